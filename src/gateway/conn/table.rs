//! The open connections of the public listener, as the eviction scan sees them: when the
//! listener is full, a new connection takes the place of the one that has waited longest on its
//! own client (silent since it connected, idle between requests, or stalled sending a body or
//! reading an answer). Connections busy with the backend are never evicted: a flood of clients
//! that hold connections open cannot keep the listener from clients that use it.
//!
//! The scan looks at a random sample of slots, not all of them, so its cost does not grow with
//! `max_connections`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::Mutex;

use super::shared::Shared;

/// Slots looked at per eviction.
const SAMPLE: usize = 32;

/// A connection is evicted only after waiting on its client at least this long: not one whose
/// first request is on its way. (Longer would protect nothing: attackers that reconnect at once
/// keep the whole table young, and new connections would be refused instead.)
const EVICT_AFTER_NS: u64 = 20_000_000;

pub struct Table {
    slots: Vec<Mutex<Weak<Shared>>>,
    free: Mutex<Vec<u32>>,
    rng: AtomicU64,
    origin: Instant,
}

impl Table {
    pub fn new(capacity: usize) -> Table {
        let capacity = capacity.clamp(1, u32::MAX as usize);
        Table {
            slots: (0..capacity).map(|_| Mutex::new(Weak::new())).collect(),
            free: Mutex::new((0..capacity as u32).rev().collect()),
            rng: AtomicU64::new(0x9e37_79b9_7f4a_7c15),
            origin: Instant::now(),
        }
    }

    /// Nanoseconds on the table's clock.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// Enters a connection; its slot, or `None` when every slot is taken.
    pub fn insert(&self, shared: &Arc<Shared>) -> Option<u32> {
        let index = self.free.lock().pop()?;
        if let Some(slot) = self.slots.get(index as usize) {
            *slot.lock() = Arc::downgrade(shared);
        }
        Some(index)
    }

    pub fn remove(&self, index: u32) {
        if let Some(slot) = self.slots.get(index as usize) {
            *slot.lock() = Weak::new();
            self.free.lock().push(index);
        }
    }

    /// Evicts the sampled connection that has waited longest on its client, if one has waited
    /// long enough. Whether one was evicted.
    pub fn evict_one(&self) -> bool {
        let now = self.now_ns();
        let mut best: Option<(u64, Arc<Shared>)> = None;
        let len = self.slots.len() as u64;
        for _ in 0..SAMPLE.min(self.slots.len()) {
            let i = (self.next_random() % len) as usize;
            let Some(shared) = self.slots.get(i).and_then(|s| s.lock().upgrade()) else {
                continue;
            };
            let Some(since) = shared.waiting_on_client_since() else {
                continue;
            };
            let waited = now.saturating_sub(since);
            if waited >= EVICT_AFTER_NS && best.as_ref().is_none_or(|(w, _)| waited > *w) {
                best = Some((waited, shared));
            }
        }
        match best {
            Some((_, victim)) => {
                victim.evict();
                true
            }
            None => false,
        }
    }

    fn next_random(&self) -> u64 {
        // xorshift64*, racy on purpose: a sample only needs to spread.
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.store(x, Ordering::Relaxed);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}
