//! Prometheus metrics (docs/operations.md#metrics), in one registry owned by the gateway and
//! rendered on the admin listener's `/metrics`.
//!
//! Naming: gateway-level families are `vq_gateway_*`, queue families `virtual_queue_*`. Every
//! label value comes from a bounded set (route classes, reasons, events, configured targets):
//! never a raw path or user input.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::queue::QueueTarget;

/// Latency buckets in seconds: local answers are sub-millisecond, proxied ones span the backend.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// Admission wait buckets in seconds.
const WAIT_BUCKETS: [f64; 12] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0,
];

#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// `vq_gateway_requests_total{route_class, status}`; status is the numeric code.
    pub requests: IntCounterVec,
    /// `vq_gateway_request_duration_seconds{route_class}`.
    pub latency: HistogramVec,
    /// `virtual_queue_tokens_total{target, event}`: issued, consumed, rejected.
    pub tokens: IntCounterVec,
    /// `virtual_queue_bypass_attempts_total{route, reason}`: gated requests refused.
    pub bypass: IntCounterVec,
    /// `virtual_queue_redis_degraded_total{op}`: store calls that failed open.
    pub degraded: IntCounterVec,
    /// `virtual_queue_wait_seconds{target}`: enter → admission, observed when the token is issued.
    pub wait: HistogramVec,
    /// `virtual_queue_entries_total{target, outcome}`: enter outcomes.
    pub entries: IntCounterVec,
    /// `virtual_queue_admitted_total{target}`: live users admitted by the pump.
    pub admitted: IntCounterVec,
    /// `virtual_queue_evicted_total{target}`: waiting users evicted for a stale heartbeat.
    pub evicted: IntCounterVec,
    /// `virtual_queue_length{target}`: users in the waiting set, exported by the instance that
    /// led the target at its last tick (others drop the series).
    pub length: IntGaugeVec,
    /// `virtual_queue_pump_leader`: targets whose pump lock this instance held at its last tick.
    pub leader: IntGauge,
    /// `vq_gateway_up`: 1 while the process serves.
    pub up: IntGauge,
    /// `virtual_queue_store_degraded`: 1 while the request path's store calls fail.
    pub store_degraded: IntGauge,
    /// `virtual_queue_store_refused_total{op, reason}`: store calls refused without an outage:
    /// `oom` (Redis at maxmemory) or `saturated` (this replica's in-flight limit).
    pub refused: IntCounterVec,
    /// `virtual_queue_failopen_answers_total{mode, outcome}`: enter/poll answered while degraded:
    /// `direct_admitted`, `waiting` (the paced budget is used up), `held` (paced mode, but this
    /// replica may not pace now: see `failopen`) or `refused` (closed mode).
    pub failopen: IntCounterVec,
    /// `virtual_queue_replicas`: live replicas in the replica roster at the last tick.
    pub replicas: IntGauge,
    /// `virtual_queue_store_calls_total{op}`: store operations attempted, by operation.
    pub store_calls: IntCounterVec,
    /// `vq_gateway_connections`: public connections being served.
    pub connections: IntGauge,
    /// `vq_gateway_connections_refused_total{reason}`: `max_connections`, `first_byte_timeout`
    /// (the first request's header did not arrive in full within `server.first_byte_timeout_ms`).
    pub refused_connections: IntCounterVec,
    /// `virtual_queue_store_data_loss_total{state}`: run-time settings documents (`flag`,
    /// `targets`) and sales (`sale`) found missing or older than this replica had read them
    /// (`settings.rs`, `services/settings.rs`); a sale's queue state the scripts found missing or
    /// behind and repaired (`queue_seq`, `queue_mark`, `queue_waiting`, `queue_heartbeats`,
    /// `queue_queued`, `sale_stand_in`, reported by the pump); and a Redis that went back in time (`rollback`,
    /// from the replica roster's clock). Redis restarted empty, failed over to a replica that
    /// missed writes, was flushed, or a key was deleted (docs/state.md).
    pub data_loss: IntCounterVec,
    /// `virtual_queue_flag_known`: 1 once this replica knows the run-time flag (read from Redis,
    /// or the file's with the memory store); 0 while it is unknown and everyone queues.
    pub flag_known: IntGauge,
    /// `virtual_queue_registered_invalid_members`: members of `queue:targets` that are not
    /// canonical `TYPE:ID` (`allowed.rs`, `Allowed::set_dynamic`).
    pub registered_invalid: IntGauge,
    pub targets: std::sync::Arc<TargetLabels>,
    /// Tells this registry's cached children (`Hot`) from another's on the same thread.
    id: u64,
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "vq_gateway_requests_total",
                "Requests by route class and status",
            ),
            &["route_class", "status"],
        )?;
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "vq_gateway_request_duration_seconds",
                "Request latency by route class, from request header to response end",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["route_class"],
        )?;
        let tokens = IntCounterVec::new(
            Opts::new(
                "virtual_queue_tokens_total",
                "Entry tokens by target and event",
            ),
            &["target", "event"],
        )?;
        let bypass = IntCounterVec::new(
            Opts::new(
                "virtual_queue_bypass_attempts_total",
                "Requests to gated routes refused, by configured route and reason",
            ),
            &["route", "reason"],
        )?;
        let degraded = IntCounterVec::new(
            Opts::new(
                "virtual_queue_redis_degraded_total",
                "Store operations that failed and were answered fail-open",
            ),
            &["op"],
        )?;
        let wait = HistogramVec::new(
            HistogramOpts::new(
                "virtual_queue_wait_seconds",
                "Time from entering the queue to receiving the entry token",
            )
            .buckets(WAIT_BUCKETS.to_vec()),
            &["target"],
        )?;
        let entries = IntCounterVec::new(
            Opts::new(
                "virtual_queue_entries_total",
                "Enter calls by target and outcome",
            ),
            &["target", "outcome"],
        )?;
        let admitted = IntCounterVec::new(
            Opts::new(
                "virtual_queue_admitted_total",
                "Live users admitted by the pump",
            ),
            &["target"],
        )?;
        let evicted = IntCounterVec::new(
            Opts::new(
                "virtual_queue_evicted_total",
                "Waiting users evicted because their heartbeat went stale",
            ),
            &["target"],
        )?;
        let length = IntGaugeVec::new(
            Opts::new(
                "virtual_queue_length",
                "Users in the waiting set of a target",
            ),
            &["target"],
        )?;
        let leader = IntGauge::new(
            "virtual_queue_pump_leader",
            "Targets whose pump lock this instance held at its last tick",
        )?;
        let up = IntGauge::new("vq_gateway_up", "1 while the gateway process serves")?;
        let store_degraded = IntGauge::new(
            "virtual_queue_store_degraded",
            "1 while this replica's request-path store calls fail (fail-open mode in force)",
        )?;
        let refused = IntCounterVec::new(
            Opts::new(
                "virtual_queue_store_refused_total",
                "Store calls refused while the store answers: oom (maxmemory) or saturated (in-flight limit)",
            ),
            &["op", "reason"],
        )?;
        let failopen = IntCounterVec::new(
            Opts::new(
                "virtual_queue_failopen_answers_total",
                "Enter and poll answers given while the store was unavailable, by fail-open mode and outcome",
            ),
            &["mode", "outcome"],
        )?;
        let replicas = IntGauge::new(
            "virtual_queue_replicas",
            "Live gateway replicas in the replica roster at this replica's last pump tick",
        )?;
        let store_calls = IntCounterVec::new(
            Opts::new(
                "virtual_queue_store_calls_total",
                "Store operations attempted by this replica, by operation",
            ),
            &["op"],
        )?;
        registry.register(Box::new(store_calls.clone()))?;
        let connections =
            IntGauge::new("vq_gateway_connections", "Public connections being served")?;
        let refused_connections = IntCounterVec::new(
            Opts::new(
                "vq_gateway_connections_refused_total",
                "Public connections closed unserved, by reason",
            ),
            &["reason"],
        )?;
        let data_loss = IntCounterVec::new(
            Opts::new(
                "virtual_queue_store_data_loss_total",
                "Run-time settings found missing or older in Redis than this replica had read them, by state",
            ),
            &["state"],
        )?;
        let registered_invalid = IntGauge::new(
            "virtual_queue_registered_invalid_members",
            "Members of queue:targets that are not canonical TYPE:ID",
        )?;
        let flag_known = IntGauge::new(
            "virtual_queue_flag_known",
            "Whether this replica knows the run-time flag (1), or not yet (0: everyone queues)",
        )?;
        registry.register(Box::new(flag_known.clone()))?;
        registry.register(Box::new(data_loss.clone()))?;
        registry.register(Box::new(registered_invalid.clone()))?;
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(refused_connections.clone()))?;
        registry.register(Box::new(store_degraded.clone()))?;
        registry.register(Box::new(refused.clone()))?;
        registry.register(Box::new(failopen.clone()))?;
        registry.register(Box::new(replicas.clone()))?;
        registry.register(Box::new(admitted.clone()))?;
        registry.register(Box::new(evicted.clone()))?;
        registry.register(Box::new(length.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(tokens.clone()))?;
        registry.register(Box::new(degraded.clone()))?;
        registry.register(Box::new(bypass.clone()))?;
        registry.register(Box::new(wait.clone()))?;
        registry.register(Box::new(entries.clone()))?;
        registry.register(Box::new(up.clone()))?;
        Ok(Metrics {
            registry,
            requests,
            latency,
            tokens,
            bypass,
            degraded,
            wait,
            entries,
            admitted,
            evicted,
            length,
            leader,
            up,
            store_degraded,
            refused,
            failopen,
            replicas,
            store_calls,
            connections,
            refused_connections,
            data_loss,
            flag_known,
            registered_invalid,
            targets: Default::default(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Counts a finished request and observes its latency.
    pub fn count_request(&self, class: &'static str, status: &'static str, seconds: f64) {
        // One cached entry holds both children of the request, so it is one lookup.
        self.hot(Family::Requests, class, status, None, seconds, |_| {
            Child::Request(
                self.requests.with_label_values(&[class, status]),
                self.latency.with_label_values(&[class]),
            )
        });
    }

    /// Counts an entry token event (`issued`, `consumed`, `rejected`) of `target`.
    pub fn count_token(&self, target: QueueTarget, event: &'static str) {
        self.hot(Family::Tokens, event, "", Some(target), 0.0, |label| {
            Child::Counter(self.tokens.with_label_values(&[label, event]))
        });
    }

    /// Counts an enter outcome of `target`.
    pub fn count_entry(&self, target: QueueTarget, outcome: &'static str) {
        self.hot(Family::Entries, outcome, "", Some(target), 0.0, |label| {
            Child::Counter(self.entries.with_label_values(&[label, outcome]))
        });
    }

    /// Counts a store call of operation `op`.
    pub fn count_store_call(&self, op: &'static str) {
        self.hot(Family::StoreCalls, op, "", None, 0.0, |_| {
            Child::Counter(self.store_calls.with_label_values(&[op]))
        });
    }

    /// Increments the counter of `family` with these labels, found in this thread's cache, and
    /// observes `seconds` in the entry's latency histogram if it has one; `child` makes the entry
    /// on a miss, given the target's label value. The request path thus neither hashes label
    /// strings into a family's locked map nor formats a target label on every request. The cache
    /// is bounded (targets are chosen by clients): past `HOT_CHILDREN` entries a thread looks
    /// children up uncached.
    fn hot(
        &self,
        family: Family,
        a: &'static str,
        b: &'static str,
        target: Option<QueueTarget>,
        seconds: f64,
        child: impl FnOnce(&str) -> Child,
    ) {
        let key = HotKey {
            metrics: self.id,
            family,
            a: StaticLabel::of(a),
            b: StaticLabel::of(b),
            target,
        };
        let count = |found: &Child| match found {
            Child::Counter(c) => c.inc(),
            Child::Request(c, h) => {
                c.inc();
                h.observe(seconds);
            }
        };
        HOT.with(|hot| {
            let mut hot = hot.borrow_mut();
            if let Some(found) = hot.get(&key) {
                return count(found);
            }
            let made = match target {
                Some(t) => child(&self.targets.label(t)),
                None => child(""),
            };
            count(&made);
            if hot.len() < HOT_CHILDREN {
                hot.insert(key, made);
            }
        })
    }

    /// Prometheus text exposition of every family.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        out
    }
}

/// The most children one thread caches (`Metrics::hot`).
const HOT_CHILDREN: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Family {
    Requests,
    Tokens,
    Entries,
    StoreCalls,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct HotKey {
    metrics: u64,
    family: Family,
    a: StaticLabel,
    b: StaticLabel,
    target: Option<QueueTarget>,
}

/// A `&'static str` label value known by its address and length, so a lookup neither hashes nor
/// compares its text. The same text at another address makes a second entry holding the same
/// child, never a wrong one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct StaticLabel(usize, usize);

impl StaticLabel {
    fn of(s: &'static str) -> StaticLabel {
        StaticLabel(s.as_ptr() as usize, s.len())
    }
}

enum Child {
    Counter(IntCounter),
    /// A request's counter (class, status) and latency histogram (class).
    Request(IntCounter, Histogram),
}

thread_local! {
    static HOT: RefCell<HashMap<HotKey, Child, ahash::RandomState>> =
        RefCell::new(HashMap::with_hasher(ahash::RandomState::new()));
}

/// How many distinct targets get a label of their own; later ones share `other`, since clients
/// choose target ids and a label set must stay bounded.
pub const MAX_TARGET_LABELS: usize = 256;

/// Hands out target label values (`LIMITED_DROP:42`), at most `MAX_TARGET_LABELS` distinct ones.
#[derive(Debug, Default)]
pub struct TargetLabels {
    seen: parking_lot::Mutex<std::collections::HashSet<crate::queue::QueueTarget>>,
}

impl TargetLabels {
    pub fn label(&self, target: crate::queue::QueueTarget) -> String {
        let mut seen = self.seen.lock();
        if seen.contains(&target) || seen.len() < MAX_TARGET_LABELS {
            seen.insert(target);
            target.to_string()
        } else {
            "other".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-thread cache counts into the registry it was asked by, with the same bounded
    /// target labels as an uncached lookup, also past its own size limit.
    #[test]
    fn cached_children_count_into_their_own_registry() {
        use crate::queue::TargetType;
        let (a, b) = (Metrics::new().unwrap(), Metrics::new().unwrap());
        let n = HOT_CHILDREN as u64 + 100;
        for id in 0..n {
            a.count_token(QueueTarget::new(TargetType::LimitedDrop, id), "issued");
        }
        a.count_token(QueueTarget::new(TargetType::LimitedDrop, 7), "issued");
        b.count_entry(QueueTarget::new(TargetType::LimitedDrop, 7), "waiting");
        for _ in 0..3 {
            a.count_request("proxy", "200", 0.002);
        }
        a.count_store_call("enter");
        let text = String::from_utf8(a.render()).unwrap();
        let series = |name: &str| -> Vec<(String, f64)> {
            text.lines()
                .filter(|l| l.starts_with(name))
                .map(|l| {
                    let (k, v) = l.rsplit_once(' ').unwrap();
                    (k.to_string(), v.parse().unwrap())
                })
                .collect()
        };
        let tokens = series("virtual_queue_tokens_total{");
        assert_eq!(tokens.len(), MAX_TARGET_LABELS + 1, "bounded labels");
        assert_eq!(tokens.iter().map(|(_, v)| v).sum::<f64>(), (n + 1) as f64);
        assert!(tokens.contains(&(
            "virtual_queue_tokens_total{event=\"issued\",target=\"LIMITED_DROP:7\"}".into(),
            2.0
        )));
        assert!(tokens.contains(&(
            "virtual_queue_tokens_total{event=\"issued\",target=\"other\"}".into(),
            (n - MAX_TARGET_LABELS as u64) as f64
        )));
        assert!(
            series("virtual_queue_entries_total{").is_empty(),
            "b's entry is b's"
        );
        assert!(text.contains("vq_gateway_requests_total{route_class=\"proxy\",status=\"200\"} 3"));
        assert!(text.contains("vq_gateway_request_duration_seconds_count{route_class=\"proxy\"} 3"));
        assert!(text.contains("virtual_queue_store_calls_total{op=\"enter\"} 1"));
        let text = String::from_utf8(b.render()).unwrap();
        assert!(text.contains(
            "virtual_queue_entries_total{outcome=\"waiting\",target=\"LIMITED_DROP:7\"} 1"
        ));
    }

    #[test]
    fn renders_registered_families() {
        let m = Metrics::new().unwrap();
        m.requests.with_label_values(&["proxy", "200"]).inc();
        m.up.set(1);
        let text = String::from_utf8(m.render()).unwrap();
        assert!(text.contains("vq_gateway_requests_total{route_class=\"proxy\",status=\"200\"} 1"));
        assert!(text.contains("vq_gateway_up 1"));
    }

    #[test]
    fn target_labels_are_bounded() {
        use crate::queue::{QueueTarget, TargetType};
        let labels = TargetLabels::default();
        for id in 1..=MAX_TARGET_LABELS as u64 {
            assert_eq!(
                labels.label(QueueTarget::new(TargetType::LimitedDrop, id)),
                format!("LIMITED_DROP:{id}")
            );
        }
        let extra = QueueTarget::new(TargetType::LimitedDrop, 99_999);
        assert_eq!(labels.label(extra), "other");
        let first = QueueTarget::new(TargetType::LimitedDrop, 1);
        assert_eq!(labels.label(first), "LIMITED_DROP:1");
    }
}
