//! The admission pump (SPEC §5): a background service in every instance. Ticks are aligned to
//! multiples of `tick_ms` since the epoch, so all instances try at the same moments and the lock
//! decides who works. Per active target and tick: take the lock (`SET NX PX`, TTL < tick); if taken,
//! advance (the script itself refuses a second advance within 0.95 × tick, whoever calls it) and
//! sweep stale heartbeats.
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
use crate::config::QueueConfig;
use crate::failopen::Pacer;
use crate::metrics::Metrics;
use crate::queue::{millis, QueueTarget};
use crate::store::{AdvanceOutcome, QueueStore, Registering, StoreGuard};

/// What one tick did, for tests and logs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TickReport {
    pub targets: usize,
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

impl PumpConfig {
    pub fn from_config(c: &QueueConfig) -> PumpConfig {
        PumpConfig {
            tick: c.tick,
            batch_size: c.batch_size,
            heartbeat_timeout: c.heartbeat_timeout,
            max_evict_per_tick: c.max_evict_per_tick,
        }
    }
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
    held: parking_lot::Mutex<BTreeSet<QueueTarget>>,
    /// Targets this instance found with an empty queue at its last visit: empty twice in a row,
    /// a target is retired from the active set (it stops counting against the cap).
    empty: parking_lot::Mutex<BTreeSet<QueueTarget>>,
    /// What the registry last said the instances that stopped registering may be pacing.
    reserved: std::sync::atomic::AtomicU32,
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
            held: Default::default(),
            empty: Default::default(),
            reserved: Default::default(),
        }
    }

    fn lock_ttl(&self) -> Duration {
        self.cfg.tick.mul_f64(0.9)
    }

    fn min_interval(&self) -> Duration {
        self.cfg.tick.mul_f64(0.95)
    }

    /// One pass over the active targets.
    pub async fn tick(&self) -> TickReport {
        let mut report = TickReport::default();
        let store = &self.store;
        if !store.started() {
            return report;
        }
        // The instances that stopped registering may be pacing their recorded shares on their
        // own: this tick admits that much less.
        let batch = self
            .cfg
            .batch_size
            .get()
            .saturating_sub(self.register().await);
        // Failures are counted (and logged once per outage) by the store guard.
        let targets = match store.active_targets(self.clock.now()).await {
            Ok(t) => t,
            Err(_) => {
                report.errors += 1;
                return report;
            }
        };
        self.pacer.set_known(&targets);
        report.targets = targets.len();
        let previous = self.held.lock().clone();
        let mut held = BTreeSet::new();
        for target in targets {
            match self.visit(target, batch, &mut report).await {
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

    /// Records this instance in the registry with the share it would pace if cut off, and
    /// answers how many admissions per tick the instances that stopped registering may be making
    /// on their own (the pump's batch is lowered by that much). While its own store fails, this
    /// instance sends no registration: one that landed would keep it live in the other pumps'
    /// eyes while it paces (`failopen`), and the last known reservation stands.
    async fn register(&self) -> u32 {
        if self.store.degraded() {
            return self.reserved.load(std::sync::atomic::Ordering::Relaxed);
        }
        let share = self.pacer.share_to_record();
        let sent = self.clock.now().epoch_ms;
        self.pacer.registering(share, sent);
        let Ok(n) = self
            .store
            .register_instance(self.registering(share, false))
            .await
        else {
            return self.reserved.load(std::sync::atomic::Ordering::Relaxed);
        };
        // The pacer divides by every replica seen recently: one that died lately makes each
        // share smaller (fewer admissions), never larger.
        self.pacer
            .registered(n.recorded, sent, n.recent.max(n.live));
        self.metrics.replicas.set(i64::from(n.live));
        // An instance of a version that records no share paces ⌈batch / replicas⌉.
        let unrecorded = n
            .unrecorded
            .saturating_mul(self.cfg.batch_size.get().div_ceil(n.recent.max(1)));
        let reserved = n.reserved.saturating_add(unrecorded);
        self.reserved
            .store(reserved, std::sync::atomic::Ordering::Relaxed);
        reserved
    }

    fn registering(&self, share: u32, leave: bool) -> Registering<'_> {
        let c = self.pacer.config();
        Registering {
            instance: &self.instance,
            share,
            batch: self.cfg.batch_size.get(),
            live_window: Duration::from_millis(c.live_window_ms()),
            recent_window: Duration::from_millis(c.paced_for_ms),
            leave,
        }
    }

    /// Returns whether this instance held the target's lock.
    async fn visit(
        &self,
        target: QueueTarget,
        batch: u32,
        report: &mut TickReport,
    ) -> Result<bool, crate::store::StoreError> {
        let store = &self.store;
        let cfg = &self.cfg;
        if !store
            .try_lock(target, &self.instance, self.lock_ttl())
            .await?
        {
            return Ok(false);
        }
        // On the release list at once: a shutdown in the middle of this tick must give it back.
        self.held.lock().insert(target);
        let label = self.metrics.targets.label(target);
        if batch == 0 {
            // Every admission of this tick is with replicas that may be pacing on their own.
            return Ok(true);
        }
        let mut adv = store
            .advance(target, batch, self.min_interval(), self.clock.now())
            .await?;
        // This tick fired a little earlier after the last advance than the one before it (timer
        // jitter, another instance led last time): wait out the rest of the guard, once, while
        // the lock is still ours, instead of losing the whole tick. The script still decides.
        let retry = Duration::from_millis(adv.retry_in_ms);
        if adv.outcome == AdvanceOutcome::Guarded && retry <= cfg.tick / 4 {
            self.clock.sleep(retry + Duration::from_millis(1)).await;
            adv = store
                .advance(target, batch, self.min_interval(), self.clock.now())
                .await?;
        }
        if adv.outcome == AdvanceOutcome::Advanced {
            report.advanced += 1;
            report.admitted += adv.admitted_now;
            self.metrics
                .admitted
                .with_label_values(&[&label])
                .inc_by(adv.admitted_now);
        }
        let cutoff = self.sweep_cutoff(self.clock.now().epoch_ms);
        let evicted = store
            .sweep(
                target,
                cutoff,
                cfg.max_evict_per_tick.get(),
                self.clock.now(),
            )
            .await?;
        report.evicted += evicted;
        let m = &self.metrics;
        m.evicted.with_label_values(&[&label]).inc_by(evicted);
        let remaining = adv.waiting.saturating_sub(evicted);
        m.length
            .with_label_values(&[&label])
            .set(i64::try_from(remaining).unwrap_or(i64::MAX));
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
            let _ = m.length.remove_label_values(&[&label]);
        }
        Ok(true)
    }

    /// Heartbeats at or before this are stale. Users could not heartbeat while the store was
    /// down, so an outage that ended less than a heartbeat timeout ago is not held against them.
    fn sweep_cutoff(&self, now_ms: u64) -> u64 {
        let timeout = millis(self.cfg.heartbeat_timeout);
        let credit = self.store.outage_credit_ms(now_ms, timeout);
        now_ms.saturating_sub(timeout).saturating_sub(credit)
    }

    /// Releases the locks this instance holds, so another instance takes over at its next tick.
    async fn release(&self) {
        let held: Vec<QueueTarget> = self.held.lock().iter().copied().collect();
        for target in held {
            let _ = self.store.unlock(target, &self.instance).await;
        }
    }
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
            let wait = until_next_tick(self.cfg.tick, self.clock.now().epoch_ms);
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
        // A clean shutdown leaves the registry, so the others do not count this one as cut off.
        let _ = self
            .store
            .register_instance(self.registering(0, true))
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

    #[test]
    fn instance_ids_differ() {
        assert_ne!(instance_id(), instance_id());
    }
}
