//! The one place where the validated `Config` becomes each subsystem's own settings: the
//! subsystems (pump, pacer, store guard, sales) take plain values and never import `config`.

use super::{Config, FailOpenConfig, QueueConfig, StoreConfig};
use crate::failopen::PacerConfig;
use crate::pump::PumpConfig;
use crate::queue::millis;
use crate::sale::SaleDefaults;
use crate::store::GuardConfig;

impl Config {
    /// The admission pump's settings.
    pub fn pump(&self) -> PumpConfig {
        let queue = &self.queue;
        PumpConfig {
            tick: queue.tick,
            batch_size: queue.batch_size,
            heartbeat_timeout: queue.heartbeat_timeout,
            max_evict_per_tick: queue.max_evict_per_tick,
        }
    }

    /// The fail-open pacer's timing.
    pub fn pacer(&self) -> PacerConfig {
        pacer(&self.fail_open, &self.queue, &self.store)
    }

    /// The store guard's deadline and permits.
    pub fn guard(&self) -> GuardConfig {
        GuardConfig {
            timeout: self.store.command_timeout,
            max_in_flight: self.store.max_in_flight,
        }
    }

    /// What a sale is created with when its creator does not say (`[queue]`).
    pub fn sale_defaults(&self) -> SaleDefaults {
        sale_defaults(&self.queue)
    }
}

/// The pacer's timing from the sections it reads (also while `check` validates `fail_open`).
pub(super) fn pacer(
    fail_open: &FailOpenConfig,
    queue: &QueueConfig,
    store: &StoreConfig,
) -> PacerConfig {
    PacerConfig {
        tick_ms: millis(queue.tick),
        batch: queue.batch_size.get(),
        min_replicas: fail_open.min_replicas,
        paced_for_ms: millis(fail_open.paced_for),
        call_timeout_ms: millis(store.command_timeout),
    }
}

fn sale_defaults(queue: &QueueConfig) -> SaleDefaults {
    SaleDefaults {
        batch_size: queue.batch_size.get(),
        tick_ms: millis(queue.tick),
        max_capacity: queue.max_capacity.get(),
        heartbeat_timeout_s: queue.heartbeat_timeout.as_secs(),
    }
}
