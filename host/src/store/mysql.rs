//! MySQL 8 and MariaDB 10.6+. Without `UPDATE … RETURNING`, a claim is the procedure
//! `<table>_claim` (migration 3): one round trip, in which a short transaction runs
//! `SELECT … FOR UPDATE SKIP LOCKED` per claimable status, then `UPDATE` of the picked
//! ids. The outcomes of a batch are written with one statement per kind (`CASE` over the
//! ids).

use async_trait::async_trait;
use sqlx::MySql;
use sqlx::migrate::Migrator;
use sqlx::mysql::MySqlPoolOptions;

use sqlx::Row as _;
use sqlx::mysql::MySqlRow;

use super::schema::{Key, Profile};
use super::sql::{ByCount, Dialect, MigrationLock, SqlStore, decode_routine_claimed};
use super::{Backend, Claimed, Held, Lease, Mark, RoomOrder, StoreError};

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

/// Version 12's claim procedure (and versions 17's and 18's restatements of it) for a table
/// keyed by `event_id`.
const BOUNDED_WALK: &[(&str, &str)] = &[
    // The cut.
    ("(SELECT created_at_ms, id FROM ", "(SELECT created_at_ms, event_id AS id FROM "),
    ("ORDER BY created_at_ms, id LIMIT 1 OFFSET", "ORDER BY created_at_ms, event_id LIMIT 1 OFFSET"),
    ("h.id <= @", "h.event_id <= @"),
    ("h.id > @", "h.event_id > @"),
    // The walk's head check.
    ("AND h.id = (SELECT e.id FROM", "AND h.event_id = (SELECT e.event_id FROM"),
    ("ORDER BY e.created_at_ms, e.id LIMIT 1)", "ORDER BY e.created_at_ms, e.event_id LIMIT 1)"),
    // The heads in turns.
    ("SELECT o.id FROM JSON_TABLE(v_heads", "SELECT CONVERT(o.event_id USING utf8mb4) AS id FROM JSON_TABLE(v_heads"),
    ("COLUMNS (id BIGINT PATH '$')) AS hs", "COLUMNS (id VARCHAR(255) PATH '$')) AS hs"),
    ("AS o ON o.id = hs.id", "AS o ON o.event_id = hs.id"),
    ("ORDER BY o.created_at_ms, o.id LIMIT v_turn", "ORDER BY o.created_at_ms, o.event_id LIMIT v_turn"),
    // The rooms' first events.
    ("SELECT room_id, app_code, id INTO", "SELECT room_id, app_code, CONVERT(event_id USING utf8mb4) INTO"),
    (
        "ORDER BY status, room_id, app_code, created_at_ms, id LIMIT 1",
        "ORDER BY status, room_id, app_code, created_at_ms, event_id LIMIT 1",
    ),
    (
        "SELECT h.id FROM JSON_TABLE(v_rooms, '$[*]' COLUMNS (id BIGINT PATH '$')) AS rm",
        "SELECT CONVERT(h.event_id USING utf8mb4) AS id FROM JSON_TABLE(v_rooms, '$[*]' COLUMNS (id VARCHAR(255) PATH '$')) AS rm",
    ),
    ("AS h ON h.id = rm.id", "AS h ON h.event_id = rm.id"),
    ("SELECT MIN(f.id) AS k FROM (", "SELECT CONVERT(MIN(f.event_id) USING utf8mb4) AS k FROM ("),
    ("ORDER BY h.created_at_ms, h.id LIMIT v_left", "ORDER BY h.created_at_ms, h.event_id LIMIT v_left"),
    // The runs.
    ("SELECT o.created_at_ms, o.id\n", "SELECT o.created_at_ms, o.event_id AS id\n"),
    ("COLUMNS (id BIGINT PATH '$[0]')) AS lp", "COLUMNS (id VARCHAR(255) PATH '$[0]')) AS lp"),
    ("AS o ON o.id = lp.id", "AS o ON o.event_id = lp.id"),
    ("ORDER BY o.created_at_ms DESC, o.id DESC", "ORDER BY o.created_at_ms DESC, o.event_id DESC"),
    ("nx.id < @", "nx.event_id < @"),
    ("COLUMNS (id BIGINT PATH '$[0]')) AS hp", "COLUMNS (id VARCHAR(255) PATH '$[0]')) AS hp"),
    ("AS o ON o.id = hp.id", "AS o ON o.event_id = hp.id"),
    (
        "SELECT o.id, o.room_id, o.app_code, o.created_at_ms, o.id, 1",
        "SELECT o.event_id, o.room_id, o.app_code, o.created_at_ms, o.event_id, 1",
    ),
    ("nx.created_at_ms, nx.id, r.n + 1", "nx.created_at_ms, nx.event_id, r.n + 1"),
    ("AS nx ON nx.id = r.next_id", "AS nx ON nx.event_id = r.next_id"),
    ("(SELECT e.id FROM", "(SELECT e.event_id FROM"),
    ("e.id > o.id", "e.event_id > o.event_id"),
    ("e.id > nx.id", "e.event_id > nx.event_id"),
    ("b.created_at_ms = r.c AND b.id > r.id", "b.created_at_ms = r.c AND b.event_id > r.id"),
    (
        "b.created_at_ms = nx.created_at_ms AND b.id < nx.id",
        "b.created_at_ms = nx.created_at_ms AND b.event_id < nx.event_id",
    ),
    (
        "SELECT head, id FROM run WHERE n > 1",
        "SELECT CONVERT(head USING utf8mb4) AS head, CONVERT(id USING utf8mb4) AS id FROM run WHERE n > 1",
    ),
    // The cut of heads and runs, and its lock.
    ("head BIGINT PATH '$[2]'", "head VARCHAR(255) PATH '$[2]'"),
    ("SELECT o.id, p.was FROM JSON_TABLE(", "SELECT CONVERT(o.event_id USING utf8mb4) AS id, p.was FROM JSON_TABLE("),
    ("AS h ON h.id = COALESCE(p.head, p.id)", "AS h ON h.event_id = COALESCE(p.head, p.id)"),
    ("IF(v_few, h.id, o.id),", "IF(v_few, h.event_id, o.event_id),"),
    (
        "o.created_at_ms, o.id\n                 LIMIT p_limit",
        "o.created_at_ms, o.event_id\n                 LIMIT p_limit",
    ),
    ("SELECT c.id, k.was FROM", "SELECT CONVERT(c.event_id USING utf8mb4) AS id, k.was FROM"),
    ("ON c.id = k.id", "ON c.event_id = k.id"),
];

#[async_trait]
impl Dialect for MysqlDialect {
    type Db = MySql;
    type Statements = Statements;

    const BACKEND: Backend = Backend::Mysql;

    fn statements(table: &str, profile: &Profile) -> Statements {
        let (failed_table, release_table) = (table.to_string(), table.to_string());
        let (key, no_worker) = (profile.key.column(), profile.no_worker);
        Statements {
            claim: format!("CALL {table}_claim(?, ?, ?, ?, ?, ?, ?)"),
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
    fn adapt_migration(version: i64, sql: String, key: Key) -> Result<String, String> {
        if !matches!(version, 3..=5 | 9 | 12 | 13 | 17 | 18) || key != Key::EventId {
            return Ok(sql);
        }
        use super::sql::replace_all;
        if version == 13 {
            // Only the claim index: its key column.
            return replace_all(
                sql,
                &[("created_at_ms, id, next_retry_at_ms", "created_at_ms, event_id, next_retry_at_ms")],
            );
        }
        // What versions 5 and 9 share after the runs are found: lock them, cut the claim.
        const LOCK_AND_CUT: &[(&str, &str)] = &[
            ("COLUMNS (id BIGINT PATH '$[0]')) AS hp", "COLUMNS (id VARCHAR(255) PATH '$[0]')) AS hp"),
            (
                "COLUMNS (id BIGINT PATH '$')) AS nx ON c.id = nx.id",
                "COLUMNS (id VARCHAR(255) PATH '$')) AS nx ON c.event_id = nx.id",
            ),
            (
                "SELECT o.id, p.was FROM JSON_TABLE(",
                "SELECT CONVERT(o.event_id USING utf8mb4) AS id, p.was FROM JSON_TABLE(",
            ),
            ("ORDER BY o.created_at_ms, o.id LIMIT p_limit", "ORDER BY o.created_at_ms, o.event_id LIMIT p_limit"),
        ];
        let sql = match version {
            5 => replace_all(
                replace_all(sql, LOCK_AND_CUT)?,
                &[
                    (
                        "SELECT r.id FROM (\n                    SELECT x.id,",
                        "SELECT r.id FROM (\n                    SELECT CONVERT(x.event_id USING utf8mb4) AS id,",
                    ),
                    ("COLUMNS (id BIGINT PATH '$[0]')) AS lp", "COLUMNS (id VARCHAR(255) PATH '$[0]')) AS lp"),
                    ("AS o ON o.id = lp.id", "AS o ON o.event_id = lp.id"),
                    ("AS h ON h.id = hp.id", "AS h ON h.event_id = hp.id"),
                    ("x.id > h.id", "x.event_id > h.event_id"),
                    ("ORDER BY x.created_at_ms, x.id", "ORDER BY x.created_at_ms, x.event_id"),
                ],
            )?,
            9 => replace_all(
                replace_all(sql, LOCK_AND_CUT)?,
                &[
                    ("MAX(f.created_at_ms), MAX(f.id) INTO", "MAX(f.created_at_ms), 0 INTO"),
                    ("SELECT o.created_at_ms, o.id\n", "SELECT o.created_at_ms\n"),
                    ("COLUMNS (id BIGINT PATH '$[0]')) AS fp", "COLUMNS (id VARCHAR(255) PATH '$[0]')) AS fp"),
                    ("AS o ON o.id = fp.id", "AS o ON o.event_id = fp.id"),
                    ("ORDER BY o.created_at_ms, o.id LIMIT 1", "ORDER BY o.created_at_ms, o.event_id LIMIT 1"),
                    ("OR id >= v_first_id", "OR TRUE"),
                    ("MAX(e.created_at_ms), MAX(e.id) INTO", "MAX(e.created_at_ms), 0 INTO"),
                    ("(SELECT created_at_ms, id FROM ", "(SELECT created_at_ms, event_id AS id FROM "),
                    ("ORDER BY created_at_ms, id LIMIT 1 OFFSET", "ORDER BY created_at_ms, event_id LIMIT 1 OFFSET"),
                    ("(SELECT id FROM ", "(SELECT event_id AS id FROM "),
                    ("ORDER BY created_at_ms, id LIMIT p_limit)", "ORDER BY created_at_ms, event_id LIMIT p_limit)"),
                    ("AS c ON c.id = walk.id", "AS c ON c.event_id = walk.id"),
                    ("OR (c.created_at_ms = v_cut_c AND c.id <= v_cut_id)", ""),
                    (
                        "SELECT c.id,\n                           ROW_NUMBER() OVER w AS n,\n                           FIRST_VALUE(c.id)",
                        "SELECT CONVERT(c.event_id USING utf8mb4) AS id,\n                           ROW_NUMBER() OVER w AS n,\n                           FIRST_VALUE(c.event_id)",
                    ),
                    ("ORDER BY c.created_at_ms, c.id)", "ORDER BY c.created_at_ms, c.event_id)"),
                    // The head check reads the room's first event in each status.
                    ("AND h.id = (SELECT e.id FROM", "AND h.event_id = (SELECT e.event_id FROM"),
                    ("ORDER BY e.created_at_ms, e.id LIMIT 1)", "ORDER BY e.created_at_ms, e.event_id LIMIT 1)"),
                ],
            )?,
            // Version 12's index, then its procedure; versions 17 and 18 restate the procedure.
            12 => replace_all(
                replace_all(sql, &[("created_at_ms, id), ALGORITHM", "created_at_ms, event_id), ALGORITHM")])?,
                BOUNDED_WALK,
            )?,
            17 => replace_all(sql, BOUNDED_WALK)?,
            // Version 18 also counts the pending events up to the runs' bound.
            18 => replace_all(replace_all(sql, BOUNDED_WALK)?, &[("AND id <= @", "AND event_id <= @")])?,
            _ => sql,
        };
        let sql = if matches!(version, 4 | 5 | 9 | 12 | 17 | 18) {
            super::sql::replace_all(
                sql,
                &[
                    (
                        "(SELECT h.id, h.created_at_ms FROM",
                        "(SELECT CONVERT(h.event_id USING utf8mb4) AS id, h.created_at_ms, h.event_id AS k FROM",
                    ),
                    (
                        "ORDER BY h.created_at_ms, h.id LIMIT p_limit)",
                        "ORDER BY h.created_at_ms, h.event_id LIMIT p_limit)",
                    ),
                    ("e.id < h.id", "e.event_id < h.event_id"),
                    (
                        "COLUMNS (id BIGINT PATH '$')) AS hd ON c.id = hd.id",
                        "COLUMNS (id VARCHAR(255) PATH '$')) AS hd ON c.event_id = hd.id",
                    ),
                    ("SELECT c.id, c.status FROM", "SELECT CONVERT(c.event_id USING utf8mb4) AS id, c.status FROM"),
                    ("ORDER BY c.created_at_ms, c.id\n", "ORDER BY c.created_at_ms, c.event_id\n"),
                ],
            )?
        } else {
            sql
        };
        super::sql::replace_all(
            sql,
            &[
                (
                    "SELECT id, status, created_at_ms FROM",
                    "SELECT CONVERT(event_id USING utf8mb4) AS id, status, created_at_ms, event_id AS k FROM",
                ),
                (
                    "ORDER BY created_at_ms, id LIMIT p_limit FOR UPDATE",
                    "ORDER BY created_at_ms, event_id LIMIT p_limit FOR UPDATE",
                ),
                ("ORDER BY created_at_ms, id LIMIT p_limit\n", "ORDER BY created_at_ms, k LIMIT p_limit\n"),
                (
                    "(id BIGINT PATH '$[0]')) AS p ON o.id = p.id",
                    "(id VARCHAR(255) PATH '$[0]')) AS p ON o.event_id = p.id",
                ),
                ("SELECT o.id, o.app_code", "SELECT 0, o.app_code"),
                ("COLUMNS (id BIGINT PATH '$[0]', was", "COLUMNS (id VARCHAR(255) PATH '$[0]', was"),
                ("AS o ON o.id = p.id\n", "AS o ON o.event_id = p.id\n"),
                ("ORDER BY o.created_at_ms, o.id;", "ORDER BY o.created_at_ms, o.event_id;"),
            ],
        )
    }

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

    fn migration_lock(table: &str) -> MigrationLock {
        // DDL commits implicitly in MySQL, so a named lock (not a transaction) keeps two
        // starting hosts from migrating at once.
        MigrationLock {
            take: format!("SELECT GET_LOCK('{table}_migrations', 60)"),
            checked: true,
            polled: false,
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
        order: RoomOrder,
    ) -> Result<Vec<Claimed>, StoreError> {
        // One round trip: the claim procedure of migration 5 picks, leases and returns the
        // rows in claim order, in its own short transaction.
        let (ordered, failed_blocks, run) = order.flags();
        let rows = sqlx::query(&store.own.claim)
            .bind(worker_id)
            .bind(lock_until_ms)
            .bind(now_ms)
            .bind(i32::try_from(limit).unwrap_or(i32::MAX))
            .bind(ordered)
            .bind(failed_blocks)
            .bind(i32::try_from(run).unwrap_or(i32::MAX))
            .fetch_all(&store.pool)
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
