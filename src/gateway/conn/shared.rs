//! What the request hooks, a connection's stream (`stream.rs`) and the listener's table
//! (`table.rs`) share of one connection: its times and flags, read and written with atomics.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Waker};
use std::time::Instant;

/// `idle_since` while a request is in progress.
pub(super) const BUSY: u64 = u64::MAX;
/// `idle_since` from the accept until the first request starts: the first bound applies.
pub(super) const FRESH: u64 = u64::MAX - 1;
/// `stall_since` while the gateway is not waiting on the client.
pub(super) const NOT_WAITING: u64 = u64::MAX;

/// What the request hooks and the listener's table see of a connection (times in nanoseconds on
/// the table's clock).
pub struct Shared {
    pub(super) origin: Instant,
    /// The end of the last request, or [`BUSY`] or [`FRESH`].
    pub(super) idle_since: AtomicU64,
    /// Since when the gateway has waited on the client during a request, or [`NOT_WAITING`].
    pub(super) stall_since: AtomicU64,
    /// The current request's body is complete (or it is a tunnel): a read that waits now is the
    /// connection's watch for a client that goes away, not a wait on the client.
    pub(super) body_done: AtomicBool,
    /// Bumped by every request: the stream starts its per-request accounting over.
    pub(super) requests: AtomicU32,
    /// Whether the bytes read between requests are the next request's header: not after a
    /// request whose body was not read to its end (Pingora drains the rest after the answer),
    /// until the next request starts.
    pub(super) watch_header: AtomicBool,
    pub(super) evicted: AtomicBool,
    /// The task that last waited on this connection (an eviction wakes it).
    pub(super) waker: parking_lot::Mutex<Option<Waker>>,
}

impl Shared {
    pub(super) fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(FRESH - 1)
    }

    /// Since when the connection has waited on its client (fresh, idle, or stalled in a
    /// request), if it does.
    pub fn waiting_on_client_since(&self) -> Option<u64> {
        if self.evicted.load(Ordering::Relaxed) {
            // Already on its way out: another eviction would free nothing more.
            return None;
        }
        match self.idle_since.load(Ordering::Relaxed) {
            // A fresh connection's wait (from its accept) is kept where a stalled request's is.
            BUSY | FRESH => match self.stall_since.load(Ordering::Relaxed) {
                NOT_WAITING => None,
                since => Some(since),
            },
            since => Some(since),
        }
    }

    /// Ends the connection at its next read or write, waking the task waiting on it.
    pub fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        if let Some(w) = self.waker.lock().take() {
            w.wake();
        }
    }

    pub(super) fn remember_waker(&self, cx: &Context<'_>) {
        let mut w = self.waker.lock();
        if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *w = Some(cx.waker().clone());
        }
    }
}
