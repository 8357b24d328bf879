//! `StoreGuard`: the one place that decides how much the gateway waits for its store. It wraps a
//! `QueueStore` and implements the same trait, so every caller (request path, pump, stats, flag
//! refresh, claim replay) gets the same policy without repeating it:
//!
//! - **Deadline**: every operation, script reloads and registrations inside it included, ends
//!   within `timeout`; past it the caller degrades.
//! - **Classes with their own budgets**: request-path calls (enter, poll, leave, claim, release)
//!   share `max_in_flight` permits and the circuit breaker; stats have a few permits of their
//!   own; the pump and the flag refresh have only the deadline. A slow or failing call of one
//!   class never opens the breaker of another, so a stats flood cannot fail the queue open.
//! - **Refuse early**: a request-path call beyond `max_in_flight` is refused at once
//!   (`Saturated`) instead of queueing behind a stalled store into a storm of timeouts.
//! - **Breaker** (`breaker.rs`): consecutive timeouts open it; one probe at a time closes it; a
//!   reconnect only when probes keep timing out, never two at once.
//! - **Health**: a latch that logs one line when the request path starts failing and one when it
//!   answers again, the `virtual_queue_store_degraded` gauge, the degraded and refused counters,
//!   and the time of the last answer (the fail-open pacer admits nobody in a tick in which the
//!   store still answered).
//!
//! Out of memory is not an outage: Redis answered, so the breaker counts it as a success and the
//! callers decide (new enters are refused; everything else keeps working).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Semaphore;

use super::breaker::{Admit, Breaker, BreakerConfig, Verdict};
use super::{
    Advance, ClaimTake, ClaimTerms, EnterOutcome, Mint, Now, Part, PollOutcome, PresenceKind,
    QueueStore, Roster, RosterEntry, Settle, StoreError, TokenCandidate,
};
use crate::metrics::Metrics;
use crate::queue::{QueueStats, QueueTarget};
use crate::sale::{FieldError, Sale, SalePatch};

/// Consecutive timeouts that open the breaker, how long it stays open before a probe, and how
/// many silent probes in a row ask for a reconnect.
const BREAKER_THRESHOLD: u32 = 5;
const BREAKER_OPEN_FOR: Duration = Duration::from_millis(200);
const RECONNECT_AFTER_PROBES: u32 = 2;

/// Stats calls in flight per replica (the per-replica stats cache keeps this far from reached).
const STATS_IN_FLIGHT: usize = 4;

/// Claim and release calls in flight per replica: their own permits, so a replica busy with
/// polls never turns a purchase into a local claim while Redis answers.
const GATE_IN_FLIGHT: usize = 128;

/// Refusals for saturation less than this apart belong to one shedding episode.
const SHED_EPISODE_GAP_MS: u64 = 1000;

/// At most one "shedding" warning per this period.
const SHED_LOG_EVERY_MS: u64 = 10_000;

#[derive(Debug, Clone, Copy)]
pub struct GuardConfig {
    pub timeout: Duration,
    pub max_in_flight: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// enter, poll, leave, probe: the breaker and `max_in_flight`.
    Request,
    /// claim, release: the breaker and permits of their own.
    Gate,
    /// stats: a few permits of its own.
    Stats,
    /// pump, flag refresh, roster, claim replay: the deadline only.
    Background,
}

pub struct StoreGuard {
    inner: Arc<dyn QueueStore>,
    cfg: GuardConfig,
    breaker: Breaker,
    requests: Semaphore,
    gate: Semaphore,
    stats: Semaphore,
    metrics: Metrics,
    down: AtomicBool,
    down_since: parking_lot::Mutex<Option<(Instant, u64)>>,
    /// The last outage of the request path: (start, end) in epoch ms.
    last_outage: parking_lot::Mutex<Option<(u64, u64)>>,
    last_ok_ms: AtomicU64,
    /// The last episode of request-path calls refused for saturation: (start, last) in epoch ms.
    /// Users whose polls were refused could not heartbeat, as in an outage.
    shedding: parking_lot::Mutex<Option<(u64, u64)>>,
    last_shed_log_ms: AtomicU64,
    reconnecting: Arc<AtomicBool>,
}

impl std::fmt::Debug for StoreGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreGuard")
            .field("store", &self.inner.kind())
            .field("degraded", &self.degraded())
            .finish_non_exhaustive()
    }
}

/// How long after an outage in which replicas may have paced new tokens wait for them to record
/// their paced admissions (they do within a probe period of the store answering).
const PACED_RECORD_MS: u64 = 1000;

fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl StoreGuard {
    pub fn new(inner: Arc<dyn QueueStore>, cfg: GuardConfig, metrics: Metrics) -> StoreGuard {
        StoreGuard {
            inner,
            breaker: Breaker::new(BreakerConfig {
                threshold: BREAKER_THRESHOLD,
                open_for: BREAKER_OPEN_FOR,
                probe_timeout: cfg.timeout * 2,
                reconnect_after: RECONNECT_AFTER_PROBES,
            }),
            requests: Semaphore::new(cfg.max_in_flight.max(1)),
            gate: Semaphore::new(GATE_IN_FLIGHT),
            stats: Semaphore::new(STATS_IN_FLIGHT),
            cfg,
            metrics,
            down: AtomicBool::new(false),
            down_since: parking_lot::Mutex::new(None),
            last_outage: parking_lot::Mutex::new(None),
            last_ok_ms: AtomicU64::new(0),
            shedding: parking_lot::Mutex::new(None),
            last_shed_log_ms: AtomicU64::new(0),
            reconnecting: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The wrapped store, for work that picks its policy itself (`background`).
    pub fn inner(&self) -> &Arc<dyn QueueStore> {
        &self.inner
    }

    /// Whether the request path is failing right now (breaker open, or the last call failed).
    pub fn degraded(&self) -> bool {
        self.down.load(Ordering::Relaxed) || self.breaker.is_open()
    }

    /// Records a failed request-path call, as a timeout would (unit tests of the policies built
    /// on `degraded`).
    #[cfg(test)]
    pub(crate) fn fail_request_for_test(&self) {
        self.failed(Class::Request, "test", &StoreError::Timeout);
    }

    /// Whether an outage of at least `min_ms` is in progress at `now_ms`, or ended less than
    /// `window_ms` before it (shorter failures, such as a timeout under load, do not count).
    pub fn long_outage_within(&self, now_ms: u64, min_ms: u64, window_ms: u64) -> bool {
        if let Some((_, start)) = *self.down_since.lock() {
            return now_ms.saturating_sub(start) >= min_ms;
        }
        self.last_outage.lock().is_some_and(|(start, end)| {
            end.saturating_sub(start) >= min_ms && now_ms.saturating_sub(end) < window_ms
        })
    }

    /// Whether new tokens are held back, and the pump admits nobody, at `now_ms`
    /// (docs/state.md): after a connection to the store broke, until this replica would have
    /// learned of a rollback (`Pacer::unsure_after_break`); after a rollback it learned of
    /// (every replica writes back what it handed out); and for a second after an outage long
    /// enough for replicas to have paced (they record their paced admissions in the store
    /// first). Admissions stop together with the tokens, so no backlog of admitted users buys
    /// at once when the hold ends.
    pub fn issue_held(&self, pacer: &crate::failopen::Pacer, now_ms: u64) -> bool {
        pacer.issue_held(now_ms)
            || pacer.unsure_after_break(self.inner.connection_broke_ms(), now_ms)
            || self.long_outage_within(now_ms, pacer.config().pace_after_ms(), PACED_RECORD_MS)
    }

    /// When the store last answered any call of this replica (epoch ms; 0: never).
    pub fn last_ok_ms(&self) -> u64 {
        self.last_ok_ms.load(Ordering::Relaxed)
    }

    /// Whether the store sent anything within `window_ms` before `now_ms`: an answer to any call,
    /// or a late reply to one whose caller gave up. A store that answers late is slow (or this
    /// replica is overloaded), not down.
    pub fn heard_within(&self, now_ms: u64, window_ms: u64) -> bool {
        let last = self.last_ok_ms().max(self.inner.last_reply_ms());
        last > 0 && now_ms.saturating_sub(last) < window_ms
    }

    /// One request-class `PING`: the background prober runs it so that a degraded replica finds
    /// out that the store is back without waiting for traffic, and a healthy one notices a hang.
    pub async fn probe(&self) -> Result<(), StoreError> {
        self.run(Class::Request, "probe", self.inner.probe()).await
    }

    /// How long users of this replica could not heartbeat, for a sweep at `now_ms`: the outage
    /// or shedding episode in progress, or the last one if it ended less than `within_ms` ago
    /// (0 otherwise). A poll this replica refused for saturation is no silence of the user's
    /// (that credit is at most twice `within_ms`).
    /// The pumps do not count that time against them (this replica's share reaches the others'
    /// pumps through the replica roster).
    pub fn outage_credit_ms(&self, now_ms: u64, within_ms: u64) -> u64 {
        let outage = {
            let since = self.down_since.lock();
            match (*since, *self.last_outage.lock()) {
                (Some((_, start)), _) => now_ms.saturating_sub(start),
                (None, Some((start, end))) if now_ms.saturating_sub(end) < within_ms => {
                    end.saturating_sub(start)
                }
                _ => 0,
            }
        };
        let shed = match *self.shedding.lock() {
            Some((start, last)) if now_ms.saturating_sub(last) < SHED_EPISODE_GAP_MS => {
                now_ms.saturating_sub(start)
            }
            Some((start, last)) if now_ms.saturating_sub(last) < within_ms => {
                last.saturating_sub(start)
            }
            _ => 0,
        };
        // Bounded: a replica kept shedding by a flood must not stop eviction everywhere for as
        // long as the flood lasts (a user some of whose polls get through stays anyway).
        outage.max(shed.min(within_ms.saturating_mul(2)))
    }

    /// Runs any other store work (the flag refresh) under the background policy.
    pub async fn background<T>(
        &self,
        op: &'static str,
        fut: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.run(Class::Background, op, fut).await
    }

    async fn run<T>(
        &self,
        class: Class,
        op: &'static str,
        fut: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.metrics.count_store_call(op);
        let _permit = match class {
            Class::Request => match self.requests.try_acquire() {
                Ok(p) => Some(p),
                Err(_) => {
                    self.note_shedding();
                    return Err(self.shed(op));
                }
            },
            Class::Gate => match self.gate.try_acquire() {
                Ok(p) => Some(p),
                Err(_) => return Err(self.shed(op)),
            },
            Class::Stats => match self.stats.try_acquire() {
                Ok(p) => Some(p),
                Err(_) => return Err(self.shed(op)),
            },
            Class::Background => None,
        };
        let guarded = matches!(class, Class::Request | Class::Gate);
        let admit = if guarded {
            match self.breaker.admit(Instant::now()) {
                Admit::Reject => {
                    let error =
                        StoreError::Unavailable("circuit open: the store is not answering".into());
                    self.failed(class, op, &error);
                    return Err(error);
                }
                a => a,
            }
        } else {
            Admit::Call
        };
        let result = match tokio::time::timeout(self.cfg.timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout),
        };
        match &result {
            Ok(_) => self.answered(class),
            Err(StoreError::OutOfMemory) => {
                self.answered(class);
                self.metrics.refused.with_label_values(&[op, "oom"]).inc();
            }
            Err(e @ StoreError::Protocol(_)) => {
                // Redis answered; the reply was not what we expected (a bug, logged every time).
                self.answered(class);
                tracing::error!(op, error = %e, "unexpected store reply");
                self.metrics.degraded.with_label_values(&[op]).inc();
            }
            Err(e) => {
                if guarded {
                    let timed_out = matches!(e, StoreError::Timeout);
                    if self.breaker.failure(Instant::now(), admit, timed_out) == Verdict::Reconnect
                    {
                        self.reconnect();
                    }
                }
                self.failed(class, op, e);
            }
        }
        result
    }

    fn answered(&self, class: Class) {
        if class == Class::Stats {
            // A read-only script may succeed on a Redis that takes no writes.
            return;
        }
        self.last_ok_ms.fetch_max(epoch_ms(), Ordering::Relaxed);
        if class == Class::Background {
            return;
        }
        self.breaker.success();
        // The latch, its gauge and the outage record change together, under one lock.
        let mut since = self.down_since.lock();
        if self.down.swap(false, Ordering::Relaxed) {
            let (at, start_ms) = since.take().unwrap_or((Instant::now(), epoch_ms()));
            *self.last_outage.lock() = Some((start_ms, epoch_ms()));
            self.metrics.store_degraded.set(0);
            tracing::info!(
                store = self.inner.kind(),
                degraded_ms = at.elapsed().as_millis() as u64,
                "store answers again; queue resumed"
            );
        }
    }

    fn failed(&self, class: Class, op: &'static str, e: &StoreError) {
        self.metrics.degraded.with_label_values(&[op]).inc();
        if !matches!(class, Class::Request | Class::Gate) {
            return;
        }
        let mut since = self.down_since.lock();
        if !self.down.swap(true, Ordering::Relaxed) {
            *since = Some((Instant::now(), epoch_ms()));
            self.metrics.store_degraded.set(1);
            tracing::warn!(store = self.inner.kind(), op, error = %e,
                "store failed; degrading until it answers again");
        }
    }

    /// A request-path call was refused for saturation now: part of the current shedding episode,
    /// or the start of a new one.
    fn note_shedding(&self) {
        let now = epoch_ms();
        let mut episode = self.shedding.lock();
        *episode = match *episode {
            Some((start, last)) if now.saturating_sub(last) < SHED_EPISODE_GAP_MS => {
                Some((start, now.max(last)))
            }
            _ => Some((now, now)),
        };
    }

    fn shed(&self, op: &'static str) -> StoreError {
        self.metrics
            .refused
            .with_label_values(&[op, "saturated"])
            .inc();
        let now = epoch_ms();
        let last = self.last_shed_log_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= SHED_LOG_EVERY_MS
            && self
                .last_shed_log_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                op,
                max_in_flight = self.cfg.max_in_flight,
                "store calls in flight at the limit; refusing the excess at once"
            );
        }
        StoreError::Saturated
    }

    /// One reconnect at a time, in the background; the breaker stays open meanwhile.
    fn reconnect(&self) {
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!(
            store = self.inner.kind(),
            "the store stays silent; reconnecting"
        );
        let inner = self.inner.clone();
        let flag = self.reconnecting.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), inner.reconnect()).await;
            flag.store(false, Ordering::Release);
        });
    }
}

#[async_trait]
impl QueueStore for StoreGuard {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn enter(
        &self,
        target: QueueTarget,
        user: u64,
        now: Now,
    ) -> Result<EnterOutcome, StoreError> {
        let fut = self.inner.enter(target, user, now);
        self.run(Class::Request, "enter", fut).await
    }

    async fn poll(
        &self,
        target: QueueTarget,
        user: u64,
        now: Now,
        mint: Mint<'_>,
    ) -> Result<PollOutcome, StoreError> {
        let fut = self.inner.poll(target, user, now, mint);
        self.run(Class::Request, "poll", fut).await
    }

    async fn rejoin(
        &self,
        target: QueueTarget,
        user: u64,
        seq: u64,
        now: Now,
        mint: Mint<'_>,
    ) -> Result<PollOutcome, StoreError> {
        let fut = self.inner.rejoin(target, user, seq, now, mint);
        self.run(Class::Request, "rejoin", fut).await
    }

    async fn record_paced(
        &self,
        target: QueueTarget,
        user: u64,
        token: &TokenCandidate,
        now: Now,
    ) -> Result<bool, StoreError> {
        let fut = self.inner.record_paced(target, user, token, now);
        self.run(Class::Background, "record_paced", fut).await
    }

    async fn leave(&self, target: QueueTarget, user: u64) -> Result<(), StoreError> {
        let fut = self.inner.leave(target, user);
        self.run(Class::Request, "leave", fut).await
    }

    async fn stats(&self, target: QueueTarget, now: Now) -> Result<QueueStats, StoreError> {
        let fut = self.inner.stats(target, now);
        self.run(Class::Stats, "stats", fut).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.run(Class::Background, "ping", self.inner.ping()).await
    }

    fn started(&self) -> bool {
        self.inner.started()
    }

    async fn active_targets(&self, now: Now) -> Result<Vec<QueueTarget>, StoreError> {
        let fut = self.inner.active_targets(now);
        self.run(Class::Background, "pump", fut).await
    }

    async fn retire_target(&self, target: QueueTarget) -> Result<(), StoreError> {
        let fut = self.inner.retire_target(target);
        self.run(Class::Background, "pump", fut).await
    }

    async fn try_lock(
        &self,
        target: QueueTarget,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let fut = self.inner.try_lock(target, owner, ttl);
        self.run(Class::Background, "pump", fut).await
    }

    async fn unlock(&self, target: QueueTarget, owner: &str) -> Result<(), StoreError> {
        let fut = self.inner.unlock(target, owner);
        self.run(Class::Background, "pump", fut).await
    }

    async fn advance(
        &self,
        target: QueueTarget,
        part: &Part,
        now: Now,
    ) -> Result<Advance, StoreError> {
        let fut = self.inner.advance(target, part, now);
        self.run(Class::Background, "pump", fut).await
    }

    async fn sweep(
        &self,
        target: QueueTarget,
        credit_ms: u64,
        max: u32,
        now: Now,
    ) -> Result<u64, StoreError> {
        let fut = self.inner.sweep(target, credit_ms, max, now);
        self.run(Class::Background, "pump", fut).await
    }

    async fn sale(&self, target: QueueTarget) -> Result<Option<Sale>, StoreError> {
        let fut = self.inner.sale(target);
        self.run(Class::Background, "sale", fut).await
    }

    async fn put_sale(
        &self,
        target: QueueTarget,
        patch: &SalePatch,
        now: Now,
    ) -> Result<Result<Sale, FieldError>, StoreError> {
        let fut = self.inner.put_sale(target, patch, now);
        self.run(Class::Background, "sale", fut).await
    }

    async fn restore_sale(&self, target: QueueTarget, sale: &Sale) -> Result<Sale, StoreError> {
        let fut = self.inner.restore_sale(target, sale);
        self.run(Class::Background, "sale", fut).await
    }

    async fn delete_sale(&self, target: QueueTarget) -> Result<bool, StoreError> {
        let fut = self.inner.delete_sale(target);
        self.run(Class::Background, "sale", fut).await
    }

    async fn draw_entrants(
        &self,
        target: QueueTarget,
        now: Now,
    ) -> Result<crate::store::DrawStep, StoreError> {
        let fut = self.inner.draw_entrants(target, now);
        self.run(Class::Background, "pump", fut).await
    }

    async fn apply_draw(
        &self,
        target: QueueTarget,
        draw_seq: u64,
        places: &[(u64, u64)],
        now: Now,
    ) -> Result<bool, StoreError> {
        let fut = self.inner.apply_draw(target, draw_seq, places, now);
        self.run(Class::Background, "pump", fut).await
    }

    async fn draw_order(&self, target: QueueTarget) -> Result<Vec<u64>, StoreError> {
        let fut = self.inner.draw_order(target);
        self.run(Class::Background, "sale", fut).await
    }

    async fn register_sale(&self, target: QueueTarget, on: bool) -> Result<(), StoreError> {
        let fut = self.inner.register_sale(target, on);
        self.run(Class::Background, "sale", fut).await
    }

    async fn claim(
        &self,
        target: QueueTarget,
        token_id: &str,
        owner: &str,
        terms: ClaimTerms,
        now: Now,
    ) -> Result<ClaimTake, StoreError> {
        let fut = self.inner.claim(target, token_id, owner, terms, now);
        self.run(Class::Gate, "claim", fut).await
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
        let fut = self
            .inner
            .settle(target, token_id, owner, settle, terms, now);
        self.run(Class::Gate, "settle", fut).await
    }

    async fn stored_token(
        &self,
        target: QueueTarget,
        user: u64,
        now: Now,
    ) -> Result<Option<String>, StoreError> {
        let fut = self.inner.stored_token(target, user, now);
        self.run(Class::Gate, "stored_token", fut).await
    }

    async fn presence(&self, instance: &str, window: Duration) -> Option<PresenceKind> {
        self.inner.presence(instance, window).await
    }

    fn presence_seen(&self, seen: bool) {
        self.inner.presence_seen(seen);
    }

    async fn update_roster(&self, r: RosterEntry<'_>) -> Result<Roster, StoreError> {
        let fut = self.inner.update_roster(r);
        self.run(Class::Background, "pump", fut).await
    }

    async fn roster_members(&self) -> Result<Vec<crate::store::RosterMember>, StoreError> {
        let fut = self.inner.roster_members();
        self.run(Class::Background, "sale", fut).await
    }

    async fn record_tick(
        &self,
        target: QueueTarget,
        figures: crate::store::TickFigures,
        keep: u32,
    ) -> Result<(), StoreError> {
        let fut = self.inner.record_tick(target, figures, keep);
        self.run(Class::Background, "pump", fut).await
    }

    async fn ticks(
        &self,
        target: QueueTarget,
        since_ms: u64,
    ) -> Result<Vec<crate::store::TickFigures>, StoreError> {
        let fut = self.inner.ticks(target, since_ms);
        self.run(Class::Background, "sale", fut).await
    }

    async fn reconnect(&self) {
        self.inner.reconnect().await
    }

    async fn probe(&self) -> Result<(), StoreError> {
        StoreGuard::probe(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shedding_is_credited_like_an_outage() {
        let guard = StoreGuard::new(
            Arc::new(crate::store::MemoryStore::new()),
            GuardConfig {
                timeout: Duration::from_millis(150),
                max_in_flight: 1,
            },
            Metrics::new().unwrap(),
        );
        let now = epoch_ms();
        assert_eq!(guard.outage_credit_ms(now, 10_000), 0);
        *guard.shedding.lock() = Some((now - 5_000, now - 100));
        let ongoing = guard.outage_credit_ms(now, 10_000);
        assert!((5_000..5_100).contains(&ongoing), "{ongoing}");
        assert_eq!(
            guard.outage_credit_ms(now, 2_000),
            4_000,
            "at most twice the timeout"
        );
        // Ended 3 s ago after 2 s: credited for a heartbeat timeout after it.
        *guard.shedding.lock() = Some((now - 5_000, now - 3_000));
        assert_eq!(guard.outage_credit_ms(now, 10_000), 2_000);
        assert_eq!(guard.outage_credit_ms(now, 3_000), 0);
        guard.note_shedding();
        assert!(
            guard.outage_credit_ms(epoch_ms(), 10_000) < 100,
            "a new episode"
        );
    }
}
