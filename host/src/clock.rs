//! Time and randomness: the wall clock leases and retries are measured in, and random
//! numbers for worker ids and secrets.

/// The current wall-clock time in UTC milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

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

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
