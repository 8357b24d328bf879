//! A circuit breaker for the Redis store: a Redis that hangs (paused, overloaded, a half-open TCP
//! connection) answers nothing and fred's own health check never fires under steady traffic, so
//! every call would wait the full command timeout. After `threshold` consecutive failures the
//! breaker opens for `open_for`: calls fail at once (the gateway fails open) and the connection is
//! rebuilt; the first call after that period probes Redis again.
//!
//! No I/O here; the clock is passed in so the logic is testable.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    open_for: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    consecutive: u32,
    open_until: Option<Instant>,
}

impl Breaker {
    pub fn new(threshold: u32, open_for: Duration) -> Breaker {
        Breaker {
            threshold: threshold.max(1),
            open_for,
            state: Mutex::new(State::default()),
        }
    }

    /// Whether a call may go to Redis now.
    pub fn allow(&self, now: Instant) -> bool {
        match self.state.lock() {
            Ok(s) => s.open_until.is_none_or(|until| now >= until),
            Err(_) => true,
        }
    }

    pub fn success(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.consecutive = 0;
            s.open_until = None;
        }
    }

    /// Records a failure; true when this failure opened the breaker.
    pub fn failure(&self, now: Instant) -> bool {
        let Ok(mut s) = self.state.lock() else {
            return false;
        };
        s.consecutive += 1;
        if s.consecutive >= self.threshold {
            s.consecutive = 0;
            s.open_until = Some(now + self.open_for);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_and_probes_after_the_period() {
        let b = Breaker::new(3, Duration::from_millis(500));
        let t0 = Instant::now();
        assert!(b.allow(t0));
        assert!(!b.failure(t0));
        b.success();
        assert!(!b.failure(t0));
        assert!(!b.failure(t0));
        assert!(b.failure(t0), "third consecutive failure opens it");
        assert!(!b.allow(t0 + Duration::from_millis(100)));
        assert!(
            b.allow(t0 + Duration::from_millis(500)),
            "probe after the open period"
        );
        b.success();
        assert!(b.allow(t0 + Duration::from_millis(501)));
    }
}
