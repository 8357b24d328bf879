//! Script calls on a Redis Cluster: pipelined connections per thread to every primary
//! (`pipe.rs`), each call sent to the node that serves its first key's slot.
//!
//! The slot map comes from `CLUSTER SLOTS` (asked of any known node) at the first call and
//! whenever a node redirects or fails. Redirections are followed here, within the caller's
//! deadline: `MOVED` (the slot has a new owner: remember it, refresh the map, send there),
//! `ASK` (the slot is being migrated and the keys are already on the importing node: send
//! `ASKING` + the call there, once), `TRYAGAIN` (a multi-key call during a migration, some keys
//! moved and some not: try again in a moment). Every script keeps its keys in one slot (the
//! `{TYPE:ID}` hash tag, or a single global key), so a call never needs two nodes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::Value;
use parking_lot::{Mutex, RwLock};

use super::pipe::{hosts, PipeError, Pipes, Wire};

/// Hash slots in a Redis Cluster.
const SLOTS: usize = 16384;

/// Redirections followed for one call before it fails.
const MAX_REDIRECTS: usize = 5;

/// The pause before retrying a `TRYAGAIN`.
const TRYAGAIN_PAUSE: Duration = Duration::from_millis(5);

/// How often the slot map may be asked for again (a storm of redirects asks once).
const REFRESH_EVERY: Duration = Duration::from_millis(100);

pub struct ClusterPipes {
    config: fred::types::config::Config,
    seeds: Vec<String>,
    /// The node serving each slot (`host:port`), as last learned.
    slots: RwLock<Vec<Option<Arc<str>>>>,
    nodes: RwLock<HashMap<Arc<str>, Arc<Pipes>>>,
    last_refresh: Mutex<Option<Instant>>,
    refreshing: AtomicBool,
    /// Shared by every node's connections (`Pipes::with_wire`).
    wire: Arc<Wire>,
}

/// Why a cluster call failed.
#[derive(Debug)]
pub enum ClusterError {
    /// An error reply other than a redirection (`NOSCRIPT`, `OOM`, ...).
    Redis(String),
    /// No node could be reached, the slot is not served, or redirections did not settle.
    Unavailable(String),
    /// The deadline passed.
    Timeout,
}

impl ClusterPipes {
    pub fn new(config: &fred::types::config::Config, wire: Arc<Wire>) -> ClusterPipes {
        ClusterPipes {
            wire,
            config: config.clone(),
            seeds: hosts(config),
            slots: RwLock::new(vec![None; SLOTS]),
            nodes: RwLock::new(HashMap::new()),
            last_refresh: Mutex::new(None),
            refreshing: AtomicBool::new(false),
        }
    }

    /// Every thread opens new connections to every node on its next call.
    pub fn reconnect(&self) {
        for pipes in self.nodes.read().values() {
            pipes.reconnect();
        }
    }

    fn pipes(&self, addr: &Arc<str>) -> Arc<Pipes> {
        if let Some(pipes) = self.nodes.read().get(addr) {
            return pipes.clone();
        }
        self.nodes
            .write()
            .entry(addr.clone())
            .or_insert_with(|| {
                Arc::new(Pipes::new(addr.to_string(), &self.config).with_wire(self.wire.clone()))
            })
            .clone()
    }

    /// Runs `args` (a script call whose first key is `key`) on the node serving its slot.
    pub async fn call(
        &self,
        key: &[u8],
        args: &[&[u8]],
        deadline: Instant,
    ) -> Result<Value, ClusterError> {
        let slot = usize::from(fred::util::redis_keyslot(key));
        let mut asking: Option<Arc<str>> = None;
        let mut redirects = 0;
        loop {
            let (addr, ask) = match asking.take() {
                Some(addr) => (addr, true),
                None => (self.node_for(slot, deadline).await?, false),
            };
            let pipes = self.pipes(&addr);
            let call = async {
                if ask {
                    pipes.call_asking(args).await
                } else {
                    pipes.call(args).await
                }
            };
            let reply = tokio::time::timeout_at(deadline.into(), call)
                .await
                .map_err(|_| ClusterError::Timeout)?;
            let error = match reply {
                Ok(v) => return Ok(v),
                Err(PipeError::Unavailable(e)) => {
                    // The node is down or gone: the map may be stale (a failover, a node
                    // removed). Ask again, at most every REFRESH_EVERY.
                    self.refresh_soon(deadline).await;
                    return Err(ClusterError::Unavailable(e));
                }
                Err(PipeError::Redis(e)) => e,
            };
            let mut words = error.split_whitespace();
            match words.next() {
                Some(kind @ ("MOVED" | "ASK")) => {
                    redirects += 1;
                    if redirects > MAX_REDIRECTS {
                        return Err(ClusterError::Unavailable(format!(
                            "too many redirections: {error}"
                        )));
                    }
                    let to: Arc<str> = match words.nth(1) {
                        Some(to) => Arc::from(to),
                        None => return Err(ClusterError::Unavailable(error)),
                    };
                    if kind == "MOVED" {
                        if let Some(owner) = self.slots.write().get_mut(slot) {
                            *owner = Some(to);
                        }
                        self.refresh_soon(deadline).await;
                    } else {
                        asking = Some(to);
                    }
                }
                Some("TRYAGAIN") => {
                    // ASK then TRYAGAIN, over and over, is a migration in progress: bounded by
                    // the deadline, not by the redirection count.
                    redirects = 0;
                    if Instant::now() + TRYAGAIN_PAUSE >= deadline {
                        return Err(ClusterError::Timeout);
                    }
                    tokio::time::sleep(TRYAGAIN_PAUSE).await;
                }
                Some("CLUSTERDOWN") => {
                    self.refresh_soon(deadline).await;
                    return Err(ClusterError::Unavailable(error));
                }
                _ => return Err(ClusterError::Redis(error)),
            }
        }
    }

    /// The node serving `slot` as last learned.
    fn owner(&self, slot: usize) -> Option<Arc<str>> {
        self.slots.read().get(slot).cloned().flatten()
    }

    /// The node serving `slot`, asking for the map first if it is not known.
    async fn node_for(&self, slot: usize, deadline: Instant) -> Result<Arc<str>, ClusterError> {
        loop {
            if let Some(addr) = self.owner(slot) {
                return Ok(addr);
            }
            if self.refreshing.load(Ordering::Acquire) {
                // Another task is asking for the map: wait for it.
                if Instant::now() + TRYAGAIN_PAUSE >= deadline {
                    return Err(ClusterError::Timeout);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
            self.refresh(deadline).await?;
            return self
                .owner(slot)
                .ok_or_else(|| ClusterError::Unavailable(format!("slot {slot} is not served")));
        }
    }

    /// Refreshes the map unless that was done within `REFRESH_EVERY` (errors are ignored: the
    /// call that asked fails or follows its redirection anyway).
    async fn refresh_soon(&self, deadline: Instant) {
        let recent = self
            .last_refresh
            .lock()
            .is_some_and(|at| at.elapsed() < REFRESH_EVERY);
        if !recent {
            let _ = self.refresh(deadline).await;
        }
    }

    /// Asks the known nodes (then the seeds) for `CLUSTER SLOTS` until one answers.
    async fn refresh(&self, deadline: Instant) -> Result<(), ClusterError> {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            // Another task is at it; this call uses the map as it is.
            return Ok(());
        }
        let result = self.refresh_from_any(deadline).await;
        *self.last_refresh.lock() = Some(Instant::now());
        self.refreshing.store(false, Ordering::Release);
        result
    }

    async fn refresh_from_any(&self, deadline: Instant) -> Result<(), ClusterError> {
        let mut candidates: Vec<Arc<str>> = self.nodes.read().keys().cloned().collect();
        for seed in &self.seeds {
            if !candidates.iter().any(|c| c.as_ref() == seed.as_str()) {
                candidates.push(Arc::from(seed.as_str()));
            }
        }
        let mut last = String::from("no cluster node known");
        for addr in candidates {
            let pipes = self.pipes(&addr);
            let asked =
                tokio::time::timeout_at(deadline.into(), pipes.call(&[b"CLUSTER", b"SLOTS"])).await;
            match asked {
                Ok(Ok(reply)) => match slot_map(&reply) {
                    Ok(map) => {
                        *self.slots.write() = map;
                        return Ok(());
                    }
                    Err(e) => last = e,
                },
                Ok(Err(PipeError::Redis(e) | PipeError::Unavailable(e))) => last = e,
                Err(_) => return Err(ClusterError::Timeout),
            }
        }
        Err(ClusterError::Unavailable(last))
    }
}

/// A `CLUSTER SLOTS` reply as the node serving each slot (`[[start, end, [host, port, id,
/// ...], replicas...], ...]`).
fn slot_map(reply: &Value) -> Result<Vec<Option<Arc<str>>>, String> {
    let Value::Array(ranges) = reply else {
        return Err("CLUSTER SLOTS: not an array".into());
    };
    let mut map = vec![None; SLOTS];
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err("CLUSTER SLOTS: a range is not an array".into());
        };
        let (Some(start), Some(end), Some(Value::Array(primary))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            return Err("CLUSTER SLOTS: short range".into());
        };
        let (Some(start), Some(end)) = (int(start), int(end)) else {
            return Err("CLUSTER SLOTS: bad slot numbers".into());
        };
        let (Some(host), Some(port)) = (
            primary.first().and_then(|h| h.as_string()),
            primary.get(1).and_then(int),
        ) else {
            return Err("CLUSTER SLOTS: bad node".into());
        };
        if start > end || end >= SLOTS as i64 || start < 0 {
            return Err("CLUSTER SLOTS: slot out of range".into());
        }
        let addr: Arc<str> = Arc::from(format!("{host}:{port}"));
        for slot in start..=end {
            map[slot as usize] = Some(addr.clone());
        }
    }
    Ok(map)
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Integer(i) => Some(*i),
        other => other.as_string()?.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![host.into(), Value::Integer(port), "id".into()])
    }

    #[test]
    fn the_slot_map_follows_cluster_slots() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Integer(0),
                Value::Integer(5460),
                node("10.0.0.1", 7000),
                node("10.0.0.4", 7003),
            ]),
            Value::Array(vec![
                Value::Integer(5461),
                Value::Integer(16383),
                node("10.0.0.2", 7001),
            ]),
        ]);
        let map = slot_map(&reply).unwrap();
        assert_eq!(map[0].as_deref(), Some("10.0.0.1:7000"));
        assert_eq!(map[5460].as_deref(), Some("10.0.0.1:7000"));
        assert_eq!(map[5461].as_deref(), Some("10.0.0.2:7001"));
        assert_eq!(map[16383].as_deref(), Some("10.0.0.2:7001"));

        let partial = Value::Array(vec![Value::Array(vec![
            Value::Integer(10),
            Value::Integer(20),
            node("h", 1),
        ])]);
        let map = slot_map(&partial).unwrap();
        assert!(map[9].is_none() && map[21].is_none());
        assert_eq!(map[15].as_deref(), Some("h:1"));
    }

    #[test]
    fn bad_cluster_slots_replies_are_refused() {
        for bad in [
            Value::Integer(1),
            Value::Array(vec![Value::Integer(1)]),
            Value::Array(vec![Value::Array(vec![
                Value::Integer(5),
                Value::Integer(1),
                node("h", 1),
            ])]),
            Value::Array(vec![Value::Array(vec![
                Value::Integer(0),
                Value::Integer(20000),
                node("h", 1),
            ])]),
        ] {
            assert!(slot_map(&bad).is_err(), "{bad:?}");
        }
    }
}
