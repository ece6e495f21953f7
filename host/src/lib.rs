//! outbox-host: drains a transactional outbox table (`room_outbox`) and delivers every event
//! through a sandboxed WebAssembly sink, with at-least-once delivery, leases and fencing.
//!
//! The binary is a thin CLI over this library: [`app::Host`] wires a [`store::Store`], a
//! [`sink::SinkRuntime`] and a [`worker::Worker`] together; the integration tests drive the
//! same pieces.

pub mod admin;
pub mod app;
pub mod config;
pub mod envelope;
pub mod logging;
pub mod metrics;
pub mod ops;
pub mod page;
pub mod report;
pub mod sink;
pub mod store;
pub mod worker;

/// A random 64-bit number from the standard library's per-process keys (no extra crate).
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish()
}
