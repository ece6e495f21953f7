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
pub mod text;
pub mod worker;

/// A random 64-bit number from the standard library's per-process keys (no extra crate).
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish()
}

/// `n` bytes from the operating system's random source, for secrets (the admin form token,
/// the compile cache's key). Falls back to [`random_u64`] where `/dev/urandom` is missing.
pub fn random_bytes(n: usize) -> Vec<u8> {
    use std::io::Read as _;
    let mut bytes = vec![0u8; n];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_err() {
        for chunk in bytes.chunks_mut(8) {
            chunk.copy_from_slice(&random_u64().to_le_bytes()[..chunk.len()]);
        }
    }
    bytes
}
