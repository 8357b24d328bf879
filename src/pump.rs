//! The admission pump (docs/ARCHITECTURE.md#the-admission-pump): a background service in every
//! instance. Ticks are aligned to multiples of `tick_ms` since the epoch, so all instances try at
//! the same moments and the lock decides who works. Per active target and tick: take the lock (`SET
//! NX PX`, TTL < tick); if taken, advance (the script itself refuses a second advance within 0.95 ×
//! tick, whoever calls it) and sweep stale heartbeats.
//!
//! A tick never panics and never blocks shutdown: every store call carries the command timeout,
//! errors are counted and logged once per outage, and shutdown interrupts a tick.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::clock::Clock;
use crate::failopen::Pacer;
use crate::metrics::Metrics;
use crate::queue::{millis, QueueTarget};
use crate::slice::Slice;
use crate::store::{
    Advance, AdvanceOutcome, Part, QueueStore, RosterEntry, StoreGuard, TickFigures,
    WHOLE_BATCH_PPM,
};

/// The shortest sleep between two passes of the pump, whatever a sale's tick says.
const MIN_WAKE_MS: u64 = 10;

/// What one tick did, for tests and logs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TickReport {
    pub targets: usize,
    /// Targets visited (their tick had moved since this instance's last visit).
    pub visited: usize,
    pub led: usize,
    pub advanced: usize,
    pub admitted: u64,
    pub evicted: u64,
    pub errors: usize,
}

/// What the pump needs of the configuration.
#[derive(Debug, Clone, Copy)]
pub struct PumpConfig {
    pub tick: Duration,
    pub batch_size: std::num::NonZeroU32,
    pub heartbeat_timeout: Duration,
    pub max_evict_per_tick: std::num::NonZeroU32,
}

/// The pump works on the store, its configuration, the metrics, the fail-open pacer (it tells it
/// the replica count) and a clock: nothing of HTTP, so a simulation drives it in virtual time.
pub struct Pump {
    store: Arc<StoreGuard>,
    cfg: PumpConfig,
    metrics: Metrics,
    pacer: Arc<Pacer>,
    clock: Arc<dyn Clock>,
    instance: String,
    /// The replica's stable name (`server.replica_name_env`; empty: none).
    name: String,
    held: parking_lot::Mutex<BTreeSet<QueueTarget>>,
    /// Targets this instance found with an empty queue at its last visit: empty twice in a row,
    /// a target is retired from the active set (it stops counting against the cap).
    empty: parking_lot::Mutex<BTreeSet<QueueTarget>>,
    /// The largest heartbeat credit the live instances reported at the last registration
    /// (`Roster::credit_ms`).
    roster_credit_ms: std::sync::atomic::AtomicU64,
    /// Each sale's tick as its last admission step read it (`tickMs` of the sale's hash), and the
    /// tick (now / tick) this instance last visited it in: a sale is visited once per its own
    /// tick, and the pump wakes at the shortest.
    ticks: parking_lot::Mutex<std::collections::HashMap<QueueTarget, (u64, u64)>>,
    /// Each sale's losses as its last admission step reported them (`Advance::losses`): a
    /// count that rose is a loss found since, logged and counted once.
    losses: parking_lot::Mutex<std::collections::HashMap<QueueTarget, Vec<(String, u64)>>>,
}

/// One roster reading: the part of the batch an advance may admit, and when the registration
/// that read it was sent (epoch ms).
#[derive(Debug, Clone)]
struct Reading {
    part: Part,
    sent_ms: u64,
}

impl Reading {
    /// Whether `now_ms` falls in the tick this reading was taken in.
    fn same_tick(&self, now_ms: u64, tick_ms: u64) -> bool {
        now_ms / tick_ms == self.sent_ms / tick_ms
    }
}

impl Pump {
    pub fn new(
        store: Arc<StoreGuard>,
        cfg: PumpConfig,
        metrics: Metrics,
        pacer: Arc<Pacer>,
        clock: Arc<dyn Clock>,
    ) -> Pump {
        Pump {
            store,
            cfg,
            metrics,
            pacer,
            clock,
            instance: instance_id(),
            name: String::new(),
            held: Default::default(),
            empty: Default::default(),
            roster_credit_ms: Default::default(),
            ticks: Default::default(),
            losses: Default::default(),
        }
    }

    /// The replica's stable name: registering with it retires a predecessor of that name.
    pub fn with_name(mut self, name: &str) -> Pump {
        self.name = name.to_string();
        self
    }

    fn tick_ms(&self) -> u64 {
        millis(self.cfg.tick).max(1)
    }

    /// The tick of `target`: the sale's, once an admission step read it; this file's before.
    fn tick_of(&self, target: QueueTarget) -> u64 {
        self.ticks
            .lock()
            .get(&target)
            .map_or(self.tick_ms(), |(tick, _)| *tick)
    }

    /// How long the pump sleeps between passes: to the next multiple of the shortest tick among
    /// this file's and the sales' it knows (a sale is visited only when its own tick has moved).
    fn wake_every(&self) -> Duration {
        let shortest = self
            .ticks
            .lock()
            .values()
            .map(|(tick, _)| *tick)
            .fold(self.tick_ms(), u64::min);
        Duration::from_millis(shortest.max(MIN_WAKE_MS))
    }

    /// Whether `target` is due at `now_ms`: its own tick moved since this instance's last visit.
    fn due(&self, target: QueueTarget, now_ms: u64) -> bool {
        let ticks = self.ticks.lock();
        match ticks.get(&target) {
            Some((tick, visited)) => tick_index(now_ms, *tick) != *visited,
            None => true,
        }
    }

    /// Records a visit at `now_ms` and the sale's tick as the step read it.
    fn visited(&self, target: QueueTarget, tick_ms: u64, now_ms: u64) {
        let tick = tick_ms.max(1);
        self.ticks
            .lock()
            .insert(target, (tick, tick_index(now_ms, tick)));
    }

    /// One pass over the active targets.
    pub async fn tick(&self) -> TickReport {
        let mut report = TickReport::default();
        let store = &self.store;
        if !store.started() {
            return report;
        }
        // `None` while this replica's own calls fail: it may be pacing (`failopen`), so its pump
        // admits nobody meanwhile and another instance's pump leads.
        let Some(mut reading) = self.read_roster().await else {
            return report;
        };
        // Failures are counted (and logged once per outage) by the store guard.
        let targets = match store.active_targets(self.clock.now()).await {
            Ok(t) => t,
            Err(_) => {
                report.errors += 1;
                return report;
            }
        };
        self.pacer.set_known(&targets);
        {
            // Sales no longer active are forgotten (their tick no longer sets the wake-ups).
            let mut ticks = self.ticks.lock();
            ticks.retain(|t, _| targets.binary_search(t).is_ok());
        }
        report.targets = targets.len();
        let previous = self.held.lock().clone();
        let mut held = BTreeSet::new();
        let tick_ms = self.tick_ms();
        let fresh_for = tick_ms / 4;
        // Each tick starts elsewhere in the list: a pass cut short (the store failing mid-pass)
        // does not always leave out the same targets.
        let start = usize::try_from(self.clock.now().epoch_ms / tick_ms).unwrap_or(0)
            % targets.len().max(1);
        let (tail, head) = targets.split_at(start);
        for &target in head.iter().chain(tail) {
            if !self.due(target, self.clock.now().epoch_ms) {
                // Visited in this sale's tick already: still on the list a shutdown releases.
                if previous.contains(&target) {
                    held.insert(target);
                }
                continue;
            }
            // A reading serves a quarter tick at most, within its own tick (a slow store or many
            // sales stretch a pass): `failopen::PacerConfig::pace_after_ms` allows for that.
            let now_ms = self.clock.now().epoch_ms;
            if now_ms.saturating_sub(reading.sent_ms) >= fresh_for
                || !reading.same_tick(now_ms, tick_ms)
            {
                match self.read_roster().await {
                    Some(r) => reading = r,
                    None => break,
                }
            }
            report.visited += 1;
            match self.visit(target, &reading, &mut report).await {
                Ok(true) => {
                    held.insert(target);
                }
                Ok(false) => {}
                // The lock may be ours: keep it on the list a shutdown releases (the release
                // script only deletes a lock this instance owns).
                Err(_) => {
                    report.errors += 1;
                    held.insert(target);
                }
            }
        }
        report.led = held.len();
        self.metrics.leader.set(held.len() as i64);
        // Another instance leads these now: its gauge is the current one, ours is stale.
        for gone in previous.difference(&held) {
            let label = self.metrics.targets.label(*gone);
            let _ = self.metrics.length.remove_label_values(&[&label]);
        }
        *self.held.lock() = held;
        report
    }

    /// Records this instance in the roster with the share it would pace if cut off, and
    /// answers this tick's batch: lowered by the shares the instances that stopped registering
    /// may be pacing on their own. `None` while this instance's own store fails: it then sends
    /// no registration (one that landed would keep it live in the other pumps' eyes while it
    /// paces, `failopen`) and admits nobody.
    async fn read_roster(&self) -> Option<Reading> {
        if self.store.degraded() {
            return None;
        }
        let asked = self.pacer.slice_to_ask();
        let sent_ms = self.clock.now().epoch_ms;
        self.pacer.registering(asked, sent_ms);
        let presence = self
            .store
            .presence(
                &self.instance,
                Duration::from_millis(self.pacer.config().pace_until_ms()),
            )
            .await;
        let replicas = match self
            .store
            .update_roster(self.registering(asked, presence, false))
            .await
        {
            Ok(replicas) => replicas,
            // Who stopped registering is unknown: what this instance's own recorded slice admits
            // (while the roster still holds it) is what the others' slices, which never
            // overlap it, surely leave.
            Err(_) => {
                return Some(Reading {
                    part: Part {
                        only: Some(self.pacer.own_slice(sent_ms)),
                        ..Part::whole()
                    },
                    sent_ms,
                })
            }
        };
        if presence.is_some() {
            self.store.presence_seen(replicas.presence_seen);
        }
        if self.pacer.saw_roster_clock(
            replicas.clock,
            replicas.rollbacks,
            self.clock.now().epoch_ms,
        ) {
            self.metrics
                .data_loss
                .with_label_values(&["rollback"])
                .inc();
            tracing::error!(
                rollbacks = replicas.rollbacks,
                "Redis went back in time (a failover to a replica that missed writes, a restart from an old snapshot), or a replica found a sale's sequence or mark behind what it saw: writing back the spent claims and issued tokens this replica remembers"
            );
        }
        if replicas.retired {
            tracing::error!(
                instance = %self.instance,
                name = %self.name,
                "a newer instance registered with this replica's name: this one paces nobody from now on (two replicas with one server.replica_name?)"
            );
        }
        if replicas.dead > 0 || replicas.retired_others > 0 {
            tracing::info!(
                dead = replicas.dead,
                retired = replicas.retired_others,
                "replicas gone from the roster: their part of the batch is no longer held back"
            );
        }
        // The pacer divides by every replica seen recently: one that died lately makes each
        // slice smaller (fewer admissions), never larger.
        self.pacer.registered(
            replicas.recorded,
            replicas.desired,
            sent_ms,
            replicas.recent.max(replicas.live),
        );
        self.roster_credit_ms
            .store(replicas.credit_ms, std::sync::atomic::Ordering::Relaxed);
        self.metrics.replicas.set(i64::from(replicas.live));
        // Gateways of older versions pace a share of this file's batch.
        let batch = self.cfg.batch_size.get();
        let legacy = replicas.held_back_legacy.min(batch);
        Some(Reading {
            part: Part {
                ppm: self.share_ppm(batch - legacy),
                held_back: replicas.held_back,
                only: None,
            },
            sent_ms,
        })
    }

    fn registering(
        &self,
        asked: Slice,
        presence: Option<crate::store::PresenceKind>,
        leave: bool,
    ) -> RosterEntry<'_> {
        let c = self.pacer.config();
        let timeout = millis(self.cfg.heartbeat_timeout);
        RosterEntry {
            credit_ms: self
                .store
                .outage_credit_ms(self.clock.now().epoch_ms, timeout),
            instance: &self.instance,
            name: &self.name,
            asked,
            batch: self.cfg.batch_size.get(),
            min_replicas: c.min_replicas,
            presence,
            live_window: Duration::from_millis(c.live_window_ms()),
            recent_window: Duration::from_millis(c.paced_for_ms),
            leave,
            clock_seen: self.pacer.roster_clock().0,
            rollbacks_known: self.pacer.roster_clock().1,
        }
    }

    /// What an advance sent now may admit by `reading`: nothing once the tick it was read in
    /// is over (a reading that counted a replica live must not meet that replica's paced
    /// admissions in a later tick), nor in a tick in which this replica itself let users through
    /// while degraded (its slice is not held back now that it registers again).
    fn part_now(&self, reading: &Reading) -> Part {
        let tick_ms = self.tick_ms();
        let now_ms = self.clock.now().epoch_ms;
        if !reading.same_tick(now_ms, tick_ms)
            || self.pacer.paced_in(now_ms / tick_ms)
            || self.store.issue_held(&self.pacer, now_ms)
        {
            Part::ppm(0)
        } else {
            reading.part.clone()
        }
    }

    /// Returns whether this instance held the target's lock.
    async fn visit(
        &self,
        target: QueueTarget,
        reading: &Reading,
        report: &mut TickReport,
    ) -> Result<bool, crate::store::StoreError> {
        let store = &self.store;
        let cfg = &self.cfg;
        let tick = Duration::from_millis(self.tick_of(target));
        self.visited(target, millis(tick), self.clock.now().epoch_ms);
        if !store
            .try_lock(target, &self.instance, tick.mul_f64(0.9))
            .await?
        {
            return Ok(false);
        }
        // On the release list at once: a shutdown in the middle of this tick must give it back.
        self.held.lock().insert(target);
        let label = self.metrics.targets.label(target);
        let part = self.part_now(reading);
        let mut adv = store.advance(target, &part, self.clock.now()).await?;
        self.learn(target, &adv);
        if adv.outcome == AdvanceOutcome::Prequeue && adv.retry_in_ms == 0 {
            // The opening is due: the draw gives the pre-queue its places, then the first
            // admissions follow in the same visit.
            self.draw(target).await?;
            adv = store.advance(target, &part, self.clock.now()).await?;
            self.learn(target, &adv);
        }
        // This tick fired a little earlier after the last advance than the one before it (timer
        // jitter, another instance led last time): wait out the rest of the guard, once, while
        // the lock is still ours, instead of losing the whole tick. The script still decides.
        let retry = Duration::from_millis(adv.retry_in_ms);
        if adv.outcome == AdvanceOutcome::Guarded && retry <= Duration::from_millis(adv.tick_ms) / 4
        {
            self.clock.sleep(retry + Duration::from_millis(1)).await;
            let part = self.part_now(reading);
            adv = store.advance(target, &part, self.clock.now()).await?;
            self.learn(target, &adv);
        }
        if adv.outcome == AdvanceOutcome::Advanced {
            report.advanced += 1;
            report.admitted += adv.admitted_now;
            self.metrics
                .admitted
                .with_label_values(&[&label])
                .inc_by(adv.admitted_now);
        }
        let credit = self.sweep_credit_ms(self.clock.now().epoch_ms);
        let evicted = store
            .sweep(
                target,
                credit,
                cfg.max_evict_per_tick.get(),
                self.clock.now(),
            )
            .await?;
        report.evicted += evicted;
        let metrics = &self.metrics;
        metrics.evicted.with_label_values(&[&label]).inc_by(evicted);
        let remaining = adv.waiting.saturating_sub(evicted);
        metrics
            .length
            .with_label_values(&[&label])
            .set(i64::try_from(remaining).unwrap_or(i64::MAX));
        if adv.outcome != AdvanceOutcome::Guarded {
            self.record_tick(target, &adv, evicted, remaining).await;
        }
        let retire = {
            let mut empty = self.empty.lock();
            if remaining > 0 {
                empty.remove(&target);
                false
            } else {
                !empty.insert(target)
            }
        };
        if retire {
            store.retire_target(target).await?;
            self.empty.lock().remove(&target);
            let _ = metrics.length.remove_label_values(&[&label]);
        }
        Ok(true)
    }

    /// Adds this visit to the sale's console history. Best effort: a store that refuses it (full,
    /// or failing) costs the chart a point, never the tick.
    async fn record_tick(&self, target: QueueTarget, adv: &Advance, evicted: u64, waiting: u64) {
        let figures = TickFigures {
            at_ms: self.clock.now().epoch_ms,
            admitted: adv.admitted_now,
            evicted,
            waiting,
            batch: u64::from(adv.batch_size),
            outcome: adv.outcome,
        };
        let keep = TickFigures::keep(adv.tick_ms);
        if let Err(e) = self.store.record_tick(target, figures, keep).await {
            tracing::debug!(%target, error = %e, "the sale's console history missed a tick");
        }
    }

    /// The pre-queue's draw (`draw.rs`): the entrants as the store closed the pre-queue, their
    /// order from the sale's seed, written back in one step. Entrants that changed in between
    /// (one left or was evicted) leave it for the next visit, which starts over.
    async fn draw(&self, target: QueueTarget) -> Result<(), crate::store::StoreError> {
        let crate::store::DrawStep::Entrants {
            draw_seq,
            seed,
            entrants,
        } = self.store.draw_entrants(target, self.clock.now()).await?
        else {
            return Ok(());
        };
        let Some(seed) = crate::draw::unhex(&seed).filter(|s| s.len() == 32) else {
            tracing::error!(%target, "the sale's draw seed is not 32 bytes of hex; no draw");
            return Ok(());
        };
        let places = crate::draw::places(&seed, &entrants);
        let applied = self
            .store
            .apply_draw(target, draw_seq, &places, self.clock.now())
            .await?;
        if applied {
            tracing::info!(%target, entrants = places.len(), draw_seq, "pre-queue drawn");
        } else {
            tracing::info!(%target, "the pre-queue changed during the draw; drawing again next tick");
        }
        Ok(())
    }

    /// Time not held against silent users (the sweep's cutoff is this much before the sale's
    /// timeout). Users could not heartbeat while the store was down, nor while a replica refused
    /// their polls for saturation, so an outage or shedding episode (this replica's, or the
    /// largest any live replica reported) that ended less than a heartbeat timeout ago counts.
    fn sweep_credit_ms(&self, now_ms: u64) -> u64 {
        let timeout = millis(self.cfg.heartbeat_timeout);
        self.store.outage_credit_ms(now_ms, timeout).max(
            self.roster_credit_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// The part of a sale's batch an advance may admit, in millionths: what this file's batch
    /// lowered by the roster leaves of it (`read_roster`), as a part of it, so that it
    /// applies to every sale's own batch.
    fn share_ppm(&self, batch: u32) -> u32 {
        let whole = u64::from(self.cfg.batch_size.get());
        let part = u64::from(batch.min(self.cfg.batch_size.get())) * u64::from(WHOLE_BATCH_PPM);
        u32::try_from(part / whole).unwrap_or(WHOLE_BATCH_PPM)
    }

    /// What an admission step read of the sale: its tick (for scheduling) and its batch and tick
    /// (for the fail-open pacer's share of it).
    fn learn(&self, target: QueueTarget, adv: &crate::store::Advance) {
        let now_ms = self.clock.now().epoch_ms;
        let tick = adv.tick_ms.max(1);
        let mut ticks = self.ticks.lock();
        let visited = ticks
            .get(&target)
            .map_or(tick_index(now_ms, tick), |(old, v)| {
                if *old == tick {
                    *v
                } else {
                    tick_index(now_ms, tick)
                }
            });
        ticks.insert(target, (tick, visited));
        drop(ticks);
        self.pacer.set_sale(target, adv.batch_size, adv.tick_ms);
        self.pacer.set_mark(target, adv.admitted_count);
        self.report_losses(target, adv);
    }

    /// Logs and counts the losses of the sale's state the scripts found since the last step
    /// (docs/state.md): each kind's count in `queue:{T}:losses` that rose. A count that fell
    /// (the hash expired or was lost itself) starts over from it.
    fn report_losses(&self, target: QueueTarget, adv: &crate::store::Advance) {
        if adv.losses.is_empty() {
            return;
        }
        let before = self
            .losses
            .lock()
            .insert(target, adv.losses.clone())
            .unwrap_or_default();
        for (kind, count) in &adv.losses {
            let was = before
                .iter()
                .find(|(k, _)| k == kind)
                .map_or(0, |(_, c)| *c);
            let new = if *count >= was { count - was } else { *count };
            if new == 0 {
                continue;
            }
            if matches!(kind.as_str(), "seq" | "mark") {
                // Behind what a replica saw: tokens signed and claims spent in the lost part may
                // be gone too; every replica writes back what it remembers (as after a rollback).
                self.pacer.report_loss(self.clock.now().epoch_ms);
            }
            let label = match kind.as_str() {
                "seq" => "queue_seq",
                "mark" => "queue_mark",
                "waiting" => "queue_waiting",
                "alive" => "queue_heartbeats",
                "queued" => "queue_queued",
                "sale" => "sale_stand_in",
                _ => "queue_other",
            };
            self.metrics
                .data_loss
                .with_label_values(&[label])
                .inc_by(new);
            let what = match kind.as_str() {
                "seq" => "the sequence counter was missing or behind (deleted, or Redis came back from a failover behind): set forward to the highest seq handed out",
                "mark" => "the admission mark was missing or behind: set back to the highest this replica saw",
                "waiting" => "waiting users were missing: put back at the places their queue tickets prove",
                "alive" => "the heartbeat windows were missing: restarted (nobody is evicted for a heartbeat timeout)",
                "queued" => "the bitmap of waiting seqs was missing: made again from the waiting set",
                "sale" => "the sale's parameters were missing next to its queue: it is paused until a replica writes them back or an operator sets them",
                _ => "state was missing",
            };
            tracing::error!(%target, kind = %kind, found = new, total = count, "Redis lost part of a sale's state: {what}");
        }
    }

    /// Releases the locks this instance holds, so another instance takes over at its next tick.
    async fn release(&self) {
        let held: Vec<QueueTarget> = self.held.lock().iter().copied().collect();
        for target in held {
            let _ = self.store.unlock(target, &self.instance).await;
        }
    }
}

/// The tick (since the epoch) a visit at `now_ms` belongs to: a timer that fires a little early
/// (up to a tenth of a tick) counts for the tick it was meant for.
fn tick_index(now_ms: u64, tick_ms: u64) -> u64 {
    let tick = tick_ms.max(1);
    (now_ms + tick / 10) / tick
}

/// Time from `now_ms` until the next multiple of `tick` since the epoch.
fn until_next_tick(tick: Duration, now_ms: u64) -> Duration {
    let tick_ms = millis(tick).max(1);
    Duration::from_millis(tick_ms - now_ms % tick_ms)
}

fn instance_id() -> String {
    let mut random = [0u8; 6];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random);
    let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{suffix}", std::process::id())
}

#[async_trait]
impl BackgroundService for Pump {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tracing::info!(instance = %self.instance, tick_ms = millis(self.cfg.tick), "admission pump started");
        loop {
            let wait = until_next_tick(self.wake_every(), self.clock.now().epoch_ms);
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tokio::time::sleep(wait) => {}
            }
            tokio::select! {
                _ = shutdown.changed() => break,
                report = self.tick() => {
                    if report.advanced > 0 || report.evicted > 0 {
                        tracing::debug!(?report, "pump tick");
                    }
                }
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), self.release()).await;
        // A clean shutdown leaves the roster, so the others do not count this one as cut off.
        // From now on nobody holds a share back for it: while the listener drains it paces no
        // more, should its store fail.
        self.pacer
            .registering(Slice::EMPTY, self.clock.now().epoch_ms);
        let _ = self
            .store
            .update_roster(self.registering(Slice::EMPTY, None, true))
            .await;
        tracing::info!(instance = %self.instance, "admission pump stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_tick_is_within_one_tick() {
        let tick = Duration::from_millis(200);
        for now in [0, 1, 199, 200, 1_234_567] {
            let w = until_next_tick(tick, now);
            assert!(w > Duration::ZERO && w <= tick, "{w:?}");
            assert_eq!((now + millis(w)) % 200, 0);
        }
    }

    struct Rig {
        guard: Arc<StoreGuard>,
        pacer: Arc<Pacer>,
        clock: Arc<crate::clock::VirtualClock>,
        pump: Pump,
        target: QueueTarget,
    }

    /// A pump on the embedded store (batch 5, tick 1 s) with 20 users waiting.
    async fn rig() -> Rig {
        use crate::failopen::PacerConfig;
        use crate::queue::TargetType;
        use crate::store::MemoryStore;
        let metrics = Metrics::new().unwrap();
        let guard = Arc::new(StoreGuard::new(
            Arc::new(
                MemoryStore::new().with_sale_defaults(crate::sale::SaleDefaults {
                    batch_size: 5,
                    tick_ms: 1000,
                    max_capacity: 1000,
                    heartbeat_timeout_s: 600,
                }),
            ),
            crate::store::GuardConfig {
                timeout: Duration::from_millis(150),
                max_in_flight: 16,
            },
            metrics.clone(),
        ));
        let pacer = Arc::new(Pacer::new(PacerConfig {
            tick_ms: 1000,
            batch: 5,
            min_replicas: 1,
            paced_for_ms: 120_000,
            call_timeout_ms: 150,
        }));
        let clock = Arc::new(crate::clock::VirtualClock::new(1_000_000));
        let pump = Pump::new(
            guard.clone(),
            PumpConfig {
                tick: Duration::from_millis(1000),
                batch_size: std::num::NonZeroU32::new(5).unwrap(),
                heartbeat_timeout: Duration::from_secs(600),
                max_evict_per_tick: std::num::NonZeroU32::new(100).unwrap(),
            },
            metrics,
            pacer.clone(),
            clock.clone(),
        );
        let target = QueueTarget::new(TargetType::LimitedDrop, 1);
        for user in 1..=20 {
            guard.enter(target, user, clock.now()).await.unwrap();
        }
        Rig {
            guard,
            pacer,
            clock,
            pump,
            target,
        }
    }

    /// Any request-path call that the store answers ends the guard's degraded state.
    async fn store_answers(r: &Rig) {
        let never = || {
            Some(crate::store::TokenCandidate {
                token: String::new(),
                expires_at: 0,
            })
        };
        r.guard
            .poll(r.target, 20, r.clock.now(), &never)
            .await
            .unwrap();
        assert!(!r.guard.degraded());
    }

    fn block_on(f: impl std::future::Future<Output = ()>) {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(f);
    }

    /// A replica whose request path fails may pace on its own (`failopen`): its pump then neither
    /// registers nor admits, and does both again once the store answers.
    #[test]
    fn a_degraded_replica_s_pump_admits_nobody() {
        block_on(async {
            let r = rig().await;
            r.guard.fail_request_for_test();
            let report = r.pump.tick().await;
            assert_eq!((report.advanced, report.admitted), (0, 0), "{report:?}");
            assert_eq!(r.pacer.replicas(), 0, "no registration was sent");
            store_answers(&r).await;
            r.clock.advance(Duration::from_millis(1000));
            let report = r.pump.tick().await;
            assert_eq!((report.advanced, report.admitted), (1, 5), "{report:?}");
            assert_eq!(r.pacer.replicas(), 1);
        });
    }

    /// In a tick in which its replica let users through while degraded, the pump admits nobody
    /// even once the store answers again: nobody reserves that replica's share any more.
    #[test]
    fn no_advance_in_a_tick_the_replica_paced_in() {
        block_on(async {
            let r = rig().await;
            // Two registrations: the count, then the share (5, alone).
            for _ in 0..2 {
                r.pump.tick().await;
                r.clock.advance(Duration::from_millis(1000));
            }
            assert_eq!(r.pacer.own_slice(r.clock.now().epoch_ms), Slice::WHOLE);
            r.guard.fail_request_for_test();
            // Past the pacing delay (4 × 150 ms + 3 s + 1 s), at the start of a tick.
            r.clock.advance(Duration::from_millis(5000));
            let now = r.clock.now().epoch_ms;
            assert_eq!(
                r.pacer.try_admit(r.target, 99, now, 0),
                crate::failopen::Pace::Admitted
            );
            store_answers(&r).await;
            let report = r.pump.tick().await;
            assert_eq!(report.admitted, 0, "{report:?}");
            r.clock.advance(Duration::from_millis(1000));
            let report = r.pump.tick().await;
            assert_eq!(report.admitted, 5, "{report:?}");
        });
    }

    #[test]
    fn instance_ids_differ() {
        assert_ne!(instance_id(), instance_id());
    }
}
