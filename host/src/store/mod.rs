//! The outbox table: one [`Store`] trait with the claim / mark / stats operations, and one
//! module per database implementing it. Dialect differences live in the backend modules.

mod consumer_store;
mod consumers;
pub mod migrate;
mod mysql;
pub mod partitions;
mod postgres;
mod runner;
pub mod schema;
pub mod search;
pub mod sinks;
mod sql;
mod sql_store;
mod sqlite;

use std::sync::Arc;

use async_trait::async_trait;
pub use consumers::{Exception, Finished, Position, SETTLE_MS, Settle, Settled};
pub use mysql::MysqlStore;
pub use partitions::{Fence, Heartbeat, Holding, OwnedRead, OwnerView, Page, Waiting};
pub use postgres::PostgresStore;
pub use search::{Cursor, Found, Search};
pub use sinks::{KeyValue, RegisteredSink, Step};
pub use sql::{Dialect, SqlStore};
pub use sqlite::SqliteStore;

/// The columns of a whole [`Row`] after its key (see [`row_columns`]).
const ROW_COLUMNS: &str = "app_code, event_id, event_type, room_id, status, envelope, created_at_ms, \
     retry_count, last_error, worker_id, lock_until_ms, next_retry_at_ms, updated_at_ms, delivered_at_ms, plugin_digest";

/// The columns a claim returns after its key (see [`claim_columns`]).
const CLAIM_COLUMNS: &str =
    "app_code, event_id, event_type, room_id, envelope, created_at_ms, retry_count, trace_context";

/// The key as the first selected column, `id`: the row's id, SQLite's rowid, or 0 where the
/// table names rows by `event_id`.
fn key_as_id(key: schema::Key) -> &'static str {
    match key {
        schema::Key::Id => "id",
        schema::Key::RowId => "rowid AS id",
        schema::Key::EventId => "0 AS id",
    }
}

/// The columns of a whole [`Row`], in [`sql::decode_row`]'s order.
fn row_columns(key: schema::Key) -> String {
    format!("{}, {ROW_COLUMNS}", key_as_id(key))
}

/// The columns a claim returns, in [`sql::decode_claimed`]'s order.
fn claim_columns(key: schema::Key) -> String {
    format!("{}, {CLAIM_COLUMNS}", key_as_id(key))
}

/// The delivery state of one outbox row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    /// Written by the producer in the same transaction as its state change; waits for a
    /// worker. Also where the host hands back rows it claimed but never started, and where
    /// an operator's retry puts a `failed` row. Left by a claim.
    Pending,
    /// Claimed by the worker named in `worker_id` until `lock_until_ms`. Left by the
    /// worker's outcome, by a hand-back at shutdown, or by another worker's claim once the
    /// lease has expired.
    Delivering,
    /// Terminal: the sink accepted (or skipped) it, or the producer's own synchronous
    /// publish succeeded. Nothing moves a row out of it.
    Delivered,
    /// The last attempt failed in a way that may pass (sink said retryable, a timeout, a
    /// trap). Claimable again once `next_retry_at_ms` has passed.
    Retryable,
    /// A permanent failure, an envelope that does not decode, or attempts exhausted. Waits
    /// for an operator, whose retry moves it back to `pending`.
    Failed,
}

impl Status {
    /// Every status, in the order `status` prints them.
    pub const ALL: [Status; 5] =
        [Status::Pending, Status::Delivering, Status::Retryable, Status::Failed, Status::Delivered];

    /// The text stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Delivering => "delivering",
            Status::Delivered => "delivered",
            Status::Retryable => "retryable",
            Status::Failed => "failed",
        }
    }

    /// Parses the `status` column.
    pub fn parse(text: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A row as a producer writes it: every other column has a default.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// Tenant / app.
    pub app_code: String,
    /// Idempotency key.
    pub event_id: String,
    /// e.g. `RoomGiftSent`.
    pub event_type: String,
    /// Partition / ordering key.
    pub room_id: String,
    /// `Pending`, or `Delivered` after the producer's own synchronous publish succeeded.
    pub status: Status,
    /// Protobuf `EventEnvelope`.
    pub envelope: Vec<u8>,
    /// UTC milliseconds; claim order.
    pub created_at_ms: i64,
    /// The producer's trace context (`trace_context`), if it has one.
    pub trace_context: Option<String>,
}

/// Claimed rows in claim order: creation time, then the row key (`id`, or `event_id` where
/// the table has none and `id` reads 0), as the claims pick them.
pub(crate) fn sort_claimed(rows: &mut [Claimed]) {
    rows.sort_by(|a, b| (a.created_at_ms, a.id, &a.event_id).cmp(&(b.created_at_ms, b.id, &b.event_id)));
}

/// Who holds a claimed row, and until when. Marking a failure applies only while the row
/// is still held under this exact lease (fencing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The claiming worker.
    pub worker_id: String,
    /// The lease end it wrote (`i64::MAX` for a row read by its partition's owner).
    pub lock_until_ms: i64,
    /// For a row read by its partition's owner: the partition and epoch its outcome is
    /// fenced by (no row lease is written).
    pub fence: Option<Fence>,
}

/// A row the worker claimed.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// Surrogate key.
    pub id: i64,
    /// Tenant / app.
    pub app_code: String,
    /// Idempotency key.
    pub event_id: String,
    /// Event type.
    pub event_type: String,
    /// Room.
    pub room_id: String,
    /// Protobuf `EventEnvelope`.
    pub envelope: Vec<u8>,
    /// Claim order.
    pub created_at_ms: i64,
    /// Failed worker attempts so far.
    pub retry_count: i32,
    /// The producer's trace context, as written (`trace_context`; see `ops/traces.rs`).
    pub trace_context: Option<String>,
    /// The lease this claim holds.
    pub lease: Lease,
    /// The row was `delivering` under another lease that had expired (its holder died or
    /// stalled): a lease rescue.
    pub rescued: bool,
}

/// What became of one claimed row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Sink delivered or skipped it: `delivered`, whoever holds it now (delivered wins).
    Delivered,
    /// `retryable`, claimable again at `next_retry_at_ms`.
    Retry {
        /// Short, secret-free reason.
        error: String,
        /// Earliest next claim.
        next_retry_at_ms: i64,
    },
    /// `failed`: needs an operator.
    Fail {
        /// Short, secret-free reason.
        error: String,
    },
    /// `retryable` without counting the attempt (`retry_count` stays): the sink pushed back
    /// for its room or its whole destination, so the event itself is not at fault.
    Defer {
        /// Short, secret-free reason.
        error: String,
        /// Earliest next claim.
        next_retry_at_ms: i64,
    },
}

impl Outcome {
    /// The status this outcome leaves its row in.
    pub fn status(&self) -> Status {
        match self {
            Outcome::Delivered => Status::Delivered,
            Outcome::Retry { .. } | Outcome::Defer { .. } => Status::Retryable,
            Outcome::Fail { .. } => Status::Failed,
        }
    }

    /// The reason, for `last_error` (none when delivered).
    pub fn error(&self) -> Option<&str> {
        match self {
            Outcome::Delivered => None,
            Outcome::Retry { error, .. } | Outcome::Fail { error } | Outcome::Defer { error, .. } => Some(error),
        }
    }

    /// What the outcome adds to `retry_count`: 1 for an attempt that counts against the
    /// event, 0 for a deferral (and for `delivered`, which leaves the count as it was).
    pub fn counted(&self) -> i32 {
        match self {
            Outcome::Retry { .. } | Outcome::Fail { .. } => 1,
            Outcome::Delivered | Outcome::Defer { .. } => 0,
        }
    }

    /// When the row may be claimed again: `next_retry_at_ms` of a retry, else 0.
    pub fn next_retry_at_ms(&self) -> i64 {
        match self {
            Outcome::Retry { next_retry_at_ms, .. } | Outcome::Defer { next_retry_at_ms, .. } => *next_retry_at_ms,
            _ => 0,
        }
    }
}

/// One claimed row's outcome, to be written.
#[derive(Debug, Clone)]
pub struct Mark {
    /// Row id.
    pub id: i64,
    /// The event, which names the row where the table has no `id` (see [`schema::Key`]).
    pub event_id: String,
    /// The lease it was claimed under.
    pub lease: Lease,
    /// What happened.
    pub outcome: Outcome,
    /// The build of the sink that produced the outcome (`sha256:<hex>` of its component),
    /// recorded with it; `None` where no sink ran.
    pub plugin_digest: Option<std::sync::Arc<str>>,
}

impl Mark {
    /// The outcome of `row` under the lease it was read or claimed with, no sink build named.
    pub fn of(row: &Claimed, outcome: Outcome) -> Mark {
        Mark { id: row.id, event_id: row.event_id.clone(), lease: row.lease.clone(), outcome, plugin_digest: None }
    }
}

/// A claimed row to hand back, and the lease it is held under.
#[derive(Debug, Clone)]
pub struct Held {
    /// Row id.
    pub id: i64,
    /// The event, which names the row where the table has no `id`.
    pub event_id: String,
    /// The lease it was claimed under.
    pub lease: Lease,
}

impl From<&Claimed> for Held {
    fn from(c: &Claimed) -> Self {
        Held { id: c.id, event_id: c.event_id.clone(), lease: c.lease.clone() }
    }
}

/// One whole row, for `status`, tests and operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Surrogate key.
    pub id: i64,
    /// Tenant / app.
    pub app_code: String,
    /// Idempotency key.
    pub event_id: String,
    /// Event type.
    pub event_type: String,
    /// Room.
    pub room_id: String,
    /// Delivery state.
    pub status: Status,
    /// Protobuf `EventEnvelope`.
    pub envelope: Vec<u8>,
    /// Claim order.
    pub created_at_ms: i64,
    /// Failed worker attempts.
    pub retry_count: i32,
    /// Last failure reason.
    pub last_error: Option<String>,
    /// Lease holder.
    pub worker_id: Option<String>,
    /// Lease end.
    pub lock_until_ms: i64,
    /// Earliest retry.
    pub next_retry_at_ms: i64,
    /// Last change.
    pub updated_at_ms: i64,
    /// When the worker delivered it.
    pub delivered_at_ms: Option<i64>,
    /// The build of the sink that produced the last outcome (`sha256:<hex>`).
    pub plugin_digest: Option<String>,
}

/// Counts for `status` and the metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Rows per status (every status present, zero when none).
    pub counts: Vec<(Status, i64)>,
    /// `created_at_ms` of the oldest row still waiting (pending or retryable).
    pub oldest_waiting_created_at_ms: Option<i64>,
    /// The most frequent `last_error` values among retryable and failed rows.
    pub top_errors: Vec<(String, i64)>,
    /// Rows the worker delivered in the last minute.
    pub delivered_last_minute: i64,
    /// Rows in a status the host does not know (an older producer's `published`): never
    /// claimed, shown so that someone decides what they are.
    pub unknown_statuses: Vec<(String, i64)>,
}

/// Which `failed` rows an operator's retry moves back to `pending`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryFilter {
    /// One event.
    EventId(String),
    /// Every failed event of one type.
    EventType(String),
    /// Every failed event whose `last_error` contains this text.
    ErrorContains(String),
    /// Every failed event whose `last_error` is exactly this (an error group).
    ErrorIs(String),
    /// Every failed event.
    All,
}

/// Deliveries and failures in one minute, for the status page's chart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Minute {
    /// Start of the minute, UTC ms.
    pub start_ms: i64,
    /// Rows delivered by the worker in it.
    pub delivered: i64,
    /// Rows that became `failed` in it.
    pub failed: i64,
}

impl Stats {
    /// The count for one status.
    pub fn count(&self, status: Status) -> i64 {
        self.counts.iter().find(|(s, _)| *s == status).map_or(0, |(_, n)| *n)
    }
}

/// The database errors a caller can act on; the message never holds SQL or a password.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Could not reach the database or lost the connection: wait and try again.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A unique key clash (an `event_id` already in the table).
    #[error("duplicate event_id {0}")]
    Duplicate(String),
    /// Migrations could not be applied.
    #[error("migration failed: {0}")]
    Migration(String),
    /// Anything else the database refused.
    #[error("database error: {0}")]
    Query(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_) => StoreError::Unavailable(e.to_string()),
            sqlx::Error::Database(db) if db.is_unique_violation() => StoreError::Duplicate(String::new()),
            sqlx::Error::Database(db) => StoreError::Query(db.message().to_string()),
            _ => StoreError::Query(e.to_string()),
        }
    }
}

/// What [`Store::migrate`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Migrated {
    /// The table did not exist: this call created it (so no event can predate it).
    pub created: bool,
}

/// The table itself: its schema and migrations, the connection, the database's clock.
#[async_trait]
pub trait Schema: Send + Sync + 'static {
    /// Creates or upgrades the table and its indexes. A table that exists but was not made
    /// by the host (room-service's own) is adopted: what the host needs is added as online
    /// steps, or, when a column cannot work as declared, nothing is changed and the error
    /// lists every such column with the statement that would fix it.
    async fn migrate(&self) -> Result<Migrated, StoreError>;

    /// The database this store is on.
    fn backend(&self) -> Backend;

    /// The table's columns and indexes as the database describes them; `None` when there
    /// is no such table.
    async fn describe(&self) -> Result<Option<schema::TableInfo>, StoreError>;

    /// What the host needs of the table and does not find, for a host whose worker ids are
    /// `worker_id_chars` long; `None` when there is no such table.
    async fn review(&self, worker_id_chars: Option<usize>) -> Result<Option<schema::Review>, StoreError> {
        let table = self.table().to_string();
        Ok(self.describe().await?.map(|info| schema::review(self.backend(), &table, &info, worker_id_chars)))
    }

    /// The outbox table's name.
    fn table(&self) -> &str;

    /// A cheap round trip, for readiness.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Now on the database's clock, UTC milliseconds (this machine's for SQLite), as of
    /// the moment this returns: what leases and due times are judged by, whichever host's
    /// clock runs ahead.
    async fn clock_ms(&self) -> Result<i64, StoreError>;

    /// Closes the pool once in-flight work has been recorded.
    async fn close(&self);
}

/// Row claims and their outcomes (`ordering: none`), and how an idle worker learns of inserts.
#[async_trait]
pub trait Claims: Send + Sync + 'static {
    /// Claims up to `limit` claimable rows (pending; retryable whose `next_retry_at_ms`
    /// has passed; delivering whose lease expired) in `created_at_ms, id` order, moving
    /// them to `delivering` under `worker_id` until `lock_until_ms`. Two concurrent
    /// claims never return the same row. The result is in claim order. Rooms are not
    /// considered (`ordering: none`): per-room order is kept by partition ownership.
    async fn claim(
        &self,
        worker_id: &str,
        now_ms: i64,
        lock_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<Claimed>, StoreError>;

    /// Writes outcomes. `Delivered` applies to any row not yet delivered; `Retry` and
    /// `Fail` apply only while the row is still `delivering` under the same lease.
    /// Returns how many rows changed.
    async fn mark(&self, marks: &[Mark], now_ms: i64) -> Result<u64, StoreError>;

    /// Hands back rows that were claimed but never started: `pending` at once, lease
    /// cleared, only while still held under the same lease. Returns how many.
    async fn release(&self, rows: &[Held], now_ms: i64) -> Result<u64, StoreError>;

    /// Whether any row is `pending`: an index-only probe an idle worker may run often.
    async fn has_pending(&self) -> Result<bool, StoreError>;

    /// Whether this store's sink is a consumer of the outbox (a sink after the first): it
    /// takes no row claims, so its hosts own partitions whatever its `ordering`, holding a
    /// room behind a retry only under `per_room`.
    fn is_consumer(&self) -> bool;

    /// Notified (one permit) whenever rows are inserted through this store, so that a
    /// worker in the same process wakes at once.
    fn inserted(&self) -> Arc<tokio::sync::Notify>;

    /// Notifies `wake` whenever any producer inserts rows, for as long as `stop` is not
    /// cancelled, where the database can say so (PostgreSQL's `LISTEN`); `false` where it
    /// cannot. Reconnects by itself, and notifies once after reconnecting (anything inserted
    /// meanwhile went unheard).
    fn listen_for_inserts(&self, wake: Arc<tokio::sync::Notify>, stop: tokio_util::sync::CancellationToken) -> bool;
}

/// What a producer does: insert events (the `enqueue` command and tests).
#[async_trait]
pub trait Producer: Send + Sync + 'static {
    /// Inserts rows as a producer would (the enqueue command and tests).
    async fn insert(&self, events: &[NewEvent]) -> Result<(), StoreError>;
}

/// What operators read and do: one event, the counts, the history, failures, retry and purge.
#[async_trait]
pub trait Inspection: Send + Sync + 'static {
    /// One row by `event_id`.
    async fn get(&self, event_id: &str) -> Result<Option<Row>, StoreError>;

    /// Counts per status, the oldest waiting row and the most frequent errors.
    async fn stats(&self) -> Result<Stats, StoreError>;

    /// Delivered and failed counts per minute since `since_ms`, oldest first (minutes with
    /// neither are left out).
    async fn history(&self, since_ms: i64) -> Result<Vec<Minute>, StoreError>;

    /// The most recently updated `failed` and `retryable` rows, newest first.
    async fn recent_failures(&self, limit: u32) -> Result<Vec<Row>, StoreError>;

    /// The event of `row`'s room just before it and just after it, in the order the room's
    /// events are delivered (`created_at_ms`, then the key), each in this store's state.
    async fn neighbours(&self, row: &Row) -> Result<[Option<Row>; 2], StoreError>;

    /// A page of the events `search` selects, newest first, each in this store's state.
    async fn search(&self, search: &Search) -> Result<Found, StoreError>;

    /// How many `failed` rows `filter` selects.
    async fn count_failed(&self, filter: &RetryFilter) -> Result<i64, StoreError>;

    /// Moves the `failed` rows `filter` selects back to `pending` (retry count reset, last
    /// error kept for context). Returns how many.
    async fn retry_failed(&self, filter: &RetryFilter, now_ms: i64) -> Result<u64, StoreError>;

    /// Deletes up to `limit` `delivered` rows last updated before `before_ms`; callers
    /// repeat until it returns less than `limit`, so no statement holds locks for long.
    async fn purge_delivered(&self, before_ms: i64, limit: u32) -> Result<u64, StoreError>;
}

/// Several sinks: the registry, each sink's store, and replay.
#[async_trait]
pub trait SinkRegistry: Send + Sync + 'static {
    /// The sinks registered on this outbox, oldest first (see [`sinks`]).
    async fn sinks(&self) -> Result<Vec<RegisteredSink>, StoreError>;

    /// Registers the sink `name`, starting from events created at `start_from_ms`, unless
    /// the outbox knows it already (then it keeps where it started). The first sink ever
    /// registered, when `may_be_first`, keeps its state in the outbox's own columns; any
    /// other is a consumer of the outbox (positions and exceptions), and the index it reads
    /// by is built (online) when missing.
    async fn register_sink(
        &self,
        name: &str,
        start_from_ms: i64,
        may_be_first: bool,
        now_ms: i64,
    ) -> Result<RegisteredSink, StoreError>;

    /// The store of a registered sink's state: this one for the first sink, else the sink
    /// as a consumer of this outbox (issue 48, decision 0203): its state in positions and
    /// exceptions, its partition leases keyed by its registered table.
    async fn sink_store(self: Arc<Self>, sink: &RegisteredSink) -> Result<Arc<dyn Store>, StoreError>;

    /// How many `delivered` and `failed` rows `filter` selects: what [`Store::replay`] moves.
    async fn count_replayable(&self, filter: &ReplayFilter) -> Result<i64, StoreError>;

    /// One bounded step of a replay: of the `delivered` and `failed` rows `filter` selects,
    /// up to `limit` after `after` in key order move back to `pending` (attempts reset, last
    /// error kept), in one short statement, so that this table's sink receives them again;
    /// rows waiting or in flight are left alone.
    async fn replay(
        &self,
        filter: &ReplayFilter,
        now_ms: i64,
        after: Option<KeyValue>,
        limit: u32,
    ) -> Result<Step, StoreError>;

    /// One bounded step of an operator's discard: of the events `filter` selects that wait in
    /// this store's state (`pending`, `retryable`), up to `limit` after `after` in key order
    /// become `failed` with `reason` as their last error, and are not attempted again (an
    /// attempt already under way may still finish, and its outcome is written). Events in
    /// flight on a claim (`delivering`) and finished ones are left alone.
    async fn discard(
        &self,
        filter: &ReplayFilter,
        reason: &str,
        now_ms: i64,
        after: Option<KeyValue>,
        limit: u32,
    ) -> Result<Step, StoreError>;
}

/// Per-room order by partition ownership: leases, the owner's reads and its fenced outcomes.
#[async_trait]
pub trait Partitions: Send + Sync + 'static {
    /// Per-room order by partition ownership: one heartbeat of `beat.owner` on this sink's
    /// partitions (see [`partitions`]), judged by `beat.now_ms` on the database's clock.
    async fn keep_partitions(&self, beat: &Heartbeat<'_>) -> Result<Holding, StoreError>;

    /// One page of the owned partitions' unfinished rows, in order, due or not.
    async fn read_owned(&self, read: &OwnedRead<'_>) -> Result<Page, StoreError>;

    /// The newest row's key where keys are given in insert order (`id`, SQLite's `rowid`;
    /// 0 in an empty table), `None` where rows are keyed by event id. A row inserted after
    /// this read has a greater key.
    async fn newest_key(&self) -> Result<Option<i64>, StoreError>;

    /// Finds, or builds online, the index of this sink table's unfinished rows by partition
    /// of `total` (dropping those of other counts), so that an owner of some partitions
    /// reads their rows only. `false` where the database has none (SQLite: the host
    /// computes the partition).
    async fn index_partitions(&self, total: u32) -> Result<bool, StoreError>;

    /// Of these rooms, those with a `failed` row, and its earliest creation time.
    async fn failed_rooms(&self, rooms: &[(String, String)]) -> Result<Vec<(String, String, i64)>, StoreError>;

    /// Writes outcomes of rows read by their partition's owner, each only while `owner`
    /// holds the row's partition under the mark's epoch. Returns rows changed and the
    /// indexes of the marks fenced off.
    async fn mark_owned(&self, owner: &str, marks: &[Mark], now_ms: i64) -> Result<(u64, Vec<usize>), StoreError>;

    /// Gives up every partition `owner` holds on this sink, and its place among the sink's
    /// hosts (a clean shutdown).
    async fn leave_partitions(&self, owner: &str) -> Result<(), StoreError>;

    /// Says `owner` delivers this sink with `ordering` (`per_room`, `none`) until `until_ms`
    /// on the database's clock, joining the sink's hosts if it was not among them. Returns
    /// the hosts live at `now_ms` that deliver it with another ordering, and theirs.
    async fn announce(
        &self,
        owner: &str,
        ordering: &str,
        now_ms: i64,
        until_ms: i64,
    ) -> Result<Vec<(String, String)>, StoreError>;

    /// The live owners of this sink's partitions.
    async fn partition_owners(&self, now_ms: i64) -> Result<Vec<OwnerView>, StoreError>;

    /// Makes this sink's partitions `total` anew (an operator's command, with every host of
    /// the sink stopped): `Err` names the hosts that hold one under a live lease, and nothing
    /// changes. Returns the count it had (0: none made yet).
    async fn set_partitions(&self, total: u32, now_ms: i64) -> Result<Result<u32, Vec<String>>, StoreError>;
}

/// Sinks as consumers (issue 48): a sink's positions in its partitions and its exceptions,
/// kept in the outbox's `<table>_positions` and `<table>_exceptions`.
#[async_trait]
pub trait Consumers: Send + Sync + 'static {
    /// `sink`'s positions in `parts`, each at the sink's start until first written.
    async fn positions(&self, sink: &RegisteredSink, parts: &[u32]) -> Result<Vec<Position>, StoreError>;

    /// Up to `read.limit` events of `sink` waiting in the owned partitions, in order after
    /// `read.after`: rows past their positions with no exception and not in `finished` (the
    /// events the owner delivered past its positions), and the `pending` and `retryable`
    /// exceptions, each with the sink's own status and retry count.
    async fn read_consumer(
        &self,
        sink: &RegisteredSink,
        read: &OwnedRead<'_>,
        finished: &Finished<'_>,
    ) -> Result<Page, StoreError>;

    /// Records exceptions and moves positions, fenced by the partitions' epochs (see
    /// [`Settle`]).
    async fn settle(&self, settle: &Settle<'_>) -> Result<Settled, StoreError>;

    /// Makes `sink`, kept so far in its own copy of the outbox, a consumer: positions and
    /// exceptions from the copy, then the copy dropped (with the sink's hosts stopped).
    /// Returns the exceptions written; `None` when it has no copy.
    async fn consumer_from_copy(&self, sink: &RegisteredSink, now_ms: i64) -> Result<Option<u64>, StoreError>;
}

/// The outbox table: every role above, as one object (`Arc<dyn Store>`). A module calls the
/// methods of the roles it imports, which says what it does with the table.
pub trait Store: Schema + Claims + Producer + Inspection + SinkRegistry + Partitions + Consumers {}

impl<T: Schema + Claims + Producer + Inspection + SinkRegistry + Partitions + Consumers> Store for T {}

/// Which events a replay delivers again to one sink: created in `[from_ms, to_ms)`, and of
/// one type or room if given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayFilter {
    /// Created at or after, UTC ms.
    pub from_ms: i64,
    /// Created before, UTC ms (`None`: up to now).
    pub to_ms: Option<i64>,
    /// Only this event type.
    pub event_type: Option<String>,
    /// Only this room.
    pub room_id: Option<String>,
    /// Only this event (an operator's bulk action, one event at a time).
    pub event_id: Option<String>,
}

impl ReplayFilter {
    /// ` AND …` conditions on `prefix`-qualified columns, their first placeholder numbered
    /// `first`, and the values to bind after `from_ms` and `to_ms` (always bound, `i64::MAX`
    /// standing for no end).
    fn conditions(&self, prefix: &str, param: impl Fn(usize) -> String, first: usize) -> (String, Vec<String>) {
        let mut sql =
            format!(" AND {prefix}created_at_ms >= {} AND {prefix}created_at_ms < {}", param(first), param(first + 1));
        let mut values = Vec::new();
        for (column, value) in
            [("event_type", &self.event_type), ("room_id", &self.room_id), ("event_id", &self.event_id)]
        {
            if let Some(value) = value {
                sql.push_str(&format!(" AND {prefix}{column} = {}", param(first + 2 + values.len())));
                values.push(value.clone());
            }
        }
        (sql, values)
    }
}

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `sqlite://path` (embedded).
    Sqlite,
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `mysql://` or `mariadb://`.
    Mysql,
}

impl Backend {
    /// This database's own types and schema statements, from the module named after it.
    pub(crate) fn ddl(self) -> &'static schema::Ddl {
        match self {
            Backend::Sqlite => &sqlite::DDL,
            Backend::Postgres => &postgres::DDL,
            Backend::Mysql => &mysql::DDL,
        }
    }

    /// Picks the backend from the URL's scheme.
    pub fn from_url(url: &str) -> Result<Backend, String> {
        let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
        match scheme {
            "sqlite" => Ok(Backend::Sqlite),
            "postgres" | "postgresql" => Ok(Backend::Postgres),
            "mysql" | "mariadb" => Ok(Backend::Mysql),
            _ => Err(format!("{:?} does not start with sqlite://, postgres:// or mysql://", crate::redact::url(url))),
        }
    }
}

/// Opens the store a `database.url` names. An unreachable database is an error that names
/// the host (never the password).
pub async fn open(url: &str, max_connections: u32, table: &str) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match Backend::from_url(url).map_err(StoreError::Query)? {
        Backend::Sqlite => Arc::new(SqliteStore::connect(url, max_connections, table).await?.profiled().await?),
        Backend::Postgres => Arc::new(PostgresStore::connect(url, max_connections, table).await?.profiled().await?),
        Backend::Mysql => Arc::new(MysqlStore::connect(url, max_connections, table).await?.profiled().await?),
    })
}

/// Rows per `INSERT` statement in [`Store::insert`] (7 parameters each stay under every
/// dialect's limit on bound parameters).
const INSERT_CHUNK: usize = 500;

/// How long to wait for a connection before an operation fails (and the worker backs off).
const ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The error for a database that could not be connected to at start-up: unavailable when
/// it could not be reached (worth waiting for), a query error when it answered and refused
/// (a wrong password, no such database: a config mistake).
fn unreachable_error(url: &str, e: sqlx::Error) -> StoreError {
    let said = format!("cannot connect to {}: {e}", crate::redact::url(url));
    match StoreError::from(e) {
        StoreError::Unavailable(_) => StoreError::Unavailable(said),
        _ => StoreError::Query(said),
    }
}

pub use crate::clock::now_ms;

/// Default `outbox.table`, room-service's table.
pub const DEFAULT_TABLE: &str = "room_outbox";

/// Assembles [`Stats`] from the rows every backend's queries return.
fn stats_from(
    counts: Vec<(String, i64)>,
    oldest: Option<i64>,
    top_errors: Vec<(String, i64)>,
    last_minute: i64,
) -> Stats {
    let unknown_statuses = counts.iter().filter(|(name, _)| Status::parse(name).is_none()).cloned().collect();
    let counts = Status::ALL
        .into_iter()
        .map(|s| (s, counts.iter().find(|(name, _)| name == s.as_str()).map_or(0, |(_, n)| *n)))
        .collect();
    Stats {
        counts,
        oldest_waiting_created_at_ms: oldest,
        top_errors,
        delivered_last_minute: last_minute,
        unknown_statuses,
    }
}

/// `LIKE` pattern matching `text` anywhere, with `!` escaping the wildcards (`ESCAPE '!'`
/// reads the same in every dialect).
fn contains_pattern(text: &str) -> String {
    let escaped: String =
        text.chars().flat_map(|c| if matches!(c, '%' | '_' | '!') { vec!['!', c] } else { vec![c] }).collect();
    format!("%{escaped}%")
}

/// The three statements behind [`Store::stats`]; they need no parameters and read the same
/// in every dialect.
fn stats_sql(table: &str) -> [String; 3] {
    [
        format!("SELECT status, COUNT(*) FROM {table} GROUP BY status"),
        format!("SELECT MIN(created_at_ms) FROM {table} WHERE status IN ('pending', 'retryable')"),
        format!(
            "SELECT last_error, COUNT(*) AS n FROM {table} \
             WHERE status IN ('retryable', 'failed') AND last_error IS NOT NULL AND last_error <> '' \
             GROUP BY last_error ORDER BY n DESC, last_error LIMIT 5"
        ),
    ]
}

/// Names the event in a unique-key clash on insert.
fn name_duplicate(err: sqlx::Error, event_id: &str) -> StoreError {
    match StoreError::from(err) {
        StoreError::Duplicate(_) => StoreError::Duplicate(event_id.to_string()),
        other => other,
    }
}
