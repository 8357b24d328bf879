//! What a replica does while its store cannot be used (Redis down, hung, or shedding load): the
//! fail-open policy (`fail_open.mode`) and the two pieces of local state that keep its promises.
//!
//! - `Pacer`: in `paced` mode (the default) a replica still enforces the admission budget by
//!   itself: per target and tick it lets at most `share = ⌈batch_size / replicas⌉` users through
//!   directly, where `replicas` is the replica count the pump last read from the instance
//!   registry, counting those seen within the last two minutes (clamped to `[min_replicas,
//!   max_replicas]`; `max_replicas` while never learned, so a replica that starts during an outage
//!   errs on the small side). A replica that stopped registering without a clean shutdown may be
//!   pacing on its own, cut off from Redis: the pump lowers its batch by that replica's share. It admits nobody in a tick
//!   in which the store still answered this replica, so its budget and the pump's do not add up
//!   in the tick an outage starts. Cluster-wide, a degraded tick admits at most
//!   `replicas × share ≤ batch_size + replicas − 1` users.
//! - `LocalClaims`: single-use claims that could not be stored in Redis are kept per replica for
//!   the token's lifetime (a token is refused a second time on the same replica) and written to
//!   Redis once it answers again, so after recovery a token used during the outage stays spent.
//!   The reuse window is therefore one use per replica during the outage.
//!
//! No I/O: the caller passes the clock.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::queue::QueueTarget;

/// `fail_open.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailOpenMode {
    /// Each replica admits at most its share of the budget per tick; the rest wait.
    Paced,
    /// Everyone is let through with a stateless token (the seed's behaviour; the backend sees the
    /// whole crowd during an outage).
    Open,
    /// Nobody is let through: enter and poll answer 503 with `Retry-After` until the store is back.
    Closed,
}

impl FailOpenMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FailOpenMode::Paced => "paced",
            FailOpenMode::Open => "open",
            FailOpenMode::Closed => "closed",
        }
    }
}

/// How many targets a replica keeps a local budget for at once (clients choose target ids).
const MAX_PACED_TARGETS: usize = 4096;

#[derive(Debug)]
pub struct Pacer {
    tick_ms: u64,
    batch: u32,
    min_replicas: u32,
    max_replicas: u32,
    /// The live replica count last read from the registry; 0 while never learned.
    replicas: AtomicU32,
    budgets: Mutex<Budgets>,
}

#[derive(Debug, Default)]
struct Budgets {
    per_target: HashMap<QueueTarget, Budget>,
    /// Targets the pump last saw with a queue: they always get a budget, however many made-up
    /// targets clients send during an outage.
    known: std::collections::HashSet<QueueTarget>,
}

#[derive(Debug, Clone)]
struct Budget {
    window: u64,
    /// Users let through in this window (a user who asks again gets through again without
    /// spending more of the budget: the same user, the same tick, the same token).
    users: Vec<u64>,
}

impl Pacer {
    pub fn new(tick_ms: u64, batch: u32, min_replicas: u32, max_replicas: u32) -> Pacer {
        let min_replicas = min_replicas.max(1);
        Pacer {
            tick_ms: tick_ms.max(1),
            batch: batch.max(1),
            min_replicas,
            max_replicas: max_replicas.max(min_replicas),
            replicas: AtomicU32::new(0),
            budgets: Mutex::new(Budgets::default()),
        }
    }

    /// Records the live replica count read from the instance registry.
    pub fn set_replicas(&self, n: u32) {
        self.replicas.store(n, Ordering::Relaxed);
    }

    /// The replica count the share is computed from.
    pub fn replicas(&self) -> u32 {
        match self.replicas.load(Ordering::Relaxed) {
            0 => self.max_replicas,
            n => n.clamp(self.min_replicas, self.max_replicas),
        }
    }

    /// This replica's direct admissions per target and tick while degraded.
    pub fn share(&self) -> u32 {
        self.batch.div_ceil(self.replicas())
    }

    /// The share a replica that counted `replicas` (clamped like ours) would pace with.
    pub fn share_of(&self, replicas: u32) -> u32 {
        self.batch
            .div_ceil(replicas.clamp(self.min_replicas, self.max_replicas))
    }

    pub fn tick_ms(&self) -> u64 {
        self.tick_ms
    }

    /// Records the targets the pump found with a queue (they keep a budget whatever else fills
    /// the table).
    pub fn set_known(&self, targets: &[QueueTarget]) {
        let mut b = self.budgets.lock();
        b.known = targets.iter().copied().take(MAX_PACED_TARGETS).collect();
    }

    /// Whether `user` of `target` may be let through now. `last_ok_ms` is when the store last
    /// answered this replica (0: never).
    pub fn try_admit(&self, target: QueueTarget, user: u64, now_ms: u64, last_ok_ms: u64) -> bool {
        let window = now_ms / self.tick_ms;
        if last_ok_ms > 0 && window <= last_ok_ms / self.tick_ms {
            // The store answered in this tick: the pump may have admitted its batch in it.
            return false;
        }
        let share = self.share() as usize;
        let mut guard = self.budgets.lock();
        let budgets = &mut *guard;
        let table = &mut budgets.per_target;
        if !table.contains_key(&target) && table.len() >= MAX_PACED_TARGETS {
            table.retain(|_, b| b.window >= window);
            if table.len() >= MAX_PACED_TARGETS {
                if !budgets.known.contains(&target) {
                    return false;
                }
                // A known sale takes the place of a target nobody had a queue for.
                let stranger = table.keys().find(|t| !budgets.known.contains(t)).copied();
                match stranger {
                    Some(s) => {
                        table.remove(&s);
                    }
                    None => return false,
                }
            }
        }
        let b = table.entry(target).or_insert(Budget {
            window,
            users: Vec::new(),
        });
        // Windows only move forward: a request whose clock reading is older than the budget's
        // window (it waited on the store) spends the current window's budget, never reopens an
        // old one (which would hand out a fresh share for a tick already paid).
        if window > b.window {
            b.window = window;
            b.users.clear();
        }
        if b.users.contains(&user) {
            return true;
        }
        if b.users.len() < share {
            b.users.push(user);
            true
        } else {
            false
        }
    }

    /// Seconds until the next tick, the honest wait for a user the budget could not take now.
    pub fn retry_after_secs(&self, now_ms: u64) -> u64 {
        let left = self.tick_ms - now_ms % self.tick_ms;
        left.div_ceil(1000).max(1)
    }
}

/// How many claims a replica keeps locally at most (each is one admitted user's token).
pub const MAX_LOCAL_CLAIMS: usize = 200_000;

/// Single-use claims taken while the store could not record them.
#[derive(Debug, Default)]
pub struct LocalClaims {
    inner: Mutex<ClaimsInner>,
}

#[derive(Debug, Default)]
struct ClaimsInner {
    /// (target, token id) → until when the claim holds (epoch seconds).
    claims: HashMap<(QueueTarget, String), u64>,
    /// Claims not yet written to the store.
    pending: Vec<(QueueTarget, String, u64)>,
    /// When expired claims were last purged (a full table is scanned at most once a second).
    purged_at: u64,
}

/// The outcome of a local claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalClaim {
    Taken,
    AlreadyUsed,
    /// The local table is full of unexpired claims.
    Full,
}

impl LocalClaims {
    pub fn claim(&self, target: QueueTarget, id: &str, expires_at: u64, now_s: u64) -> LocalClaim {
        let mut c = self.inner.lock();
        let key = (target, id.to_string());
        if c.claims.get(&key).is_some_and(|exp| *exp > now_s) {
            return LocalClaim::AlreadyUsed;
        }
        if c.claims.len() >= MAX_LOCAL_CLAIMS {
            if c.purged_at < now_s {
                c.purged_at = now_s;
                c.claims.retain(|_, exp| *exp > now_s);
                c.pending.retain(|(_, _, exp)| *exp > now_s);
            }
            if c.claims.len() >= MAX_LOCAL_CLAIMS {
                return LocalClaim::Full;
            }
        }
        c.claims.insert(key, expires_at);
        c.pending.push((target, id.to_string(), expires_at));
        LocalClaim::Taken
    }

    /// Gives a local claim back (the backend did not process the request).
    pub fn release(&self, target: QueueTarget, id: &str) {
        let mut c = self.inner.lock();
        c.claims.remove(&(target, id.to_string()));
        c.pending.retain(|(t, i, _)| !(*t == target && i == id));
    }

    /// Whether `id` is claimed locally (and unexpired).
    pub fn contains(&self, target: QueueTarget, id: &str, now_s: u64) -> bool {
        let c = self.inner.lock();
        c.claims
            .get(&(target, id.to_string()))
            .is_some_and(|exp| *exp > now_s)
    }

    /// Takes the claims still to be written to the store (unexpired ones only).
    pub fn take_pending(&self, now_s: u64) -> Vec<(QueueTarget, String, u64)> {
        let mut c = self.inner.lock();
        let mut out = std::mem::take(&mut c.pending);
        out.retain(|(_, _, exp)| *exp > now_s);
        out
    }

    /// Puts back claims that could not be written yet.
    pub fn restore_pending(&self, claims: Vec<(QueueTarget, String, u64)>) {
        let mut c = self.inner.lock();
        c.pending.extend(claims);
    }

    pub fn pending_len(&self) -> usize {
        let c = self.inner.lock();
        c.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::TargetType;

    fn t(id: u64) -> QueueTarget {
        QueueTarget::new(TargetType::LimitedDrop, id)
    }

    #[test]
    fn share_follows_the_replica_count_within_bounds() {
        let p = Pacer::new(2000, 100, 1, 16);
        assert_eq!(p.replicas(), 16, "never learned: the ceiling");
        assert_eq!(p.share(), 7);
        p.set_replicas(3);
        assert_eq!(p.share(), 34);
        p.set_replicas(1000);
        assert_eq!(p.replicas(), 16);
        let floor = Pacer::new(2000, 100, 4, 16);
        floor.set_replicas(1);
        assert_eq!(floor.share(), 25);
    }

    #[test]
    fn admits_at_most_the_share_per_tick_and_target() {
        let p = Pacer::new(1000, 10, 1, 8);
        p.set_replicas(2);
        let now = 50_000;
        let admitted = (0..100u64)
            .filter(|u| p.try_admit(t(1), *u, now, 0))
            .count();
        assert_eq!(admitted, 5);
        assert!(
            p.try_admit(t(2), 1, now + 10, 0),
            "another target has its own budget"
        );
        assert!(!p.try_admit(t(1), 500, now + 999, 0));
        assert!(p.try_admit(t(1), 3, now + 999, 0), "an admitted user again");
        let next = (100..200u64)
            .filter(|u| p.try_admit(t(1), *u, now + 1000, 0))
            .count();
        assert_eq!(next, 5, "a new tick, a new budget");
    }

    #[test]
    fn a_late_clock_reading_never_reopens_an_old_tick() {
        let p = Pacer::new(1000, 4, 1, 1);
        p.set_replicas(1);
        let admitted = |from: u64, at: u64| {
            (from..from + 100)
                .filter(|u| p.try_admit(t(1), *u, at, 0))
                .count()
        };
        assert_eq!(admitted(0, 10_500), 4);
        // Requests that read the clock in the previous tick and reach the pacer only now (they
        // waited on the store) spend this tick's budget, which is gone.
        assert_eq!(admitted(100, 9_900), 0);
        assert_eq!(admitted(200, 10_900), 0);
        assert_eq!(admitted(300, 11_000), 4);
    }

    #[test]
    fn a_user_asking_again_spends_nothing() {
        let p = Pacer::new(1000, 2, 1, 1);
        p.set_replicas(1);
        for _ in 0..10 {
            assert!(p.try_admit(t(1), 7, 1_000, 0));
        }
        assert!(p.try_admit(t(1), 8, 1_000, 0));
        assert!(!p.try_admit(t(1), 9, 1_000, 0));
    }

    #[test]
    fn nobody_in_a_tick_where_the_store_answered() {
        let p = Pacer::new(1000, 10, 1, 1);
        p.set_replicas(1);
        assert!(!p.try_admit(t(1), 1, 5_500, 5_100));
        assert!(p.try_admit(t(1), 1, 6_000, 5_100));
    }

    #[test]
    fn the_target_table_is_bounded_and_known_sales_keep_a_budget() {
        let p = Pacer::new(1000, 10, 1, 1);
        p.set_known(&[t(1)]);
        for id in 100..100 + MAX_PACED_TARGETS as u64 {
            assert!(p.try_admit(t(id), 1, 1_000, 0));
        }
        assert!(!p.try_admit(t(999_999), 1, 1_500, 0), "full in this tick");
        assert!(
            p.try_admit(t(1), 1, 1_500, 0),
            "a known sale still gets its budget"
        );
        assert!(
            p.try_admit(t(999_999), 1, 2_000, 0),
            "stale entries make room"
        );
    }

    #[test]
    fn local_claims_are_single_use_and_pending_until_written() {
        let c = LocalClaims::default();
        assert_eq!(c.claim(t(1), "a", 100, 10), LocalClaim::Taken);
        assert_eq!(c.claim(t(1), "a", 100, 11), LocalClaim::AlreadyUsed);
        assert_eq!(c.claim(t(2), "a", 100, 11), LocalClaim::Taken);
        c.release(t(2), "a");
        assert!(!c.contains(t(2), "a", 12));
        assert_eq!(c.pending_len(), 1);
        let p = c.take_pending(12);
        assert_eq!(p, vec![(t(1), "a".to_string(), 100)]);
        assert_eq!(c.pending_len(), 0);
        c.restore_pending(p);
        assert_eq!(c.pending_len(), 1);
        assert!(c.take_pending(200).is_empty(), "expired claims are dropped");
        assert_eq!(
            c.claim(t(1), "a", 300, 150),
            LocalClaim::Taken,
            "an expired claim no longer counts"
        );
    }

    #[test]
    fn retry_after_is_the_rest_of_the_tick() {
        let p = Pacer::new(2000, 1, 1, 1);
        assert_eq!(p.retry_after_secs(10_000), 2);
        assert_eq!(p.retry_after_secs(11_500), 1);
    }
}
