//! Liveness of waiting users by heartbeat window, shared by both stores.
//!
//! A poll does not record its time: it marks the user's seq in the bitmap of the current window
//! (`queue:{T}:alive:{width}:{window}`, a window being a quarter of the sale's
//! `heartbeatTimeoutS`, its width stored with the sale as `windowMs`), which
//! costs a bit per user and window instead of a second sorted set (about 96 bytes per user).
//! A sweep with cutoff `C` keeps every user marked in a window that ends after `C` and evicts
//! the others, lowest seq first: nobody who polled after `C` is evicted, and a user silent
//! since `C` is evicted at most one window late.
//!
//! A sweep reads at most `MAX_SWEEP_WINDOWS` windows. When the cutoff lies further back (the
//! pump gives users credit for a store outage they could not heartbeat through), it evicts
//! nobody, so eviction pauses for that long rather than evicting on windows it no longer reads.
//!
//! The width is the sale's, read by the scripts from the sale's hash, never the caller's: two
//! replicas with different `queue.heartbeat_timeout_s` in their files mark and read the same
//! windows. When an operator changes the timeout, and with it the width, the windows of the old
//! width are no longer read; sweeps evict nobody until a whole timeout has passed since the
//! change (`windowSince`), so nobody who polled before it is evicted for being in an old window.
//! The Redis scripts compute all this themselves; this type is the memory store's copy of it.

use std::ops::RangeInclusive;
use std::time::Duration;

use crate::queue::millis;

/// Windows per heartbeat timeout: eviction is at most this fraction of the timeout late.
pub const WINDOWS_PER_TIMEOUT: u64 = 4;

/// The most windows one sweep reads (the normal span is `WINDOWS_PER_TIMEOUT + 2`).
pub const MAX_SWEEP_WINDOWS: u64 = 12;

/// The heartbeat window of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    window_ms: u64,
}

impl Default for Liveness {
    /// For the default `queue.heartbeat_timeout_s` (60 s): 15-second windows.
    fn default() -> Liveness {
        Liveness::for_timeout(Duration::from_secs(60))
    }
}

impl Liveness {
    pub fn for_timeout(timeout: Duration) -> Liveness {
        Liveness {
            window_ms: (millis(timeout) / WINDOWS_PER_TIMEOUT).max(1),
        }
    }

    /// Windows of `window_ms` (the sale's `windowMs`).
    pub fn of_width(window_ms: u64) -> Liveness {
        Liveness {
            window_ms: window_ms.max(1),
        }
    }

    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// The window a heartbeat at `now_ms` marks.
    pub fn window(&self, now_ms: u64) -> u64 {
        now_ms / self.window_ms
    }

    /// The windows a sweep at `now_ms` with `cutoff_ms` reads: from the window holding the cutoff
    /// (its users may have polled after it) to the next one (a replica whose clock runs a little
    /// ahead). `None` when that is more than `MAX_SWEEP_WINDOWS`: the sweep evicts nobody.
    pub fn sweep_windows(&self, cutoff_ms: u64, now_ms: u64) -> Option<RangeInclusive<u64>> {
        let first = self.window(cutoff_ms);
        let last = self.window(now_ms.max(cutoff_ms)) + 1;
        (last - first < MAX_SWEEP_WINDOWS).then_some(first..=last)
    }

    /// The last `MAX_SWEEP_WINDOWS` windows up to the next one: what a sweep that evicts nobody
    /// still reads, to give the bitmaps polls created their lifetime.
    pub fn recent_windows(&self, now_ms: u64) -> RangeInclusive<u64> {
        let last = self.window(now_ms) + 1;
        last.saturating_sub(MAX_SWEEP_WINDOWS - 1)..=last
    }

    /// How long a window's bitmap is kept: past the last sweep that may read it.
    pub fn key_ttl_ms(&self) -> u64 {
        (MAX_SWEEP_WINDOWS + 2) * self.window_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_reads_the_windows_from_the_cutoff_to_the_next_one() {
        let l = Liveness::for_timeout(Duration::from_secs(60));
        assert_eq!(l.window_ms(), 15_000);
        let now = 1_000 * 15_000 + 7_000;
        assert_eq!(l.window(now), 1_000);
        assert_eq!(l.sweep_windows(now - 60_000, now), Some(996..=1_001));
        // A cutoff inside a window keeps that window's users: polled after the cutoff, perhaps.
        assert_eq!(l.sweep_windows(now - 68_000, now), Some(995..=1_001));
        // Credit for an outage: up to MAX_SWEEP_WINDOWS windows are read, beyond that none.
        assert_eq!(l.sweep_windows(now - 10 * 15_000, now), Some(990..=1_001));
        assert_eq!(l.sweep_windows(now - 11 * 15_000, now), None);
        assert!(l.key_ttl_ms() > MAX_SWEEP_WINDOWS * l.window_ms());
        assert_eq!(l.recent_windows(now), 990..=1_001);
    }

    #[test]
    fn short_timeouts_get_short_windows() {
        assert_eq!(
            Liveness::for_timeout(Duration::from_secs(2)).window_ms(),
            500
        );
        assert_eq!(Liveness::for_timeout(Duration::ZERO).window_ms(), 1);
    }
}
