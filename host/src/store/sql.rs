//! The contract between the shared store and each database, and the shared store's state.
//!
//! [`Dialect`] is what a database module must provide: every statement, lock and setting
//! that differs between databases (its migrations and their lock, the registry's lock, its
//! claim and its outcome writes, how it computes a partition, seeks past a cursor, locks
//! lease rows, builds and drops an index online, upserts a consumer's position and
//! exception). The roles' files (`sinks.rs`, `partitions.rs`, `consumers.rs`, `runner.rs`)
//! never ask which database they run on: what differs, they take from the dialect.
//! [`SqlStore`] holds a pool and the statements built once per table; the statements that
//! read the same everywhere are written once, with each database's own placeholders
//! ([`Dialect::param`]). `sql_store.rs` implements [`super::Store`] over them all.

use std::marker::PhantomData;

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::{Database, Executor, IntoArguments, Pool};

use super::schema::{self, Profile, TableInfo};
use super::{Backend, Claimed, Held, Lease, Mark, RetryFilter, Row, Schema, Status, Store, StoreError};

/// What differs between databases. Everything else is [`SqlStore`]'s.
#[async_trait]
pub trait Dialect: Send + Sync + Sized + 'static {
    /// The sqlx database.
    type Db: Database;

    /// Which database this is.
    const BACKEND: Backend;

    /// The dialect's own statements, built once per store ([`Dialect::statements`]).
    type Statements: Send + Sync + 'static;

    /// Builds the dialect's own statements for `table`, written as `profile` says.
    fn statements(table: &str, profile: &Profile) -> Self::Statements;

    /// The two queries that describe `table`: its columns (name, declared type, nullable as
    /// 0/1) in table order, and its indexes (name, unique as 0/1, column), one row per
    /// indexed column in index order. No rows: no such table.
    fn describe_sql(table: &str) -> [String; 2];

    /// Column `i` of `row` as an integer, whatever its width and signedness.
    fn int(row: &<Self::Db as Database>::Row, i: usize) -> Result<i64, sqlx::Error>;

    /// Column `i` of `row` as an integer or `NULL`.
    fn opt_int(row: &<Self::Db as Database>::Row, i: usize) -> Result<Option<i64>, sqlx::Error>;

    /// Column `i` of `row` as text, whatever its collation (binary included).
    fn text(row: &<Self::Db as Database>::Row, i: usize) -> Result<String, sqlx::Error>;

    /// Column `i` of `row` as text or `NULL`.
    fn opt_text(row: &<Self::Db as Database>::Row, i: usize) -> Result<Option<String>, sqlx::Error>;

    /// Column `i` of `row` as bytes.
    fn bytes(row: &<Self::Db as Database>::Row, i: usize) -> Result<Vec<u8>, sqlx::Error>;

    /// The dialect's migrations (`migrations/<dialect>/`).
    fn migrator() -> &'static Migrator;

    /// The placeholder of the `n`th parameter (from 1): `$1`, or `?` where parameters are
    /// bound in the order they appear (every shared statement binds in that order).
    fn param(n: usize) -> String;

    /// Rows a statement changed.
    fn rows_affected(result: &<Self::Db as Database>::QueryResult) -> u64;

    /// Whether this process should queue its own writes (claims, outcomes, hand-backs,
    /// inserts) instead of letting them meet in the database: SQLite has one writer at a
    /// time, and a writer that finds it busy sleeps for milliseconds.
    fn one_writer() -> bool {
        false
    }

    /// Starts telling `wake` about every insert into the table, if the database can (see
    /// [`Store::listen_for_inserts`]); `false` if it cannot.
    fn listen_for_inserts(
        _store: &SqlStore<Self>,
        _wake: std::sync::Arc<tokio::sync::Notify>,
        _stop: tokio_util::sync::CancellationToken,
    ) -> bool {
        false
    }

    /// The query for now on the database's clock in UTC milliseconds, where the database is
    /// another machine's (`None`: this machine's clock).
    fn clock_sql() -> Option<&'static str> {
        None
    }

    /// What keeps two starting hosts from migrating `table` at once.
    fn migration_lock(table: &str) -> Lock;

    /// What keeps a sink's registration and a purge of `table` from running at once
    /// (waiting for the other, a minute at most); named `<table>_fanout`, as earlier
    /// versions named it, so that theirs and this version's exclude each other. Where it
    /// begins a transaction, it is READ COMMITTED: each statement sees what committed
    /// before it.
    fn registry_lock(table: &str) -> Lock;

    /// The statements that bound how long this session's DDL waits for a lock on the table
    /// to `ms`, and that undo it; `None` where the database has no such wait (SQLite's one
    /// writer waits on its busy timeout).
    fn ddl_lock_timeout(_ms: u64) -> Option<[String; 2]> {
        None
    }

    /// What holds locks on `table` now, one row of text per session; `None` where the
    /// database cannot tell (SQLite: another writer).
    fn lock_holders_sql(_table: &str) -> Option<String> {
        None
    }

    /// The indexes of `table` named `name`, one row each: `1` if it is valid, `0` if a
    /// build was cut short (PostgreSQL's `CONCURRENTLY`; elsewhere every index is valid).
    fn index_sql(table: &str, name: &str) -> String;

    /// Builds an index on `table (columns)` without blocking writers (PostgreSQL
    /// `CONCURRENTLY`, MySQL in place); run only where no valid one of that name exists.
    fn create_index_online(table: &str, name: &str, columns: &str) -> String;

    /// `condition` kept out of the choice of an index: applied to the rows an index on the
    /// query's other terms (or its order) gives. As it is, by default.
    fn residual(condition: &str) -> String {
        condition.to_string()
    }

    /// The index the console's search of `failed` rows reads by, `(columns)` over the failed
    /// rows alone, built online; `None` where the claim index already leads with `status`
    /// and serves it (SQLite, MySQL).
    fn failed_index_online(table: &str, name: &str, columns: &str) -> Option<String> {
        let _ = (table, name, columns);
        None
    }

    /// Drops `index` of `table` without blocking writers; run only where it exists.
    fn drop_index_online(table: &str, index: &str) -> String;

    /// Builds the index of `table`'s unfinished rows by their partition of `total` (see
    /// [`Dialect::partition_expr`]), where the database keeps one ([`Dialect::PARTITION_INDEX`]);
    /// elsewhere nothing, and an owner reads its partitions from the claim index.
    async fn build_partition_index(
        _store: &SqlStore<Self>,
        _conn: &mut <Self::Db as Database>::Connection,
        _total: u32,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    /// Whether the database keeps partition indexes ([`Dialect::build_partition_index`]).
    const PARTITION_INDEX: bool = false;

    /// An owner's read through the partition index of `table` (see
    /// [`Dialect::build_partition_index`]): binding the cursor's time twice, its key, the
    /// partitions as text (`3,5,8`) and the rows per partition, it selects `columns` from
    /// each partition's next unfinished rows after the cursor, at most that many each, in
    /// `(created_at_ms, key)` order; `None` where there is no such index.
    fn partition_read_sql(_table: &str, _columns: &str, _key: &str, _expr: &str) -> Option<String> {
        None
    }

    /// The SQL that computes a row's partition of `{total}`, where the database does; `None`
    /// where the host computes it ([`super::partitions::partition_of`]).
    const PARTITION_HASH: Option<&'static str>;

    /// [`Self::PARTITION_HASH`] for `total` partitions.
    fn partition_expr(total: u32) -> Option<String> {
        Self::PARTITION_HASH.map(|hash| hash.replace("{total}", &total.to_string()))
    }

    /// Appended to a read of lease rows whose lease the transaction's writes rely on: no
    /// takeover commits between the read and the transaction's end.
    const SHARE_LOCK: &'static str;

    /// Appended to a read of lease rows the transaction goes on to change.
    const UPDATE_LOCK: &'static str;

    /// Rows after the cursor `(created_at_ms, key)`, whose time is bound at the
    /// placeholders `at` and `again` and whose key at `last`, written so that the read
    /// seeks to the cursor in its index rather than reading again, on every page, each row
    /// of the cursor's millisecond before it (a burst puts hundreds in one).
    fn after_cursor(key: &str, at: &str, again: &str, last: &str) -> String;

    /// The conditions an owner's read ranges over, each one ordered range of an index:
    /// where there are several, their ranges are merged in order.
    const WAITING: &'static [&'static str] = &["status IN ('pending', 'retryable', 'delivering')"];

    /// What an owner's read reads from: `table`, or `table` with the index it must use.
    fn waiting_from(table: &str) -> String {
        table.to_string()
    }

    /// Writes one consumer's position in `positions`, binding sink, part, created_at_ms,
    /// key and now: an `INSERT … ON CONFLICT` (PostgreSQL, SQLite) unless the database
    /// spells it otherwise.
    fn set_position_sql(positions: &str) -> String {
        let p = Self::param;
        format!(
            "INSERT INTO {positions} (sink, part, created_at_ms, row_key, updated_at_ms) VALUES ({}, {}, {}, {}, {}) \
             ON CONFLICT (sink, part) DO UPDATE SET created_at_ms = excluded.created_at_ms, \
             row_key = excluded.row_key, updated_at_ms = excluded.updated_at_ms",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5)
        )
    }

    /// Writes one exception in `exceptions`, binding [`EXCEPTION_COLUMNS`] in order (an empty
    /// last error or digest stored as `NULL`): added to the retry count of one already
    /// there, and never over one that says `delivered`. An `INSERT … ON CONFLICT`
    /// (PostgreSQL, SQLite) unless the database spells it otherwise.
    fn set_exception_sql(exceptions: &str) -> String {
        format!(
            "INSERT INTO {exceptions} ({EXCEPTION_COLUMNS}) VALUES ({}) ON CONFLICT (sink, event_id) DO UPDATE SET \
             status = excluded.status, retry_count = {exceptions}.retry_count + excluded.retry_count, \
             next_retry_at_ms = excluded.next_retry_at_ms, last_error = excluded.last_error, \
             updated_at_ms = excluded.updated_at_ms, plugin_digest = excluded.plugin_digest \
             WHERE {exceptions}.status <> 'delivered'",
            (1..=13)
                .map(|n| if n == 11 || n == 13 { format!("NULLIF({}, '')", Self::param(n)) } else { Self::param(n) })
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// The statement that begins a transaction that writes from its start; `None`: a plain
    /// `BEGIN` does.
    const BEGIN_WRITING: Option<&'static str> = None;

    /// Sets the session up for a read that must follow its index's order without sorting
    /// (see `SqlStore::in_index_order`), inside a read-only transaction; `None` where the
    /// planner needs no such help.
    const INDEX_ORDER_READ: Option<&'static str> = None;

    /// Takes up to `limit` claimable rows (`pending`, `retryable` and due, `delivering` with
    /// an expired lease) in `created_at_ms, id` order, under the lease
    /// `(worker_id, lock_until_ms)`; never a row another claim holds.
    async fn claim_rows(
        store: &SqlStore<Self>,
        worker_id: &str,
        now_ms: i64,
        lock_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<Claimed>, StoreError>;

    /// Writes `delivered` for these rows in one statement of the dialect's own, if it has a
    /// better one than the shared `IN` list (PostgreSQL binds one array, so the statement's
    /// text, and its prepared plan, never change); `None` to use the shared one.
    async fn mark_delivered(
        _store: &SqlStore<Self>,
        _marks: &[&Mark],
        _now_ms: i64,
    ) -> Result<Option<u64>, StoreError> {
        Ok(None)
    }

    /// Writes `retryable`/`failed` outcomes (never `delivered`: the caller writes those),
    /// each only while its row is still `delivering` under its lease. Returns rows changed.
    async fn mark_failed(store: &SqlStore<Self>, marks: &[&Mark], now_ms: i64) -> Result<u64, StoreError>;

    /// Hands back unstarted rows to `pending` (a non-empty list), each only under its lease.
    async fn release_rows(store: &SqlStore<Self>, rows: &[Held], now_ms: i64) -> Result<u64, StoreError>;
}

/// Statements around work one session at a time does (applying migrations, registering a
/// sink), run on one connection: `take` before (it may begin a transaction), `keep` after
/// success, `undo` after a failure.
pub struct Lock {
    /// Taken before anything is read; when `checked`, it must return 1 (e.g. `GET_LOCK`),
    /// and when `polled` it is tried again every 50 ms (for a minute) until it does.
    pub take: String,
    /// Whether `take` returns a value that must be 1.
    pub checked: bool,
    /// Try `take` until it returns 1, rather than once.
    pub polled: bool,
    /// After success (`COMMIT`, or releasing the lock).
    pub keep: String,
    /// After a failure (`ROLLBACK`, or releasing the lock).
    pub undo: String,
}

/// The text of a statement that differs only in how many rows it carries (an `IN` list, a
/// multi-row `VALUES`): built the first time each count is used, then reused, so the hot
/// path formats no SQL and each text meets sqlx's prepared-statement cache.
pub struct ByCount {
    build: Box<dyn Fn(usize) -> String + Send + Sync>,
    built: std::sync::Mutex<std::collections::HashMap<usize, std::sync::Arc<str>>>,
}

impl ByCount {
    /// Counts above this are built each time rather than kept (no batch reaches it).
    const MAX_KEPT: usize = 4_096;

    /// Statements built by `build(count)`.
    pub fn new(build: impl Fn(usize) -> String + Send + Sync + 'static) -> Self {
        ByCount { build: Box::new(build), built: Default::default() }
    }

    /// The text for `count` rows.
    pub fn get(&self, count: usize) -> std::sync::Arc<str> {
        if count > Self::MAX_KEPT {
            return (self.build)(count).into();
        }
        let mut built = self.built.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        built.entry(count).or_insert_with(|| (self.build)(count).into()).clone()
    }
}

/// An exception's columns, in the order [`Dialect::set_exception_sql`] binds them.
pub const EXCEPTION_COLUMNS: &str = "sink, event_id, app_code, room_id, event_type, part, created_at_ms, status, \
                                     retry_count, next_retry_at_ms, last_error, updated_at_ms, plugin_digest";

/// The statements [`SqlStore`] runs the same way on every database, with the dialect's
/// placeholders, built once per store.
pub(super) struct SharedStatements {
    pub(super) delivered: ByCount,
    pub(super) insert: ByCount,
    /// [`Self::insert`] without `trace_context`, for rows that have none (a table an older
    /// host migrated takes them).
    pub(super) insert_untraced: ByCount,
    pub(super) get: String,
    pub(super) stats: [String; 3],
    pub(super) last_minute: String,
    pub(super) history: String,
    pub(super) recent_failures: String,
    /// A room's event just before a row, and just after it, in delivery order.
    pub(super) neighbours: [String; 2],
    pub(super) purge_pick: String,
    pub(super) purge_delete: ByCount,
    pub(super) has_pending: String,
    /// An operator's retry, before its filter.
    pub(super) retry_set: String,
}

impl SharedStatements {
    /// `outbox`: the table is an outbox (which may have sinks' copies to wait for before a
    /// purge), not a sink's copy.
    fn new<D: Dialect>(table: &str, profile: &Profile, outbox: bool) -> Self {
        let t = table.to_string();
        let (p1, p2) = (D::param(1), D::param(2));
        let (key, no_worker, no_error) = (profile.key.column(), profile.no_worker, profile.no_error);
        let row_columns = super::row_columns(profile.key);
        SharedStatements {
            delivered: ByCount::new({
                let t = t.clone();
                move |n| {
                    format!(
                        "UPDATE {t} SET status = 'delivered', last_error = {no_error}, worker_id = {no_worker}, \
                         lock_until_ms = 0, updated_at_ms = {}, delivered_at_ms = {}, plugin_digest = {} \
                         WHERE status <> 'delivered' AND {key} IN ({})",
                        D::param(1),
                        D::param(2),
                        D::param(3),
                        params::<D>(4, n),
                    )
                }
            }),
            // The producer crate's statement, so that `enqueue` and every Rust producer write
            // rows the same way.
            insert: ByCount::new({
                let t = t.clone();
                move |n| outbox_producer::sql::insert(&t, n, D::param)
            }),
            insert_untraced: ByCount::new({
                let t = t.clone();
                move |n| outbox_producer::sql::insert_untraced(&t, n, D::param)
            }),
            get: format!("SELECT {row_columns} FROM {t} WHERE event_id = {p1}"),
            stats: super::stats_sql(&t),
            last_minute: format!("SELECT COUNT(*) FROM {t} WHERE status = 'delivered' AND delivered_at_ms >= {p1}"),
            // `x - x % 60000` floors to the minute, and COUNT is a BIGINT, in every dialect.
            history: format!(
                "SELECT m, COUNT(CASE WHEN k = 1 THEN 1 END), COUNT(CASE WHEN k = 2 THEN 1 END) FROM (\
                   SELECT delivered_at_ms - delivered_at_ms % 60000 AS m, 1 AS k FROM {t} \
                   WHERE status = 'delivered' AND delivered_at_ms >= {p1} \
                   UNION ALL SELECT updated_at_ms - updated_at_ms % 60000 AS m, 2 AS k FROM {t} \
                   WHERE status = 'failed' AND updated_at_ms >= {p2}) per_row GROUP BY m ORDER BY m"
            ),
            recent_failures: format!(
                "SELECT {row_columns} FROM {t} WHERE status IN ('failed', 'retryable') \
                 ORDER BY updated_at_ms DESC, {key} DESC LIMIT {p1}"
            ),
            neighbours: [("<", "DESC"), (">", "ASC")].map(|(beyond, order)| {
                format!(
                    "SELECT {row_columns} FROM {t} WHERE room_id = {p1} AND (created_at_ms {beyond} {p2} \
                     OR (created_at_ms = {} AND {key} {beyond} {})) ORDER BY created_at_ms {order}, {key} {order} LIMIT 1",
                    D::param(3),
                    D::param(4)
                )
            }),
            // Pick the ids first, then delete them: one bounded statement each, and the same
            // in every dialect (MySQL cannot delete from a subquery on its table).
            // A row delivered by its producer's own publish may never have had updated_at_ms
            // set (a table adopted from elsewhere defaults it to 0): it is at least as young
            // as its created_at_ms.
            // An outbox row another sink still needs stays (see `still_needed_elsewhere`; the
            // DELETE says so again, under the registry's lock, so that a sink registered after
            // the pick is seen).
            purge_pick: format!(
                "SELECT {key}, event_id FROM {t} WHERE status = 'delivered' \
                 AND updated_at_ms < {p1} AND created_at_ms < {p2}{} AND {key} > {} ORDER BY {key} LIMIT {}",
                if outbox { still_needed_elsewhere(&t) } else { String::new() },
                D::param(3),
                D::param(4)
            ),
            purge_delete: ByCount::new({
                let t = t.clone();
                let needed = if outbox { still_needed_elsewhere(&t) } else { String::new() };
                move |n| {
                    format!("DELETE FROM {t} WHERE status = 'delivered' AND {key} IN ({}){needed}", params::<D>(1, n))
                }
            }),
            has_pending: format!("SELECT 1 FROM {t} WHERE status = 'pending' LIMIT 1"),
            retry_set: format!(
                "UPDATE {t} SET status = 'pending', retry_count = 0, next_retry_at_ms = 0, worker_id = {no_worker}, \
                 lock_until_ms = 0, updated_at_ms = {p1}"
            ),
        }
    }
}

/// The registry's statements, built once per store.
pub(super) struct RegistryStatements {
    /// The registry, oldest first.
    pub(super) list: String,
    /// The registry's lock ([`Dialect::registry_lock`]).
    pub(super) lock: Lock,
}

impl RegistryStatements {
    pub(super) fn new<D: Dialect>(table: &str) -> Self {
        let t = table.to_string();
        RegistryStatements {
            list: format!(
                "SELECT name, sink_table, start_from_ms, added_at_ms, backfilled_at_ms FROM {t}_sinks \
                 ORDER BY added_at_ms, CASE WHEN sink_table = '{t}' THEN 0 ELSE 1 END, name"
            ),
            lock: D::registry_lock(table),
        }
    }
}

/// ` AND …`: an outbox row that no sink after the first (decision 0203) that started no
/// later than it plainly still needs: its exception there says so (unless `delivered`);
/// with none, the sink has no position yet (registered, nothing settled). The DELETE of a purge repeats this
/// under the registry's lock: a sink registered, or a replay made, since the rows were
/// picked keeps them. Whether a row lies past the sink's position in its partition is
/// judged for the picked rows by the host, which computes partitions on every database
/// ([`SqlStore::still_needed`]).
fn still_needed_elsewhere(t: &str) -> String {
    format!(
        " AND NOT EXISTS (SELECT 1 FROM {t}_sinks s WHERE s.sink_table <> '{t}' AND s.start_from_ms <= {t}.created_at_ms \
         AND COALESCE((SELECT CASE WHEN e.status = 'delivered' THEN 0 ELSE 1 END FROM {t}_exceptions e \
         WHERE e.sink = s.name AND e.event_id = {t}.event_id), \
         CASE WHEN EXISTS (SELECT 1 FROM {t}_positions p WHERE p.sink = s.name) THEN 0 ELSE 1 END) = 1)"
    )
}

// The bounds below say what the shared statements need of a database: sqlx's executors and
// argument buffers, and the column types the outbox uses. Every dialect here has them; Rust
// does not carry such bounds along with `Dialect`, so they are spelled out once, here.

/// `impl SqlStore<D> { … }`, or `impl Role for SqlStore<D> { … }` (with the attributes
/// given, e.g. `#[async_trait]`), under the bounds every dialect meets; `on Type [bounds]`
/// first: the same for another type generic over the dialect, with further bounds.
macro_rules! for_every_dialect {
    ($(#[$attr:meta])* impl $($role:ident)? { $($body:tt)* }) => {
        $crate::store::sql::for_every_dialect!(on SqlStore []; $(#[$attr])* impl $($role)? { $($body)* });
    };
    (on $ty:ident [$($extra:tt)*]; $(#[$attr:meta])* impl $($role:ident)? { $($body:tt)* }) => {
        $(#[$attr])*
        impl<D> $($role for)? $ty<D>
        where
            D: Dialect,
            $($extra)*
            for<'c> &'c mut <D::Db as sqlx::Database>::Connection: sqlx::Executor<'c, Database = D::Db>,
            for<'q> <D::Db as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, D::Db>,
            for<'a> &'a str: sqlx::ColumnIndex<<D::Db as sqlx::Database>::Row>,
            usize: sqlx::ColumnIndex<<D::Db as sqlx::Database>::Row>,
            for<'r> i64: sqlx::Encode<'r, D::Db> + sqlx::Decode<'r, D::Db> + sqlx::Type<D::Db>,
            for<'r> i32: sqlx::Decode<'r, D::Db> + sqlx::Type<D::Db>,
            for<'r> String: sqlx::Encode<'r, D::Db> + sqlx::Decode<'r, D::Db> + sqlx::Type<D::Db>,
            for<'r> Vec<u8>: sqlx::Encode<'r, D::Db> + sqlx::Decode<'r, D::Db> + sqlx::Type<D::Db>,
            for<'r> &'r str: sqlx::Encode<'r, D::Db> + sqlx::Type<D::Db>,
            for<'r> Option<String>: sqlx::Encode<'r, D::Db> + sqlx::Type<D::Db>,
        {
            $($body)*
        }
    };
}
pub(super) use for_every_dialect;

/// The statements of positions and exceptions, built once per store.
pub(super) struct ConsumerStatements {
    /// `(sink, part)` → position, for the parts bound as a comma list.
    pub(super) positions: String,
    /// Writes one position: sink, part, created_at_ms, key, now.
    pub(super) set_position: String,
    /// Writes one exception (pending, retryable or failed are kept over by delivered).
    pub(super) set_exception: String,
    /// Deletes a sink's `delivered` exceptions behind positions (`{behind}`: per partition).
    pub(super) forget: String,
}

impl ConsumerStatements {
    pub(super) fn new<D: Dialect>(table: &str) -> Self {
        let p = D::param;
        let (positions, exceptions) = (format!("{table}_positions"), format!("{table}_exceptions"));
        let set_position = D::set_position_sql(&positions);
        let set_exception = D::set_exception_sql(&exceptions);
        ConsumerStatements {
            positions: format!(
                "SELECT part, created_at_ms, row_key FROM {positions} WHERE sink = {} AND part IN ({{parts}})",
                p(1)
            ),
            set_position,
            set_exception,
            forget: format!("DELETE FROM {exceptions} WHERE sink = {} AND status = 'delivered' AND ({{behind}})", p(1)),
        }
    }
}

/// Statements whose text depends on what they read (a partition count, the partitions
/// owned), each built the first time it is asked for and then kept: a read formats no
/// SQL. At most [`Kept::MAX`] are kept; past that they are all built again as asked.
pub(super) struct Kept<K> {
    built: std::sync::Mutex<std::collections::HashMap<K, std::sync::Arc<str>>>,
}

impl<K> Default for Kept<K> {
    fn default() -> Self {
        Kept { built: Default::default() }
    }
}

impl<K: std::hash::Hash + Eq> Kept<K> {
    /// More than an owner's reads need between two changes of what it owns.
    const MAX: usize = 32;

    /// The statement for `key`, built by `build` unless kept.
    pub(super) fn get(&self, key: K, build: impl FnOnce() -> String) -> std::sync::Arc<str> {
        let mut built = self.built.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(sql) = built.get(&key) {
            return sql.clone();
        }
        if built.len() >= Self::MAX {
            built.clear();
        }
        built.entry(key).or_insert_with(|| build().into()).clone()
    }
}

/// The outbox table on database dialect `D`.
pub struct SqlStore<D: Dialect> {
    pub(super) pool: Pool<D::Db>,
    pub(super) table: String,
    /// How this table is written to (the host's own, or one made elsewhere).
    pub(super) profile: Profile,
    /// The shared statements' text, built once.
    pub(super) sql: SharedStatements,
    /// The dialect's own statements' text, built once.
    pub(super) own: D::Statements,
    /// The registry's statements, built once.
    pub(super) registry: RegistryStatements,
    /// The statements of the sinks' positions and exceptions, built once.
    pub(super) consumers: ConsumerStatements,
    pub(super) inserted: std::sync::Arc<tokio::sync::Notify>,
    /// Shared with the stores of the sinks' own tables on the same pool.
    pub(super) writes: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// The outbox this table keeps a sink's copy of (`<outbox>__<sink>`), if it is one.
    pub(super) copy_of: Option<String>,
    /// The partition count whose index this table is known to have (0: none known).
    pub(super) indexed_partitions: std::sync::Arc<std::sync::atomic::AtomicU32>,
    /// An owner's read through the partition index, per partition count.
    pub(super) partition_read: Kept<u32>,
    /// An owner's read of its partitions, per partition count and partitions read (`None`:
    /// all).
    pub(super) waiting_read: Kept<(u32, Option<Vec<u32>>)>,
    /// A consumer's walk of the outbox, per partition count, partitions walked (`None`:
    /// all) and whether it reads the envelopes.
    pub(super) walk_read: Kept<(u32, Option<Vec<u32>>, bool)>,
    pub(super) dialect: PhantomData<D>,
}

impl<D: Dialect> SqlStore<D> {
    /// A store over `pool` for `table`.
    pub(super) fn new(pool: Pool<D::Db>, table: &str) -> Self {
        let profile = Profile::native();
        SqlStore {
            pool,
            table: table.to_string(),
            sql: SharedStatements::new::<D>(table, &profile, true),
            own: D::statements(table, &profile),
            registry: RegistryStatements::new::<D>(table),
            consumers: ConsumerStatements::new::<D>(table),
            profile,
            inserted: Default::default(),
            writes: Default::default(),
            copy_of: None,
            indexed_partitions: Default::default(),
            partition_read: Default::default(),
            waiting_read: Default::default(),
            walk_read: Default::default(),
            dialect: PhantomData,
        }
    }

    /// A store for `table`, a sink's own copy of this outbox, on the same pool.
    pub(super) fn sink_copy(&self, table: &str) -> Self {
        let profile = Profile::native();
        SqlStore {
            pool: self.pool.clone(),
            table: table.to_string(),
            sql: SharedStatements::new::<D>(table, &profile, false),
            own: D::statements(table, &profile),
            registry: RegistryStatements::new::<D>(table),
            consumers: ConsumerStatements::new::<D>(table),
            profile,
            inserted: Default::default(),
            writes: self.writes.clone(),
            copy_of: Some(self.table.clone()),
            indexed_partitions: Default::default(),
            partition_read: Default::default(),
            waiting_read: Default::default(),
            walk_read: Default::default(),
            dialect: PhantomData,
        }
    }

    /// This store with its statements written for the table as it is (a table made
    /// elsewhere may name rows by `event_id`, or take `''` for "nothing").
    pub(super) async fn profiled(self) -> Result<Self, StoreError>
    where
        Self: Store,
    {
        let Some(review) = self.review(None).await? else { return Ok(self) };
        if review.profile == self.profile {
            return Ok(self);
        }
        let profile = review.profile;
        Ok(SqlStore {
            sql: SharedStatements::new::<D>(&self.table, &profile, self.copy_of.is_none()),
            own: D::statements(&self.table, &profile),
            registry: RegistryStatements::new::<D>(&self.table),
            consumers: ConsumerStatements::new::<D>(&self.table),
            profile,
            ..self
        })
    }

    /// The table as the database describes it, read on `conn` (which sees what a
    /// migration running on it has not committed yet).
    pub(super) async fn describe_on(
        &self,
        conn: &mut <D::Db as Database>::Connection,
    ) -> Result<Option<TableInfo>, StoreError>
    where
        for<'c> &'c mut <D::Db as Database>::Connection: Executor<'c, Database = D::Db>,
        for<'q> <D::Db as Database>::Arguments<'q>: IntoArguments<'q, D::Db>,
    {
        self.describe_named(conn, &self.table).await
    }

    /// The table `table` as the database describes it, read on `conn`.
    pub(super) async fn describe_named(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        table: &str,
    ) -> Result<Option<TableInfo>, StoreError>
    where
        for<'c> &'c mut <D::Db as Database>::Connection: Executor<'c, Database = D::Db>,
        for<'q> <D::Db as Database>::Arguments<'q>: IntoArguments<'q, D::Db>,
    {
        let [columns, indexes] = D::describe_sql(table);
        let columns = sqlx::query(&columns).fetch_all(&mut *conn).await?;
        if columns.is_empty() {
            return Ok(None);
        }
        let indexes = sqlx::query(&indexes).fetch_all(&mut *conn).await?;

        let mut info = TableInfo::default();
        for c in &columns {
            info.columns.push(schema::ColumnInfo {
                name: D::text(c, 0)?.to_ascii_lowercase(),
                declared: D::text(c, 1)?,
                nullable: D::int(c, 2)? != 0,
            });
        }
        for i in &indexes {
            let (name, unique, column) = (D::text(i, 0)?, D::int(i, 1)? != 0, D::text(i, 2)?.to_ascii_lowercase());
            match info.indexes.last_mut() {
                Some(last) if last.name == name => last.columns.push(column),
                _ => info.indexes.push(schema::IndexInfo { name, unique, columns: vec![column] }),
            }
        }
        Ok(Some(info))
    }

    /// Makes `review`'s additions, each as an online step.
    pub(super) async fn add(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        review: &schema::Review,
    ) -> Result<(), StoreError>
    where
        for<'c> &'c mut <D::Db as Database>::Connection: Executor<'c, Database = D::Db>,
    {
        let steps = schema::addition_statements(D::BACKEND, &self.table, review.profile.key, &review.additions);
        for step in &steps {
            add_online::<D>(conn, step).await?;
        }
        if !steps.is_empty() {
            tracing::info!(table = %self.table, added = ?review.additions, "added what the host needs to the table");
        }
        Ok(())
    }

    /// `last_error` text clipped to what the column takes.
    pub(super) fn fit_error<'e>(&self, error: &'e str) -> std::borrow::Cow<'e, str> {
        crate::text::clip_chars(error, self.profile.last_error_chars)
    }

    /// Holds this process's other writes off while one runs, where the dialect wants that.
    pub(super) async fn writing(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        if D::one_writer() { Some(self.writes.lock().await) } else { None }
    }

    /// A transaction that writes from its start (SQLite's `BEGIN IMMEDIATE`: its write lock
    /// is taken before the first read, not upgraded later, which could fail as busy).
    pub(super) async fn begin_writing(&self) -> Result<sqlx::Transaction<'static, D::Db>, StoreError> {
        Ok(match D::BEGIN_WRITING {
            Some(begin) => self.pool.begin_with(begin).await?,
            None => self.pool.begin().await?,
        })
    }
}

/// Decodes a whole [`Row`], by position ([`super::row_columns`]), tolerating the column
/// types a table made elsewhere may have (see [`Dialect::int`]).
pub(super) fn decode_row<D: Dialect>(r: &<D::Db as Database>::Row) -> Result<Row, sqlx::Error> {
    let status = D::text(r, 5)?;
    Ok(Row {
        id: D::int(r, 0)?,
        app_code: D::text(r, 1)?,
        event_id: D::text(r, 2)?,
        event_type: D::text(r, 3)?,
        room_id: D::text(r, 4)?,
        status: Status::parse(&status)
            .ok_or_else(|| sqlx::Error::Decode(format!("unknown status {status:?}").into()))?,
        envelope: D::bytes(r, 6)?,
        created_at_ms: D::int(r, 7)?,
        retry_count: counter(D::int(r, 8)?),
        last_error: blank_is_none(D::opt_text(r, 9)?),
        worker_id: blank_is_none(D::opt_text(r, 10)?),
        lock_until_ms: D::int(r, 11)?,
        next_retry_at_ms: D::int(r, 12)?,
        updated_at_ms: D::int(r, 13)?,
        delivered_at_ms: D::opt_int(r, 14)?,
        plugin_digest: blank_is_none(D::opt_text(r, 15)?),
    })
}

/// The sink build the marks (all of one build) were produced by, `''` for none.
pub(super) fn digest_of(marks: &[&Mark]) -> String {
    marks.first().and_then(|m| m.plugin_digest.as_deref()).unwrap_or("").to_string()
}

/// An empty string (a `NOT NULL DEFAULT ''` column's "nothing") read as `NULL`.
fn blank_is_none(text: Option<String>) -> Option<String> {
    text.filter(|t| !t.is_empty())
}

/// A retry counter as the host keeps it.
fn counter(n: i64) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Decodes a claimed row held under `lease`, by position ([`super::claim_columns`]; a
/// `CALL`'s prepared statement on MySQL describes no columns, so names would find none).
/// `rescued` says the row was taken over from an expired lease.
pub(super) fn decode_claimed<D: Dialect>(
    r: &<D::Db as Database>::Row,
    lease: Lease,
    rescued: bool,
) -> Result<Claimed, sqlx::Error> {
    decode_claimed_with::<D>(r, lease, rescued, CLAIMED_CONTEXT)
}

/// Where [`super::claim_columns`] put `trace_context`.
const CLAIMED_CONTEXT: usize = 8;

/// [`decode_claimed`] of a row whose first eight columns are the claim's and whose
/// `trace_context` is column `context_at` (an owner's page reads it last).
pub(super) fn decode_claimed_with<D: Dialect>(
    r: &<D::Db as Database>::Row,
    lease: Lease,
    rescued: bool,
    context_at: usize,
) -> Result<Claimed, sqlx::Error> {
    Ok(Claimed {
        id: D::int(r, 0)?,
        app_code: D::text(r, 1)?,
        event_id: D::text(r, 2)?,
        event_type: D::text(r, 3)?,
        room_id: D::text(r, 4)?,
        envelope: D::bytes(r, 5)?,
        created_at_ms: D::int(r, 6)?,
        retry_count: counter(D::int(r, 7)?),
        trace_context: D::opt_text(r, context_at)?,
        lease,
        rescued,
    })
}

/// Decodes a row of a claim routine (PostgreSQL's function, MySQL's procedure): the claim
/// columns, then `was`, the status the row had before the claim.
pub(super) fn decode_routine_claimed<D: Dialect>(
    r: &<D::Db as Database>::Row,
    lease: Lease,
) -> Result<Claimed, sqlx::Error> {
    let was = D::text(r, CLAIMED_CONTEXT + 1)?;
    decode_claimed::<D>(r, lease, was == "delivering")
}

/// Whether the database broke a deadlock by failing this statement (MySQL's 1213,
/// PostgreSQL's 40P01): the transaction may simply be tried again.
pub(super) fn is_deadlock(e: &impl std::fmt::Display) -> bool {
    e.to_string().to_ascii_lowercase().contains("deadlock")
}

/// Runs `attempt` again while the database breaks it as a deadlock ([`is_deadlock`]), up to
/// ten times, pausing `pause` times the tries so far in between; any other outcome is
/// returned. Only for an attempt that is one transaction the database rolls back whole.
pub(super) async fn retrying_deadlocks<T, E, F, Fut>(pause: std::time::Duration, mut attempt: F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut tries = 0;
    loop {
        match attempt().await {
            Err(e) if tries < 10 && is_deadlock(&e) => tries += 1,
            done => return done,
        }
        tokio::time::sleep(pause * tries).await;
    }
}

/// Whether a DDL statement gave up waiting for its lock (`lock_timeout`, `lock_wait_timeout`).
pub(super) fn is_lock_timeout(e: &impl std::fmt::Display) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("lock timeout") || text.contains("lock wait timeout")
}

/// Runs one step of adopting a table. MySQL's `ALGORITHM=INSTANT`, where the server cannot
/// add these columns instantly, falls back to `INPLACE, LOCK=NONE` (inserts still go on).
pub(super) async fn add_online<D: Dialect>(
    conn: &mut <D::Db as Database>::Connection,
    step: &str,
) -> Result<(), StoreError>
where
    for<'c> &'c mut <D::Db as Database>::Connection: Executor<'c, Database = D::Db>,
{
    let failed = match Executor::execute(&mut *conn, step).await {
        Ok(_) => return Ok(()),
        // A transaction holds the table: the caller waits and tries again, as it would in place.
        Err(e) if is_lock_timeout(&e) => return Err(e.into()),
        Err(e) => e,
    };
    if let Some(fallback) = schema::mysql_fallback(step) {
        tracing::info!(error = %failed, "cannot add the columns instantly; adding them in place, inserts still allowed");
        if Executor::execute(&mut *conn, fallback.as_str()).await.is_ok() {
            return Ok(());
        }
    }
    Err(StoreError::Migration(format!("adopting the table: {step}: {failed}")))
}

/// Placeholders `first..first + count` of dialect `D`, comma-separated: `$3, $4` or `?, ?`.
pub(super) fn params<D: Dialect>(first: usize, count: usize) -> String {
    (first..first + count).map(D::param).collect::<Vec<_>>().join(", ")
}

/// ` WHERE status = 'failed' AND <filter>` with its parameter (if any) numbered from
/// `first`, and the value to bind.
pub(super) fn failed_filter<D: Dialect>(filter: &RetryFilter, first: usize) -> (String, Option<String>) {
    let p = D::param(first);
    match filter {
        RetryFilter::EventId(id) => (format!(" WHERE status = 'failed' AND event_id = {p}"), Some(id.clone())),
        RetryFilter::EventType(t) => (format!(" WHERE status = 'failed' AND event_type = {p}"), Some(t.clone())),
        RetryFilter::ErrorContains(text) => (
            format!(" WHERE status = 'failed' AND last_error LIKE {p} ESCAPE '!'"),
            Some(super::contains_pattern(text)),
        ),
        RetryFilter::ErrorIs(text) => (format!(" WHERE status = 'failed' AND last_error = {p}"), Some(text.clone())),
        RetryFilter::All => (" WHERE status = 'failed'".into(), None),
    }
}
