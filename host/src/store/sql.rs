//! The contract between the shared store and each database, and the shared store itself.
//!
//! [`Dialect`] is what a database module must provide: its migrations and lock, its claim,
//! and its way of writing failed outcomes and hand-backs under their leases. [`SqlStore`]
//! implements [`Store`] once for every dialect: the statements that read the same
//! everywhere are written once, with each database's own placeholders ([`Dialect::param`]).

use std::marker::PhantomData;

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use super::{
    Claimed, Lease, Mark, Minute, NewEvent, Outcome, ROW_COLUMNS, RetryFilter, Row, Stats, Status, Store, StoreError,
    now_ms,
};

/// What differs between databases. Everything else is [`SqlStore`]'s.
#[async_trait]
pub trait Dialect: Send + Sync + Sized + 'static {
    /// The sqlx database.
    type Db: Database;

    /// The dialect's own statements, built once per store ([`Dialect::statements`]).
    type Statements: Send + Sync + 'static;

    /// Builds the dialect's own statements for `table`.
    fn statements(table: &str) -> Self::Statements;

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
    async fn mark_delivered(_store: &SqlStore<Self>, _ids: &[i64], _now_ms: i64) -> Result<Option<u64>, StoreError> {
        Ok(None)
    }

    /// Writes `retryable`/`failed` outcomes (never `delivered`: the caller writes those),
    /// each only while its row is still `delivering` under its lease. Returns rows changed.
    async fn mark_failed(store: &SqlStore<Self>, marks: &[&Mark], now_ms: i64) -> Result<u64, StoreError>;

    /// Hands back unstarted rows to `pending` (a non-empty list), each only under its lease.
    async fn release_rows(store: &SqlStore<Self>, rows: &[(i64, Lease)], now_ms: i64) -> Result<u64, StoreError>;
}

/// Statements around applying migrations, run on one connection: `take` before (it may
/// begin a transaction), `keep` after success, `undo` after a failure.
pub struct MigrationLock {
    /// Taken before anything is read; when `checked`, it must return 1 (e.g. `GET_LOCK`).
    pub take: String,
    /// Whether `take` returns a value that must be 1.
    pub checked: bool,
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
struct SharedStatements {
    versions: String,
    delivered: ByCount,
    insert: ByCount,
    get: String,
    stats: [String; 3],
    last_minute: String,
    history: String,
    recent_failures: String,
    purge_pick: String,
    purge_delete: ByCount,
    has_pending: String,
}

impl SharedStatements {
    fn new<D: Dialect>(table: &str) -> Self {
        let t = table.to_string();
        let (p1, p2) = (D::param(1), D::param(2));
        SharedStatements {
            versions: format!("SELECT version FROM {t}_migrations"),
            delivered: ByCount::new({
                let t = t.clone();
                move |n| {
                    format!(
                        "UPDATE {t} SET status = 'delivered', last_error = NULL, worker_id = NULL, lock_until_ms = 0, \
                         updated_at_ms = {}, delivered_at_ms = {} WHERE status <> 'delivered' AND id IN ({})",
                        D::param(1),
                        D::param(2),
                        params::<D>(3, n),
                    )
                }
            }),
            insert: ByCount::new({
                let t = t.clone();
                move |n| {
                    let rows: Vec<String> = (0..n).map(|i| format!("({})", params::<D>(i * 7 + 1, 7))).collect();
                    format!(
                        "INSERT INTO {t} (app_code, event_id, event_type, room_id, status, envelope, created_at_ms) VALUES {}",
                        rows.join(", ")
                    )
                }
            }),
            get: format!("SELECT {ROW_COLUMNS} FROM {t} WHERE event_id = {p1}"),
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
                "SELECT {ROW_COLUMNS} FROM {t} WHERE status IN ('failed', 'retryable') \
                 ORDER BY updated_at_ms DESC, id DESC LIMIT {p1}"
            ),
            // Pick the ids first, then delete them: one bounded statement each, and the same
            // in every dialect (MySQL cannot delete from a subquery on its table).
            purge_pick: format!(
                "SELECT id FROM {t} WHERE status = 'delivered' AND updated_at_ms < {p1} ORDER BY id LIMIT {p2}"
            ),
            purge_delete: ByCount::new({
                let t = t.clone();
                move |n| format!("DELETE FROM {t} WHERE status = 'delivered' AND id IN ({})", params::<D>(1, n))
            }),
            has_pending: format!("SELECT id FROM {t} WHERE status = 'pending' LIMIT 1"),
        }
    }
}

/// The outbox table on database dialect `D`.
pub struct SqlStore<D: Dialect> {
    pub(super) pool: Pool<D::Db>,
    pub(super) table: String,
    /// The shared statements' text, built once.
    sql: SharedStatements,
    /// The dialect's own statements' text, built once.
    pub(super) own: D::Statements,
    inserted: std::sync::Arc<tokio::sync::Notify>,
    writes: tokio::sync::Mutex<()>,
    dialect: PhantomData<D>,
}

impl<D: Dialect> SqlStore<D> {
    /// A store over `pool` for `table`.
    pub(super) fn new(pool: Pool<D::Db>, table: &str) -> Self {
        SqlStore {
            pool,
            table: table.to_string(),
            sql: SharedStatements::new::<D>(table),
            own: D::statements(table),
            inserted: Default::default(),
            writes: tokio::sync::Mutex::new(()),
            dialect: PhantomData,
        }
    }

    /// Holds this process's other writes off while one runs, where the dialect wants that.
    async fn writing(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        if D::one_writer() { Some(self.writes.lock().await) } else { None }
    }
}

/// Decodes a whole [`Row`] (see [`ROW_COLUMNS`]); the column types agree across dialects.
pub(super) fn decode_row<R: sqlx::Row>(r: &R) -> Result<Row, sqlx::Error>
where
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i32: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    let status: String = r.try_get("status")?;
    Ok(Row {
        id: r.try_get("id")?,
        app_code: r.try_get("app_code")?,
        event_id: r.try_get("event_id")?,
        event_type: r.try_get("event_type")?,
        room_id: r.try_get("room_id")?,
        status: Status::parse(&status)
            .ok_or_else(|| sqlx::Error::Decode(format!("unknown status {status:?}").into()))?,
        envelope: r.try_get("envelope")?,
        created_at_ms: r.try_get("created_at_ms")?,
        retry_count: r.try_get("retry_count")?,
        last_error: r.try_get("last_error")?,
        worker_id: r.try_get("worker_id")?,
        lock_until_ms: r.try_get("lock_until_ms")?,
        next_retry_at_ms: r.try_get("next_retry_at_ms")?,
        updated_at_ms: r.try_get("updated_at_ms")?,
        delivered_at_ms: r.try_get("delivered_at_ms")?,
    })
}

/// Decodes a claimed row held under `lease`, by position: [`super::CLAIM_COLUMNS`] in
/// their order (a `CALL`'s prepared statement on MySQL describes no columns, so names
/// would find none). `rescued` says the row was taken over from an expired lease.
pub(super) fn decode_claimed<R: sqlx::Row>(r: &R, lease: Lease, rescued: bool) -> Result<Claimed, sqlx::Error>
where
    usize: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i32: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(Claimed {
        id: r.try_get(0)?,
        app_code: r.try_get(1)?,
        event_id: r.try_get(2)?,
        event_type: r.try_get(3)?,
        room_id: r.try_get(4)?,
        envelope: r.try_get(5)?,
        created_at_ms: r.try_get(6)?,
        retry_count: r.try_get(7)?,
        lease,
        rescued,
    })
}

/// Decodes a row of a claim routine (PostgreSQL's function, MySQL's procedure):
/// [`super::CLAIM_COLUMNS`], then `was`, the status the row had before the claim.
pub(super) fn decode_routine_claimed<R: sqlx::Row>(r: &R, lease: Lease) -> Result<Claimed, sqlx::Error>
where
    usize: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i32: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    let was: String = r.try_get(8)?;
    decode_claimed(r, lease, was == "delivering")
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
    for<'r> (String, i64): FromRow<'r, <D::Db as Database>::Row>,
    for<'r> (i64, i64, i64): FromRow<'r, <D::Db as Database>::Row>,
{
    async fn migrate(&self) -> Result<(), StoreError> {
        // Up to date: no DDL, so a host whose user may only read and write rows can start.
        let applied: Result<Vec<i64>, _> = sqlx::query_scalar(&self.sql.versions).fetch_all(&self.pool).await;
        if applied.is_ok_and(|v| super::migrate::up_to_date(D::migrator(), &v)) {
            return Ok(());
        }
        // Apply what is not recorded yet, holding the dialect's migration lock.
        let lock = D::migration_lock(&self.table);
        let mut conn = self.pool.acquire().await?;
        if lock.checked {
            let got: Option<i64> = sqlx::query_scalar(&lock.take).fetch_one(&mut *conn).await?;
            if got != Some(1) {
                return Err(StoreError::Migration(format!("could not take the lock {:?}", lock.take)));
            }
        } else {
            Executor::execute(&mut *conn, lock.take.as_str()).await?;
        }
        let applied: Result<(), StoreError> = async {
            let t = &self.table;
            let create = format!(
                "CREATE TABLE IF NOT EXISTS {t}_migrations \
                 (version BIGINT PRIMARY KEY, description VARCHAR(255) NOT NULL, applied_at_ms BIGINT NOT NULL)"
            );
            sqlx::query(&create).execute(&mut *conn).await?;
            let check = format!("SELECT version FROM {t}_migrations WHERE version = {}", D::param(1));
            let record = format!(
                "INSERT INTO {t}_migrations (version, description, applied_at_ms) VALUES ({})",
                params::<D>(1, 3)
            );
            for step in super::migrate::steps(D::migrator(), t) {
                let done: Option<i64> =
                    sqlx::query_scalar(&check).bind(step.version).fetch_optional(&mut *conn).await?;
                if done.is_some() {
                    continue;
                }
                Executor::execute(&mut *conn, step.sql.as_str())
                    .await
                    .map_err(|e| StoreError::Migration(format!("{} {}: {e}", step.version, step.description)))?;
                sqlx::query(&record)
                    .bind(step.version)
                    .bind(step.description.clone())
                    .bind(now_ms())
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(())
        }
        .await;
        let end = if applied.is_ok() { &lock.keep } else { &lock.undo };
        Executor::execute(&mut *conn, end.as_str()).await?;
        applied
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
        let delivered: Vec<i64> = marks.iter().filter(|m| m.outcome == Outcome::Delivered).map(|m| m.id).collect();
        // Delivered wins: any row not yet delivered, whoever holds it.
        if let Some(n) = D::mark_delivered(self, &delivered, now_ms).await? {
            changed += n;
        } else if !delivered.is_empty() {
            let sql = self.sql.delivered.get(delivered.len());
            let mut q = sqlx::query(&sql).bind(now_ms).bind(now_ms);
            for id in &delivered {
                q = q.bind(*id);
            }
            changed += D::rows_affected(&q.execute(&self.pool).await?);
        }
        let failed: Vec<&Mark> = marks.iter().filter(|m| m.outcome != Outcome::Delivered).collect();
        if !failed.is_empty() {
            changed += D::mark_failed(self, &failed, now_ms).await?;
        }
        Ok(changed)
    }

    async fn release(&self, rows: &[(i64, Lease)], now_ms: i64) -> Result<u64, StoreError> {
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
        Ok(row.as_ref().map(decode_row).transpose()?)
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        let [counts, oldest, errors] = &self.sql.stats;
        let counts: Vec<(String, i64)> = sqlx::query_as(counts).fetch_all(&self.pool).await?;
        let oldest: Option<i64> = sqlx::query_scalar(oldest).fetch_one(&self.pool).await?;
        let errors: Vec<(String, i64)> = sqlx::query_as(errors).fetch_all(&self.pool).await?;
        let last_minute: i64 =
            sqlx::query_scalar(&self.sql.last_minute).bind(now_ms() - 60_000).fetch_one(&self.pool).await?;
        Ok(super::stats_from(counts, oldest, errors, last_minute))
    }

    async fn history(&self, since_ms: i64) -> Result<Vec<Minute>, StoreError> {
        let rows: Vec<(i64, i64, i64)> =
            sqlx::query_as(&self.sql.history).bind(since_ms).bind(since_ms).fetch_all(&self.pool).await?;
        Ok(rows.into_iter().map(|(start_ms, delivered, failed)| Minute { start_ms, delivered, failed }).collect())
    }

    async fn recent_failures(&self, limit: u32) -> Result<Vec<Row>, StoreError> {
        let rows = sqlx::query(&self.sql.recent_failures).bind(i64::from(limit)).fetch_all(&self.pool).await?;
        Ok(rows.iter().map(decode_row).collect::<Result<_, _>>()?)
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
        let sql = format!(
            "UPDATE {} SET status = 'pending', retry_count = 0, next_retry_at_ms = 0, worker_id = NULL, \
             lock_until_ms = 0, updated_at_ms = {}{filter}",
            self.table,
            D::param(1)
        );
        let mut q = sqlx::query(&sql).bind(now_ms);
        if let Some(value) = value {
            q = q.bind(value);
        }
        Ok(D::rows_affected(&q.execute(&self.pool).await?))
    }

    async fn purge_delivered(&self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let ids: Vec<i64> = sqlx::query_scalar(&self.sql.purge_pick)
            .bind(before_ms)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        if ids.is_empty() {
            return Ok(0);
        }
        let delete = self.sql.purge_delete.get(ids.len());
        let mut q = sqlx::query(&delete);
        for id in &ids {
            q = q.bind(*id);
        }
        Ok(D::rows_affected(&q.execute(&self.pool).await?))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn has_pending(&self) -> Result<bool, StoreError> {
        let found: Option<i64> = sqlx::query_scalar(&self.sql.has_pending).fetch_optional(&self.pool).await?;
        Ok(found.is_some())
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
}
