//! The background services besides the pump: the Redis connection (start-up, health probe,
//! claim write-back), the run-time settings refresher (flag and registered sales, written back
//! when Redis loses them), and the JWT key watcher. Each is a Pingora `BackgroundService`; `server::build` wires them and their order.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::services::ServiceReadyNotifier;

use parking_lot::Mutex;

use crate::app::AppState;

/// The most registered sales whose parameters a replica reads (and writes back) per refresh.
const MAX_SALES_REFRESHED: usize = 10_000;

/// The owner recorded on a claim written back after an outage (any value but a purchase's own).
const REPLAY_OWNER: &str = "replay";
use crate::flag::FlagState;
use crate::settings::{Doc, DocKind, Step, Tracker};
use crate::store::RedisStore;

/// How often each instance re-reads `queue:flag` (every instance within 3 s:
/// docs/operations.md#the-flag).
pub const FLAG_REFRESH: Duration = Duration::from_secs(1);

/// How often the prober checks the store's request path (it also notices a hang without traffic).
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// The run-time settings kept in Redis (`settings.rs`): the flag (`queue:flag`) and, with
/// `queue.targets = "registered"`, the registered sales (`queue:targets`), each read with its
/// version every second. The last known documents stay while Redis is down, and are written back
/// when Redis comes back without them. Shared by `RedisConnection` (one pass before the public
/// listener opens) and `RuntimeSettings` (every second after).
pub struct SettingsRefresher {
    pub store: Arc<RedisStore>,
    pub state: Arc<AppState>,
    /// The TOML `[flag]` values: the flag document's first content, and the value of a field it
    /// lacks.
    pub defaults: FlagState,
    flag: Mutex<Tracker>,
    targets: Mutex<Tracker>,
    /// Problems already logged (bad flag fields, invalid members of the allowed sales), so each is logged
    /// when it appears rather than every second.
    reported: Mutex<(Vec<String>, Vec<String>)>,
    /// The registered sales' parameters as last read (`queue:{T}:sale`), written back when Redis
    /// lost them or holds an older version.
    sales: Mutex<std::collections::HashMap<crate::queue::QueueTarget, crate::sale::Sale>>,
}

impl SettingsRefresher {
    pub fn new(store: Arc<RedisStore>, state: Arc<AppState>, defaults: FlagState) -> Self {
        SettingsRefresher {
            store,
            state,
            defaults,
            flag: Default::default(),
            targets: Default::default(),
            sales: Default::default(),
            reported: Default::default(),
        }
    }

    /// Reads every document once and acts on what it found. The registered sales are read in
    /// either `queue.targets` mode: they are also the list of sales whose parameters are written
    /// back after a data loss.
    pub async fn pass(&self) {
        self.refresh(DocKind::Flag).await;
        self.refresh(DocKind::Targets).await;
        self.refresh_sales().await;
    }

    /// Reads each registered sale's parameters, remembers them, and writes back what it
    /// remembers when Redis lost a sale or holds an older version of it (restarted empty, failed
    /// over to a replica that missed the change): a Redis that comes back empty neither deletes
    /// a sale nor resets its budget. A sale deleted by an operator is unregistered first, so no
    /// replica brings it back.
    async fn refresh_sales(&self) {
        use crate::store::QueueStore;
        let registered: Vec<crate::queue::QueueTarget> = match self.targets.lock().known() {
            Some(doc) => doc
                .items
                .iter()
                .filter_map(|(m, _)| crate::queue::QueueTarget::parse_key(m))
                .take(MAX_SALES_REFRESHED)
                .collect(),
            None => return,
        };
        let store = &self.state.store;
        for &target in &registered {
            let Ok(read) = store.sale(target).await else {
                // Counted by the guard; the remembered sales stay.
                return;
            };
            self.state
                .sales
                .set(target, read.clone(), None, crate::clock::now().epoch_ms);
            let known = self.sales.lock().get(&target).cloned();
            // A paused stand-in the scripts made for a lost sale (`lost_at_ms`) is older than
            // any sale read: never remembered, always replaced by the one remembered.
            let lost = match (&read, &known) {
                (None, Some(k)) => Some(k.clone()),
                (Some(r), Some(k)) if r.version < k.version || r.lost_at_ms > 0 => Some(k.clone()),
                _ => None,
            };
            let Some(known) = lost else {
                if let Some(r) = read.filter(|r| r.lost_at_ms == 0) {
                    self.store.saw_sale(target, r.version);
                    self.sales.lock().insert(target, r);
                }
                continue;
            };
            self.state
                .metrics
                .data_loss
                .with_label_values(&["sale"])
                .inc();
            tracing::error!(%target, version = known.version, "Redis lost a sale's parameters (restarted empty, failed over, or flushed); writing back the last ones read");
            match store.restore_sale(target, &known).await {
                Ok(stored) => {
                    tracing::info!(%target, version = stored.version, "sale written back");
                    self.sales.lock().insert(target, stored);
                }
                Err(e) => {
                    tracing::warn!(%target, error = %e, "writing a sale back failed; trying again at the next refresh")
                }
            }
        }
        self.sales.lock().retain(|t, _| {
            let keep = registered.contains(t);
            if !keep {
                self.store.forget_sale(*t);
            }
            keep
        });
    }

    fn tracker(&self, kind: DocKind) -> &Mutex<Tracker> {
        match kind {
            DocKind::Flag => &self.flag,
            DocKind::Targets => &self.targets,
        }
    }

    async fn refresh(&self, kind: DocKind) {
        let store = &self.state.store;
        // A failure is counted by the guard; the last known document stays.
        let Ok(reading) = store
            .background("settings", self.store.read_doc(kind))
            .await
        else {
            return;
        };
        let now_ms = crate::clock::now().epoch_ms;
        let step = self.tracker(kind).lock().observe(reading, now_ms);
        let write = |op: &'static str, arg: u64, items: Vec<(String, String)>| async move {
            let written = store
                .background(
                    "settings",
                    self.store.write_doc(kind, op, arg, false, &items),
                )
                .await;
            if let Err(e) = &written {
                tracing::warn!(state = kind.as_str(), op, error = %e, "writing a settings document failed; trying again at the next refresh");
            }
            written
        };
        match step {
            Step::Adopt(doc) => self.apply(kind, &doc),
            Step::Stamp(doc) => {
                self.apply(kind, &doc);
                let _ = write("bootstrap", 0, self.first_content(kind)).await;
            }
            Step::Restore { known, new_loss } => {
                if new_loss {
                    self.state
                        .metrics
                        .data_loss
                        .with_label_values(&[kind.as_str()])
                        .inc();
                    if kind == DocKind::Flag {
                        // The spent tokens and issued ones went with it: write back every
                        // claim and token remembered here.
                        self.state.claims.requeue_all(now_ms / 1000);
                        self.state
                            .pacer
                            .return_unrecorded(self.state.issued.live(now_ms / 1000));
                    }
                    tracing::error!(
                        state = kind.as_str(),
                        key = kind.key(),
                        version = known.version,
                        "Redis lost run-time settings (restarted without persistence, failed over, or flushed); keeping the last known ones and writing them back"
                    );
                }
                if let Ok((status, version)) = write("restore", known.version, known.items).await {
                    tracing::info!(state = kind.as_str(), status = %status, version, "run-time settings written back");
                }
            }
            Step::Bootstrap => {
                if let Ok((status, version)) = write("bootstrap", 0, self.first_content(kind)).await
                {
                    tracing::info!(state = kind.as_str(), status = %status, version, "run-time settings created from the configuration file");
                }
            }
            Step::Wait => {}
        }
    }

    /// What a document holds when it is first created: the TOML `[flag]` values, written out so
    /// that every replica reads the same ones from then on; an empty set of registered sales.
    fn first_content(&self, kind: DocKind) -> Vec<(String, String)> {
        let on_off = |b: bool| if b { "on" } else { "off" };
        match kind {
            DocKind::Flag => vec![
                ("enabled".into(), on_off(self.defaults.enabled).into()),
                (
                    "rollout_percent".into(),
                    self.defaults.rollout_percent.to_string(),
                ),
            ],
            DocKind::Targets => Vec::new(),
        }
    }

    fn apply(&self, kind: DocKind, doc: &Doc) {
        match kind {
            DocKind::Flag => {
                let (next, problems) = FlagState::with_overrides(&self.defaults, &doc.items);
                let mut reported = self.reported.lock();
                if problems != reported.0 {
                    for p in &problems {
                        tracing::warn!(problem = %p, "ignoring a bad runtime flag field");
                    }
                    reported.0 = problems;
                }
                drop(reported);
                self.state.metrics.flag_known.set(1);
                if self.state.flag.snapshot().as_ref() != Some(&next) {
                    tracing::info!(
                        enabled = next.enabled,
                        rollout_percent = next.rollout_percent,
                        targets = next.per_target.len(),
                        version = doc.version,
                        "runtime flag changed"
                    );
                    self.state.flag.set(next);
                }
            }
            DocKind::Targets => {
                let members: Vec<String> = doc.items.iter().map(|(m, _)| m.clone()).collect();
                let bad = self.state.allowed.set_dynamic(&members);
                self.state
                    .metrics
                    .registered_invalid
                    .set(i64::try_from(bad.len()).unwrap_or(i64::MAX));
                let mut reported = self.reported.lock();
                if bad != reported.1 {
                    for b in &bad {
                        tracing::warn!(member = %b, "a queue:targets member is not canonical TYPE:ID (vq-gateway target remove it and add the sale again); a near miss still registers the sale it names");
                    }
                    reported.1 = bad;
                }
            }
        }
    }
}

/// Re-reads the run-time settings every `FLAG_REFRESH` (every instance within 3 s:
/// docs/operations.md#the-flag).
#[async_trait]
impl crate::settings::FlagWriter for SettingsRefresher {
    /// Sets the fields in `queue:flag` (as `vq-gateway flag set` does) and reads the document
    /// back at once, so this replica answers with the change before its next refresh.
    async fn write_flag(&self, fields: &[(String, String)]) -> Result<u64, String> {
        let now_ms = crate::clock::now().epoch_ms;
        let written = self
            .state
            .store
            .background(
                "settings",
                self.store
                    .write_doc(DocKind::Flag, "set", now_ms, false, fields),
            )
            .await
            .map_err(|e| format!("the flag could not be written: {e}"))?;
        match written {
            (status, version) if status == "ok" => {
                self.refresh(DocKind::Flag).await;
                Ok(version)
            }
            (status, _) if status == "missing" => Err(
                "the flag document is missing from Redis (lost, or not created yet); the replicas write it back within seconds: try again".into(),
            ),
            (status, _) => Err(format!("the flag could not be written: `{status}`")),
        }
    }
}

/// Starts after `RedisConnection` (a service dependency).
pub struct RuntimeSettings {
    pub refresher: Arc<SettingsRefresher>,
}

#[async_trait]
impl BackgroundService for RuntimeSettings {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticker = tokio::time::interval(FLAG_REFRESH);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = ticker.tick() => self.refresher.pass().await,
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

/// Renews the leases of the claims whose purchases are in flight through this replica (every
/// third of `gate::CLAIM_LEASE`), so a claim lapses only when its replica is gone.
pub struct ClaimLeases {
    pub state: Arc<AppState>,
}

#[async_trait]
impl BackgroundService for ClaimLeases {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticker = tokio::time::interval(crate::gateway::gate::CLAIM_LEASE / 3);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = ticker.tick() => self.renew().await,
            }
        }
    }
}

impl ClaimLeases {
    async fn renew(&self) {
        let store = &self.state.store;
        for (target, id, owner) in self.state.claims.leases() {
            let now = crate::clock::now();
            // The lease's length is all renewing uses of the terms.
            let terms = crate::gateway::gate::claim_terms(&self.state, 0, 0);
            let renew =
                store
                    .inner()
                    .settle(target, &id, &owner, crate::store::Settle::Renew, terms, now);
            if let Ok(false) = store.background("claim_lease", renew).await {
                // Settled meanwhile, or the lease lapsed (this replica could not renew it in
                // time) and the claim may be another attempt's now.
                tracing::debug!(%target, "a claim's lease was not renewed: settled or lapsed");
            }
        }
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
