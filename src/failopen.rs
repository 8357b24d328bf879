//! What a replica does while its store cannot be used (Redis down, hung, or shedding load): the
//! fail-open policy (`fail_open.mode`) and the paced budget that keeps its promise. (The
//! single-use claims it takes meanwhile are `claims/`.)
//!
//! - `Pacer`: in `paced` mode (the default) a replica still enforces the admission budget by
//!   itself: per target and tick it lets through at most what its *slice* of the batch admits in
//!   that tick (`slice.rs`: disjoint slices never admit more than the batch together in any
//!   tick, and a batch smaller than the replica count rotates between them). Each registration
//!   asks the replica roster for the seat the roster last told it (`roster.lua`), and
//!   the roster records the largest piece of it no other member holds: the recorded slices
//!   never overlap. Each pump holds back what the slices of the replicas that stopped
//!   registering admit (they may be cut off from Redis and pacing) for `paced_for` after their
//!   last registration, unless the roster knows them gone (their presence connection closed:
//!   the process died; or a newer instance with their replica name registered). A replica paces
//!   only while every pump is sure to be doing that:
//!   - not before `pace_after` (4 command timeouts + the roster's live window + a tick) has
//!     passed since it last sent a registration (until then a pump may still count it live and
//!     admit the whole batch); its pump sends none, and admits nobody, while its store is failing;
//!   - not after `paced_for − 2 ticks` since the last registration Redis confirmed (from then on
//!     the pumps forget it and admit the whole batch again); it then admits nobody until the
//!     store answers;
//!   - never before its first confirmed registration (nobody holds anything back for it), and
//!     never in a tick in which the store still answered it;
//!   - with what it held of the slice it last asked for, should that registration's answer be
//!     lost (the roster then holds that part either way).
//!
//!   The pump (`pump.rs`) keeps its side: an advance is sent only within the tick of the
//!   roster reading it relies on, and not in a tick in which its own replica paced; a pump
//!   whose registration failed admits only what its own recorded slice admits.
//!
//!   So in every tick a pump's batch plus what the slices it holds back admit is at most the
//!   batch, and in an outage of every replica at once the paced slices admit at most the batch.
//!
//! No I/O: the caller passes the clock.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::queue::QueueTarget;
use crate::slice::Slice;

/// `fail_open.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailOpenMode {
    /// Each replica admits at most its share of the budget per tick; the rest wait.
    Paced,
    /// Everyone is let through with a stateless token (the seed's behaviour; the backend sees the
    /// whole crowd during an outage).
    Open,
    /// Nobody is let through: enter and poll answer 503 with `Retry-After` until the store is back.
    Closed,
}

impl FailOpenMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FailOpenMode::Paced => "paced",
            FailOpenMode::Open => "open",
            FailOpenMode::Closed => "closed",
        }
    }
}

/// What a degraded enter or poll answers (`decide`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The mode decided by (`open` answers like `paced` when the replica only refused the call
    /// itself).
    pub mode: FailOpenMode,
    /// The metric's outcome label: `direct_admitted`, `waiting`, `held` or `refused`.
    pub outcome: &'static str,
    pub answer: Answer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Let through with a stateless token (`DIRECT_ADMITTED`, degraded).
    Admit,
    /// A degraded `WAITING`: poll again after this many seconds.
    Wait { retry_after_s: u64 },
    /// 503 `QUEUE_UNAVAILABLE`, retry after this many seconds.
    Refuse { retry_after_s: u64 },
}

/// The fail-open decision for an enter or poll the store could not serve: the mode, why the
/// store failed (`saturated`: this replica refused the call itself while Redis still answers,
/// so `open` lets nobody through unmetered and answers like `paced`), and in `paced` mode the
/// pacer's verdict for the user (`seq`: the seq of the queue ticket the user showed, asked only
/// in that mode). `now_ms` is read at the decision, not when the request began.
#[allow(clippy::too_many_arguments)]
pub fn decide(
    pacer: &Pacer,
    mode: FailOpenMode,
    saturated: bool,
    target: QueueTarget,
    user: u64,
    seq: impl FnOnce() -> Option<u64>,
    now_ms: u64,
    last_ok_ms: u64,
) -> Decision {
    let mode = match mode {
        FailOpenMode::Open if saturated => FailOpenMode::Paced,
        mode => mode,
    };
    let retry_after_s = pacer.retry_after_secs(now_ms);
    let (outcome, answer) = match mode {
        FailOpenMode::Open => ("direct_admitted", Answer::Admit),
        FailOpenMode::Closed => ("refused", Answer::Refuse { retry_after_s }),
        FailOpenMode::Paced => match pacer.admit(target, user, seq(), now_ms, last_ok_ms) {
            Pace::Admitted => ("direct_admitted", Answer::Admit),
            Pace::Spent => ("waiting", Answer::Wait { retry_after_s }),
            Pace::Held => ("held", Answer::Wait { retry_after_s }),
        },
    };
    Decision {
        mode,
        outcome,
        answer,
    }
}

/// How many targets a replica keeps a local budget for at once (clients choose target ids).
const MAX_PACED_TARGETS: usize = 4096;

/// An instance counts as live in the roster if it registered within 3 ticks, and never less
/// than this (short test ticks would otherwise drop live instances between two ticks).
const ROSTER_MIN_WINDOW_MS: u64 = 2000;

/// The timing the pacer and the replica roster share.
#[derive(Debug, Clone, Copy)]
pub struct PacerConfig {
    pub tick_ms: u64,
    pub batch: u32,
    /// `fail_open.min_replicas`: the share never assumes fewer replicas than this.
    pub min_replicas: u32,
    /// `fail_open.paced_for_s`: how long after its last registration a replica may pace, and how
    /// long the pumps lower their batch by the share of a replica that stopped registering.
    pub paced_for_ms: u64,
    /// The store's command timeout: how long after it was sent a registration may still land.
    pub call_timeout_ms: u64,
}

impl PacerConfig {
    /// An instance that registered within this window counts as live.
    pub fn live_window_ms(&self) -> u64 {
        self.tick_ms.saturating_mul(3).max(ROSTER_MIN_WINDOW_MS)
    }

    /// How long after its last registration attempt a cut-off replica waits before pacing: until
    /// the attempt can no longer land (a command timeout), every pump has stopped counting it
    /// live (the live window), and the longest a pump admits by one roster reading has passed
    /// (`pump.rs` reads again after a quarter tick, and sends advances by a reading only within
    /// the tick it was read in; a visit that began before then takes a lock, advances, may wait
    /// up to a quarter tick and advance again: under a tick and three command timeouts).
    pub fn pace_after_ms(&self) -> u64 {
        self.call_timeout_ms
            .saturating_mul(4)
            .saturating_add(self.live_window_ms())
            .saturating_add(self.tick_ms)
    }

    /// How long after its last confirmed registration a replica stops pacing: two ticks before
    /// the pumps forget it (one for the tick a pump's roster reading covers, one for rounding to
    /// tick boundaries).
    pub fn pace_until_ms(&self) -> u64 {
        self.paced_for_ms
            .saturating_sub(self.tick_ms.saturating_mul(2))
    }
}

#[derive(Debug)]
pub struct Pacer {
    cfg: PacerConfig,
    /// The live or recent replica count the roster last gave; 0 while never learned.
    replicas: AtomicU32,
    registration: Mutex<Registration>,
    budgets: Mutex<Budgets>,
    /// Each sale's batch and tick (ms) as the pump's last admission step read them from the
    /// sale's hash: a slice admits its cells of the sale's own budget (`share_for`). Bounded
    /// like the budgets.
    sales: Mutex<HashMap<QueueTarget, (u32, u64)>>,
    /// Each sale's admission mark as the pump's last step read it: a queue ticket at or below it
    /// proves a place that was already admitted, and gives no precedence. Bounded like `sales`.
    marks: Mutex<HashMap<QueueTarget, u64>>,
    /// Admissions made while pacing whose tokens are not recorded in the store yet (sale, user,
    /// token expiry): written back once it answers (`QueueStore::record_paced`), so the pump
    /// never admits those users again and their polls answer the same token.
    unrecorded: Mutex<Vec<(QueueTarget, u64, u64)>>,
    /// The replica roster's clock as this replica was last answered (docs/state.md).
    clock: Mutex<RosterClock>,
}

/// What this replica knows of the roster's clock (`roster.lua`).
#[derive(Debug, Default)]
struct RosterClock {
    /// The highest clock it was answered.
    seen: u64,
    /// The rollbacks the roster counted, once learned.
    rollbacks: Option<u64>,
    /// A rollback was learned and the write-back of what this replica remembers is due.
    pending: bool,
    /// New tokens are held back until then (epoch ms): every replica writes back what it
    /// handed out first.
    hold_until_ms: u64,
    /// A sale's state was found behind what this replica saw (`report_loss`): the next
    /// registration tells every replica, as a rollback.
    signal: bool,
    /// When this replica last learned of a rollback (epoch ms; 0: never).
    learned_ms: u64,
}

/// This replica's standing in the replica roster, as far as it knows.
#[derive(Debug, Default)]
struct Registration {
    /// The slice the roster holds for this replica whatever became of the attempts whose
    /// answer was lost: the one the last confirmed registration recorded, cut to the slice each
    /// attempt since asked for (an attempt records a piece of what it asked for that contains
    /// what it held of it).
    slice: Slice,
    /// The seat the roster last told this replica to ask for.
    desired: Slice,
    /// When the last registration Redis confirmed was sent (epoch ms).
    confirmed_ms: Option<u64>,
    /// When the confirmed registration before that one was sent (epoch ms; 0: none).
    confirmed_before_ms: u64,
    /// When the last registration attempt was sent (epoch ms).
    attempted_ms: u64,
}

#[derive(Debug, Default)]
struct Budgets {
    per_target: HashMap<QueueTarget, Budget>,
    /// Targets the pump last saw with a queue: they always get a budget, however many made-up
    /// targets clients send during an outage.
    known: std::collections::HashSet<QueueTarget>,
    /// The newest window anyone was let through in, and how many users of targets the pump did
    /// not know were let through in it.
    window: u64,
    strangers: usize,
}

/// How many users of targets the pump did not know a replica lets through per tick, all such
/// targets together: made-up targets cannot make it hold more than this (plus the known sales'
/// shares) however large the share.
const MAX_STRANGER_USERS: usize = 65_536;

#[derive(Debug, Clone)]
struct Budget {
    window: u64,
    /// Users let through in this window (a user who asks again gets through again without
    /// spending more of the budget: the same user, the same tick, the same token). A set: a
    /// share can be large, and every degraded enter and poll looks here.
    users: std::collections::HashSet<u64>,
    /// Users who showed a queue ticket (they were waiting before the store failed) and were not
    /// let through yet: (seq, user) → when last seen (epoch ms). Kept across ticks; the lowest
    /// `MAX_HOLDERS` seqs only.
    holders: std::collections::BTreeMap<(u64, u64), u64>,
    /// Users let through while pacing, in any tick: one who asks again gets through again
    /// without spending a later tick's share, with the same token (the same user's admission;
    /// a holder's ticket does not buy one a tick). At most `MAX_REMEMBERED` per sale.
    admitted: HashMap<u64, Admission>,
}

/// One user let through while pacing.
#[derive(Debug, Clone, Copy)]
struct Admission {
    /// Until when the admission is remembered (epoch ms): `paced_for` after it, or as long as
    /// its token lives if longer.
    until_ms: u64,
    /// The expiry of the token handed out for it (epoch s; 0 before the first answer).
    expires_at_s: u64,
}

/// The longest new tokens and purchases wait after a broken connection (`unsure_after_break`).
const MAX_UNSURE_MS: u64 = 5_000;

/// How many users let through a replica remembers per sale while it paces.
const MAX_REMEMBERED: usize = 65_536;

/// How many ticket holders a replica remembers per sale: the lowest seqs, which are the next to
/// be let through (a share's worth at most per tick).
const MAX_HOLDERS: usize = 256;

/// What the pacer decided for one degraded enter or poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Let through directly.
    Admitted,
    /// This tick's share is spent; the next tick has a new one.
    Spent,
    /// This replica may not pace now (see the module documentation): nobody is let through.
    Held,
}

impl Pacer {
    pub fn new(cfg: PacerConfig) -> Pacer {
        Pacer {
            cfg: PacerConfig {
                tick_ms: cfg.tick_ms.max(1),
                min_replicas: cfg.min_replicas.max(1),
                ..cfg
            },
            replicas: AtomicU32::new(0),
            registration: Mutex::new(Registration::default()),
            budgets: Mutex::new(Budgets::default()),
            sales: Mutex::new(HashMap::new()),
            marks: Mutex::new(HashMap::new()),
            unrecorded: Mutex::new(Vec::new()),
            clock: Mutex::new(RosterClock::default()),
        }
    }

    /// The highest roster clock this replica was answered, and the rollbacks it reports: the
    /// ones it knows, one more while a loss it found is to be told (`report_loss`).
    pub fn roster_clock(&self) -> (u64, u64) {
        let c = self.clock.lock();
        let known = c.rollbacks.unwrap_or(0);
        (c.seen, known + u64::from(c.signal && c.rollbacks.is_some()))
    }

    /// A sale's sequence or mark was found behind what a replica saw (the scripts repaired it):
    /// part of Redis went back in time, or a key was lost. Every replica is told as of a
    /// rollback (`roster.lua` takes the higher count), and each writes back the claims it
    /// spent and the tokens it signed: a shard of a cluster can fail over behind while the
    /// roster's shard does not.
    ///
    /// Losses found within two ticks and a second of a rollback this replica learned of are that
    /// rollback's (every replica is writing back already): not told again, so one failover does
    /// not hold tokens and purchases over and over.
    pub fn report_loss(&self, now_ms: u64) {
        let mut c = self.clock.lock();
        let recent = c.learned_ms > 0
            && now_ms
                < c.learned_ms
                    .saturating_add(self.cfg.tick_ms.saturating_mul(2))
                    .saturating_add(1000);
        if !recent {
            c.signal = true;
        }
    }

    /// A registration answered the roster's clock and rollbacks (0 and 0: not kept): true when
    /// it tells of a rollback this replica did not know of (not the ones before it started).
    pub fn saw_roster_clock(&self, clock: u64, rollbacks: u64, now_ms: u64) -> bool {
        let mut c = self.clock.lock();
        if clock == 0 {
            return false;
        }
        c.seen = c.seen.max(clock);
        let new = c.rollbacks.is_some_and(|known| rollbacks > known);
        c.rollbacks = Some(c.rollbacks.unwrap_or(0).max(rollbacks));
        if new {
            c.signal = false;
            c.learned_ms = now_ms;
            c.pending = true;
            // Every replica learns of it at its next registration (within a tick) and writes
            // back within a probe period.
            c.hold_until_ms = now_ms.saturating_add(self.cfg.tick_ms).saturating_add(500);
        }
        new
    }

    /// Whether new tokens are held back after a rollback (`saw_roster_clock`).
    pub fn issue_held(&self, now_ms: u64) -> bool {
        now_ms < self.clock.lock().hold_until_ms
    }

    /// Whether new tokens wait because a connection to the store broke at `broke_ms` (0:
    /// never): what answers since may be a server that went back in time, and a replica that
    /// signed tokens in the lost seconds writes them back only once it learns of the rollback.
    /// The wait ends when two registrations sent after the break are confirmed: every other
    /// replica registers once a tick, so by then each has registered since the store came
    /// back, and a rollback any of them found is known here (`saw_roster_clock`, which holds
    /// tokens on until the write-backs are done). It ends anyway four ticks (and command
    /// timeouts) after the break, and never later than `MAX_UNSURE_MS`: a replica that cannot
    /// register paces instead, and with ticks that long a rollback is found late anyway.
    pub fn unsure_after_break(&self, broke_ms: u64, now_ms: u64) -> bool {
        if broke_ms == 0 {
            return false;
        }
        let settled = self.registration.lock().confirmed_before_ms > broke_ms;
        let limit = self
            .cfg
            .tick_ms
            .saturating_add(self.cfg.call_timeout_ms)
            .saturating_mul(4)
            .min(MAX_UNSURE_MS);
        !settled && now_ms < broke_ms.saturating_add(limit)
    }

    /// Takes a pending write-back after a rollback (`saw_roster_clock`).
    pub fn take_rollback(&self) -> bool {
        std::mem::take(&mut self.clock.lock().pending)
    }

    /// Records a sale's admission mark as the pump's step read it.
    pub fn set_mark(&self, target: QueueTarget, mark: u64) {
        let mut marks = self.marks.lock();
        if marks.len() >= MAX_PACED_TARGETS && !marks.contains_key(&target) {
            let known = self.budgets.lock().known.clone();
            marks.retain(|t, _| known.contains(t));
            if marks.len() >= MAX_PACED_TARGETS {
                return;
            }
        }
        let m = marks.entry(target).or_insert(0);
        *m = (*m).max(mark);
    }

    /// The expiry of the token of `user`'s admission while pacing (`Pace::Admitted`): the one
    /// handed out first, as long as it lives, so every later answer carries the same token (one
    /// admission, one token, one purchase); `fresh_s` for the first answer. None when this
    /// replica holds no paced admission of the user.
    pub fn token_expiry(
        &self,
        target: QueueTarget,
        user: u64,
        fresh_s: u64,
        now_ms: u64,
    ) -> Option<u64> {
        let mut budgets = self.budgets.lock();
        let admission = budgets
            .per_target
            .get_mut(&target)?
            .admitted
            .get_mut(&user)?;
        if admission.until_ms <= now_ms {
            return None;
        }
        if admission.expires_at_s.saturating_mul(1000) <= now_ms {
            admission.expires_at_s = fresh_s;
            admission.until_ms = admission.until_ms.max(fresh_s.saturating_mul(1000));
            let mut unrecorded = self.unrecorded.lock();
            if unrecorded.len() < MAX_REMEMBERED {
                unrecorded.push((target, user, fresh_s));
            }
        }
        Some(admission.expires_at_s)
    }

    /// The expiry of a live token this replica handed `user` while pacing, if any: an admission
    /// through the store reuses it (the same user, the same token).
    pub fn remembered_expiry(&self, target: QueueTarget, user: u64, now_ms: u64) -> Option<u64> {
        let budgets = self.budgets.lock();
        let admission = budgets.per_target.get(&target)?.admitted.get(&user)?;
        (admission.expires_at_s.saturating_mul(1000) > now_ms).then_some(admission.expires_at_s)
    }

    /// Takes the paced admissions not yet recorded in the store.
    pub fn take_unrecorded(&self) -> Vec<(QueueTarget, u64, u64)> {
        std::mem::take(&mut *self.unrecorded.lock())
    }

    /// Gives back the paced admissions the store could not record yet.
    pub fn return_unrecorded(&self, mut left: Vec<(QueueTarget, u64, u64)>) {
        let mut unrecorded = self.unrecorded.lock();
        left.append(&mut unrecorded);
        left.truncate(MAX_REMEMBERED);
        *unrecorded = left;
    }

    /// Records a sale's batch and tick as read from its hash (the pump, at each admission step).
    pub fn set_sale(&self, target: QueueTarget, batch: u32, tick_ms: u64) {
        let mut sales = self.sales.lock();
        if sales.len() >= MAX_PACED_TARGETS && !sales.contains_key(&target) {
            let known = self.budgets.lock().known.clone();
            sales.retain(|t, _| known.contains(t));
            if sales.len() >= MAX_PACED_TARGETS {
                return;
            }
        }
        sales.insert(target, (batch, tick_ms.max(1)));
    }

    /// What `slice` admits of `target` in tick `window` (this file's ticks): the sale's batch
    /// per this file's tick, as the pump last read it (this file's batch for a sale it never
    /// read). With the sale's tick equal to this file's (the usual case), this is exactly what
    /// the pumps hold back for the slice (`advance.lua`).
    fn share_for(&self, target: QueueTarget, slice: Slice, window: u64) -> usize {
        let batch = match self.sales.lock().get(&target).copied() {
            Some((batch, tick_ms)) => u64::from(batch) * self.cfg.tick_ms / tick_ms.max(1),
            None => u64::from(self.cfg.batch),
        };
        usize::try_from(slice.cells(batch, window)).unwrap_or(usize::MAX)
    }

    pub fn config(&self) -> &PacerConfig {
        &self.cfg
    }

    /// The replica count the roster last gave (0: never learned).
    pub fn replicas(&self) -> u32 {
        self.replicas.load(Ordering::Relaxed)
    }

    /// The slice this replica asks for at its next registration: the seat the roster last
    /// told it (nothing before it heard one).
    pub fn slice_to_ask(&self) -> Slice {
        self.registration.lock().desired
    }

    /// A registration asking for `asked` is sent at `now_ms`.
    pub fn registering(&self, asked: Slice, now_ms: u64) {
        let mut r = self.registration.lock();
        r.attempted_ms = r.attempted_ms.max(now_ms);
        r.slice = r.slice.intersect(asked);
    }

    /// The registration sent at `sent_ms` recorded `recorded` and told this replica to ask for
    /// `desired` next; the roster counted `replicas` live or recent instances.
    pub fn registered(&self, recorded: Slice, desired: Slice, sent_ms: u64, replicas: u32) {
        let mut r = self.registration.lock();
        r.slice = recorded;
        r.desired = desired;
        match r.confirmed_ms {
            Some(last) if sent_ms <= last => {}
            last => {
                r.confirmed_before_ms = last.unwrap_or(0);
                r.confirmed_ms = Some(sent_ms);
            }
        }
        self.replicas.store(replicas, Ordering::Relaxed);
    }

    /// The slice the roster surely holds for this replica at `now_ms`: none once the roster
    /// may have forgotten it (after `pace_until` past its last confirmed registration).
    pub fn own_slice(&self, now_ms: u64) -> Slice {
        let r = self.registration.lock();
        match r.confirmed_ms {
            Some(c) if now_ms < c.saturating_add(self.cfg.pace_until_ms()) => r.slice,
            _ => Slice::EMPTY,
        }
    }

    /// Whether this replica let anyone through while degraded in tick `window` (since epoch).
    pub fn paced_in(&self, window: u64) -> bool {
        self.budgets.lock().window >= window
    }

    /// The slice this replica may pace with at `now_ms`, if it may pace at all.
    pub fn paced_slice(&self, now_ms: u64) -> Option<Slice> {
        let r = self.registration.lock();
        let confirmed = r.confirmed_ms?;
        let held_back = now_ms < r.attempted_ms.saturating_add(self.cfg.pace_after_ms());
        let forgotten = now_ms >= confirmed.saturating_add(self.cfg.pace_until_ms());
        (!held_back && !forgotten).then_some(r.slice)
    }

    /// Records the targets the pump found with a queue (they keep a budget whatever else fills
    /// the table).
    pub fn set_known(&self, targets: &[QueueTarget]) {
        let mut b = self.budgets.lock();
        b.known = targets.iter().copied().take(MAX_PACED_TARGETS).collect();
    }

    /// Whether `user` of `target`, who shows no queue ticket, may be let through now.
    /// `last_ok_ms` is when the store last answered this replica (0: never).
    pub fn try_admit(&self, target: QueueTarget, user: u64, now_ms: u64, last_ok_ms: u64) -> Pace {
        self.admit(target, user, None, now_ms, last_ok_ms)
    }

    /// Whether `user` of `target` may be let through now; `seq` is the seq of its queue ticket,
    /// if it showed a valid one. Only the users this replica's slice owns are (`Slice::owns`):
    /// the others belong to another replica, or to nobody while their slice's replica is gone. Users who were waiting come first, lowest seq first: a ticket
    /// holder is let through while fewer holders with a lower seq, seen here within the last tick
    /// and not let through, wait than the tick's share has left; users without a ticket only get
    /// what the holders left, in the second half of a tick (degraded answers send holders back at
    /// the next tick). A holder is remembered for one tick only: one that stopped polling may
    /// have been let through by another replica or the pump, and must not hold the share back.
    /// Holders are remembered also while this replica may not pace yet.
    pub fn admit(
        &self,
        target: QueueTarget,
        user: u64,
        seq: Option<u64>,
        now_ms: u64,
        last_ok_ms: u64,
    ) -> Pace {
        let pacing = self.paced_slice(now_ms);
        let not_now = if pacing.is_some() {
            Pace::Spent
        } else {
            Pace::Held
        };
        // A ticket at or below the mark proves a place that was admitted already: its user holds
        // (or held) that admission's token, and is not admitted a second time.
        if seq.is_some_and(|s| {
            self.marks
                .lock()
                .get(&target)
                .is_some_and(|mark| s <= *mark)
        }) {
            return not_now;
        }
        // Each user belongs to one replica's slice (`Slice::owns`; the roster keeps the slices
        // disjoint): only that replica lets it through, so a user gets one token however many
        // replicas it asks, and each token is claimed where it was signed (`gate.rs`).
        let mine = pacing.unwrap_or_else(|| self.registration.lock().slice);
        if !mine.owns(user) {
            return not_now;
        }
        let window = now_ms / self.cfg.tick_ms;
        // The store answered in this tick: the pump may have admitted its batch in it.
        let answered = last_ok_ms > 0 && window <= last_ok_ms / self.cfg.tick_ms;
        let share = match pacing {
            Some(slice) if !slice.is_empty() && !answered => {
                Some(self.share_for(target, slice, window))
            }
            _ => None,
        };
        if share.is_none() && seq.is_none() {
            return Pace::Held;
        }
        let held_or_spent = if share.is_some() {
            Pace::Spent
        } else {
            Pace::Held
        };
        let stale_ms = self.cfg.tick_ms;
        let mut guard = self.budgets.lock();
        let budgets = &mut *guard;
        let table = &mut budgets.per_target;
        if !table.contains_key(&target) && table.len() >= MAX_PACED_TARGETS {
            table.retain(|_, b| b.window >= window || !b.holders.is_empty());
            if table.len() >= MAX_PACED_TARGETS {
                if !budgets.known.contains(&target) {
                    return held_or_spent;
                }
                // A known sale takes the place of a target nobody had a queue for.
                let stranger = table.keys().find(|t| !budgets.known.contains(t)).copied();
                match stranger {
                    Some(s) => {
                        table.remove(&s);
                    }
                    None => return held_or_spent,
                }
            }
        }
        let budget = table.entry(target).or_insert(Budget {
            window,
            users: Default::default(),
            holders: Default::default(),
            admitted: Default::default(),
        });
        // Windows only move forward: a request whose clock reading is older than the budget's
        // window (it waited on the store) spends the current window's budget, never reopens an
        // old one (which would hand out a fresh share for a tick already paid).
        if window > budget.window {
            budget.window = window;
            // A new set, not a cleared one: a large share's capacity is not kept for a target
            // that may never come back.
            budget.users = Default::default();
        }
        budget
            .holders
            .retain(|_, seen| now_ms.saturating_sub(*seen) < stale_ms);
        let holder = seq.map(|seq| (seq, user));
        if let Some(key) = holder {
            let full = budget.holders.len() >= MAX_HOLDERS && !budget.holders.contains_key(&key);
            let beyond = full
                && budget
                    .holders
                    .last_key_value()
                    .is_some_and(|(last, _)| *last < key);
            if !beyond {
                budget.holders.insert(key, now_ms);
                if budget.holders.len() > MAX_HOLDERS {
                    budget.holders.pop_last();
                }
            }
        }
        let Some(share) = share else {
            return Pace::Held;
        };
        if budget.users.contains(&user)
            || budget
                .admitted
                .get(&user)
                .is_some_and(|a| a.until_ms > now_ms)
        {
            if let Some(key) = holder {
                budget.holders.remove(&key);
            }
            return Pace::Admitted;
        }
        if budget.users.len() >= share {
            return Pace::Spent;
        }
        let left = share - budget.users.len();
        match holder {
            Some(key) if budget.holders.range(..key).count() >= left => return Pace::Spent,
            Some(key) => {
                budget.holders.remove(&key);
            }
            None => {
                let first_half = now_ms % self.cfg.tick_ms < self.cfg.tick_ms / 2;
                if first_half && !budget.holders.is_empty() {
                    return Pace::Spent;
                }
            }
        }
        if window > budgets.window {
            budgets.window = window;
            budgets.strangers = 0;
        }
        if !budgets.known.contains(&target) {
            if budgets.strangers >= MAX_STRANGER_USERS {
                return Pace::Spent;
            }
            budgets.strangers += 1;
        }
        budget.users.insert(user);
        if budget.admitted.len() >= MAX_REMEMBERED {
            budget.admitted.retain(|_, a| a.until_ms > now_ms);
        }
        if budget.admitted.len() < MAX_REMEMBERED {
            budget.admitted.insert(
                user,
                Admission {
                    until_ms: now_ms.saturating_add(self.cfg.paced_for_ms),
                    expires_at_s: 0,
                },
            );
        }
        Pace::Admitted
    }

    /// Seconds until the next tick, the honest wait for a user the budget could not take now.
    pub fn retry_after_secs(&self, now_ms: u64) -> u64 {
        let left = self.cfg.tick_ms - now_ms % self.cfg.tick_ms;
        left.div_ceil(1000).max(1)
    }
}

#[cfg(test)]
mod tests;
