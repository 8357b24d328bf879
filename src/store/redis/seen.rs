//! What this replica has seen of each target's state in Redis (docs/state.md): the highest
//! sequence number and admission mark, and the highest version of the sale it read. The scripts
//! take them as floors (`enter.lua`, `advance.lua`): a reading below what a replica saw is a
//! loss (a deleted key, or a Redis that came back from a failover behind), repaired upwards in
//! the same step, so no seq is handed out twice and nobody is admitted twice.
//!
//! Target keys expire 30 minutes after their last refresh, so the seq and mark are floors only
//! while this replica's own calls refreshed them within that time (an idle queue that expired is
//! not a loss). A sale an operator wrote never expires: its version stays a floor until the sale
//! is deleted or unregistered. No I/O.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::queue::QueueTarget;

/// How many targets are remembered; past it, those not refreshed for the longest are dropped.
const MAX_TARGETS: usize = 100_000;

/// The floors of one target, as passed to the scripts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Floors {
    pub seq: u64,
    pub mark: u64,
    pub sale_version: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Entry {
    floors: Floors,
    /// When a call of this replica last refreshed the target's keys (epoch ms).
    touched_ms: u64,
}

#[derive(Debug)]
pub struct Seen {
    /// The keys' lifetime less a margin for clocks and calls in flight: seq and mark older than
    /// this may have expired legitimately.
    fresh_ms: u64,
    entries: Mutex<HashMap<QueueTarget, Entry>>,
    /// Each sale's heartbeat window width as last read: polls name the window's bitmap as a
    /// declared key (`poll.lua`). Bounded like the entries.
    windows: Mutex<HashMap<QueueTarget, u64>>,
}

impl Seen {
    pub fn new(key_ttl_ms: u64) -> Seen {
        Seen {
            fresh_ms: key_ttl_ms.saturating_sub(60_000),
            entries: Mutex::new(HashMap::new()),
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// The sale's heartbeat window width as last read.
    pub fn window_ms(&self, target: QueueTarget) -> Option<u64> {
        self.windows.lock().get(&target).copied()
    }

    /// The sale's heartbeat window width was read.
    pub fn saw_window(&self, target: QueueTarget, width_ms: u64) {
        let mut windows = self.windows.lock();
        if windows.len() >= MAX_TARGETS && !windows.contains_key(&target) {
            windows.clear();
        }
        windows.insert(target, width_ms);
    }

    /// The floors of `target` at `now_ms`.
    pub fn floors(&self, target: QueueTarget, now_ms: u64) -> Floors {
        match self.entries.lock().get(&target) {
            Some(e) if now_ms.saturating_sub(e.touched_ms) < self.fresh_ms => e.floors,
            Some(e) => Floors {
                sale_version: e.floors.sale_version,
                ..Floors::default()
            },
            None => Floors::default(),
        }
    }

    /// A call read `seq` and `mark` (0: not read); `refreshed` when it also refreshed the
    /// target's keys' lifetime.
    pub fn saw(&self, target: QueueTarget, seq: u64, mark: u64, refreshed: bool, now_ms: u64) {
        let mut entries = self.entries.lock();
        if entries.len() >= MAX_TARGETS && !entries.contains_key(&target) {
            let fresh = self.fresh_ms;
            entries.retain(|_, e| {
                now_ms.saturating_sub(e.touched_ms) < fresh || e.floors.sale_version > 0
            });
            if entries.len() >= MAX_TARGETS {
                return;
            }
        }
        let e = entries.entry(target).or_default();
        if now_ms.saturating_sub(e.touched_ms) >= self.fresh_ms {
            // What was seen before the keys could expire is no floor any more.
            e.floors.seq = 0;
            e.floors.mark = 0;
        }
        e.floors.seq = e.floors.seq.max(seq);
        e.floors.mark = e.floors.mark.max(mark);
        if refreshed {
            e.touched_ms = e.touched_ms.max(now_ms);
        }
    }

    /// The sale's version as read (a registered sale: the settings refresher).
    pub fn saw_sale(&self, target: QueueTarget, version: u64) {
        let mut entries = self.entries.lock();
        if entries.len() >= MAX_TARGETS && !entries.contains_key(&target) {
            return;
        }
        let e = entries.entry(target).or_default();
        e.floors.sale_version = e.floors.sale_version.max(version);
    }

    /// The sale was deleted or unregistered by an operator: nothing of it is a floor any more.
    pub fn forget(&self, target: QueueTarget) {
        self.entries.lock().remove(&target);
    }

    /// Nothing is a floor any more (an operator emptied Redis on purpose).
    pub fn forget_all(&self) {
        self.entries.lock().clear();
    }

    /// The sale's version is no floor any more (no longer registered), its queue's floors stay.
    pub fn forget_sale(&self, target: QueueTarget) {
        if let Some(e) = self.entries.lock().get_mut(&target) {
            e.floors.sale_version = 0;
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

    #[test]
    fn floors_only_rise_and_lapse_with_the_keys() {
        let seen = Seen::new(1_800_000);
        seen.saw(t(1), 10, 4, true, 1_000);
        seen.saw(t(1), 7, 2, false, 2_000);
        assert_eq!(
            seen.floors(t(1), 2_000),
            Floors {
                seq: 10,
                mark: 4,
                sale_version: 0
            }
        );
        seen.saw_sale(t(1), 3);
        seen.saw_sale(t(1), 2);
        // Not refreshed by this replica for the keys' lifetime: they may have expired.
        let later = 1_000 + 1_800_000 - 60_000;
        assert_eq!(
            seen.floors(t(1), later),
            Floors {
                seq: 0,
                mark: 0,
                sale_version: 3
            }
        );
        seen.saw(t(1), 2, 1, true, later);
        assert_eq!(seen.floors(t(1), later).seq, 2, "a new life starts over");
        seen.forget(t(1));
        assert_eq!(seen.floors(t(1), later), Floors::default());
    }

    #[test]
    fn an_unregistered_sale_keeps_its_queue_floors() {
        let seen = Seen::new(1_800_000);
        seen.saw(t(2), 5, 5, true, 0);
        seen.saw_sale(t(2), 4);
        seen.forget_sale(t(2));
        assert_eq!(
            seen.floors(t(2), 1),
            Floors {
                seq: 5,
                mark: 5,
                sale_version: 0
            }
        );
    }
}
