//! Which server is the primary, as the sentinels say, asked every `CHECK_EVERY`.
//!
//! fred asks the sentinels only when its connection breaks. A primary that dies breaks it, but
//! after a failover with the old primary alive (`SENTINEL FAILOVER`, a partition that heals)
//! the old primary keeps accepting writes until Sentinel demotes it, seconds later, and
//! everything written to it meanwhile is thrown away when it resyncs as a replica. So the
//! store asks the sentinels itself, from the request path but off it (a spawned task, at most
//! one at a time), and moves its connections (and fred's) as soon as they name another primary.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::prelude::Value;
use fred::types::config::{Config, ServerConfig};
use parking_lot::RwLock;

use super::pipe::{self, Pipes};

/// How often the sentinels are asked.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// How long one sentinel may take to answer before the next is asked.
const ASK_TIMEOUT: Duration = Duration::from_millis(150);

pub struct SentinelWatch {
    service: String,
    sentinels: Vec<Pipes>,
    client: Client,
    primary: RwLock<Option<Arc<str>>>,
    /// Bumped whenever `primary` changes (0: never heard from the sentinels), so callers can
    /// tell a change with one atomic load.
    version: AtomicU64,
    /// Milliseconds since `epoch` at the last check (checked on every script call: no lock).
    last_check_ms: AtomicU64,
    epoch: Instant,
    checking: AtomicBool,
}

impl SentinelWatch {
    /// `None` unless `config` is a Sentinel configuration.
    pub fn new(config: &Config, client: Client) -> Option<SentinelWatch> {
        let ServerConfig::Sentinel {
            service_name,
            username,
            password,
            ..
        } = &config.server
        else {
            return None;
        };
        // The sentinels' own credentials, no database.
        let mut own = config.clone();
        own.username = username.clone();
        own.password = password.clone();
        own.database = None;
        let sentinels = pipe::hosts(config)
            .into_iter()
            .map(|addr| Pipes::new(addr, &own))
            .collect();
        Some(SentinelWatch {
            service: service_name.clone(),
            sentinels,
            client,
            primary: RwLock::new(None),
            version: AtomicU64::new(0),
            last_check_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            checking: AtomicBool::new(false),
        })
    }

    /// The primary as the sentinels last named it (`host:port`), if they were reached.
    pub fn primary(&self) -> Option<Arc<str>> {
        self.primary.read().clone()
    }

    /// Changes whenever the sentinels name another primary; 0 until they answered.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Starts a check when one is due and none is running.
    pub fn check_soon(self: &Arc<Self>) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.last_check_ms.load(Ordering::Relaxed);
        let first = self.version() == 0;
        if (!first && now.saturating_sub(last) < millis(CHECK_EVERY))
            || self.checking.swap(true, Ordering::AcqRel)
        {
            return;
        }
        self.last_check_ms.store(now, Ordering::Relaxed);
        let me = self.clone();
        tokio::spawn(async move {
            me.check().await;
            me.checking.store(false, Ordering::Release);
        });
    }

    /// Asks the sentinels in turn until one names the primary.
    async fn check(&self) {
        for sentinel in &self.sentinels {
            let asked = tokio::time::timeout(
                ASK_TIMEOUT,
                sentinel.call(&[
                    b"SENTINEL",
                    b"get-master-addr-by-name",
                    self.service.as_bytes(),
                ]),
            )
            .await;
            let Ok(Ok(Value::Array(parts))) = asked else {
                continue;
            };
            let (Some(host), Some(port)) = (
                parts.first().and_then(|h| h.as_string()),
                parts.get(1).and_then(|p| p.as_string()),
            ) else {
                continue;
            };
            let named: Arc<str> = Arc::from(format!("{host}:{port}"));
            let before = self.primary.write().replace(named.clone());
            if before.as_ref() != Some(&named) {
                self.version.fetch_add(1, Ordering::AcqRel);
            }
            if before.is_some_and(|b| b != named) {
                tracing::warn!(primary = %named, "the sentinels name a new primary; moving there");
                // fred's own connection (operator commands, the health probe's ping) follows.
                let client = self.client.clone();
                tokio::spawn(async move {
                    let _ = client.force_reconnection().await;
                });
            }
            return;
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
