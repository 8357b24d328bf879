//! The one clock: `now()` for wall-clock epoch time, and the `Clock` trait the admission pump
//! runs on, real (`SystemClock`) or virtual (`VirtualClock`, for simulations that drive the real
//! pump through thousands of ticks without sleeping).
//!
//! The store's operations take the caller's `Now` (the memory store decides by it; the Redis
//! scripts time the tick guard with Redis' own clock), so a virtual clock drives them too.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Everything a request needs from the clock, read once per request.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub epoch_ms: u64,
}

/// Wall-clock time, read once per request.
pub fn now() -> Now {
    let epoch_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(crate::queue::millis)
        .unwrap_or(0);
    Now { epoch_ms }
}

/// What the pump needs of time: the current instant and a way to wait.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Now;
    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Now {
        now()
    }

    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(tokio::time::sleep(d))
    }
}

/// A clock that moves only when told to; `sleep` moves it forward and returns at once.
#[derive(Debug, Default)]
pub struct VirtualClock {
    epoch_ms: AtomicU64,
}

impl VirtualClock {
    pub fn new(epoch_ms: u64) -> VirtualClock {
        VirtualClock {
            epoch_ms: AtomicU64::new(epoch_ms),
        }
    }

    pub fn set(&self, epoch_ms: u64) {
        self.epoch_ms.store(epoch_ms, Ordering::SeqCst);
    }

    pub fn advance(&self, d: Duration) {
        self.epoch_ms
            .fetch_add(crate::queue::millis(d), Ordering::SeqCst);
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Now {
        Now {
            epoch_ms: self.epoch_ms.load(Ordering::SeqCst),
        }
    }

    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        self.advance(d);
        Box::pin(std::future::ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_time_moves_only_when_told() {
        let c = VirtualClock::new(1_000);
        assert_eq!(c.now().epoch_ms, 1_000);
        c.advance(Duration::from_millis(250));
        assert_eq!(c.now().epoch_ms, 1_250);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(c.sleep(Duration::from_secs(2)));
        assert_eq!(c.now().epoch_ms, 3_250);
        c.set(5);
        assert_eq!(c.now().epoch_ms, 5);
    }

    #[test]
    fn the_system_clock_is_wall_time() {
        let a = now().epoch_ms;
        let b = SystemClock.now().epoch_ms;
        assert!(b >= a && b - a < 1_000);
    }
}
