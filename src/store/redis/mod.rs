//! `RedisStore`: all queue state in Redis (docs/redis.md#keys), shared by every gateway replica.
//! This file holds the store's operations; how a script call reaches the right server (`EVALSHA` on
//! the deployment's pipelined connections, a `NOSCRIPT` reply from a restarted or flushed Redis
//! loading the script and retrying once, never reaching the caller) is `dispatch.rs`. Other
//! commands go through fred with the per-call timeout and fail-fast options. Every call is bounded
//! by `command_timeout`; a disconnected client fails at once instead of queueing. Timeouts,
//! refusals under `maxmemory` and disconnections come back as distinct `StoreError`s; what to do
//! about them (breaker, deadlines, fail-open) is `StoreGuard`'s business, not this file's.
//!
//! fred spawns its connection task on the runtime that calls `connect`, so `connect` is called
//! from a Pingora background service whose runtime lives as long as the server.
//!
//! The operator-facing keys (flag, registered sales, memory settings) are `settings.rs`.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use fred::prelude::*;
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand};

mod batch;
mod cluster;
mod dispatch;
mod pipe;
mod presence;
mod seen;
mod sentinel;
mod settings;
pub mod url;

use batch::{BatchKey, Kind};
use cluster::ClusterPipes;
use dispatch::{store_err, Caller, Dispatch, CLUSTER_ATTEMPTS};
use pipe::Pipes;
use sentinel::SentinelWatch;
use url::{Deployment, RedisUrl};

use super::replies::{self, as_u64, reply_array, PollReply};
use super::scripts::{
    Key, Script, Scripts, TargetKeys, ACTIVE_KEY, ROSTER_CLOCK_KEY, ROSTER_CREDIT_KEY, ROSTER_KEY,
    ROSTER_PRESENCE_KEY, ROSTER_RETIRED_KEY,
};
use super::{
    Advance, ClaimTake, ClaimTerms, EnterOutcome, Mint, Now, Part, PollOutcome, PresenceKind,
    QueueStore, Roster, RosterEntry, RosterMember, Settle, StoreError, TickFigures, TokenCandidate,
    ADVANCE_SAMPLES, DEFAULT_MAX_TARGETS, RATE_WINDOW_MS, TARGET_KEY_TTL_SECS, TICKS_KEPT_MS,
    WAIT_SAMPLES,
};
use crate::queue::{millis, QueueStats, QueueTarget};
use crate::sale::{FieldError, Sale, SaleDefaults, SalePatch};

/// How often one instance re-adds a target it serves to `queue:active` (the pump drops targets
/// whose keys expired, so a live target must be added again now and then).
const ACTIVE_REFRESH: Duration = Duration::from_secs(10);

/// The key the health probe writes (`SET NX PX 1000`).
const PROBE_KEY: &str = "queue:probe";

/// How long a stats summary computed by `stats.lua` is reused (the answer is at most this stale).
const STATS_SUMMARY_MAX_AGE_MS: u64 = 1000;

pub struct RedisStore {
    client: Client,
    options: Options,
    started: std::sync::atomic::AtomicBool,
    scripts: Arc<Scripts>,
    /// When this instance last added each target to the active sales (`queue:active`).
    marked_active: Mutex<HashMap<QueueTarget, Instant>>,
    max_targets: usize,
    /// What a sale is created with when its creator does not say (`[queue]`).
    defaults: SaleDefaults,
    /// Makes the script calls; shared with the tasks that send gathered enters and polls.
    caller: Arc<Caller>,
    /// Tells this store's gathered calls from another store's on the same thread.
    id: u64,
    deployment: Deployment,
    /// What the pipelined connections report (`pipe::Wire`).
    wire: Arc<pipe::Wire>,
    /// This instance's presence connection (`presence.rs`), and the configuration it is built
    /// from.
    presence: presence::Presence,
    presence_config: fred::types::config::Config,
    /// What this replica has seen of each target's seq, mark and sale version: the floors the
    /// scripts repair lost or rolled-back state up to (docs/state.md).
    seen: Arc<seen::Seen>,
    /// The keys draw seeds are derived from (`draw::DrawKeys`; `None`: this process has no
    /// token secret, and may not set an opening).
    draw_keys: Option<crate::draw::DrawKeys>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Builds the client without connecting; see `connect`.
    pub fn new(url: &str, command_timeout: Duration) -> Result<RedisStore, StoreError> {
        let parsed = RedisUrl::parse(url)
            .map_err(|e| StoreError::Protocol(format!("bad redis url: {e}")))?;
        RedisStore::from_url(&parsed, command_timeout)
    }

    /// The same, from a URL the configuration already parsed.
    pub fn from_url(
        parsed: &RedisUrl,
        command_timeout: Duration,
    ) -> Result<RedisStore, StoreError> {
        let deployment = parsed.deployment.clone();
        let mut config = parsed.config.clone();
        // Keep trying when Redis is not there at start (the gateway fails open meanwhile).
        config.fail_fast = false;
        let wire = Arc::new(pipe::Wire::default());
        let dispatch = match deployment {
            Deployment::Single => {
                Dispatch::Direct(Pipes::for_config(&config).with_wire(wire.clone()))
            }
            Deployment::Sentinel { .. } => {
                Dispatch::Primary(Pipes::new(String::new(), &config).with_wire(wire.clone()))
            }
            Deployment::Cluster => {
                Dispatch::Cluster(Box::new(ClusterPipes::new(&config, wire.clone())))
            }
        };
        // In a cluster every MOVED/ASK redirection costs fred one write attempt: allow a few,
        // so a slot migration is followed instead of failing the call.
        let attempts = match deployment {
            Deployment::Cluster => CLUSTER_ATTEMPTS,
            Deployment::Single | Deployment::Sentinel { .. } => 1,
        };
        let sentinel_config = config.clone();
        let presence_config = config.clone();
        let client = Builder::from_config(config)
            .with_performance_config(|p| p.default_command_timeout = command_timeout)
            .with_connection_config(|c| {
                c.connection_timeout = Duration::from_millis(500);
                c.internal_command_timeout = Duration::from_millis(500);
                c.max_command_attempts = attempts;
            })
            // Reconnect forever, every 100 ms, so the store comes back by itself and soon.
            .set_policy(ReconnectPolicy::new_constant(0, 100))
            .build()
            .map_err(|e| StoreError::Protocol(e.details().to_string()))?;
        let options = Options {
            timeout: Some(command_timeout),
            fail_fast: true,
            max_attempts: Some(attempts),
            ..Default::default()
        };
        let watch = SentinelWatch::new(&sentinel_config, client.clone()).map(Arc::new);
        let caller = Arc::new(Caller {
            client: client.clone(),
            dispatch,
            watch,
            followed: std::sync::atomic::AtomicU64::new(0),
            primary: Mutex::new(None),
            command_timeout,
        });
        Ok(RedisStore {
            client,
            options,
            started: std::sync::atomic::AtomicBool::new(false),
            scripts: Arc::new(Scripts::load()),
            marked_active: Mutex::new(HashMap::new()),
            max_targets: DEFAULT_MAX_TARGETS,
            defaults: SaleDefaults::default(),
            caller,
            id: batch::store_id(),
            deployment,
            wire,
            presence: presence::Presence::default(),
            presence_config,
            seen: Arc::new(seen::Seen::new(KEY_TTL_MS)),
            draw_keys: None,
        })
    }

    /// Starts the connection task and waits up to `wait` for a first connection, then loads the
    /// scripts. Returns whether Redis was reached; either way start-up is over afterwards and the
    /// client keeps reconnecting in the background. Call it from a runtime that lives as long as
    /// the server (fred's connection task runs on it). No QUIT is ever sent: during the shutdown
    /// grace period other services still need Redis (the pump releases its locks).
    pub async fn connect(&self, wait: Duration) -> bool {
        let _task = self.client.connect();
        // Scripts are also loaded on demand (NOSCRIPT); loading them up front keeps the first
        // requests after start from paying for it.
        let reached = matches!(
            tokio::time::timeout(wait, self.client.wait_for_connect()).await,
            Ok(Ok(()))
        );
        if reached {
            self.load_scripts().await;
        } else {
            tracing::warn!(
                wait_ms = wait.as_millis() as u64,
                "redis is not reachable at start; degrading per fail_open.mode and reconnecting in the background"
            );
        }
        self.started
            .store(true, std::sync::atomic::Ordering::Relaxed);
        reached
    }

    async fn load_scripts(&self) {
        for script in self.scripts.all() {
            let loaded = match self.deployment {
                // On every primary; a node that lost them later answers NOSCRIPT and the call
                // falls back to EVAL on that node (see `eval`).
                Deployment::Cluster => self
                    .client
                    .script_load_cluster::<Value, _>(script.source)
                    .await
                    .map(drop),
                Deployment::Single | Deployment::Sentinel { .. } => self
                    .command("SCRIPT", vec!["LOAD".into(), script.source.into()])
                    .await
                    .map(drop),
            };
            if let Err(e) = loaded {
                tracing::warn!(script = script.name, error = %e.details(), "loading a script failed; it loads on first use");
            }
        }
    }

    async fn command(&self, name: &'static str, args: Vec<Value>) -> Result<Value, Error> {
        self.client
            .with_options(&self.options)
            .custom(
                CustomCommand::new_static(name, ClusterHash::FirstKey, false),
                args,
            )
            .await
    }

    async fn eval(
        &self,
        script: &Script,
        keys: Vec<String>,
        argv: Vec<Value>,
    ) -> Result<Value, StoreError> {
        self.caller.eval(script, &keys, &argv).await
    }

    /// `SET key value NX PX ttl` (through `setnx.lua`, which runs under maxmemory too): true when
    /// this call set it or the key holds `value` already, false when it holds another value.
    async fn set_nx_px(&self, key: String, value: &str, ttl: Duration) -> Result<bool, StoreError> {
        let ttl_ms = millis(ttl).max(1);
        let argv = vec![value.into(), ttl_ms.to_string().into()];
        let reply = self.eval(&self.scripts.setnx, vec![key], argv).await?;
        Ok(as_u64(&reply, "setnx")? == 1)
    }

    /// One call of `claim.lua`.
    async fn claim_call(
        &self,
        target: QueueTarget,
        token_id: &str,
        owner: &str,
        op: &str,
        terms: ClaimTerms,
    ) -> Result<Value, StoreError> {
        let k = TargetKeys::new(target);
        let keys = vec![k.of(Key::Used(token_id)), k.of(Key::Spent)];
        let argv = vec![
            op.into(),
            owner.into(),
            millis(terms.ttl).max(1).to_string().into(),
            millis(terms.lease).max(1).to_string().into(),
            terms.max_attempts.to_string().into(),
            token_id.into(),
        ];
        self.eval(&self.scripts.claim, keys, argv).await
    }

    pub fn with_sale_defaults(mut self, defaults: SaleDefaults) -> RedisStore {
        self.defaults = defaults;
        self
    }

    /// The caller's defaults as script arguments (batchSize, tickMs, maxCapacity,
    /// heartbeatTimeoutS).
    fn default_args(&self) -> [Value; 4] {
        let d = &self.defaults;
        [
            d.batch_size.to_string().into(),
            d.tick_ms.to_string().into(),
            d.max_capacity.to_string().into(),
            d.heartbeat_timeout_s.to_string().into(),
        ]
    }

    /// The default heartbeat window width, for a sale that does not exist.
    fn default_window_arg(&self) -> Value {
        crate::sale::window_ms(self.defaults.heartbeat_timeout_s)
            .to_string()
            .into()
    }

    /// The keys draw seeds are derived from (the gateway's token secret).
    pub fn with_draw_keys(mut self, keys: crate::draw::DrawKeys) -> RedisStore {
        self.draw_keys = Some(keys);
        self
    }

    /// The seed of `target`'s draw: the stored one (a sale written by an older version), or the
    /// one derived from its nonce that matches its commitment.
    fn draw_seed(
        &self,
        target: QueueTarget,
        stored: String,
        nonce: &str,
        commitment: &str,
    ) -> Result<String, StoreError> {
        if !stored.is_empty() {
            return Ok(stored);
        }
        let keys = self.draw_keys.as_ref().ok_or_else(|| {
            StoreError::Unavailable("no token secret here to derive the draw's seed".into())
        })?;
        keys.committed_seed(&target.to_string(), nonce, commitment)
            .map(|seed| crate::draw::hex(&seed))
            .ok_or_else(|| {
                StoreError::Protocol(
                    "the draw's seed does not match its commitment under the token secret or the previous one (the secret changed since the opening was set: configure the old one as token.previous_secret_env)".into(),
                )
            })
    }

    /// A registered sale's version as the settings refresher read it: while it stays
    /// registered, its hash missing is a loss (`seen.rs`).
    pub fn saw_sale(&self, target: QueueTarget, version: u64) {
        self.seen.saw_sale(target, version);
    }

    /// Forgets everything this replica saw of every sale: an operator emptied Redis on purpose
    /// (a reset, a test between runs), so the next queues start from nothing instead of being
    /// repaired up to the old ones.
    pub fn forget_all_seen(&self) {
        self.seen.forget_all();
    }

    /// The sale is no longer registered: its absence is no loss any more.
    pub fn forget_sale(&self, target: QueueTarget) {
        self.seen.forget_sale(target);
    }

    /// Caps the number of targets with a live queue (`queue:active`).
    pub fn with_max_targets(mut self, max: usize) -> RedisStore {
        self.max_targets = max.max(1);
        self
    }

    /// Whether `target` may get a queue: it is in `queue:active`, or there is room and it is
    /// added in the same step (`open.lua`: exact under concurrency).
    async fn opens_queue(&self, target: QueueTarget) -> Result<bool, StoreError> {
        let argv = vec![
            target.to_string().into(),
            self.max_targets.to_string().into(),
        ];
        let reply = self
            .eval(&self.scripts.open, vec![ACTIVE_KEY.to_string()], argv)
            .await?;
        Ok(as_u64(&reply, "admit")? == 1)
    }

    /// Whether this instance saw `target` admitted to `queue:active` within `ACTIVE_REFRESH`.
    fn admitted_recently(&self, target: QueueTarget) -> bool {
        self.marked_active
            .lock()
            .get(&target)
            .is_some_and(|at| at.elapsed() < ACTIVE_REFRESH)
    }

    /// `open.lua`, remembering a success for `ACTIVE_REFRESH`. Boxed: it runs about once per
    /// target and instance every `ACTIVE_REFRESH`, and inline its script call would make every
    /// enter's and poll's future larger (a future is copied whole when it is boxed).
    fn admit_and_note(
        &self,
        target: QueueTarget,
    ) -> Pin<Box<dyn Future<Output = Result<bool, StoreError>> + Send + '_>> {
        Box::pin(self.admit_and_note_now(target))
    }

    async fn admit_and_note_now(&self, target: QueueTarget) -> Result<bool, StoreError> {
        let admitted = self.opens_queue(target).await?;
        let mut seen = self.marked_active.lock();
        if admitted {
            let now = Instant::now();
            if seen.len() > 2 * self.max_targets {
                seen.retain(|_, at| now.duration_since(*at) < ACTIVE_REFRESH);
            }
            seen.insert(target, now);
        } else {
            seen.remove(&target);
        }
        Ok(admitted)
    }

    /// Re-adds a target with waiting users to `queue:active` at most every `ACTIVE_REFRESH` per
    /// instance (the pump drops targets whose keys expired; a Redis that restarted empty lost
    /// `queue:active` with them). Through the cap like any new queue: re-adding never lets the
    /// count pass it.
    async fn keep_active(&self, target: QueueTarget) -> Result<(), StoreError> {
        if !self.admitted_recently(target) {
            self.admit_and_note(target).await?;
        }
        Ok(())
    }
}

const KEY_TTL_MS: u64 = TARGET_KEY_TTL_SECS * 1000;

#[async_trait]
impl QueueStore for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn enter(
        &self,
        target: QueueTarget,
        user: u64,
        now: Now,
    ) -> Result<EnterOutcome, StoreError> {
        // The cap: a target this instance did not see admitted lately goes through open.lua
        // first; a known one skips that round trip.
        let known = self.admitted_recently(target);
        if !known && !self.admit_and_note(target).await? {
            return Ok(EnterOutcome::TooManyTargets);
        }
        let key = BatchKey {
            store: self.id,
            kind: Kind::Enter,
            target,
        };
        let reply = batch::join(key, user, now.epoch_ms, || {
            let (caller, scripts) = (self.caller.clone(), self.scripts.clone());
            let defaults = self.default_args();
            let seen = self.seen.clone();
            Box::new(move |users, now_ms| {
                Box::pin(async move {
                    let keys = TargetKeys::new(target).enter_keys();
                    let floors = seen.floors(target, now_ms);
                    let mut argv: Vec<Value> =
                        vec![now_ms.to_string().into(), KEY_TTL_MS.to_string().into()];
                    argv.extend(defaults);
                    argv.push(floors.seq.to_string().into());
                    argv.push(floors.sale_version.to_string().into());
                    argv.extend(users.iter().map(|u| u.to_string().into()));
                    let flat =
                        reply_array(caller.eval(&scripts.enter, &keys, &argv).await?, "enter")?;
                    replies::per_user(flat, replies::enter_fields, "enter")
                })
            })
        })
        .await?;
        let (outcome, opened) = replies::enter(reply)?;
        if let EnterOutcome::Waiting { seq, .. } = outcome {
            self.seen.saw(target, seq, 0, true, now.epoch_ms);
        }
        if opened {
            // This enter opened an empty waiting room, which the pump may have retired from
            // queue:active at any moment before (an empty target is retired after two ticks,
            // and it re-checks after retiring: see `retire_target`). Make sure it is listed;
            // if the cap was filled meanwhile, the place is given back.
            if !self.admit_and_note(target).await? {
                self.leave(target, user).await?;
                return Ok(EnterOutcome::TooManyTargets);
            }
        }
        Ok(outcome)
    }

    async fn poll(
        &self,
        target: QueueTarget,
        user: u64,
        now: Now,
        mint: Mint<'_>,
    ) -> Result<PollOutcome, StoreError> {
        let key = BatchKey {
            store: self.id,
            kind: Kind::Poll,
            target,
        };
        let reply = batch::join(key, user, now.epoch_ms, || {
            let (caller, scripts) = (self.caller.clone(), self.scripts.clone());
            let window = self.default_window_arg();
            let width = self
                .seen
                .window_ms(target)
                .unwrap_or(crate::sale::window_ms(self.defaults.heartbeat_timeout_s));
            Box::new(move |users, now_ms| {
                Box::pin(async move {
                    let mut keys = TargetKeys::new(target).poll_keys();
                    keys.push(TargetKeys::new(target).window(width, now_ms));
                    let mut argv: Vec<Value> = vec![now_ms.to_string().into(), window];
                    argv.extend(users.iter().map(|u| u.to_string().into()));
                    let flat =
                        reply_array(caller.eval(&scripts.poll, &keys, &argv).await?, "poll")?;
                    replies::per_user(flat, replies::poll_fields, "poll")
                })
            })
        })
        .await?;
        let (reply, mark) = replies::poll(reply)?;
        let outcome = match reply {
            PollReply::Outcome(o) => o,
            // Admitted by the pump: sign the token now (once per user) and store it.
            PollReply::Due => {
                let Some(candidate) = mint() else {
                    let key = TargetKeys::new(target).of(Key::Waiting);
                    let seq = self
                        .command("ZSCORE", vec![key.into(), user.to_string().into()])
                        .await
                        .map_err(store_err)?;
                    return Ok(match seq.as_u64() {
                        Some(seq) => PollOutcome::Due { seq },
                        None => PollOutcome::NotInQueue,
                    });
                };
                let token_ttl = candidate
                    .expires_at
                    .saturating_sub(now.epoch_ms / 1000)
                    .max(1);
                let argv = vec![
                    user.to_string().into(),
                    now.epoch_ms.to_string().into(),
                    format!("{}|{}", candidate.expires_at, candidate.token).into(),
                    token_ttl.to_string().into(),
                    KEY_TTL_MS.to_string().into(),
                    WAIT_SAMPLES.to_string().into(),
                    self.default_window_arg(),
                ];
                let keys = TargetKeys::new(target).queue_keys(user);
                // Boxed: once per user, and inline it would make every poll's future larger.
                let issued = Box::pin(self.eval(&self.scripts.issue, keys, argv)).await?;
                replies::issue(issued)?
            }
        };
        if let PollOutcome::Waiting { seq, .. } = outcome {
            // A waiting user's place: every replica learns the highest seq handed out from the
            // polls it answers, whichever replica handed it out (the floor a lost or rolled-back
            // sequence is repaired up to, `seen.rs`); the queue's keys live while users wait.
            self.seen.saw(target, seq, mark, true, now.epoch_ms);
            // Users wait here: keep the target on the pump's list (at most every 10 s per
            // instance; it may have been retired as empty just before they entered).
            if let Err(e) = self.keep_active(target).await {
                tracing::debug!(%target, error = %e, "re-registering an active target failed");
            }
        }
        Ok(outcome)
    }

    async fn rejoin(
        &self,
        target: QueueTarget,
        user: u64,
        seq: u64,
        now: Now,
        mint: Mint<'_>,
    ) -> Result<PollOutcome, StoreError> {
        let keys = TargetKeys::new(target).rejoin_keys(user);
        let argv = vec![
            user.to_string().into(),
            seq.to_string().into(),
            now.epoch_ms.to_string().into(),
            self.default_window_arg(),
            KEY_TTL_MS.to_string().into(),
        ];
        let reply = self.eval(&self.scripts.rejoin, keys, argv).await?;
        match replies::rejoin(reply)? {
            // Put back at an admitted place: issued as any admitted user's poll is.
            PollReply::Due => self.poll(target, user, now, mint).await,
            PollReply::Outcome(outcome) => Ok(outcome),
        }
    }

    async fn record_paced(
        &self,
        target: QueueTarget,
        user: u64,
        token: &TokenCandidate,
        now: Now,
    ) -> Result<bool, StoreError> {
        let keys = TargetKeys::new(target).paced_keys(user);
        let ttl = token.expires_at.saturating_sub(now.epoch_ms / 1000).max(1);
        let argv = vec![
            user.to_string().into(),
            format!("{}|{}", token.expires_at, token.token).into(),
            ttl.to_string().into(),
        ];
        let reply = self.eval(&self.scripts.paced, keys, argv).await?;
        Ok(as_u64(&reply, "paced")? == 1)
    }

    async fn leave(&self, target: QueueTarget, user: u64) -> Result<(), StoreError> {
        let k = TargetKeys::new(target);
        let keys = vec![
            k.of(Key::Waiting),
            k.of(Key::Queued),
            k.of(Key::Token(user)),
        ];
        self.eval(&self.scripts.leave, keys, vec![user.to_string().into()])
            .await?;
        Ok(())
    }

    async fn stats(&self, target: QueueTarget, now: Now) -> Result<QueueStats, StoreError> {
        let k = TargetKeys::new(target);
        let keys = vec![
            k.of(Key::Waiting),
            k.of(Key::AdmittedCount),
            k.of(Key::Waits),
            k.of(Key::Advances),
            k.of(Key::Summary),
        ];
        let argv = vec![
            now.epoch_ms.to_string().into(),
            RATE_WINDOW_MS.to_string().into(),
            STATS_SUMMARY_MAX_AGE_MS.to_string().into(),
            KEY_TTL_MS.to_string().into(),
        ];
        replies::stats(self.eval(&self.scripts.stats, keys, argv).await?)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.command("PING", vec![]).await.map_err(store_err)?;
        Ok(())
    }

    async fn probe(&self) -> Result<(), StoreError> {
        // A write script on a key of its own: refused while loading, read-only or MISCONF;
        // allowed under maxmemory (setnx.lua is allow-oom), which is not an outage.
        self.set_nx_px(PROBE_KEY.to_string(), "1", Duration::from_millis(1000))
            .await
            .map(drop)
    }

    fn started(&self) -> bool {
        self.started.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn active_targets(&self, _now: Now) -> Result<Vec<QueueTarget>, StoreError> {
        let members = self
            .command("SMEMBERS", vec![ACTIVE_KEY.into()])
            .await
            .map_err(store_err)?;
        let mut targets = Vec::new();
        for m in reply_array(members, "active")? {
            let Some(name) = m.as_string() else { continue };
            let Some(target) = QueueTarget::parse_key(&name) else {
                // Not ours to interpret; leave it and never visit it.
                continue;
            };
            // Targets whose keys expired, or that a first enter has only just admitted, are
            // visited too: the pump retires a target only after finding it empty on two ticks,
            // so an enter racing between `open.lua` and `enter.lua` never loses its place in
            // the cap (and the cap never admits a 51st of 50).
            targets.push(target);
        }
        targets.sort();
        Ok(targets)
    }

    async fn retire_target(&self, target: QueueTarget) -> Result<(), StoreError> {
        self.command("SREM", vec![ACTIVE_KEY.into(), target.to_string().into()])
            .await
            .map_err(store_err)?;
        self.marked_active.lock().remove(&target);
        // queue:active and the target's keys are in different slots, so the emptiness check
        // and the removal cannot be one script. Look again after removing: a user who entered
        // before the SREM is seen here, and one who entered after it opened an empty room and
        // re-admitted the target from `enter` itself.
        let waiting = self
            .command(
                "ZCARD",
                vec![TargetKeys::new(target).of(Key::Waiting).into()],
            )
            .await
            .map_err(store_err)?;
        if as_u64(&waiting, "zcard")? > 0 && !self.admit_and_note(target).await? {
            tracing::warn!(%target, "a target retired as empty has users again, and the cap is full");
        }
        Ok(())
    }

    async fn try_lock(
        &self,
        target: QueueTarget,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let key = TargetKeys::new(target).of(Key::Lock);
        self.set_nx_px(key, owner, ttl).await
    }

    async fn unlock(&self, target: QueueTarget, owner: &str) -> Result<(), StoreError> {
        let key = TargetKeys::new(target).of(Key::Lock);
        self.eval(&self.scripts.unlock, vec![key], vec![owner.into()])
            .await?;
        Ok(())
    }

    async fn advance(
        &self,
        target: QueueTarget,
        part: &Part,
        _now: Now,
    ) -> Result<Advance, StoreError> {
        let keys = TargetKeys::new(target).advance_keys();
        let d = &self.defaults;
        let now_ms = crate::clock::now().epoch_ms;
        let floors = self.seen.floors(target, now_ms);
        let argv = vec![
            part.ppm.to_string().into(),
            KEY_TTL_MS.to_string().into(),
            ADVANCE_SAMPLES.to_string().into(),
            d.batch_size.to_string().into(),
            d.tick_ms.to_string().into(),
            part.script_arg().into(),
            floors.mark.to_string().into(),
            floors.seq.to_string().into(),
            floors.sale_version.to_string().into(),
            d.max_capacity.to_string().into(),
            d.heartbeat_timeout_s.to_string().into(),
        ];
        let adv = replies::advance(self.eval(&self.scripts.advance, keys, argv).await?)?;
        if adv.deleted {
            self.seen.forget(target);
        } else {
            let refreshed = adv.outcome == crate::store::AdvanceOutcome::Advanced;
            self.seen
                .saw(target, adv.seq, adv.admitted_count, refreshed, now_ms);
        }
        Ok(adv)
    }

    async fn sweep(
        &self,
        target: QueueTarget,
        credit_ms: u64,
        max: u32,
        now: Now,
    ) -> Result<u64, StoreError> {
        let keys = TargetKeys::new(target).sweep_keys();
        let argv = vec![
            max.to_string().into(),
            now.epoch_ms.to_string().into(),
            credit_ms.to_string().into(),
            self.defaults.heartbeat_timeout_s.to_string().into(),
        ];
        let reply = self.eval(&self.scripts.sweep, keys, argv).await?;
        as_u64(&reply, "evicted")
    }

    async fn sale(&self, target: QueueTarget) -> Result<Option<Sale>, StoreError> {
        let key = TargetKeys::new(target).of(Key::Sale);
        let reply = self
            .command("HGETALL", vec![key.into()])
            .await
            .map_err(store_err)?;
        let sale = replies::sale(reply)?;
        if let Some(s) = &sale {
            self.seen.saw_window(target, s.window_ms);
        }
        if let Some(s) = sale.as_ref().filter(|s| s.lost_at_ms == 0) {
            // An operator's sale (version above 0): missing later, it is a loss (`seen.rs`).
            self.seen.saw_sale(target, s.version);
        }
        Ok(sale)
    }

    async fn put_sale(
        &self,
        target: QueueTarget,
        patch: &SalePatch,
        now: Now,
    ) -> Result<Result<Sale, FieldError>, StoreError> {
        let mut argv: Vec<Value> = vec!["merge".into(), now.epoch_ms.to_string().into()];
        for (field, value) in patch.fields() {
            argv.push(field.into());
            argv.push(value.into());
        }
        let defaults = self.defaults.sale(now.epoch_ms);
        for (field, value) in defaults.to_fields() {
            if crate::sale::FIELDS.contains(&field) {
                argv.push(format!("default:{field}").into());
                argv.push(value.into());
            }
        }
        // The draw's nonce and commitment, should this change set the first opening (the script
        // keeps stored ones, and refuses an opening without them): the seed itself is never
        // stored before the draw (`draw::DrawKeys`).
        let (nonce, commitment) = match &self.draw_keys {
            Some(keys) => {
                let nonce = crate::draw::new_nonce().map_err(|_| {
                    StoreError::Unavailable("no randomness for the draw's nonce".into())
                })?;
                let nonce = crate::draw::hex(&nonce);
                let seed = keys.seed(&target.to_string(), &nonce);
                (nonce, crate::draw::commitment(&seed))
            }
            None => (String::new(), String::new()),
        };
        for (field, value) in [
            ("default:drawNonce", nonce),
            ("default:drawCommitment", commitment),
        ] {
            argv.push(field.into());
            argv.push(value.into());
        }
        let k = TargetKeys::new(target);
        let keys = vec![k.of(Key::Sale), k.of(Key::Seq)];
        let reply = self.eval(&self.scripts.sale_write, keys, argv).await?;
        replies::sale_written(reply)
    }

    async fn restore_sale(&self, target: QueueTarget, sale: &Sale) -> Result<Sale, StoreError> {
        let mut argv: Vec<Value> = vec![
            "restore".into(),
            crate::clock::now().epoch_ms.to_string().into(),
        ];
        for (field, value) in sale.to_fields() {
            argv.push(field.into());
            argv.push(value.into());
        }
        let k = TargetKeys::new(target);
        let keys = vec![k.of(Key::Sale), k.of(Key::Seq)];
        let reply = self.eval(&self.scripts.sale_write, keys, argv).await?;
        replies::sale(reply)?.ok_or_else(|| StoreError::Protocol("sale_write: no sale".into()))
    }

    async fn delete_sale(&self, target: QueueTarget) -> Result<bool, StoreError> {
        let k = TargetKeys::new(target);
        let mut keys = vec![k.of(Key::Sale)];
        keys.extend(k.queue_state_keys());
        // One slot: one DEL (the sale first in its answer does not matter, the count does).
        let existed = self
            .command("EXISTS", vec![k.of(Key::Sale).into()])
            .await
            .map_err(store_err)?;
        self.command("DEL", keys.into_iter().map(Value::from).collect())
            .await
            .map_err(store_err)?;
        // For as long as its keys would have lived: a queue state missing now is no loss, and
        // what other replicas remember of it is no floor (docs/state.md).
        self.command(
            "SET",
            vec![
                k.of(Key::Deleted).into(),
                "1".into(),
                "PX".into(),
                KEY_TTL_MS.to_string().into(),
            ],
        )
        .await
        .map_err(store_err)?;
        self.command("SREM", vec![ACTIVE_KEY.into(), target.to_string().into()])
            .await
            .map_err(store_err)?;
        self.marked_active.lock().remove(&target);
        self.seen.forget(target);
        Ok(as_u64(&existed, "exists")? > 0)
    }

    async fn draw_entrants(
        &self,
        target: QueueTarget,
        now: Now,
    ) -> Result<crate::store::DrawStep, StoreError> {
        let keys = TargetKeys::new(target).draw_keys();
        let argv = vec!["prepare".into(), now.epoch_ms.to_string().into()];
        let prepared = replies::draw_step(self.eval(&self.scripts.draw, keys, argv).await?)?;
        Ok(match prepared.step {
            crate::store::DrawStep::Entrants {
                draw_seq,
                seed,
                entrants,
            } => crate::store::DrawStep::Entrants {
                draw_seq,
                seed: self.draw_seed(target, seed, &prepared.nonce, &prepared.commitment)?,
                entrants,
            },
            other => other,
        })
    }

    async fn apply_draw(
        &self,
        target: QueueTarget,
        draw_seq: u64,
        places: &[(u64, u64)],
        now: Now,
    ) -> Result<bool, StoreError> {
        let keys = TargetKeys::new(target).draw_keys();
        // The seed the caller drew with, revealed with the order (derived again: the same sale,
        // nonce and commitment give the same one).
        let stored = self
            .command(
                "HMGET",
                vec![
                    TargetKeys::new(target).of(Key::Sale).into(),
                    "drawSeed".into(),
                    "drawNonce".into(),
                    "drawCommitment".into(),
                ],
            )
            .await
            .map_err(store_err)?;
        let fields: Vec<String> = reply_array(stored, "draw fields")?
            .iter()
            .map(|v| v.as_string().unwrap_or_default())
            .collect();
        let field = |i: usize| fields.get(i).cloned().unwrap_or_default();
        let seed = self.draw_seed(target, field(0), &field(1), &field(2))?;
        let mut argv: Vec<Value> = vec![
            "apply".into(),
            now.epoch_ms.to_string().into(),
            draw_seq.to_string().into(),
            seed.into(),
        ];
        for (user, seq) in places {
            argv.push(user.to_string().into());
            argv.push(seq.to_string().into());
        }
        let reply = self.eval(&self.scripts.draw, keys, argv).await?;
        let items = reply_array(reply, "draw")?;
        Ok(items.first().and_then(|v| v.as_string()).as_deref() == Some("APPLIED"))
    }

    async fn draw_order(&self, target: QueueTarget) -> Result<Vec<u64>, StoreError> {
        let key = TargetKeys::new(target).of(Key::Draw);
        let reply = self
            .command("LRANGE", vec![key.into(), "0".into(), "-1".into()])
            .await
            .map_err(store_err)?;
        reply_array(reply, "draw order")?
            .iter()
            .map(|v| as_u64(v, "draw order"))
            .collect()
    }

    async fn register_sale(&self, target: QueueTarget, on: bool) -> Result<(), StoreError> {
        let op = if on { "add" } else { "remove" };
        let items = [(target.to_string(), String::new())];
        let now_ms = crate::clock::now().epoch_ms;
        let (status, _) = self
            .write_doc(crate::settings::DocKind::Targets, op, now_ms, false, &items)
            .await?;
        match status.as_str() {
            "ok" => Ok(()),
            // Lost with Redis' data: the replicas write the whole list back within seconds; a
            // partial one written now would drop the other sales from it.
            "missing" => Err(StoreError::Unavailable(
                "the list of registered sales is missing from Redis (lost, or never created); the replicas write it back within seconds: try again".into(),
            )),
            other => Err(StoreError::Protocol(format!("settings_write: `{other}`"))),
        }
    }

    async fn claim(
        &self,
        target: QueueTarget,
        token_id: &str,
        owner: &str,
        terms: ClaimTerms,
        _now: Now,
    ) -> Result<ClaimTake, StoreError> {
        let reply = self
            .claim_call(target, token_id, owner, "take", terms)
            .await?;
        replies::claim_take(reply)
    }

    async fn settle(
        &self,
        target: QueueTarget,
        token_id: &str,
        owner: &str,
        settle: Settle,
        terms: ClaimTerms,
        _now: Now,
    ) -> Result<bool, StoreError> {
        let reply = self
            .claim_call(target, token_id, owner, settle.as_str(), terms)
            .await?;
        Ok(as_u64(&reply, "claim")? == 1)
    }

    async fn stored_token(
        &self,
        target: QueueTarget,
        user: u64,
        _now: Now,
    ) -> Result<Option<String>, StoreError> {
        // "expiresAt|token", expiring with the token (issue.lua).
        let key = TargetKeys::new(target).of(Key::Token(user));
        let reply = self
            .command("GET", vec![key.into()])
            .await
            .map_err(store_err)?;
        Ok(reply
            .as_string()
            .and_then(|v| v.split_once('|').map(|(_, token)| token.to_string())))
    }

    fn last_reply_ms(&self) -> u64 {
        self.wire.heard.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn mark_seen(&self, target: QueueTarget, now_ms: u64) -> u64 {
        self.seen.floors(target, now_ms).mark
    }

    fn connection_broke_ms(&self) -> u64 {
        self.wire.broke.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn update_roster(&self, r: RosterEntry<'_>) -> Result<Roster, StoreError> {
        if r.instance.contains('|') {
            return Err(StoreError::Protocol("an instance id contains '|'".into()));
        }
        let argv = vec![
            r.instance.into(),
            millis(r.live_window).max(1).to_string().into(),
            millis(r.recent_window).max(1).to_string().into(),
            if r.leave { "leave" } else { "register" }.into(),
            r.asked.to_string().into(),
            r.batch.to_string().into(),
            r.credit_ms.to_string().into(),
            r.name.into(),
            r.min_replicas.to_string().into(),
            r.presence.map_or("", |k| k.as_str()).into(),
            r.clock_seen.to_string().into(),
            r.rollbacks_known.to_string().into(),
        ];
        let keys = vec![
            ROSTER_KEY.to_string(),
            ROSTER_CREDIT_KEY.to_string(),
            ROSTER_PRESENCE_KEY.to_string(),
            ROSTER_RETIRED_KEY.to_string(),
            ROSTER_CLOCK_KEY.to_string(),
        ];
        let reply = self.eval(&self.scripts.roster, keys, argv).await?;
        replies::roster(reply)
    }

    async fn roster_members(&self) -> Result<Vec<RosterMember>, StoreError> {
        // Three reads of one slot: a member registering in between shows its last registration
        // or the one before, either of which is true.
        let members = self
            .command(
                "ZRANGE",
                vec![
                    ROSTER_KEY.into(),
                    "0".into(),
                    "-1".into(),
                    "WITHSCORES".into(),
                ],
            )
            .await
            .map_err(store_err)?;
        let credit = self
            .command("HGETALL", vec![ROSTER_CREDIT_KEY.into()])
            .await
            .map_err(store_err)?;
        let presence = self
            .command("HGETALL", vec![ROSTER_PRESENCE_KEY.into()])
            .await
            .map_err(store_err)?;
        Ok(replies::roster_members(
            &settings::string_pairs(replies::flattened(members), "roster")?,
            &settings::string_pairs(credit, "roster credit")?,
            &settings::string_pairs(presence, "roster presence")?,
        ))
    }

    async fn record_tick(
        &self,
        target: QueueTarget,
        figures: TickFigures,
        keep: u32,
    ) -> Result<(), StoreError> {
        let key = TargetKeys::new(target).of(Key::Ticks);
        let argv = vec![
            figures.encode().into(),
            keep.max(1).to_string().into(),
            TICKS_KEPT_MS.to_string().into(),
        ];
        self.eval(&self.scripts.ticks, vec![key], argv).await?;
        Ok(())
    }

    async fn ticks(
        &self,
        target: QueueTarget,
        since_ms: u64,
    ) -> Result<Vec<TickFigures>, StoreError> {
        let key = TargetKeys::new(target).of(Key::Ticks);
        // Newest first, in growing chunks until one reaches `since_ms`: a console that polls
        // with the last time it saw reads one small chunk.
        let mut newest_first: Vec<TickFigures> = Vec::new();
        let (mut start, mut chunk) = (0u64, 64u64);
        loop {
            let reply = self
                .command(
                    "LRANGE",
                    vec![
                        key.clone().into(),
                        start.to_string().into(),
                        (start + chunk - 1).to_string().into(),
                    ],
                )
                .await
                .map_err(store_err)?;
            let items = reply_array(reply, "ticks")?;
            let full = items.len() as u64 == chunk;
            let mut reached = false;
            for item in &items {
                let figures = item
                    .as_str()
                    .and_then(|s| TickFigures::decode(&s))
                    .ok_or_else(|| replies::protocol("ticks", item))?;
                if figures.at_ms <= since_ms {
                    reached = true;
                    break;
                }
                // Entries pushed between two reads shift the list: skip what was seen.
                if newest_first.last().is_none_or(|l| figures.at_ms < l.at_ms) {
                    newest_first.push(figures);
                }
            }
            if reached || !full {
                break;
            }
            start += chunk;
            chunk = (chunk * 2).min(4096);
        }
        newest_first.reverse();
        Ok(newest_first)
    }

    async fn presence(&self, instance: &str, window: Duration) -> Option<PresenceKind> {
        if let Some(known) = self.presence.known() {
            return known;
        }
        let keepalive = match self
            .command("CONFIG", vec!["GET".into(), "tcp-keepalive".into()])
            .await
        {
            Ok(reply) => settings::string_pairs(reply, "config")
                .ok()
                .and_then(|pairs| presence::keepalive_from(&pairs)),
            // Not reached: decided at a later registration.
            Err(e)
                if matches!(
                    e.kind(),
                    fred::error::ErrorKind::Timeout
                        | fred::error::ErrorKind::IO
                        | fred::error::ErrorKind::Canceled
                        | fred::error::ErrorKind::Backpressure
                ) =>
            {
                return None
            }
            // Refused (a managed Redis without CONFIG): nothing is known.
            Err(_) => None,
        };
        let config = self.presence_config.clone();
        let build = move || {
            Builder::from_config(config)
                .with_connection_config(|c| {
                    c.connection_timeout = Duration::from_millis(500);
                    c.internal_command_timeout = Duration::from_millis(500);
                })
                .set_policy(ReconnectPolicy::new_constant(0, 100))
                .build_subscriber_client()
                .ok()
        };
        let cluster = matches!(self.deployment, Deployment::Cluster);
        self.presence
            .ensure(build, instance, cluster, keepalive, window)
            .await
    }

    fn presence_seen(&self, seen: bool) {
        self.presence.seen(seen);
    }

    async fn reconnect(&self) {
        match &self.caller.dispatch {
            Dispatch::Direct(pipes) | Dispatch::Primary(pipes) => pipes.reconnect(),
            Dispatch::Cluster(cluster) => cluster.reconnect(),
        }
        if let Err(e) = self.client.force_reconnection().await {
            tracing::debug!(error = %e.details(), "reconnect failed; fred keeps retrying");
        }
    }
}
