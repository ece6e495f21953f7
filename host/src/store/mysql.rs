//! MySQL 8 and MariaDB 10.6+. Without `UPDATE … RETURNING`, a claim is the procedure
//! `<table>_claim` (a routine): one round trip, in which a short transaction runs
//! `SELECT … FOR UPDATE SKIP LOCKED` per claimable status, then `UPDATE` of the picked
//! ids. The outcomes of a batch are written with one statement per kind (`CASE` over the
//! ids).
//!
//! Everything MySQL spells its own way is here: the claim and outcome statements, the
//! migration and registry locks (`GET_LOCK`), the partition hash (`CRC32`), the ranges a
//! read seeks past a cursor with and reads per status, the `ON DUPLICATE KEY` upserts of a
//! consumer's positions and exceptions, online index changes (`ALGORITHM=INPLACE`) and the
//! lock-holder report; and what adopting a table says in MySQL's words ([`DDL`]: its types,
//! the fix and add statements, the claim procedure).

use async_trait::async_trait;
use sqlx::MySql;
use sqlx::migrate::Migrator;
use sqlx::mysql::MySqlPoolOptions;

use sqlx::Row as _;
use sqlx::mysql::MySqlRow;

use super::schema::{self, Ddl, Profile};
use super::sql::{ByCount, Dialect, EXCEPTION_COLUMNS, Lock, SqlStore, decode_routine_claimed};
use super::{Backend, Claimed, Held, Lease, Mark, StoreError};

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
                    // A value too long for its column is an error, never a shortened value,
                    // whatever the server's default mode.
                    sqlx::Executor::execute(
                        &mut *conn,
                        "SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@sql_mode, ''), 'STRICT_ALL_TABLES')",
                    )
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

    const BACKEND: Backend = Backend::Mysql;

    fn statements(table: &str, profile: &Profile) -> Statements {
        let (failed_table, release_table) = (table.to_string(), table.to_string());
        let (key, no_worker) = (profile.key.column(), profile.no_worker);
        Statements {
            claim: format!("CALL {table}_claim(?, ?, ?, ?)"),
            failed: ByCount::new(move |n| {
                let case = |column: &str| format!("{column} = CASE {key}{} END", " WHEN ? THEN ?".repeat(n));
                format!(
                    "UPDATE {failed_table} SET {}, {}, {}, retry_count = retry_count + CASE {key}{} END, \
                     worker_id = {no_worker}, lock_until_ms = 0, updated_at_ms = ?, plugin_digest = ? WHERE 1 = 1{}",
                    case("status"),
                    case("last_error"),
                    case("next_retry_at_ms"),
                    " WHEN ? THEN ?".repeat(n),
                    lease_filter(key, n)
                )
            }),
            release: ByCount::new(move |n| {
                format!(
                    "UPDATE {release_table} SET status = 'pending', worker_id = {no_worker}, lock_until_ms = 0, \
                     updated_at_ms = ? WHERE 1 = 1{}",
                    lease_filter(key, n)
                )
            }),
        }
    }

    fn describe_sql(table: &str) -> [String; 2] {
        [
            format!(
                "SELECT column_name, column_type, CASE WHEN is_nullable = 'YES' THEN 1 ELSE 0 END \
                 FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = '{table}' \
                 ORDER BY ordinal_position"
            ),
            format!(
                "SELECT index_name, CASE WHEN non_unique = 0 THEN 1 ELSE 0 END, column_name \
                 FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = '{table}' \
                 ORDER BY index_name, seq_in_index"
            ),
        ]
    }

    /// The claim procedure (versions 3, 4, 5, 9, 12, 17 and 18) of a table without `id` picks in
    /// `event_id` order, carries the event ids (as text, so that a binary column reads the
    /// same in JSON), and returns 0 for `id`. Version 9's walk cannot resume within a
    /// millisecond by key (a procedure variable cannot hold a key of the table's own
    /// collation), so it starts at the first head's millisecond and stops before the
    /// millisecond of its cut: runs are shorter where many events share a millisecond, never
    /// wrong. Version 12 keeps its keys in user variables, which take the column's own type
    /// and collation, so it walks, cuts and steps by `event_id` as it does by `id`.
    // Unchecked: the value is read as the column's bytes say (any integer width, signed or
    // not; any string collation, binary included); sqlx's type check would refuse
    // `BIGINT UNSIGNED` and `VARBINARY` outright.
    fn int(row: &MySqlRow, i: usize) -> Result<i64, sqlx::Error> {
        row.try_get_unchecked(i)
    }

    fn opt_int(row: &MySqlRow, i: usize) -> Result<Option<i64>, sqlx::Error> {
        row.try_get_unchecked(i)
    }

    fn text(row: &MySqlRow, i: usize) -> Result<String, sqlx::Error> {
        row.try_get_unchecked(i)
    }

    fn opt_text(row: &MySqlRow, i: usize) -> Result<Option<String>, sqlx::Error> {
        row.try_get_unchecked(i)
    }

    fn bytes(row: &MySqlRow, i: usize) -> Result<Vec<u8>, sqlx::Error> {
        row.try_get_unchecked(i)
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

    fn clock_sql() -> Option<&'static str> {
        Some("SELECT CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)")
    }

    fn migration_lock(table: &str) -> Lock {
        // DDL commits implicitly in MySQL, so a named lock (not a transaction) keeps two
        // starting hosts from migrating at once.
        Lock {
            take: format!("SELECT GET_LOCK('{table}_migrations', 60)"),
            checked: true,
            polled: false,
            keep: format!("SELECT RELEASE_LOCK('{table}_migrations')"),
            undo: format!("SELECT RELEASE_LOCK('{table}_migrations')"),
        }
    }

    fn registry_lock(table: &str) -> Lock {
        let name = format!("SHA1(CONCAT(DATABASE(), '.{table}_fanout'))");
        Lock {
            take: format!("SELECT GET_LOCK({name}, 60)"),
            checked: true,
            polled: false,
            keep: format!("SELECT RELEASE_LOCK({name})"),
            undo: format!("SELECT RELEASE_LOCK({name})"),
        }
    }

    fn ddl_lock_timeout(ms: u64) -> Option<[String; 2]> {
        Some([
            format!("SET SESSION lock_wait_timeout = {}", ms.div_ceil(1_000)),
            "SET SESSION lock_wait_timeout = DEFAULT".into(),
        ])
    }

    fn lock_holders_sql(_table: &str) -> Option<String> {
        Some(
            "SELECT CONCAT('thread ', trx_mysql_thread_id, ' (transaction open ', \
             TIMESTAMPDIFF(SECOND, trx_started, NOW()), ' s)') FROM information_schema.innodb_trx \
             WHERE trx_mysql_thread_id <> CONNECTION_ID()"
                .into(),
        )
    }

    fn index_sql(table: &str, name: &str) -> String {
        format!(
            "SELECT DISTINCT 1 FROM information_schema.statistics \
             WHERE table_schema = DATABASE() AND table_name = '{table}' AND index_name = '{name}'"
        )
    }

    fn create_index_online(table: &str, name: &str, columns: &str) -> String {
        format!("CREATE INDEX {name} ON {table} ({columns}) ALGORITHM=INPLACE LOCK=NONE")
    }

    fn drop_index_online(table: &str, index: &str) -> String {
        format!("ALTER TABLE {table} DROP INDEX {index}, ALGORITHM=INPLACE, LOCK=NONE")
    }

    const PARTITION_HASH: Option<&'static str> = Some("(CRC32(CONCAT(app_code, ':', room_id)) % {total})");

    const SHARE_LOCK: &'static str = " LOCK IN SHARE MODE";
    const UPDATE_LOCK: &'static str = " FOR UPDATE";

    /// Ranges MySQL's optimizer merges in order.
    fn after_cursor(key: &str, at: &str, again: &str, last: &str) -> String {
        format!("(created_at_ms > {at} OR (created_at_ms = {again} AND {key} > {last}))")
    }

    /// The claim index starts with the status: one range per status, merged.
    const WAITING: &'static [&'static str] = &["status = 'pending'", "status = 'retryable'", "status = 'delivering'"];

    fn set_position_sql(positions: &str) -> String {
        format!(
            "INSERT INTO {positions} (sink, part, created_at_ms, row_key, updated_at_ms) VALUES (?, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE created_at_ms = VALUES(created_at_ms), row_key = VALUES(row_key), \
             updated_at_ms = VALUES(updated_at_ms)"
        )
    }

    /// Delivered wins over anything but delivered: each column keeps its value once it is.
    fn set_exception_sql(exceptions: &str) -> String {
        let keep = |column: &str| format!("{column} = IF(status = 'delivered', {column}, VALUES({column}))");
        format!(
            "INSERT INTO {exceptions} ({EXCEPTION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULLIF(?, ''), ?, NULLIF(?, '')) \
             ON DUPLICATE KEY UPDATE \
             retry_count = IF(status = 'delivered', retry_count, retry_count + VALUES(retry_count)), {}, {}, {}, {}, \
             status = IF(status = 'delivered', status, VALUES(status))",
            keep("next_retry_at_ms"),
            keep("last_error"),
            keep("updated_at_ms"),
            keep("plugin_digest"),
        )
    }

    async fn claim_rows(
        store: &MysqlStore,
        worker_id: &str,
        now_ms: i64,
        lock_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<Claimed>, StoreError> {
        // One round trip: the claim procedure (migrations/routines/mysql_claim.sql) picks,
        // leases and returns the rows in claim order, in its own short transaction. Claimers
        // racing over the same index ranges can deadlock on InnoDB's gap locks; the server
        // then rolls the procedure's transaction back whole (nothing leased), and the claim
        // is tried again.
        let rows = super::sql::retrying_deadlocks(std::time::Duration::from_millis(5), || {
            sqlx::query(&store.own.claim)
                .bind(worker_id)
                .bind(lock_until_ms)
                .bind(now_ms)
                .bind(i32::try_from(limit).unwrap_or(i32::MAX))
                .fetch_all(&store.pool)
        })
        .await?;
        let lease = Lease { worker_id: worker_id.to_string(), lock_until_ms, fence: None };
        Ok(rows.iter().map(|r| decode_routine_claimed::<Self>(r, lease.clone())).collect::<Result<_, _>>()?)
    }

    /// `retryable`/`failed` outcomes, each only under its own lease, in one statement.
    async fn mark_failed(store: &MysqlStore, marks: &[&Mark], now_ms: i64) -> Result<u64, StoreError> {
        let sql = store.own.failed.get(marks.len());
        let mut q = sqlx::query(&sql);
        let by_event = store.profile.key.is_text();
        // Bound in the order of the text: (key, status) …, (key, error) …, (key, next
        // retry) …, (key, counted) …, then the time, then the leases.
        macro_rules! key {
            ($q:expr, $m:expr) => {
                if by_event { $q.bind($m.event_id.as_str()) } else { $q.bind($m.id) }
            };
        }
        for m in marks {
            q = key!(q, m).bind(m.outcome.status().as_str());
        }
        for m in marks {
            q = key!(q, m).bind(m.outcome.error().map(|e| store.fit_error(e).into_owned()));
        }
        for m in marks {
            q = key!(q, m).bind(m.outcome.next_retry_at_ms());
        }
        for m in marks {
            q = key!(q, m).bind(m.outcome.counted());
        }
        q = q.bind(now_ms).bind(super::sql::digest_of(marks));
        for m in marks {
            q = key!(q, m).bind(m.lease.worker_id.as_str()).bind(m.lease.lock_until_ms);
        }
        Ok(q.execute(&store.pool).await?.rows_affected())
    }

    async fn release_rows(store: &MysqlStore, rows: &[Held], now_ms: i64) -> Result<u64, StoreError> {
        let sql = store.own.release.get(rows.len());
        let mut q = sqlx::query(&sql).bind(now_ms);
        for r in rows {
            q = if store.profile.key.is_text() { q.bind(r.event_id.as_str()) } else { q.bind(r.id) };
            q = q.bind(r.lease.worker_id.as_str()).bind(r.lease.lock_until_ms);
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

/// ` AND status = 'delivering' AND (key, worker_id, lock_until_ms) IN ((?, ?, ?), …)` for
/// `count` rows: only rows still held under the same lease.
fn lease_filter(key: &str, count: usize) -> String {
    format!(
        " AND status = 'delivering' AND ({key}, worker_id, lock_until_ms) IN ({})",
        vec!["(?, ?, ?)"; count].join(", ")
    )
}

/// MySQL's and MariaDB's types and schema statements (see [`Ddl`]).
pub(super) static DDL: Ddl = Ddl {
    definition: 2,
    shape: |declared| schema::server_shape(declared, false),
    suggested: |role| schema::server_suggested(role, "MEDIUMBLOB"),
    fix: |table, column, ty, null| format!("ALTER TABLE {table} MODIFY COLUMN {column} {ty} {null};"),
    unique_event_id: |table| {
        format!("ALTER TABLE {table} ADD UNIQUE INDEX {table}_event_id_uq (event_id), ALGORITHM=INPLACE, LOCK=NONE;")
    },
    row_id: false,
    // One statement for every column (see `schema::mysql_fallback`).
    add_columns: |table, columns| {
        if columns.is_empty() {
            return Vec::new();
        }
        let adds: Vec<String> = columns.iter().map(|(n, d)| format!("ADD COLUMN {n} {d}")).collect();
        vec![format!("ALTER TABLE {table} {}, ALGORITHM=INSTANT", adds.join(", "))]
    },
    claim_index: |table, key, _| {
        format!(
            "ALTER TABLE {table} ADD INDEX {table}_claim_idx (status, created_at_ms, {key}, next_retry_at_ms, lock_until_ms), \
             ALGORITHM=INPLACE, LOCK=NONE"
        )
    },
    drop_invalid_index: None,
    dir: "mysql",
    routines: &[("claim", include_str!("../../../migrations/routines/mysql_claim.sql"))],
    event_id_key: ["0", "CONVERT(event_id USING utf8mb4)", "VARCHAR(255)"],
};
