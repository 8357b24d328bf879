//! Builds the Pingora server from a validated `Config`: checks the listen ports, resolves the
//! backend once, creates the store, and wires the services and their order: the Redis
//! connection first (the public proxy waits for it), then the proxy, the admin listener, the
//! admission pump, the run-time settings refresher and the JWT key watcher (`services/`).
//! `main` builds exactly this; the tests run the binary that does.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;

use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::services::background::background_service;
use pingora::services::listening::Service;

use crate::admin::AdminApp;
use crate::app::AppState;
use crate::config::{Config, StoreBackend};
use crate::flag::{Flag, FlagState};
use crate::gateway::conn::{Bounds, ConnectionLimit};
use crate::gateway::Gateway;
use crate::metrics::Metrics;
use crate::services::claim_leases::ClaimLeases;
use crate::services::connection::RedisConnection;
use crate::services::keys::KeyWatcher;
use crate::services::settings::{RuntimeSettings, SettingsRefresher};
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
    #[error("admin token: {0}")]
    AdminToken(String),
    #[error("identity keys: {0}")]
    Identity(String),
    #[error("server.replica_name_env: {0}")]
    ReplicaName(String),
    #[error("fail_open.claims_file `{path}`: {reason}")]
    ClaimsFile { path: String, reason: String },
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
    let current = read(&config.token.secret_env)?.ok_or_else(|| StartError::MissingSecret {
        var: config.token.secret_env.clone(),
    })?;
    let previous = read(&config.token.previous_secret_env)?;
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

/// A built server and the shared state its services run on.
pub struct Built {
    pub server: Server,
    pub state: Arc<AppState>,
}

pub fn build(config: Config, keys: TokenKeys) -> Result<Built, StartError> {
    check_free("server.listen", config.server.listen)?;
    check_free("server.admin_listen", config.server.admin_listen)?;
    let upstream = resolve(&config.upstream.address)?;
    let metrics = Metrics::new().map_err(|e| StartError::Metrics(e.to_string()))?;
    if config.token.release_on_ignored {
        tracing::warn!("{}", crate::config::RELEASE_ON_IGNORED);
    }
    if config.fail_open.max_replicas_ignored {
        tracing::warn!("{}", crate::config::MAX_REPLICAS_IGNORED);
    }

    let mut conf = ServerConf {
        threads: config.server.threads,
        // One single-threaded runtime per worker thread: a request and its wake-ups stay on one
        // thread (faster on the queue API than the work-stealing runtime: `benches/HISTORY.md`).
        work_stealing: false,
        grace_period_seconds: Some(config.server.grace_period.as_secs()),
        graceful_shutdown_timeout_seconds: Some(config.server.grace_period.as_secs().max(1)),
        pid_file: format!("/tmp/vq-gateway-{}.pid", config.server.listen.port()),
        upgrade_sock: format!(
            "/tmp/vq-gateway-upgrade-{}.sock",
            config.server.listen.port()
        ),
        ..ServerConf::default()
    };
    conf.max_retries = 1;
    let mut server = Server::new_with_opt_and_conf(None, conf);

    let mut redis_store = None;
    // With registered targets ops decide which sales have a queue; the cap is for `any`.
    let max_targets = match config.queue.targets {
        crate::allowed::TargetsMode::Any => config.queue.max_active_targets.get() as usize,
        crate::allowed::TargetsMode::Registered => usize::MAX / 2,
    };
    // The `[queue]` keys only seed sales created without them: a sale's own parameters live
    // in its hash (Redis) and every replica reads them from there.
    let defaults = config.sale_defaults();
    let store: Arc<dyn QueueStore> = match &config.store.backend {
        StoreBackend::Memory => Arc::new(
            MemoryStore::new()
                .with_max_targets(max_targets)
                .with_sale_defaults(defaults),
        ),
        StoreBackend::Redis { url } => {
            let store = Arc::new(
                RedisStore::from_url(url, config.store.command_timeout)
                    .map_err(|e| StartError::Store(e.to_string()))?
                    .with_max_targets(max_targets)
                    .with_sale_defaults(defaults)
                    .with_draw_keys(crate::draw::DrawKeys::from_token_keys(&keys)),
            );
            redis_store = Some(store.clone());
            store
        }
    };
    let flag_defaults = FlagState::new(config.flag.enabled, config.flag.rollout_percent);
    // The memory store has no run-time flag: the file's values are all there is. With Redis the
    // flag is unknown until read (`settings.rs`).
    let flag = if redis_store.is_some() {
        Flag::unknown()
    } else {
        Flag::new(flag_defaults.clone())
    };
    let listen = config.server.listen;
    let admin_listen = config.server.admin_listen;
    let identity =
        crate::identity::Identity::new(config.identity.clone()).map_err(StartError::Identity)?;
    let memory = matches!(config.store.backend, StoreBackend::Memory);
    let claims = match &config.fail_open.claims_file {
        None => crate::claims::Claims::in_memory(),
        Some(path) => {
            let journal =
                crate::claims::Journal::open(path).map_err(|e| StartError::ClaimsFile {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?;
            let claims =
                crate::claims::Claims::with_journal(journal, crate::clock::now().epoch_ms / 1000);
            if claims.pending_len() > 0 {
                tracing::info!(
                    claims = claims.pending_len(),
                    "claims journalled before a restart; written to the store once it answers"
                );
            }
            claims
        }
    };
    let state = Arc::new(
        AppState::new(config, upstream, store, keys, flag, metrics, identity).with_claims(claims),
    );
    if memory {
        state.allowed.mark_loaded();
        state.metrics.flag_known.set(1);
    }

    let app = pingora::proxy::http_proxy(&server.configuration, Gateway::new(state.clone()));
    let limits = &state.config.server;
    let limited = ConnectionLimit::new(
        app,
        limits.max_connections,
        Bounds {
            first: limits.first_byte_timeout,
            idle: limits.keepalive_idle,
            stall: limits.client_stall,
            min_rate: limits.min_client_rate,
            max_headers: limits.max_headers,
            max_header_bytes: limits.max_header_bytes,
        },
        state.metrics.clone(),
    );
    let mut proxy = Service::new("proxy".to_string(), limited);
    proxy.add_tcp(&listen.to_string());
    let proxy = server.add_service(proxy);

    let admin_token =
        crate::admin::sales::AdminToken::from_env(state.config.server.admin_token_env.as_deref())
            .map_err(StartError::AdminToken)?;
    let replica_name = state
        .config
        .server
        .replica_name()
        .map_err(StartError::ReplicaName)?;
    // With Redis, the run-time settings (the flag, the registered sales) are kept by one
    // refresher, which the admin listener's flag writes go through too.
    let refresher = redis_store.as_ref().map(|store| {
        Arc::new(SettingsRefresher::new(
            store.clone(),
            state.clone(),
            flag_defaults.clone(),
        ))
    });
    let mut admin_app = AdminApp::new(state.clone(), admin_token);
    if let Some(refresher) = &refresher {
        admin_app = admin_app.with_flag_writer(refresher.clone());
    }
    let mut admin = Service::new("admin".to_string(), admin_app);
    admin.add_tcp(&admin_listen.to_string());
    admin.threads = Some(1);
    server.add_service(admin);

    server.add_service(background_service(
        "admission pump",
        crate::pump::Pump::new(
            state.store.clone(),
            state.config.pump(),
            state.metrics.clone(),
            state.pacer.clone(),
            Arc::new(crate::clock::SystemClock),
        )
        .with_name(&replica_name),
    ));

    if let (Some(store), Some(refresher)) = (redis_store, refresher) {
        let redis = server.add_service(background_service(
            "redis",
            RedisConnection {
                store: store.clone(),
                state: state.clone(),
                settings: refresher.clone(),
            },
        ));
        // No answer before the first store contact (or the bounded start-up wait): a replica that
        // answered enters while still connecting would let its first users skip the queue.
        proxy.add_dependency(&redis);
        let settings = server.add_service(background_service(
            "settings",
            RuntimeSettings { refresher },
        ));
        settings.add_dependency(&redis);
    }
    if state.config.token.single_use {
        server.add_service(background_service(
            "claim leases",
            ClaimLeases {
                state: state.clone(),
            },
        ));
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

/// The shutdown signals, with a drain phase before a graceful stop: on SIGTERM the replica keeps
/// serving for `server.drain_ms` while every answer closes its connection and `/readyz` answers
/// 503 (`AppState::draining`), then Pingora's graceful shutdown begins (the listener closes,
/// idle connections are dropped, in-flight requests get `grace_period_s`). Without the drain, a
/// load balancer writing a request onto an idle keep-alive connection just as it is dropped
/// gets a reset, and a POST it may not send again becomes a 502. SIGINT stops at once, SIGQUIT
/// hands the sockets over, as Pingora's own watcher does.
pub struct DrainThenStop {
    state: Arc<AppState>,
}

impl DrainThenStop {
    pub fn new(state: Arc<AppState>) -> DrainThenStop {
        DrainThenStop { state }
    }
}

#[async_trait::async_trait]
impl pingora::server::ShutdownSignalWatch for DrainThenStop {
    async fn recv(&self) -> pingora::server::ShutdownSignal {
        use pingora::server::ShutdownSignal;
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int), Ok(mut quit)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::quit()),
        ) else {
            tracing::error!("cannot install signal handlers; stopping");
            return ShutdownSignal::FastShutdown;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => return ShutdownSignal::FastShutdown,
            _ = quit.recv() => return ShutdownSignal::GracefulUpgrade,
        }
        let drain = self.state.config.server.drain;
        tracing::info!(
            drain_ms = drain.as_millis() as u64,
            "SIGTERM: draining connections"
        );
        self.state
            .draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
        tokio::select! {
            _ = tokio::time::sleep(drain) => ShutdownSignal::GracefulTerminate,
            _ = int.recv() => ShutdownSignal::FastShutdown,
        }
    }
}
