//! vq-gateway: a virtual waiting room sidecar on Pingora.
//!
//! # Layout
//! - `app`      — `AppState`, the shared state of a running gateway (built by `server`).
//! - `clock`    — the one clock: `Now` and wall time for requests, `Clock` (real or virtual) for
//!   the pump.
//! - `config`   — TOML file (`file.rs`, serde enums) → validated (`check.rs`) `Config`, one typed
//!   part per section (docs/configuration.md); `subsystems.rs` is the one place that turns it into
//!   the pump's, the pacer's, the store guard's and the sales' own settings (they never import
//!   `config`).
//! - `cli`      — `serve`, `check-config`, `flag show|set`, `target`, `sale`, `draw verify`.
//! - `ops`      — the `flag`, `target` and `sale` commands: read and write them in Redis.
//! - `server`   — builds the Pingora server: ports, upstream, store, services and their order;
//!   the shutdown signals (SIGTERM drains, then stops).
//! - `gateway`  — the public listener (`ProxyHttp`): `route` (classification, `ApiOp`),
//!   `hygiene` (header, method and upgrade spellings refused before routing), `api` (queue
//!   handlers), `gate` (`decide`: the entry-token check), `conn` (connections at once,
//!   their time bounds and eviction).
//! - `admin`    — the admin listener: health, readiness, metrics, `sales` (the admin API of
//!   sales: `/sales`, bearer token), `console` (the operator console: its page, its state, the
//!   flag's `/flag`).
//! - `routing`  — pure: `path` (strict canonicalisation) and `gated` (the purchase route table:
//!   templates compiled from `gate.routes`, matching, look-alikes); shared by `gateway` and
//!   `config`.
//! - `headers`  — strict reading of single-valued request headers, used by every reader.
//! - `identity` — who the user is: `X-User-Id` from a trusted load balancer, or a verified JWT.
//! - `slice`    — slices of a sale's batch: what a cut-off replica may pace, and the pumps hold back.
//! - `allowed`  — the allowed sales: which targets may have a queue (`any` or `registered`).
//! - `sale`     — a sale's parameters (the one source of truth is its hash in Redis, read by the
//!   scripts): parsing, validation, merging, and each replica's book of what it last read. No I/O.
//! - `draw`     — the pre-queue's draw at a sale's opening: seed, commitment, the reproducible
//!   order (`vq-draw-v1`), the check of an export. No I/O.
//! - `settings` — the run-time settings in Redis (flag, registered sales) as versioned documents:
//!   adopted, or written back when Redis lost them. No I/O.
//! - `queue`    — pure domain: targets, positions, ETA, response JSON, the per-replica stats cache.
//! - `store`    — `QueueStore` trait; `RedisStore` (`redis/`, Lua in `lua/`; script calls
//!   pipelined on a connection per thread in `redis/pipe.rs`; the replica's presence connection
//!   for the replica roster in `redis/presence.rs`) and `MemoryStore` (`memory/`, the
//!   executable model of the scripts), heartbeat windows in `liveness.rs`, both behind
//!   `StoreGuard` (deadlines, per-class in-flight limits, circuit breaker, health), which every
//!   caller goes through.
//! - `failopen` — what a replica does while its store cannot be used: the mode and the paced
//!   budget. No I/O.
//! - `claims`   — the single-use claims a replica remembers: in flight (their leases renewed by
//!   `services::claim_leases`), spent, and those taken while Redis was down (journalled to disk in
//!   `claims/journal.rs`, written back once spent).
//! - `issued`   — the entry tokens this replica answered for admissions (sale, user → expiry):
//!   the same token again when the store lost the issue, written back after a rollback. No I/O.
//! - `token`    — entry token mint/verify (HMAC-SHA256, docs/api.md#entry-token). No I/O.
//! - `flag`     — queue flag and rollout bucket evaluation (docs/operations.md#the-flag). No I/O.
//! - `pump`     — admission pump background service: lock, advance, sweep
//!   (docs/ARCHITECTURE.md). Depends on `store`, `clock`, `failopen` and `metrics` only;
//!   `tests/simulation.rs` drives it in virtual time.
//! - `services` — the other background services, one file each: the Redis connection (start-up,
//!   health probe, write-backs), the run-time settings refresher (flag, registered sales), the
//!   leases of claims in flight and the JWT key watcher.
//! - `metrics`  — Prometheus registry and families (docs/operations.md#metrics).
//! - `error`    — `ApiError` → status + JSON body.
//! - `logging`  — tracing subscriber (text or JSON).
//!
//! # Who may import whom
//! - The pure modules (`queue`, `token`, `flag`, `slice`, `sale`, `draw`, `settings`, `allowed`,
//!   `routing`, `headers`, `failopen`, `clock`, `error`) do no I/O and never import `store`,
//!   `gateway`, `server` or `app`.
//! - `config` turns the file into settings (`config/subsystems.rs`) and may import the types of
//!   the subsystems it fills in; the subsystems (`pump`, `failopen`, `sale`, `store`) never
//!   import `config`.
//! - `store` imports the pure modules and `metrics` (the guard counts its calls) only; everything
//!   else reaches it through `StoreGuard`.
//! - `pump` imports `store`, `clock`, `failopen`, `draw`, `slice` and `metrics`, nothing of HTTP.
//! - `gateway`: `gate` may import `hygiene`, never the reverse; header names live in `headers`;
//!   `AppState` is imported from `app` everywhere.
//! - `admin` and `services` import `app`, `store` and the pure modules (and `gateway::gate` for a
//!   claim's terms); `gateway` imports neither, and only `server` imports them.
//! - Nothing here generates load: the simulator and the recording stand-in backend are the
//!   `vq-sim` package (`benches/sim`), a client of the gateway over HTTP that imports none of it.
//!
//! # A request's path
//! nginx-lb → Pingora listener (`gateway::conn`) → `Gateway::request_filter`: header limits (431) and
//! hygiene (400) first, then the path is canonicalised once (ambiguous spellings → 400) and
//! classified; the user comes from `identity`.
//! `/virtual-queues/**` is answered locally by `api::handle` over the guarded store (a failed
//! call is answered per `fail_open.mode`). A path with
//! a gated route's shape (`gated::match_route`) goes through `gate::decide` (token, user, single-use claim) and reaches
//! the backend under its canonical path without the token; everything else goes to
//! `upstream_peer` (the backend, resolved once) unchanged. `logging` records one line and the
//! metrics per request.

pub mod admin;
pub mod allowed;
pub mod app;
pub mod claims;
pub mod cli;
pub mod clock;
pub mod config;
pub mod draw;
pub mod error;
pub mod failopen;
pub mod flag;
pub mod gateway;
pub mod headers;
pub mod identity;
pub mod issued;
pub mod logging;
pub mod metrics;
pub mod ops;
pub mod pump;
pub mod queue;
pub mod routing;
pub mod sale;
pub mod server;
pub mod services;
pub mod settings;
pub mod slice;
pub mod store;
pub mod token;

#[cfg(test)]
mod test_util;
