//! Queue state behind one trait, `QueueStore`, with two implementations: `RedisStore` (all state in
//! Redis, shared by every gateway replica, SPEC §9) and `MemoryStore` (in-process, single instance
//! only, the embedded default). One contract test suite runs against both.
//!
//! A store answers in terms of the domain (`EntryStatus`, `QueueStats`); it never builds HTTP
//! responses and never mints tokens itself: the caller passes a ready candidate token in, so both
//! stores store exactly the bytes the gateway signed.

mod breaker;
mod guard;
pub mod liveness;
mod memory;
mod redis;
mod replies;
mod scripts;

use async_trait::async_trait;

use crate::queue::{QueueStats, QueueTarget};
use crate::sale::{FieldError, Sale, SalePatch};

pub use guard::{GuardConfig, StoreGuard};
pub use memory::MemoryStore;
pub use redis::url::{Deployment, RedisUrl};
pub use redis::RedisStore;
pub use scripts::REGISTERED_KEY;

/// How long the per-target keys live after their last write (SPEC §4: idle targets vanish).
pub const TARGET_KEY_TTL_SECS: u64 = 30 * 60;

/// How many admission wait samples a target keeps for its statistics.
pub const WAIT_SAMPLES: usize = 1024;

/// The window over which `admissionRatePerSec` is computed.
pub const RATE_WINDOW_MS: u64 = 30_000;

/// Default cap on targets with a live queue (`queue.max_active_targets`).
pub const DEFAULT_MAX_TARGETS: usize = 1000;

/// Redis memory per waiting user, measured by `benches/redis_memory.rs` at 100,000 users (112),
/// rounded up for the heartbeat windows kept alive at once (about 0.2 bytes per user each).
pub const BYTES_PER_WAITING_USER: u64 = 120;

/// How many advance samples (time, mark) a target keeps for its rate.
pub const ADVANCE_SAMPLES: usize = 64;

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached (disconnected, refused): callers degrade per their mode.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store did not answer within the deadline.
    #[error("store did not answer in time")]
    Timeout,
    /// This replica already has as many store calls in flight as it allows: refused at once
    /// instead of queued into timeouts.
    #[error("store saturated: too many calls in flight")]
    Saturated,
    /// Redis refused a write because it reached `maxmemory`. Not an outage: Redis answers, it
    /// only takes no new state (new enters are refused, everything else goes on).
    #[error("store out of memory")]
    OutOfMemory,
    /// The store answered with something the gateway does not understand (a bug, not an outage).
    #[error("unexpected store reply: {0}")]
    Protocol(String),
}

impl StoreError {
    /// Whether the caller should degrade (fail open per its mode) rather than report an answer.
    pub fn is_outage(&self) -> bool {
        !matches!(self, StoreError::OutOfMemory)
    }
}

/// Signs a token for the user being admitted, when the store finds that one is needed (once per
/// user: a waiting poll signs nothing).
pub type Mint<'a> = &'a (dyn Fn() -> TokenCandidate + Send + Sync);

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
    /// The sale's pre-queue has not opened yet (`prequeueOpensAt`).
    Early,
    /// A new target would exceed the cap on active targets (clients choose target ids, so the
    /// number of queues must be bounded).
    TooManyTargets,
}

/// What `poll` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PollOutcome {
    Waiting {
        seq: u64,
        ahead: u64,
    },
    /// `waited_ms` is set on the poll that issued the token: the time since the user entered.
    Admitted {
        token: String,
        expires_at: u64,
        waited_ms: Option<u64>,
    },
    /// Never entered, left, evicted, or the token expired.
    NotInQueue,
}

/// One call to the instance registry.
#[derive(Debug, Clone, Copy)]
pub struct Registering<'a> {
    /// This instance's id (never contains `|`).
    pub instance: &'a str,
    /// The paced share this instance asks to record: what it would admit per tick if cut off
    /// from the store.
    pub share: u32,
    /// The batch size: the recorded shares never add up to more.
    pub batch: u32,
    /// An instance that registered within this window counts as live.
    pub live_window: std::time::Duration,
    /// How long an instance that stopped registering stays in the registry.
    pub recent_window: std::time::Duration,
    /// A clean shutdown: remove this instance instead of recording it.
    pub leave: bool,
    /// How long this instance's users could not heartbeat (an outage or shedding episode in
    /// progress or recent, `StoreGuard::outage_credit_ms`): every pump's sweep credits it.
    pub credit_ms: u64,
}

/// The instance registry's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instances {
    /// Instances that registered within the live window: the replica count.
    pub live: u32,
    /// Instances that registered within the recent window (live ones included).
    pub recent: u32,
    /// The shares recorded by the instances that are recent but not live (they stopped
    /// registering without a clean shutdown and may be pacing on their own).
    pub reserved: u32,
    /// How many of those recorded no share (a gateway version that records none).
    pub unrecorded: u32,
    /// The share recorded for this instance: what it asked for, or less if the others' shares
    /// leave less of the batch (never less than the smaller of what it asked for and what it
    /// held before). 0 when leaving.
    pub recorded: u32,
    /// The largest credit the live instances reported: no pump evicts for time in which some
    /// replica could not take its users' heartbeats.
    pub credit_ms: u64,
}

/// What one `advance` call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advance {
    pub outcome: AdvanceOutcome,
    /// The admission mark after the call.
    pub admitted_count: u64,
    /// Live users admitted by this call (0 unless `Advanced`).
    pub admitted_now: u64,
    /// Users in the waiting set (including admitted ones that have not polled yet).
    pub waiting: u64,
    /// With `Guarded`: how long until the next advance is allowed.
    pub retry_in_ms: u64,
    /// The sale's batch size and tick as the step read them (the pump schedules by the tick).
    pub batch_size: u32,
    pub tick_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdvanceOutcome {
    Advanced,
    /// Refused: the last advance of this target was less than the minimum interval ago.
    Guarded,
    /// Nobody above the mark to admit.
    Idle,
    /// The sale is paused: nobody admitted, everyone keeps their place.
    Paused,
    /// An opening is announced and the draw has not run: nobody admitted. `retry_in_ms` is the
    /// time until the opening; 0 once the draw is due.
    Prequeue,
}

/// The pre-queue at its draw (`QueueStore::draw_entrants`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrawStep {
    /// No opening, or not reached yet.
    NotYet,
    /// The draw has run.
    Drawn,
    /// The users to place: (user, seq) with every seq at most `draw_seq`, and the seed (hex).
    Entrants {
        draw_seq: u64,
        seed: String,
        entrants: Vec<(u64, u64)>,
    },
}

/// The whole batch, in the millionths `QueueStore::advance` takes.
pub const WHOLE_BATCH_PPM: u32 = 1_000_000;

/// Everything a request needs from the clock, read once per request.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub epoch_ms: u64,
}

#[async_trait]
pub trait QueueStore: Send + Sync + 'static {
    /// `memory` or `redis`, for logs and metrics.
    fn kind(&self) -> &'static str;

    /// Atomic, idempotent enter (SPEC §4), within the sale's `maxCapacity`. The first enter of a
    /// target nobody created a sale for creates it from the store's `SaleDefaults`.
    async fn enter(
        &self,
        target: QueueTarget,
        user: u64,
        now: Now,
    ) -> Result<EnterOutcome, StoreError>;

    /// Heartbeat plus admission check; on admission stores a token from `mint` unless one is
    /// stored already, and answers whichever token is stored. A waiting user's poll only
    /// heartbeats (it does not extend the target's key TTL; enter, admission steps and token
    /// issue do).
    async fn poll(
        &self,
        target: QueueTarget,
        user: u64,
        now: Now,
        mint: Mint<'_>,
    ) -> Result<PollOutcome, StoreError>;

    /// Leaves the queue and drops an unused token. Idempotent.
    async fn leave(&self, target: QueueTarget, user: u64) -> Result<(), StoreError>;

    /// Cluster-wide figures for one target.
    async fn stats(&self, target: QueueTarget, now: Now) -> Result<QueueStats, StoreError>;

    /// Whether the store currently answers (for `/readyz`).
    async fn ping(&self) -> Result<(), StoreError>;

    /// Whether the store currently takes writes (the health probe): a Redis that is loading,
    /// read-only after a failover or refusing writes after a failed save answers `PING` but
    /// cannot run the queue.
    async fn probe(&self) -> Result<(), StoreError> {
        self.ping().await
    }

    /// Whether start-up is over: connected with scripts loaded, or given up waiting and failing
    /// open. `/readyz` waits for it so the first requests do not fail open needlessly.
    fn started(&self) -> bool {
        true
    }

    /// Targets the pump should visit (the pump retires those it finds empty twice).
    async fn active_targets(&self, now: Now) -> Result<Vec<QueueTarget>, StoreError>;

    /// Takes a target whose queue stayed empty off the active set, so it no longer counts
    /// against `max_active_targets` (its next enter adds it again).
    async fn retire_target(&self, _target: QueueTarget) -> Result<(), StoreError> {
        Ok(())
    }

    /// Tries to take the target's pump lock for `ttl` (shorter than a tick) as `owner`.
    async fn try_lock(
        &self,
        target: QueueTarget,
        owner: &str,
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError>;

    /// Releases the lock if `owner` still holds it.
    async fn unlock(&self, target: QueueTarget, owner: &str) -> Result<(), StoreError>;

    /// One admission step (SPEC §5) of at most `share_ppm` millionths of the sale's `batchSize`
    /// (`WHOLE_BATCH_PPM`: all of it), refused within 0.95 of the sale's `tickMs` of the previous
    /// one; nobody while the sale is paused. The Redis store times the guard with Redis' own clock
    /// and ignores `now`; the memory store uses `now`, which lets a simulation drive it in
    /// virtual time.
    async fn advance(
        &self,
        target: QueueTarget,
        share_ppm: u32,
        now: Now,
    ) -> Result<Advance, StoreError>;

    /// Evicts at most `max` waiting users with no heartbeat since `now` minus the sale's
    /// `heartbeatTimeoutS` minus `credit_ms` (time in which some replica could not take its
    /// users' heartbeats), in heartbeat windows of the sale's width (`liveness.rs`).
    async fn sweep(
        &self,
        target: QueueTarget,
        credit_ms: u64,
        max: u32,
        now: Now,
    ) -> Result<u64, StoreError>;

    /// The sale's stored parameters, if it exists.
    async fn sale(&self, target: QueueTarget) -> Result<Option<Sale>, StoreError>;

    /// An operator's change of a sale (created from the store's `SaleDefaults` if new): the
    /// stored sale after it, its version one higher; or the field the stored sale refuses to
    /// change (`Sale::merged`'s rules: the opening after the draw, a pre-queue after the
    /// opening).
    async fn put_sale(
        &self,
        target: QueueTarget,
        patch: &SalePatch,
        now: Now,
    ) -> Result<Result<Sale, FieldError>, StoreError>;

    /// Writes `sale` back when the stored one is missing or older (Redis lost it); answers the
    /// stored sale after the call.
    async fn restore_sale(&self, target: QueueTarget, sale: &Sale) -> Result<Sale, StoreError>;

    /// Drops a sale and its queue (waiting users are no longer known; tokens already issued stay
    /// valid until they expire). False when there was no sale.
    async fn delete_sale(&self, target: QueueTarget) -> Result<bool, StoreError>;

    /// The draw's first step, at or after the sale's opening: closes the pre-queue (every later
    /// enter gets a seq after `draw_seq`) and answers its users.
    async fn draw_entrants(&self, target: QueueTarget, now: Now) -> Result<DrawStep, StoreError>;

    /// The draw's second step: gives each entrant its new seq (`places`, from `draw::places`),
    /// in one atomic step, if the entrants are still exactly those `draw_entrants` answered
    /// (false otherwise: nothing written, the caller starts over). Records the order, the time
    /// and the count; the heartbeat windows restart (they are kept by seq).
    async fn apply_draw(
        &self,
        target: QueueTarget,
        draw_seq: u64,
        places: &[(u64, u64)],
        now: Now,
    ) -> Result<bool, StoreError>;

    /// The draw's order (user ids, first admitted first), once it has run.
    async fn draw_order(&self, target: QueueTarget) -> Result<Vec<u64>, StoreError>;

    /// Adds `target` to, or removes it from, the registered sales every replica reads
    /// (`queue:targets`): the list of sales replicas write back after a data loss, and the sales
    /// `queue.targets = "registered"` admits. The memory store has no shared list (its replica's
    /// registry is the list).
    async fn register_sale(&self, _target: QueueTarget, _on: bool) -> Result<(), StoreError> {
        Ok(())
    }

    /// Claims a token for single use (`SET NX`, expiring with the token) on behalf of `owner`
    /// (unique per purchase attempt). False when it was claimed already by another owner; true
    /// again for the same owner, so a call retried after a lost or late reply does not take its
    /// own claim for a second use.
    async fn claim(
        &self,
        target: QueueTarget,
        token_id: &str,
        owner: &str,
        ttl: std::time::Duration,
        now: Now,
    ) -> Result<bool, StoreError>;

    /// Gives a claim back (the backend refused the purchase, so the user may retry).
    async fn release(&self, target: QueueTarget, token_id: &str) -> Result<(), StoreError>;

    /// The entry token the queue issued to `user` of `target` and still holds (unexpired), if
    /// any: the gate's check of a token issued before the queue was last turned on.
    async fn stored_token(
        &self,
        target: QueueTarget,
        user: u64,
        now: Now,
    ) -> Result<Option<String>, StoreError>;

    /// Records that an instance is alive with its paced share (the pump calls it every tick
    /// while its store answers; `leave` removes it on a clean shutdown) and answers what the
    /// registry holds.
    async fn register_instance(&self, r: Registering<'_>) -> Result<Instances, StoreError>;

    /// Rebuilds the connection (asked for by the breaker when probes keep timing out).
    async fn reconnect(&self) {}

    /// When the store last sent any reply (epoch ms; 0: never or not tracked), late replies to
    /// calls whose callers gave up included: a store that answers late is slow (or this replica
    /// is overloaded), not down.
    fn last_reply_ms(&self) -> u64 {
        0
    }
}
