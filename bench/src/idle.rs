//! What an idle host costs its database: the round trips per second a worker makes on an
//! empty table with the default config (claims, probes), counted at the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use outbox_host::engine::Worker;
use outbox_host::engine::settings::WorkerConfig;
use outbox_host::ops::metrics::Metrics;
use outbox_host::sandbox::Deliver;
use outbox_host::store::schema::TableInfo;
use outbox_host::store::{
    Backend, Claimed, Claims, Heartbeat, Held, Holding, Inspection, KeyValue, Mark, Migrated, Minute, NewEvent,
    OwnedRead, OwnerView, Page, Partitions, Producer, RegisteredSink, ReplayFilter, RetryFilter, Row, Schema,
    SinkRegistry, Stats, Step, Store, StoreError,
};
use tokio_util::sync::CancellationToken;

use crate::db::Db;

/// A store that counts the statements sent through it.
struct Counting {
    inner: Arc<dyn Store>,
    calls: AtomicU64,
}

impl Counting {
    fn count(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    fn count_n(&self, n: u64) {
        self.calls.fetch_add(n, Ordering::Relaxed);
    }
}

#[async_trait]
impl Schema for Counting {
    async fn migrate(&self) -> Result<Migrated, StoreError> {
        self.count();
        self.inner.migrate().await
    }
    fn backend(&self) -> Backend {
        self.inner.backend()
    }
    fn table(&self) -> &str {
        self.inner.table()
    }
    async fn describe(&self) -> Result<Option<TableInfo>, StoreError> {
        self.count();
        self.inner.describe().await
    }
    async fn ping(&self) -> Result<(), StoreError> {
        self.count();
        self.inner.ping().await
    }
    async fn clock_ms(&self) -> Result<i64, StoreError> {
        self.count();
        self.inner.clock_ms().await
    }
    async fn close(&self) {
        self.inner.close().await
    }
}

#[async_trait]
impl Claims for Counting {
    async fn claim(&self, w: &str, now: i64, until: i64, limit: u32) -> Result<Vec<Claimed>, StoreError> {
        self.count();
        self.inner.claim(w, now, until, limit).await
    }
    async fn mark(&self, marks: &[Mark], now: i64) -> Result<u64, StoreError> {
        self.count();
        self.inner.mark(marks, now).await
    }
    async fn release(&self, rows: &[Held], now: i64) -> Result<u64, StoreError> {
        self.count();
        self.inner.release(rows, now).await
    }
    async fn has_pending(&self) -> Result<bool, StoreError> {
        self.count();
        self.inner.has_pending().await
    }
    fn is_consumer(&self) -> bool {
        self.inner.is_consumer()
    }
    fn inserted(&self) -> Arc<tokio::sync::Notify> {
        self.inner.inserted()
    }
    fn listen_for_inserts(&self, wake: Arc<tokio::sync::Notify>, stop: CancellationToken) -> bool {
        self.inner.listen_for_inserts(wake, stop)
    }
}

#[async_trait]
impl Producer for Counting {
    async fn insert(&self, events: &[NewEvent]) -> Result<(), StoreError> {
        self.count();
        self.inner.insert(events).await
    }
}

#[async_trait]
impl Inspection for Counting {
    async fn get(&self, event_id: &str) -> Result<Option<Row>, StoreError> {
        self.count();
        self.inner.get(event_id).await
    }
    async fn stats(&self) -> Result<Stats, StoreError> {
        self.count();
        self.inner.stats().await
    }
    async fn history(&self, since: i64) -> Result<Vec<Minute>, StoreError> {
        self.count();
        self.inner.history(since).await
    }
    async fn recent_failures(&self, limit: u32) -> Result<Vec<Row>, StoreError> {
        self.count();
        self.inner.recent_failures(limit).await
    }
    async fn neighbours(&self, row: &Row) -> Result<[Option<Row>; 2], StoreError> {
        self.count();
        self.inner.neighbours(row).await
    }
    async fn search(&self, search: &outbox_host::store::Search) -> Result<outbox_host::store::Found, StoreError> {
        self.count();
        self.inner.search(search).await
    }
    async fn count_failed(&self, filter: &RetryFilter) -> Result<i64, StoreError> {
        self.count();
        self.inner.count_failed(filter).await
    }
    async fn retry_failed(&self, filter: &RetryFilter, now: i64) -> Result<u64, StoreError> {
        self.count();
        self.inner.retry_failed(filter, now).await
    }
    async fn purge_delivered(&self, before: i64, limit: u32) -> Result<u64, StoreError> {
        self.count();
        self.inner.purge_delivered(before, limit).await
    }
}

#[async_trait]
impl SinkRegistry for Counting {
    async fn sinks(&self) -> Result<Vec<RegisteredSink>, StoreError> {
        self.count();
        self.inner.sinks().await
    }
    async fn register_sink(
        &self,
        name: &str,
        start_from_ms: i64,
        may_be_first: bool,
        now: i64,
    ) -> Result<RegisteredSink, StoreError> {
        self.count();
        self.inner.register_sink(name, start_from_ms, may_be_first, now).await
    }
    async fn sink_store(self: Arc<Self>, sink: &RegisteredSink) -> Result<Arc<dyn Store>, StoreError> {
        self.inner.clone().sink_store(sink).await
    }
    async fn count_replayable(&self, filter: &ReplayFilter) -> Result<i64, StoreError> {
        self.count();
        self.inner.count_replayable(filter).await
    }
    async fn replay(
        &self,
        filter: &ReplayFilter,
        now: i64,
        after: Option<KeyValue>,
        limit: u32,
    ) -> Result<Step, StoreError> {
        self.count();
        self.inner.replay(filter, now, after, limit).await
    }

    async fn discard(
        &self,
        filter: &ReplayFilter,
        reason: &str,
        now_ms: i64,
        after: Option<KeyValue>,
        limit: u32,
    ) -> Result<Step, StoreError> {
        self.count();
        self.inner.discard(filter, reason, now_ms, after, limit).await
    }
}

#[async_trait]
impl outbox_host::store::Consumers for Counting {
    async fn positions(
        &self,
        sink: &RegisteredSink,
        parts: &[u32],
    ) -> Result<Vec<outbox_host::store::Position>, StoreError> {
        self.count();
        self.inner.positions(sink, parts).await
    }
    async fn read_consumer(
        &self,
        sink: &RegisteredSink,
        read: &OwnedRead<'_>,
        finished: &outbox_host::store::Finished<'_>,
    ) -> Result<Page, StoreError> {
        self.count();
        self.inner.read_consumer(sink, read, finished).await
    }
    async fn settle(&self, settle: &outbox_host::store::Settle<'_>) -> Result<outbox_host::store::Settled, StoreError> {
        self.count();
        self.inner.settle(settle).await
    }
    async fn consumer_from_copy(&self, sink: &RegisteredSink, now_ms: i64) -> Result<Option<u64>, StoreError> {
        self.count();
        self.inner.consumer_from_copy(sink, now_ms).await
    }
}

#[async_trait]
impl Partitions for Counting {
    /// A steady heartbeat is three statements: the owner's own row, the renewal, and the read
    /// of the partition and owner rows (taking or giving up partitions adds one each).
    async fn keep_partitions(&self, beat: &Heartbeat<'_>) -> Result<Holding, StoreError> {
        self.count_n(3);
        self.inner.keep_partitions(beat).await
    }
    async fn read_owned(&self, read: &OwnedRead<'_>) -> Result<Page, StoreError> {
        self.count();
        self.inner.read_owned(read).await
    }
    async fn newest_key(&self) -> Result<Option<i64>, StoreError> {
        self.count();
        self.inner.newest_key().await
    }
    async fn failed_rooms(&self, rooms: &[(String, String)]) -> Result<Vec<(String, String, i64)>, StoreError> {
        self.count();
        self.inner.failed_rooms(rooms).await
    }
    async fn mark_owned(&self, owner: &str, marks: &[Mark], now: i64) -> Result<(u64, Vec<usize>), StoreError> {
        self.count();
        self.inner.mark_owned(owner, marks, now).await
    }
    async fn index_partitions(&self, total: u32) -> Result<bool, StoreError> {
        self.count();
        self.inner.index_partitions(total).await
    }
    async fn leave_partitions(&self, owner: &str) -> Result<(), StoreError> {
        self.count_n(3);
        self.inner.leave_partitions(owner).await
    }
    async fn announce(
        &self,
        owner: &str,
        ordering: &str,
        now: i64,
        until: i64,
    ) -> Result<Vec<(String, String)>, StoreError> {
        self.count_n(2);
        self.inner.announce(owner, ordering, now, until).await
    }
    async fn partition_owners(&self, now: i64) -> Result<Vec<OwnerView>, StoreError> {
        self.count();
        self.inner.partition_owners(now).await
    }
    async fn set_partitions(&self, total: u32, now: i64) -> Result<Result<u32, Vec<String>>, StoreError> {
        self.count();
        self.inner.set_partitions(total, now).await
    }
}

/// Statements per second a worker with the default config sends while the table is empty,
/// over `seconds` once it has started: after a three-second warm-up, past a starting host's
/// short heartbeats (six at an eighth of a heartbeat, 2.5 s at the default lease).
pub async fn queries_per_second(db: &Db, sink: Arc<dyn Deliver>, seconds: u64) -> anyhow::Result<f64> {
    let store = Arc::new(Counting { inner: db.open().await?, calls: AtomicU64::new(0) });
    let shutdown = CancellationToken::new();
    let metrics = Arc::new(Metrics::new(sink.name()));
    let worker = Worker::new(store.clone(), sink, WorkerConfig::default(), "bench", metrics);
    let task = tokio::spawn(worker.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = store.calls.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let after = store.calls.load(Ordering::Relaxed);
    shutdown.cancel();
    task.await??;
    Ok((after - before) as f64 / seconds as f64)
}
