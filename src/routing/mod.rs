//! Routing, pure: the one canonical form of a request path (`path`) and the table of gated
//! purchase routes matched against it (`gated`). Shared by the HTTP layer (`gateway`), which
//! routes every request with them, and by `config`, which compiles and checks the configured
//! routes and upgrade prefixes with the same code. No I/O.

pub mod gated;
pub mod path;

/// First path segment owned by the gateway (compared without case: nothing under it, however
/// spelled, may reach the backend).
pub const API_PREFIX: &str = "virtual-queues";
