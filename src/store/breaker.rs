//! The circuit breaker of the request path (enter, poll, leave, claim, release).
//!
//! A Redis that hangs (paused, overloaded, a half-open TCP connection) answers nothing, and fred's
//! own health check never fires under steady traffic, so every call would wait the full command
//! timeout and queue the next ones behind it. Three states:
//!
//! - **Closed**: calls go through; `threshold` consecutive *timeouts* open it (a disconnected
//!   client already fails at once and needs no breaker).
//! - **Open** for `open_for`: calls fail at once (the caller degrades per its fail-open mode).
//! - **Half-open**: exactly one call, the probe, goes through; the others still fail at once. The
//!   probe's success closes the breaker; its failure opens it again. A probe that never reports
//!   back (its request was dropped) is replaced after `probe_timeout`.
//!
//! Reconnecting is the expensive cure and is asked for only when probes keep timing out
//! (`reconnect_after` in a row): a paused Redis that resumes answers on the same connection, and a
//! reconnect per opening was what let load keep a recovered Redis failed-open for minutes (each
//! reconnect stalled the queued calls into new timeouts, which opened the breaker again).
//!
//! No I/O, no clock of its own: the caller passes `now`, so the logic is unit-tested here.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub struct BreakerConfig {
    pub threshold: u32,
    pub open_for: Duration,
    pub probe_timeout: Duration,
    pub reconnect_after: u32,
}

#[derive(Debug)]
pub struct Breaker {
    cfg: BreakerConfig,
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed { timeouts: u32 },
    Open { until: Instant, failed_probes: u32 },
    HalfOpen { since: Instant, failed_probes: u32 },
}

/// What the breaker lets a call do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Closed: an ordinary call.
    Call,
    /// Half-open: this call is the one probe.
    Probe,
    /// Open, or a probe is in flight: fail at once.
    Reject,
}

/// What a failure asks the caller to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Nothing,
    /// This failure opened a closed breaker (the start of an outage).
    Opened,
    /// Probes keep timing out: rebuild the connection (once; the breaker stays open meanwhile).
    Reconnect,
}

impl Breaker {
    pub fn new(cfg: BreakerConfig) -> Breaker {
        Breaker {
            cfg: BreakerConfig {
                threshold: cfg.threshold.max(1),
                reconnect_after: cfg.reconnect_after.max(1),
                ..cfg
            },
            state: Mutex::new(State::Closed { timeouts: 0 }),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock())
    }

    pub fn admit(&self, now: Instant) -> Admit {
        let probe_timeout = self.cfg.probe_timeout;
        self.with(|s| match *s {
            State::Closed { .. } => Admit::Call,
            State::Open {
                until,
                failed_probes,
            } if now >= until => {
                *s = State::HalfOpen {
                    since: now,
                    failed_probes,
                };
                Admit::Probe
            }
            State::Open { .. } => Admit::Reject,
            State::HalfOpen {
                since,
                failed_probes,
            } if now.saturating_duration_since(since) >= probe_timeout => {
                *s = State::HalfOpen {
                    since: now,
                    failed_probes,
                };
                Admit::Probe
            }
            State::HalfOpen { .. } => Admit::Reject,
        })
    }

    /// Redis answered (any reply, even an error reply). True when this closed an open breaker.
    pub fn success(&self) -> bool {
        self.with(|s| {
            let was_open = !matches!(s, State::Closed { .. });
            *s = State::Closed { timeouts: 0 };
            was_open
        })
    }

    /// A call failed; `timed_out` says whether Redis stayed silent (as opposed to the client
    /// failing at once because it is disconnected).
    pub fn failure(&self, now: Instant, admitted: Admit, timed_out: bool) -> Verdict {
        let cfg = self.cfg;
        self.with(|s| match (*s, admitted) {
            (State::Closed { timeouts }, Admit::Call) if timed_out => {
                if timeouts + 1 >= cfg.threshold {
                    *s = State::Open {
                        until: now + cfg.open_for,
                        failed_probes: 0,
                    };
                    Verdict::Opened
                } else {
                    *s = State::Closed {
                        timeouts: timeouts + 1,
                    };
                    Verdict::Nothing
                }
            }
            (State::HalfOpen { failed_probes, .. }, Admit::Probe) => {
                let failed = if timed_out {
                    failed_probes + 1
                } else {
                    failed_probes
                };
                let reconnect = failed >= cfg.reconnect_after;
                *s = State::Open {
                    until: now + cfg.open_for,
                    failed_probes: if reconnect { 0 } else { failed },
                };
                if reconnect {
                    Verdict::Reconnect
                } else {
                    Verdict::Nothing
                }
            }
            // A straggler admitted before the breaker opened, or a fail-fast error while closed.
            _ => Verdict::Nothing,
        })
    }

    /// Whether calls are currently refused or probing (the request path is degraded).
    pub fn is_open(&self) -> bool {
        self.with(|s| !matches!(s, State::Closed { .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(BreakerConfig {
            threshold: 3,
            open_for: Duration::from_millis(200),
            probe_timeout: Duration::from_millis(500),
            reconnect_after: 2,
        })
    }

    #[test]
    fn opens_after_consecutive_timeouts_only() {
        let b = breaker();
        let t = Instant::now();
        assert_eq!(b.admit(t), Admit::Call);
        // Fail-fast errors (disconnected) never open it.
        for _ in 0..10 {
            assert_eq!(b.failure(t, Admit::Call, false), Verdict::Nothing);
        }
        assert!(!b.is_open());
        assert_eq!(b.failure(t, Admit::Call, true), Verdict::Nothing);
        assert_eq!(b.failure(t, Admit::Call, true), Verdict::Nothing);
        b.success();
        assert_eq!(b.failure(t, Admit::Call, true), Verdict::Nothing);
        assert_eq!(b.failure(t, Admit::Call, true), Verdict::Nothing);
        assert_eq!(b.failure(t, Admit::Call, true), Verdict::Opened);
        assert!(b.is_open());
        assert_eq!(b.admit(t + Duration::from_millis(100)), Admit::Reject);
    }

    #[test]
    fn half_open_lets_exactly_one_probe_through() {
        let b = breaker();
        let t = Instant::now();
        for _ in 0..3 {
            b.failure(t, Admit::Call, true);
        }
        let later = t + Duration::from_millis(200);
        assert_eq!(b.admit(later), Admit::Probe);
        for _ in 0..100 {
            assert_eq!(b.admit(later), Admit::Reject, "one probe at a time");
        }
        assert!(b.success(), "the probe's success closes it");
        assert_eq!(b.admit(later), Admit::Call);
        assert!(!b.success(), "already closed");
    }

    #[test]
    fn failed_probes_reopen_and_ask_for_one_reconnect() {
        let b = breaker();
        let mut t = Instant::now();
        for _ in 0..3 {
            b.failure(t, Admit::Call, true);
        }
        t += Duration::from_millis(200);
        assert_eq!(b.admit(t), Admit::Probe);
        assert_eq!(b.failure(t, Admit::Probe, true), Verdict::Nothing);
        assert_eq!(b.admit(t + Duration::from_millis(100)), Admit::Reject);
        t += Duration::from_millis(200);
        assert_eq!(b.admit(t), Admit::Probe);
        assert_eq!(b.failure(t, Admit::Probe, true), Verdict::Reconnect);
        // The count starts over: the next reconnect needs two more silent probes.
        t += Duration::from_millis(200);
        assert_eq!(b.admit(t), Admit::Probe);
        assert_eq!(b.failure(t, Admit::Probe, true), Verdict::Nothing);
        // A probe that fails fast (disconnected, fred is reconnecting) never asks for another.
        t += Duration::from_millis(200);
        assert_eq!(b.admit(t), Admit::Probe);
        assert_eq!(b.failure(t, Admit::Probe, false), Verdict::Nothing);
    }

    #[test]
    fn a_lost_probe_is_replaced() {
        let b = breaker();
        let t = Instant::now();
        for _ in 0..3 {
            b.failure(t, Admit::Call, true);
        }
        let t1 = t + Duration::from_millis(200);
        assert_eq!(b.admit(t1), Admit::Probe);
        // Its request was dropped: nothing reports back.
        assert_eq!(b.admit(t1 + Duration::from_millis(499)), Admit::Reject);
        assert_eq!(b.admit(t1 + Duration::from_millis(500)), Admit::Probe);
    }

    #[test]
    fn stragglers_do_not_count() {
        let b = breaker();
        let t = Instant::now();
        for _ in 0..3 {
            b.failure(t, Admit::Call, true);
        }
        // Calls admitted before it opened fail afterwards: no effect on the open state.
        assert_eq!(b.failure(t, Admit::Call, true), Verdict::Nothing);
        assert_eq!(b.admit(t + Duration::from_millis(200)), Admit::Probe);
    }
}
