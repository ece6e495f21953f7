//! PostgreSQL. A claim is one statement (in a transaction that keeps the planner on the
//! claim index): a `FOR UPDATE SKIP LOCKED` pick in a CTE and an `UPDATE … RETURNING`, so
//! concurrent claimers skip each other's rows and a row whose lease was renewed in between
//! is re-checked, not taken. Outcomes of a whole batch are
//! written with one statement per kind, passing arrays.

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use super::{CLAIM_COLUMNS, Claimed, Lease, Mark, StoreError, decode_claimed};

/// The PostgreSQL backend.
pub struct PostgresStore {
    pool: PgPool,
    table: String,
}

impl PostgresStore {
    /// Connects to a `postgres://` URL (the schema is the connection's `search_path`).
    pub async fn connect(url: &str, max_connections: u32, table: &str) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(super::ACQUIRE_TIMEOUT)
            .connect(url)
            .await
            .map_err(|e| super::unreachable_error(url, e))?;
        Ok(PostgresStore { pool, table: table.to_string() })
    }
}

super::common::common_store!(PostgresStore, sqlx::Postgres, super::migrate::POSTGRES);

impl PostgresStore {
    async fn migrate_schema(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        // Serialise concurrent starters on this table's migrations.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(format!("{}_migrations", self.table))
            .execute(&mut *tx)
            .await?;
        self.apply_missing(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn claim_rows(
        &self,
        worker_id: &str,
        now_ms: i64,
        lock_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<Claimed>, StoreError> {
        let t = &self.table;
        let sql = format!(
            "WITH picked AS (\
                 SELECT id, status AS was FROM {t} \
                 WHERE status IN ('pending', 'retryable', 'delivering') \
                   AND (status = 'pending' \
                        OR (status = 'retryable' AND next_retry_at_ms <= $3) \
                        OR (status = 'delivering' AND lock_until_ms < $3)) \
                 ORDER BY created_at_ms, id \
                 LIMIT $4 \
                 FOR UPDATE SKIP LOCKED) \
             UPDATE {t} AS o SET status = 'delivering', worker_id = $1, lock_until_ms = $2, updated_at_ms = $3 \
             FROM picked WHERE o.id = picked.id \
             RETURNING {}, picked.was",
            CLAIM_COLUMNS.split(", ").map(|c| format!("o.{c}")).collect::<Vec<_>>().join(", ")
        );
        // After a burst of inserts the table's statistics are stale, and the planner would
        // rather sort every claimable row than walk the claim index in order and stop at
        // `limit` (25 ms against 1 ms per claim at 57,000 pending rows, measured). Tell it not to.
        let mut tx = self.pool.begin().await?;
        sqlx::Executor::execute(&mut *tx, "SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off").await?;
        let rows = sqlx::query(&sql)
            .bind(worker_id)
            .bind(lock_until_ms)
            .bind(now_ms)
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let lease = Lease { worker_id: worker_id.to_string(), lock_until_ms };
        let mut claimed = rows
            .iter()
            .map(|r| {
                use sqlx::Row as _;
                let was: String = r.try_get("was")?;
                Ok::<_, sqlx::Error>(Claimed { rescued: was == "delivering", ..decode_claimed!(r, lease.clone())? })
            })
            .collect::<Result<Vec<_>, _>>()?;
        claimed.sort_by_key(|c| (c.created_at_ms, c.id));
        Ok(claimed)
    }

    /// `retryable`/`failed` outcomes, each only under its own lease, in one statement.
    async fn mark_failed(&self, marks: &[&Mark], now_ms: i64) -> Result<u64, StoreError> {
        let t = &self.table;
        let mut changed = 0;
        let failed = super::FailedMarks::from(marks);
        if !failed.ids.is_empty() {
            changed += sqlx::query(&format!(
                "UPDATE {t} AS o SET status = m.status, retry_count = o.retry_count + 1, last_error = m.error, \
                 next_retry_at_ms = m.next_retry_at_ms, worker_id = NULL, lock_until_ms = 0, updated_at_ms = $7 \
                 FROM UNNEST($1::BIGINT[], $2::TEXT[], $3::BIGINT[], $4::TEXT[], $5::TEXT[], $6::BIGINT[]) \
                      AS m(id, worker_id, lock_until_ms, status, error, next_retry_at_ms) \
                 WHERE o.id = m.id AND o.status = 'delivering' AND o.worker_id = m.worker_id AND o.lock_until_ms = m.lock_until_ms"
            ))
            .bind(&failed.ids)
            .bind(&failed.worker_ids)
            .bind(&failed.lock_untils)
            .bind(&failed.statuses)
            .bind(&failed.errors)
            .bind(&failed.next_retry_ats)
            .bind(now_ms)
            .execute(&self.pool)
            .await?
            .rows_affected();
        }
        Ok(changed)
    }

    async fn release_rows(&self, rows: &[(i64, Lease)], now_ms: i64) -> Result<u64, StoreError> {
        let ids: Vec<i64> = rows.iter().map(|(id, _)| *id).collect();
        let workers: Vec<&str> = rows.iter().map(|(_, l)| l.worker_id.as_str()).collect();
        let locks: Vec<i64> = rows.iter().map(|(_, l)| l.lock_until_ms).collect();
        let result = sqlx::query(&format!(
            "UPDATE {} AS o SET status = 'pending', worker_id = NULL, lock_until_ms = 0, updated_at_ms = $4 \
             FROM UNNEST($1::BIGINT[], $2::TEXT[], $3::BIGINT[]) AS m(id, worker_id, lock_until_ms) \
             WHERE o.id = m.id AND o.status = 'delivering' AND o.worker_id = m.worker_id AND o.lock_until_ms = m.lock_until_ms",
            self.table
        ))
        .bind(&ids)
        .bind(&workers)
        .bind(&locks)
        .bind(now_ms)
        .execute(&self.pool)
        .await?;
        Ok(result.rows_affected())
    }
}
