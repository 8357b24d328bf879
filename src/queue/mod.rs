//! The queue domain: targets, positions, statuses, the JSON the API answers with, and the
//! per-replica stats cache.
//!
//! Everything here is pure (no I/O, no clock reads): stores and handlers pass the numbers in.

mod position;
pub mod stats_cache;
mod status;
mod target;

pub use position::{eta_at_rate, eta_seconds, per_tick, poll_after_seconds, QueuePosition};
pub use status::{iso8601_utc, EntryStatus, QueueEntryResponse, QueueStats, QueueStatsResponse};
pub use target::{parse_positive_id, positive_id, QueueTarget, TargetType};

/// A duration in whole milliseconds, saturating at `u64::MAX` instead of failing.
pub fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
