//! PostgreSQL. A claim is one statement: a `FOR UPDATE SKIP LOCKED` pick in a CTE and an
//! `UPDATE … RETURNING`, so concurrent claimers skip each other's rows and a row whose
//! lease was renewed in between is re-checked, not taken. Outcomes of a whole batch are
//! written with one statement per kind, passing arrays.

use async_trait::async_trait;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use super::{
    CLAIM_COLUMNS, Claimed, Lease, Mark, NewEvent, Outcome, ROW_COLUMNS, Row, Stats, Store, StoreError, decode_claimed,
    decode_row, migrate,
};

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

#[async_trait]
impl Store for PostgresStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        let t = &self.table;
        // Up to date: no DDL, so a host whose user may only read and write rows can start.
        let applied = sqlx::query_scalar(&format!("SELECT version FROM {t}_migrations")).fetch_all(&self.pool).await;
        if applied.is_ok_and(|applied: Vec<i64>| migrate::up_to_date(&migrate::POSTGRES, &applied)) {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        // Serialise concurrent starters on this table's migrations.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(format!("{t}_migrations"))
            .execute(&mut *tx)
            .await?;
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {t}_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL, applied_at_ms BIGINT NOT NULL)"
        ))
        .execute(&mut *tx)
        .await?;
        for step in migrate::steps(&migrate::POSTGRES, t) {
            let applied: Option<i64> =
                sqlx::query_scalar(&format!("SELECT version FROM {t}_migrations WHERE version = $1"))
                    .bind(step.version)
                    .fetch_optional(&mut *tx)
                    .await?;
            if applied.is_some() {
                continue;
            }
            sqlx::Executor::execute(&mut *tx, step.sql.as_str())
                .await
                .map_err(|e| StoreError::Migration(format!("{} {}: {e}", step.version, step.description)))?;
            sqlx::query(&format!(
                "INSERT INTO {t}_migrations (version, description, applied_at_ms) VALUES ($1, $2, $3)"
            ))
            .bind(step.version)
            .bind(&step.description)
            .bind(super::now_ms())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn claim(
        &self,
        worker_id: &str,
        now_ms: i64,
        lock_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<Claimed>, StoreError> {
        let t = &self.table;
        let sql = format!(
            "WITH picked AS (\
                 SELECT id FROM {t} \
                 WHERE status IN ('pending', 'retryable', 'delivering') \
                   AND (status = 'pending' \
                        OR (status = 'retryable' AND next_retry_at_ms <= $3) \
                        OR (status = 'delivering' AND lock_until_ms < $3)) \
                 ORDER BY created_at_ms, id \
                 LIMIT $4 \
                 FOR UPDATE SKIP LOCKED) \
             UPDATE {t} AS o SET status = 'delivering', worker_id = $1, lock_until_ms = $2, updated_at_ms = $3 \
             FROM picked WHERE o.id = picked.id \
             RETURNING {}",
            CLAIM_COLUMNS.split(", ").map(|c| format!("o.{c}")).collect::<Vec<_>>().join(", ")
        );
        let rows = sqlx::query(&sql)
            .bind(worker_id)
            .bind(lock_until_ms)
            .bind(now_ms)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        let lease = Lease { worker_id: worker_id.to_string(), lock_until_ms };
        let mut claimed = rows.iter().map(|r| decode_claimed!(r, lease.clone())).collect::<Result<Vec<_>, _>>()?;
        claimed.sort_by_key(|c| (c.created_at_ms, c.id));
        Ok(claimed)
    }

    async fn mark(&self, marks: &[Mark], now_ms: i64) -> Result<u64, StoreError> {
        let t = &self.table;
        let mut changed = 0;
        let delivered: Vec<i64> =
            marks.iter().filter(|m| matches!(m.outcome, Outcome::Delivered)).map(|m| m.id).collect();
        if !delivered.is_empty() {
            changed += sqlx::query(&format!(
                "UPDATE {t} SET status = 'delivered', last_error = NULL, worker_id = NULL, lock_until_ms = 0, \
                 updated_at_ms = $2, delivered_at_ms = $2 \
                 WHERE id = ANY($1) AND status <> 'delivered'"
            ))
            .bind(&delivered)
            .bind(now_ms)
            .execute(&self.pool)
            .await?
            .rows_affected();
        }
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

    async fn release(&self, rows: &[(i64, Lease)], now_ms: i64) -> Result<u64, StoreError> {
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

    async fn insert(&self, events: &[NewEvent]) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        for e in events {
            sqlx::query(&format!(
                "INSERT INTO {} (app_code, event_id, event_type, room_id, status, envelope, created_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                self.table
            ))
            .bind(&e.app_code)
            .bind(&e.event_id)
            .bind(&e.event_type)
            .bind(&e.room_id)
            .bind(e.status.as_str())
            .bind(&e.envelope)
            .bind(e.created_at_ms)
            .execute(&mut *tx)
            .await
            .map_err(|err| super::name_duplicate(err, &e.event_id))?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn get(&self, event_id: &str) -> Result<Option<Row>, StoreError> {
        let row = sqlx::query(&format!("SELECT {ROW_COLUMNS} FROM {} WHERE event_id = $1", self.table))
            .bind(event_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.as_ref().map(|r| decode_row!(r)).transpose()?)
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        let [counts, oldest, errors] = super::stats_sql(&self.table);
        let counts: Vec<(String, i64)> = sqlx::query_as(&counts).fetch_all(&self.pool).await?;
        let oldest: Option<i64> = sqlx::query_scalar(&oldest).fetch_one(&self.pool).await?;
        let errors: Vec<(String, i64)> = sqlx::query_as(&errors).fetch_all(&self.pool).await?;
        Ok(super::stats_from(counts, oldest, errors))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}
