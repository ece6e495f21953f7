//! MySQL 8 and MariaDB 10.6+. Without `UPDATE … RETURNING`, a claim is one short
//! transaction: `SELECT … FOR UPDATE SKIP LOCKED` per claimable status, then `UPDATE` of
//! the picked ids. The outcomes of a batch are written with one statement per kind (`CASE`
//! over the ids).

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{MySql, QueryBuilder};

use super::sql::{Dialect, MigrationLock, SqlStore, decode_claimed};
use super::{CLAIM_COLUMNS, Claimed, Lease, Mark, StoreError};

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
        let t = &store.table;
        let mut tx = store.pool.begin().await?;
        // One index-ordered pick per claimable status (an OR over the three would make InnoDB
        // sort every claimable row on each claim), merged here into claim order. Rows picked
        // but not taken stay locked only until this short transaction commits.
        let lease = Lease { worker_id: worker_id.to_string(), lock_until_ms };
        let mut claimed = Vec::new();
        for (status, due) in
            [("pending", None), ("retryable", Some("next_retry_at_ms <= ")), ("delivering", Some("lock_until_ms < "))]
        {
            let mut q: QueryBuilder<MySql> =
                QueryBuilder::new(format!("SELECT {CLAIM_COLUMNS} FROM {t} WHERE status = '{status}'"));
            if let Some(due) = due {
                q.push(" AND ").push(due).push_bind(now_ms);
            }
            q.push(" ORDER BY created_at_ms, id LIMIT ").push_bind(i64::from(limit)).push(" FOR UPDATE SKIP LOCKED");
            for r in q.build().fetch_all(&mut *tx).await? {
                claimed.push(decode_claimed(&r, lease.clone(), status == "delivering")?);
            }
        }
        claimed.sort_by_key(|c| (c.created_at_ms, c.id));
        claimed.truncate(limit as usize);
        if !claimed.is_empty() {
            let mut q: QueryBuilder<MySql> =
                QueryBuilder::new(format!("UPDATE {t} SET status = 'delivering', worker_id = "));
            q.push_bind(worker_id).push(", lock_until_ms = ").push_bind(lock_until_ms);
            q.push(", updated_at_ms = ").push_bind(now_ms).push(" WHERE id IN (");
            let mut ids = q.separated(", ");
            for c in &claimed {
                ids.push_bind(c.id);
            }
            q.push(")");
            q.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(claimed)
    }

    /// `retryable`/`failed` outcomes, each only under its own lease, in one statement.
    async fn mark_failed(store: &MysqlStore, marks: &[&Mark], now_ms: i64) -> Result<u64, StoreError> {
        let mut q: QueryBuilder<MySql> = QueryBuilder::new(format!("UPDATE {} SET ", store.table));
        for column in ["status", "last_error", "next_retry_at_ms"] {
            q.push(format!("{column} = CASE id"));
            for m in marks {
                q.push(" WHEN ").push_bind(m.id).push(" THEN ");
                match column {
                    "status" => q.push_bind(m.outcome.status().as_str()),
                    "last_error" => q.push_bind(m.outcome.error()),
                    _ => q.push_bind(m.outcome.next_retry_at_ms()),
                };
            }
            q.push(" END, ");
        }
        q.push("retry_count = retry_count + 1, worker_id = NULL, lock_until_ms = 0, updated_at_ms = ");
        q.push_bind(now_ms).push(" WHERE 1 = 1");
        push_lease_filter(&mut q, marks.iter().map(|m| (m.id, &m.lease)));
        Ok(q.build().execute(&store.pool).await?.rows_affected())
    }

    async fn release_rows(store: &MysqlStore, rows: &[(i64, Lease)], now_ms: i64) -> Result<u64, StoreError> {
        let mut q: QueryBuilder<MySql> = QueryBuilder::new(format!(
            "UPDATE {} SET status = 'pending', worker_id = NULL, lock_until_ms = 0, updated_at_ms = ",
            store.table
        ));
        q.push_bind(now_ms).push(" WHERE 1 = 1");
        push_lease_filter(&mut q, rows.iter().map(|(id, lease)| (*id, lease)));
        Ok(q.build().execute(&store.pool).await?.rows_affected())
    }
}

/// `AND (id, worker_id, lock_until_ms) IN ((…), …)`: only rows still held under the same
/// lease.
fn push_lease_filter<'a>(q: &mut QueryBuilder<'a, MySql>, rows: impl Iterator<Item = (i64, &'a Lease)>) {
    q.push(" AND status = 'delivering' AND (id, worker_id, lock_until_ms) IN (");
    let mut list = q.separated(", ");
    for (id, lease) in rows {
        list.push("(");
        list.push_bind_unseparated(id);
        list.push_unseparated(", ");
        list.push_bind_unseparated(lease.worker_id.as_str());
        list.push_unseparated(", ");
        list.push_bind_unseparated(lease.lock_until_ms);
        list.push_unseparated(")");
    }
    q.push(")");
}
