//! What goes wrong during a soak, and when: each fault at a fraction of the producer's run.

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL host `i` (it is started again a second later).
    Kill(usize),
    /// Every database connection of the hosts dropped, and new ones refused, for so many
    /// seconds.
    CutDatabase(u64),
    /// Sink a's plugin file replaced by another build (each host reloads it).
    HotReload,
    /// A rolling restart that adds sink c, `start_from: beginning`.
    AddThirdSink,
    /// `outbox-host purge --delivered-before 1s`, while sink c may still be copying.
    Purge,
    /// `outbox-host replay --sink b` over two seconds of events.
    Replay,
}

/// The faults of a run with `hosts` hosts, each at a fraction of the production time.
pub fn schedule(hosts: usize) -> Vec<(f64, Fault)> {
    let host = |k: usize| k % hosts.max(1);
    vec![
        (0.10, Fault::Kill(host(0))),
        (0.20, Fault::CutDatabase(3)),
        (0.30, Fault::HotReload),
        (0.40, Fault::AddThirdSink),
        (0.50, Fault::Purge),
        (0.60, Fault::Replay),
        (0.70, Fault::Kill(host(1))),
        (0.85, Fault::Kill(host(2))),
        (0.95, Fault::Purge),
    ]
}
