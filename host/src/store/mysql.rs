//! MySQL 8 and MariaDB 10.6+. Without `UPDATE … RETURNING`, a claim is the procedure
//! `<table>_claim` (migration 3): one round trip, in which a short transaction runs
//! `SELECT … FOR UPDATE SKIP LOCKED` per claimable status, then `UPDATE` of the picked
//! ids. The outcomes of a batch are written with one statement per kind (`CASE` over the
//! ids).

use async_trait::async_trait;
use sqlx::MySql;
use sqlx::migrate::Migrator;
use sqlx::mysql::MySqlPoolOptions;

use super::sql::{ByCount, Dialect, MigrationLock, SqlStore, decode_routine_claimed};
use super::{Claimed, Lease, Mark, StoreError};

/// MySQL's and MariaDB's [`Dialect`].
pub struct MysqlDialect;

/// The MySQL / MariaDB backend.
pub type MysqlStore = SqlStore<MysqlDialect>;

impl MysqlStore {
    /// Connects to a `mysql://` (or `mariadb://`) URL.
    pub async fn connect(url: &str, max_connections: u32, table: &str) -> Result<Self, StoreError> {
        let url = match url.strip_prefix("mariadb://") {
            Some(rest) => format!("mysql://{rest}"),
            None => url.to_string(),
        };
        let pool = MySqlPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(super::ACQUIRE_TIMEOUT)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    // Claims lock only the rows they take, not the gaps between them.
                    sqlx::Executor::execute(&mut *conn, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await?;
                    Ok(())
                })
            })
            .connect(&url)
            .await
            .map_err(|e| super::unreachable_error(&url, e))?;
        Ok(SqlStore::new(pool, table))
    }
}

#[async_trait]
impl Dialect for MysqlDialect {
    type Db = MySql;
    type Statements = Statements;

    fn statements(table: &str) -> Statements {
        let (failed_table, release_table) = (table.to_string(), table.to_string());
        Statements {
            claim: format!("CALL {table}_claim(?, ?, ?, ?)"),
            failed: ByCount::new(move |n| {
                let case = |column: &str| format!("{column} = CASE id{} END", " WHEN ? THEN ?".repeat(n));
                format!(
                    "UPDATE {failed_table} SET {}, {}, {}, retry_count = retry_count + 1, worker_id = NULL, \
                     lock_until_ms = 0, updated_at_ms = ? WHERE 1 = 1{}",
                    case("status"),
                    case("last_error"),
                    case("next_retry_at_ms"),
                    lease_filter(n)
                )
            }),
            release: ByCount::new(move |n| {
                format!(
                    "UPDATE {release_table} SET status = 'pending', worker_id = NULL, lock_until_ms = 0, \
                     updated_at_ms = ? WHERE 1 = 1{}",
                    lease_filter(n)
                )
            }),
        }
    }

    fn param(n: usize) -> String {
        let _ = n;
        "?".to_string()
    }

    fn rows_affected(result: &sqlx::mysql::MySqlQueryResult) -> u64 {
        result.rows_affected()
    }

    fn migrator() -> &'static Migrator {
        &super::migrate::MYSQL
    }

    fn migration_lock(table: &str) -> MigrationLock {
        // DDL commits implicitly in MySQL, so a named lock (not a transaction) keeps two
        // starting hosts from migrating at once.
        MigrationLock {
            take: format!("SELECT GET_LOCK('{table}_migrations', 60)"),
            checked: true,
            keep: format!("SELECT RELEASE_LOCK('{table}_migrations')"),
            undo: format!("SELECT RELEASE_LOCK('{table}_migrations')"),
        }
    }

    async fn claim_rows(
        store: &MysqlStore,
        worker_id: &str,
        now_ms: i64,
        lock_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<Claimed>, StoreError> {
        // One round trip: the claim procedure of migration 3 picks, leases and returns the
        // rows in claim order, in its own short transaction.
        let rows = sqlx::query(&store.own.claim)
            .bind(worker_id)
            .bind(lock_until_ms)
            .bind(now_ms)
            .bind(i32::try_from(limit).unwrap_or(i32::MAX))
            .fetch_all(&store.pool)
            .await?;
        let lease = Lease { worker_id: worker_id.to_string(), lock_until_ms };
        Ok(rows.iter().map(|r| decode_routine_claimed(r, lease.clone())).collect::<Result<_, _>>()?)
    }

    /// `retryable`/`failed` outcomes, each only under its own lease, in one statement.
    async fn mark_failed(store: &MysqlStore, marks: &[&Mark], now_ms: i64) -> Result<u64, StoreError> {
        let sql = store.own.failed.get(marks.len());
        let mut q = sqlx::query(&sql);
        // Bound in the order of the text: (id, status) …, (id, error) …, (id, next retry) …,
        // then the time, then the leases.
        for m in marks {
            q = q.bind(m.id).bind(m.outcome.status().as_str());
        }
        for m in marks {
            q = q.bind(m.id).bind(m.outcome.error());
        }
        for m in marks {
            q = q.bind(m.id).bind(m.outcome.next_retry_at_ms());
        }
        q = q.bind(now_ms);
        for m in marks {
            q = q.bind(m.id).bind(m.lease.worker_id.as_str()).bind(m.lease.lock_until_ms);
        }
        Ok(q.execute(&store.pool).await?.rows_affected())
    }

    async fn release_rows(store: &MysqlStore, rows: &[(i64, Lease)], now_ms: i64) -> Result<u64, StoreError> {
        let sql = store.own.release.get(rows.len());
        let mut q = sqlx::query(&sql).bind(now_ms);
        for (id, lease) in rows {
            q = q.bind(*id).bind(lease.worker_id.as_str()).bind(lease.lock_until_ms);
        }
        Ok(q.execute(&store.pool).await?.rows_affected())
    }
}

/// MySQL's own statements.
pub struct Statements {
    /// The claim procedure's call.
    claim: String,
    /// A batch's failures, per count: one `CASE` over the ids per column, under the leases.
    failed: ByCount,
    /// A hand-back, per count, under the leases.
    release: ByCount,
}

/// ` AND status = 'delivering' AND (id, worker_id, lock_until_ms) IN ((?, ?, ?), …)` for
/// `count` rows: only rows still held under the same lease.
fn lease_filter(count: usize) -> String {
    format!(
        " AND status = 'delivering' AND (id, worker_id, lock_until_ms) IN ({})",
        vec!["(?, ?, ?)"; count].join(", ")
    )
}
