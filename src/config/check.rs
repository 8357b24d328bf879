//! Validation: each file section (`file.rs`) checked and turned into its subsystem's typed part
//! (`mod.rs`). Every error names the dotted key at fault.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::identity::{IdentityConfig, JwtConfig, KeySource};
use crate::queue::QueueTarget;
use crate::routing::gated::GateRoute;

fn invalid(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        reason: reason.into(),
    }
}

pub(super) fn server(section: &ServerSection) -> Result<ServerConfig, ConfigError> {
    let listen = socket_addr("server.listen", &section.listen)?;
    let admin_listen = socket_addr("server.admin_listen", &section.admin_listen)?;
    if listen == admin_listen {
        return Err(invalid(
            "server.admin_listen",
            "must differ from server.listen",
        ));
    }
    let admin_token_env = match section.admin_token_env.as_str() {
        "" => None,
        name => {
            env_name("server.admin_token_env", name)?;
            Some(name.to_string())
        }
    };
    let replica_name_env = match section.replica_name_env.as_str() {
        "" => None,
        name => {
            env_name("server.replica_name_env", name)?;
            Some(name.to_string())
        }
    };
    let mut admin_hosts = Vec::new();
    for name in &section.admin_hosts {
        let valid = !name.is_empty()
            && name.len() <= 253
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if !valid {
            return Err(invalid(
                "server.admin_hosts",
                format!("{name:?} is not a host name (letters, digits, '-' and '.'; no port)"),
            ));
        }
        admin_hosts.push(name.to_ascii_lowercase());
    }
    Ok(ServerConfig {
        listen,
        admin_listen,
        admin_token_env,
        admin_hosts,
        replica_name_env,
        threads: in_range("server.threads", section.threads as u64, 1, 256)? as usize,
        keepalive_idle: secs("server.keepalive_idle_s", section.keepalive_idle_s, 1, 3600)?,
        grace_period: secs("server.grace_period_s", section.grace_period_s, 0, 3600)?,
        drain: millis("server.drain_ms", section.drain_ms, 0, 60_000)?,
        log_format: section.log_format,
        max_connections: in_range(
            "server.max_connections",
            section.max_connections,
            1,
            1_000_000,
        )? as usize,
        first_byte_timeout: millis(
            "server.first_byte_timeout_ms",
            section.first_byte_timeout_ms,
            1,
            3_600_000,
        )?,
        // Pingora itself reads at most 1 MiB of header and 256 fields.
        max_header_bytes: in_range(
            "server.max_header_bytes",
            section.max_header_bytes,
            1024,
            1_048_575,
        )? as usize,
        max_headers: in_range("server.max_headers", section.max_headers, 8, 256)? as usize,
        client_stall: millis(
            "server.client_stall_ms",
            section.client_stall_ms,
            100,
            600_000,
        )?,
        min_client_rate: in_range(
            "server.min_client_rate",
            section.min_client_rate,
            1,
            1 << 30,
        )?,
    })
}

pub(super) fn upstream(section: &UpstreamSection) -> Result<UpstreamConfig, ConfigError> {
    Ok(UpstreamConfig {
        address: host_port("upstream.address", &section.address)?,
        connect_timeout: millis(
            "upstream.connect_timeout_ms",
            section.connect_timeout_ms,
            1,
            60_000,
        )?,
        read_timeout: millis(
            "upstream.read_timeout_ms",
            section.read_timeout_ms,
            1,
            3_600_000,
        )?,
        write_timeout: millis(
            "upstream.write_timeout_ms",
            section.write_timeout_ms,
            1,
            3_600_000,
        )?,
    })
}

pub(super) fn store(section: &StoreSection) -> Result<StoreConfig, ConfigError> {
    let backend = match section.backend {
        StoreKind::Memory => StoreBackend::Memory,
        StoreKind::Redis => StoreBackend::Redis {
            url: Box::new(
                crate::store::RedisUrl::parse(&section.redis_url)
                    .map_err(|why| invalid("store.redis_url", why))?,
            ),
        },
    };
    Ok(StoreConfig {
        backend,
        command_timeout: millis(
            "store.command_timeout_ms",
            section.command_timeout_ms,
            1,
            10_000,
        )?,
        max_in_flight: in_range("store.max_in_flight", section.max_in_flight, 1, 1_000_000)?
            as usize,
        startup_wait: millis("store.startup_wait_ms", section.startup_wait_ms, 0, 600_000)?,
    })
}

/// The most users a tick may admit: far beyond any backend's budget, and a bound on what a
/// replica keeps per sale and tick while it paces.
const MAX_BATCH: u64 = 1_000_000;

/// `paced_for_s` when the file does not set it.
const DEFAULT_PACED_FOR: Duration = Duration::from_secs(120);

/// `[fail_open]`, checked against the queue's tick and the store's timeout: a replica cut off
/// from the store starts pacing `pace_after` after its last registration and stops two ticks
/// before `paced_for`; the window must hold at least one tick.
pub(super) fn fail_open(
    section: &FailOpenSection,
    queue: &QueueConfig,
    store: &StoreConfig,
) -> Result<FailOpenConfig, ConfigError> {
    let min_replicas = in_range("fail_open.min_replicas", section.min_replicas, 1, 10_000)? as u32;
    let claims_file = match section.claims_file.as_deref() {
        None => None,
        // Only its form: the file is opened (created) at start-up on the host that serves, which
        // refuses to start when it cannot.
        Some(p) => {
            let path = std::path::PathBuf::from(p);
            if p.is_empty() || p.ends_with('/') || path.file_name().is_none() {
                return Err(invalid("fail_open.claims_file", "must name a file"));
            }
            Some(path)
        }
    };
    let mut config = FailOpenConfig {
        mode: section.mode,
        min_replicas,
        paced_for: DEFAULT_PACED_FOR,
        max_replicas_ignored: section.max_replicas.is_some(),
        claims_file,
    };
    let least = {
        let c = super::subsystems::pacer(&config, queue, store);
        Duration::from_millis(c.pace_after_ms() + 3 * c.tick_ms)
    };
    config.paced_for = match section.paced_for_s {
        None => DEFAULT_PACED_FOR.max(least),
        Some(s) => {
            let given = Duration::from_secs(in_range("fail_open.paced_for_s", s, 1, 86_400)?);
            // In every mode: the roster forgets instances after this window whoever calls it,
            // so one replica's short window would cut the others' reservations short.
            if given < least {
                return Err(invalid(
                    "fail_open.paced_for_s",
                    format!(
                        "must be at least {} s with this tick and command timeout: a replica cut \
                         off from the store waits 4 command timeouts, the roster's live window \
                         (3 ticks, at least 2 s) and a tick before it paces, and stops two ticks \
                         before paced_for_s; the window must hold at least one tick",
                        least.as_millis().div_ceil(1000)
                    ),
                ));
            }
            given
        }
    };
    Ok(config)
}

pub(super) fn queue(section: &QueueSection) -> Result<QueueConfig, ConfigError> {
    let mut registered = Vec::with_capacity(section.registered.len());
    for (i, r) in section.registered.iter().enumerate() {
        let t = QueueTarget::parse_key(r).ok_or_else(|| {
            invalid(
                &format!("queue.registered[{i}]"),
                format!("`{r}` is not TYPE:ID (e.g. LIMITED_DROP:42)"),
            )
        })?;
        registered.push(t);
    }
    Ok(QueueConfig {
        tick: millis("queue.tick_ms", section.tick_ms, 10, 3_600_000)?,
        batch_size: nonzero_u32(
            "queue.batch_size",
            in_range("queue.batch_size", section.batch_size, 1, MAX_BATCH)?,
        )?,
        max_capacity: NonZeroU64::new(section.max_capacity)
            .ok_or_else(|| invalid("queue.max_capacity", "must be at least 1"))?,
        heartbeat_timeout: secs(
            "queue.heartbeat_timeout_s",
            section.heartbeat_timeout_s,
            1,
            86_400,
        )?,
        max_evict_per_tick: nonzero_u32("queue.max_evict_per_tick", section.max_evict_per_tick)?,
        max_active_targets: nonzero_u32(
            "queue.max_active_targets",
            in_range(
                "queue.max_active_targets",
                section.max_active_targets,
                1,
                100_000,
            )?,
        )?,
        targets: section.targets,
        registered,
        unregistered_gated: section.unregistered_gated,
    })
}

pub(super) fn token(section: &TokenSection) -> Result<TokenConfig, ConfigError> {
    env_name("token.secret_env", &section.secret_env)?;
    env_name("token.previous_secret_env", &section.previous_secret_env)?;
    if section.secret_env == section.previous_secret_env {
        return Err(invalid(
            "token.previous_secret_env",
            "must name a different variable than token.secret_env",
        ));
    }
    Ok(TokenConfig {
        secret_env: section.secret_env.clone(),
        previous_secret_env: section.previous_secret_env.clone(),
        // Capped at the per-target key TTL: a token must not outlive its target's keys, or the
        // two stores would disagree about an idle admitted user.
        ttl: secs(
            "token.ttl_s",
            section.ttl_s,
            1,
            crate::store::TARGET_KEY_TTL_SECS,
        )?,
        single_use: section.single_use,
        max_attempts: in_range(
            "token.max_attempts",
            u64::from(section.max_attempts),
            1,
            1000,
        )? as u32,
        release_on_ignored: section.release_on.is_some(),
    })
}

pub(super) fn flag(section: &FlagSection) -> Result<FlagConfig, ConfigError> {
    Ok(FlagConfig {
        enabled: section.enabled,
        rollout_percent: in_range("flag.rollout_percent", section.rollout_percent, 0, 100)? as u8,
    })
}

pub(super) fn gate(
    gate: &GateSection,
    upgrade: &UpgradeSection,
) -> Result<GateConfig, ConfigError> {
    let mut routes = Vec::with_capacity(gate.routes.len());
    for (i, r) in gate.routes.iter().enumerate() {
        let route = GateRoute::compile(&r.method, &r.path, r.target_type)
            .map_err(|e| invalid(&format!("gate.routes[{i}].{}", e.field), e.reason))?;
        routes.push(Arc::new(route));
    }
    let mut upgrade_prefixes = Vec::with_capacity(upgrade.paths.len());
    for (i, p) in upgrade.paths.iter().enumerate() {
        let key = format!("upgrade.paths[{i}].prefix");
        let canonical = crate::routing::path::canonicalize(p.prefix.as_bytes())
            .map_err(|e| invalid(&key, format!("`{}`: {e}", p.prefix)))?;
        if canonical.is_empty() {
            return Err(invalid(&key, "must name at least one path segment"));
        }
        let segments: Vec<String> = canonical.segments().map(str::to_ascii_lowercase).collect();
        if segments[0] == crate::routing::API_PREFIX {
            return Err(invalid(&key, "the queue API never upgrades"));
        }
        upgrade_prefixes.push(segments);
    }
    Ok(GateConfig {
        routes,
        upgrade_prefixes,
    })
}

pub(super) fn identity(section: &IdentitySection) -> Result<IdentityConfig, ConfigError> {
    match section.mode {
        IdentityMode::Header => Ok(IdentityConfig::Header),
        IdentityMode::Jwt => {
            if section.algorithms.is_empty() {
                return Err(invalid(
                    "identity.algorithms",
                    "name at least one algorithm",
                ));
            }
            let algorithms = section.algorithms.clone();
            let key = match (section.key_file.is_empty(), section.jwks_file.is_empty()) {
                (false, true) => KeySource::File(section.key_file.clone().into()),
                (true, false) => KeySource::Jwks(section.jwks_file.clone().into()),
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
            if section.user_claim.is_empty() {
                return Err(invalid("identity.user_claim", "must name a claim"));
            }
            let opt = |v: &String| (!v.is_empty()).then(|| v.clone());
            Ok(IdentityConfig::Jwt(JwtConfig {
                algorithms,
                key,
                issuer: opt(&section.issuer),
                audience: opt(&section.audience),
                user_claim: section.user_claim.clone(),
                leeway_s: in_range("identity.leeway_s", section.leeway_s, 0, 600)?,
                es256_low_s_only: section.es256_low_s_only,
            }))
        }
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
