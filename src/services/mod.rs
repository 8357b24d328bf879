//! The background services besides the pump (`pump.rs`): the Redis connection (start-up,
//! health probe, write-backs), the run-time settings refresher (flag and registered sales,
//! written back when Redis loses them), the leases of claims in flight, and the JWT key watcher.
//! Each is a Pingora `BackgroundService`, one file each; `server::build` wires them and their
//! order.

pub mod claim_leases;
pub mod connection;
pub mod keys;
pub mod settings;
