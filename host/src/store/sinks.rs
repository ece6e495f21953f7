//! Several sinks on one outbox (issue 14): the registry `<table>_sinks`, the fan-out that
//! copies each event once into every other sink's own table, and the back-fill of a sink
//! added after events were already fanned out.
//!
//! The outbox's own status columns stay the first sink's, as the seed defines them. Every
//! other sink keeps its state in `<table>__<sink>`, a table with the outbox's columns, so
//! claims, leases, fencing, retries and purge work there exactly as on the outbox. The
//! producer still writes one row. The fan-out runs on one host at a time (a lock), in
//! creation order, and registering a sink takes the same lock: every fan-out either ran
//! before the registration (the back-fill then sees it) or sees the new sink.

use sqlx::{Database, Encode, Executor, Type};

use super::sql::for_every_dialect;
use super::sql::{Dialect, SqlStore, params};
use super::{Backend, StoreError};

/// A sink the table knows of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredSink {
    /// Its name (`sinks[].name`).
    pub name: String,
    /// Where its delivery state lives: the outbox itself for the first sink, else
    /// `<table>__<sink>`.
    pub table: String,
    /// Events created before this (UTC ms) are not its business.
    pub start_from_ms: i64,
    /// When it was registered.
    pub added_at_ms: i64,
    /// When the copy of the events fanned out before it was registered finished; `None`
    /// while it is under way (the sink does not deliver meanwhile, so that a room's old
    /// events never arrive after its new ones).
    pub backfilled_at_ms: Option<i64>,
}

impl RegisteredSink {
    /// Whether its state is the outbox's own columns (the first sink).
    pub fn is_first(&self, outbox: &str) -> bool {
        self.table == outbox
    }
}

/// The table that keeps `sink`'s state beside `outbox`: `<outbox>__<sink>`, lower-case, with
/// `.` and `-` written `_`.
pub fn sink_table(outbox: &str, sink: &str) -> String {
    let name: String =
        sink.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
    format!("{outbox}__{name}")
}

/// The longest suffix the host gives a table's own objects (`<table>_notify_insert`).
pub const LONGEST_OBJECT_SUFFIX: usize = "_notify_insert".len();

/// The columns the fan-out copies, the producer's (the rest take their defaults: `pending`).
const COPIED: &str = "app_code, event_id, event_type, room_id, envelope, created_at_ms";

/// What one step of a walk in key order did (a back-fill, a replay, a re-copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Rows changed or newly copied.
    pub rows: u64,
    /// Where the next step starts (the last key read), `None` when the walk is over.
    pub next: Option<KeyValue>,
}

impl KeyValue {
    /// The key before every other of a table keyed as `key` says.
    pub(super) fn first(key: super::schema::Key) -> KeyValue {
        if key.is_text() { KeyValue::Text(String::new()) } else { KeyValue::Int(i64::MIN) }
    }
}

/// A row key, as the back-fill walks them (and a table's keys are all of one kind).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum KeyValue {
    /// `id` or SQLite's `rowid`.
    Int(i64),
    /// `event_id`, where the table has no `id`.
    Text(String),
}

for_every_dialect!(impl {
    /// Takes the registry's lock on `conn`, waiting for it (a minute at most on MySQL): a
    /// registration, a fan-out and a purge of the outbox each run wholly before or after
    /// one another. On PostgreSQL and SQLite it is a transaction (READ COMMITTED, so each
    /// statement sees what committed before it) that [`Self::unlock_registry`] ends.
    pub(super) async fn lock_registry(&self, conn: &mut <D::Db as Database>::Connection) -> Result<(), StoreError> {
        let f = &self.fan_out;
        match D::BACKEND {
            Backend::Postgres => {
                Executor::execute(&mut *conn, "BEGIN ISOLATION LEVEL READ COMMITTED").await?;
                if let Err(e) = Executor::execute(&mut *conn, f.lock.as_str()).await {
                    let _ = Executor::execute(&mut *conn, "ROLLBACK").await;
                    return Err(e.into());
                }
            }
            Backend::Mysql => {
                if D::opt_int(&sqlx::query(&f.lock).fetch_one(&mut *conn).await?, 0)? != Some(1) {
                    return Err(StoreError::Unavailable(format!(
                        "could not take the lock {}_fanout within a minute",
                        self.table
                    )));
                }
            }
            Backend::Sqlite => {
                Executor::execute(&mut *conn, "BEGIN IMMEDIATE").await?;
            }
        }
        Ok(())
    }

    /// Ends what [`Self::lock_registry`] began: commits (`keep`) or rolls back, and releases
    /// the lock.
    pub(super) async fn unlock_registry(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        keep: bool,
    ) -> Result<(), StoreError> {
        let end = match D::BACKEND {
            Backend::Mysql => self.fan_out.unlock.as_str(),
            _ if keep => "COMMIT",
            _ => "ROLLBACK",
        };
        Executor::execute(&mut *conn, end).await?;
        Ok(())
    }

    /// On PostgreSQL, moves the id sequence of `sink`'s table past the ids it holds: copies
    /// made before 0.1.0 kept the outbox's ids, which an identity column's sequence does not
    /// count, and copies now take generated ids. Run under the registry's lock, which every
    /// copy of the fan-out also holds.
    async fn catch_up_generated_ids(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        sink: &RegisteredSink,
    ) -> Result<(), StoreError> {
        if D::BACKEND != Backend::Postgres || sink.is_first(&self.table) {
            return Ok(());
        }
        let s = &sink.table;
        let exists = format!("SELECT CASE WHEN to_regclass('{s}') IS NULL THEN 0 ELSE 1 END::INT8");
        if D::int(&sqlx::query(&exists).fetch_one(&mut *conn).await?, 0)? == 0 {
            return Ok(());
        }
        let catch_up = format!(
            "SELECT setval(seq, m) FROM (SELECT pg_get_serial_sequence('{s}', 'id')::regclass AS seq, \
             (SELECT MAX(id) FROM {s}) AS m) x WHERE m > COALESCE(pg_sequence_last_value(seq), 0)"
        );
        Executor::execute(&mut *conn, catch_up.as_str()).await?;
        Ok(())
    }

    fn decode_sinks(rows: &[<D::Db as Database>::Row]) -> Result<Vec<RegisteredSink>, sqlx::Error> {
        rows.iter()
            .map(|r| {
                Ok(RegisteredSink {
                    name: D::text(r, 0)?,
                    table: D::text(r, 1)?,
                    start_from_ms: D::int(r, 2)?,
                    added_at_ms: D::int(r, 3)?,
                    backfilled_at_ms: D::opt_int(r, 4)?,
                })
            })
            .collect()
    }

    /// The registry, oldest first.
    pub(super) async fn registered_sinks(&self) -> Result<Vec<RegisteredSink>, StoreError> {
        let rows = sqlx::query(&self.fan_out.registry).fetch_all(&self.pool).await?;
        Ok(Self::decode_sinks(&rows)?)
    }

    /// Registers `name` unless the table knows it already (then its entry is returned as
    /// it is: a sink keeps where it started). The first sink ever registered on the table,
    /// when `may_be_first`, keeps its state in the table's own columns.
    pub(super) async fn register(
        &self,
        name: &str,
        start_from_ms: i64,
        may_be_first: bool,
        now_ms: i64,
    ) -> Result<RegisteredSink, StoreError> {
        let _writing = self.writing().await;
        let t = self.table.clone();
        let f = &self.fan_out;
        // `backfilled_at_ms`: now for the first sink (nothing to copy), else NULL until copied.
        let insert = |backfilled: &str| {
            format!(
                "INSERT INTO {t}_sinks (name, sink_table, start_from_ms, added_at_ms, backfilled_at_ms) \
                 VALUES ({}, {backfilled})",
                params::<D>(1, 4)
            )
        };
        let mut conn = self.pool.acquire().await?;
        // The registry's lock: a fan-out, and a purge of the outbox, run wholly before this
        // registration or wholly after it.
        self.lock_registry(&mut conn).await?;
        let result: Result<RegisteredSink, StoreError> = async {
            let known = Self::decode_sinks(&sqlx::query(&f.registry).fetch_all(&mut *conn).await?)?;
            if let Some(sink) = known.iter().find(|s| s.name == name) {
                self.catch_up_generated_ids(&mut conn, sink).await?;
                return Ok(sink.clone());
            }
            let first = known.is_empty() && may_be_first;
            let table = if first { t.clone() } else { sink_table(&t, name) };
            // Two names that write the same table (`b-x`, `b_x`) would split its events.
            if let Some(owner) = known.iter().find(|s| s.table.eq_ignore_ascii_case(&table)) {
                return Err(StoreError::Query(format!(
                    "sink {name:?} would keep its state in {table}, which sink {:?} already uses: rename one of them",
                    owner.name
                )));
            }
            let sink = RegisteredSink {
                name: name.to_string(),
                table,
                start_from_ms: if first { 0 } else { start_from_ms },
                added_at_ms: now_ms,
                backfilled_at_ms: first.then_some(now_ms),
            };
            let insert = insert(&sink.backfilled_at_ms.map_or("NULL".to_string(), |at| at.to_string()));
            sqlx::query(&insert)
                .bind(sink.name.clone())
                .bind(sink.table.clone())
                .bind(sink.start_from_ms)
                .bind(sink.added_at_ms)
                .execute(&mut *conn)
                .await?;
            Ok(sink)
        }
        .await;
        self.unlock_registry(&mut conn, result.is_ok()).await?;
        result
    }

    /// Gives `sink_table` the outbox's own types for the text and bytes columns a copy writes
    /// where they differ (an adopted outbox may take room ids longer than the host's own 128
    /// characters), so that a copy never shortens a value and never fails for one. SQLite's
    /// declared types bound nothing.
    pub(super) async fn match_copied_types(&self, sink_table: &str) -> Result<(), StoreError> {
        if D::BACKEND == Backend::Sqlite {
            return Ok(());
        }
        let mut conn = self.pool.acquire().await?;
        let outbox = self.copied_types(&mut conn, &self.table).await?;
        let copy = self.copied_types(&mut conn, sink_table).await?;
        for (column, wanted) in &outbox {
            let Some(has) = copy.iter().find(|(name, _)| name == column).map(|(_, has)| has) else { continue };
            if wanted == has {
                continue;
            }
            let ddl = match D::BACKEND {
                Backend::Mysql => {
                    let default = if column == "app_code" { " DEFAULT ''" } else { "" };
                    format!("ALTER TABLE {sink_table} MODIFY COLUMN {column} {wanted} NOT NULL{default}")
                }
                _ => format!("ALTER TABLE {sink_table} ALTER COLUMN {column} TYPE {wanted}"),
            };
            Executor::execute(&mut *conn, ddl.as_str())
                .await
                .map_err(|e| StoreError::Migration(format!("giving {sink_table}.{column} the outbox's type: {e}")))?;
            tracing::info!(table = %sink_table, column, from = %has, to = %wanted, "a sink's table takes the outbox's column type");
        }
        Ok(())
    }

    /// The declared types of `table`'s text and bytes columns a copy writes, by name; on
    /// MySQL with their collation (`varchar(64) COLLATE utf8mb4_bin`): a case-sensitive
    /// event id must stay case-sensitive in a sink's table, or two ids that differ by case
    /// would be one there.
    async fn copied_types(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        table: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        const COLUMNS: &str = "'app_code', 'event_id', 'event_type', 'room_id', 'envelope'";
        let sql = match D::BACKEND {
            Backend::Mysql => format!(
                "SELECT LOWER(column_name), CONCAT(LOWER(column_type), \
                 COALESCE(CONCAT(' COLLATE ', collation_name), '')) FROM information_schema.columns \
                 WHERE table_schema = DATABASE() AND table_name = '{table}' AND LOWER(column_name) IN ({COLUMNS})"
            ),
            _ => format!(
                "SELECT a.attname::TEXT, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
                 WHERE a.attrelid = to_regclass('{table}') AND a.attnum > 0 AND NOT a.attisdropped \
                 AND a.attname IN ({COLUMNS})"
            ),
        };
        let rows = sqlx::query(&sql).fetch_all(&mut *conn).await?;
        Ok(rows.iter().map(|r| Ok((D::text(r, 0)?, D::text(r, 1)?))).collect::<Result<_, sqlx::Error>>()?)
    }

    /// Whether the index of rows not fanned out yet is there and valid.
    pub(super) async fn fanout_index_ok(&self) -> Result<bool, StoreError> {
        let t = &self.table;
        let sql = match D::BACKEND {
            Backend::Postgres => format!(
                "SELECT COUNT(*) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid \
                 WHERE x.indrelid = to_regclass('{t}') AND i.relname = '{t}_fanout_idx' AND x.indisvalid"
            ),
            Backend::Mysql => format!(
                "SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() \
                 AND table_name = '{t}' AND index_name = '{t}_fanout_idx'"
            ),
            Backend::Sqlite => {
                format!("SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = '{t}_fanout_idx'")
            }
        };
        Ok(D::int(&sqlx::query(&sql).fetch_one(&self.pool).await?, 0)? > 0)
    }

    /// The index of rows not fanned out yet, made (under the migration lock, see
    /// `SqlStore::holding_migration_lock`) when the first other sink is registered: a table
    /// with one sink never fans out, and its producer's inserts do not pay for it. On
    /// PostgreSQL it is built `CONCURRENTLY`, and a build cut short leaves an invalid index
    /// that `IF NOT EXISTS` would keep: it is dropped and built again.
    pub(super) async fn build_fanout_index(
        &self,
        conn: &mut <D::Db as Database>::Connection,
    ) -> Result<(), StoreError> {
        let t = &self.table;
        let key = self.profile.key.column();
        let ddl = match D::BACKEND {
            Backend::Postgres => {
                let invalid = format!(
                    "SELECT COUNT(*) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid \
                     WHERE x.indrelid = to_regclass('{t}') AND i.relname = '{t}_fanout_idx' AND NOT x.indisvalid"
                );
                if D::int(&sqlx::query(&invalid).fetch_one(&mut *conn).await?, 0)? > 0 {
                    tracing::warn!(table = %t, "the fan-out index is invalid (a build was cut short): building it again");
                    let drop = format!("DROP INDEX CONCURRENTLY IF EXISTS {t}_fanout_idx");
                    Executor::execute(&mut *conn, drop.as_str())
                        .await
                        .map_err(|e| StoreError::Migration(format!("dropping the invalid {t}_fanout_idx: {e}")))?;
                }
                format!(
                    "CREATE INDEX CONCURRENTLY IF NOT EXISTS {t}_fanout_idx ON {t} (created_at_ms, {key}) \
                     WHERE fanned_out_at_ms = 0"
                )
            }
            Backend::Sqlite => {
                format!("CREATE INDEX IF NOT EXISTS {t}_fanout_idx ON {t} (created_at_ms) WHERE fanned_out_at_ms = 0")
            }
            Backend::Mysql => {
                let exists = self.describe_on(conn).await?.is_some_and(|info| {
                    info.indexes.iter().any(|i| i.name.eq_ignore_ascii_case(&format!("{t}_fanout_idx")))
                });
                if exists {
                    return Ok(());
                }
                format!(
                    "CREATE INDEX {t}_fanout_idx ON {t} (fanned_out_at_ms, created_at_ms, {key}) ALGORITHM=INPLACE LOCK=NONE"
                )
            }
        };
        match Executor::execute(&mut *conn, ddl.as_str()).await {
            Ok(_) => Ok(()),
            Err(e) => Err(StoreError::Migration(format!("creating {t}_fanout_idx: {e}"))),
        }
    }

    /// Copies up to `limit` rows not fanned out yet, in creation order, into the table of
    /// every other registered sink whose start they are not before, and marks them fanned
    /// out. Returns how many rows were fanned out; 0 when there is nothing to do, no other
    /// sink, or another host is fanning out right now.
    pub(super) async fn fan_out_rows(&self, limit: u32, now_ms: i64) -> Result<u64, StoreError> {
        let _writing = self.writing().await;
        let f = &self.fan_out;
        let mut conn = self.pool.acquire().await?;
        // Idle, one lock-free look: is there a row some other sink still needs copied?
        if sqlx::query(&f.probe).fetch_optional(&mut *conn).await?.is_none() {
            return Ok(0);
        }
        // READ COMMITTED, whatever the database's default: the registry read below must see
        // a sink registered a moment ago (the lock orders the two), not a snapshot from before.
        match D::BACKEND {
            Backend::Postgres => {
                Executor::execute(&mut *conn, "BEGIN ISOLATION LEVEL READ COMMITTED").await?;
            }
            Backend::Sqlite => {
                Executor::execute(&mut *conn, "BEGIN IMMEDIATE").await?;
            }
            Backend::Mysql => {
                if D::opt_int(&sqlx::query(&f.try_lock).fetch_one(&mut *conn).await?, 0)? != Some(1) {
                    return Ok(0);
                }
            }
        }
        let result: Result<u64, StoreError> = async {
            if D::BACKEND == Backend::Postgres
                && D::int(&sqlx::query(&f.try_lock).fetch_one(&mut *conn).await?, 0)? != 1
            {
                return Ok(0);
            }
            let sinks = Self::decode_sinks(&sqlx::query(&f.registry).fetch_all(&mut *conn).await?)?;
            let others: Vec<&RegisteredSink> = sinks.iter().filter(|s| !s.is_first(&self.table)).collect();
            let Some(min_start) = others.iter().map(|s| s.start_from_ms).min() else {
                return Ok(0);
            };
            // The picked rows' keys, in creation order.
            let picked = sqlx::query(&f.pick).bind(min_start).bind(i64::from(limit)).fetch_all(&mut *conn).await?;
            if picked.is_empty() {
                return Ok(0);
            }
            let keys = picked.iter().map(|r| self.key_of(r)).collect::<Result<Vec<_>, _>>()?;
            if D::BACKEND == Backend::Mysql {
                Executor::execute(&mut *conn, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED").await?;
                Executor::execute(&mut *conn, "BEGIN").await?;
            }
            for sink in &others {
                self.copy_rows(&mut conn, sink, &keys).await?;
            }
            let mark = f.mark.get(keys.len());
            let mut q = sqlx::query(&mark).bind(now_ms);
            for k in &keys {
                q = bind_key::<D>(q, k);
            }
            Ok(D::rows_affected(&q.execute(&mut *conn).await?))
        }
        .await;
        // On MySQL with nothing picked there is no transaction, and COMMIT is harmless.
        let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
        let ended = Executor::execute(&mut *conn, end).await;
        if D::BACKEND == Backend::Mysql {
            let _ = Executor::execute(&mut *conn, f.unlock.as_str()).await;
        }
        let fanned = result?;
        ended?;
        Ok(fanned)
    }

    /// ` FROM <outbox> o WHERE …`: the outbox rows `filter` selects, fanned out and not before
    /// `sink`'s start (`$1`; the filter's values from `$2`), that its table no longer has.
    fn missing_from(&self, sink: &RegisteredSink, filter: &super::ReplayFilter) -> (String, Vec<String>) {
        let (conditions, values) = filter.conditions("o.", D::param, 2);
        let sql = format!(
            " FROM {} o WHERE o.fanned_out_at_ms <> 0 AND o.created_at_ms >= {}{conditions} \
             AND NOT EXISTS (SELECT 1 FROM {} x WHERE x.event_id = o.event_id)",
            self.table,
            D::param(1),
            sink.table
        );
        (sql, values)
    }

    /// How many outbox rows [`Self::recopy_step`] would copy into `sink`'s table.
    pub(super) async fn count_missing(
        &self,
        sink: &RegisteredSink,
        filter: &super::ReplayFilter,
    ) -> Result<i64, StoreError> {
        if sink.is_first(&self.table) {
            return Ok(0);
        }
        let (from, values) = self.missing_from(sink, filter);
        let sql = format!("SELECT COUNT(*){from}");
        let mut q =
            sqlx::query(&sql).bind(sink.start_from_ms).bind(filter.from_ms).bind(filter.to_ms.unwrap_or(i64::MAX));
        for value in values {
            q = q.bind(value);
        }
        Ok(D::int(&q.fetch_one(&self.pool).await?, 0)?)
    }

    /// One step of copying the outbox rows `filter` selects back into `sink`'s table where
    /// it no longer has them: of up to `limit` such rows after `after` in key order.
    pub(super) async fn recopy_step(
        &self,
        sink: &RegisteredSink,
        filter: &super::ReplayFilter,
        after: Option<KeyValue>,
        limit: u32,
    ) -> Result<Step, StoreError> {
        if sink.is_first(&self.table) {
            return Ok(Step { rows: 0, next: None });
        }
        let key = self.profile.key.column();
        let (from, values) = self.missing_from(sink, filter);
        let next = 2 + values.len() + 2;
        let sql = format!(
            "SELECT o.{key}{from} AND o.{key} > {} ORDER BY o.{key} LIMIT {}",
            D::param(next),
            D::param(next + 1)
        );
        let after = after.unwrap_or(KeyValue::first(self.profile.key));
        let mut q =
            sqlx::query(&sql).bind(sink.start_from_ms).bind(filter.from_ms).bind(filter.to_ms.unwrap_or(i64::MAX));
        for value in values {
            q = q.bind(value);
        }
        let picked = bind_key::<D>(q, &after).bind(i64::from(limit)).fetch_all(&self.pool).await?;
        let keys = picked.iter().map(|r| self.key_of(r)).collect::<Result<Vec<_>, _>>()?;
        let _writing = self.writing().await;
        let mut conn = self.pool.acquire().await?;
        let rows = self.copy_rows(&mut conn, sink, &keys).await?;
        Ok(Step { rows, next: if keys.len() < limit as usize { None } else { keys.last().cloned() } })
    }

    /// The key in column 0 of `row`.
    pub(super) fn key_of(&self, row: &<D::Db as Database>::Row) -> Result<KeyValue, sqlx::Error> {
        if self.profile.key.is_text() { D::text(row, 0).map(KeyValue::Text) } else { D::int(row, 0).map(KeyValue::Int) }
    }

    /// Copies the rows named by `keys` into `sink`'s table, those created at or after its
    /// start; rows it has already are left as they are.
    async fn copy_rows(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        sink: &RegisteredSink,
        keys: &[KeyValue],
    ) -> Result<u64, StoreError> {
        if keys.is_empty() {
            return Ok(0);
        }
        let t = &self.table;
        let key = self.profile.key.column();
        let (guard, tail) = insert_if_absent(D::BACKEND, &sink.table);
        let sql = format!(
            "INSERT INTO {} ({COPIED}) SELECT {} FROM {t} o WHERE o.created_at_ms >= {} AND o.{key} IN ({}){guard} \
             ORDER BY o.created_at_ms, o.{key}{tail}",
            sink.table,
            prefixed(COPIED),
            D::param(1),
            params::<D>(2, keys.len())
        );
        let mut q = sqlx::query(&sql).bind(sink.start_from_ms);
        for k in keys {
            q = bind_key::<D>(q, k);
        }
        Ok(D::rows_affected(&q.execute(&mut *conn).await?))
    }

    /// One step of `sink`'s back-fill: of the rows already fanned out (before it was
    /// registered), those after `after` in key order, up to `limit` read, copied into its
    /// table if created at or after its start.
    pub(super) async fn backfill_step(
        &self,
        sink: &RegisteredSink,
        after: Option<KeyValue>,
        limit: u32,
    ) -> Result<Step, StoreError> {
        let _writing = self.writing().await;
        let t = &self.table;
        let key = self.profile.key.column();
        let after = after.unwrap_or(KeyValue::first(self.profile.key));
        let walk = format!(
            "SELECT {key}, fanned_out_at_ms FROM {t} WHERE {key} > {} ORDER BY {key} LIMIT {}",
            D::param(1),
            D::param(2)
        );
        let mut conn = self.pool.acquire().await?;
        let rows = bind_key::<D>(sqlx::query(&walk), &after).bind(i64::from(limit)).fetch_all(&mut *conn).await?;
        let mut keys = Vec::new();
        let mut last = None;
        for r in &rows {
            let k = self.key_of(r)?;
            if D::int(r, 1)? != 0 {
                keys.push(k.clone());
            }
            last = Some(k);
        }
        let copied = self.copy_rows(&mut conn, sink, &keys).await?;
        Ok(Step { rows: copied, next: if rows.len() < limit as usize { None } else { last } })
    }

    /// Records that `name`'s back-fill is complete.
    pub(super) async fn finish_backfill(&self, name: &str, now_ms: i64) -> Result<(), StoreError> {
        let _writing = self.writing().await;
        let sql = format!(
            "UPDATE {}_sinks SET backfilled_at_ms = {} WHERE name = {} AND backfilled_at_ms IS NULL",
            self.table,
            D::param(1),
            D::param(2)
        );
        sqlx::query(&sql).bind(now_ms).bind(name.to_string()).execute(&self.pool).await?;
        Ok(())
    }
});

/// What makes an `INSERT INTO <sink_table> … SELECT … FROM <outbox> o` leave the events the
/// sink's table has already alone, and nothing else: a condition for the `WHERE`, and a
/// tail. The conflict is the event's id, never its row id (the copy takes an id of the sink
/// table's own, so an outbox id that SQLite reuses after a purge is a new row there). No
/// `INSERT IGNORE`: it would also turn a value too long for its column into a silently
/// shortened one.
fn insert_if_absent(backend: Backend, sink_table: &str) -> (String, String) {
    match backend {
        // MySQL names no conflict target: the rows present are left out by the condition, and
        // one a concurrent copy inserts meanwhile meets the no-op update (its only unique keys
        // are `event_id` and the id it generates).
        Backend::Mysql => (
            format!(" AND NOT EXISTS (SELECT 1 FROM {sink_table} x WHERE x.event_id = o.event_id)"),
            format!(" ON DUPLICATE KEY UPDATE {sink_table}.event_id = {sink_table}.event_id"),
        ),
        // SQLite reads ON CONFLICT after a SELECT only when it has a WHERE (every copy has).
        Backend::Sqlite | Backend::Postgres => (String::new(), " ON CONFLICT (event_id) DO NOTHING".to_string()),
    }
}

/// `COPIED` with each column prefixed `o.`.
fn prefixed(columns: &str) -> String {
    columns.split(", ").map(|c| format!("o.{c}")).collect::<Vec<_>>().join(", ")
}

pub(super) fn bind_key<'q, D>(
    q: sqlx::query::Query<'q, D::Db, <D::Db as Database>::Arguments<'q>>,
    key: &KeyValue,
) -> sqlx::query::Query<'q, D::Db, <D::Db as Database>::Arguments<'q>>
where
    D: Dialect,
    for<'r> i64: Encode<'r, D::Db> + Type<D::Db>,
    for<'r> String: Encode<'r, D::Db> + Type<D::Db>,
{
    match key {
        KeyValue::Int(n) => q.bind(*n),
        KeyValue::Text(s) => q.bind(s.clone()),
    }
}
