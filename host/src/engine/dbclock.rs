//! The database's clock, as this host reads it: leases and due times are judged by one
//! clock for every host on the table, so a host whose own clock runs ahead cannot see a
//! live lease as expired (nor one running behind keep a dead one). The offset to the local
//! clock is read from the database now and then (a query every [`RESYNC`]) and applied to
//! the local clock in between; SQLite, on this machine, is its own clock.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use crate::store::Store;

/// How often the offset is read again.
const RESYNC: Duration = Duration::from_secs(10);

/// A local clock corrected to the database's.
#[derive(Default)]
pub struct DbClock {
    offset_ms: AtomicI64,
    synced_at: Mutex<Option<Instant>>,
}

impl DbClock {
    /// Now on the database's clock, UTC milliseconds (the local clock until the first sync).
    pub fn now_ms(&self) -> i64 {
        crate::clock::now_ms().saturating_add(self.offset_ms.load(Ordering::Relaxed))
    }

    /// Reads the offset again if it is older than [`RESYNC`]: the database's now (as the
    /// store reads it, the query's own round trip accounted for and a wait for a pooled
    /// connection not) against this clock when the read returns. A failure keeps the last
    /// offset (the claim that follows will fail and back off the same way).
    pub async fn sync(&self, store: &dyn Store) {
        let due = self.synced_at.lock().unwrap_or_else(|p| p.into_inner()).is_none_or(|at| at.elapsed() >= RESYNC);
        if !due {
            return;
        }
        let read = store.clock_ms().await;
        let after = crate::clock::now_ms();
        match read {
            Ok(db_ms) => {
                let offset = db_ms - after;
                let was = self.offset_ms.swap(offset, Ordering::Relaxed);
                if (offset - was).abs() > 1_000 {
                    tracing::warn!(
                        offset_ms = offset,
                        "this host's clock and the database's differ by more than a second: leases and due times follow the database's"
                    );
                }
                *self.synced_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            }
            Err(e) => tracing::debug!(error = %e, "could not read the database's clock; keeping the last offset"),
        }
    }
}
