//! The embedded default: SQLite in WAL mode. A claim is one short `BEGIN IMMEDIATE`
//! transaction (pick, then `UPDATE … RETURNING`), which takes SQLite's write lock before it
//! reads, so two claimers (threads or processes) are serialised and never share a row.
//!
//! Everything SQLite does its own way is here: the claim and outcome statements, the one
//! write lock (`BEGIN IMMEDIATE`) that serves as the migration and registry locks and
//! begins every writing transaction, the pick index an owner's read names, and the cursor
//! condition it reads by, and what adopting a table says in SQLite's words ([`DDL`]: types by
//! affinity, `rowid` for a table without `id`). It computes no partition in SQL: the host does.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Sqlite;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use sqlx::Row as _;
use sqlx::sqlite::SqliteRow;

use super::schema::{Ddl, Profile, Role, Shape};
use super::sql::{ByCount, Dialect, Lock, SqlStore, decode_claimed, params};
use super::{Backend, Claimed, Held, Lease, Mark, StoreError};

/// SQLite's [`Dialect`].
pub struct SqliteDialect;

/// SQLite's own statements.
pub struct Statements {
    /// The claim's pick, in claim order: a walk of `<table>_pick_idx` (named, because
    /// without statistics SQLite would rather gather every claimable row and sort them)
    /// that stops at the limit.
    pick: String,
    /// The claim's take of the picked ids, per count.
    take: ByCount,
    /// One row's failure, under its lease.
    failed: String,
    /// One row's hand-back, under its lease.
    release: String,
}

/// The SQLite backend.
pub type SqliteStore = SqlStore<SqliteDialect>;

impl SqliteStore {
    /// Opens (creating if missing) the database file a `sqlite://` URL names.
    pub async fn connect(url: &str, max_connections: u32, table: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Query(format!("database.url: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(super::ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(|e| super::unreachable_error(url, e))?;
        Ok(SqlStore::new(pool, table))
    }
}

#[async_trait]
impl Dialect for SqliteDialect {
    type Db = Sqlite;
    type Statements = Statements;

    const BACKEND: Backend = Backend::Sqlite;

    /// SQLite names rows by `rowid` where a table has no `id` (never by `event_id`): every
    /// binding below is an integer.
    fn statements(table: &str, profile: &Profile) -> Statements {
        let t = table.to_string();
        let (key, no_worker) = (profile.key.column(), profile.no_worker);
        let returning = super::claim_columns(profile.key);
        // Whether the row may be claimed at `?1`.
        let claimable_row = "(status = 'pending' OR (status = 'retryable' AND next_retry_at_ms <= ?1) \
                             OR (status = 'delivering' AND lock_until_ms < ?1))";
        Statements {
            pick: format!(
                "SELECT {key}, status FROM {t} INDEXED BY {t}_pick_idx \
                 WHERE status IN ('pending', 'retryable', 'delivering') AND {claimable_row} \
                 ORDER BY created_at_ms, {key} LIMIT ?2"
            ),
            failed: format!(
                "UPDATE {t} SET status = ?, retry_count = retry_count + ?, last_error = ?, next_retry_at_ms = ?, \
                 worker_id = {no_worker}, lock_until_ms = 0, updated_at_ms = ?, plugin_digest = ? \
                 WHERE {key} = ? AND status = 'delivering' AND worker_id = ? AND lock_until_ms = ?"
            ),
            release: format!(
                "UPDATE {t} SET status = 'pending', worker_id = {no_worker}, lock_until_ms = 0, updated_at_ms = ? \
                 WHERE {key} = ? AND status = 'delivering' AND worker_id = ? AND lock_until_ms = ?"
            ),
            take: ByCount::new(move |n| {
                format!(
                    "UPDATE {t} SET status = 'delivering', worker_id = ?, lock_until_ms = ?, updated_at_ms = ? \
                     WHERE {key} IN ({}) RETURNING {returning}",
                    params::<SqliteDialect>(1, n)
                )
            }),
        }
    }

    fn describe_sql(table: &str) -> [String; 2] {
        [
            format!(
                "SELECT name, type, CASE WHEN \"notnull\" = 0 THEN 1 ELSE 0 END FROM pragma_table_info('{table}') ORDER BY cid"
            ),
            format!(
                "SELECT il.name, il.\"unique\", ii.name FROM pragma_index_list('{table}') AS il, \
                 pragma_index_info(il.name) AS ii ORDER BY il.name, ii.seqno"
            ),
        ]
    }

    fn int(row: &SqliteRow, i: usize) -> Result<i64, sqlx::Error> {
        row.try_get(i)
    }

    fn opt_int(row: &SqliteRow, i: usize) -> Result<Option<i64>, sqlx::Error> {
        row.try_get(i)
    }

    fn text(row: &SqliteRow, i: usize) -> Result<String, sqlx::Error> {
        row.try_get(i)
    }

    fn opt_text(row: &SqliteRow, i: usize) -> Result<Option<String>, sqlx::Error> {
        row.try_get(i)
    }

    fn bytes(row: &SqliteRow, i: usize) -> Result<Vec<u8>, sqlx::Error> {
        row.try_get(i)
    }

    /// Anonymous `?`, bound in order: with numbered `$N` placeholders sqlx looks each
    /// parameter up by name, which made a 500-row insert quadratic (a profile showed it
    /// at an eighth of a SQLite drain).
    fn param(_n: usize) -> String {
        "?".into()
    }

    fn rows_affected(result: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        result.rows_affected()
    }

    fn one_writer() -> bool {
        true
    }

    fn migrator() -> &'static Migrator {
        &super::migrate::SQLITE
    }

    fn migration_lock(_table: &str) -> Lock {
        // Takes SQLite's write lock at once: a second starter waits, then finds the work done.
        Lock {
            take: "BEGIN IMMEDIATE".into(),
            checked: false,
            polled: false,
            keep: "COMMIT".into(),
            undo: "ROLLBACK".into(),
        }
    }

    /// The same one write lock as the migrations'.
    fn registry_lock(table: &str) -> Lock {
        Self::migration_lock(table)
    }

    fn index_sql(_table: &str, name: &str) -> String {
        format!("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = '{name}'")
    }

    fn create_index_online(table: &str, name: &str, columns: &str) -> String {
        format!("CREATE INDEX IF NOT EXISTS {name} ON {table} ({columns})")
    }

    /// A unary `+` on the column: SQLite then uses no index for the term.
    fn residual(condition: &str) -> String {
        format!("+{condition}")
    }

    fn drop_index_online(_table: &str, index: &str) -> String {
        format!("DROP INDEX IF EXISTS {index}")
    }

    /// None: the host computes it ([`super::partitions::partition_of`]).
    const PARTITION_HASH: Option<&'static str> = None;

    /// `BEGIN IMMEDIATE` holds the one write lock.
    const SHARE_LOCK: &'static str = "";
    const UPDATE_LOCK: &'static str = "";

    /// SQLite seeks on neither form: it reads its millisecond's earlier rows again.
    fn after_cursor(key: &str, at: &str, again: &str, last: &str) -> String {
        format!("created_at_ms >= {at} AND (created_at_ms > {again} OR {key} > {last})")
    }

    /// Its planner prefers a status-first index and sorts: the partial pick index, named.
    fn waiting_from(table: &str) -> String {
        format!("{table} INDEXED BY {table}_pick_idx")
    }

    const BEGIN_WRITING: Option<&'static str> = Some("BEGIN IMMEDIATE");

    async fn claim_rows(
        store: &SqliteStore,
        worker_id: &str,
        now_ms: i64,
        lock_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<Claimed>, StoreError> {
        // BEGIN IMMEDIATE takes SQLite's write lock before reading, so two claimers
        // (threads or processes) are serialised and never pick the same row.
        let mut tx = store.pool.begin_with("BEGIN IMMEDIATE").await?;
        let picked: Vec<(i64, String)> =
            sqlx::query_as(&store.own.pick).bind(now_ms).bind(i64::from(limit)).fetch_all(&mut *tx).await?;
        if picked.is_empty() {
            // Ended here, not left to the drop: a dropped transaction's rollback is only
            // queued, and until it runs, the idle connection keeps SQLite's write lock from
            // every other process.
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let take = store.own.take.get(picked.len());
        let mut q = sqlx::query(&take).bind(worker_id).bind(lock_until_ms).bind(now_ms);
        for (id, _) in &picked {
            q = q.bind(*id);
        }
        let rows = q.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        let lease = Lease { worker_id: worker_id.to_string(), lock_until_ms, fence: None };
        let mut claimed =
            rows.iter().map(|r| decode_claimed::<Self>(r, lease.clone(), false)).collect::<Result<Vec<_>, _>>()?;
        // Rescues are rare: look up only among the picked rows that were `delivering`.
        let rescued: Vec<i64> = picked.iter().filter(|(_, was)| was == "delivering").map(|(id, _)| *id).collect();
        for c in &mut claimed {
            c.rescued = rescued.contains(&c.id);
        }
        // RETURNING does not promise an order.
        super::sort_claimed(&mut claimed);
        Ok(claimed)
    }

    /// `retryable`/`failed` outcomes, each only under its own lease, in one transaction.
    async fn mark_failed(store: &SqliteStore, marks: &[&Mark], now_ms: i64) -> Result<u64, StoreError> {
        let mut changed = 0;
        let mut tx = store.pool.begin().await?;
        for m in marks {
            changed += sqlx::query(&store.own.failed)
                .bind(m.outcome.status().as_str())
                .bind(m.outcome.counted())
                .bind(m.outcome.error().map(|e| store.fit_error(e)))
                .bind(m.outcome.next_retry_at_ms())
                .bind(now_ms)
                .bind(m.plugin_digest.as_deref().unwrap_or(""))
                .bind(m.id)
                .bind(&m.lease.worker_id)
                .bind(m.lease.lock_until_ms)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        tx.commit().await?;
        Ok(changed)
    }

    async fn release_rows(store: &SqliteStore, rows: &[Held], now_ms: i64) -> Result<u64, StoreError> {
        let mut tx = store.pool.begin().await?;
        let mut changed = 0;
        for r in rows {
            changed += sqlx::query(&store.own.release)
                .bind(now_ms)
                .bind(r.id)
                .bind(&r.lease.worker_id)
                .bind(r.lease.lock_until_ms)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        tx.commit().await?;
        Ok(changed)
    }
}

/// SQLite's types and schema statements (see [`Ddl`]).
pub(super) static DDL: Ddl = Ddl {
    definition: 0,
    shape: affinity,
    suggested: |role| match role {
        Role::Millis | Role::Counter => "INTEGER",
        Role::Envelope => "BLOB",
        _ => "TEXT",
    },
    fix: |table, column, ty, _| {
        format!(
            "SQLite cannot change a column's type in place: rebuild {table} with {column} {ty} \
             (https://www.sqlite.org/lang_altertable.html#otheralter)"
        )
    },
    unique_event_id: |table| format!("CREATE UNIQUE INDEX {table}_event_id_uq ON {table} (event_id);"),
    row_id: true,
    add_columns: |table, columns| {
        columns.iter().map(|(n, d)| format!("ALTER TABLE {table} ADD COLUMN {n} {d}")).collect()
    },
    // rowid is every SQLite index's last column already.
    claim_index: |table, _, key_last| {
        format!(
            "CREATE INDEX IF NOT EXISTS {table}_claim_idx ON {table} (status, next_retry_at_ms, created_at_ms{key_last})"
        )
    },
    drop_invalid_index: None,
    dir: "sqlite",
    // A claim is a short transaction of plain statements, and idle hosts probe.
    routines: &[],
    event_id_key: ["0", "event_id", "TEXT"],
};

/// A declared type by SQLite's type affinity rules (https://www.sqlite.org/datatype3.html, 3.1).
fn affinity(declared: &str) -> Shape {
    let t = declared.trim().to_ascii_lowercase();
    if t.contains("int") {
        Shape::Int { bits: 64 }
    } else if t.contains("char") || t.contains("clob") || t.contains("text") {
        Shape::Text { max_chars: None, binary: false }
    } else if t.contains("blob") || t.is_empty() {
        Shape::Bytes
    } else {
        Shape::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Schema as _;

    /// The claim's pick walks the claimable rows in creation order and stops at the limit:
    /// no sort of the whole backlog.
    #[tokio::test]
    async fn the_pick_walks_the_pick_index_without_sorting_the_backlog() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("plan.db").display());
        let store = SqliteStore::connect(&url, 2, "room_outbox").await.unwrap();
        store.migrate().await.unwrap();
        let plan: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(&format!("EXPLAIN QUERY PLAN {}", store.own.pick)).fetch_all(&store.pool).await.unwrap();
        let plan: Vec<String> = plan.into_iter().map(|(_, _, _, step)| step).collect();
        assert!(plan.iter().any(|s| s.contains("USING INDEX room_outbox_pick_idx")), "{plan:?}");
        assert!(!plan.iter().any(|s| s.contains("TEMP B-TREE")), "the pick sorts: {plan:?}");
    }
}
