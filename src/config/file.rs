//! The configuration file as an operator writes it (`ConfigFile`, docs/configuration.md): every
//! section with its documented defaults, `deny_unknown_fields` everywhere. `Serialize` too, so
//! tests build a file in code and hand the gateway exactly what an operator would write. Validation
//! into the typed `Config` is `config/mod.rs`'s job; nothing here checks a value.

use serde::{Deserialize, Serialize};

pub use crate::allowed::{TargetsMode, UnregisteredGated};
pub use crate::failopen::FailOpenMode;
pub use crate::identity::JwtAlgorithm;
pub use crate::queue::TargetType;

/// `server.log_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `store.backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// Embedded, single instance (the default).
    Memory,
    /// Shared by every replica, at `store.redis_url`.
    Redis,
}

/// `identity.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdentityMode {
    /// Trust `X-User-Id` as set by the load balancer.
    Header,
    /// Verify `Authorization: Bearer <JWT>`.
    Jwt,
}

/// The TOML file, section by section. Every section and key is optional and has the documented
/// default; unknown keys are errors.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConfigFile {
    pub server: ServerSection,
    pub upstream: UpstreamSection,
    pub store: StoreSection,
    pub queue: QueueSection,
    pub token: TokenSection,
    pub flag: FlagSection,
    pub fail_open: FailOpenSection,
    pub gate: GateSection,
    pub upgrade: UpgradeSection,
    pub identity: IdentitySection,
}

/// Who the user is (`identity.rs`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdentitySection {
    pub mode: IdentityMode,
    /// With `jwt`: accepted algorithms, from `HS256`, `RS256`, `ES256`.
    pub algorithms: Vec<JwtAlgorithm>,
    /// With `jwt`: a PEM public key, or for HS256 a file holding the secret. Reloaded on change.
    pub key_file: String,
    /// With `jwt`, instead of `key_file`: a JWKS document. Reloaded on change.
    pub jwks_file: String,
    /// With `jwt`: the required `iss` (empty: not checked).
    pub issuer: String,
    /// With `jwt`: the required `aud` (empty: not checked).
    pub audience: String,
    /// With `jwt`: the claim holding the user id (a positive integer).
    pub user_claim: String,
    /// With `jwt`: clock skew allowed on `exp` and `nbf`, seconds.
    pub leeway_s: u64,
    /// With `jwt`: refuse ES256 signatures whose `s` is in the upper half of the curve order
    /// (the second, malleable spelling of a signature). Only for issuers that always sign with a
    /// low `s`: OpenSSL-based signers (most identity providers) give a high one half the time.
    pub es256_low_s_only: bool,
}

impl Default for IdentitySection {
    fn default() -> Self {
        IdentitySection {
            mode: IdentityMode::Header,
            algorithms: vec![JwtAlgorithm::RS256],
            key_file: String::new(),
            jwks_file: String::new(),
            issuer: String::new(),
            audience: String::new(),
            user_claim: "sub".into(),
            leeway_s: 30,
            es256_low_s_only: false,
        }
    }
}

/// Paths on which a protocol upgrade (websocket) may reach the backend. None by default: after a
/// `101` the connection is an opaque tunnel the gate can no longer inspect.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpgradeSection {
    pub paths: Vec<UpgradePathEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpgradePathEntry {
    /// A canonical path prefix, e.g. `/ws/` (matched on whole segments, without case).
    pub prefix: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// Public listener (all traffic from nginx-lb).
    pub listen: String,
    /// Admin listener: `/healthz`, `/readyz`, `/metrics`, `/sales`. Keep it private.
    pub admin_listen: String,
    /// The environment variable holding the bearer token that admin writes (`PUT`/`DELETE
    /// /sales/…`) must carry; empty: admin writes are refused.
    pub admin_token_env: String,
    /// Host names the admin listener answers besides IP addresses and `localhost` (the names
    /// Prometheus and operators reach it by, e.g. `gateway-1`): a request whose `Host` is another
    /// name is refused (421), so a web page whose name an attacker rebinds to this address cannot
    /// read the console, the sales, the flag or the metrics.
    pub admin_hosts: Vec<String>,
    /// The environment variable holding this replica's stable name (letters, digits, `.`, `_`,
    /// `-`; at most 64), unique among the replicas and kept across restarts (a pod or container
    /// name): a replica that starts with a name retires its predecessor of that name from the
    /// replica roster at once. Empty: no name.
    pub replica_name_env: String,
    /// Worker threads of the proxy service.
    pub threads: usize,
    /// Idle keep-alive of downstream connections, seconds.
    pub keepalive_idle_s: u64,
    /// After SIGTERM, how long the replica keeps serving while it closes every keep-alive
    /// connection after its next answer (and `/readyz` answers 503), ms; then it stops accepting.
    pub drain_ms: u64,
    /// How long in-flight requests may finish after SIGTERM, seconds.
    pub grace_period_s: u64,
    pub log_format: LogFormat,
    /// Connections served at once; one beyond is closed at once.
    pub max_connections: u64,
    /// A new connection must deliver its whole first request header within this, ms.
    pub first_byte_timeout_ms: u64,
    /// Request line plus headers, bytes; larger requests get 431.
    pub max_header_bytes: u64,
    /// Header fields per request; more get 431.
    pub max_headers: u64,
    /// During a request, the longest the gateway waits on the client without a byte moving (a
    /// request body that stops coming, an answer it does not read).
    pub client_stall_ms: u64,
    /// During a request, the waits on the client add up to at most `client_stall_ms` plus the
    /// bytes moved at this rate (bytes per second): a slower body or reader is cut off.
    pub min_client_rate: u64,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            listen: "127.0.0.1:8080".into(),
            admin_listen: "127.0.0.1:9090".into(),
            admin_token_env: String::new(),
            admin_hosts: Vec::new(),
            replica_name_env: String::new(),
            threads: 2,
            keepalive_idle_s: 60,
            grace_period_s: 5,
            drain_ms: 1000,
            log_format: LogFormat::Text,
            max_connections: 10_000,
            first_byte_timeout_ms: 10_000,
            max_header_bytes: 32 * 1024,
            max_headers: 100,
            client_stall_ms: 10_000,
            min_client_rate: 1024,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamSection {
    /// The unchanged backend, `host:port`.
    pub address: String,
    pub connect_timeout_ms: u64,
    pub read_timeout_ms: u64,
    pub write_timeout_ms: u64,
}

impl Default for UpstreamSection {
    fn default() -> Self {
        UpstreamSection {
            address: "127.0.0.1:8081".into(),
            connect_timeout_ms: 1000,
            read_timeout_ms: 30_000,
            write_timeout_ms: 30_000,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSection {
    pub backend: StoreKind,
    pub redis_url: String,
    pub command_timeout_ms: u64,
    /// Request-path store calls in flight per replica; the excess is refused at once (degraded
    /// answer) instead of queueing into timeouts.
    pub max_in_flight: u64,
    /// How long start-up waits for Redis before the public listener opens anyway (degraded).
    pub startup_wait_ms: u64,
}

impl Default for StoreSection {
    fn default() -> Self {
        StoreSection {
            backend: StoreKind::Memory,
            redis_url: "redis://127.0.0.1:6379".into(),
            command_timeout_ms: 150,
            max_in_flight: 256,
            startup_wait_ms: 3000,
        }
    }
}

/// What a replica does while its store cannot be used (`failopen.rs`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FailOpenSection {
    pub mode: FailOpenMode,
    /// The fewest replicas the paced share assumes (`batch_size / max(replicas, min_replicas)`).
    pub min_replicas: u64,
    /// Accepted and ignored: the share no longer assumes a count before the roster was read
    /// (a replica that never registered does not pace). Kept so that older files still load;
    /// `check-config` and start-up say it is ignored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_replicas: Option<u64>,
    /// How long a replica cut off from the store may pace after its last registration, and how
    /// long the pumps lower their batch by the share of a replica that stopped registering.
    /// Unset: 120 s, or the least the tick allows if that is longer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paced_for_s: Option<u64>,
    /// Where the single-use claims taken while the store is down are journalled before the
    /// purchase is forwarded (`claims/journal.rs`); unset: kept in memory only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claims_file: Option<String>,
}

impl Default for FailOpenSection {
    fn default() -> Self {
        FailOpenSection {
            mode: FailOpenMode::Paced,
            min_replicas: 1,
            max_replicas: None,
            paced_for_s: None,
            claims_file: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueSection {
    pub tick_ms: u64,
    pub batch_size: u64,
    pub max_capacity: u64,
    pub heartbeat_timeout_s: u64,
    pub max_evict_per_tick: u64,
    /// Targets with a live queue at once; entering a new target beyond it answers 429.
    pub max_active_targets: u64,
    pub targets: TargetsMode,
    /// With `registered`: sales registered in the file (`TYPE:ID`), besides `queue:targets`.
    pub registered: Vec<String>,
    /// With `registered`: what purchases of other sales get.
    pub unregistered_gated: UnregisteredGated,
}

impl Default for QueueSection {
    fn default() -> Self {
        QueueSection {
            tick_ms: 2000,
            batch_size: 100,
            max_capacity: 100_000,
            heartbeat_timeout_s: 60,
            max_evict_per_tick: 1000,
            max_active_targets: crate::store::DEFAULT_MAX_TARGETS as u64,
            targets: TargetsMode::Any,
            registered: Vec::new(),
            unregistered_gated: UnregisteredGated::Refuse,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokenSection {
    /// Name of the environment variable holding the signing secret.
    pub secret_env: String,
    /// Name of the environment variable holding the previous secret (verification only).
    pub previous_secret_env: String,
    pub ttl_s: u64,
    pub single_use: bool,
    /// How many purchases one token may try in all (a 4xx or 5xx answer gives the token back
    /// for another try; a 2xx or 3xx spends it).
    pub max_attempts: u32,
    /// No longer used (an older file's key: any 4xx or 5xx gives the token back now); accepted
    /// with a warning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_on: Option<Vec<u16>>,
}

impl Default for TokenSection {
    fn default() -> Self {
        TokenSection {
            secret_env: "VQ_TOKEN_SECRET".into(),
            previous_secret_env: "VQ_TOKEN_SECRET_PREVIOUS".into(),
            ttl_s: 300,
            single_use: true,
            max_attempts: 10,
            release_on: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlagSection {
    pub enabled: bool,
    pub rollout_percent: u64,
}

impl Default for FlagSection {
    fn default() -> Self {
        FlagSection {
            enabled: false,
            rollout_percent: 100,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GateSection {
    pub routes: Vec<GateRouteEntry>,
}

impl Default for GateSection {
    fn default() -> Self {
        GateSection {
            routes: vec![
                GateRouteEntry {
                    method: "POST".into(),
                    path: "/limited-drops/{id}/orders".into(),
                    target_type: TargetType::LimitedDrop,
                },
                GateRouteEntry {
                    method: "POST".into(),
                    path: "/events/{id}/seats/select".into(),
                    target_type: TargetType::TicketingEvent,
                },
            ],
        }
    }
}

/// One gated route: `POST /limited-drops/{id}/orders` guarded for `LIMITED_DROP`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateRouteEntry {
    pub method: String,
    pub path: String,
    pub target_type: TargetType,
}
