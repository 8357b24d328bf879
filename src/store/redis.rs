//! `RedisStore`: all queue state in Redis (SPEC §9), shared by every gateway replica.
//!
//! Scripts run with `EVALSHA`, sent as a custom command through `with_options` so the per-call
//! timeout and fail-fast options apply (fred 10 ignores options on its typed `evalsha`); a
//! `NOSCRIPT` reply (a restarted or flushed Redis) loads the script and retries once, never
//! reaching the caller. Every call is bounded by `command_timeout`; a disconnected client fails at
//! once instead of queueing.
//!
//! fred spawns its connection task on the runtime that calls `connect`, so `connect` is called
//! from a Pingora background service (`run_connection`) whose runtime lives as long as the server.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use fred::prelude::*;
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand};

use super::breaker::Breaker;
use super::scripts::{Script, Scripts, TargetKeys, ACTIVE_KEY};
use super::{
    Advance, AdvanceOutcome, EnterOutcome, Now, PollOutcome, QueueStore, StoreError,
    TokenCandidate, ADVANCE_SAMPLES, DEFAULT_MAX_TARGETS, RATE_WINDOW_MS, TARGET_KEY_TTL_SECS,
    WAIT_SAMPLES,
};
use crate::queue::{millis, QueueStats, QueueTarget};

/// How often one instance re-adds a target it serves to `queue:active` (the pump drops targets
/// whose keys expired, so a live target must be re-registered now and then).
const ACTIVE_REFRESH: Duration = Duration::from_secs(10);

/// Consecutive failures that open the breaker, and how long it stays open.
const BREAKER_THRESHOLD: u32 = 5;
const BREAKER_OPEN_FOR: Duration = Duration::from_millis(500);

/// How long start-up waits for a first connection before it declares itself ready (failing open).
const STARTUP_WAIT: Duration = Duration::from_secs(2);

pub struct RedisStore {
    client: Client,
    options: Options,
    breaker: Breaker,
    started: std::sync::atomic::AtomicBool,
    scripts: Scripts,
    registered: Mutex<HashMap<QueueTarget, Instant>>,
    max_targets: usize,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Builds the client without connecting; see `run_connection`.
    pub fn new(url: &str, command_timeout: Duration) -> Result<RedisStore, StoreError> {
        let mut config = Config::from_url(url)
            .map_err(|e| StoreError::Protocol(format!("bad redis url: {}", e.details())))?;
        // Keep trying when Redis is not there at start (the gateway fails open meanwhile).
        config.fail_fast = false;
        let client = Builder::from_config(config)
            .with_performance_config(|p| p.default_command_timeout = command_timeout)
            .with_connection_config(|c| {
                c.connection_timeout = Duration::from_millis(500);
                c.internal_command_timeout = Duration::from_millis(500);
                c.max_command_attempts = 1;
            })
            // Reconnect forever, at most every 250 ms, so the store comes back by itself.
            .set_policy(ReconnectPolicy::new_constant(0, 250))
            .build()
            .map_err(|e| StoreError::Protocol(e.details().to_string()))?;
        let options = Options {
            timeout: Some(command_timeout),
            fail_fast: true,
            max_attempts: Some(1),
            ..Default::default()
        };
        Ok(RedisStore {
            client,
            options,
            breaker: Breaker::new(BREAKER_THRESHOLD, BREAKER_OPEN_FOR),
            started: std::sync::atomic::AtomicBool::new(false),
            scripts: Scripts::load(),
            registered: Mutex::new(HashMap::new()),
            max_targets: DEFAULT_MAX_TARGETS,
        })
    }

    /// Connects, loads the scripts, and returns when `shutdown` resolves (the connection task
    /// lives on in the runtime until it is dropped). Call it from a long-lived runtime.
    pub async fn run_connection(&self, shutdown: impl std::future::Future<Output = ()>) {
        let _task = self.client.connect();
        let preload = async {
            // Scripts are also loaded on demand (NOSCRIPT); loading them up front keeps the first
            // requests after start from paying for it.
            match tokio::time::timeout(STARTUP_WAIT, self.client.wait_for_connect()).await {
                Ok(Ok(())) => self.load_scripts().await,
                _ => tracing::warn!(
                    "redis is not reachable at start; failing open and reconnecting in the background"
                ),
            }
            self.started
                .store(true, std::sync::atomic::Ordering::Relaxed);
            std::future::pending::<()>().await
        };
        tokio::select! {
            _ = shutdown => {}
            _ = preload => {}
        }
        // No QUIT here: during the shutdown grace period other services still need Redis (the
        // pump releases its locks); the connection ends with the runtime.
    }

    async fn load_scripts(&self) {
        for script in self.scripts.all() {
            let loaded = self
                .command("SCRIPT", vec!["LOAD".into(), script.source.into()])
                .await;
            if let Err(e) = loaded {
                tracing::warn!(script = script.name, error = %e.details(), "loading a script failed; it loads on first use");
            }
        }
    }

    /// The fields of the runtime flag hash (`queue:flag`).
    pub async fn read_flag(&self) -> Result<Vec<(String, String)>, StoreError> {
        let reply = self
            .command("HGETALL", vec![crate::flag::FLAG_KEY.into()])
            .await
            .map_err(unavailable)?;
        let items = match reply {
            Value::Map(map) => map
                .inner()
                .into_iter()
                .map(|(k, v)| (k.as_str().map(|s| s.to_string()), v.as_string()))
                .collect::<Vec<_>>(),
            Value::Array(items) => items
                .chunks(2)
                .map(|pair| {
                    (
                        pair.first().and_then(|k| k.as_string()),
                        pair.get(1).and_then(|v| v.as_string()),
                    )
                })
                .collect(),
            Value::Null => Vec::new(),
            other => return Err(protocol("flag hash", &other)),
        };
        Ok(items
            .into_iter()
            .filter_map(|(k, v)| Some((k?, v?)))
            .collect())
    }

    /// Writes fields of the runtime flag hash.
    pub async fn write_flag(&self, fields: &[(String, String)]) -> Result<(), StoreError> {
        let mut args: Vec<Value> = vec![crate::flag::FLAG_KEY.into()];
        for (k, v) in fields {
            args.push(k.as_str().into());
            args.push(v.as_str().into());
        }
        self.command("HSET", args).await.map_err(unavailable)?;
        Ok(())
    }

    async fn command(&self, name: &'static str, args: Vec<Value>) -> Result<Value, Error> {
        if !self.breaker.allow(Instant::now()) {
            return Err(Error::new(
                ErrorKind::Timeout,
                "circuit open: redis is not answering",
            ));
        }
        let result = self
            .client
            .with_options(&self.options)
            .custom(
                CustomCommand::new_static(name, ClusterHash::FirstKey, false),
                args,
            )
            .await;
        match &result {
            // Only silence counts: a disconnected client already fails at once (fail-fast).
            Err(e) if *e.kind() == ErrorKind::Timeout => {
                if self.breaker.failure(Instant::now()) {
                    // A hung connection may never error by itself: rebuild it.
                    let client = self.client.clone();
                    tokio::spawn(async move {
                        let _ = client.force_reconnection().await;
                    });
                }
            }
            // A reply, even an error reply, means Redis is there.
            _ => self.breaker.success(),
        }
        result
    }

    async fn eval(
        &self,
        script: &Script,
        keys: Vec<String>,
        argv: Vec<Value>,
    ) -> Result<Value, StoreError> {
        let mut args: Vec<Value> = Vec::with_capacity(2 + keys.len() + argv.len());
        args.push(script.sha.as_str().into());
        args.push(Value::Integer(keys.len() as i64));
        args.extend(keys.into_iter().map(Value::from));
        args.extend(argv);
        match self.command("EVALSHA", args.clone()).await {
            Err(e) if e.details().starts_with("NOSCRIPT") => {
                self.command("SCRIPT", vec!["LOAD".into(), script.source.into()])
                    .await
                    .map_err(unavailable)?;
                self.command("EVALSHA", args).await.map_err(unavailable)
            }
            other => other.map_err(unavailable),
        }
    }

    /// `SET key value NX PX ttl`: true when this call set it, false when the key existed.
    async fn set_nx_px(&self, key: String, value: &str, ttl: Duration) -> Result<bool, StoreError> {
        let ttl_ms = millis(ttl).max(1);
        let args = vec![
            key.into(),
            value.into(),
            "NX".into(),
            "PX".into(),
            ttl_ms.to_string().into(),
        ];
        let reply = self.command("SET", args).await.map_err(unavailable)?;
        // OK when set, nil when the key was there already.
        Ok(!reply.is_null())
    }

    /// Caps the number of targets with a live queue (`queue:active`).
    pub fn with_max_targets(mut self, max: usize) -> RedisStore {
        self.max_targets = max.max(1);
        self
    }

    /// Whether `target` may get a queue: this instance serves it already, it is active, or
    /// `queue:active` has room. Costs two round trips only for a target new to this instance.
    async fn admits_target(&self, target: QueueTarget) -> Result<bool, StoreError> {
        let known = self
            .registered
            .lock()
            .map_err(|_| StoreError::Protocol("registry lock poisoned".into()))?
            .contains_key(&target);
        if known {
            return Ok(true);
        }
        let name = target.to_string();
        let member = self
            .command("SISMEMBER", vec![ACTIVE_KEY.into(), name.into()])
            .await
            .map_err(unavailable)?;
        if as_u64(&member, "sismember")? == 1 {
            return Ok(true);
        }
        let active = self
            .command("SCARD", vec![ACTIVE_KEY.into()])
            .await
            .map_err(unavailable)?;
        Ok(as_u64(&active, "scard")? < self.max_targets as u64)
    }

    /// Adds the target to `queue:active` at most every `ACTIVE_REFRESH` per instance.
    /// `fresh` (the target's first seq) registers at once: the target's keys were just created,
    /// perhaps in a Redis that restarted empty and lost `queue:active` with them.
    async fn register(&self, target: QueueTarget, fresh: bool) -> Result<(), StoreError> {
        let due = {
            let mut seen = self
                .registered
                .lock()
                .map_err(|_| StoreError::Protocol("registry lock poisoned".into()))?;
            let now = Instant::now();
            if seen.len() > 2 * self.max_targets {
                seen.retain(|_, at| now.duration_since(*at) < ACTIVE_REFRESH);
            }
            match seen.get(&target) {
                Some(at) if !fresh && now.duration_since(*at) < ACTIVE_REFRESH => false,
                _ => {
                    seen.insert(target, now);
                    true
                }
            }
        };
        if due {
            let r = self
                .command("SADD", vec![ACTIVE_KEY.into(), target.to_string().into()])
                .await;
            if let Err(e) = r {
                if let Ok(mut seen) = self.registered.lock() {
                    seen.remove(&target);
                }
                return Err(unavailable(e));
            }
        }
        Ok(())
    }
}

fn unavailable(e: Error) -> StoreError {
    StoreError::Unavailable(e.details().to_string())
}

fn protocol(what: &str, v: &Value) -> StoreError {
    StoreError::Protocol(format!("{what}: {v:?}"))
}

fn reply_array(v: Value, what: &str) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(protocol(what, &other)),
    }
}

fn as_u64(v: &Value, what: &str) -> Result<u64, StoreError> {
    match v {
        Value::Integer(i) => u64::try_from(*i).map_err(|_| protocol(what, v)),
        _ => v
            .as_str()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| protocol(what, v)),
    }
}

fn as_f64(v: &Value, what: &str) -> Result<f64, StoreError> {
    v.as_str()
        .and_then(|s| s.parse::<f64>().ok())
        .ok_or_else(|| protocol(what, v))
}

fn tag(items: &[Value]) -> String {
    items
        .first()
        .and_then(|v| v.as_str().map(|s| s.into_owned()))
        .unwrap_or_default()
}

/// `expiresAt|token`, the stored token value.
fn stored_token(v: Option<&Value>) -> Result<(String, u64), StoreError> {
    let s = v
        .and_then(|v| v.as_string())
        .ok_or_else(|| StoreError::Protocol("token reply missing".into()))?;
    let (exp, token) = s
        .split_once('|')
        .ok_or_else(|| StoreError::Protocol("stored token without expiry".into()))?;
    let exp = exp
        .parse::<u64>()
        .map_err(|_| StoreError::Protocol("stored token expiry not a number".into()))?;
    Ok((token.to_string(), exp))
}

fn waiting_reply(items: &[Value]) -> Result<(u64, u64), StoreError> {
    match (items.get(1), items.get(2)) {
        (Some(seq), Some(rank)) => Ok((as_u64(seq, "seq")?, as_u64(rank, "rank")?)),
        _ => Err(StoreError::Protocol("short WAITING reply".into())),
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
        capacity: u64,
    ) -> Result<EnterOutcome, StoreError> {
        if !self.admits_target(target).await? {
            return Ok(EnterOutcome::TooManyTargets);
        }
        let keys = TargetKeys::new(target).queue_keys(user);
        let argv = vec![
            user.to_string().into(),
            now.epoch_ms.to_string().into(),
            capacity.to_string().into(),
            KEY_TTL_MS.to_string().into(),
        ];
        let items = reply_array(self.eval(&self.scripts.enter, keys, argv).await?, "enter")?;
        let outcome = match tag(&items).as_str() {
            "WAITING" => {
                let (seq, ahead) = waiting_reply(&items)?;
                EnterOutcome::Waiting { seq, ahead }
            }
            "ADMITTED" => {
                let (token, expires_at) = stored_token(items.get(1))?;
                EnterOutcome::Admitted { token, expires_at }
            }
            "FULL" => EnterOutcome::Full,
            _ => return Err(StoreError::Protocol("unknown enter reply".into())),
        };
        if let EnterOutcome::Waiting { seq, .. } = outcome {
            // The user is queued either way; a failed registration is retried by the next enter.
            if let Err(e) = self.register(target, seq == 1).await {
                tracing::debug!(%target, error = %e, "registering an active target failed");
            }
        }
        Ok(outcome)
    }

    async fn poll(
        &self,
        target: QueueTarget,
        user: u64,
        now: Now,
        candidate: &TokenCandidate,
    ) -> Result<PollOutcome, StoreError> {
        let keys = TargetKeys::new(target).queue_keys(user);
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
        ];
        let items = reply_array(self.eval(&self.scripts.poll, keys, argv).await?, "poll")?;
        match tag(&items).as_str() {
            "WAITING" => {
                let (seq, ahead) = waiting_reply(&items)?;
                Ok(PollOutcome::Waiting { seq, ahead })
            }
            "ADMITTED" => {
                let (token, expires_at) = stored_token(items.get(1))?;
                let waited_ms = items.get(2).and_then(|v| as_u64(v, "waited").ok());
                Ok(PollOutcome::Admitted {
                    token,
                    expires_at,
                    waited_ms,
                })
            }
            "NONE" => Ok(PollOutcome::NotInQueue),
            _ => Err(StoreError::Protocol("unknown poll reply".into())),
        }
    }

    async fn leave(&self, target: QueueTarget, user: u64) -> Result<(), StoreError> {
        let k = TargetKeys::new(target);
        let keys = vec![k.key("waiting"), k.key("heartbeat"), k.token(user)];
        self.eval(&self.scripts.leave, keys, vec![user.to_string().into()])
            .await?;
        Ok(())
    }

    async fn stats(&self, target: QueueTarget, now: Now) -> Result<QueueStats, StoreError> {
        let k = TargetKeys::new(target);
        let keys = vec![
            k.key("waiting"),
            k.key("admitted_count"),
            k.key("waits"),
            k.key("advances"),
        ];
        let argv = vec![
            now.epoch_ms.to_string().into(),
            RATE_WINDOW_MS.to_string().into(),
        ];
        let items = reply_array(self.eval(&self.scripts.stats, keys, argv).await?, "stats")?;
        let get = |i: usize| {
            items
                .get(i)
                .ok_or_else(|| StoreError::Protocol("short stats reply".into()))
        };
        Ok(QueueStats {
            waiting_count: as_u64(get(0)?, "waitingCount")?,
            admitted_count: as_u64(get(1)?, "admittedCount")?,
            admission_rate_per_sec: as_f64(get(2)?, "rate")?,
            avg_wait_seconds: as_f64(get(3)?, "avgWait")?,
            p95_wait_seconds: as_f64(get(4)?, "p95Wait")?,
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.command("PING", vec![]).await.map_err(unavailable)?;
        Ok(())
    }

    fn started(&self) -> bool {
        self.started.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn active_targets(&self, _now: Now) -> Result<Vec<QueueTarget>, StoreError> {
        let members = self
            .command("SMEMBERS", vec![ACTIVE_KEY.into()])
            .await
            .map_err(unavailable)?;
        let mut targets = Vec::new();
        for m in reply_array(members, "active")? {
            let Some(name) = m.as_string() else { continue };
            let Some(target) = QueueTarget::parse_key(&name) else {
                // Not ours to interpret; leave it and never visit it.
                continue;
            };
            let seq_key = TargetKeys::new(target).key("seq");
            let exists = self
                .command("EXISTS", vec![seq_key.into()])
                .await
                .map_err(unavailable)?;
            if as_u64(&exists, "exists")? == 0 {
                self.command("SREM", vec![ACTIVE_KEY.into(), name.into()])
                    .await
                    .map_err(unavailable)?;
            } else {
                targets.push(target);
            }
        }
        targets.sort();
        Ok(targets)
    }

    async fn try_lock(
        &self,
        target: QueueTarget,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let key = TargetKeys::new(target).key("lock");
        self.set_nx_px(key, owner, ttl).await
    }

    async fn unlock(&self, target: QueueTarget, owner: &str) -> Result<(), StoreError> {
        let key = TargetKeys::new(target).key("lock");
        self.eval(&self.scripts.unlock, vec![key], vec![owner.into()])
            .await?;
        Ok(())
    }

    async fn advance(
        &self,
        target: QueueTarget,
        batch: u32,
        min_interval: Duration,
        _now: Now,
    ) -> Result<Advance, StoreError> {
        let keys = TargetKeys::new(target).advance_keys();
        let argv = vec![
            batch.to_string().into(),
            millis(min_interval).to_string().into(),
            KEY_TTL_MS.to_string().into(),
            ADVANCE_SAMPLES.to_string().into(),
        ];
        let items = reply_array(
            self.eval(&self.scripts.advance, keys, argv).await?,
            "advance",
        )?;
        let outcome = match tag(&items).as_str() {
            "ADVANCED" => AdvanceOutcome::Advanced,
            "GUARDED" => AdvanceOutcome::Guarded,
            "IDLE" => AdvanceOutcome::Idle,
            _ => return Err(StoreError::Protocol("unknown advance reply".into())),
        };
        let num = |i: usize, what: &str| match items.get(i) {
            Some(v) => as_u64(v, what),
            None => Err(StoreError::Protocol("short advance reply".into())),
        };
        Ok(Advance {
            outcome,
            admitted_count: num(1, "mark")?,
            admitted_now: num(2, "admitted")?,
            waiting: num(3, "waiting")?,
            retry_in_ms: items.get(4).map_or(Ok(0), |v| as_u64(v, "retry"))?,
        })
    }

    async fn sweep(
        &self,
        target: QueueTarget,
        cutoff_ms: u64,
        max: u32,
        _now: Now,
    ) -> Result<u64, StoreError> {
        let k = TargetKeys::new(target);
        let keys = vec![k.key("waiting"), k.key("heartbeat")];
        let argv = vec![cutoff_ms.to_string().into(), max.to_string().into()];
        let reply = self.eval(&self.scripts.sweep, keys, argv).await?;
        as_u64(&reply, "evicted")
    }

    async fn claim(
        &self,
        target: QueueTarget,
        token_id: &str,
        ttl: Duration,
        _now: Now,
    ) -> Result<bool, StoreError> {
        let key = TargetKeys::new(target).key(&format!("used:{token_id}"));
        self.set_nx_px(key, "1", ttl).await
    }

    async fn release(&self, target: QueueTarget, token_id: &str) -> Result<(), StoreError> {
        let key = TargetKeys::new(target).key(&format!("used:{token_id}"));
        self.command("DEL", vec![key.into()])
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}
