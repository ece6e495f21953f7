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

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Type};

use super::schema::Profile;
use super::sql::{ByCount, Dialect, SqlStore, params};
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

/// The migration that adds `fanned_out_at_ms` and the registry: a sink's own table skips it.
pub const REGISTRY_VERSION: i64 = 7;

/// The longest suffix the migrations give a table's own objects (`<table>_room_order_idx`).
pub const LONGEST_OBJECT_SUFFIX: usize = "_room_order_idx".len();

/// The columns the fan-out copies, the producer's (the rest take their defaults: `pending`).
const COPIED: &str = "app_code, event_id, event_type, room_id, envelope, created_at_ms";

/// What one back-fill step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backfilled {
    /// Rows newly copied.
    pub copied: u64,
    /// Where the next step starts (the last key read), `None` when the walk is over.
    pub next: Option<KeyValue>,
}

/// A row key, as the back-fill walks them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyValue {
    /// `id` or SQLite's `rowid`.
    Int(i64),
    /// `event_id`, where the table has no `id`.
    Text(String),
}

/// The registry's and the fan-out's statements, built once per store (the idle probe runs
/// every `probe_interval`).
pub(super) struct FanOutStatements {
    /// The registry, oldest first.
    registry: String,
    /// Whether a row some other sink still needs copied exists (lock-free).
    probe: String,
    /// Up to `$2` rows not fanned out yet, created at or after `$1`, in creation order.
    pick: String,
    /// Marks the picked rows fanned out at `$1`, per count.
    mark: ByCount,
    /// Takes the fan-out lock without waiting (returns 1 when taken), and with waiting.
    try_lock: String,
    lock: String,
    /// Releases it (MySQL's is a session lock; PostgreSQL's ends with the transaction).
    unlock: String,
}

impl FanOutStatements {
    pub(super) fn new<D: Dialect>(table: &str, profile: &Profile) -> Self {
        let t = table.to_string();
        let key = profile.key.column();
        let name = format!("{t}_fanout");
        let (try_lock, lock, unlock) = match D::BACKEND {
            Backend::Postgres => (
                format!(
                    "SELECT CASE WHEN pg_try_advisory_xact_lock(hashtext(current_schema() || '.{name}')) THEN 1 ELSE 0 END"
                ),
                format!("SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.{name}'))"),
                String::new(),
            ),
            Backend::Mysql => (
                format!("SELECT GET_LOCK(SHA1(CONCAT(DATABASE(), '.{name}')), 0)"),
                format!("SELECT GET_LOCK(SHA1(CONCAT(DATABASE(), '.{name}')), 60)"),
                format!("SELECT RELEASE_LOCK(SHA1(CONCAT(DATABASE(), '.{name}')))"),
            ),
            // `BEGIN IMMEDIATE` is SQLite's lock.
            Backend::Sqlite => (String::new(), String::new(), String::new()),
        };
        FanOutStatements {
            registry: format!(
                "SELECT name, sink_table, start_from_ms, added_at_ms, backfilled_at_ms FROM {t}_sinks \
                 ORDER BY added_at_ms, name"
            ),
            probe: format!(
                "SELECT 1 FROM {t} WHERE fanned_out_at_ms = 0 AND created_at_ms >= \
                 (SELECT COALESCE(MIN(start_from_ms), {}) FROM {t}_sinks WHERE sink_table <> '{t}') LIMIT 1",
                i64::MAX
            ),
            pick: format!(
                "SELECT {key} FROM {t} WHERE fanned_out_at_ms = 0 AND created_at_ms >= {} \
                 ORDER BY created_at_ms, {key} LIMIT {}",
                D::param(1),
                D::param(2)
            ),
            mark: ByCount::new(move |n| {
                format!("UPDATE {t} SET fanned_out_at_ms = {} WHERE {key} IN ({})", D::param(1), params::<D>(2, n))
            }),
            try_lock,
            lock,
            unlock,
        }
    }
}

impl<D> SqlStore<D>
where
    D: Dialect,
    for<'c> &'c mut <D::Db as Database>::Connection: Executor<'c, Database = D::Db>,
    for<'q> <D::Db as Database>::Arguments<'q>: IntoArguments<'q, D::Db>,
    for<'a> &'a str: ColumnIndex<<D::Db as Database>::Row>,
    usize: ColumnIndex<<D::Db as Database>::Row>,
    for<'r> i64: Encode<'r, D::Db> + Decode<'r, D::Db> + Type<D::Db>,
    for<'r> String: Encode<'r, D::Db> + Decode<'r, D::Db> + Type<D::Db>,
{
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
        // The fan-out's lock: a fan-out runs wholly before this registration or wholly after.
        let release = match D::BACKEND {
            // Then `pg_advisory_xact_lock`, below.
            Backend::Postgres => {
                Executor::execute(&mut *conn, "BEGIN").await?;
                None
            }
            Backend::Mysql => {
                if D::opt_int(&sqlx::query(&f.lock).fetch_one(&mut *conn).await?, 0)? != Some(1) {
                    return Err(StoreError::Unavailable(format!("could not take the lock {t}_fanout within a minute")));
                }
                Some(f.unlock.clone())
            }
            Backend::Sqlite => {
                Executor::execute(&mut *conn, "BEGIN IMMEDIATE").await?;
                None
            }
        };
        let result: Result<RegisteredSink, StoreError> = async {
            if D::BACKEND == Backend::Postgres {
                Executor::execute(&mut *conn, f.lock.as_str()).await?;
            }
            let known = Self::decode_sinks(&sqlx::query(&f.registry).fetch_all(&mut *conn).await?)?;
            if let Some(sink) = known.iter().find(|s| s.name == name) {
                return Ok(sink.clone());
            }
            let first = known.is_empty() && may_be_first;
            let sink = RegisteredSink {
                name: name.to_string(),
                table: if first { t.clone() } else { sink_table(&t, name) },
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
        let end = match (&release, &result) {
            (Some(release), _) => release.clone(),
            (None, Ok(_)) => "COMMIT".into(),
            (None, Err(_)) => "ROLLBACK".into(),
        };
        Executor::execute(&mut *conn, end.as_str()).await?;
        let sink = result?;
        if !sink.is_first(&t) {
            self.create_fanout_index(&mut conn).await?;
        }
        Ok(sink)
    }

    /// The index of rows not fanned out yet, made when the first other sink is registered
    /// (a table with one sink never fans out, and its producer's inserts do not pay for it).
    async fn create_fanout_index(&self, conn: &mut <D::Db as Database>::Connection) -> Result<(), StoreError> {
        let t = &self.table;
        let key = self.profile.key.column();
        let ddl = match D::BACKEND {
            Backend::Postgres => format!(
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS {t}_fanout_idx ON {t} (created_at_ms, {key}) \
                 WHERE fanned_out_at_ms = 0"
            ),
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
            // Two hosts registering at once on MySQL: the other one made it.
            Err(e) if D::BACKEND == Backend::Mysql && e.to_string().contains("Duplicate key name") => Ok(()),
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
        match D::BACKEND {
            Backend::Postgres => {
                Executor::execute(&mut *conn, "BEGIN").await?;
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
            let keys = picked
                .iter()
                .map(|r| {
                    if self.profile.key.is_text() {
                        D::text(r, 0).map(KeyValue::Text)
                    } else {
                        D::int(r, 0).map(KeyValue::Int)
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            if D::BACKEND == Backend::Mysql {
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

    /// The outbox rows `filter` selects, fanned out and not before `sink`'s start, copied
    /// into its table where it no longer has them.
    pub(super) async fn recopy_rows(
        &self,
        sink: &RegisteredSink,
        filter: &super::ReplayFilter,
    ) -> Result<u64, StoreError> {
        if sink.is_first(&self.table) {
            return Ok(0);
        }
        let _writing = self.writing().await;
        let (into, from) = self.copied_columns();
        let (verb, tail) = insert_if_absent(D::BACKEND);
        let (conditions, values) = filter.conditions("o.", D::param, 2);
        let sql = format!(
            "{verb} {} ({into}) SELECT {from} FROM {} o WHERE o.fanned_out_at_ms <> 0 AND o.created_at_ms >= {}{conditions} \
             ORDER BY o.created_at_ms, o.{}{tail}",
            sink.table,
            self.table,
            D::param(1),
            self.profile.key.column()
        );
        let mut q =
            sqlx::query(&sql).bind(sink.start_from_ms).bind(filter.from_ms).bind(filter.to_ms.unwrap_or(i64::MAX));
        for value in values {
            q = q.bind(value);
        }
        Ok(D::rows_affected(&q.execute(&self.pool).await?))
    }

    /// The columns a copy writes into a sink's table, and what it reads for them from the
    /// outbox (`o`). The copy keeps the outbox's id, so that its claim order (creation time,
    /// then id) is the outbox's and `show` finds one event under one id everywhere.
    fn copied_columns(&self) -> (String, String) {
        match self.profile.key {
            super::schema::Key::Id => (format!("id, {COPIED}"), format!("o.id, {}", prefixed(COPIED))),
            super::schema::Key::RowId => (format!("id, {COPIED}"), format!("o.rowid, {}", prefixed(COPIED))),
            super::schema::Key::EventId => (COPIED.to_string(), prefixed(COPIED)),
        }
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
        let (into, from) = self.copied_columns();
        let (verb, tail) = insert_if_absent(D::BACKEND);
        let sql = format!(
            "{verb} {} ({into}) SELECT {from} FROM {t} o WHERE o.created_at_ms >= {} AND o.{key} IN ({}) \
             ORDER BY o.created_at_ms, o.{key}{tail}",
            sink.table,
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
    ) -> Result<Backfilled, StoreError> {
        let _writing = self.writing().await;
        let t = &self.table;
        let key = self.profile.key.column();
        let after = after.unwrap_or(if self.profile.key.is_text() {
            KeyValue::Text(String::new())
        } else {
            KeyValue::Int(i64::MIN)
        });
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
            let k =
                if self.profile.key.is_text() { KeyValue::Text(D::text(r, 0)?) } else { KeyValue::Int(D::int(r, 0)?) };
            if D::int(r, 1)? != 0 {
                keys.push(k.clone());
            }
            last = Some(k);
        }
        let copied = self.copy_rows(&mut conn, sink, &keys).await?;
        Ok(Backfilled { copied, next: if rows.len() < limit as usize { None } else { last } })
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
}

/// An `INSERT … SELECT` that leaves rows already there alone: its verb and its tail.
fn insert_if_absent(backend: Backend) -> (&'static str, &'static str) {
    match backend {
        Backend::Mysql => ("INSERT IGNORE INTO", ""),
        // SQLite reads ON CONFLICT after a SELECT only when it has a WHERE (every copy has).
        Backend::Sqlite | Backend::Postgres => ("INSERT INTO", " ON CONFLICT DO NOTHING"),
    }
}

/// `COPIED` with each column prefixed `o.`.
fn prefixed(columns: &str) -> String {
    columns.split(", ").map(|c| format!("o.{c}")).collect::<Vec<_>>().join(", ")
}

fn bind_key<'q, D>(
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
