//! Configuration: the TOML file (`ConfigFile` in `file.rs`, docs/configuration.md) and the
//! validated `Config` the rest of the gateway runs on, one typed part per subsystem.
//!
//! The file is parsed with `deny_unknown_fields` and serde enums for every closed set of words;
//! `check.rs` then turns every value into a typed field (socket addresses, durations, non-zero
//! sizes, compiled routes). A bad value is an error naming its dotted key; nothing falls back to a
//! default silently.
//!
//! This module does no network I/O; the upstream host is resolved when the server is built.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

mod check;
mod file;
mod subsystems;

pub use file::*;

use crate::identity::IdentityConfig;
use crate::queue::QueueTarget;
use crate::routing::gated::GateRoute;

/// Error for a configuration that cannot be used. `key` is the dotted TOML key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Parse(String),
    #[error("invalid `{key}`: {reason}")]
    Invalid { key: String, reason: String },
}

/// The validated configuration, one part per subsystem.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub upstream: UpstreamConfig,
    pub store: StoreConfig,
    pub fail_open: FailOpenConfig,
    pub queue: QueueConfig,
    pub token: TokenConfig,
    pub flag: FlagConfig,
    pub gate: GateConfig,
    pub identity: IdentityConfig,
}

/// `[server]`: the listeners, worker threads, and the limits applied before a request is routed.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// `server.admin_token_env`: the variable holding the admin writes' bearer token (`None`:
    /// admin writes are refused).
    pub admin_token_env: Option<String>,
    /// `server.admin_hosts`, lower-cased: the names the admin listener answers besides IP
    /// addresses and `localhost`.
    pub admin_hosts: Vec<String>,
    /// `server.replica_name_env`: the variable holding this replica's stable name (`None`: no
    /// name). Read by `serve` (`ServerConfig::replica_name`), not by the other commands.
    pub replica_name_env: Option<String>,
    pub threads: usize,
    pub keepalive_idle: Duration,
    pub grace_period: Duration,
    /// The drain phase after SIGTERM (`server.drain_ms`).
    pub drain: Duration,
    pub log_format: LogFormat,
    pub max_connections: usize,
    pub first_byte_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// `server.client_stall_ms`.
    pub client_stall: Duration,
    /// `server.min_client_rate`, bytes per second.
    pub min_client_rate: u64,
}

/// `[upstream]`: the unchanged backend.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// `host:port` as configured; resolved once when the server is built.
    pub address: String,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
}

/// Where the queue state lives.
#[derive(Debug, Clone)]
pub enum StoreBackend {
    Memory,
    /// The URL as parsed once, here (`store::RedisUrl`).
    Redis {
        url: Box<crate::store::RedisUrl>,
    },
}

/// `[store]`: the backend and the budget of every call to it.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub backend: StoreBackend,
    pub command_timeout: Duration,
    pub max_in_flight: usize,
    pub startup_wait: Duration,
}

/// `[fail_open]`: what a replica does while its store cannot be used.
#[derive(Debug, Clone)]
pub struct FailOpenConfig {
    pub mode: FailOpenMode,
    pub min_replicas: u32,
    pub paced_for: Duration,
    /// The file set `fail_open.max_replicas`, which is no longer used (said at start-up and by
    /// `check-config`).
    pub max_replicas_ignored: bool,
    /// `fail_open.claims_file`: the claims journal, if any.
    pub claims_file: Option<std::path::PathBuf>,
}

/// What start-up and `check-config` say about a file that sets `fail_open.max_replicas`.
pub const RELEASE_ON_IGNORED: &str = "token.release_on is ignored: any 4xx or 5xx answer gives the token back for another try, a 2xx or 3xx spends it, and token.max_attempts bounds the tries";

pub const MAX_REPLICAS_IGNORED: &str = "fail_open.max_replicas is ignored: a replica paces only after it registered, with the share the roster recorded for it";

/// `[queue]`: admission pace, capacity, liveness, and which targets may have a queue.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    pub tick: Duration,
    pub batch_size: NonZeroU32,
    pub max_capacity: NonZeroU64,
    pub heartbeat_timeout: Duration,
    pub max_evict_per_tick: NonZeroU32,
    pub max_active_targets: NonZeroU32,
    pub targets: TargetsMode,
    pub registered: Vec<QueueTarget>,
    pub unregistered_gated: UnregisteredGated,
}

/// `[token]`: the entry token's secrets, lifetime and single use.
#[derive(Debug, Clone)]
pub struct TokenConfig {
    pub secret_env: String,
    pub previous_secret_env: String,
    pub ttl: Duration,
    pub single_use: bool,
    /// `token.max_attempts`: how many purchases one token may try in all.
    pub max_attempts: u32,
    /// The file still sets `token.release_on`, which is ignored (`RELEASE_ON_IGNORED`).
    pub release_on_ignored: bool,
}

impl ServerConfig {
    /// This replica's stable name from `replica_name_env` (empty: none configured): 1 to 64 of
    /// letters, digits, `.`, `_` and `-`.
    pub fn replica_name(&self) -> Result<String, String> {
        let Some(var) = &self.replica_name_env else {
            return Ok(String::new());
        };
        let value = std::env::var(var).map_err(|_| format!("the variable {var} is not set"))?;
        let ok = !value.is_empty()
            && value.len() <= 64
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if ok {
            Ok(value)
        } else {
            Err(format!(
                "{var} must hold 1 to 64 letters, digits, '.', '_' or '-'"
            ))
        }
    }
}

/// `[flag]`: the file's default of the run-time flag (Redis `queue:flag` overrides it).
#[derive(Debug, Clone)]
pub struct FlagConfig {
    pub enabled: bool,
    pub rollout_percent: u8,
}

/// `[gate]` and `[upgrade]`: the purchase routes behind the entry-token gate, and the paths
/// where a websocket upgrade may reach the backend.
#[derive(Debug, Clone)]
pub struct GateConfig {
    pub routes: Vec<Arc<GateRoute>>,
    /// Canonical path prefixes (lower-case segments) on which websocket upgrades are allowed.
    pub upgrade_prefixes: Vec<Vec<String>>,
}

impl Config {
    /// Reads, parses and validates a TOML file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::from_toml(&text)
    }

    /// Parses and validates TOML text. A value of the wrong type or word is an error naming its
    /// key, as a value out of range is.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let de = toml::Deserializer::new(text);
        let file: ConfigFile = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let reason = inner.message().to_string();
            if key.is_empty() || key == "." {
                ConfigError::Parse(inner.to_string())
            } else {
                ConfigError::Invalid { key, reason }
            }
        })?;
        Config::from_file(&file)
    }

    /// Validates a parsed file.
    pub fn from_file(f: &ConfigFile) -> Result<Config, ConfigError> {
        let store = check::store(&f.store)?;
        let queue = check::queue(&f.queue)?;
        let fail_open = check::fail_open(&f.fail_open, &queue, &store)?;
        Ok(Config {
            server: check::server(&f.server)?,
            upstream: check::upstream(&f.upstream)?,
            store,
            fail_open,
            queue,
            token: check::token(&f.token)?,
            flag: check::flag(&f.flag)?,
            gate: check::gate(&f.gate, &f.upgrade)?,
            identity: check::identity(&f.identity)?,
        })
    }

    /// Redis memory when every allowed queue is full (what an attacker entering made-up users
    /// into made-up targets can reach).
    pub fn worst_case_redis_bytes(&self) -> u64 {
        self.queue
            .max_capacity
            .get()
            .saturating_mul(u64::from(self.queue.max_active_targets.get()))
            .saturating_mul(crate::store::BYTES_PER_WAITING_USER)
    }

    /// The paced share and window, for the summary.
    fn pacing_summary(&self) -> String {
        let fail_open = &self.fail_open;
        let c = self.pacer();
        let mut out = format!(
            " (paced share batch_size / max(replicas, {}); a replica cut off from the store paces from {} ms to {} ms after its last registration)",
            fail_open.min_replicas,
            c.pace_after_ms(),
            c.pace_until_ms(),
        );
        if fail_open.max_replicas_ignored {
            out.push_str(&format!("\nwarning: {MAX_REPLICAS_IGNORED}"));
        }
        if self.token.release_on_ignored {
            out.push_str(&format!("\nwarning: {RELEASE_ON_IGNORED}"));
        }
        out
    }

    /// A short human summary for `check-config`. Holds no secret.
    pub fn summary(&self) -> String {
        let (server, queue, token) = (&self.server, &self.queue, &self.token);
        let store = match &self.store.backend {
            StoreBackend::Memory => "memory (single instance only)".to_string(),
            StoreBackend::Redis { url } => format!("redis {}", url.describe()),
        };
        let routes: Vec<String> = self
            .gate
            .routes
            .iter()
            .map(|r| format!("{} {} -> {}", r.method, r.template, r.target_type.as_str()))
            .collect();
        format!(
            "listen {} | admin {} | upstream {}\nstore {} (timeout {} ms, {} calls in flight, start-up wait {} ms)\nfail-open: {}{}\nredis memory with every queue full: ~{} MB (max_capacity x max_active_targets x {} B per waiting user)\nqueue: {} users per {} ms, capacity {}, heartbeat timeout {} s\ntoken: ttl {} s, single use {}, secret from ${}\nflag: enabled {}, rollout {}%\ngated: {}",
            server.listen,
            server.admin_listen,
            self.upstream.address,
            store,
            self.store.command_timeout.as_millis(),
            self.store.max_in_flight,
            self.store.startup_wait.as_millis(),
            self.fail_open.mode.as_str(),
            self.pacing_summary(),
            self.worst_case_redis_bytes() / 1_000_000,
            crate::store::BYTES_PER_WAITING_USER,
            queue.batch_size,
            queue.tick.as_millis(),
            queue.max_capacity,
            queue.heartbeat_timeout.as_secs(),
            token.ttl.as_secs(),
            token.single_use,
            token.secret_env,
            self.flag.enabled,
            self.flag.rollout_percent,
            if routes.is_empty() { "none".to_string() } else { routes.join(", ") },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_of(toml: &str) -> String {
        match Config::from_toml(toml) {
            Ok(_) => panic!("accepted: {toml}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn empty_file_gives_documented_defaults() {
        let c = Config::from_toml("").unwrap();
        assert!(matches!(c.store.backend, StoreBackend::Memory));
        assert_eq!(c.queue.tick, Duration::from_millis(2000));
        assert_eq!(c.queue.batch_size.get(), 100);
        assert_eq!(c.store.command_timeout, Duration::from_millis(150));
        assert_eq!(c.gate.routes.len(), 2);
        assert_eq!(c.fail_open.mode, FailOpenMode::Paced);
        assert_eq!(c.server.log_format, LogFormat::Text);
        assert!(!c.flag.enabled);
        assert_eq!(c.flag.rollout_percent, 100);
        assert_eq!(c.server.drain, Duration::from_millis(1000));
    }

    #[test]
    fn bad_values_name_their_key() {
        for (toml, key) in [
            ("[queue]\nbatch_size = 0", "queue.batch_size"),
            ("[queue]\ntick_ms = 0", "queue.tick_ms"),
            ("[flag]\nrollout_percent = 101", "flag.rollout_percent"),
            ("[server]\nlisten = \"nope\"", "server.listen"),
            ("[store]\nbackend = \"etcd\"", "store.backend"),
            ("[upstream]\naddress = \"host\"", "upstream.address"),
            ("[token]\nsecret_env = \"A B\"", "token.secret_env"),
            ("[queue]\nmax_capacity = 0", "queue.max_capacity"),
            ("[token]\nttl_s = 1801", "token.ttl_s"),
            (
                "[queue]\nmax_active_targets = 0",
                "queue.max_active_targets",
            ),
            ("[queue]\ntargets = \"some\"", "queue.targets"),
            ("[server]\nlog_format = \"xml\"", "server.log_format"),
            ("[fail_open]\nmode = \"ajar\"", "fail_open.mode"),
            ("[identity]\nmode = \"cookie\"", "identity.mode"),
            (
                "[identity]\nalgorithms = [\"none\"]",
                "identity.algorithms[0]",
            ),
            ("[queue]\nbatch_size = -1", "queue.batch_size"),
            ("[server]\ndrain_ms = 60001", "server.drain_ms"),
        ] {
            let e = err_of(toml);
            assert!(e.contains(&format!("`{key}`")), "{toml}: {e}");
        }
        // A word outside a closed set lists the words that are allowed.
        assert!(err_of("[store]\nbackend = \"etcd\"").contains("`memory`"));
    }

    #[test]
    fn unknown_keys_are_errors() {
        assert!(err_of("[queue]\nbatch = 5").contains("batch"));
        assert!(err_of("[nope]\na = 1").contains("nope"));
        assert!(err_of("not toml at all").contains("line 1"));
    }

    #[test]
    fn gate_routes_are_compiled_with_their_key() {
        let e = err_of(
            "[[gate.routes]]\nmethod = \"POST\"\npath = \"/a/b\"\ntarget_type = \"LIMITED_DROP\"",
        );
        assert!(e.contains("gate.routes[0].path"), "{e}");
        let e =
            err_of("[[gate.routes]]\nmethod = \"POST\"\npath = \"/a/{id}\"\ntarget_type = \"X\"");
        assert!(e.contains("gate.routes[0].target_type"), "{e}");
        let c = Config::from_toml(
            "[[gate.routes]]\nmethod = \"put\"\npath = \"/Shop/{id}/Buy\"\ntarget_type = \"TICKETING_EVENT\"",
        )
        .unwrap();
        assert_eq!(c.gate.routes.len(), 1);
        assert_eq!(c.gate.routes[0].method, http::Method::PUT);
    }

    #[test]
    fn the_pacing_window_follows_the_tick() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.fail_open.paced_for, Duration::from_secs(120));
        // A long tick stretches the default: the window must hold at least a tick after the
        // live window (3 ticks) and a tick have passed.
        let c = Config::from_toml("[queue]\ntick_ms = 60000").unwrap();
        assert_eq!(
            c.fail_open.paced_for,
            Duration::from_millis(4 * 150 + 7 * 60_000)
        );
        let e = err_of("[fail_open]\npaced_for_s = 5");
        assert!(
            e.contains("`fail_open.paced_for_s`") && e.contains("at least 15 s"),
            "{e}"
        );
        let c = Config::from_toml("[fail_open]\npaced_for_s = 15").unwrap();
        assert_eq!(c.fail_open.paced_for, Duration::from_secs(15));
        // Also in the modes that never pace: every replica's roster call forgets instances
        // after its own window.
        assert!(Config::from_toml("[fail_open]\nmode = \"closed\"\npaced_for_s = 5").is_err());
        // An older file's `max_replicas` loads, and the summary says it is ignored.
        let c = Config::from_toml("[fail_open]\nmax_replicas = 16").unwrap();
        assert!(
            c.summary().contains(MAX_REPLICAS_IGNORED),
            "{}",
            c.summary()
        );
        assert!(!Config::from_toml("")
            .unwrap()
            .summary()
            .contains("max_replicas"));
    }

    #[test]
    fn hostnames_are_allowed_for_upstream() {
        let c = Config::from_toml("[upstream]\naddress = \"backend.internal:8081\"").unwrap();
        assert_eq!(c.upstream.address, "backend.internal:8081");
    }

    #[test]
    fn serialized_file_round_trips() {
        let mut f = ConfigFile::default();
        f.queue.batch_size = 7;
        f.store.backend = StoreKind::Redis;
        f.identity.algorithms = vec![JwtAlgorithm::ES256];
        let text = toml::to_string(&f).unwrap();
        assert!(text.contains("backend = \"redis\""), "{text}");
        let c = Config::from_toml(&text).unwrap();
        assert_eq!(c.queue.batch_size.get(), 7);
        assert!(matches!(c.store.backend, StoreBackend::Redis { .. }));
    }
}
