//! Queue state behind one trait, `QueueStore`, with two implementations: `RedisStore` (all state in
//! Redis, shared by every gateway replica, SPEC §9) and `MemoryStore` (in-process, single instance
//! only, the embedded default). One contract test suite runs against both.
//!
//! A store answers in terms of the domain (`EntryStatus`, `QueueStats`); it never builds HTTP
//! responses and never mints tokens itself: the caller passes a ready candidate token in, so both
//! stores store exactly the bytes the gateway signed.

mod memory;
mod redis;
mod scripts;

use async_trait::async_trait;

use crate::queue::{QueueStats, QueueTarget};

pub use memory::MemoryStore;
pub use redis::RedisStore;

/// How long the per-target keys live after their last write (SPEC §4: idle targets vanish).
pub const TARGET_KEY_TTL_SECS: u64 = 30 * 60;

/// How many admission wait samples a target keeps for its statistics.
pub const WAIT_SAMPLES: usize = 1024;

/// The window over which `admissionRatePerSec` is computed.
pub const RATE_WINDOW_MS: u64 = 30_000;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or did not answer in time: callers fail open.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered with something the gateway does not understand (a bug, not an outage).
    #[error("unexpected store reply: {0}")]
    Protocol(String),
}

/// A token the caller has signed and offers to the store; stored only if none is stored yet.
#[derive(Debug, Clone)]
pub struct TokenCandidate {
    pub token: String,
    pub expires_at: u64,
}

/// What `enter` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnterOutcome {
    /// Waiting with this fixed seq (new, or the same one as before) and this many live users ahead.
    Waiting { seq: u64, ahead: u64 },
    /// The user already holds an admission token; the same token is answered again.
    Admitted { token: String, expires_at: u64 },
    /// The waiting set is at capacity.
    Full,
}

/// What `poll` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PollOutcome {
    Waiting {
        seq: u64,
        ahead: u64,
    },
    Admitted {
        token: String,
        expires_at: u64,
    },
    /// Never entered, left, evicted, or the token expired.
    NotInQueue,
}

/// Everything a request needs from the clock, read once per request.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub epoch_ms: u64,
}

#[async_trait]
pub trait QueueStore: Send + Sync + 'static {
    /// `memory` or `redis`, for logs and metrics.
    fn kind(&self) -> &'static str;

    /// Atomic, idempotent enter (SPEC §4).
    async fn enter(
        &self,
        target: QueueTarget,
        user: u64,
        now: Now,
        capacity: u64,
    ) -> Result<EnterOutcome, StoreError>;

    /// Heartbeat plus admission check; on admission stores `candidate` unless a token is stored
    /// already, and answers whichever token is stored.
    async fn poll(
        &self,
        target: QueueTarget,
        user: u64,
        now: Now,
        candidate: &TokenCandidate,
    ) -> Result<PollOutcome, StoreError>;

    /// Leaves the queue and drops an unused token. Idempotent.
    async fn leave(&self, target: QueueTarget, user: u64) -> Result<(), StoreError>;

    /// Cluster-wide figures for one target.
    async fn stats(&self, target: QueueTarget, now: Now) -> Result<QueueStats, StoreError>;

    /// Whether the store currently answers (for `/readyz`).
    async fn ping(&self) -> Result<(), StoreError>;
}
