//! Several sinks on one outbox (issue 14, issue 48): the registry `<table>_sinks`, and the
//! index the sinks after the first read the outbox by.
//!
//! The outbox's own status columns stay the first sink's, as the seed defines them. Every
//! other sink is a consumer of the outbox (decision 0203): positions per partition and
//! exceptions (`consumers.rs`), no copy of any row. The producer still writes one row. A
//! registration and a purge of the outbox take the registry's lock: every purge either ran
//! before the registration or sees the new sink's start.

use sqlx::{Database, Encode, Executor, Type};

use super::StoreError;
use super::sql::for_every_dialect;
use super::sql::{Dialect, SqlStore, params};

/// A sink the table knows of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredSink {
    /// Its name (`sinks[].name`).
    pub name: String,
    /// The outbox itself for the first sink (its state is the row's own columns), else
    /// `<table>__<sink>`: a name that keys its partition leases and hosts (an earlier
    /// version kept a copy of the outbox under it).
    pub table: String,
    /// Events created before this (UTC ms) are not its business.
    pub start_from_ms: i64,
    /// When it was registered.
    pub added_at_ms: i64,
    /// When an earlier version's copy of the events fanned out before the sink was
    /// registered finished (`None`: under way when that version stopped; the copy's
    /// conversion then starts the sink no later than its start). Registration sets it now.
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

/// What one step of a walk in key order did (a replay).
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

/// A row key, as a walk in key order reads them (and a table's keys are all of one kind).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum KeyValue {
    /// `id` or SQLite's `rowid`.
    Int(i64),
    /// `event_id`, where the table has no `id`.
    Text(String),
}

for_every_dialect!(impl {
    /// Takes the registry's lock on `conn` ([`Dialect::registry_lock`]): a registration and
    /// a purge of the outbox each run wholly before or after the other.
    /// [`Self::unlock_registry`] ends it.
    pub(super) async fn lock_registry(&self, conn: &mut <D::Db as Database>::Connection) -> Result<(), StoreError> {
        if !self.take_lock(conn, &self.registry.lock).await? {
            return Err(StoreError::Unavailable(format!(
                "could not take the lock {}_fanout within a minute",
                self.table
            )));
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
        self.release_lock(conn, &self.registry.lock, keep).await
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
        let rows = sqlx::query(&self.registry.list).fetch_all(&self.pool).await?;
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
        let f = &self.registry;
        // `backfilled_at_ms` (an earlier version's copy finished): now, there is no copy.
        let insert = format!(
            "INSERT INTO {t}_sinks (name, sink_table, start_from_ms, added_at_ms, backfilled_at_ms) VALUES ({}, {})",
            params::<D>(1, 4),
            D::param(5)
        );
        let mut conn = self.pool.acquire().await?;
        // The registry's lock: a fan-out, and a purge of the outbox, run wholly before this
        // registration or wholly after it.
        self.lock_registry(&mut conn).await?;
        let result: Result<RegisteredSink, StoreError> = async {
            let known = Self::decode_sinks(&sqlx::query(&f.list).fetch_all(&mut *conn).await?)?;
            if let Some(sink) = known.iter().find(|s| s.name == name) {
                return Ok(sink.clone());
            }
            let first = known.is_empty() && may_be_first;
            let table = if first { t.clone() } else { sink_table(&t, name) };
            // Two names that key the same partitions (`b-x`, `b_x`) would split their events.
            if let Some(owner) = known.iter().find(|s| s.table.eq_ignore_ascii_case(&table)) {
                return Err(StoreError::Query(format!(
                    "sink {name:?} would key its partitions as {table}, which sink {:?} already uses: rename one of them",
                    owner.name
                )));
            }
            let sink = RegisteredSink {
                name: name.to_string(),
                table,
                start_from_ms: if first { 0 } else { start_from_ms },
                added_at_ms: now_ms,
                backfilled_at_ms: Some(now_ms),
            };
            sqlx::query(&insert)
                .bind(sink.name.clone())
                .bind(sink.table.clone())
                .bind(sink.start_from_ms)
                .bind(sink.added_at_ms)
                .bind(now_ms)
                .execute(&mut *conn)
                .await?;
            Ok(sink)
        }
        .await;
        self.unlock_registry(&mut conn, result.is_ok()).await?;
        result
    }

    /// Whether the index the consumers read by is there and valid, and the fan-out's index
    /// of an earlier version gone.
    pub(super) async fn consumer_index_ok(&self) -> Result<bool, StoreError> {
        let t = &self.table;
        let mut conn = self.pool.acquire().await?;
        Ok(self.indexes_named(&mut conn, &format!("{t}_consumer_idx")).await?.contains(&1)
            && self.indexes_named(&mut conn, &format!("{t}_fanout_idx")).await?.is_empty())
    }

    /// The table's indexes named `name`, each `1` if valid, `0` if not ([`Dialect::index_sql`]).
    async fn indexes_named(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        name: &str,
    ) -> Result<Vec<i64>, StoreError> {
        let rows = sqlx::query(&D::index_sql(&self.table, name)).fetch_all(&mut *conn).await?;
        Ok(rows.iter().map(|r| D::int(r, 0)).collect::<Result<Vec<_>, _>>()?)
    }

    /// The index the sinks after the first read the outbox by, `(created_at_ms, key)`, made
    /// (under the migration lock, see `SqlStore::holding_migration_lock`) by `migrate` and
    /// when a sink after the first is registered; the console's searches read by it too.
    /// Online: on PostgreSQL built `CONCURRENTLY` (a build cut short leaves an invalid index
    /// that `IF NOT EXISTS` would keep: it is dropped and built again), on MySQL in place.
    /// The fan-out's partial index of an earlier version goes: every new row would enter
    /// it, since nothing copies rows any more.
    pub(super) async fn build_consumer_index(
        &self,
        conn: &mut <D::Db as Database>::Connection,
    ) -> Result<(), StoreError> {
        let t = &self.table;
        let create = D::create_index_online(t, &format!("{t}_consumer_idx"), &self.after_created(""));
        self.ensure_index(conn, "consumer_idx", &create).await?;
        let fanout = format!("{t}_fanout_idx");
        if !self.indexes_named(conn, &fanout).await?.is_empty() {
            Executor::execute(&mut *conn, D::drop_index_online(t, &fanout).as_str())
                .await
                .map_err(|e| StoreError::Migration(format!("dropping {fanout}, which this version no longer uses: {e}")))?;
        }
        Ok(())
    }

    /// The indexes the console's searches read by (databases.md, "What the console
    /// reads"), each built online by `migrate` where it is missing: a room's events and a
    /// type's, newest first (`(room_id, created_at_ms, key)`, `(event_type, …)`), and on
    /// PostgreSQL the failed rows. The time order is the consumers' index.
    pub(super) async fn build_search_indexes(
        &self,
        conn: &mut <D::Db as Database>::Connection,
    ) -> Result<(), StoreError> {
        let t = &self.table;
        self.build_consumer_index(conn).await?;
        for (suffix, lead) in [("room_idx", "room_id, "), ("type_idx", "event_type, ")] {
            let create = D::create_index_online(t, &format!("{t}_{suffix}"), &self.after_created(lead));
            self.ensure_index(conn, suffix, &create).await?;
        }
        if let Some(create) = D::failed_index_online(t, &format!("{t}_failed_idx"), &self.after_created("")) {
            self.ensure_index(conn, "failed_idx", &create).await?;
        }
        Ok(())
    }

    /// `lead` then `created_at_ms, key`: every SQLite index ends in the row id already, and
    /// names no `rowid` column in it.
    fn after_created(&self, lead: &str) -> String {
        match self.profile.key.column() {
            "rowid" => format!("{lead}created_at_ms"),
            key => format!("{lead}created_at_ms, {key}"),
        }
    }

    /// Runs `create` unless `<table>_<suffix>` is there and valid; an invalid one (a build
    /// cut short) is dropped first.
    async fn ensure_index(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        suffix: &str,
        create: &str,
    ) -> Result<(), StoreError> {
        let t = &self.table;
        let name = format!("{t}_{suffix}");
        let built = self.indexes_named(conn, &name).await?;
        if built.contains(&1) {
            return Ok(());
        }
        if built.contains(&0) {
            tracing::warn!(table = %t, index = %name, "an index is invalid (a build was cut short): building it again");
            Executor::execute(&mut *conn, D::drop_index_online(t, &name).as_str())
                .await
                .map_err(|e| StoreError::Migration(format!("dropping the invalid {name}: {e}")))?;
        }
        Executor::execute(&mut *conn, create).await.map_err(|e| StoreError::Migration(format!("creating {name}: {e}")))?;
        Ok(())
    }

    /// The keys of up to `limit` rows in `statuses` (SQL literals) that `filter` selects,
    /// after `after` in key order: what one step of a replay or a discard moves.
    pub(super) async fn pick_for_step(
        &self,
        statuses: &str,
        filter: &super::ReplayFilter,
        after: Option<KeyValue>,
        limit: u32,
    ) -> Result<Vec<KeyValue>, StoreError> {
        let key = self.profile.key.column();
        let (conditions, values) = filter.conditions("", D::param, 1);
        let next = 3 + values.len();
        let pick = format!(
            "SELECT {key} FROM {} WHERE status IN ({statuses}){conditions} AND {key} > {} ORDER BY {key} LIMIT {}",
            self.table,
            D::param(next),
            D::param(next + 1)
        );
        let mut q = sqlx::query(&pick).bind(filter.from_ms).bind(filter.to_ms.unwrap_or(i64::MAX));
        for value in values {
            q = q.bind(value);
        }
        let after = after.unwrap_or(KeyValue::first(self.profile.key));
        let picked = bind_key::<D>(q, &after).bind(i64::from(limit)).fetch_all(&self.pool).await?;
        Ok(picked.iter().map(|r| self.key_of(r)).collect::<Result<Vec<_>, _>>()?)
    }

    /// The key in column 0 of `row`.
    pub(super) fn key_of(&self, row: &<D::Db as Database>::Row) -> Result<KeyValue, sqlx::Error> {
        if self.profile.key.is_text() { D::text(row, 0).map(KeyValue::Text) } else { D::int(row, 0).map(KeyValue::Int) }
    }

});

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
