//! Queue state behind one trait, `QueueStore`, with two implementations: `RedisStore` (all state in
//! Redis, shared by every gateway replica, docs/redis.md#keys) and `MemoryStore` (in-process,
//! single instance only, the embedded default). One contract test suite runs against both.
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
use crate::slice::Slice;

pub use guard::{GuardConfig, StoreGuard};
pub use memory::MemoryStore;
pub use redis::url::{Deployment, RedisUrl};
pub use redis::RedisStore;
pub use scripts::{presence_channel, REGISTERED_KEY};

/// How long the per-target keys live after their last write (idle targets vanish:
/// docs/api.md#idle-queues).
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
/// user: a waiting poll signs nothing); `None` holds the issue back (the poll answers `Due`).
pub type Mint<'a> = &'a (dyn Fn() -> Option<TokenCandidate> + Send + Sync);

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
    /// Admitted at place `seq`, and no token issued yet: the caller's `Mint` held it back
    /// (right after a long outage or a rollback, while the replicas write back what they handed
    /// out, docs/state.md).
    Due {
        seq: u64,
    },
}

/// One call to the replica roster.
#[derive(Debug, Clone, Copy)]
pub struct RosterEntry<'a> {
    /// This instance's id (never contains `|`).
    pub instance: &'a str,
    /// The replica's stable name (`server.replica_name`; empty: none): a newer instance with the
    /// same name retires this one from the roster.
    pub name: &'a str,
    /// The slice of the batch this instance asks to record: what it would admit per tick if cut
    /// off from the store (`slice.rs`).
    pub asked: Slice,
    /// This file's batch size (for the gateways of older versions, which record shares of it).
    pub batch: u32,
    /// `fail_open.min_replicas`: the slices are never wider than a batch over this many.
    pub min_replicas: u32,
    /// The highest roster clock this instance was answered, and the rollbacks it knows.
    pub clock_seen: u64,
    pub rollbacks_known: u64,
    /// This instance's presence subscription, if it keeps one the roster may trust
    /// (`presence.rs`).
    pub presence: Option<PresenceKind>,
    /// An instance that registered within this window counts as live.
    pub live_window: std::time::Duration,
    /// How long an instance that stopped registering stays in the roster.
    pub recent_window: std::time::Duration,
    /// A clean shutdown: remove this instance instead of recording it.
    pub leave: bool,
    /// How long this instance's users could not heartbeat (an outage or shedding episode in
    /// progress or recent, `StoreGuard::outage_credit_ms`): every pump's sweep credits it.
    pub credit_ms: u64,
}

/// What taking a token's claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimTake {
    /// Pending for this attempt; the token's attempts so far, this one included.
    Taken { attempts: u32 },
    /// A purchase with it went through.
    Spent,
    /// Another attempt's purchase is in flight (its lease holds).
    InFlight,
    /// Tried `max_attempts` times already.
    Exhausted,
}

/// What becomes of an attempt's pending claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// The backend answered 2xx or 3xx: the token is spent.
    Spend,
    /// The backend answered 4xx or 5xx: the token may be tried again.
    GiveBack,
    /// The attempt never reached the backend: given back, and it does not count.
    Undo,
    /// Still in flight: the lease runs on.
    Renew,
}

impl Settle {
    pub fn as_str(self) -> &'static str {
        match self {
            Settle::Spend => "spend",
            Settle::GiveBack => "give",
            Settle::Undo => "undo",
            Settle::Renew => "renew",
        }
    }
}

/// The terms of a token's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimTerms {
    /// How long the claim is kept: until the token has expired on every instance.
    pub ttl: std::time::Duration,
    /// How long a pending claim holds without being renewed (its replica may have died).
    pub lease: std::time::Duration,
    /// `token.max_attempts`: how many purchases one token may try in all.
    pub max_attempts: u32,
}

/// The replica roster's answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Roster {
    /// Roster that registered within the live window: the replica count.
    pub live: u32,
    /// Roster that registered within the recent window (live ones included).
    pub recent: u32,
    /// The slices recorded by the instances that are recent but not live (they stopped
    /// registering and may be pacing on their own), known dead or retired ones left out.
    pub held_back: Vec<Slice>,
    /// Users per tick of this file's batch the instances of older versions among those may pace.
    pub held_back_legacy: u32,
    /// The slice recorded for this instance: the largest piece of what it asked for that no
    /// other member holds, containing what it held of it. Empty when leaving.
    pub recorded: Slice,
    /// The slice this instance should ask for next (its seat among the members).
    pub desired: Slice,
    /// The largest credit the live instances reported: no pump evicts for time in which some
    /// replica could not take its users' heartbeats.
    pub credit_ms: u64,
    /// A newer instance with this replica's name retired this one: it is not recorded.
    pub retired: bool,
    /// The roster saw this instance's presence subscription.
    pub presence_seen: bool,
    /// Members this registration dropped as dead (their presence subscription closed).
    pub dead: u32,
    /// Members this registration dropped as retired (a newer instance with their name).
    pub retired_others: u32,
    /// The roster's clock after this registration (`roster.lua`; 0: not kept, as on the
    /// memory store or in a leave).
    pub clock: u64,
    /// How many times a registration found Redis behind what an instance was answered before
    /// (a rollback or a loss of the clock), docs/state.md.
    pub rollbacks: u64,
}

/// How an instance's presence subscription is kept: a classic channel, or a sharded one (in a
/// cluster, on the node that holds the roster's slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PresenceKind {
    Classic,
    Shard,
}

impl PresenceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PresenceKind::Classic => "classic",
            PresenceKind::Shard => "shard",
        }
    }
}

/// What one `advance` call did.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The sequence counter after the call.
    pub seq: u64,
    /// The losses of this target's state the scripts found and repaired so far
    /// (`queue:{T}:losses`: kind, count), docs/state.md. Always empty on the memory store.
    pub losses: Vec<(String, u64)>,
    /// An operator deleted the sale lately: what was seen of its queue is no floor any more.
    pub deleted: bool,
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

impl AdvanceOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            AdvanceOutcome::Advanced => "advanced",
            AdvanceOutcome::Guarded => "guarded",
            AdvanceOutcome::Idle => "idle",
            AdvanceOutcome::Paused => "paused",
            AdvanceOutcome::Prequeue => "prequeue",
        }
    }

    fn parse(s: &str) -> Option<AdvanceOutcome> {
        [
            AdvanceOutcome::Advanced,
            AdvanceOutcome::Guarded,
            AdvanceOutcome::Idle,
            AdvanceOutcome::Paused,
            AdvanceOutcome::Prequeue,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }
}

/// How long a sale's console history reaches back.
pub const TICKS_KEPT_MS: u64 = 10 * 60 * 1000;

/// One pump visit that ran a sale's admission step, as the operator console charts it
/// (`QueueStore::record_tick`, `ticks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickFigures {
    /// When the visit ended (epoch ms).
    pub at_ms: u64,
    /// Users admitted by this visit.
    pub admitted: u64,
    /// Users this visit evicted (silent past the heartbeat timeout).
    pub evicted: u64,
    /// Users waiting after it.
    pub waiting: u64,
    /// The sale's budget per tick (its batch size) as the step read it.
    pub batch: u64,
    pub outcome: AdvanceOutcome,
}

impl TickFigures {
    /// Entries to keep for a sale with this tick: `TICKS_KEPT_MS` of them.
    pub fn keep(tick_ms: u64) -> u32 {
        u32::try_from(TICKS_KEPT_MS.div_ceil(tick_ms.max(1))).unwrap_or(u32::MAX)
    }

    /// `at:admitted:evicted:waiting:batch:outcome`, as `ticks.lua` stores it.
    pub fn encode(&self) -> String {
        format!(
            "{}:{}:{}:{}:{}:{}",
            self.at_ms,
            self.admitted,
            self.evicted,
            self.waiting,
            self.batch,
            self.outcome.as_str()
        )
    }

    pub fn decode(s: &str) -> Option<TickFigures> {
        let mut parts = s.split(':');
        let mut number = || parts.next()?.parse::<u64>().ok();
        let figures = TickFigures {
            at_ms: number()?,
            admitted: number()?,
            evicted: number()?,
            waiting: number()?,
            batch: number()?,
            outcome: AdvanceOutcome::Advanced,
        };
        let outcome = AdvanceOutcome::parse(parts.next()?)?;
        parts
            .next()
            .is_none()
            .then_some(TickFigures { outcome, ..figures })
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "at": self.at_ms,
            "admitted": self.admitted,
            "evicted": self.evicted,
            "waiting": self.waiting,
            "batch": self.batch,
            "outcome": self.outcome.as_str(),
        })
    }
}

/// One member of the replica roster, for operators (`QueueStore::roster_members`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RosterMember {
    /// The instance id (one process's life).
    pub instance: String,
    /// The replica's stable name (`server.replica_name_env`; empty: none).
    pub name: String,
    /// The slice of each batch it holds ("start:end" in millionths; empty: none recorded, an
    /// older gateway's member).
    pub slice: String,
    /// Its last registration (epoch ms).
    pub last_seen_ms: u64,
    /// The heartbeat credit it last reported: how long its users could not heartbeat through it
    /// (a store outage, or polls refused for saturation). Above 0: it was degraded lately.
    pub credit_ms: u64,
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
pub const WHOLE_BATCH_PPM: u32 = crate::slice::UNIT;

/// The part of a sale's batch one admission step may admit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// At most this many millionths of the batch (rounded down).
    pub ppm: u32,
    /// What the slices of the replicas that may be pacing on their own admit in the step's tick
    /// is held back (`slice.rs`).
    pub held_back: Vec<Slice>,
    /// Only what this slice admits in the step's tick (a pump whose registration failed admits
    /// its own recorded slice: the others' never overlap it).
    pub only: Option<Slice>,
}

impl Part {
    /// All of the batch.
    pub fn whole() -> Part {
        Part::ppm(WHOLE_BATCH_PPM)
    }

    /// `ppm` millionths of the batch.
    pub fn ppm(ppm: u32) -> Part {
        Part {
            ppm,
            held_back: Vec::new(),
            only: None,
        }
    }

    /// The users this part admits of a sale whose batch is `batch`, in tick `tick` (since the
    /// epoch, in the sale's ticks).
    pub fn users(&self, batch: u32, tick: u64) -> u32 {
        let b = u64::from(batch);
        let mut n = b * u64::from(self.ppm.min(WHOLE_BATCH_PPM)) / u64::from(WHOLE_BATCH_PPM);
        n = match self.only {
            Some(only) => n.min(only.cells(b, tick)),
            None => n.saturating_sub(crate::slice::cells_of(&self.held_back, b, tick)),
        };
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The part as `advance.lua` reads it (its `ARGV[6]`): "" (none), "=start:end" (only) or
    /// "-start:end,..." (held back); a step with both holds back within the only slice, which
    /// the roster keeps disjoint from the others, so "only" alone says it.
    pub fn script_arg(&self) -> String {
        if let Some(only) = self.only {
            return format!("={only}");
        }
        if self.held_back.is_empty() {
            return String::new();
        }
        let list: Vec<String> = self.held_back.iter().map(|s| s.to_string()).collect();
        format!("-{}", list.join(","))
    }
}

/// The clock's reading the store's operations take (`clock.rs`).
pub use crate::clock::Now;

#[async_trait]
pub trait QueueStore: Send + Sync + 'static {
    /// `memory` or `redis`, for logs and metrics.
    fn kind(&self) -> &'static str;

    /// Atomic, idempotent enter (docs/api.md#enter), within the sale's `maxCapacity`. The first
    /// enter of a target nobody created a sale for creates it from the store's `SaleDefaults`.
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

    /// Puts `user` back at the place `seq` of its signed queue ticket when the store lost it
    /// (`rejoin.lua`, docs/state.md): only a place nothing else took (not left, evicted,
    /// issued, nor held by another user). Answers as a poll would; `NotInQueue` when the place
    /// does not stand. The memory store never loses a place: a user not waiting there left,
    /// was evicted or was admitted.
    async fn rejoin(
        &self,
        target: QueueTarget,
        user: u64,
        seq: u64,
        now: Now,
        mint: Mint<'_>,
    ) -> Result<PollOutcome, StoreError>;

    /// Records an admission made while the store could not be used (paced fail-open): the
    /// user's token (`expires_at`) becomes the stored one unless one is stored already, and the
    /// user leaves the waiting room, so the pump never admits the same user again
    /// (`paced.lua`). Returns whether it was written.
    async fn record_paced(
        &self,
        target: QueueTarget,
        user: u64,
        token: &TokenCandidate,
        now: Now,
    ) -> Result<bool, StoreError>;

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

    /// One admission step (docs/ARCHITECTURE.md#the-admission-pump) of at most the `part` of the
    /// sale's `batchSize` (`Part`) in the step's tick (`now` over the sale's `tickMs`), refused
    /// within 0.95 of the sale's `tickMs` of the previous one; nobody while the sale is paused. The
    /// Redis store times the guard with Redis' own clock and ignores `now`; the memory store uses
    /// `now`, which lets a simulation drive it in virtual time.
    async fn advance(
        &self,
        target: QueueTarget,
        part: &Part,
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
    /// allowed sales are the list).
    async fn register_sale(&self, _target: QueueTarget, _on: bool) -> Result<(), StoreError> {
        Ok(())
    }

    /// Takes a token's single-use claim (`claim.lua`) for the purchase attempt `owner`: pending
    /// under a lease while the purchase is in flight. Taken again by the same attempt (a call
    /// retried after a lost reply is not a second use); refused while another attempt's lease
    /// holds, once spent, and after `terms.max_attempts` attempts.
    async fn claim(
        &self,
        target: QueueTarget,
        token_id: &str,
        owner: &str,
        terms: ClaimTerms,
        now: Now,
    ) -> Result<ClaimTake, StoreError>;

    /// Settles or renews attempt `owner`'s pending claim: whether the claim changed (spending
    /// always does; the others only act on the attempt's own pending claim).
    async fn settle(
        &self,
        target: QueueTarget,
        token_id: &str,
        owner: &str,
        settle: Settle,
        terms: ClaimTerms,
        now: Now,
    ) -> Result<bool, StoreError>;

    /// The entry token the queue issued to `user` of `target` and still holds (unexpired), if
    /// any: the gate's check of a token issued before the queue was last turned on.
    async fn stored_token(
        &self,
        target: QueueTarget,
        user: u64,
        now: Now,
    ) -> Result<Option<String>, StoreError>;

    /// This instance's presence subscription for the roster (`redis/presence.rs`), started
    /// at the first call: the kind, where the roster may trust it (Redis keeps a silent
    /// connection at least `window`, how long a cut-off replica paces). None for a store with
    /// no other instances, or where it cannot be trusted.
    async fn presence(
        &self,
        _instance: &str,
        _window: std::time::Duration,
    ) -> Option<PresenceKind> {
        None
    }

    /// Whether the last registration saw the presence subscription.
    fn presence_seen(&self, _seen: bool) {}

    /// Records in the replica roster that an instance is alive with its paced slice (the pump
    /// calls it every tick while its store answers; `leave` removes it on a clean shutdown) and
    /// answers what the roster holds.
    async fn update_roster(&self, r: RosterEntry<'_>) -> Result<Roster, StoreError>;

    /// The roster's members as they stand, for operators (nothing is changed).
    async fn roster_members(&self) -> Result<Vec<RosterMember>, StoreError>;

    /// Adds a pump visit to the sale's console history, which keeps the last `keep` and goes
    /// `TICKS_KEPT_MS` after the last visit.
    async fn record_tick(
        &self,
        target: QueueTarget,
        figures: TickFigures,
        keep: u32,
    ) -> Result<(), StoreError>;

    /// The sale's console history after `since_ms`, oldest first.
    async fn ticks(
        &self,
        target: QueueTarget,
        since_ms: u64,
    ) -> Result<Vec<TickFigures>, StoreError>;

    /// Rebuilds the connection (asked for by the breaker when probes keep timing out).
    async fn reconnect(&self) {}

    /// When the store last sent any reply (epoch ms; 0: never or not tracked), late replies to
    /// calls whose callers gave up included: a store that answers late is slow (or this replica
    /// is overloaded), not down.
    fn last_reply_ms(&self) -> u64 {
        0
    }

    /// The highest admission mark of `target` this replica read from the store, while it is
    /// still a floor (0: none, or a store that keeps no such memory).
    fn mark_seen(&self, _target: QueueTarget, _now_ms: u64) -> u64 {
        0
    }

    /// When a connection to the store last broke or failed to open (epoch ms; 0: never, or a
    /// store without connections): what answers after it may be a server that went back in time.
    fn connection_broke_ms(&self) -> u64 {
        0
    }
}
