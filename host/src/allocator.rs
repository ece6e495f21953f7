//! The process's allocator: mimalloc, tuned to keep its footprint near the C library's
//! (decision 0193). Every binary that links this library allocates through it.

/// mimalloc rather than glibc's malloc: in the relay's drain glibc's `malloc` and `free`
/// took about a fifth of the host's CPU, and the drain ran 14% faster with mimalloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc 3's `mimalloc.h` (the crate names no constant).
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Hands freed pages back to the system after 10 ms rather than mimalloc's 1 s. With it, and
/// arena memory committed as it is used (`.cargo/config.toml`: mimalloc reserves its first
/// arena before `main`, so that default is compiled in), a SQLite drain's peak RSS stays
/// near 40 MiB; by default mimalloc took 77 MiB, over the 48 MiB target, where glibc took
/// 38. Call first thing in `main`.
#[allow(unsafe_code)] // a call into mimalloc's C API, which has no safe wrapper for it
pub fn tune() {
    // SAFETY: `mi_option_set` stores an integer option that mimalloc reads on its next use;
    // the option exists in the mimalloc this crate builds (version 3, the default).
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 10) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option's number is copied from `mimalloc.h`: after an upgrade that renumbers the
    /// options, `tune` would set another one. mimalloc 3's purge delay defaults to 1,000 ms,
    /// and its neighbours to 1 and 0.
    #[test]
    #[allow(unsafe_code)] // reading mimalloc's options through its C API
    fn tune_sets_the_purge_delay_and_nothing_else() {
        // SAFETY: `mi_option_get` reads an integer option.
        let get = |option| unsafe { libmimalloc_sys::mi_option_get(option) };
        assert_eq!(get(PURGE_DELAY), 1_000, "option {PURGE_DELAY} is not mimalloc's purge delay");
        let neighbours = (get(PURGE_DELAY - 1), get(PURGE_DELAY + 1));
        tune();
        assert_eq!(get(PURGE_DELAY), 10);
        assert_eq!((get(PURGE_DELAY - 1), get(PURGE_DELAY + 1)), neighbours);
    }
}
