//! PostgreSQL. A claim is one round trip: the function `<table>_claim` (a routine) runs a
//! `FOR UPDATE SKIP LOCKED` pick in a CTE and an `UPDATE … RETURNING`, so concurrent
//! claimers skip each other's rows, with planner settings of its own that keep the pick on
//! the claim index. Outcomes of a whole batch are
//! written with one statement per kind, passing arrays.
//!
//! Everything PostgreSQL spells its own way is here: the claim and outcome statements, the
//! migration and registry locks (advisory locks), the partition hash (`hashtextextended`)
//! and the partition index an owner reads by, the row comparison a read seeks past a cursor
//! with, the planner settings that keep a read in its index's order, and the catalog
//! queries behind online index builds (`CONCURRENTLY`) and the lock-holder report; and what
//! adopting a table says in PostgreSQL's words ([`DDL`]: its types, the fix and add statements,
//! the routines kept beside a table).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Postgres;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgListener;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use sqlx::postgres::PgRow;
use sqlx::{Column as _, Row as _, TypeInfo as _};

use super::schema::{self, Ddl, Profile};
use super::sql::{Dialect, Lock, SqlStore, decode_routine_claimed};
use super::{Backend, CLAIM_COLUMNS, Claimed, Held, Lease, Mark, StoreError};

/// The longest wait between attempts to listen again.
const MAX_LISTEN_BACKOFF: Duration = Duration::from_secs(5);

/// PostgreSQL's [`Dialect`].
pub struct PostgresDialect;

/// The PostgreSQL backend.
pub type PostgresStore = SqlStore<PostgresDialect>;

impl PostgresStore {
    /// Connects to a `postgres://` URL (the schema is the connection's `search_path`).
    pub async fn connect(url: &str, max_connections: u32, table: &str) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(super::ACQUIRE_TIMEOUT)
            .connect(url)
            .await
            .map_err(|e| super::unreachable_error(url, e))?;
        Ok(SqlStore::new(pool, table))
    }
}

#[async_trait]
impl Dialect for PostgresDialect {
    type Db = Postgres;
    type Statements = Statements;

    const BACKEND: Backend = Backend::Postgres;

    fn statements(table: &str, profile: &Profile) -> Statements {
        let t = table;
        let (key, no_worker, no_error) = (profile.key.column(), profile.no_worker, profile.no_error);
        let keys = if profile.key.is_text() { "TEXT[]" } else { "BIGINT[]" };
        Statements {
            claim: format!("SELECT id, {CLAIM_COLUMNS}, was FROM {t}_claim($1, $2, $3, $4)"),
            delivered: format!(
                "UPDATE {t} SET status = 'delivered', last_error = {no_error}, worker_id = {no_worker}, lock_until_ms = 0, \
                 updated_at_ms = $1, delivered_at_ms = $1, plugin_digest = $3 \
                 WHERE status <> 'delivered' AND {key} = ANY($2::{keys})"
            ),
            failed: format!(
                "UPDATE {t} AS o SET status = m.status, retry_count = o.retry_count + m.counted, last_error = m.error, \
                 next_retry_at_ms = m.next_retry_at_ms, worker_id = {no_worker}, lock_until_ms = 0, updated_at_ms = $8, \
                 plugin_digest = $9 \
                 FROM UNNEST($1::{keys}, $2::TEXT[], $3::BIGINT[], $4::TEXT[], $5::TEXT[], $6::BIGINT[], $7::INT4[]) \
                      AS m(k, worker_id, lock_until_ms, status, error, next_retry_at_ms, counted) \
                 WHERE o.{key} = m.k AND o.status = 'delivering' AND o.worker_id = m.worker_id AND o.lock_until_ms = m.lock_until_ms"
            ),
            release: format!(
                "UPDATE {t} AS o SET status = 'pending', worker_id = {no_worker}, lock_until_ms = 0, updated_at_ms = $4 \
                 FROM UNNEST($1::{keys}, $2::TEXT[], $3::BIGINT[]) AS m(k, worker_id, lock_until_ms) \
                 WHERE o.{key} = m.k AND o.status = 'delivering' AND o.worker_id = m.worker_id AND o.lock_until_ms = m.lock_until_ms"
            ),
        }
    }

    fn describe_sql(table: &str) -> [String; 2] {
        [
            format!(
                "SELECT a.attname::TEXT, format_type(a.atttypid, a.atttypmod), CASE WHEN a.attnotnull THEN 0 ELSE 1 END::INT8 \
                 FROM pg_attribute a WHERE a.attrelid = to_regclass('{table}') AND a.attnum > 0 AND NOT a.attisdropped \
                 ORDER BY a.attnum"
            ),
            format!(
                "SELECT i.relname::TEXT, CASE WHEN x.indisunique THEN 1 ELSE 0 END::INT8, a.attname::TEXT \
                 FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid \
                 CROSS JOIN LATERAL unnest(x.indkey::INT2[]) WITH ORDINALITY AS k(attnum, n) \
                 JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum \
                 WHERE x.indrelid = to_regclass('{table}') AND x.indisvalid ORDER BY i.relname, k.n"
            ),
        ]
    }

    fn int(row: &PgRow, i: usize) -> Result<i64, sqlx::Error> {
        match row.try_column(i)?.type_info().name() {
            "INT4" => row.try_get::<i32, _>(i).map(i64::from),
            "INT2" => row.try_get::<i16, _>(i).map(i64::from),
            _ => row.try_get(i),
        }
    }

    fn opt_int(row: &PgRow, i: usize) -> Result<Option<i64>, sqlx::Error> {
        match row.try_column(i)?.type_info().name() {
            "INT4" => row.try_get::<Option<i32>, _>(i).map(|n| n.map(i64::from)),
            "INT2" => row.try_get::<Option<i16>, _>(i).map(|n| n.map(i64::from)),
            _ => row.try_get(i),
        }
    }

    fn text(row: &PgRow, i: usize) -> Result<String, sqlx::Error> {
        row.try_get(i)
    }

    fn opt_text(row: &PgRow, i: usize) -> Result<Option<String>, sqlx::Error> {
        row.try_get(i)
    }

    fn bytes(row: &PgRow, i: usize) -> Result<Vec<u8>, sqlx::Error> {
        row.try_get(i)
    }

    fn param(n: usize) -> String {
        format!("${n}")
    }

    fn rows_affected(result: &sqlx::postgres::PgQueryResult) -> u64 {
        result.rows_affected()
    }

    fn migrator() -> &'static Migrator {
        &super::migrate::POSTGRES
    }

    fn listen_for_inserts(store: &PostgresStore, wake: Arc<Notify>, stop: CancellationToken) -> bool {
        let (pool, channel) = (store.pool.clone(), format!("{}_insert", store.table));
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(100);
            while !stop.is_cancelled() {
                let mut listener = match PgListener::connect_with(&pool).await {
                    Ok(listener) => listener,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot LISTEN for inserts; polling meanwhile");
                        tokio::select! { () = tokio::time::sleep(backoff) => {}, () = stop.cancelled() => return }
                        backoff = (backoff * 2).min(MAX_LISTEN_BACKOFF);
                        continue;
                    }
                };
                if let Err(e) = listener.listen(&channel).await {
                    tracing::warn!(error = %e, channel, "LISTEN failed; polling meanwhile");
                    tokio::select! { () = tokio::time::sleep(backoff) => {}, () = stop.cancelled() => return }
                    backoff = (backoff * 2).min(MAX_LISTEN_BACKOFF);
                    continue;
                }
                tracing::debug!(channel, "listening for inserts");
                // Anything inserted while no connection listened went unheard.
                wake.notify_one();
                backoff = Duration::from_millis(100);
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        heard = listener.try_recv() => match heard {
                            Ok(Some(_)) => wake.notify_one(),
                            // The connection was lost: listen again on a new one.
                            Ok(None) => break,
                            Err(sqlx::Error::PoolClosed) => return,
                            Err(e) => {
                                tracing::warn!(error = %e, "lost the LISTEN connection; reconnecting, polling meanwhile");
                                break;
                            }
                        },
                    }
                }
            }
        });
        true
    }

    fn clock_sql() -> Option<&'static str> {
        Some("SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::INT8")
    }

    fn migration_lock(table: &str) -> Lock {
        // Serialise concurrent starters on this table's migrations. A session lock, not a
        // transaction: adopting a table builds indexes CONCURRENTLY, which no transaction
        // may hold. Tried, not waited for: a statement waiting for the lock holds a snapshot,
        // which the holder's CONCURRENTLY build would wait for in turn (a deadlock).
        let lock = format!("hashtext(current_schema() || '.{table}_migrations')");
        Lock {
            take: format!("SELECT CASE WHEN pg_try_advisory_lock({lock}) THEN 1 ELSE 0 END::INT8"),
            checked: true,
            polled: true,
            keep: format!("SELECT pg_advisory_unlock({lock})"),
            undo: format!("SELECT pg_advisory_unlock({lock})"),
        }
    }

    fn registry_lock(table: &str) -> Lock {
        let lock = format!("SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.{table}_fanout'))");
        Lock {
            take: format!("BEGIN ISOLATION LEVEL READ COMMITTED; {lock}"),
            checked: false,
            polled: false,
            keep: "COMMIT".into(),
            undo: "ROLLBACK".into(),
        }
    }

    fn ddl_lock_timeout(ms: u64) -> Option<[String; 2]> {
        Some([format!("SET lock_timeout = {ms}"), "RESET lock_timeout".into()])
    }

    fn lock_holders_sql(table: &str) -> Option<String> {
        Some(format!(
            "SELECT DISTINCT a.pid::TEXT || ' (' || COALESCE(a.state, '?') || ', transaction open ' || \
             COALESCE(EXTRACT(EPOCH FROM now() - a.xact_start)::BIGINT::TEXT, '?') || ' s)' \
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.relation = to_regclass('{table}') AND a.pid <> pg_backend_pid()"
        ))
    }

    fn index_sql(table: &str, name: &str) -> String {
        format!(
            "SELECT CASE WHEN x.indisvalid THEN 1 ELSE 0 END::INT8 FROM pg_index x \
             JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = to_regclass('{table}') AND i.relname = '{name}'"
        )
    }

    fn create_index_online(table: &str, name: &str, columns: &str) -> String {
        format!("CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} ({columns})")
    }

    fn drop_index_online(_table: &str, index: &str) -> String {
        format!("DROP INDEX CONCURRENTLY IF EXISTS {index}")
    }

    /// Partial: the claim index covers the claimable statuses only, and failed rows are few.
    fn failed_index_online(table: &str, name: &str, columns: &str) -> Option<String> {
        Some(format!("CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} ({columns}) WHERE status = 'failed'"))
    }

    /// An expression index over the unfinished rows, built `CONCURRENTLY`, after dropping
    /// the table's partition indexes of other counts and an invalid one of this count.
    async fn build_partition_index(
        store: &PostgresStore,
        conn: &mut sqlx::PgConnection,
        total: u32,
    ) -> Result<(), StoreError> {
        use super::partitions::{partition_index_count, partition_index_name};
        let t = &store.table;
        let expr = Self::partition_expr(total).expect("PostgreSQL computes partitions");
        let wanted = partition_index_name(t, total);
        let rows = sqlx::query(&format!(
            "SELECT i.relname::TEXT, CASE WHEN x.indisvalid THEN 1 ELSE 0 END::INT8 FROM pg_index x \
             JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = to_regclass('{t}')"
        ))
        .fetch_all(&mut *conn)
        .await?;
        for r in &rows {
            let (name, valid) = (Self::text(r, 0)?, Self::int(r, 1)? == 1);
            let Some(count) = partition_index_count(t, &name) else { continue };
            if count != total || !valid {
                sqlx::Executor::execute(&mut *conn, format!("DROP INDEX CONCURRENTLY IF EXISTS {name}").as_str())
                    .await
                    .map_err(|e| StoreError::Migration(format!("dropping {name}: {e}")))?;
                tracing::info!(table = %t, index = %name, "dropped a partition index of another count, or an invalid one");
            }
        }
        let key = store.profile.key.column();
        let create = format!(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS {wanted} ON {t} (({expr}), created_at_ms, {key}) \
             WHERE status IN ('pending', 'retryable', 'delivering')"
        );
        sqlx::Executor::execute(&mut *conn, create.as_str())
            .await
            .map_err(|e| StoreError::Migration(format!("building {wanted}: {e}")))?;
        Ok(())
    }

    const PARTITION_INDEX: bool = true;

    /// One range of the partial index per partition, merged in order.
    fn partition_read_sql(table: &str, columns: &str, key: &str, expr: &str) -> Option<String> {
        Some(format!(
            "SELECT * FROM (SELECT w.* FROM unnest(string_to_array($4, ',')::INT8[]) AS p(n) CROSS JOIN LATERAL ( \
               SELECT {columns} FROM {table} WHERE {expr} = p.n AND status IN ('pending', 'retryable', 'delivering') \
                  AND {} ORDER BY created_at_ms, {key} LIMIT $5) AS w) AS waiting ORDER BY created_at_ms, sort_key",
            Self::after_cursor(key, "$1", "$2", "$3")
        ))
    }

    const PARTITION_HASH: Option<&'static str> =
        Some("(((hashtextextended(app_code || ':' || room_id, 0) % {total}) + {total}) % {total})");

    const SHARE_LOCK: &'static str = " FOR SHARE";
    const UPDATE_LOCK: &'static str = " FOR UPDATE";

    /// A row comparison, which PostgreSQL seeks to.
    fn after_cursor(key: &str, at: &str, again: &str, last: &str) -> String {
        format!("created_at_ms >= {at} AND (created_at_ms, {key}) > ({again}, {last})")
    }

    const INDEX_ORDER_READ: Option<&'static str> =
        Some("BEGIN READ ONLY; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_sort = off; SET LOCAL jit = off");

    async fn claim_rows(
        store: &PostgresStore,
        worker_id: &str,
        now_ms: i64,
        lock_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<Claimed>, StoreError> {
        // One round trip: the claim function (migrations/routines/postgres_claim.sql; its
        // own planner settings keep the pick on the claim index when statistics are stale).
        let rows = sqlx::query(&store.own.claim)
            .bind(worker_id)
            .bind(lock_until_ms)
            .bind(now_ms)
            .bind(i32::try_from(limit).unwrap_or(i32::MAX))
            .fetch_all(&store.pool)
            .await?;
        let lease = Lease { worker_id: worker_id.to_string(), lock_until_ms, fence: None };
        let mut claimed =
            rows.iter().map(|r| decode_routine_claimed::<Self>(r, lease.clone())).collect::<Result<Vec<_>, _>>()?;
        super::sort_claimed(&mut claimed);
        Ok(claimed)
    }

    async fn mark_delivered(store: &PostgresStore, marks: &[&Mark], now_ms: i64) -> Result<Option<u64>, StoreError> {
        if marks.is_empty() {
            return Ok(Some(0));
        }
        let q = sqlx::query(&store.own.delivered).bind(now_ms);
        let q = if store.profile.key.is_text() {
            q.bind(marks.iter().map(|m| m.event_id.as_str()).collect::<Vec<_>>())
        } else {
            q.bind(marks.iter().map(|m| m.id).collect::<Vec<_>>())
        };
        Ok(Some(q.bind(super::sql::digest_of(marks)).execute(&store.pool).await?.rows_affected()))
    }

    /// `retryable`/`failed` outcomes, each only under its own lease, in one statement.
    async fn mark_failed(store: &PostgresStore, marks: &[&Mark], now_ms: i64) -> Result<u64, StoreError> {
        let mut changed = 0;
        let failed = FailedMarks::from(marks);
        if !failed.ids.is_empty() {
            let errors: Vec<std::borrow::Cow<'_, str>> = failed.errors.iter().map(|e| store.fit_error(e)).collect();
            let q = sqlx::query(&store.own.failed);
            let q = if store.profile.key.is_text() { q.bind(&failed.event_ids) } else { q.bind(&failed.ids) };
            changed += q
                .bind(&failed.worker_ids)
                .bind(&failed.lock_untils)
                .bind(&failed.statuses)
                .bind(errors.iter().map(|e| e.as_ref()).collect::<Vec<&str>>())
                .bind(&failed.next_retry_ats)
                .bind(&failed.counted)
                .bind(now_ms)
                .bind(super::sql::digest_of(marks))
                .execute(&store.pool)
                .await?
                .rows_affected();
        }
        Ok(changed)
    }

    async fn release_rows(store: &PostgresStore, rows: &[Held], now_ms: i64) -> Result<u64, StoreError> {
        let workers: Vec<&str> = rows.iter().map(|r| r.lease.worker_id.as_str()).collect();
        let locks: Vec<i64> = rows.iter().map(|r| r.lease.lock_until_ms).collect();
        let q = sqlx::query(&store.own.release);
        let q = if store.profile.key.is_text() {
            q.bind(rows.iter().map(|r| r.event_id.as_str()).collect::<Vec<_>>())
        } else {
            q.bind(rows.iter().map(|r| r.id).collect::<Vec<_>>())
        };
        let result = q.bind(&workers).bind(&locks).bind(now_ms).execute(&store.pool).await?;
        Ok(result.rows_affected())
    }
}

/// PostgreSQL's own statements: each binds whole arrays, so one text serves every batch.
pub struct Statements {
    claim: String,
    delivered: String,
    failed: String,
    release: String,
}

/// The `Retry` and `Fail` marks of a batch as parallel columns, for statements that write
/// them all at once.
struct FailedMarks<'a> {
    ids: Vec<i64>,
    event_ids: Vec<&'a str>,
    worker_ids: Vec<&'a str>,
    lock_untils: Vec<i64>,
    statuses: Vec<&'static str>,
    errors: Vec<&'a str>,
    next_retry_ats: Vec<i64>,
    counted: Vec<i32>,
}

impl<'a> From<&[&'a Mark]> for FailedMarks<'a> {
    fn from(marks: &[&'a Mark]) -> Self {
        let mut out = FailedMarks {
            ids: vec![],
            event_ids: vec![],
            worker_ids: vec![],
            lock_untils: vec![],
            statuses: vec![],
            errors: vec![],
            next_retry_ats: vec![],
            counted: vec![],
        };
        for m in marks {
            let Some(error) = m.outcome.error() else { continue };
            out.ids.push(m.id);
            out.event_ids.push(&m.event_id);
            out.worker_ids.push(&m.lease.worker_id);
            out.lock_untils.push(m.lease.lock_until_ms);
            out.statuses.push(m.outcome.status().as_str());
            out.errors.push(error);
            out.next_retry_ats.push(m.outcome.next_retry_at_ms());
            out.counted.push(m.outcome.counted());
        }
        out
    }
}

/// PostgreSQL's types and schema statements (see [`Ddl`]).
pub(super) static DDL: Ddl = Ddl {
    definition: 1,
    shape: |declared| schema::server_shape(declared, true),
    suggested: |role| schema::server_suggested(role, "BYTEA"),
    fix: |table, column, ty, _| format!("ALTER TABLE {table} ALTER COLUMN {column} TYPE {ty};"),
    unique_event_id: |table| format!("CREATE UNIQUE INDEX CONCURRENTLY {table}_event_id_uq ON {table} (event_id);"),
    row_id: false,
    add_columns: |table, columns| {
        columns.iter().map(|(n, d)| format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {n} {d}")).collect()
    },
    claim_index: |table, key, _| {
        format!(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS {table}_claim_idx ON {table} (created_at_ms, {key}) \
             WHERE status IN ('pending', 'retryable', 'delivering')"
        )
    },
    drop_invalid_index: Some(|table, name| format!("DROP INDEX CONCURRENTLY IF EXISTS {table}_{name}")),
    dir: "postgres",
    routines: &[
        ("notify_insert", include_str!("../../../migrations/routines/postgres_notify_insert.sql")),
        ("claim", include_str!("../../../migrations/routines/postgres_claim.sql")),
    ],
    event_id_key: ["0::BIGINT", "event_id", "TEXT"],
};
