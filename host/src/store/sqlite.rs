//! The embedded default: SQLite in WAL mode. A claim is one short `BEGIN IMMEDIATE`
//! transaction (pick, then `UPDATE … RETURNING`), which takes SQLite's write lock before it
//! reads, so two claimers (threads or processes) are serialised and never share a row.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Sqlite;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use sqlx::Row as _;
use sqlx::sqlite::SqliteRow;

use super::schema::Profile;
use super::sql::{ByCount, Dialect, MigrationLock, SqlStore, decode_claimed, params};
use super::{Backend, Claimed, Held, Lease, Mark, RoomOrder, StoreError};

/// SQLite's [`Dialect`].
pub struct SqliteDialect;

/// SQLite's own statements.
pub struct Statements {
    /// The claim's pick, in claim order: a walk of `<table>_pick_idx` (named, because
    /// without statistics SQLite would rather gather every claimable row and sort them)
    /// that stops at the limit.
    pick: String,
    /// The pick of rooms' heads only (`RoomOrder::PerRoom`; `?3` is `failed_blocks`), with
    /// their creation times, from a walk that ends at the claimable event `(?4, ?5)`.
    pick_heads: String,
    /// The `?2`-th claimable event in claim order, if the backlog is that long: where the
    /// heads' walk ends.
    reach: String,
    /// Rooms' heads past the walk's reach (`?4`, `?5`), oldest first, at most `?2`: from a
    /// walk of the rooms that have an event in a claimable status, one read per room.
    room_heads: String,
    /// Each head's run (heads `?6…`): of its room's unfinished events after it, none after
    /// (`?4`, `?5`) in claim order, the first `?3 - 1` while each is claimable (`?1`), with
    /// the head it follows. Walked one event at a time from the head, so a run costs `?3`
    /// index reads however deep the room's backlog, and however many of its events share a
    /// millisecond.
    runs: ByCount,
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
        // Whether the row aliased `a` may be claimed at `?1`.
        let claimable = |a: &str| {
            format!(
                "({a}status = 'pending' OR ({a}status = 'retryable' AND {a}next_retry_at_ms <= ?1) \
                 OR ({a}status = 'delivering' AND {a}lock_until_ms < ?1))"
            )
        };
        let (claimable_row, claimable_c, claimable_x) = (claimable(""), claimable("c."), claimable("x."));
        // Whether the event `c` heads its room: no unfinished event of the room (`failed`
        // ones only when `?3`) comes before it. One read of the room order index (status
        // first) per status: each status's first event in the room, however deep the room's
        // backlog or history.
        let earlier = |s: &str| {
            format!(
                "IFNULL((SELECT e.created_at_ms, e.{key} FROM {t} AS e INDEXED BY {t}_room_order_idx \
                          WHERE e.status = '{s}' AND e.room_id = c.room_id AND e.app_code = c.app_code \
                          ORDER BY e.created_at_ms, e.{key} LIMIT 1) < (c.created_at_ms, c.{key}), 0)"
            )
        };
        let head_c = format!(
            "NOT ({} OR {} OR {} OR (?3 AND {}))",
            earlier("pending"),
            earlier("delivering"),
            earlier("retryable"),
            earlier("failed")
        );
        Statements {
            pick: format!(
                "SELECT {key}, status FROM {t} INDEXED BY {t}_pick_idx \
                 WHERE status IN ('pending', 'retryable', 'delivering') AND {claimable_row} \
                 ORDER BY created_at_ms, {key} LIMIT ?2"
            ),
            pick_heads: format!(
                "SELECT c.{key}, c.status, c.created_at_ms FROM {t} AS c INDEXED BY {t}_pick_idx \
                 WHERE c.status IN ('pending', 'retryable', 'delivering') AND {claimable_c} \
                   AND c.created_at_ms <= ?4 AND (c.created_at_ms < ?4 OR c.{key} <= ?5) AND {head_c} \
                 ORDER BY c.created_at_ms, c.{key} LIMIT ?2"
            ),
            reach: format!(
                "SELECT created_at_ms, {key} FROM {t} INDEXED BY {t}_pick_idx \
                 WHERE status IN ('pending', 'retryable', 'delivering') AND {claimable_row} \
                 ORDER BY created_at_ms, {key} LIMIT 1 OFFSET ?2 - 1"
            ),
            room_heads: {
                // Per claimable status, the rooms that have an event in it: a loose walk of
                // the room order index (status first), one read per room (the next app of
                // the same room, else the next room: a row value `>` here would read the
                // whole room); then each room's first event in that status, which heads the
                // room if nothing unfinished comes before it.
                let first_room = |s: &str| {
                    format!(
                        "SELECT * FROM (SELECT '{s}', room_id, app_code FROM {t} INDEXED BY {t}_room_order_idx \
                          WHERE status = '{s}' ORDER BY room_id, app_code LIMIT 1)"
                    )
                };
                format!(
                    "WITH RECURSIVE rooms(status, room_id, app_code) AS ( \
                       {} UNION ALL {} UNION ALL {} \
                       UNION ALL \
                       SELECT r.status, n.room_id, n.app_code FROM rooms AS r CROSS JOIN {t} AS n \
                        WHERE n.{key} = COALESCE( \
                                (SELECT y.{key} FROM {t} AS y INDEXED BY {t}_room_order_idx \
                                  WHERE y.status = r.status AND y.room_id = r.room_id AND y.app_code > r.app_code \
                                  ORDER BY y.app_code LIMIT 1), \
                                (SELECT y.{key} FROM {t} AS y INDEXED BY {t}_room_order_idx \
                                  WHERE y.status = r.status AND y.room_id > r.room_id \
                                  ORDER BY y.room_id, y.app_code LIMIT 1))) \
                     SELECT c.{key}, c.status, c.created_at_ms FROM rooms AS r CROSS JOIN {t} AS c \
                      WHERE c.{key} = (SELECT f.{key} FROM {t} AS f INDEXED BY {t}_room_order_idx \
                                        WHERE f.status = r.status AND f.room_id = r.room_id AND f.app_code = r.app_code \
                                        ORDER BY f.created_at_ms, f.{key} LIMIT 1) \
                        AND {claimable_c} \
                        AND (c.created_at_ms > ?4 OR (c.created_at_ms = ?4 AND c.{key} > ?5)) AND {head_c} \
                      ORDER BY c.created_at_ms, c.{key} LIMIT ?2",
                    first_room("pending"),
                    first_room("retryable"),
                    first_room("delivering")
                )
            },
            runs: {
                let t = t.clone();
                ByCount::new(move |n| {
                    let heads: Vec<String> = (6..6 + n).map(|i| format!("?{i}")).collect();
                    // `y` is an unfinished event of the room of the run's step `r`, before
                    // (`?4`, `?5`).
                    let in_room = format!(
                        "y.room_id = r.room_id AND y.app_code = r.app_code \
                         AND y.status IN ('pending', 'delivering', 'retryable', 'failed') AND (y.status <> 'failed' OR ?2) \
                         AND (y.created_at_ms < ?4 OR (y.created_at_ms = ?4 AND y.{key} < ?5))"
                    );
                    format!(
                        "WITH RECURSIVE run(head, head_at, room_id, app_code, id, status, created_at_ms, n) AS ( \
                           SELECT h.{key}, h.created_at_ms, h.room_id, h.app_code, h.{key}, h.status, h.created_at_ms, 0 \
                             FROM {t} AS h WHERE h.{key} IN ({}) \
                           UNION ALL \
                           SELECT r.head, r.head_at, r.room_id, r.app_code, x.{key}, x.status, x.created_at_ms, r.n + 1 \
                             FROM run AS r CROSS JOIN {t} AS x \
                            WHERE r.n < ?3 - 1 \
                              AND x.{key} = COALESCE( \
                                    (SELECT y.{key} FROM {t} AS y \
                                      WHERE {in_room} AND y.created_at_ms = r.created_at_ms AND y.{key} > r.id \
                                      ORDER BY y.{key} LIMIT 1), \
                                    (SELECT y.{key} FROM {t} AS y \
                                      WHERE {in_room} AND y.created_at_ms > r.created_at_ms AND y.created_at_ms <= ?4 \
                                      ORDER BY y.created_at_ms, y.{key} LIMIT 1)) \
                              AND {claimable_x}) \
                         SELECT head, head_at, id, status, created_at_ms FROM run WHERE n > 0",
                        heads.join(", ")
                    )
                })
            },
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

    fn migration_lock(_table: &str) -> MigrationLock {
        // Takes SQLite's write lock at once: a second starter waits, then finds the work done.
        MigrationLock {
            take: "BEGIN IMMEDIATE".into(),
            checked: false,
            polled: false,
            keep: "COMMIT".into(),
            undo: "ROLLBACK".into(),
        }
    }

    async fn claim_rows(
        store: &SqliteStore,
        worker_id: &str,
        now_ms: i64,
        lock_until_ms: i64,
        limit: u32,
        order: RoomOrder,
    ) -> Result<Vec<Claimed>, StoreError> {
        // BEGIN IMMEDIATE takes SQLite's write lock before reading, so two claimers
        // (threads or processes) are serialised and never pick the same row.
        let mut tx = store.pool.begin_with("BEGIN IMMEDIATE").await?;
        let picked: Vec<(i64, String)> = match order {
            RoomOrder::Unordered => {
                sqlx::query_as(&store.own.pick).bind(now_ms).bind(i64::from(limit)).fetch_all(&mut *tx).await?
            }
            RoomOrder::PerRoom { failed_blocks, run } => {
                // The heads among the first `2 × limit` claimable events; when those are
                // short and the backlog goes on (busy rooms whose heads are in flight), the
                // rest from the rooms, so a claim never reads a busy room's backlog.
                let reach: Option<(i64, i64)> = sqlx::query_as(&store.own.reach)
                    .bind(now_ms)
                    .bind(2 * i64::from(limit))
                    .fetch_optional(&mut *tx)
                    .await?;
                let (reach_at, reach_id) = reach.unwrap_or((i64::MAX, i64::MAX));
                let mut heads: Vec<(i64, String, i64)> = sqlx::query_as(&store.own.pick_heads)
                    .bind(now_ms)
                    .bind(i64::from(limit))
                    .bind(failed_blocks)
                    .bind(reach_at)
                    .bind(reach_id)
                    .fetch_all(&mut *tx)
                    .await?;
                if heads.len() < limit as usize && reach.is_some() {
                    let more: Vec<(i64, String, i64)> = sqlx::query_as(&store.own.room_heads)
                        .bind(now_ms)
                        .bind((limit as usize - heads.len()) as i64)
                        .bind(failed_blocks)
                        .bind(reach_at)
                        .bind(reach_id)
                        .fetch_all(&mut *tx)
                        .await?;
                    heads.extend(more);
                }
                // Each head's run: the room's next events while each is claimable. Nobody
                // else can take them (they are not heads while their head is unfinished),
                // and this transaction holds the write lock anyway.
                //
                // Fewer heads than the claim takes: the cut keeps whole runs, oldest head
                // first (each room's run is then in flight at once, not its first two
                // events). Otherwise it keeps creation order, and only events before the last
                // head can make it: the walk stops there.
                let few_rooms = heads.len() < limit as usize;
                let until = match heads.last() {
                    Some(&(last, _, last_at)) if !few_rooms => (last_at, last),
                    _ => (i64::MAX, i64::MAX),
                };
                // Each taken row with where it sorts in the cut.
                let mut taken: Vec<((i64, i64, i64, i64), i64, String)> = Vec::with_capacity(heads.len());
                if run > 1 && !heads.is_empty() {
                    // One statement for every room's run. `CROSS JOIN` makes SQLite walk
                    // from the heads, never from every unfinished row.
                    let sql = store.own.runs.get(heads.len());
                    let mut q = sqlx::query_as(&sql)
                        .bind(now_ms)
                        .bind(failed_blocks)
                        .bind(i64::from(run))
                        .bind(until.0)
                        .bind(until.1);
                    for (head, _, _) in &heads {
                        q = q.bind(*head);
                    }
                    let runs: Vec<(i64, i64, i64, String, i64)> = q.fetch_all(&mut *tx).await?;
                    taken.extend(runs.into_iter().map(|(head, head_at, id, status, at)| {
                        let cut = if few_rooms { (head_at, head, at, id) } else { (at, id, at, id) };
                        (cut, id, status)
                    }));
                }
                taken.extend(heads.into_iter().map(|(head, status, at)| ((at, head, at, head), head, status)));
                // At most `limit` rows: each room keeps a prefix of its run.
                taken.sort_by_key(|(cut, _, _)| *cut);
                taken.truncate(limit as usize);
                taken.into_iter().map(|(_, id, status)| (id, status)).collect()
            }
        };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store as _;

    /// Both picks walk the claimable rows in creation order and stop at the limit: no sort
    /// of the whole backlog, and per-room order's probe runs only for the rows walked.
    #[tokio::test]
    async fn the_picks_walk_the_pick_index_without_sorting_the_backlog() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("plan.db").display());
        let store = SqliteStore::connect(&url, 2, "room_outbox").await.unwrap();
        store.migrate().await.unwrap();
        for pick in [&store.own.pick, &store.own.pick_heads, &store.own.reach] {
            let plan: Vec<(i64, i64, i64, String)> =
                sqlx::query_as(&format!("EXPLAIN QUERY PLAN {pick}")).fetch_all(&store.pool).await.unwrap();
            let plan: Vec<String> = plan.into_iter().map(|(_, _, _, step)| step).collect();
            assert!(plan.iter().any(|s| s.contains("USING INDEX room_outbox_pick_idx")), "{plan:?}");
            assert!(!plan.iter().any(|s| s.contains("TEMP B-TREE")), "the pick sorts: {plan:?}");
        }
    }

    /// Pages SQLite's page cache handed this connection since the last call: every b-tree
    /// page a statement visits, whether it was cached or read from the file.
    #[allow(unsafe_code)]
    async fn pages_visited(conn: &mut sqlx::SqliteConnection) -> i64 {
        let mut handle = conn.lock_handle().await.unwrap();
        let db = handle.as_raw_handle().as_ptr();
        let (mut hit, mut miss, mut high) = (0, 0, 0);
        // SAFETY: `db` is this connection's open handle, locked for the duration; the calls
        // only read (and reset) its counters.
        let status = unsafe {
            libsqlite3_sys::sqlite3_db_status(db, libsqlite3_sys::SQLITE_DBSTATUS_CACHE_HIT, &mut hit, &mut high, 1)
                | libsqlite3_sys::sqlite3_db_status(
                    db,
                    libsqlite3_sys::SQLITE_DBSTATUS_CACHE_MISS,
                    &mut miss,
                    &mut high,
                    1,
                )
        };
        assert_eq!(status, libsqlite3_sys::SQLITE_OK);
        i64::from(hit) + i64::from(miss)
    }

    /// A claim behind a busy room: 20,000 events whose head another worker holds, then four
    /// other rooms' heads (one of them the same `room_id` under another `app_code`, one
    /// behind 2,000 delivered events of its own). The claim takes the four and nothing of the
    /// busy room, and visits a few hundred pages where reading the busy room's backlog
    /// visits tens of thousands; the same with the statistics `ANALYZE` (or an application's
    /// `PRAGMA optimize`) leaves behind.
    #[tokio::test]
    async fn a_claim_behind_a_busy_room_reads_each_room_not_the_backlog() {
        for analyzed in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite://{}", dir.path().join("busy.db").display());
            let store = SqliteStore::connect(&url, 2, "room_outbox").await.unwrap();
            store.migrate().await.unwrap();
            let fill = "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?1 - 1) \
                        INSERT INTO room_outbox (event_id, event_type, room_id, app_code, status, envelope, created_at_ms) \
                        SELECT ?2 || i, 'RoomGiftSent', ?3, ?4, ?5, x'00', ?6 + i / 10 FROM n";
            for (n, prefix, room, app, status, at) in [
                (2_000, "old-", "quiet-1", "", "delivered", 0),
                (20_000, "hot-", "hot", "", "pending", 1_000),
                (1, "other-app-", "hot", "other", "pending", 5_000),
                (1, "quiet-1-", "quiet-1", "", "pending", 5_001),
                (1, "quiet-2-", "quiet-2", "", "pending", 5_002),
                (1, "quiet-3-", "quiet-3", "", "pending", 5_003),
            ] {
                sqlx::query(fill)
                    .bind(n)
                    .bind(prefix)
                    .bind(room)
                    .bind(app)
                    .bind(status)
                    .bind(at)
                    .execute(&store.pool)
                    .await
                    .unwrap();
            }
            sqlx::query(
                "UPDATE room_outbox SET status = 'delivering', worker_id = 'elsewhere', lock_until_ms = 9000000000000 \
                 WHERE event_id = 'hot-0'",
            )
            .execute(&store.pool)
            .await
            .unwrap();
            if analyzed {
                sqlx::query("ANALYZE").execute(&store.pool).await.unwrap();
            }
            store.pool.close().await;
            // One connection: the claim runs on the one whose counters are read.
            let store = SqliteStore::connect(&url, 1, "room_outbox").await.unwrap();
            {
                // The schema read, the count from zero.
                let mut conn = store.pool.acquire().await.unwrap();
                sqlx::query("SELECT 1 FROM room_outbox LIMIT 1").execute(&mut *conn).await.unwrap();
                pages_visited(&mut conn).await;
            }
            let order = RoomOrder::PerRoom { failed_blocks: false, run: 8 };

            let now = crate::store::now_ms();
            let claimed = store.claim_in_order("w", now, now + 60_000, 10, order).await.unwrap();
            let visited = pages_visited(&mut store.pool.acquire().await.unwrap()).await;
            let ids: Vec<&str> = claimed.iter().map(|c| c.event_id.as_str()).collect();
            assert_eq!(ids, ["other-app-0", "quiet-1-0", "quiet-2-0", "quiet-3-0"], "analyzed: {analyzed}");
            eprintln!("analyzed: {analyzed}: the claim visited {visited} pages");
            assert!(visited < 1_000, "analyzed: {analyzed}: the claim visited {visited} pages");
        }
    }
}
