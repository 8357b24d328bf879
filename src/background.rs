//! The background services besides the pump: the Redis connection (start-up, health probe,
//! claim write-back), the run-time settings refresher (flag and registered sales), and the JWT key
//! watcher. Each is a Pingora `BackgroundService`; `server::build` wires them and their order.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::services::ServiceReadyNotifier;

use crate::app::AppState;
use crate::flag::FlagState;
use crate::store::RedisStore;

/// How often each instance re-reads `queue:flag` (SPEC §7: every instance within 3 s).
pub const FLAG_REFRESH: Duration = Duration::from_secs(1);

/// How often the prober checks the store's request path (it also notices a hang without traffic).
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// Re-reads `queue:targets` (with `queue.targets = "registered"`); `reported` remembers the bad
/// members already logged.
async fn refresh_registry(state: &AppState, store: &RedisStore, reported: &mut Vec<String>) {
    if state.registry.mode() != crate::registry::TargetsMode::Registered {
        return;
    }
    let Ok(members) = state
        .store
        .background("targets", store.registered_targets())
        .await
    else {
        return;
    };
    let bad = state.registry.set_dynamic(&members);
    if bad != *reported {
        for b in &bad {
            tracing::warn!(member = %b, "ignoring a queue:targets member that is not TYPE:ID");
        }
        *reported = bad;
    }
}

/// The run-time settings kept in Redis: the flag (`queue:flag`) and the registered sales
/// (`queue:targets`), re-read every second; the last known values stay while Redis is down.
/// Starts after `RedisConnection` (a service dependency).
pub struct RuntimeSettings {
    pub store: Arc<RedisStore>,
    pub state: Arc<AppState>,
    pub defaults: FlagState,
}

#[async_trait]
impl BackgroundService for RuntimeSettings {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tokio::select! {
            _ = shutdown.changed() => {}
            _ = self.refresh() => {}
        }
    }
}

impl RuntimeSettings {
    async fn refresh(&self) {
        let mut reported: Vec<String> = Vec::new();
        let mut reported_targets: Vec<String> = Vec::new();
        let mut ticker = tokio::time::interval(FLAG_REFRESH);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            // A failure is counted by the guard; the last known value stays.
            let Ok(fields) = self
                .state
                .store
                .background("flag", self.store.read_flag())
                .await
            else {
                continue;
            };
            refresh_registry(&self.state, &self.store, &mut reported_targets).await;
            let (next, problems) = FlagState::with_overrides(&self.defaults, &fields);
            if problems != reported {
                for p in &problems {
                    tracing::warn!(problem = %p, "ignoring a bad runtime flag field");
                }
                reported = problems;
            }
            if next != self.state.flag.snapshot() {
                tracing::info!(
                    enabled = next.enabled,
                    rollout_percent = next.rollout_percent,
                    targets = next.per_target.len(),
                    "runtime flag changed"
                );
                self.state.flag.set(next);
            }
        }
    }
}

/// The Redis connection's service: connects at start-up (the public listener waits for it, up to
/// `store.startup_wait_ms`, so a starting replica never answers before it has tried its store),
/// then keeps the connection task on a runtime that lives as long as the server, probes the
/// store's health (ending a degraded episode by itself) and writes back the claims taken while
/// the store was down.
pub struct RedisConnection {
    pub store: Arc<RedisStore>,
    pub state: Arc<AppState>,
}

impl RedisConnection {
    /// Probes the request path every `PROBE_EVERY` (the guard's breaker lets one probe through
    /// at a time and refuses the rest at once), and once the store answers, writes the claims
    /// taken locally during the outage so those tokens stay spent.
    async fn probe(&self) {
        let store = &self.state.store;
        let mut ticker = tokio::time::interval(PROBE_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if store.probe().await.is_err() || self.state.claims.pending_len() == 0 {
                continue;
            }
            let now = crate::clock::now();
            let pending = self.state.claims.take_pending(now.epoch_ms / 1000);
            let mut left = Vec::new();
            let mut written = 0usize;
            for (target, id, expires_at) in pending {
                if !left.is_empty() {
                    left.push((target, id, expires_at));
                    continue;
                }
                let ttl =
                    Duration::from_secs(expires_at.saturating_sub(now.epoch_ms / 1000).max(1));
                match store
                    .background("claim_replay", store.inner().claim(target, &id, ttl, now))
                    .await
                {
                    Ok(_) => written += 1,
                    Err(_) => left.push((target, id, expires_at)),
                }
            }
            if written > 0 {
                tracing::info!(
                    written,
                    "claims taken during the outage written to the store"
                );
            }
            self.state.claims.restore_pending(left);
        }
    }

    /// Warns when full queues would not fit in Redis' `maxmemory`, or when Redis may evict queue
    /// state under memory pressure.
    async fn check_memory(&self) {
        let Some((maxmemory, policy)) = self.store.memory_config().await else {
            return;
        };
        let need = self.state.config.worst_case_redis_bytes();
        if maxmemory > 0 && need > maxmemory {
            tracing::warn!(
                maxmemory,
                worst_case_bytes = need,
                "queue.max_capacity x queue.max_active_targets does not fit in Redis maxmemory: \
                 when Redis is full new enters get 429 QUEUE_FULL (waiting users keep their places)"
            );
        }
        if policy != "noeviction" {
            tracing::warn!(policy = %policy, "Redis maxmemory-policy is not noeviction: queue state may be evicted");
        }
    }
}

#[async_trait]
impl BackgroundService for RedisConnection {
    async fn start_with_ready_notifier(
        &self,
        mut shutdown: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        let wait = self.state.config.store.startup_wait;
        tokio::select! {
            _ = shutdown.changed() => return,
            reached = self.store.connect(wait) => {
                if reached {
                    self.check_memory().await;
                    // Registered sales known before the first request: until they are, their
                    // purchases are refused rather than let through ungated.
                    refresh_registry(&self.state, &self.store, &mut Vec::new()).await;
                }
            }
        }
        // The public listener opens now: with the store reached, or degraded after the wait.
        ready.notify_ready();
        tokio::select! {
            _ = shutdown.changed() => {}
            _ = self.probe() => {}
        }
        // No QUIT: during the shutdown grace period the pump still releases its locks; the
        // connection ends with this service's runtime.
    }
}

/// How often the identity key file is checked for changes.
const KEY_RELOAD_EVERY: Duration = Duration::from_secs(1);

/// Reloads the JWT verification keys when their file changes (`identity.rs`).
pub struct KeyWatcher {
    pub state: Arc<AppState>,
}

#[async_trait]
impl BackgroundService for KeyWatcher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticker = tokio::time::interval(KEY_RELOAD_EVERY);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = ticker.tick() => {
                    self.state.identity.reload_if_changed();
                }
            }
        }
    }
}
