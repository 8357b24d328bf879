//! Where a waiting user stands: the fixed sequence number, the users ahead and the ETA.
//!
//! Admission is decided by the fixed `seq` against the target's `admitted_count`, never by rank
//! (docs/api.md#queue-semantics): users leaving ahead of you shorten your ETA but never admit you
//! before the next tick.

use std::time::Duration;

/// A waiting user's place, computed from the store's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePosition {
    /// The user's fixed, 1-based sequence number.
    pub seq: u64,
    /// Live users ahead of this one (the rank in the waiting set).
    pub ahead: u64,
    /// The target's admission high-water mark.
    pub admitted_count: u64,
}

impl QueuePosition {
    pub fn is_admitted(&self) -> bool {
        self.seq <= self.admitted_count
    }
}

/// Estimated wait for a user with `ahead` live users in front: one batch of `batch_size` is admitted
/// per `tick`, and the user's own batch is the one after the `ahead / batch_size` full batches in
/// front. Never negative; saturates instead of overflowing.
pub fn eta_seconds(ahead: u64, batch_size: u32, tick: Duration) -> u64 {
    let batch = u64::from(batch_size.max(1));
    let ticks = (ahead / batch).saturating_add(1);
    let ms = super::millis(tick);
    ticks.saturating_mul(ms).div_ceil(1000)
}

/// The live users admitted per tick an ETA counts on: the measured rate (live users admitted per
/// second over the recent admissions) when there is one and it is clearly below the budget (a
/// pump that skipped ticks, a budget shared with replicas cut off), else the budget itself. A
/// measured rate within 10 % of the budget is the budget (the ticks' own jitter), so the ETA of a
/// user does not rise when the first measurements replace the budget.
pub fn per_tick(batch_size: u32, tick: Duration, measured_per_sec: f64) -> f64 {
    let budget = f64::from(batch_size.max(1));
    let measured = measured_per_sec * super::millis(tick) as f64 / 1000.0;
    if measured > 0.0 && measured < 0.9 * budget {
        measured.max(1e-3)
    } else {
        budget
    }
}

/// Estimated wait for a user with `ahead` live users in front, at `per_tick` live users a tick:
/// the user's own tick is the one after the `ahead / per_tick` full ticks in front.
pub fn eta_at_rate(ahead: u64, per_tick: f64, tick: Duration) -> u64 {
    let ticks = (ahead as f64 / per_tick.max(1e-3)).floor() + 1.0;
    let ms = ticks * super::millis(tick) as f64;
    if ms >= u64::MAX as f64 {
        u64::MAX
    } else {
        (ms as u64).div_ceil(1000)
    }
}

/// When a waiting user should poll next (the `pollAfterSeconds` hint): half the ETA, so each poll
/// halves the rest of the wait and the user learns of an admission about a tick late at most;
/// never sooner than one tick (no admission can happen sooner) and never later than a third of
/// the heartbeat timeout (the poll is the heartbeat: a user who follows the hint is never
/// evicted).
pub fn poll_after_seconds(eta_seconds: u64, tick: Duration, heartbeat_timeout: Duration) -> u64 {
    let floor = super::millis(tick).div_ceil(1000).max(1);
    let ceiling = (heartbeat_timeout.as_secs() / 3).max(floor);
    (eta_seconds / 2).clamp(floor, ceiling)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admitted_iff_seq_within_mark() {
        let p = |seq, admitted_count| QueuePosition {
            seq,
            ahead: 0,
            admitted_count,
        };
        assert!(p(5, 5).is_admitted());
        assert!(p(1, 100).is_admitted());
        assert!(!p(6, 5).is_admitted());
        assert!(!p(1, 0).is_admitted());
    }

    #[test]
    fn eta_counts_whole_batches_ahead_plus_own() {
        let tick = Duration::from_millis(2000);
        assert_eq!(eta_seconds(0, 100, tick), 2);
        assert_eq!(eta_seconds(99, 100, tick), 2);
        assert_eq!(eta_seconds(100, 100, tick), 4);
        assert_eq!(eta_seconds(250, 100, tick), 6);
        assert_eq!(eta_seconds(0, 100, Duration::from_millis(300)), 1);
        assert_eq!(
            eta_seconds(u64::MAX, 1, Duration::from_secs(3600)),
            u64::MAX / 1000 + 1
        );
    }

    #[test]
    fn the_measured_rate_counts_only_when_clearly_below_the_budget() {
        let tick = Duration::from_millis(2000);
        assert_eq!(per_tick(100, tick, 0.0), 100.0, "no history: the budget");
        assert_eq!(per_tick(100, tick, 47.0), 100.0, "94 %: tick jitter");
        assert_eq!(per_tick(100, tick, 25.0), 50.0);
        assert_eq!(eta_at_rate(99, 100.0, tick), 2);
        assert_eq!(eta_at_rate(100, 100.0, tick), 4);
        assert_eq!(eta_at_rate(100, 50.0, tick), 6);
        for ahead in [0, 1, 99, 100, 250, 9_999] {
            assert_eq!(
                eta_at_rate(ahead, per_tick(100, tick, 0.0), tick),
                eta_seconds(ahead, 100, tick),
                "the budget's ETA is the plain one"
            );
        }
    }

    #[test]
    fn poll_hint_halves_the_eta_within_a_tick_and_a_third_of_the_heartbeat_timeout() {
        let (tick, hb) = (Duration::from_secs(2), Duration::from_secs(60));
        assert_eq!(poll_after_seconds(2, tick, hb), 2);
        assert_eq!(poll_after_seconds(9, tick, hb), 4);
        assert_eq!(poll_after_seconds(36, tick, hb), 18);
        assert_eq!(poll_after_seconds(3600, tick, hb), 20);
        let fast = Duration::from_millis(300);
        assert_eq!(poll_after_seconds(0, fast, hb), 1);
        // A heartbeat timeout shorter than three ticks: the tick wins.
        assert_eq!(poll_after_seconds(100, tick, Duration::from_secs(3)), 2);
    }
}
