//! The per-replica cache of queue statistics. `stats` is public and unauthenticated, so a flood of
//! it must cost the store nothing that grows with the flood: each replica asks the store at most
//! once per `FRESH` per target (one refresh in flight; concurrent callers get the previous answer
//! meanwhile), and keeps at most `MAX_TARGETS` targets. Together with `stats.lua`'s own summary
//! this keeps a stats flood off the enter/poll path entirely.
//!
//! No I/O: the caller passes the clock and does the fetch.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::queue::{QueueStats, QueueTarget};

/// How long an answer is served without asking the store again.
pub const FRESH: Duration = Duration::from_secs(1);

/// A refresh that has not reported back by then (its request was dropped) is replaced.
const REFRESH_TIMEOUT: Duration = Duration::from_secs(2);

/// Targets kept at once (clients choose target ids).
const MAX_TARGETS: usize = 4096;

#[derive(Debug, Default)]
pub struct StatsCache {
    entries: Mutex<HashMap<QueueTarget, Entry>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Entry {
    value: Option<(Instant, QueueStats)>,
    refreshing: Option<Instant>,
}

/// What a caller should do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lookup {
    /// Answer this (fresh, or the last answer while another caller refreshes it).
    Answer(QueueStats),
    /// Ask the store, then `finish`; `stale` is the answer to fall back on if the store fails.
    Refresh { stale: Option<QueueStats> },
    /// Another caller is asking the store and there is no earlier answer.
    Busy,
}

impl StatsCache {
    pub fn lookup(&self, target: QueueTarget, now: Instant) -> Lookup {
        let mut entries = self.entries.lock();
        if !entries.contains_key(&target) && entries.len() >= MAX_TARGETS {
            entries.retain(|_, e| {
                e.refreshing.is_some()
                    || e.value
                        .is_some_and(|(at, _)| now.saturating_duration_since(at) < FRESH)
            });
            if entries.len() >= MAX_TARGETS {
                return Lookup::Busy;
            }
        }
        let entry = entries.entry(target).or_default();
        let stale = entry.value.map(|(_, s)| s);
        if let Some((at, s)) = entry.value {
            if now.saturating_duration_since(at) < FRESH {
                return Lookup::Answer(s);
            }
        }
        match entry.refreshing {
            Some(since) if now.saturating_duration_since(since) < REFRESH_TIMEOUT => match stale {
                Some(s) => Lookup::Answer(s),
                None => Lookup::Busy,
            },
            _ => {
                entry.refreshing = Some(now);
                Lookup::Refresh { stale }
            }
        }
    }

    /// Records the outcome of a refresh (`None`: the store failed; the old answer stays).
    pub fn finish(&self, target: QueueTarget, fetched: Option<QueueStats>, now: Instant) {
        let mut entries = self.entries.lock();
        let e = entries.entry(target).or_default();
        e.refreshing = None;
        if let Some(s) = fetched {
            e.value = Some((now, s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::TargetType;

    fn t(id: u64) -> QueueTarget {
        QueueTarget::new(TargetType::LimitedDrop, id)
    }

    fn stats(waiting: u64) -> QueueStats {
        QueueStats {
            waiting_count: waiting,
            ..Default::default()
        }
    }

    #[test]
    fn one_refresh_per_period_and_target() {
        let c = StatsCache::default();
        let t0 = Instant::now();
        assert_eq!(c.lookup(t(1), t0), Lookup::Refresh { stale: None });
        assert_eq!(c.lookup(t(1), t0), Lookup::Busy, "one refresh in flight");
        assert_eq!(c.lookup(t(2), t0), Lookup::Refresh { stale: None });
        c.finish(t(1), Some(stats(5)), t0);
        for ms in [0, 500, 999] {
            assert_eq!(
                c.lookup(t(1), t0 + Duration::from_millis(ms)),
                Lookup::Answer(stats(5))
            );
        }
        let t1 = t0 + FRESH;
        assert_eq!(
            c.lookup(t(1), t1),
            Lookup::Refresh {
                stale: Some(stats(5))
            }
        );
        assert_eq!(
            c.lookup(t(1), t1),
            Lookup::Answer(stats(5)),
            "the previous answer while refreshing"
        );
        c.finish(t(1), None, t1);
        assert_eq!(
            c.lookup(t(1), t1),
            Lookup::Refresh {
                stale: Some(stats(5))
            },
            "a failed refresh is retried by the next caller"
        );
    }

    #[test]
    fn a_dropped_refresh_is_replaced() {
        let c = StatsCache::default();
        let t0 = Instant::now();
        assert_eq!(c.lookup(t(1), t0), Lookup::Refresh { stale: None });
        assert_eq!(
            c.lookup(t(1), t0 + Duration::from_millis(1999)),
            Lookup::Busy
        );
        assert_eq!(
            c.lookup(t(1), t0 + REFRESH_TIMEOUT),
            Lookup::Refresh { stale: None }
        );
    }

    #[test]
    fn the_table_is_bounded() {
        let c = StatsCache::default();
        let t0 = Instant::now();
        for id in 1..=MAX_TARGETS as u64 {
            assert!(matches!(c.lookup(t(id), t0), Lookup::Refresh { .. }));
            c.finish(t(id), Some(stats(id)), t0);
        }
        assert_eq!(c.lookup(t(999_999), t0), Lookup::Busy);
        assert!(matches!(
            c.lookup(t(999_999), t0 + FRESH),
            Lookup::Refresh { .. }
        ));
    }
}
