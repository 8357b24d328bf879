//! Builds the Pingora server from a validated `Config`: checks the listen ports, resolves the
//! backend once, creates the store, and wires the services: the public proxy, the admin listener,
//! the admission pump and, with Redis, the connection that also refreshes the runtime flag.
//! `main` builds exactly this; the tests run the binary that does.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::configuration::ServerConf;
use pingora::server::{Server, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};
use pingora::services::listening::Service;
use pingora::services::ServiceReadyNotifier;

use crate::config::{Config, StoreBackend};
use crate::flag::{Flag, FlagState};
use crate::gateway::admin::AdminApp;
use crate::gateway::limits::ConnectionLimit;
use crate::gateway::{AppState, Gateway};
use crate::metrics::Metrics;
use crate::store::{MemoryStore, QueueStore, RedisStore};
use crate::token::TokenKeys;

/// The smallest accepted token secret, in bytes.
pub const MIN_SECRET_LEN: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("environment variable {var} is not set: it must hold the token secret (at least {MIN_SECRET_LEN} bytes)")]
    MissingSecret { var: String },
    #[error("environment variable {var} holds a secret of {len} bytes; at least {MIN_SECRET_LEN} are required")]
    ShortSecret { var: String, len: usize },
    #[error("cannot listen on {addr} ({key}): {reason}")]
    Listen {
        key: &'static str,
        addr: SocketAddr,
        reason: String,
    },
    #[error("cannot resolve upstream.address `{addr}`: {reason}")]
    Upstream { addr: String, reason: String },
    #[error("store: {0}")]
    Store(String),
    #[error("metrics: {0}")]
    Metrics(String),
    #[error("identity keys: {0}")]
    Identity(String),
}

/// Reads the signing secret (and the optional previous one) from the environment variables the
/// configuration names. The values never appear in errors or logs.
pub fn load_keys(config: &Config) -> Result<TokenKeys, StartError> {
    let read = |var: &str| -> Result<Option<Vec<u8>>, StartError> {
        match std::env::var_os(var) {
            None => Ok(None),
            Some(v) => {
                let bytes = v.into_encoded_bytes();
                if bytes.len() < MIN_SECRET_LEN {
                    return Err(StartError::ShortSecret {
                        var: var.to_string(),
                        len: bytes.len(),
                    });
                }
                Ok(Some(bytes))
            }
        }
    };
    let current = read(&config.secret_env)?.ok_or_else(|| StartError::MissingSecret {
        var: config.secret_env.clone(),
    })?;
    let previous = read(&config.previous_secret_env)?;
    Ok(TokenKeys::new(&current, previous.as_deref()))
}

fn check_free(key: &'static str, addr: SocketAddr) -> Result<(), StartError> {
    TcpListener::bind(addr)
        .map(drop)
        .map_err(|e| StartError::Listen {
            key,
            addr,
            reason: e.to_string(),
        })
}

fn resolve(addr: &str) -> Result<SocketAddr, StartError> {
    let err = |reason: String| StartError::Upstream {
        addr: addr.to_string(),
        reason,
    };
    addr.to_socket_addrs()
        .map_err(|e| err(e.to_string()))?
        .next()
        .ok_or_else(|| err("no address found".into()))
}

/// How often each instance re-reads `queue:flag` (SPEC §7: every instance within 3 s).
pub const FLAG_REFRESH: Duration = Duration::from_secs(1);

/// How often the prober checks the store's request path (it also notices a hang without traffic).
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// The Redis connection's service: connects at start-up (the public listener waits for it, up to
/// `store.startup_wait_ms`, so a starting replica never answers before it has tried its store),
/// then keeps the connection task on a runtime that lives as long as the server and runs the
/// store's background chores: the runtime flag refresh, the health probe that ends a degraded
/// episode by itself, and the write-back of claims taken while the store was down.
struct RedisService {
    store: Arc<RedisStore>,
    state: Arc<AppState>,
    defaults: FlagState,
}

impl RedisService {
    /// Re-reads `queue:targets` (with `queue.targets = "registered"`).
    async fn refresh_registry(&self, reported: &mut Vec<String>) {
        if self.state.registry.mode() != crate::registry::TargetsMode::Registered {
            return;
        }
        let Ok(members) = self
            .state
            .store
            .background("targets", self.store.registered_targets())
            .await
        else {
            return;
        };
        let bad = self.state.registry.set_dynamic(&members);
        if bad != *reported {
            for b in &bad {
                tracing::warn!(member = %b, "ignoring a queue:targets member that is not TYPE:ID");
            }
            *reported = bad;
        }
    }

    async fn refresh_flag(&self) {
        let mut reported: Vec<String> = Vec::new();
        let mut reported_targets: Vec<String> = Vec::new();
        let mut ticker = tokio::time::interval(FLAG_REFRESH);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            // A failure is counted by the guard; the last known value stays.
            let Ok(fields) = self
                .state
                .store
                .background("flag", self.store.read_flag())
                .await
            else {
                continue;
            };
            self.refresh_registry(&mut reported_targets).await;
            let (next, problems) = FlagState::with_overrides(&self.defaults, &fields);
            if problems != reported {
                for p in &problems {
                    tracing::warn!(problem = %p, "ignoring a bad runtime flag field");
                }
                reported = problems;
            }
            if next != self.state.flag.snapshot() {
                tracing::info!(
                    enabled = next.enabled,
                    rollout_percent = next.rollout_percent,
                    targets = next.per_target.len(),
                    "runtime flag changed"
                );
                self.state.flag.set(next);
            }
        }
    }

    /// Probes the request path every `PROBE_EVERY` (the guard's breaker lets one probe through
    /// at a time and refuses the rest at once), and once the store answers, writes the claims
    /// taken locally during the outage so those tokens stay spent.
    async fn probe(&self) {
        let store = &self.state.store;
        let mut ticker = tokio::time::interval(PROBE_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if store.probe().await.is_err() || self.state.claims.pending_len() == 0 {
                continue;
            }
            let now = crate::gateway::api::now();
            let pending = self.state.claims.take_pending(now.epoch_ms / 1000);
            let mut left = Vec::new();
            let mut written = 0usize;
            for (target, id, expires_at) in pending {
                if !left.is_empty() {
                    left.push((target, id, expires_at));
                    continue;
                }
                let ttl =
                    Duration::from_secs(expires_at.saturating_sub(now.epoch_ms / 1000).max(1));
                match store
                    .background("claim_replay", store.inner().claim(target, &id, ttl, now))
                    .await
                {
                    Ok(_) => written += 1,
                    Err(_) => left.push((target, id, expires_at)),
                }
            }
            if written > 0 {
                tracing::info!(
                    written,
                    "claims taken during the outage written to the store"
                );
            }
            self.state.claims.restore_pending(left);
        }
    }

    /// Warns when full queues would not fit in Redis' `maxmemory`, or when Redis may evict queue
    /// state under memory pressure.
    async fn check_memory(&self) {
        let Some((maxmemory, policy)) = self.store.memory_config().await else {
            return;
        };
        let need = self.state.config.worst_case_redis_bytes();
        if maxmemory > 0 && need > maxmemory {
            tracing::warn!(
                maxmemory,
                worst_case_bytes = need,
                "queue.max_capacity x queue.max_active_targets does not fit in Redis maxmemory: \
                 when Redis is full new enters get 429 QUEUE_FULL (waiting users keep their places)"
            );
        }
        if policy != "noeviction" {
            tracing::warn!(policy = %policy, "Redis maxmemory-policy is not noeviction: queue state may be evicted");
        }
    }
}

#[async_trait]
impl BackgroundService for RedisService {
    async fn start_with_ready_notifier(
        &self,
        mut shutdown: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        let wait = self.state.config.startup_wait;
        tokio::select! {
            _ = shutdown.changed() => return,
            reached = self.store.connect(wait) => {
                if reached {
                    self.check_memory().await;
                    // Registered sales known before the first request: until they are, their
                    // purchases are refused rather than let through ungated.
                    self.refresh_registry(&mut Vec::new()).await;
                }
            }
        }
        // The public listener opens now: with the store reached, or degraded after the wait.
        ready.notify_ready();
        tokio::select! {
            _ = shutdown.changed() => {}
            _ = self.refresh_flag() => {}
            _ = self.probe() => {}
        }
        // No QUIT: during the shutdown grace period the pump still releases its locks; the
        // connection ends with this service's runtime.
    }
}

/// How often the identity key file is checked for changes.
const KEY_RELOAD_EVERY: Duration = Duration::from_secs(1);

/// Reloads the JWT verification keys when their file changes (`identity.rs`).
struct KeyWatcher {
    state: Arc<AppState>,
}

#[async_trait]
impl BackgroundService for KeyWatcher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticker = tokio::time::interval(KEY_RELOAD_EVERY);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = ticker.tick() => {
                    self.state.identity.reload_if_changed();
                }
            }
        }
    }
}

/// A built server and the shared state its services run on.
pub struct Built {
    pub server: Server,
    pub state: Arc<AppState>,
}

pub fn build(config: Config, keys: TokenKeys) -> Result<Built, StartError> {
    check_free("server.listen", config.listen)?;
    check_free("server.admin_listen", config.admin_listen)?;
    let upstream = resolve(&config.upstream)?;
    let metrics = Metrics::new().map_err(|e| StartError::Metrics(e.to_string()))?;

    let mut conf = ServerConf {
        threads: config.threads,
        grace_period_seconds: Some(config.grace_period.as_secs()),
        graceful_shutdown_timeout_seconds: Some(config.grace_period.as_secs().max(1)),
        pid_file: format!("/tmp/vq-gateway-{}.pid", config.listen.port()),
        upgrade_sock: format!("/tmp/vq-gateway-upgrade-{}.sock", config.listen.port()),
        ..ServerConf::default()
    };
    conf.max_retries = 1;
    let mut server = Server::new_with_opt_and_conf(None, conf);

    let mut redis_store = None;
    // With registered targets ops decide which sales have a queue; the cap is for `any`.
    let max_targets = match config.targets_mode {
        crate::registry::TargetsMode::Any => config.max_active_targets.get() as usize,
        crate::registry::TargetsMode::Registered => usize::MAX / 2,
    };
    let store: Arc<dyn QueueStore> = match &config.store {
        StoreBackend::Memory => Arc::new(MemoryStore::new().with_max_targets(max_targets)),
        StoreBackend::Redis { url } => {
            let s = Arc::new(
                RedisStore::new(url, config.command_timeout)
                    .map_err(|e| StartError::Store(e.to_string()))?
                    .with_max_targets(max_targets),
            );
            redis_store = Some(s.clone());
            s
        }
    };
    let flag = Flag::new(FlagState::new(config.flag_enabled, config.rollout_percent));
    let listen = config.listen;
    let admin_listen = config.admin_listen;
    let identity =
        crate::identity::Identity::new(config.identity.clone()).map_err(StartError::Identity)?;
    let memory = matches!(config.store, StoreBackend::Memory);
    let state = Arc::new(AppState::new(
        config, upstream, store, keys, flag, metrics, identity,
    ));
    if memory {
        state.registry.mark_loaded();
    }

    let app = pingora::proxy::http_proxy(&server.configuration, Gateway::new(state.clone()));
    let limited = ConnectionLimit::new(
        app,
        state.config.max_connections,
        state.config.first_byte_timeout,
        state.metrics.clone(),
    );
    let mut proxy = Service::new("proxy".to_string(), limited);
    proxy.add_tcp(&listen.to_string());
    let proxy = server.add_service(proxy);

    let mut admin = Service::new("admin".to_string(), AdminApp::new(state.clone()));
    admin.add_tcp(&admin_listen.to_string());
    admin.threads = Some(1);
    server.add_service(admin);

    server.add_service(background_service(
        "admission pump",
        crate::pump::Pump::new(
            state.store.clone(),
            crate::pump::PumpConfig::from_config(&state.config),
            state.metrics.clone(),
            state.pacer.clone(),
            Arc::new(crate::clock::SystemClock),
        ),
    ));

    if let Some(store) = redis_store {
        let defaults = state.flag.snapshot();
        let redis = server.add_service(background_service(
            "redis",
            RedisService {
                store,
                state: state.clone(),
                defaults,
            },
        ));
        // No answer before the first store contact (or the bounded start-up wait): a replica that
        // answered enters while still connecting would let its first users skip the queue.
        proxy.add_dependency(&redis);
    }
    if state.identity.is_jwt() {
        server.add_service(background_service(
            "identity keys",
            KeyWatcher {
                state: state.clone(),
            },
        ));
    }
    state.metrics.up.set(1);
    Ok(Built { server, state })
}
