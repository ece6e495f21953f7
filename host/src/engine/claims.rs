//! The claim path (`ordering: none`): a worker claims rows under leases of its own
//! (`status = 'delivering'`, `lock_until_ms`), hands back the ones it will not start, and
//! writes each outcome under its row's lease. It holds no partitions; it says it is among
//! the sink's hosts in `<table>_claimers`, so that a `per_room` host does not start beside
//! it (decision 0200). The owner path (`per_room`) is `owner.rs`; `mod.rs` runs either.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Signal, Worker};
use crate::store::{Claimed, Held, Mark, StoreError};

impl Worker {
    /// Claims up to `wanted` rows until `lock_until_ms`; the read's clock (none: 0) and
    /// whether the table had no more.
    pub(super) async fn claim_rows(
        &self,
        wanted: usize,
        now_ms: i64,
        lock_until_ms: i64,
    ) -> Result<(u64, Vec<Claimed>, bool), StoreError> {
        let rows = self.store.claim(&self.worker_id, now_ms, lock_until_ms, wanted as u32).await?;
        let at_end = rows.len() < wanted;
        Ok((0, rows, at_end))
    }

    /// Hands claimed rows that were not started back to the table, for any worker to claim.
    pub(super) async fn hand_back(&self, rows: &[Claimed]) {
        let rows: Vec<Held> = rows.iter().map(Held::from).collect();
        let rows = rows.as_slice();
        let released = tokio::time::timeout(self.config.shutdown_grace, self.store.release(rows, self.clock.now_ms()))
            .await
            .unwrap_or_else(|_| Err(StoreError::Unavailable("timed out handing back rows".into())));
        match released {
            Ok(n) => {
                self.metrics.handed_back(n);
                tracing::info!(worker = "room_outbox", node_id = %self.node_id, released = n, "handed back claimed rows that were not started");
                self.signal(Signal::Released(n as usize));
            }
            // Not fatal: the leases expire and any worker claims the rows again.
            Err(e) => {
                self.metrics.db_error("release", &e);
                tracing::warn!(worker = "room_outbox", node_id = %self.node_id, error = %e, rows = rows.len(), "could not hand back rows; they become claimable when their lease expires")
            }
        }
    }

    /// Writes a batch of outcomes, each under its row's lease.
    pub(super) async fn write_claimed(&self, marks: &[Mark], now_ms: i64) -> Result<u64, StoreError> {
        self.store.mark(marks, now_ms).await
    }

    /// Under `ordering: none`, keeps this host among the sink's hosts (a heartbeat every
    /// third of `partition_lease`), so that a `per_room` host starting meanwhile refuses.
    pub(super) async fn keep_announced(self: Arc<Self>, shutdown: CancellationToken) {
        let every = self.config.partition_lease / 3;
        let lease_ms = self.config.partition_lease.as_millis() as i64;
        while !shutdown.is_cancelled() {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = shutdown.cancelled() => return,
            }
            self.clock.sync(self.store.as_ref()).await;
            let now = self.clock.now_ms();
            let said = self.store.announce(&self.worker_id, self.config.ordering.name(), now, now + lease_ms).await;
            match said {
                Ok(others) if others.is_empty() => self.metrics.db_ok("partitions"),
                Ok(others) => {
                    self.metrics.db_ok("partitions");
                    let hosts: Vec<&str> = others.iter().map(|(owner, _)| owner.as_str()).collect();
                    tracing::error!(worker = "room_outbox", node_id = %self.node_id, hosts = %hosts.join(","), "hosts with another outbox_worker.ordering deliver this sink (they started together with this one): stop them")
                }
                Err(e) => {
                    self.metrics.db_error("partitions", &e);
                    tracing::warn!(worker = "room_outbox", node_id = %self.node_id, error = %e, "could not renew this host's place among the sink's hosts; will retry");
                }
            }
        }
    }
}
