//! The run-time settings refresher: the flag and the registered sales, read with their versions
//! every second, kept while Redis is down and written back when Redis loses them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use parking_lot::Mutex;

use crate::app::AppState;
use crate::flag::FlagState;
use crate::settings::{Doc, DocKind, Step, Tracker};
use crate::store::RedisStore;

/// The most registered sales whose parameters a replica reads (and writes back) per refresh.
const MAX_SALES_REFRESHED: usize = 10_000;

/// How often each instance re-reads `queue:flag` (every instance within 3 s:
/// docs/operations.md#the-flag).
pub const FLAG_REFRESH: Duration = Duration::from_secs(1);

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

/// Re-reads the run-time settings every `FLAG_REFRESH` (every instance within 3 s:
/// docs/operations.md#the-flag). Starts after `RedisConnection` (a service dependency).
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
