//! `MemoryStore`: the queue in process memory, the embedded default for a single gateway
//! instance. Same semantics as the Redis scripts, including the sliding 30-minute expiry of idle
//! targets; nothing is shared with other instances, so it must never back more than one replica.
//!
//! Ranks come from a Fenwick tree over seqs (O(log n) per enter, poll and leave), since seqs are
//! handed out in order and removals happen anywhere.

use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use async_trait::async_trait;

use super::liveness::Liveness;
use super::{
    Advance, AdvanceOutcome, ClaimTake, ClaimTerms, EnterOutcome, Mint, Now, Part, PollOutcome,
    QueueStore, Roster, RosterEntry, RosterMember, Settle, StoreError, TickFigures, TokenCandidate,
    ADVANCE_SAMPLES, DEFAULT_MAX_TARGETS, RATE_WINDOW_MS, TARGET_KEY_TTL_SECS, TICKS_KEPT_MS,
    WAIT_SAMPLES,
};
use crate::queue::{millis, QueueStats, QueueTarget};
use crate::sale::{FieldError, Sale, SaleDefaults, SalePatch, SaleState};
use crate::slice::Slice;

mod chunked;
mod fenwick;
mod waiting;

use chunked::Chunked;
use fenwick::Fenwick;
use waiting::Waiting;

#[derive(Debug)]
struct Waiter {
    seq: u64,
    /// The latest heartbeat window (`liveness.rs`) the user polled in, and its width.
    heartbeat_window: u64,
    heartbeat_width: u64,
    entered_ms: u64,
}

/// Targets held at most, as a multiple of `max_targets`, whether users wait in them or not: an
/// emptied target stays (as its Redis keys would until their TTL), so without a bound a client
/// entering and leaving ever new target ids would grow the map, and every scan of it, without end.
const HELD_PER_OPEN: usize = 4;
/// With the map at its bound, an emptied target (nobody waiting, no token held, past its tick
/// guard) idle this long is forgotten to make room.
const EMPTIED_KEEP_MS: u64 = 60_000;
/// The map is scanned for expired and forgettable targets at most this often.
const PURGE_EVERY_MS: u64 = 1_000;

/// Every target's state, and how many of them have users waiting (kept exact by every change,
/// so the `max_targets` check is not a scan).
#[derive(Debug, Default)]
struct Targets {
    map: HashMap<QueueTarget, TargetState>,
    open: usize,
    purged_ms: u64,
}

impl Targets {
    /// Drops the targets idle past the key TTL (as Redis would have expired their keys) and,
    /// with `make_room`, the emptied ones idle for `EMPTIED_KEEP_MS`.
    fn purge(&mut self, now: Now, make_room: bool) {
        let Targets { map, open, .. } = self;
        map.retain(|_, t| {
            let idle_ms = now.epoch_ms.saturating_sub(t.last_write_ms);
            let forgettable = make_room
                && t.waiting.is_empty()
                && t.tokens.is_empty()
                && idle_ms >= EMPTIED_KEEP_MS
                && t.last_advance_ms
                    .is_none_or(|a| now.epoch_ms.saturating_sub(a) >= t.guard_ms);
            let keep = idle_ms <= TARGET_KEY_TTL_SECS * 1000 && !forgettable;
            if !keep && !t.waiting.is_empty() {
                *open = open.saturating_sub(1);
            }
            keep
        });
        self.purged_ms = now.epoch_ms;
    }
}

/// The Fenwick tree is rebuilt over the live seqs only once it holds this many slots and more
/// than `COMPACT_FACTOR` times the waiting users, so a target with steady churn (enter, leave,
/// enter...) does not grow without bound.
const COMPACT_MIN: usize = 1024;
const COMPACT_FACTOR: usize = 4;

#[derive(Debug, Default)]
struct TargetState {
    seq: u64,
    admitted_count: u64,
    /// `slots[i]` is the seq held by Fenwick position `i + 1`, ascending: every live seq has a
    /// slot; a compaction drops the slots of seqs that left.
    slots: Chunked<u64>,
    live: Fenwick,
    waiting: Waiting<Waiter>,
    /// (latest heartbeat window, user), stalest first, for eviction.
    by_heartbeat: BTreeSet<(u64, u64)>,
    /// Whether some waiter's latest heartbeat is in a window of another width than the sale's
    /// (its heartbeat timeout changed): the next sweep that may evict looks at every waiter.
    mixed_widths: bool,
    /// The draw's order (user ids, first admitted first), once it ran.
    draw_order: Vec<u64>,
    /// The sale a first enter created from the defaults (an operator's sale is kept apart, in
    /// `MemoryStore::sales`, and outlives the target's state); it expires with the target.
    auto_sale: Option<Sale>,
    last_advance_ms: Option<u64>,
    /// The minimum interval between two advances the pump last asked for (its tick guard).
    guard_ms: u64,
    /// user → (expiresAt epoch s, token).
    tokens: HashMap<u64, (u64, String)>,
    waits_ms: VecDeque<u64>,
    /// (ms, admitted_count) samples, newest last.
    advances: VecDeque<(u64, u64, u64)>,
    last_write_ms: u64,
}

impl TargetState {
    /// Number of slots whose seq is at or below `seq` (the Fenwick position to sum up to).
    fn slots_upto(&self, seq: u64) -> usize {
        self.slots.partition_point(|s| *s <= seq)
    }

    fn rank(&self, seq: u64) -> u64 {
        u64::try_from(self.live.prefix(self.slots_upto(seq.saturating_sub(1)))).unwrap_or(0)
    }

    /// Live users with a seq at or below `seq`.
    fn live_upto(&self, seq: u64) -> i64 {
        self.live.prefix(self.slots_upto(seq))
    }

    fn push_seq(&mut self, seq: u64) {
        self.slots.push(seq);
        self.live.push(1);
    }

    fn compact_if_sparse(&mut self) {
        let len = self.slots.len();
        if len < COMPACT_MIN || len < COMPACT_FACTOR * self.waiting.len() {
            return;
        }
        let mut seqs: Vec<u64> = self.waiting.values().map(|w| w.seq).collect();
        seqs.sort_unstable();
        self.slots = Chunked::default();
        self.live = Fenwick::default();
        for seq in seqs {
            self.push_seq(seq);
        }
    }

    fn token(&mut self, user: u64, now: Now) -> Option<(u64, String)> {
        match self.tokens.get(&user) {
            Some((exp, _)) if exp.saturating_mul(1000) <= now.epoch_ms => {
                self.tokens.remove(&user);
                None
            }
            other => other.cloned(),
        }
    }

    /// Marks the user alive in `window` of `width` ms (a heartbeat never moves it back, as a bit
    /// set in an earlier window's bitmap stays set; a window of a new width replaces one of the
    /// old, which the sweeps no longer read).
    fn heartbeat(&mut self, user: u64, width: u64, window: u64) {
        if let Some(w) = self.waiting.get_mut(&user) {
            if w.heartbeat_width != width || window > w.heartbeat_window {
                self.by_heartbeat.remove(&(w.heartbeat_window, user));
                w.heartbeat_window = window;
                w.heartbeat_width = width;
                self.by_heartbeat.insert((window, user));
            }
        }
    }

    fn remove_waiter(&mut self, user: u64) -> Option<Waiter> {
        let w = self.waiting.remove(&user)?;
        self.by_heartbeat.remove(&(w.heartbeat_window, user));
        let slot = self.slots_upto(w.seq);
        if self.slots.get(slot.wrapping_sub(1)) == Some(w.seq) {
            self.live.add(slot, -1);
        }
        self.compact_if_sparse();
        Some(w)
    }
}

/// Claims kept before expired ones are swept out on the next claim.
const CLAIM_SWEEP_AT: usize = 10_000;

/// The embedded single-instance store.
/// One token's claim, as `claim.lua` keeps it.
#[derive(Debug, Clone)]
struct StoredClaim {
    /// Until when the claim is kept (epoch ms).
    expires: u64,
    spent: bool,
    /// The attempt holding it pending, and until when (epoch ms); None when given back.
    pending: Option<(String, u64)>,
    attempts: u32,
}

#[derive(Debug)]
pub struct MemoryStore {
    targets: Mutex<Targets>,
    /// Single-use claims (as `claim.lua`): (target, token id) → the claim.
    claims: Mutex<HashMap<(QueueTarget, String), StoredClaim>>,
    max_targets: usize,
    /// What a sale is created with when its creator does not say (`[queue]`).
    defaults: SaleDefaults,
    /// The sales an operator created or changed (`put_sale`): they never expire.
    sales: Mutex<HashMap<QueueTarget, Sale>>,
    /// Each sale's console history, newest first (`record_tick`).
    ticks: Mutex<HashMap<QueueTarget, VecDeque<TickFigures>>>,
    /// The one instance's last registration (`update_roster`): the roster of one process.
    roster: Mutex<Option<RosterMember>>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            targets: Mutex::default(),
            claims: Mutex::default(),
            max_targets: DEFAULT_MAX_TARGETS,
            defaults: SaleDefaults::default(),
            sales: Mutex::default(),
            ticks: Mutex::default(),
            roster: Mutex::default(),
        }
    }
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        tracing::warn!(
            "store backend is `memory`: queue state lives in this process only; run a single \
             gateway instance, or use the redis backend for replicas"
        );
        MemoryStore::default()
    }

    /// What a sale is created with when its creator does not say (`[queue]`).
    pub fn with_sale_defaults(mut self, defaults: SaleDefaults) -> MemoryStore {
        self.defaults = defaults;
        self
    }

    /// Caps the number of targets with a live queue.
    pub fn with_max_targets(mut self, max: usize) -> MemoryStore {
        self.max_targets = max.max(1);
        self
    }

    /// Whether `target` may get a queue: it has waiting users already, or fewer than the cap of
    /// targets have (an emptied or idle target does not count, as in Redis once the pump retired
    /// it) and the map has room for it (`HELD_PER_OPEN`).
    fn opens_queue(&self, target: QueueTarget, now: Now) -> Result<bool, StoreError> {
        let mut targets = self.targets.lock();
        let held = targets.map.get(&target);
        if held.is_some_and(|t| !t.waiting.is_empty()) {
            return Ok(true);
        }
        let known = held.is_some();
        let held_cap = self.max_targets.saturating_mul(HELD_PER_OPEN);
        if now.epoch_ms.saturating_sub(targets.purged_ms) >= PURGE_EVERY_MS {
            let make_room = targets.map.len() >= held_cap;
            targets.purge(now, make_room);
        }
        Ok(targets.open < self.max_targets
            && ((known && targets.map.contains_key(&target)) || targets.map.len() < held_cap))
    }

    /// Runs `f` on the target's state, first dropping it if it has been idle past the key TTL
    /// (as Redis would have expired its keys).
    fn with_target<R>(
        &self,
        target: QueueTarget,
        now: Now,
        f: impl FnOnce(&mut TargetState) -> R,
    ) -> Result<R, StoreError> {
        let mut targets = self.targets.lock();
        let Targets { map, open, .. } = &mut *targets;
        let mut was_open = false;
        if let Some(t) = map.get(&target) {
            let expired = now.epoch_ms.saturating_sub(t.last_write_ms) > TARGET_KEY_TTL_SECS * 1000;
            was_open = !t.waiting.is_empty();
            if expired {
                map.remove(&target);
                if was_open {
                    *open = open.saturating_sub(1);
                    was_open = false;
                }
            }
        }
        let state = map.entry(target).or_default();
        let result = f(state);
        match (was_open, !state.waiting.is_empty()) {
            (false, true) => *open += 1,
            (true, false) => *open = open.saturating_sub(1),
            _ => {}
        }
        // A read of a target nobody entered (poll, stats, a pump visit) leaves nothing behind, so
        // clients cannot grow the map past `max_targets` by naming ids.
        if state.seq == 0 && state.tokens.is_empty() {
            map.remove(&target);
        }
        Ok(result)
    }
}

#[async_trait]
impl QueueStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn enter(
        &self,
        target: QueueTarget,
        user: u64,
        now: Now,
    ) -> Result<EnterOutcome, StoreError> {
        if !self.opens_queue(target, now)? {
            return Ok(EnterOutcome::TooManyTargets);
        }
        let operators = self.sales.lock().get(&target).cloned();
        self.with_target(target, now, |t| {
            // As enter.lua: the sale's capacity and window width; a first enter creates the sale.
            let sale = match operators.or_else(|| t.auto_sale.clone()) {
                Some(sale) => sale,
                None => {
                    let sale = self.defaults.sale(now.epoch_ms);
                    t.auto_sale = Some(sale.clone());
                    sale
                }
            };
            if now.epoch_ms < sale.prequeue_opens_at_ms {
                return EnterOutcome::Early;
            }
            let (capacity, width) = (sale.max_capacity, sale.window_ms);
            let window = Liveness::of_width(width).window(now.epoch_ms);
            if let Some((expires_at, token)) = t.token(user, now) {
                return EnterOutcome::Admitted { token, expires_at };
            }
            if let Some(seq) = t.waiting.get(&user).map(|w| w.seq) {
                t.heartbeat(user, width, window);
                t.last_write_ms = now.epoch_ms;
                return EnterOutcome::Waiting {
                    seq,
                    ahead: t.rank(seq),
                };
            }
            let waiting = t.waiting.len() as u64;
            if waiting >= capacity {
                return EnterOutcome::Full;
            }
            t.seq += 1;
            let seq = t.seq;
            t.push_seq(seq);
            if seq == 1 {
                // A fresh sequence starts from a fresh mark (as enter.lua does).
                t.admitted_count = 0;
                t.advances.clear();
            }
            t.waiting.insert(
                user,
                Waiter {
                    seq,
                    heartbeat_window: window,
                    heartbeat_width: width,
                    entered_ms: now.epoch_ms,
                },
            );
            t.by_heartbeat.insert((window, user));
            t.last_write_ms = now.epoch_ms;
            EnterOutcome::Waiting {
                seq,
                ahead: waiting,
            }
        })
    }

    async fn poll(
        &self,
        target: QueueTarget,
        user: u64,
        now: Now,
        mint: Mint<'_>,
    ) -> Result<PollOutcome, StoreError> {
        let operators = self.sales.lock().get(&target).cloned();
        let default_width = crate::sale::window_ms(self.defaults.heartbeat_timeout_s);
        self.with_target(target, now, |t| {
            let width = operators
                .or_else(|| t.auto_sale.clone())
                .map_or(default_width, |s| s.window_ms);
            let window = Liveness::of_width(width).window(now.epoch_ms);
            if let Some((expires_at, token)) = t.token(user, now) {
                return PollOutcome::Admitted {
                    token,
                    expires_at,
                    waited_ms: None,
                };
            }
            let Some(seq) = t.waiting.get(&user).map(|w| w.seq) else {
                return PollOutcome::NotInQueue;
            };
            if seq <= t.admitted_count {
                let Some(candidate) = mint() else {
                    return PollOutcome::Due { seq };
                };
                t.last_write_ms = now.epoch_ms;
                let waited_ms = t.remove_waiter(user).map(|w| {
                    let waited = now.epoch_ms.saturating_sub(w.entered_ms);
                    t.waits_ms.push_front(waited);
                    t.waits_ms.truncate(WAIT_SAMPLES);
                    waited
                });
                t.tokens
                    .insert(user, (candidate.expires_at, candidate.token.clone()));
                return PollOutcome::Admitted {
                    token: candidate.token.clone(),
                    expires_at: candidate.expires_at,
                    waited_ms,
                };
            }
            t.heartbeat(user, width, window);
            PollOutcome::Waiting {
                seq,
                ahead: t.rank(seq),
            }
        })
    }

    async fn rejoin(
        &self,
        target: QueueTarget,
        user: u64,
        _seq: u64,
        now: Now,
        mint: Mint<'_>,
    ) -> Result<PollOutcome, StoreError> {
        // Nothing is ever lost here: a user not waiting left, was evicted or was admitted
        // (rejoin.lua answers the same where nothing was lost).
        self.poll(target, user, now, mint).await
    }

    async fn record_paced(
        &self,
        target: QueueTarget,
        user: u64,
        token: &TokenCandidate,
        now: Now,
    ) -> Result<bool, StoreError> {
        self.with_target(target, now, |t| {
            if t.token(user, now).is_some() {
                return false;
            }
            t.remove_waiter(user);
            t.tokens
                .insert(user, (token.expires_at, token.token.clone()));
            t.last_write_ms = now.epoch_ms;
            true
        })
    }

    async fn leave(&self, target: QueueTarget, user: u64) -> Result<(), StoreError> {
        let mut targets = self.targets.lock();
        let Targets { map, open, .. } = &mut *targets;
        if let Some(t) = map.get_mut(&target) {
            let was_open = !t.waiting.is_empty();
            t.remove_waiter(user);
            t.tokens.remove(&user);
            if was_open && t.waiting.is_empty() {
                *open = open.saturating_sub(1);
            }
        }
        Ok(())
    }

    async fn stats(&self, target: QueueTarget, now: Now) -> Result<QueueStats, StoreError> {
        self.with_target(target, now, |t| {
            let window: Vec<&(u64, u64, u64)> = t
                .advances
                .iter()
                .filter(|(ms, _, _)| now.epoch_ms.saturating_sub(*ms) <= RATE_WINDOW_MS)
                .collect();
            let (rate, live_rate) = match (window.first(), window.last()) {
                (Some((t0, c0, l0)), Some((t1, c1, l1))) if t1 > t0 => {
                    let secs = (t1 - t0) as f64 / 1000.0;
                    (
                        c1.saturating_sub(*c0) as f64 / secs,
                        l1.saturating_sub(*l0) as f64 / secs,
                    )
                }
                _ => (0.0, 0.0),
            };
            let mut waits: Vec<u64> = t.waits_ms.iter().copied().collect();
            waits.sort_unstable();
            let (avg, p95) = if waits.is_empty() {
                (0.0, 0.0)
            } else {
                let count = waits.len();
                let sum: u64 = waits.iter().sum();
                let idx = ((count as f64 * 0.95).ceil() as usize).clamp(1, count) - 1;
                let p95 = waits.get(idx).copied().unwrap_or(0);
                (sum as f64 / count as f64 / 1000.0, p95 as f64 / 1000.0)
            };
            // Three decimals, rounded as `stats.lua` formats them (`%.3f`), so both stores give
            // the same answer (the differential test compares them).
            let three = |x: f64| format!("{x:.3}").parse::<f64>().unwrap_or(x);
            QueueStats {
                waiting_count: t.waiting.len() as u64,
                admitted_count: t.admitted_count,
                admission_rate_per_sec: three(rate),
                avg_wait_seconds: three(avg),
                p95_wait_seconds: three(p95),
                live_rate_per_sec: three(live_rate),
            }
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn active_targets(&self, now: Now) -> Result<Vec<QueueTarget>, StoreError> {
        let mut targets = self.targets.lock();
        targets.purge(now, false);
        let mut list: Vec<QueueTarget> = targets.map.keys().copied().collect();
        list.sort();
        Ok(list)
    }

    async fn try_lock(&self, _: QueueTarget, _: &str, _: Duration) -> Result<bool, StoreError> {
        // One process: there is nobody to exclude.
        Ok(true)
    }

    async fn unlock(&self, _: QueueTarget, _: &str) -> Result<(), StoreError> {
        Ok(())
    }

    async fn advance(
        &self,
        target: QueueTarget,
        part: &Part,
        now: Now,
    ) -> Result<Advance, StoreError> {
        let operators = self.sales.lock().get(&target).cloned();
        self.with_target(target, now, |t| {
            // As advance.lua: the sale's batch, tick and state, or the defaults for a sale that
            // does not exist.
            let defaults = self.defaults;
            let sale = operators.or_else(|| t.auto_sale.clone());
            let (batch_size, tick_ms, paused) = match &sale {
                Some(s) => (s.batch_size, s.tick_ms, s.state == SaleState::Paused),
                None => (defaults.batch_size, defaults.tick_ms, false),
            };
            let batch = part.users(batch_size, now.epoch_ms / tick_ms.max(1));
            let min_ms = tick_ms * 95 / 100;
            t.guard_ms = min_ms;
            let waiting = t.waiting.len() as u64;
            let seq = t.seq;
            let result = |outcome, admitted_count, admitted_now| Advance {
                outcome,
                admitted_count,
                admitted_now,
                waiting,
                retry_in_ms: 0,
                batch_size,
                tick_ms,
                seq,
                losses: Vec::new(),
                deleted: false,
            };
            if paused {
                return result(AdvanceOutcome::Paused, t.admitted_count, 0);
            }
            if let Some(s) = sale.as_ref().filter(|s| s.prequeue()) {
                return Advance {
                    retry_in_ms: s.opens_at_ms.saturating_sub(now.epoch_ms),
                    ..result(AdvanceOutcome::Prequeue, t.admitted_count, 0)
                };
            }
            if let Some(since) = t
                .last_advance_ms
                .map(|last| now.epoch_ms.saturating_sub(last))
                .filter(|since| *since < min_ms)
            {
                return Advance {
                    retry_in_ms: min_ms - since,
                    ..result(AdvanceOutcome::Guarded, t.admitted_count, 0)
                };
            }
            let below = t.live_upto(t.admitted_count);
            let live_above = t.live.prefix(t.live.len()) - below;
            if live_above <= 0 || t.admitted_count >= t.seq || batch == 0 {
                return result(AdvanceOutcome::Idle, t.admitted_count, 0);
            }
            let batch = i64::from(batch);
            let (new_mark, admitted) = if live_above > batch {
                let nth = t
                    .live
                    .find(below + batch)
                    .and_then(|p| t.slots.get(p - 1))
                    .unwrap_or(t.seq);
                (nth, batch)
            } else {
                (t.seq, live_above)
            };
            t.admitted_count = new_mark;
            t.last_advance_ms = Some(now.epoch_ms);
            t.last_write_ms = now.epoch_ms;
            let live = t.advances.back().map_or(0, |(_, _, l)| *l) + admitted.unsigned_abs();
            t.advances.push_back((now.epoch_ms, new_mark, live));
            while t.advances.len() > ADVANCE_SAMPLES {
                t.advances.pop_front();
            }
            result(AdvanceOutcome::Advanced, new_mark, admitted.unsigned_abs())
        })
    }

    async fn sweep(
        &self,
        target: QueueTarget,
        credit_ms: u64,
        max: u32,
        now: Now,
    ) -> Result<u64, StoreError> {
        // As sweep.lua: users with a heartbeat in a window of the sale's width from the cutoff's
        // on are kept, the others evicted lowest seq first; with the cutoff too far back, or
        // before the width took effect, nobody.
        let operators = self.sales.lock().get(&target).cloned();
        let defaults = self.defaults;
        self.with_target(target, now, |t| {
            let sale = operators
                .or_else(|| t.auto_sale.clone())
                .unwrap_or_else(|| defaults.sale(0));
            let cutoff_ms = now
                .epoch_ms
                .saturating_sub(sale.heartbeat_timeout_s * 1000)
                .saturating_sub(credit_ms);
            let liveness = Liveness::of_width(sale.window_ms);
            let Some(windows) = liveness.sweep_windows(cutoff_ms, now.epoch_ms) else {
                return 0;
            };
            if cutoff_ms < sale.window_since_ms {
                return 0;
            }
            let width = sale.window_ms;
            let mut stale: Vec<(u64, u64)> = if t.mixed_widths {
                t.waiting
                    .iter()
                    .filter(|(_, w)| {
                        w.heartbeat_width != width || w.heartbeat_window < *windows.start()
                    })
                    .map(|(user, w)| (w.seq, *user))
                    .collect()
            } else {
                t.by_heartbeat
                    .range(..(*windows.start(), 0))
                    .filter_map(|(_, user)| t.waiting.get(user).map(|w| (w.seq, *user)))
                    .collect()
            };
            stale.sort_unstable();
            let all_stale = stale.len();
            stale.truncate(max as usize);
            for (_, user) in &stale {
                t.remove_waiter(*user);
            }
            if t.mixed_widths && stale.len() == all_stale {
                // Every waiter of an old width was stale, and is gone.
                t.mixed_widths = false;
            }
            stale.len() as u64
        })
    }

    async fn draw_entrants(
        &self,
        target: QueueTarget,
        now: Now,
    ) -> Result<crate::store::DrawStep, StoreError> {
        use crate::store::DrawStep;
        // As draw.lua's "prepare" (only an operator's sale has an opening).
        let mut targets = self.targets.lock();
        let mut sales = self.sales.lock();
        let Some(sale) = sales.get_mut(&target) else {
            return Ok(DrawStep::NotYet);
        };
        if sale.drawn_at_ms > 0 {
            return Ok(DrawStep::Drawn);
        }
        if sale.opens_at_ms == 0 || now.epoch_ms < sale.opens_at_ms {
            return Ok(DrawStep::NotYet);
        }
        let state = targets.map.get_mut(&target);
        if sale.draw_seq == 0 {
            sale.draw_seq = state.as_ref().map_or(0, |state| state.seq);
        }
        let draw_seq = sale.draw_seq;
        let mut entrants: Vec<(u64, u64)> = state
            .map(|state| {
                state
                    .waiting
                    .iter()
                    .filter(|(_, w)| w.seq <= draw_seq)
                    .map(|(u, w)| (*u, w.seq))
                    .collect()
            })
            .unwrap_or_default();
        entrants.sort_unstable_by_key(|(_, seq)| *seq);
        Ok(DrawStep::Entrants {
            draw_seq,
            seed: sale.draw_seed.clone(),
            entrants,
        })
    }

    async fn apply_draw(
        &self,
        target: QueueTarget,
        draw_seq: u64,
        places: &[(u64, u64)],
        now: Now,
    ) -> Result<bool, StoreError> {
        // As draw.lua's "apply": only over exactly the entrants still waiting.
        let mut targets = self.targets.lock();
        let mut sales = self.sales.lock();
        let Some(sale) = sales.get_mut(&target) else {
            return Ok(false);
        };
        if sale.drawn_at_ms > 0
            || sale.opens_at_ms == 0
            || now.epoch_ms < sale.opens_at_ms
            || sale.draw_seq != draw_seq
        {
            return Ok(false);
        }
        let Some(t) = targets.map.get_mut(&target) else {
            return Ok(places.is_empty());
        };
        let present = t.waiting.values().filter(|w| w.seq <= draw_seq).count();
        let all_there = places
            .iter()
            .all(|(u, _)| t.waiting.get(u).is_some_and(|w| w.seq <= draw_seq));
        if present != places.len() || !all_there {
            return Ok(false);
        }
        for (user, seq) in places {
            if let Some(w) = t.waiting.get_mut(user) {
                w.seq = *seq;
            }
        }
        t.draw_order = places.iter().map(|(u, _)| *u).collect();
        sale.drawn_at_ms = now.epoch_ms;
        sale.draw_entrants = places.len() as u64;
        sale.window_since_ms = now.epoch_ms;
        Ok(true)
    }

    async fn draw_order(&self, target: QueueTarget) -> Result<Vec<u64>, StoreError> {
        let targets = self.targets.lock();
        Ok(targets
            .map
            .get(&target)
            .map(|t| t.draw_order.clone())
            .unwrap_or_default())
    }

    async fn sale(&self, target: QueueTarget) -> Result<Option<Sale>, StoreError> {
        if let Some(s) = self.sales.lock().get(&target) {
            return Ok(Some(s.clone()));
        }
        let targets = self.targets.lock();
        Ok(targets.map.get(&target).and_then(|t| t.auto_sale.clone()))
    }

    async fn put_sale(
        &self,
        target: QueueTarget,
        patch: &SalePatch,
        now: Now,
    ) -> Result<Result<Sale, FieldError>, StoreError> {
        let mut targets = self.targets.lock();
        let state = targets.map.get_mut(&target);
        let mut sales = self.sales.lock();
        let old = sales
            .get(&target)
            .cloned()
            .or_else(|| state.as_ref().and_then(|t| t.auto_sale.clone()));
        let queued = state.as_ref().is_some_and(|t| t.seq > 0);
        if let Err(e) = crate::sale::check_first_opening(old.as_ref(), patch, queued) {
            return Ok(Err(e));
        }
        let seed = crate::draw::new_seed()
            .map_err(|_| StoreError::Unavailable("no randomness for the draw's seed".into()))?;
        let sale = match Sale::merged(old.as_ref(), patch, self.defaults, &seed, now.epoch_ms) {
            Ok(s) => s,
            Err(e) => return Ok(Err(e)),
        };
        if let Some(t) = state {
            t.auto_sale = None;
            if old.is_some_and(|o| o.window_ms != sale.window_ms) {
                t.mixed_widths = true;
            }
        }
        sales.insert(target, sale.clone());
        Ok(Ok(sale))
    }

    async fn restore_sale(&self, target: QueueTarget, sale: &Sale) -> Result<Sale, StoreError> {
        let mut sales = self.sales.lock();
        let stored = sales.entry(target).or_insert_with(|| sale.clone());
        if stored.version < sale.version {
            *stored = sale.clone();
        }
        Ok(stored.clone())
    }

    async fn delete_sale(&self, target: QueueTarget) -> Result<bool, StoreError> {
        self.ticks.lock().remove(&target);
        let mut targets = self.targets.lock();
        let Targets { map, open, .. } = &mut *targets;
        // As in Redis, the users' tokens stay (they expire on their own); the rest goes.
        let had_state = match map.remove(&target) {
            Some(t) => {
                if !t.waiting.is_empty() {
                    *open = open.saturating_sub(1);
                }
                if !t.tokens.is_empty() {
                    let kept = TargetState {
                        tokens: t.tokens,
                        last_write_ms: t.last_write_ms,
                        ..TargetState::default()
                    };
                    map.insert(target, kept);
                }
                t.auto_sale.is_some()
            }
            None => false,
        };
        let operators = self.sales.lock().remove(&target).is_some();
        Ok(operators || had_state)
    }

    async fn claim(
        &self,
        target: QueueTarget,
        token_id: &str,
        owner: &str,
        terms: ClaimTerms,
        now: Now,
    ) -> Result<ClaimTake, StoreError> {
        let mut claims = self.claims.lock();
        let at = now.epoch_ms;
        if claims.len() >= CLAIM_SWEEP_AT {
            claims.retain(|_, c| c.expires > at);
        }
        let key = (target, token_id.to_string());
        let claim = claims
            .entry(key)
            .and_modify(|claim| {
                if claim.expires <= at {
                    claim.spent = false;
                    claim.pending = None;
                    claim.attempts = 0;
                }
            })
            .or_insert(StoredClaim {
                expires: 0,
                spent: false,
                pending: None,
                attempts: 0,
            });
        let lease_until = at.saturating_add(millis(terms.lease));
        if claim.spent {
            return Ok(ClaimTake::Spent);
        }
        match &claim.pending {
            Some((holder, until)) if *until > at => {
                if holder == owner {
                    claim.pending = Some((owner.to_string(), lease_until));
                    return Ok(ClaimTake::Taken {
                        attempts: claim.attempts,
                    });
                }
                return Ok(ClaimTake::InFlight);
            }
            _ => {}
        }
        if claim.attempts >= terms.max_attempts {
            return Ok(ClaimTake::Exhausted);
        }
        claim.attempts += 1;
        claim.pending = Some((owner.to_string(), lease_until));
        claim.expires = claim.expires.max(at.saturating_add(millis(terms.ttl)));
        Ok(ClaimTake::Taken {
            attempts: claim.attempts,
        })
    }

    async fn settle(
        &self,
        target: QueueTarget,
        token_id: &str,
        owner: &str,
        settle: Settle,
        terms: ClaimTerms,
        now: Now,
    ) -> Result<bool, StoreError> {
        let mut claims = self.claims.lock();
        let at = now.epoch_ms;
        let key = (target, token_id.to_string());
        if settle == Settle::Spend {
            let claim = claims.entry(key).or_insert(StoredClaim {
                expires: 0,
                spent: false,
                pending: None,
                attempts: 1,
            });
            claim.spent = true;
            claim.pending = None;
            claim.expires = claim.expires.max(at.saturating_add(millis(terms.ttl)));
            return Ok(true);
        }
        let Some(c) = claims.get_mut(&key) else {
            return Ok(false);
        };
        let Some((holder, until)) = c.pending.clone() else {
            return Ok(false);
        };
        if c.spent || holder != owner {
            return Ok(false);
        }
        match settle {
            Settle::Renew if until > at => {
                c.pending = Some((holder, at.saturating_add(millis(terms.lease))));
            }
            Settle::Renew => return Ok(false),
            Settle::Undo => {
                c.attempts = c.attempts.saturating_sub(1);
                c.pending = None;
            }
            Settle::GiveBack | Settle::Spend => c.pending = None,
        }
        Ok(true)
    }

    async fn stored_token(
        &self,
        target: QueueTarget,
        user: u64,
        now: Now,
    ) -> Result<Option<String>, StoreError> {
        let mut targets = self.targets.lock();
        Ok(targets
            .map
            .get_mut(&target)
            .and_then(|t| t.token(user, now))
            .map(|(_, token)| token))
    }

    /// One process: the only instance there is, and never cut off from its store.
    async fn update_roster(&self, r: RosterEntry<'_>) -> Result<Roster, StoreError> {
        *self.roster.lock() = (!r.leave).then(|| RosterMember {
            instance: r.instance.to_string(),
            name: r.name.to_string(),
            slice: r.asked.to_string(),
            last_seen_ms: crate::clock::now().epoch_ms,
            credit_ms: r.credit_ms,
        });
        // One process: nobody else to pace alongside; the whole batch is this instance's seat.
        Ok(Roster {
            live: 1,
            recent: 1,
            recorded: if r.leave { Slice::EMPTY } else { r.asked },
            desired: Slice::WHOLE,
            credit_ms: r.credit_ms,
            ..Roster::default()
        })
    }

    async fn roster_members(&self) -> Result<Vec<RosterMember>, StoreError> {
        Ok(self.roster.lock().iter().cloned().collect())
    }

    async fn record_tick(
        &self,
        target: QueueTarget,
        figures: TickFigures,
        keep: u32,
    ) -> Result<(), StoreError> {
        let mut ticks = self.ticks.lock();
        let history = ticks.entry(target).or_default();
        history.push_front(figures);
        history.truncate(usize::try_from(keep.max(1)).unwrap_or(usize::MAX));
        Ok(())
    }

    async fn ticks(
        &self,
        target: QueueTarget,
        since_ms: u64,
    ) -> Result<Vec<TickFigures>, StoreError> {
        let ticks = self.ticks.lock();
        let Some(history) = ticks.get(&target) else {
            return Ok(Vec::new());
        };
        // As in Redis, a history whose last visit is older than it reaches back is gone.
        let now_ms = crate::clock::now().epoch_ms;
        if history
            .front()
            .is_none_or(|t| t.at_ms.saturating_add(TICKS_KEPT_MS) <= now_ms)
        {
            return Ok(Vec::new());
        }
        Ok(history
            .iter()
            .rev()
            .filter(|t| t.at_ms > since_ms)
            .copied()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sales of one user per 10 ms tick.
    fn one_a_tick() -> SaleDefaults {
        SaleDefaults {
            batch_size: 1,
            tick_ms: 10,
            ..SaleDefaults::default()
        }
    }

    #[test]
    fn waiting_polls_do_not_extend_the_key_ttl_admission_steps_do() {
        use crate::queue::TargetType;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let s = MemoryStore::default().with_sale_defaults(one_a_tick());
            let t = QueueTarget::new(TargetType::LimitedDrop, 1);
            let at = |min: u64| Now {
                epoch_ms: 1_000 + min * 60_000,
            };
            let never =
                || -> Option<crate::store::TokenCandidate> { unreachable!("a waiting poll signs") };
            s.enter(t, 1, at(0)).await.unwrap();
            s.enter(t, 2, at(0)).await.unwrap();
            let waiting = PollOutcome::Waiting { seq: 2, ahead: 1 };
            assert_eq!(s.poll(t, 2, at(20), &never).await.unwrap(), waiting);
            // 31 minutes after the last enter: polls alone kept nothing alive.
            assert_eq!(
                s.poll(t, 2, at(31), &never).await.unwrap(),
                PollOutcome::NotInQueue
            );
            // An admission step refreshes the keys like an enter does.
            s.enter(t, 3, at(40)).await.unwrap();
            s.enter(t, 4, at(40)).await.unwrap();
            s.advance(t, &Part::whole(), at(60)).await.unwrap();
            assert_eq!(
                s.poll(t, 4, at(80), &never).await.unwrap(),
                PollOutcome::Waiting { seq: 2, ahead: 1 }
            );
        });
    }

    #[test]
    fn churn_is_compacted_and_ranks_stay_right() {
        use crate::queue::TargetType;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let s = MemoryStore::default().with_sale_defaults(one_a_tick());
            let t = QueueTarget::new(TargetType::LimitedDrop, 1);
            let now = Now { epoch_ms: 1_000 };
            s.enter(t, 1, now).await.unwrap();
            // 20,000 users come and go; user 1 stays at the front.
            for u in 2..20_002 {
                s.enter(t, u, now).await.unwrap();
                s.leave(t, u).await.unwrap();
            }
            s.enter(t, 99_999, now).await.unwrap();
            let slots = s.targets.lock().map[&t].slots.len();
            assert!(slots < 2 * COMPACT_MIN, "{slots} slots for 2 waiting users");
            let c = || {
                Some(crate::store::TokenCandidate {
                    token: "x".into(),
                    expires_at: 10,
                })
            };
            assert_eq!(
                s.poll(t, 99_999, now, &c).await.unwrap(),
                PollOutcome::Waiting {
                    seq: 20_002,
                    ahead: 1
                }
            );
            let a = s.advance(t, &Part::whole(), now).await.unwrap();
            assert_eq!((a.admitted_count, a.admitted_now), (1, 1));
            let later = Now { epoch_ms: 1_010 };
            let a = s.advance(t, &Part::whole(), later).await.unwrap();
            assert_eq!((a.admitted_count, a.admitted_now), (20_002, 1));
        });
    }

    /// A client entering and leaving ever new target ids: the map stays within its bound (and
    /// with it every scan under the lock), the sales with users waiting keep working, the cap of
    /// open targets stays exact, and emptied targets make room once idle.
    #[test]
    fn target_churn_is_bounded() {
        use crate::queue::TargetType;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let s = MemoryStore::default().with_max_targets(2);
            let t = |id| QueueTarget::new(TargetType::LimitedDrop, id);
            let at = |ms: u64| Now {
                epoch_ms: 1_000_000 + ms,
            };
            let waiting = |o: EnterOutcome| matches!(o, EnterOutcome::Waiting { .. });
            // A real sale with a user waiting.
            assert!(waiting(s.enter(t(1), 1, at(0)).await.unwrap()));
            let mut refused = 0;
            for id in 2..10_000 {
                match s.enter(t(id), 7, at(id)).await.unwrap() {
                    EnterOutcome::TooManyTargets => refused += 1,
                    o => assert!(waiting(o)),
                }
                s.leave(t(id), 7).await.unwrap();
            }
            let held = s.targets.lock().map.len();
            assert!(held <= 2 * HELD_PER_OPEN, "{held} targets held");
            assert!(refused >= 9_990, "{refused} refused");
            assert_eq!(s.targets.lock().open, 1);
            // The real sale is untouched.
            assert!(waiting(s.enter(t(1), 2, at(10_000)).await.unwrap()));
            // Once the churned targets have idled for EMPTIED_KEEP_MS, they make room.
            let later = at(10_000 + EMPTIED_KEEP_MS + PURGE_EVERY_MS);
            assert!(waiting(s.enter(t(20_000), 1, later).await.unwrap()));
            assert_eq!(s.targets.lock().open, 2);
            assert_eq!(
                s.enter(t(20_001), 1, later).await.unwrap(),
                EnterOutcome::TooManyTargets,
                "two targets have users waiting"
            );
            s.leave(t(20_000), 1).await.unwrap();
            assert_eq!(s.targets.lock().open, 1);
            assert!(waiting(s.enter(t(20_001), 1, later).await.unwrap()));
        });
    }
}
