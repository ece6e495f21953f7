//! The contract between the shared store and each database, and the shared store itself.
//!
//! [`Dialect`] is what a database module must provide: its migrations and lock, its claim,
//! and its way of writing failed outcomes and hand-backs under their leases. [`SqlStore`]
//! implements [`Store`] once for every dialect: the statements that read the same
//! everywhere are written once, with each database's own placeholders ([`Dialect::param`]).

use std::marker::PhantomData;

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Type};

use super::schema::{self, Profile, TableInfo};
use super::{
    Backend, Claimed, Held, Lease, Mark, Minute, NewEvent, Outcome, RetryFilter, Row, Stats, Status, Store, StoreError,
    now_ms,
};

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
    fn migration_lock(table: &str) -> MigrationLock;

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

/// Statements around applying migrations, run on one connection: `take` before (it may
/// begin a transaction), `keep` after success, `undo` after a failure.
pub struct MigrationLock {
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

/// The statements [`SqlStore`] runs the same way on every database, with the dialect's
/// placeholders, built once per store.
pub(super) struct SharedStatements {
    pub(super) delivered: ByCount,
    insert: ByCount,
    get: String,
    stats: [String; 3],
    last_minute: String,
    history: String,
    recent_failures: String,
    purge_pick: String,
    purge_delete: ByCount,
    has_pending: String,
    /// An operator's retry, before its filter.
    retry_set: String,
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
            // Pick the ids first, then delete them: one bounded statement each, and the same
            // in every dialect (MySQL cannot delete from a subquery on its table).
            // A row delivered by its producer's own publish may never have had updated_at_ms
            // set (a table adopted from elsewhere defaults it to 0): it is at least as young
            // as its created_at_ms.
            // An outbox row another sink still needs stays: one not yet copied to their tables,
            // or one a sink's back-fill has still to copy (the DELETE says so again, under the
            // registry's lock, so that a sink registered after the pick is seen).
            purge_pick: format!(
                "SELECT {key} FROM {t} WHERE status = 'delivered' AND updated_at_ms < {p1} AND created_at_ms < {p2}{} \
                 ORDER BY {key} LIMIT {}",
                if outbox { still_needed_elsewhere(&t) } else { String::new() },
                D::param(3)
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

/// ` AND …`: an outbox row no other sink still needs. Each sink beside the first either has
/// its copy (the row is fanned out, and the sink's back-fill of the rows fanned out before
/// it came is complete) or started after the row was created.
fn still_needed_elsewhere(t: &str) -> String {
    format!(
        " AND NOT EXISTS (SELECT 1 FROM {t}_sinks s WHERE s.sink_table <> '{t}' AND s.start_from_ms <= {t}.created_at_ms \
         AND ({t}.fanned_out_at_ms = 0 OR s.backfilled_at_ms IS NULL))"
    )
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
    /// The registry's and the fan-out's statements, built once.
    pub(super) fan_out: super::sinks::FanOutStatements,
    inserted: std::sync::Arc<tokio::sync::Notify>,
    /// Shared with the stores of the sinks' own tables on the same pool.
    writes: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// The outbox this table keeps a sink's copy of (`<outbox>__<sink>`), if it is one.
    pub(super) copy_of: Option<String>,
    /// The partition count whose index this table is known to have (0: none known).
    pub(super) indexed_partitions: std::sync::Arc<std::sync::atomic::AtomicU32>,
    dialect: PhantomData<D>,
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
            fan_out: super::sinks::FanOutStatements::new::<D>(table, &profile),
            profile,
            inserted: Default::default(),
            writes: Default::default(),
            copy_of: None,
            indexed_partitions: Default::default(),
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
            fan_out: super::sinks::FanOutStatements::new::<D>(table, &profile),
            profile,
            inserted: Default::default(),
            writes: self.writes.clone(),
            copy_of: Some(self.table.clone()),
            indexed_partitions: Default::default(),
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
            fan_out: super::sinks::FanOutStatements::new::<D>(&self.table, &profile),
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
    Ok(Claimed {
        id: D::int(r, 0)?,
        app_code: D::text(r, 1)?,
        event_id: D::text(r, 2)?,
        event_type: D::text(r, 3)?,
        room_id: D::text(r, 4)?,
        envelope: D::bytes(r, 5)?,
        created_at_ms: D::int(r, 6)?,
        retry_count: counter(D::int(r, 7)?),
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
    let was = D::text(r, 8)?;
    decode_claimed::<D>(r, lease, was == "delivering")
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
fn failed_filter<D: Dialect>(filter: &RetryFilter, first: usize) -> (String, Option<String>) {
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

// The bounds below say what the shared statements need of a database: sqlx's executors and
// argument buffers, and the column types the outbox uses. Every dialect here has them; Rust
// does not carry such bounds along with `Dialect`, so they are spelled out here.

#[async_trait]
impl<D> Store for SqlStore<D>
where
    D: Dialect,
    for<'c> &'c mut <D::Db as Database>::Connection: Executor<'c, Database = D::Db>,
    for<'q> <D::Db as Database>::Arguments<'q>: IntoArguments<'q, D::Db>,
    for<'a> &'a str: ColumnIndex<<D::Db as Database>::Row>,
    usize: ColumnIndex<<D::Db as Database>::Row>,
    for<'r> i64: Encode<'r, D::Db> + Decode<'r, D::Db> + Type<D::Db>,
    for<'r> i32: Decode<'r, D::Db> + Type<D::Db>,
    for<'r> String: Encode<'r, D::Db> + Decode<'r, D::Db> + Type<D::Db>,
    for<'r> Vec<u8>: Encode<'r, D::Db> + Decode<'r, D::Db> + Type<D::Db>,
    for<'r> &'r str: Encode<'r, D::Db> + Type<D::Db>,
{
    async fn migrate(&self) -> Result<super::Migrated, StoreError> {
        if self.schema_current().await? {
            return Ok(super::Migrated::default());
        }
        // Apply what is not recorded yet, holding the dialect's migration lock.
        self.holding_migration_lock(super::runner::Job::Migrate).await
    }

    fn backend(&self) -> Backend {
        D::BACKEND
    }

    fn table(&self) -> &str {
        &self.table
    }

    async fn describe(&self) -> Result<Option<TableInfo>, StoreError> {
        self.describe_on(&mut *self.pool.acquire().await?).await
    }

    async fn claim(
        &self,
        worker_id: &str,
        now_ms: i64,
        lock_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<Claimed>, StoreError> {
        let _writing = self.writing().await;
        D::claim_rows(self, worker_id, now_ms, lock_until_ms, limit).await
    }

    async fn mark(&self, marks: &[Mark], now_ms: i64) -> Result<u64, StoreError> {
        let _writing = self.writing().await;
        let mut changed = 0;
        // One write per build of the sink that produced the outcomes: one, unless a reload
        // happened between them.
        let mut digests: Vec<Option<&str>> = marks.iter().map(|m| m.plugin_digest.as_deref()).collect();
        digests.sort_unstable();
        digests.dedup();
        for digest in digests {
            let ours = |m: &&Mark| m.plugin_digest.as_deref() == digest;
            let delivered: Vec<&Mark> = marks.iter().filter(|m| m.outcome == Outcome::Delivered).filter(ours).collect();
            // Delivered wins: any row not yet delivered, whoever holds it.
            if let Some(n) = D::mark_delivered(self, &delivered, now_ms).await? {
                changed += n;
            } else if !delivered.is_empty() {
                let sql = self.sql.delivered.get(delivered.len());
                let mut q = sqlx::query(&sql).bind(now_ms).bind(now_ms).bind(digest.unwrap_or("").to_string());
                for m in &delivered {
                    q = if self.profile.key.is_text() { q.bind(m.event_id.as_str()) } else { q.bind(m.id) };
                }
                changed += D::rows_affected(&q.execute(&self.pool).await?);
            }
            let failed: Vec<&Mark> = marks.iter().filter(|m| m.outcome != Outcome::Delivered).filter(ours).collect();
            if !failed.is_empty() {
                changed += D::mark_failed(self, &failed, now_ms).await?;
            }
        }
        Ok(changed)
    }

    async fn release(&self, rows: &[Held], now_ms: i64) -> Result<u64, StoreError> {
        if rows.is_empty() {
            return Ok(0);
        }
        let _writing = self.writing().await;
        D::release_rows(self, rows, now_ms).await
    }

    async fn insert(&self, events: &[NewEvent]) -> Result<(), StoreError> {
        let _writing = self.writing().await;
        let mut tx = self.pool.begin().await?;
        // Several rows per statement; a clash names the event when it can.
        for chunk in events.chunks(super::INSERT_CHUNK) {
            let sql = self.sql.insert.get(chunk.len());
            let mut q = sqlx::query(&sql);
            for e in chunk {
                q = q
                    .bind(e.app_code.clone())
                    .bind(e.event_id.clone())
                    .bind(e.event_type.clone())
                    .bind(e.room_id.clone())
                    .bind(e.status.as_str().to_string())
                    .bind(e.envelope.clone())
                    .bind(e.created_at_ms);
            }
            let named = match chunk {
                [one] => one.event_id.clone(),
                [first, .., last] => format!("(one of {} … {})", first.event_id, last.event_id),
                [] => String::new(),
            };
            q.execute(&mut *tx).await.map_err(|err| super::name_duplicate(err, &named))?;
        }
        tx.commit().await?;
        self.inserted.notify_one();
        Ok(())
    }

    async fn get(&self, event_id: &str) -> Result<Option<Row>, StoreError> {
        let row = sqlx::query(&self.sql.get).bind(event_id.to_string()).fetch_optional(&self.pool).await?;
        Ok(row.as_ref().map(decode_row::<D>).transpose()?)
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        let [counts, oldest, errors] = &self.sql.stats;
        let pairs = |rows: Vec<<D::Db as Database>::Row>| -> Result<Vec<(String, i64)>, sqlx::Error> {
            rows.iter().map(|r| Ok((D::text(r, 0)?, D::int(r, 1)?))).collect()
        };
        let counts = pairs(sqlx::query(counts).fetch_all(&self.pool).await?)?;
        let oldest = D::opt_int(&sqlx::query(oldest).fetch_one(&self.pool).await?, 0)?;
        let errors = pairs(sqlx::query(errors).fetch_all(&self.pool).await?)?;
        let last_minute: i64 =
            sqlx::query_scalar(&self.sql.last_minute).bind(now_ms() - 60_000).fetch_one(&self.pool).await?;
        Ok(super::stats_from(counts, oldest, errors, last_minute))
    }

    async fn history(&self, since_ms: i64) -> Result<Vec<Minute>, StoreError> {
        let rows = sqlx::query(&self.sql.history).bind(since_ms).bind(since_ms).fetch_all(&self.pool).await?;
        let minute = |r: &<D::Db as Database>::Row| -> Result<Minute, sqlx::Error> {
            Ok(Minute { start_ms: D::int(r, 0)?, delivered: D::int(r, 1)?, failed: D::int(r, 2)? })
        };
        Ok(rows.iter().map(minute).collect::<Result<_, _>>()?)
    }

    async fn recent_failures(&self, limit: u32) -> Result<Vec<Row>, StoreError> {
        let rows = sqlx::query(&self.sql.recent_failures).bind(i64::from(limit)).fetch_all(&self.pool).await?;
        Ok(rows.iter().map(decode_row::<D>).collect::<Result<_, _>>()?)
    }

    async fn count_failed(&self, filter: &RetryFilter) -> Result<i64, StoreError> {
        let (filter, value) = failed_filter::<D>(filter, 1);
        let sql = format!("SELECT COUNT(*) FROM {}{filter}", self.table);
        let mut q = sqlx::query_scalar(&sql);
        if let Some(value) = value {
            q = q.bind(value);
        }
        Ok(q.fetch_one(&self.pool).await?)
    }

    async fn retry_failed(&self, filter: &RetryFilter, now_ms: i64) -> Result<u64, StoreError> {
        let (filter, value) = failed_filter::<D>(filter, 2);
        let sql = format!("{}{filter}", self.sql.retry_set);
        let mut q = sqlx::query(&sql).bind(now_ms);
        if let Some(value) = value {
            q = q.bind(value);
        }
        Ok(D::rows_affected(&q.execute(&self.pool).await?))
    }

    async fn purge_delivered(&self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let picked = sqlx::query(&self.sql.purge_pick)
            .bind(before_ms)
            .bind(before_ms)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        if picked.is_empty() {
            return Ok(0);
        }
        let delete = self.sql.purge_delete.get(picked.len());
        let mut q = sqlx::query(&delete);
        for row in &picked {
            q = if self.profile.key.is_text() { q.bind(D::text(row, 0)?) } else { q.bind(D::int(row, 0)?) };
        }
        if self.copy_of.is_some() {
            return Ok(D::rows_affected(&q.execute(&self.pool).await?));
        }
        // The outbox: under the registry's lock, so that a sink registered meanwhile either
        // is seen by the DELETE's own check or comes after the rows are gone.
        let _writing = self.writing().await;
        let mut conn = self.pool.acquire().await?;
        self.lock_registry(&mut conn).await?;
        let deleted = q.execute(&mut *conn).await;
        self.unlock_registry(&mut conn, deleted.is_ok()).await?;
        Ok(D::rows_affected(&deleted?))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn clock_ms(&self) -> Result<i64, StoreError> {
        match D::clock_sql() {
            None => Ok(now_ms()),
            Some(sql) => Ok(D::int(&sqlx::query(sql).fetch_one(&self.pool).await?, 0)?),
        }
    }

    async fn has_pending(&self) -> Result<bool, StoreError> {
        Ok(sqlx::query(&self.sql.has_pending).fetch_optional(&self.pool).await?.is_some())
    }

    fn inserted(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.inserted.clone()
    }

    fn listen_for_inserts(
        &self,
        wake: std::sync::Arc<tokio::sync::Notify>,
        stop: tokio_util::sync::CancellationToken,
    ) -> bool {
        D::listen_for_inserts(self, wake, stop)
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    async fn sinks(&self) -> Result<Vec<super::RegisteredSink>, StoreError> {
        self.registered_sinks().await
    }

    async fn register_sink(
        &self,
        name: &str,
        start_from_ms: i64,
        may_be_first: bool,
        now_ms: i64,
    ) -> Result<super::RegisteredSink, StoreError> {
        let sink = self.register(name, start_from_ms, may_be_first, now_ms).await?;
        if !sink.is_first(&self.table) {
            self.sink_copy(&sink.table).migrate().await?;
            self.match_copied_types(&sink.table).await?;
            if !self.fanout_index_ok().await? {
                self.holding_migration_lock(super::runner::Job::FanOutIndex).await?;
            }
        }
        Ok(sink)
    }

    async fn sink_store(
        self: std::sync::Arc<Self>,
        sink: &super::RegisteredSink,
    ) -> Result<std::sync::Arc<dyn Store>, StoreError> {
        if sink.is_first(&self.table) {
            return Ok(self);
        }
        Ok(std::sync::Arc::new(self.sink_copy(&sink.table)))
    }

    async fn fan_out(&self, limit: u32, now_ms: i64) -> Result<u64, StoreError> {
        self.fan_out_rows(limit, now_ms).await
    }

    async fn backfill(
        &self,
        sink: &super::RegisteredSink,
        after: Option<super::KeyValue>,
        limit: u32,
    ) -> Result<super::Step, StoreError> {
        self.backfill_step(sink, after, limit).await
    }

    async fn finish_backfill(&self, name: &str, now_ms: i64) -> Result<(), StoreError> {
        SqlStore::finish_backfill(self, name, now_ms).await
    }

    async fn count_replayable(&self, filter: &super::ReplayFilter) -> Result<i64, StoreError> {
        let (conditions, values) = filter.conditions("", D::param, 1);
        let sql = format!("SELECT COUNT(*) FROM {} WHERE status IN ('delivered', 'failed'){conditions}", self.table);
        let mut q = sqlx::query(&sql).bind(filter.from_ms).bind(filter.to_ms.unwrap_or(i64::MAX));
        for value in values {
            q = q.bind(value);
        }
        Ok(D::int(&q.fetch_one(&self.pool).await?, 0)?)
    }

    async fn replay(
        &self,
        filter: &super::ReplayFilter,
        now_ms: i64,
        after: Option<super::KeyValue>,
        limit: u32,
    ) -> Result<super::Step, StoreError> {
        let key = self.profile.key.column();
        let (conditions, values) = filter.conditions("", D::param, 1);
        let next = 3 + values.len();
        let pick = format!(
            "SELECT {key} FROM {} WHERE status IN ('delivered', 'failed'){conditions} AND {key} > {} ORDER BY {key} LIMIT {}",
            self.table,
            D::param(next),
            D::param(next + 1)
        );
        let mut q = sqlx::query(&pick).bind(filter.from_ms).bind(filter.to_ms.unwrap_or(i64::MAX));
        for value in values {
            q = q.bind(value);
        }
        let after = after.unwrap_or(super::KeyValue::first(self.profile.key));
        let picked = super::sinks::bind_key::<D>(q, &after).bind(i64::from(limit)).fetch_all(&self.pool).await?;
        let keys = picked.iter().map(|r| self.key_of(r)).collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Ok(super::Step { rows: 0, next: None });
        }
        let _writing = self.writing().await;
        let update = format!(
            "{} WHERE status IN ('delivered', 'failed') AND {key} IN ({})",
            self.sql.retry_set,
            params::<D>(2, keys.len())
        );
        let mut q = sqlx::query(&update).bind(now_ms);
        for k in &keys {
            q = super::sinks::bind_key::<D>(q, k);
        }
        let rows = D::rows_affected(&q.execute(&self.pool).await?);
        Ok(super::Step { rows, next: if keys.len() < limit as usize { None } else { keys.last().cloned() } })
    }

    async fn count_recopy(
        &self,
        sink: &super::RegisteredSink,
        filter: &super::ReplayFilter,
    ) -> Result<i64, StoreError> {
        self.count_missing(sink, filter).await
    }

    async fn recopy(
        &self,
        sink: &super::RegisteredSink,
        filter: &super::ReplayFilter,
        after: Option<super::KeyValue>,
        limit: u32,
    ) -> Result<super::Step, StoreError> {
        self.recopy_step(sink, filter, after, limit).await
    }

    async fn keep_partitions(&self, beat: &super::Heartbeat<'_>) -> Result<super::Holding, StoreError> {
        self.heartbeat(beat).await
    }

    async fn read_owned(&self, read: &super::OwnedRead<'_>) -> Result<super::Page, StoreError> {
        self.read_waiting(read).await
    }

    async fn index_partitions(&self, total: u32) -> Result<bool, StoreError> {
        self.partition_index(total).await
    }

    async fn failed_rooms(&self, rooms: &[(String, String)]) -> Result<Vec<(String, String, i64)>, StoreError> {
        self.failed_in(rooms).await
    }

    async fn mark_owned(&self, owner: &str, marks: &[Mark], now_ms: i64) -> Result<(u64, Vec<usize>), StoreError> {
        self.mark_fenced(owner, marks, now_ms).await
    }

    async fn leave_partitions(&self, owner: &str) -> Result<(), StoreError> {
        self.leave(owner).await
    }

    async fn partition_owners(&self, now_ms: i64) -> Result<Vec<super::OwnerView>, StoreError> {
        self.owners(now_ms).await
    }

    async fn set_partitions(&self, total: u32, now_ms: i64) -> Result<Result<u32, Vec<String>>, StoreError> {
        self.set_partition_count(total, now_ms).await
    }
}
