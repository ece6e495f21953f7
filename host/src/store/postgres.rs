//! PostgreSQL. A claim is one round trip: the function `<table>_claim` (migration 2) runs a
//! `FOR UPDATE SKIP LOCKED` pick in a CTE and an `UPDATE … RETURNING`, so concurrent
//! claimers skip each other's rows, with planner settings of its own that keep the pick on
//! the claim index. Outcomes of a whole batch are
//! written with one statement per kind, passing arrays.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Postgres;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgListener;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::sql::{Dialect, MigrationLock, SqlStore, decode_routine_claimed};
use super::{CLAIM_COLUMNS, Claimed, Lease, Mark, StoreError};

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

    fn statements(table: &str) -> Statements {
        let t = table;
        Statements {
            claim: format!("SELECT {CLAIM_COLUMNS}, was FROM {t}_claim($1, $2, $3, $4)"),
            delivered: format!(
                "UPDATE {t} SET status = 'delivered', last_error = NULL, worker_id = NULL, lock_until_ms = 0, \
                 updated_at_ms = $1, delivered_at_ms = $1 WHERE status <> 'delivered' AND id = ANY($2)"
            ),
            failed: format!(
                "UPDATE {t} AS o SET status = m.status, retry_count = o.retry_count + 1, last_error = m.error, \
                 next_retry_at_ms = m.next_retry_at_ms, worker_id = NULL, lock_until_ms = 0, updated_at_ms = $7 \
                 FROM UNNEST($1::BIGINT[], $2::TEXT[], $3::BIGINT[], $4::TEXT[], $5::TEXT[], $6::BIGINT[]) \
                      AS m(id, worker_id, lock_until_ms, status, error, next_retry_at_ms) \
                 WHERE o.id = m.id AND o.status = 'delivering' AND o.worker_id = m.worker_id AND o.lock_until_ms = m.lock_until_ms"
            ),
            release: format!(
                "UPDATE {t} AS o SET status = 'pending', worker_id = NULL, lock_until_ms = 0, updated_at_ms = $4 \
                 FROM UNNEST($1::BIGINT[], $2::TEXT[], $3::BIGINT[]) AS m(id, worker_id, lock_until_ms) \
                 WHERE o.id = m.id AND o.status = 'delivering' AND o.worker_id = m.worker_id AND o.lock_until_ms = m.lock_until_ms"
            ),
        }
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

    fn migration_lock(table: &str) -> MigrationLock {
        // Serialise concurrent starters on this table's migrations, for the transaction.
        MigrationLock {
            take: format!("BEGIN; SELECT pg_advisory_xact_lock(hashtext('{table}_migrations'))"),
            checked: false,
            keep: "COMMIT".into(),
            undo: "ROLLBACK".into(),
        }
    }

    async fn claim_rows(
        store: &PostgresStore,
        worker_id: &str,
        now_ms: i64,
        lock_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<Claimed>, StoreError> {
        // One round trip: the claim function of migration 2 (its own planner settings keep
        // the pick on the claim index when statistics are stale).
        let rows = sqlx::query(&store.own.claim)
            .bind(worker_id)
            .bind(lock_until_ms)
            .bind(now_ms)
            .bind(i32::try_from(limit).unwrap_or(i32::MAX))
            .fetch_all(&store.pool)
            .await?;
        let lease = Lease { worker_id: worker_id.to_string(), lock_until_ms };
        let mut claimed =
            rows.iter().map(|r| decode_routine_claimed(r, lease.clone())).collect::<Result<Vec<_>, _>>()?;
        claimed.sort_by_key(|c| (c.created_at_ms, c.id));
        Ok(claimed)
    }

    async fn mark_delivered(store: &PostgresStore, ids: &[i64], now_ms: i64) -> Result<Option<u64>, StoreError> {
        if ids.is_empty() {
            return Ok(Some(0));
        }
        let done = sqlx::query(&store.own.delivered).bind(now_ms).bind(ids).execute(&store.pool).await?;
        Ok(Some(done.rows_affected()))
    }

    /// `retryable`/`failed` outcomes, each only under its own lease, in one statement.
    async fn mark_failed(store: &PostgresStore, marks: &[&Mark], now_ms: i64) -> Result<u64, StoreError> {
        let mut changed = 0;
        let failed = FailedMarks::from(marks);
        if !failed.ids.is_empty() {
            changed += sqlx::query(&store.own.failed)
                .bind(&failed.ids)
                .bind(&failed.worker_ids)
                .bind(&failed.lock_untils)
                .bind(&failed.statuses)
                .bind(&failed.errors)
                .bind(&failed.next_retry_ats)
                .bind(now_ms)
                .execute(&store.pool)
                .await?
                .rows_affected();
        }
        Ok(changed)
    }

    async fn release_rows(store: &PostgresStore, rows: &[(i64, Lease)], now_ms: i64) -> Result<u64, StoreError> {
        let ids: Vec<i64> = rows.iter().map(|(id, _)| *id).collect();
        let workers: Vec<&str> = rows.iter().map(|(_, l)| l.worker_id.as_str()).collect();
        let locks: Vec<i64> = rows.iter().map(|(_, l)| l.lock_until_ms).collect();
        let result = sqlx::query(&store.own.release)
            .bind(&ids)
            .bind(&workers)
            .bind(&locks)
            .bind(now_ms)
            .execute(&store.pool)
            .await?;
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
    worker_ids: Vec<&'a str>,
    lock_untils: Vec<i64>,
    statuses: Vec<&'static str>,
    errors: Vec<&'a str>,
    next_retry_ats: Vec<i64>,
}

impl<'a> From<&[&'a Mark]> for FailedMarks<'a> {
    fn from(marks: &[&'a Mark]) -> Self {
        let mut out = FailedMarks {
            ids: vec![],
            worker_ids: vec![],
            lock_untils: vec![],
            statuses: vec![],
            errors: vec![],
            next_retry_ats: vec![],
        };
        for m in marks {
            let Some(error) = m.outcome.error() else { continue };
            out.ids.push(m.id);
            out.worker_ids.push(&m.lease.worker_id);
            out.lock_untils.push(m.lease.lock_until_ms);
            out.statuses.push(m.outcome.status().as_str());
            out.errors.push(error);
            out.next_retry_ats.push(m.outcome.next_retry_at_ms());
        }
        out
    }
}
