//! The Redis connection's service: start-up, the health probe, and the write-back of what this
//! replica did while the store could not be used (claims, paced admissions, and everything it
//! remembers after a rollback).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::services::ServiceReadyNotifier;

use super::settings::SettingsRefresher;
use crate::app::AppState;
use crate::store::RedisStore;

/// The owner recorded on a claim written back after an outage (any value but a purchase's own).
const REPLAY_OWNER: &str = "replay";

/// How often the prober checks the store's request path (it also notices a hang without traffic).
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// The Redis connection's service: connects at start-up (the public listener waits for it, up to
/// `store.startup_wait_ms`, so a starting replica never answers before it has tried its store),
/// then keeps the connection task on a runtime that lives as long as the server, probes the
/// store's health (ending a degraded episode by itself) and writes back the claims taken while
/// the store was down.
pub struct RedisConnection {
    pub store: Arc<RedisStore>,
    pub state: Arc<AppState>,
    pub settings: Arc<SettingsRefresher>,
}

impl RedisConnection {
    /// Probes the request path every `PROBE_EVERY` (the guard's breaker lets one probe through
    /// at a time and refuses the rest at once), and once the store answers, writes the claims
    /// taken locally during the outage so those tokens stay spent.
    async fn probe(&self) {
        let store = &self.state.store;
        let mut ticker = tokio::time::interval(PROBE_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut compacted_at = 0;
        loop {
            ticker.tick().await;
            let now_s = crate::clock::now().epoch_ms / 1000;
            if now_s != compacted_at {
                compacted_at = now_s;
                self.state.claims.compact_journal(now_s);
            }
            if store.probe().await.is_err() {
                continue;
            }
            if self.state.pacer.take_rollback() {
                // Redis went back in time: the claims spent and the tokens issued in the lost
                // window are written again, so no spent token buys again and nobody gets a
                // second token (docs/state.md).
                self.state.claims.requeue_all(now_s);
                self.state
                    .pacer
                    .return_unrecorded(self.state.issued.live(now_s));
            }
            self.record_paced().await;
            if self.state.claims.pending_len() == 0 {
                continue;
            }
            // The claims taken while the store was down (or remembered, after it lost its data).
            let now = crate::clock::now();
            let pending = self.state.claims.take_pending(now.epoch_ms / 1000);
            let mut left = Vec::new();
            let mut written = 0usize;
            for (target, id, expires_at) in pending {
                if !left.is_empty() {
                    left.push((target, id, expires_at));
                    continue;
                }
                let terms =
                    crate::gateway::gate::claim_terms(&self.state, expires_at, now.epoch_ms / 1000);
                let spend = store.inner().settle(
                    target,
                    &id,
                    REPLAY_OWNER,
                    crate::store::Settle::Spend,
                    terms,
                    now,
                );
                match store.background("claim_replay", spend).await {
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

    /// Writes the admissions this replica made while pacing into the store (`record_paced`):
    /// their tokens become the stored ones and their users leave the waiting room, so the pump
    /// never admits them a second time and their next polls answer the same token.
    async fn record_paced(&self) {
        let paced = self.state.pacer.take_unrecorded();
        if paced.is_empty() {
            return;
        }
        let store = &self.state.store;
        let now = crate::clock::now();
        let mut left = Vec::new();
        let mut written = 0usize;
        for (target, user, expires_at) in paced {
            if !left.is_empty() || expires_at <= now.epoch_ms / 1000 {
                if expires_at > now.epoch_ms / 1000 {
                    left.push((target, user, expires_at));
                }
                continue;
            }
            let payload = crate::token::TokenPayload {
                target_type: target.kind,
                target_id: target.id,
                user_id: user,
                expires_at,
            };
            let token = crate::store::TokenCandidate {
                token: crate::token::mint(&self.state.keys, &payload),
                expires_at,
            };
            match crate::store::QueueStore::record_paced(&**store, target, user, &token, now).await
            {
                Ok(true) => written += 1,
                Ok(false) => {}
                Err(_) => left.push((target, user, expires_at)),
            }
        }
        if written > 0 {
            tracing::info!(
                written,
                "admissions made while pacing recorded in the store (their users are not admitted again)"
            );
        }
        self.state.pacer.return_unrecorded(left);
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
                    // The flag and the registered sales known before the first request: until
                    // they are, everyone queues and unregistered purchases wait.
                    self.settings.pass().await;
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
