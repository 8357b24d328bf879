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

use crate::config::{Config, StoreBackend};
use crate::flag::{Flag, FlagState};
use crate::gateway::admin::AdminApp;
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

/// Keeps the Redis connection task on a runtime that lives as long as the server, and refreshes
/// the runtime flag from `queue:flag` (the last known value stays while Redis is unreachable).
struct RedisService {
    store: Arc<RedisStore>,
    state: Arc<AppState>,
    defaults: FlagState,
}

impl RedisService {
    async fn refresh_flag(&self) {
        while !self.store.started() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut reported: Vec<String> = Vec::new();
        let mut ticker = tokio::time::interval(FLAG_REFRESH);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            match self.store.read_flag().await {
                Ok(fields) => {
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
                Err(e) => self.state.store_failed("flag", &e),
            }
        }
    }
}

#[async_trait]
impl BackgroundService for RedisService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let connection = self.store.run_connection(async move {
            let _ = shutdown.changed().await;
        });
        tokio::select! {
            _ = connection => {}
            _ = self.refresh_flag() => {}
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
    let store: Arc<dyn QueueStore> = match &config.store {
        StoreBackend::Memory => {
            Arc::new(MemoryStore::new().with_max_targets(config.max_active_targets.get() as usize))
        }
        StoreBackend::Redis { url } => {
            let s = Arc::new(
                RedisStore::new(url, config.command_timeout)
                    .map_err(|e| StartError::Store(e.to_string()))?
                    .with_max_targets(config.max_active_targets.get() as usize),
            );
            redis_store = Some(s.clone());
            s
        }
    };
    let flag = Flag::new(FlagState::new(config.flag_enabled, config.rollout_percent));
    let listen = config.listen;
    let admin_listen = config.admin_listen;
    let state = Arc::new(AppState::new(config, upstream, store, keys, flag, metrics));

    let mut proxy = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        Gateway::new(state.clone()),
        "proxy",
    );
    proxy.add_tcp(&listen.to_string());
    server.add_service(proxy);

    let mut admin = Service::new("admin".to_string(), AdminApp::new(state.clone()));
    admin.add_tcp(&admin_listen.to_string());
    admin.threads = Some(1);
    server.add_service(admin);

    server.add_service(background_service(
        "admission pump",
        crate::pump::Pump::new(state.clone()),
    ));

    if let Some(store) = redis_store {
        let defaults = state.flag.snapshot();
        server.add_service(background_service(
            "redis",
            RedisService {
                store,
                state: state.clone(),
                defaults,
            },
        ));
    }
    state.metrics.up.set(1);
    Ok(Built { server, state })
}
