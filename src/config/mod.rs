//! Configuration: the TOML file (`ConfigFile`, SPEC §8) and the validated `Config` the rest of the
//! gateway runs on.
//!
//! The file is parsed with `deny_unknown_fields`, then every value is checked and turned into a
//! typed field (socket addresses, durations, non-zero sizes). A bad value is an error naming the key;
//! nothing falls back to a default silently. `ConfigFile` is also `Serialize`, so tests build a
//! configuration in code and hand the gateway exactly what an operator would write.
//!
//! This module does no network I/O; the upstream host is resolved when the server is built.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::Path;
use std::time::Duration;

mod file;

pub use file::*;

use crate::failopen::FailOpenMode;
use crate::identity::{IdentityConfig, JwtConfig, KeySource};
use crate::queue::{QueueTarget, TargetType};
use crate::registry::{TargetsMode, UnregisteredGated};

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

fn invalid(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        reason: reason.into(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreBackend {
    Memory,
    Redis { url: String },
}

/// A gated route after validation: the path split into literal segments and one `{id}` slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateRoute {
    pub method: http::Method,
    /// Lower-case literal segments; `None` marks the `{id}` slot.
    pub segments: Vec<Option<String>>,
    pub target_type: TargetType,
    /// The template as configured, used as a bounded metric label.
    pub template: String,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub threads: usize,
    pub keepalive_idle: Duration,
    pub grace_period: Duration,
    pub log_format: LogFormat,
    pub max_connections: usize,
    pub first_byte_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// `host:port` as configured; resolved once when the server is built.
    pub upstream: String,
    pub upstream_connect_timeout: Duration,
    pub upstream_read_timeout: Duration,
    pub upstream_write_timeout: Duration,
    pub store: StoreBackend,
    pub command_timeout: Duration,
    pub store_max_in_flight: usize,
    pub startup_wait: Duration,
    pub fail_open: FailOpenMode,
    pub fail_open_min_replicas: u32,
    pub fail_open_max_replicas: u32,
    pub tick: Duration,
    pub batch_size: NonZeroU32,
    pub max_capacity: NonZeroU64,
    pub heartbeat_timeout: Duration,
    pub max_evict_per_tick: NonZeroU32,
    pub max_active_targets: NonZeroU32,
    pub targets_mode: TargetsMode,
    pub registered_targets: Vec<QueueTarget>,
    pub unregistered_gated: UnregisteredGated,
    pub secret_env: String,
    pub previous_secret_env: String,
    pub token_ttl: Duration,
    pub single_use: bool,
    /// Backend statuses that give a single-use claim back.
    pub release_on: Vec<u16>,
    pub flag_enabled: bool,
    pub rollout_percent: u8,
    pub gate_routes: Vec<GateRoute>,
    /// Canonical path prefixes (lower-case segments) on which websocket upgrades are allowed.
    pub upgrade_prefixes: Vec<Vec<String>>,
    pub identity: IdentityConfig,
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

    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let file: ConfigFile =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        Config::from_file(&file)
    }

    pub fn from_file(f: &ConfigFile) -> Result<Config, ConfigError> {
        let s = &f.server;
        let listen = socket_addr("server.listen", &s.listen)?;
        let admin_listen = socket_addr("server.admin_listen", &s.admin_listen)?;
        if listen == admin_listen {
            return Err(invalid(
                "server.admin_listen",
                "must differ from server.listen",
            ));
        }
        let threads = in_range("server.threads", s.threads as u64, 1, 256)? as usize;
        let keepalive_idle = secs("server.keepalive_idle_s", s.keepalive_idle_s, 1, 3600)?;
        let grace_period = secs("server.grace_period_s", s.grace_period_s, 0, 3600)?;
        let log_format = match s.log_format.as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => {
                return Err(invalid(
                    "server.log_format",
                    format!("`{other}` is not one of `text`, `json`"),
                ))
            }
        };

        let max_connections =
            in_range("server.max_connections", s.max_connections, 1, 1_000_000)? as usize;
        let first_byte_timeout = millis(
            "server.first_byte_timeout_ms",
            s.first_byte_timeout_ms,
            1,
            3_600_000,
        )?;
        // Pingora itself reads at most 1 MiB of header and 256 fields.
        let max_header_bytes = in_range(
            "server.max_header_bytes",
            s.max_header_bytes,
            1024,
            1_048_575,
        )? as usize;
        let max_headers = in_range("server.max_headers", s.max_headers, 8, 256)? as usize;

        let u = &f.upstream;
        let upstream = host_port("upstream.address", &u.address)?;
        let upstream_connect_timeout = millis(
            "upstream.connect_timeout_ms",
            u.connect_timeout_ms,
            1,
            60_000,
        )?;
        let upstream_read_timeout =
            millis("upstream.read_timeout_ms", u.read_timeout_ms, 1, 3_600_000)?;
        let upstream_write_timeout = millis(
            "upstream.write_timeout_ms",
            u.write_timeout_ms,
            1,
            3_600_000,
        )?;

        let st = &f.store;
        let store = match st.backend.as_str() {
            "memory" => StoreBackend::Memory,
            "redis" => {
                if !(st.redis_url.starts_with("redis://") || st.redis_url.starts_with("rediss://"))
                {
                    return Err(invalid(
                        "store.redis_url",
                        "must start with redis:// or rediss://",
                    ));
                }
                StoreBackend::Redis {
                    url: st.redis_url.clone(),
                }
            }
            other => {
                return Err(invalid(
                    "store.backend",
                    format!("unknown store backend `{other}` (expected `memory` or `redis`)"),
                ))
            }
        };
        let command_timeout = millis("store.command_timeout_ms", st.command_timeout_ms, 1, 10_000)?;
        let store_max_in_flight =
            in_range("store.max_in_flight", st.max_in_flight, 1, 1_000_000)? as usize;
        let startup_wait = millis("store.startup_wait_ms", st.startup_wait_ms, 0, 600_000)?;

        let fo = &f.fail_open;
        let fail_open = FailOpenMode::parse(&fo.mode).ok_or_else(|| {
            invalid(
                "fail_open.mode",
                format!("`{}` is not one of `paced`, `open`, `closed`", fo.mode),
            )
        })?;
        let fail_open_min_replicas =
            in_range("fail_open.min_replicas", fo.min_replicas, 1, 10_000)? as u32;
        let fail_open_max_replicas =
            in_range("fail_open.max_replicas", fo.max_replicas, 1, 10_000)? as u32;
        if fail_open_max_replicas < fail_open_min_replicas {
            return Err(invalid(
                "fail_open.max_replicas",
                "must be at least fail_open.min_replicas",
            ));
        }

        let q = &f.queue;
        let tick = millis("queue.tick_ms", q.tick_ms, 10, 3_600_000)?;
        let batch_size = nonzero_u32("queue.batch_size", q.batch_size)?;
        let max_capacity = NonZeroU64::new(q.max_capacity)
            .ok_or_else(|| invalid("queue.max_capacity", "must be at least 1"))?;
        let heartbeat_timeout = secs(
            "queue.heartbeat_timeout_s",
            q.heartbeat_timeout_s,
            1,
            86_400,
        )?;
        let max_evict_per_tick = nonzero_u32("queue.max_evict_per_tick", q.max_evict_per_tick)?;
        let max_active_targets = nonzero_u32(
            "queue.max_active_targets",
            in_range("queue.max_active_targets", q.max_active_targets, 1, 100_000)?,
        )?;

        let targets_mode = match q.targets.as_str() {
            "any" => TargetsMode::Any,
            "registered" => TargetsMode::Registered,
            other => {
                return Err(invalid(
                    "queue.targets",
                    format!("`{other}` is not one of `any`, `registered`"),
                ))
            }
        };
        let mut registered_targets = Vec::with_capacity(q.registered.len());
        for (i, r) in q.registered.iter().enumerate() {
            let t = QueueTarget::parse_key(r).ok_or_else(|| {
                invalid(
                    &format!("queue.registered[{i}]"),
                    format!("`{r}` is not TYPE:ID (e.g. LIMITED_DROP:42)"),
                )
            })?;
            registered_targets.push(t);
        }
        let unregistered_gated = match q.unregistered_gated.as_str() {
            "pass" => UnregisteredGated::Pass,
            "refuse" => UnregisteredGated::Refuse,
            other => {
                return Err(invalid(
                    "queue.unregistered_gated",
                    format!("`{other}` is not one of `pass`, `refuse`"),
                ))
            }
        };

        let t = &f.token;
        env_name("token.secret_env", &t.secret_env)?;
        env_name("token.previous_secret_env", &t.previous_secret_env)?;
        if t.secret_env == t.previous_secret_env {
            return Err(invalid(
                "token.previous_secret_env",
                "must name a different variable than token.secret_env",
            ));
        }
        // Capped at the per-target key TTL: a token must not outlive its target's keys, or the
        // two stores would disagree about an idle admitted user.
        let token_ttl = secs("token.ttl_s", t.ttl_s, 1, 1_800)?;

        let rollout_percent =
            in_range("flag.rollout_percent", f.flag.rollout_percent, 0, 100)? as u8;

        let mut gate_routes = Vec::with_capacity(f.gate.routes.len());
        for (i, r) in f.gate.routes.iter().enumerate() {
            gate_routes.push(gate_route(i, r)?);
        }

        let mut release_on = Vec::with_capacity(t.release_on.len());
        for (i, code) in t.release_on.iter().enumerate() {
            if !(400..=599).contains(code) {
                return Err(invalid(
                    &format!("token.release_on[{i}]"),
                    format!("{code} is not a 4xx or 5xx status (a 2xx or 3xx answer means the purchase went through)"),
                ));
            }
            release_on.push(*code);
        }

        let identity = identity(&f.identity)?;

        let mut upgrade_prefixes = Vec::with_capacity(f.upgrade.paths.len());
        for (i, p) in f.upgrade.paths.iter().enumerate() {
            let key = format!("upgrade.paths[{i}].prefix");
            let canonical = crate::gateway::path::canonicalize(p.prefix.as_bytes())
                .map_err(|e| invalid(&key, format!("`{}`: {e}", p.prefix)))?;
            if canonical.segments.is_empty() {
                return Err(invalid(&key, "must name at least one path segment"));
            }
            let segments: Vec<String> = canonical
                .segments
                .iter()
                .map(|s| s.to_ascii_lowercase())
                .collect();
            if segments[0] == crate::gateway::route::API_PREFIX {
                return Err(invalid(&key, "the queue API never upgrades"));
            }
            upgrade_prefixes.push(segments);
        }

        Ok(Config {
            listen,
            admin_listen,
            threads,
            keepalive_idle,
            grace_period,
            log_format,
            max_connections,
            first_byte_timeout,
            max_header_bytes,
            max_headers,
            upstream,
            upstream_connect_timeout,
            upstream_read_timeout,
            upstream_write_timeout,
            store,
            command_timeout,
            store_max_in_flight,
            startup_wait,
            fail_open,
            fail_open_min_replicas,
            fail_open_max_replicas,
            tick,
            batch_size,
            max_capacity,
            heartbeat_timeout,
            max_evict_per_tick,
            max_active_targets,
            targets_mode,
            registered_targets,
            unregistered_gated,
            secret_env: t.secret_env.clone(),
            previous_secret_env: t.previous_secret_env.clone(),
            token_ttl,
            single_use: t.single_use,
            release_on,
            flag_enabled: f.flag.enabled,
            rollout_percent,
            gate_routes,
            upgrade_prefixes,
            identity,
        })
    }

    /// Redis memory when every allowed queue is full (what an attacker entering made-up users
    /// into made-up targets can reach).
    pub fn worst_case_redis_bytes(&self) -> u64 {
        self.max_capacity
            .get()
            .saturating_mul(u64::from(self.max_active_targets.get()))
            .saturating_mul(crate::store::BYTES_PER_WAITING_USER)
    }

    /// A short human summary for `check-config`. Holds no secret.
    pub fn summary(&self) -> String {
        let store = match &self.store {
            StoreBackend::Memory => "memory (single instance only)".to_string(),
            StoreBackend::Redis { url } => format!("redis {}", redact_url(url)),
        };
        let routes: Vec<String> = self
            .gate_routes
            .iter()
            .map(|r| format!("{} {} -> {}", r.method, r.template, r.target_type.as_str()))
            .collect();
        format!(
            "listen {} | admin {} | upstream {}\nstore {} (timeout {} ms, {} calls in flight, start-up wait {} ms)\nfail-open: {} (paced share over {}..={} replicas)\nredis memory with every queue full: ~{} MB (max_capacity x max_active_targets x {} B per waiting user)\nqueue: {} users per {} ms, capacity {}, heartbeat timeout {} s\ntoken: ttl {} s, single use {}, secret from ${}\nflag: enabled {}, rollout {}%\ngated: {}",
            self.listen,
            self.admin_listen,
            self.upstream,
            store,
            self.command_timeout.as_millis(),
            self.store_max_in_flight,
            self.startup_wait.as_millis(),
            self.fail_open.as_str(),
            self.fail_open_min_replicas,
            self.fail_open_max_replicas,
            self.worst_case_redis_bytes() / 1_000_000,
            crate::store::BYTES_PER_WAITING_USER,
            self.batch_size,
            self.tick.as_millis(),
            self.max_capacity,
            self.heartbeat_timeout.as_secs(),
            self.token_ttl.as_secs(),
            self.single_use,
            self.secret_env,
            self.flag_enabled,
            self.rollout_percent,
            if routes.is_empty() { "none".to_string() } else { routes.join(", ") },
        )
    }
}

fn identity(s: &IdentitySection) -> Result<IdentityConfig, ConfigError> {
    match s.mode.as_str() {
        "header" => Ok(IdentityConfig::Header),
        "jwt" => {
            if s.algorithms.is_empty() {
                return Err(invalid(
                    "identity.algorithms",
                    "name at least one algorithm",
                ));
            }
            let mut algorithms = Vec::new();
            for (i, a) in s.algorithms.iter().enumerate() {
                let alg = crate::identity::parse_algorithm(a).ok_or_else(|| {
                    invalid(
                        &format!("identity.algorithms[{i}]"),
                        format!("`{a}` is not one of HS256, RS256, ES256"),
                    )
                })?;
                algorithms.push(alg);
            }
            let key = match (s.key_file.is_empty(), s.jwks_file.is_empty()) {
                (false, true) => KeySource::File(s.key_file.clone().into()),
                (true, false) => KeySource::Jwks(s.jwks_file.clone().into()),
                _ => {
                    return Err(invalid(
                        "identity.key_file",
                        "with mode `jwt`, set exactly one of key_file and jwks_file",
                    ))
                }
            };
            if algorithms.len() > 1 && matches!(key, KeySource::File(_)) {
                return Err(invalid(
                    "identity.algorithms",
                    "a key_file holds one key: name one algorithm (or use jwks_file)",
                ));
            }
            if s.user_claim.is_empty() {
                return Err(invalid("identity.user_claim", "must name a claim"));
            }
            let leeway_s = in_range("identity.leeway_s", s.leeway_s, 0, 600)?;
            let opt = |v: &String| (!v.is_empty()).then(|| v.clone());
            Ok(IdentityConfig::Jwt(JwtConfig {
                algorithms,
                key,
                issuer: opt(&s.issuer),
                audience: opt(&s.audience),
                user_claim: s.user_claim.clone(),
                leeway_s,
            }))
        }
        other => Err(invalid(
            "identity.mode",
            format!("`{other}` is not one of `header`, `jwt`"),
        )),
    }
}

/// Hides a password in a Redis URL (`redis://:pw@host` → `redis://***@host`).
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
        _ => url.to_string(),
    }
}

fn socket_addr(key: &str, v: &str) -> Result<SocketAddr, ConfigError> {
    v.parse()
        .map_err(|_| invalid(key, format!("`{v}` is not an IP:port socket address")))
}

/// `host:port` with a non-empty host and a non-zero port; resolution happens at start.
fn host_port(key: &str, v: &str) -> Result<String, ConfigError> {
    if v.parse::<SocketAddr>().is_ok() {
        return Ok(v.to_string());
    }
    let bad = || invalid(key, format!("`{v}` is not host:port"));
    let (host, port) = v.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    if !host_ok || port == 0 {
        return Err(bad());
    }
    Ok(v.to_string())
}

fn in_range(key: &str, v: u64, lo: u64, hi: u64) -> Result<u64, ConfigError> {
    if v < lo || v > hi {
        return Err(invalid(key, format!("{v} is outside {lo}..={hi}")));
    }
    Ok(v)
}

fn millis(key: &str, v: u64, lo: u64, hi: u64) -> Result<Duration, ConfigError> {
    in_range(key, v, lo, hi).map(Duration::from_millis)
}

fn secs(key: &str, v: u64, lo: u64, hi: u64) -> Result<Duration, ConfigError> {
    in_range(key, v, lo, hi).map(Duration::from_secs)
}

fn nonzero_u32(key: &str, v: u64) -> Result<NonZeroU32, ConfigError> {
    let v = u32::try_from(v).map_err(|_| invalid(key, format!("{v} is too large")))?;
    NonZeroU32::new(v).ok_or_else(|| invalid(key, "must be at least 1"))
}

fn env_name(key: &str, v: &str) -> Result<(), ConfigError> {
    let ok = !v.is_empty()
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !v.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!("`{v}` is not an environment variable name"),
        ))
    }
}

fn gate_route(i: usize, r: &GateRouteEntry) -> Result<GateRoute, ConfigError> {
    let key = |k: &str| format!("gate.routes[{i}].{k}");
    let method =
        http::Method::from_bytes(r.method.to_ascii_uppercase().as_bytes()).map_err(|_| {
            invalid(
                &key("method"),
                format!("`{}` is not an HTTP method", r.method),
            )
        })?;
    let target_type = TargetType::from_enum_name(&r.target_type).ok_or_else(|| {
        invalid(
            &key("target_type"),
            format!("`{}` is not LIMITED_DROP or TICKETING_EVENT", r.target_type),
        )
    })?;
    let bad_path = |why: &str| invalid(&key("path"), format!("`{}` {why}", r.path));
    let rest = r
        .path
        .strip_prefix('/')
        .ok_or_else(|| bad_path("must start with /"))?;
    let mut segments = Vec::new();
    for seg in rest.split('/') {
        if seg == "{id}" {
            segments.push(None);
        } else if !seg.is_empty()
            && seg
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            segments.push(Some(seg.to_ascii_lowercase()));
        } else {
            return Err(bad_path("has a segment that is not a plain word or {id}"));
        }
    }
    if segments.iter().filter(|s| s.is_none()).count() != 1 {
        return Err(bad_path("must contain exactly one {id}"));
    }
    if segments
        .first()
        .is_some_and(|s| s.as_deref() == Some("virtual-queues"))
    {
        return Err(bad_path("may not be under /virtual-queues"));
    }
    Ok(GateRoute {
        method,
        segments,
        target_type,
        template: r.path.clone(),
    })
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
        assert_eq!(c.store, StoreBackend::Memory);
        assert_eq!(c.tick, Duration::from_millis(2000));
        assert_eq!(c.batch_size.get(), 100);
        assert_eq!(c.command_timeout, Duration::from_millis(150));
        assert_eq!(c.gate_routes.len(), 2);
        assert!(!c.flag_enabled);
        assert_eq!(c.rollout_percent, 100);
    }

    #[test]
    fn bad_values_name_their_key() {
        assert!(err_of("[queue]\nbatch_size = 0").contains("queue.batch_size"));
        assert!(err_of("[queue]\ntick_ms = 0").contains("queue.tick_ms"));
        assert!(err_of("[flag]\nrollout_percent = 101").contains("flag.rollout_percent"));
        assert!(err_of("[server]\nlisten = \"nope\"").contains("server.listen"));
        assert!(err_of("[store]\nbackend = \"etcd\"").contains("store.backend"));
        assert!(err_of("[upstream]\naddress = \"host\"").contains("upstream.address"));
        assert!(err_of("[token]\nsecret_env = \"A B\"").contains("token.secret_env"));
        assert!(err_of("[queue]\nmax_capacity = 0").contains("queue.max_capacity"));
        assert!(err_of("[token]\nttl_s = 1801").contains("token.ttl_s"));
        assert!(err_of("[queue]\nmax_active_targets = 0").contains("queue.max_active_targets"));
    }

    #[test]
    fn unknown_keys_and_types_are_errors() {
        assert!(err_of("[queue]\nbatch = 5").contains("batch"));
        assert!(err_of("[nope]\na = 1").contains("nope"));
        assert!(err_of("[queue]\nbatch_size = -1").contains("batch_size"));
    }

    #[test]
    fn gate_routes_are_validated() {
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
        assert_eq!(c.gate_routes.len(), 1);
        assert_eq!(c.gate_routes[0].method, http::Method::PUT);
        assert_eq!(
            c.gate_routes[0].segments,
            vec![Some("shop".to_string()), None, Some("buy".to_string())]
        );
    }

    #[test]
    fn hostnames_are_allowed_for_upstream() {
        let c = Config::from_toml("[upstream]\naddress = \"backend.internal:8081\"").unwrap();
        assert_eq!(c.upstream, "backend.internal:8081");
    }

    #[test]
    fn redis_password_is_redacted() {
        assert_eq!(redact_url("redis://:pw@h:1"), "redis://***@h:1");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn serialized_file_round_trips() {
        let mut f = ConfigFile::default();
        f.queue.batch_size = 7;
        let text = toml::to_string(&f).unwrap();
        let c = Config::from_toml(&text).unwrap();
        assert_eq!(c.batch_size.get(), 7);
    }
}
