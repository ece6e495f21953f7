//! Sinks as consumers of the outbox (issue 48, decision 0203): what a sink after the first
//! keeps instead of a copy of every row.
//!
//! - **A position per partition** (`<table>_positions`): every row of the partition at or
//!   before `(created_at_ms, key)` is finished for the sink, unless an exception says
//!   otherwise. Before its first write a partition stands at the sink's start
//!   (`start_from_ms`): every row created earlier is none of its business.
//! - **Exceptions** (`<table>_exceptions`): one event's state for one sink where the
//!   position does not tell it: `delivered` past the position (finished out of order, kept
//!   when a partition changes hands), `pending` (held behind its room), `retryable`,
//!   `failed`.
//!
//! A sink's state for an event is its exception if it has one, else finished at or before
//! the position, else waiting. An owner reads its partitions' rows past their positions
//! and the exceptions still to deliver ([`SqlStore::consumer_page`]); it moves a position
//! in one fenced transaction ([`SqlStore::settle_positions`]) that walks the rows it passes:
//! one neither delivered nor excepted (a row that committed late, behind rows already
//! delivered) becomes a `pending` exception rather than being passed in silence, and one
//! the owner has in hand (read lately, still to deliver) stops the position there. No
//! position passes the settle horizon, so a row committing after the walk was not created
//! before it.

use std::collections::{HashMap, HashSet};

use sqlx::Database;

use super::partitions::{OwnedRead, Page, Waiting, after_cursor, list, partition_of};
use super::sinks::{KeyValue, RegisteredSink, bind_key};
use super::sql::for_every_dialect;
use super::sql::{Dialect, SqlStore};
use super::{Claimed, Fence, Lease, Status, StoreError};

/// How far behind the database's clock a position stays: a producer's transaction open
/// longer than this, or a producer clock further behind, may commit a row behind a
/// position (decision 0203).
pub const SETTLE_MS: i64 = 10_000;

/// Rows a renumbering reads at a time.
const RENUMBER_ROWS: u32 = 5_000;

/// Where a sink stands in one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The partition.
    pub part: u32,
    /// The last finished row's creation time.
    pub created_at_ms: i64,
    /// The last finished row's key.
    pub key: KeyValue,
}

impl Position {
    /// Where a partition stands before its first write: just before the first row created
    /// at `start_from_ms`.
    pub fn start(part: u32, start_from_ms: i64, key: super::schema::Key) -> Position {
        Position { part, created_at_ms: start_from_ms, key: KeyValue::first(key) }
    }

    /// Whether the row `(created_at_ms, key)` is at or before this position.
    pub fn passed(&self, created_at_ms: i64, key: &KeyValue) -> bool {
        (created_at_ms, key) <= (self.created_at_ms, &self.key)
    }
}

/// One event's state for one sink, to write as an exception.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exception {
    /// The event.
    pub event_id: String,
    /// Its room's app.
    pub app_code: String,
    /// Its room.
    pub room_id: String,
    /// Its type.
    pub event_type: String,
    /// Its partition, under the epoch its owner read it with: an exception is written only
    /// while its owner holds the partition under that epoch.
    pub fence: Fence,
    /// Its creation time.
    pub created_at_ms: i64,
    /// `pending`, `delivered`, `retryable` or `failed`.
    pub status: Status,
    /// Added to the exception's retry count (1 for a counted attempt).
    pub counted: i32,
    /// When a `retryable` event is due.
    pub next_retry_at_ms: i64,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    /// The build of the sink that made this outcome.
    pub plugin_digest: Option<String>,
}

/// Whether an owner delivered an event (by id) past its partition's position: the owner's
/// memory, asked row by row.
pub type Finished<'f> = dyn Fn(&str) -> bool + Send + Sync + 'f;

/// What one fenced settle of an owner asks.
#[derive(Clone)]
pub struct Settle<'a> {
    /// The sink (its name keys positions and exceptions; its table keys the partition leases).
    pub sink: &'a RegisteredSink,
    /// The owner, as in the partition leases.
    pub owner: &'a str,
    /// `P`.
    pub total: u32,
    /// The partitions whose positions may move, with the epochs they are held under.
    pub fences: &'a [Fence],
    /// No position passes a row created after this (the database's clock less the settle
    /// time: a producer transaction open longer may commit rows before it).
    pub horizon_ms: i64,
    /// Whether the owner delivered this event (by id) past its partition's position.
    pub finished: &'a Finished<'a>,
    /// Whether the owner has this unfinished event in hand: it read it less than a settle
    /// time ago and will deliver it (in flight, or waiting behind its room). The position
    /// stops before such a row instead of passing it as a hole: a hole is a `pending`
    /// exception, written, then delivered through the exceptions and written again as
    /// `delivered` (a catch-up past the horizon made thousands of them).
    pub in_hand: &'a Finished<'a>,
    /// Outcomes to record, each in a held partition.
    pub exceptions: &'a [Exception],
    /// Now on the database's clock.
    pub now_ms: i64,
    /// Rows walked at most, over every partition.
    pub limit: u32,
}

/// What a settle did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settled {
    /// The positions of the partitions it held, moved or not.
    pub positions: Vec<Position>,
    /// The finished events it passed (the owner may forget them).
    pub passed: Vec<String>,
    /// Partitions not held under the fences' epochs: nothing of theirs was written.
    pub fenced: Vec<u32>,
    /// The fences held: an exception was written only under one of these.
    pub held: Vec<Fence>,
    /// The walk stopped at its limit and moved positions: the next settle may move them
    /// further at once.
    pub more: bool,
}

/// A key as `<table>_positions.row_key` keeps it.
fn key_text(key: &KeyValue) -> String {
    match key {
        KeyValue::Int(n) => n.to_string(),
        KeyValue::Text(s) => s.clone(),
    }
}

/// An exception as read: `(status, retry_count, next_retry_at_ms)`.
type Excepted = (Status, i32, i64);

for_every_dialect!(impl {
    /// A key read back from `<table>_positions.row_key`.
    fn key_from_text(&self, text: String) -> Result<KeyValue, StoreError> {
        if self.profile.key.is_text() {
            return Ok(KeyValue::Text(text));
        }
        text.parse().map(KeyValue::Int).map_err(|_| StoreError::Query(format!("a position's key {text:?} is no number")))
    }

    /// `sink`'s positions in `parts` (each at the sink's start until first written), read on
    /// `conn`.
    async fn positions_on(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        sink: &RegisteredSink,
        parts: &[u32],
    ) -> Result<HashMap<u32, Position>, StoreError> {
        let mut found: HashMap<u32, Position> =
            parts.iter().map(|&part| (part, Position::start(part, sink.start_from_ms, self.profile.key))).collect();
        if parts.is_empty() {
            return Ok(found);
        }
        let sql = self.consumers.positions.replace("{parts}", &list(parts));
        for r in sqlx::query(&sql).bind(sink.name.clone()).fetch_all(&mut *conn).await? {
            let part = D::int(&r, 0)? as u32;
            let key = self.key_from_text(D::text(&r, 2)?)?;
            found.insert(part, Position { part, created_at_ms: D::int(&r, 1)?, key });
        }
        Ok(found)
    }

    /// `sink`'s positions in `parts`.
    pub(super) async fn positions_of(
        &self,
        sink: &RegisteredSink,
        parts: &[u32],
    ) -> Result<Vec<Position>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let mut positions: Vec<Position> = self.positions_on(&mut conn, sink, parts).await?.into_values().collect();
        positions.sort_by_key(|p| p.part);
        Ok(positions)
    }

    /// `sink`'s exceptions in `parts` that a read or a walk from `from_ms` must know: those
    /// still to deliver wherever they are, and every other created at or after `from_ms`.
    /// By event id, with the creation time and partition of those still to deliver.
    async fn exceptions_on(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        sink: &str,
        parts: &[u32],
        from_ms: i64,
    ) -> Result<HashMap<String, (Excepted, i64)>, StoreError> {
        if parts.is_empty() {
            return Ok(HashMap::new());
        }
        let sql = format!(
            "SELECT event_id, status, retry_count, next_retry_at_ms, created_at_ms FROM {}_exceptions \
             WHERE sink = {} AND part IN ({}) AND (status IN ('pending', 'retryable') OR created_at_ms >= {})",
            self.table,
            D::param(1),
            list(parts),
            D::param(2)
        );
        let rows = sqlx::query(&sql).bind(sink.to_string()).bind(from_ms).fetch_all(&mut *conn).await?;
        let mut found = HashMap::with_capacity(rows.len());
        for r in rows {
            let status = Status::parse(&D::text(&r, 1)?).unwrap_or(Status::Pending);
            let retry_count = i32::try_from(D::int(&r, 2)?).unwrap_or(i32::MAX);
            found.insert(D::text(&r, 0)?, ((status, retry_count, D::int(&r, 3)?), D::int(&r, 4)?));
        }
        Ok(found)
    }

    /// The rows `walk` names, in `(created_at_ms, key)` order (of every partition on SQLite,
    /// which the caller filters). Columns as [`Self::decode_page`] reads them; the envelope
    /// `NULL` unless asked for.
    async fn rows_after(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        walk: &Walk<'_>,
    ) -> Result<Vec<<D::Db as Database>::Row>, StoreError> {
        let key = self.profile.key.column();
        let only = (D::PARTITION_HASH.is_some() && (walk.parts.len() as u32) < walk.total).then(|| walk.parts.to_vec());
        // A page read leaves out runs of keys: a fixed number of ranges (those not given
        // are empty), so that its statement is built once.
        let runs = if walk.envelopes && !self.profile.key.is_text() { SKIP_SLOTS } else { 0 };
        let sql = self.walk_read.get((walk.total, only.clone(), walk.envelopes), || {
            let expr = D::partition_expr(walk.total);
            let only = match (&expr, &only) {
                (Some(expr), Some(only)) => format!(" AND {expr} IN ({})", list(only)),
                _ => String::new(),
            };
            let skip: String = (0..runs)
                .map(|i| format!(" AND NOT ({key} BETWEEN {} AND {})", D::param(5 + 2 * i), D::param(6 + 2 * i)))
                .collect();
            format!(
                "SELECT {} FROM {} WHERE {} AND created_at_ms <= {}{only}{skip} ORDER BY created_at_ms, {key} LIMIT {}",
                self.waiting_columns(expr.as_deref().unwrap_or("0"), walk.envelopes),
                self.table,
                after_cursor::<D>(key, 1),
                D::param(4),
                D::param(5 + 2 * runs)
            )
        });
        let after = walk.after;
        let mut q = bind_key::<D>(sqlx::query(&sql).bind(after.0).bind(after.0), &after.1).bind(walk.until_ms);
        for i in 0..runs {
            let (first, last) = walk.skip.get(i).copied().unwrap_or((1, 0));
            q = q.bind(first).bind(last);
        }
        Ok(q.bind(i64::from(walk.limit)).fetch_all(&mut *conn).await?)
    }

    /// The partition of a row read by [`Self::rows_after`].
    fn part_of(&self, row: &<D::Db as Database>::Row, total: u32) -> Result<u32, sqlx::Error> {
        if D::PARTITION_HASH.is_some() {
            return Ok(D::int(row, 11)? as u32);
        }
        Ok(partition_of(&D::text(row, 1)?, &D::text(row, 4)?, total))
    }

    /// The key of a row read by [`Self::rows_after`].
    fn sort_key(&self, row: &<D::Db as Database>::Row) -> Result<KeyValue, sqlx::Error> {
        if self.profile.key.is_text() { D::text(row, 12).map(KeyValue::Text) } else { D::int(row, 12).map(KeyValue::Int) }
    }

    /// Up to `read.limit` events of `sink` waiting in the owned partitions, in
    /// `(created_at_ms, key)` order after `read.after`: rows past their partition's position
    /// with no exception and not in `finished`, and the `pending` and `retryable` exceptions
    /// (due or not: a room's earliest such event decides whether the room may go on). Each
    /// carries the sink's own status and retry count, not the row's. Also says which of
    /// them have an exception (an outcome for them must be written, not remembered).
    ///
    /// `skip`: ranges of keys (first, last) of events in `finished`, which the read leaves
    /// out rather than reads and drops (at most [`SKIP_SLOTS`], where rows are keyed by
    /// number).
    pub(super) async fn consumer_page(
        &self,
        sink: &RegisteredSink,
        read: &OwnedRead<'_>,
        finished: &Finished<'_>,
        skip: &[(i64, i64)],
    ) -> Result<(Page, HashSet<String>), StoreError> {
        // Where the database plans by estimates, the rows are read in the index's order
        // whatever a run left out does to them (as an owner's read, decision 0195).
        match D::INDEX_ORDER_READ {
            Some(begin) => {
                let mut tx = self.pool.begin_with(begin).await?;
                let page = self.consumer_page_on(&mut tx, sink, read, finished, skip).await?;
                tx.commit().await?;
                Ok(page)
            }
            None => self.consumer_page_on(&mut *self.pool.acquire().await?, sink, read, finished, skip).await,
        }
    }

    async fn consumer_page_on(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        sink: &RegisteredSink,
        read: &OwnedRead<'_>,
        finished: &Finished<'_>,
        skip: &[(i64, i64)],
    ) -> Result<(Page, HashSet<String>), StoreError> {
        let parts: Vec<u32> = read.owned.iter().map(|f| f.partition).collect();
        let epochs: HashMap<u32, i64> = read.owned.iter().map(|f| (f.partition, f.epoch)).collect();
        let positions = self.positions_on(&mut *conn, sink, &parts).await?;
        let Some(lowest) = positions.values().map(|p| (p.created_at_ms, p.key.clone())).min() else {
            return Ok((Page { at_end: true, ..Page::default() }, HashSet::new()));
        };
        let from = match &read.after {
            Some(after) if *after > lowest => after.clone(),
            _ => lowest.clone(),
        };
        let exceptions = self.exceptions_on(&mut *conn, &sink.name, &parts, lowest.0).await?;
        let walk = Walk {
            total: read.total,
            parts: &parts,
            after: &from,
            until_ms: i64::MAX,
            limit: read.limit,
            envelopes: true,
            skip,
        };
        let rows = self.rows_after(&mut *conn, &walk).await?;
        let mut at_end = rows.len() < read.limit as usize;
        let mut last = None;
        let mut waiting = Vec::with_capacity(rows.len());
        let mut seen = HashSet::new();
        for r in &rows {
            let key = self.sort_key(r)?;
            let created_at_ms = D::int(r, 6)?;
            last = Some((created_at_ms, key.clone()));
            let part = self.part_of(r, read.total)?;
            let (Some(&epoch), Some(position)) = (epochs.get(&part), positions.get(&part)) else { continue };
            let event_id = D::text(r, 2)?;
            let excepted = exceptions.get(&event_id).map(|(e, _)| *e);
            let state = match excepted {
                Some((status @ (Status::Pending | Status::Retryable), retry_count, next_retry_at_ms)) => {
                    (status, retry_count, next_retry_at_ms)
                }
                Some(_) => continue,
                None if position.passed(created_at_ms, &key) || finished(&event_id) => continue,
                None => (Status::Pending, 0, 0),
            };
            seen.insert(event_id.clone());
            waiting.push(self.waiting_of(r, read.owner, Fence { partition: part, epoch }, state, key)?);
        }
        // The exceptions still to deliver that this page's rows did not bring: those before
        // the read's start (at or before their position), read by event id.
        let mut before: Vec<(i64, &String)> = exceptions
            .iter()
            .filter(|(id, ((status, _, _), created_at_ms))| {
                matches!(status, Status::Pending | Status::Retryable)
                    && !seen.contains(*id)
                    && read.after.as_ref().is_none_or(|after| *created_at_ms >= after.0)
                    && (at_end || last.as_ref().is_none_or(|last: &(i64, KeyValue)| *created_at_ms <= last.0))
            })
            .map(|(id, (_, created_at_ms))| (*created_at_ms, id))
            .collect();
        if !before.is_empty() {
            // The earliest a page can hold, read by event id.
            before.sort_unstable();
            before.truncate(read.limit as usize);
            let ids: Vec<&String> = before.into_iter().map(|(_, id)| id).collect();
            for r in self.rows_by_event_id(&mut *conn, read.total, &ids).await? {
                let key = self.sort_key(&r)?;
                let created_at_ms = D::int(&r, 6)?;
                if read.after.as_ref().is_some_and(|after| (created_at_ms, &key) <= (after.0, &after.1)) {
                    continue;
                }
                if last.as_ref().is_some_and(|last: &(i64, KeyValue)| !at_end && (created_at_ms, &key) > (last.0, &last.1)) {
                    continue;
                }
                let part = self.part_of(&r, read.total)?;
                let Some(&epoch) = epochs.get(&part) else { continue };
                let Some((state, _)) = exceptions.get(&D::text(&r, 2)?) else { continue };
                waiting.push(self.waiting_of(&r, read.owner, Fence { partition: part, epoch }, *state, key)?);
            }
            waiting.sort_by(|a, b| (a.row.created_at_ms, &a.key).cmp(&(b.row.created_at_ms, &b.key)));
            if waiting.len() > read.limit as usize {
                // The page ends at its last event: the next starts after it.
                waiting.truncate(read.limit as usize);
                at_end = false;
                last = waiting.last().map(|w| (w.row.created_at_ms, w.key.clone()));
            } else if let Some(w) = waiting.last()
                && last.as_ref().is_none_or(|last: &(i64, KeyValue)| (w.row.created_at_ms, &w.key) > (last.0, &last.1))
            {
                last = Some((w.row.created_at_ms, w.key.clone()));
            }
        }
        let excepted = waiting.iter().filter(|w| exceptions.contains_key(&w.row.event_id)).map(|w| w.row.event_id.clone());
        let excepted = excepted.collect();
        Ok((Page { waiting, last, at_end }, excepted))
    }

    /// The rows named by `event_ids`, with [`Self::rows_after`]'s columns.
    async fn rows_by_event_id(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        total: u32,
        event_ids: &[&String],
    ) -> Result<Vec<<D::Db as Database>::Row>, StoreError> {
        let key = self.profile.key.column();
        let id = super::key_as_id(self.profile.key);
        let part = D::partition_expr(total).unwrap_or_else(|| "0".to_string());
        let mut rows = Vec::with_capacity(event_ids.len());
        for chunk in event_ids.chunks(500) {
            let sql = format!(
                "SELECT {id}, app_code, event_id, event_type, room_id, envelope, created_at_ms, retry_count, \
                 status, next_retry_at_ms, lock_until_ms, {part} AS part_no, {key} AS sort_key, trace_context FROM {} \
                 WHERE event_id IN ({})",
                self.table,
                super::sql::params::<D>(1, chunk.len())
            );
            let mut q = sqlx::query(&sql);
            for event_id in chunk {
                q = q.bind((*event_id).clone());
            }
            rows.extend(q.fetch_all(&mut *conn).await?);
        }
        Ok(rows)
    }

    /// A waiting event of a consumer: the row, with the sink's own state.
    fn waiting_of(
        &self,
        r: &<D::Db as Database>::Row,
        owner: &str,
        fence: Fence,
        (status, retry_count, next_retry_at_ms): Excepted,
        key: KeyValue,
    ) -> Result<Waiting, StoreError> {
        let lease = Lease { worker_id: owner.to_string(), lock_until_ms: i64::MAX, fence: Some(fence) };
        // The row's own retry count is the first sink's: the sink's is its exception's.
        let row = Claimed {
            retry_count,
            ..super::sql::decode_claimed_with::<D>(r, lease, false, super::partitions::WAITING_CONTEXT)?
        };
        Ok(Waiting {
            row,
            status,
            next_retry_at_ms,
            lock_until_ms: 0,
            key,
        })
    }

    /// Writes one exception of `sink` in `tx` (see `ConsumerStatements` in `sql.rs`: delivered stays).
    async fn write_exception(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        sink: &str,
        e: &Exception,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.consumers.set_exception)
            .bind(sink.to_string())
            .bind(e.event_id.clone())
            .bind(e.app_code.clone())
            .bind(e.room_id.clone())
            .bind(e.event_type.clone())
            .bind(i64::from(e.fence.partition))
            .bind(e.created_at_ms)
            .bind(e.status.as_str().to_string())
            .bind(i64::from(e.counted))
            .bind(e.next_retry_at_ms)
            .bind(e.last_error.as_deref().map(|m| self.fit_error(m).into_owned()).unwrap_or_default())
            .bind(now_ms)
            .bind(e.plugin_digest.clone().unwrap_or_default())
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// Records `settle.exceptions` and moves the positions of the partitions `settle.owner`
    /// holds, in one transaction that first checks, under a share lock on the partition
    /// rows, that it holds each under its fence's epoch and lease (nothing of a partition it
    /// lost is written). A position moves over rows in order up to the last one that is in
    /// `settle.finished` or has an exception, created at or before `settle.horizon_ms`. A
    /// row it passes that is neither (a hole: a row committed late behind finished ones, a
    /// room's row held behind its retry, a delivery still under way) becomes a `pending`
    /// exception, and waits as before. `delivered` exceptions behind every position are
    /// deleted: the positions say as much.
    ///
    /// A deadlock the database breaks (MariaDB, against a purge's or another owner's
    /// statements) is tried again: a settle that fails loses nothing, but one that gives up
    /// a partition and fails would leave its next owner to deliver what this one did.
    pub(super) async fn settle_positions(&self, settle: &Settle<'_>) -> Result<Settled, StoreError> {
        super::sql::retrying_deadlocks(std::time::Duration::from_millis(20), || self.settle_once(settle)).await
    }

    async fn settle_once(&self, settle: &Settle<'_>) -> Result<Settled, StoreError> {
        let (lease_parts, _) = self.lease_tables();
        let _writing = self.writing().await;
        let mut tx = self.begin_writing().await?;
        let mut asked: Vec<u32> = settle.fences.iter().map(|f| f.partition).collect();
        asked.sort_unstable();
        asked.dedup();
        let (mut held, mut held_fences) = (Vec::new(), Vec::new());
        if !asked.is_empty() {
            let check = format!(
                "SELECT part, epoch, owner, lease_until_ms FROM {lease_parts} WHERE sink_table = {} AND part IN ({}){}",
                D::param(1),
                list(&asked),
                D::SHARE_LOCK
            );
            for r in sqlx::query(&check).bind(settle.sink.table.clone()).fetch_all(&mut *tx).await? {
                let fence = Fence { partition: D::int(&r, 0)? as u32, epoch: D::int(&r, 1)? };
                if D::opt_text(&r, 2)?.as_deref() == Some(settle.owner)
                    && D::int(&r, 3)? > settle.now_ms
                    && settle.fences.contains(&fence)
                {
                    held.push(fence.partition);
                    held_fences.push(fence);
                }
            }
        }
        let fenced: Vec<u32> = asked.iter().copied().filter(|p| !held.contains(p)).collect();
        for e in settle.exceptions.iter().filter(|e| held_fences.contains(&e.fence)) {
            self.write_exception(&mut tx, &settle.sink.name, e, settle.now_ms).await?;
        }
        let mut positions = self.positions_on(&mut tx, settle.sink, &held).await?;
        let mut passed = Vec::new();
        let mut more = false;
        if let Some(lowest) = positions.values().map(|p| (p.created_at_ms, p.key.clone())).min() {
            let known = self.exceptions_on(&mut tx, &settle.sink.name, &held, lowest.0).await?;
            let walk = Walk::over(settle.total, &held, &lowest, settle.horizon_ms, settle.limit);
            let rows = self.rows_after(&mut tx, &walk).await?;
            let epochs: HashMap<u32, Fence> = held_fences.iter().map(|f| (f.partition, *f)).collect();
            // Per partition, the rows passed over since its position last moved that are
            // neither finished nor excepted: holes once a finished row follows them.
            let mut unknown: HashMap<u32, Vec<Exception>> = HashMap::new();
            let mut holes: Vec<Exception> = Vec::new();
            let mut moved: HashSet<u32> = HashSet::new();
            // Partitions whose position stops before a row the owner has in hand.
            let mut stopped: HashSet<u32> = HashSet::new();
            let mut walked: Option<(i64, KeyValue)> = None;
            for r in &rows {
                let part = self.part_of(r, settle.total)?;
                let (created_at_ms, key) = (D::int(r, 6)?, self.sort_key(r)?);
                walked = Some((created_at_ms, key.clone()));
                let (Some(position), Some(&fence)) = (positions.get_mut(&part), epochs.get(&part)) else { continue };
                if position.passed(created_at_ms, &key) || stopped.contains(&part) {
                    continue;
                }
                let event_id = D::text(r, 2)?;
                let finished = !known.contains_key(&event_id) && (settle.finished)(&event_id);
                if !finished && !known.contains_key(&event_id) {
                    if (settle.in_hand)(&event_id) {
                        stopped.insert(part);
                    }
                    unknown.entry(part).or_default().push(self.exception_of(r, fence, Status::Pending)?);
                    continue;
                }
                holes.extend(unknown.remove(&part).unwrap_or_default());
                if finished {
                    passed.push(event_id);
                }
                *position = Position { part, created_at_ms, key };
                moved.insert(part);
            }
            // A partition with nothing left unfinished in the walk had no row of its own
            // between its position and the walk's last row: it moves there too, when the walk
            // was cut at its limit, or when others moved and it lags by a settle time.
            // Otherwise a quiet partition would keep the walk's start, the lowest position,
            // behind for good, and a walk cut at its limit would never reach the newer rows.
            // (A sink that delivers nothing still writes nothing.)
            let full = rows.len() >= settle.limit as usize;
            if let Some((at, key)) = &walked {
                let others_moved = !moved.is_empty();
                for (part, position) in positions.iter_mut() {
                    if unknown.contains_key(part) || position.passed(*at, key) {
                        continue;
                    }
                    if full || (others_moved && at - position.created_at_ms > SETTLE_MS) {
                        *position = Position { part: *part, created_at_ms: *at, key: key.clone() };
                        moved.insert(*part);
                    }
                }
            }
            for hole in &holes {
                self.write_exception(&mut tx, &settle.sink.name, hole, settle.now_ms).await?;
            }
            more = full && !moved.is_empty();
            let mut moved: Vec<u32> = moved.into_iter().collect();
            moved.sort_unstable();
            for part in &moved {
                let position = &positions[part];
                sqlx::query(&self.consumers.set_position)
                    .bind(settle.sink.name.clone())
                    .bind(i64::from(*part))
                    .bind(position.created_at_ms)
                    .bind(key_text(&position.key))
                    .bind(settle.now_ms)
                    .execute(&mut *tx)
                    .await?;
            }
            // `delivered` exceptions behind their partition's position: the position says
            // as much now (one range of the exceptions' index per partition).
            let mut clean: Vec<u32> = settle
                .exceptions
                .iter()
                .filter(|e| e.status == Status::Delivered && held_fences.contains(&e.fence))
                .map(|e| e.fence.partition)
                .chain(moved)
                .collect();
            clean.sort_unstable();
            clean.dedup();
            if !clean.is_empty() {
                let behind = clean
                    .iter()
                    .map(|part| format!("(part = {part} AND created_at_ms < {})", positions[part].created_at_ms))
                    .collect::<Vec<_>>()
                    .join(" OR ");
                let sql = self.consumers.forget.replace("{behind}", &behind);
                sqlx::query(&sql).bind(settle.sink.name.clone()).execute(&mut *tx).await?;
            }
        }
        tx.commit().await?;
        let mut positions: Vec<Position> = positions.into_values().collect();
        positions.sort_by_key(|p| p.part);
        Ok(Settled { positions, passed, fenced, held: held_fences, more })
    }
});

/// Which rows [`SqlStore::rows_after`] reads: those of partitions `parts` of `total` after
/// `after` in `(created_at_ms, key)` order, created at or before `until_ms`, `limit` at most.
struct Walk<'a> {
    total: u32,
    parts: &'a [u32],
    after: &'a (i64, KeyValue),
    until_ms: i64,
    limit: u32,
    /// With their envelopes (a page handed to the sink), or without (a settle, a count).
    envelopes: bool,
    /// Ranges of keys left out (a page read's, see [`SqlStore::consumer_page`]).
    skip: &'a [(i64, i64)],
}

/// How many ranges of keys a page read can leave out.
pub(super) const SKIP_SLOTS: usize = 16;

impl<'a> Walk<'a> {
    /// A walk that needs no envelope.
    fn over(total: u32, parts: &'a [u32], after: &'a (i64, KeyValue), until_ms: i64, limit: u32) -> Self {
        Walk { total, parts, after, until_ms, limit, envelopes: false, skip: &[] }
    }
}

/// One event's exception, as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ExceptionState {
    pub status: Status,
    pub retry_count: i32,
    pub next_retry_at_ms: i64,
    pub last_error: Option<String>,
    pub updated_at_ms: i64,
    pub plugin_digest: Option<String>,
}

/// A sink's events by its state (see [`SqlStore::consumer_counts`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ConsumerCounts {
    /// Rows created at or after the sink's start.
    pub rows: i64,
    /// Rows past their partition's position with no exception.
    pub waiting: i64,
    /// The oldest of those, and of the `pending` and `retryable` exceptions.
    pub oldest_waiting_created_at_ms: Option<i64>,
    /// Exceptions by status.
    pub excepted: Vec<(Status, i64)>,
    /// The most frequent errors of `retryable` and `failed` exceptions.
    pub top_errors: Vec<(String, i64)>,
}

/// The columns [`SqlStore::exception_states`] reads, after the event id.
const STATE_COLUMNS: &str = "status, retry_count, next_retry_at_ms, last_error, updated_at_ms, plugin_digest";

for_every_dialect!(impl {
    fn decode_state(r: &<D::Db as Database>::Row, first: usize) -> Result<ExceptionState, StoreError> {
        Ok(ExceptionState {
            status: Status::parse(&D::text(r, first)?).unwrap_or(Status::Pending),
            retry_count: i32::try_from(D::int(r, first + 1)?).unwrap_or(i32::MAX),
            next_retry_at_ms: D::int(r, first + 2)?,
            last_error: D::opt_text(r, first + 3)?,
            updated_at_ms: D::int(r, first + 4)?,
            plugin_digest: D::opt_text(r, first + 5)?,
        })
    }

    /// `sink`'s exception for `event_id`, if it has one.
    pub(super) async fn exception_state(&self, sink: &str, event_id: &str) -> Result<Option<ExceptionState>, StoreError> {
        let sql = format!(
            "SELECT {STATE_COLUMNS} FROM {}_exceptions WHERE sink = {} AND event_id = {}",
            self.table,
            D::param(1),
            D::param(2)
        );
        let row = sqlx::query(&sql).bind(sink.to_string()).bind(event_id.to_string()).fetch_optional(&self.pool).await?;
        row.map(|r| Self::decode_state(&r, 0)).transpose()
    }

    /// `sink`'s `failed` and `retryable` exceptions, the latest first, up to `limit`.
    pub(super) async fn recent_exceptions(
        &self,
        sink: &str,
        limit: u32,
    ) -> Result<Vec<(String, ExceptionState)>, StoreError> {
        let sql = format!(
            "SELECT event_id, {STATE_COLUMNS} FROM {}_exceptions WHERE sink = {} AND status IN ('failed', 'retryable') \
             ORDER BY updated_at_ms DESC, event_id DESC LIMIT {}",
            self.table,
            D::param(1),
            D::param(2)
        );
        let rows = sqlx::query(&sql).bind(sink.to_string()).bind(i64::from(limit)).fetch_all(&self.pool).await?;
        rows.iter().map(|r| Ok((D::text(r, 0)?, Self::decode_state(r, 1)?))).collect()
    }

    /// Of `rooms`, those where `sink` has a `failed` exception, with the earliest one's
    /// creation time.
    pub(super) async fn failed_exception_rooms(
        &self,
        sink: &str,
        rooms: &[(String, String)],
    ) -> Result<Vec<(String, String, i64)>, StoreError> {
        if rooms.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT app_code, room_id, MIN(created_at_ms) FROM {}_exceptions WHERE sink = {} AND status = 'failed' \
             AND room_id IN ({}) GROUP BY app_code, room_id",
            self.table,
            D::param(1),
            super::sql::params::<D>(2, rooms.len())
        );
        let mut q = sqlx::query(&sql).bind(sink.to_string());
        for (_, room) in rooms {
            q = q.bind(room.clone());
        }
        let found = q
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| Ok((D::text(r, 0)?, D::text(r, 1)?, D::int(r, 2)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok(found.into_iter().filter(|(app, room, _)| rooms.iter().any(|(a, r)| a == app && r == room)).collect())
    }

    /// How many of `sink`'s `failed` exceptions `filter` selects.
    pub(super) async fn count_failed_exceptions(&self, sink: &str, filter: &super::RetryFilter) -> Result<i64, StoreError> {
        // Bound in the order they appear (`?` placeholders): the filter's value, then the sink.
        let (filter, value) = super::sql::failed_filter::<D>(filter, 1);
        let next = 1 + usize::from(value.is_some());
        let sql = format!("SELECT COUNT(*) FROM {}_exceptions{filter} AND sink = {}", self.table, D::param(next));
        let mut q = sqlx::query(&sql);
        if let Some(value) = value {
            q = q.bind(value);
        }
        Ok(D::int(&q.bind(sink.to_string()).fetch_one(&self.pool).await?, 0)?)
    }

    /// An operator's retry of `sink`'s `failed` exceptions that `filter` selects: `pending`
    /// again, with a new count.
    pub(super) async fn retry_failed_exceptions(
        &self,
        sink: &str,
        filter: &super::RetryFilter,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        let _writing = self.writing().await;
        let (filter, value) = super::sql::failed_filter::<D>(filter, 2);
        let next = 2 + usize::from(value.is_some());
        let sql = format!(
            "UPDATE {}_exceptions SET status = 'pending', retry_count = 0, next_retry_at_ms = 0, updated_at_ms = {}{filter} \
             AND sink = {}",
            self.table,
            D::param(1),
            D::param(next)
        );
        let mut q = sqlx::query(&sql).bind(now_ms);
        if let Some(value) = value {
            q = q.bind(value);
        }
        let q = q.bind(sink.to_string());
        Ok(D::rows_affected(&q.execute(&self.pool).await?))
    }

    /// `sink`'s events by its state over `total` partitions. The rows past the positions are
    /// read (not only counted) to tell each one's partition: the cost grows with the sink's
    /// backlog, not with the table.
    pub(super) async fn consumer_counts(&self, sink: &RegisteredSink, total: u32) -> Result<ConsumerCounts, StoreError> {
        let parts: Vec<u32> = (0..total.max(1)).collect();
        let mut conn = self.pool.acquire().await?;
        let positions = self.positions_on(&mut conn, sink, &parts).await?;
        let rows_sql = format!("SELECT COUNT(*) FROM {} WHERE created_at_ms >= {}", self.table, D::param(1));
        let rows = D::int(&sqlx::query(&rows_sql).bind(sink.start_from_ms).fetch_one(&mut *conn).await?, 0)?;
        let mut counts = ConsumerCounts { rows, ..ConsumerCounts::default() };
        let exceptions = format!("{}_exceptions", self.table);
        let by_status = format!(
            "SELECT status, COUNT(*), MIN(CASE WHEN status IN ('pending', 'retryable') THEN created_at_ms END) \
             FROM {exceptions} WHERE sink = {} GROUP BY status",
            D::param(1)
        );
        for r in sqlx::query(&by_status).bind(sink.name.clone()).fetch_all(&mut *conn).await? {
            let status = Status::parse(&D::text(&r, 0)?).unwrap_or(Status::Pending);
            counts.excepted.push((status, D::int(&r, 1)?));
            if let Some(at) = D::opt_int(&r, 2)? {
                counts.oldest_waiting_created_at_ms = Some(counts.oldest_waiting_created_at_ms.map_or(at, |o| o.min(at)));
            }
        }
        let errors = format!(
            "SELECT last_error, COUNT(*) FROM {exceptions} WHERE sink = {} AND status IN ('retryable', 'failed') \
             AND last_error IS NOT NULL GROUP BY last_error ORDER BY COUNT(*) DESC LIMIT 5",
            D::param(1)
        );
        for r in sqlx::query(&errors).bind(sink.name.clone()).fetch_all(&mut *conn).await? {
            counts.top_errors.push((D::text(&r, 0)?, D::int(&r, 1)?));
        }
        let Some(lowest) = positions.values().map(|p| (p.created_at_ms, p.key.clone())).min() else {
            return Ok(counts);
        };
        let known = self.exceptions_on(&mut conn, &sink.name, &parts, lowest.0).await?;
        let mut after = lowest;
        loop {
            let page = self.rows_after(&mut conn, &Walk::over(total.max(1), &parts, &after, i64::MAX, 5_000)).await?;
            for r in &page {
                let (created_at_ms, key) = (D::int(r, 6)?, self.sort_key(r)?);
                after = (created_at_ms, key.clone());
                let part = self.part_of(r, total.max(1))?;
                if positions.get(&part).is_some_and(|p| !p.passed(created_at_ms, &key))
                    && !known.contains_key(&D::text(r, 2)?)
                {
                    counts.waiting += 1;
                    let oldest = counts.oldest_waiting_created_at_ms.get_or_insert(created_at_ms);
                    *oldest = (*oldest).min(created_at_ms);
                }
            }
            if page.len() < 5_000 {
                return Ok(counts);
            }
        }
    }

    /// The minutes since `since_ms` in which `sink`'s events became `failed` (its
    /// deliveries leave no time behind: see [`super::consumer_store`]).
    pub(super) async fn failed_exception_minutes(&self, sink: &str, since_ms: i64) -> Result<Vec<(i64, i64)>, StoreError> {
        let sql = format!(
            "SELECT updated_at_ms - updated_at_ms % 60000, COUNT(*) FROM {}_exceptions WHERE sink = {} \
             AND status = 'failed' AND updated_at_ms >= {} GROUP BY updated_at_ms - updated_at_ms % 60000 ORDER BY 1",
            self.table,
            D::param(1),
            D::param(2)
        );
        let rows = sqlx::query(&sql).bind(sink.to_string()).bind(since_ms).fetch_all(&self.pool).await?;
        Ok(rows.iter().map(|r| Ok((D::int(r, 0)?, D::int(r, 1)?))).collect::<Result<_, sqlx::Error>>()?)
    }

    /// Of the rows a purge picked (`key, event_id`), the
    /// event ids some sink after the first still needs: created no earlier than its start,
    /// and either with an exception still to deliver or, with none, past its position in
    /// the row's partition (its start where that partition has none). A row picked here as
    /// not needed stays so: positions do not move back, and what a replay or a new sink
    /// needs meanwhile the purge's DELETE sees ([`super::sql`]'s `still_needed_elsewhere`).
    /// A purge may leave a row a little longer than needed (until its position moves);
    /// never the other way.
    pub(super) async fn still_needed(
        &self,
        picked: &[<D::Db as Database>::Row],
    ) -> Result<HashSet<String>, StoreError> {
        let mut needed = HashSet::new();
        let sinks = self.registered_sinks().await?;
        let ids: Vec<String> = picked.iter().map(|r| D::text(r, 1)).collect::<Result<_, _>>()?;
        let id_refs: Vec<&String> = ids.iter().collect();
        // The picked rows placed over a partition count, read once per count (the sinks
        // usually share one).
        let mut placed: HashMap<u32, Vec<<D::Db as Database>::Row>> = HashMap::new();
        for sink in sinks.iter().filter(|s| !s.is_first(&self.table)) {
            let total = match self.partition_total(&sink.table).await? {
                0 => super::partitions::DEFAULT_PARTITIONS,
                made => made,
            };
            let parts: Vec<u32> = (0..total).collect();
            let mut conn = self.pool.acquire().await?;
            let positions = self.positions_on(&mut conn, sink, &parts).await?;
            let exceptions = format!(
                "SELECT event_id, status FROM {}_exceptions WHERE sink = {} AND event_id IN ({})",
                self.table,
                D::param(1),
                super::sql::params::<D>(2, ids.len())
            );
            let mut q = sqlx::query(&exceptions).bind(sink.name.clone());
            for id in &ids {
                q = q.bind(id.clone());
            }
            let excepted: HashMap<String, String> = q
                .fetch_all(&mut *conn)
                .await?
                .iter()
                .map(|r| Ok((D::text(r, 0)?, D::text(r, 1)?)))
                .collect::<Result<_, sqlx::Error>>()?;
            let rows = match placed.entry(total) {
                std::collections::hash_map::Entry::Occupied(known) => known.into_mut(),
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(self.rows_by_event_id(&mut conn, total, &id_refs).await?)
                }
            };
            for r in rows.iter() {
                let (event_id, created_at_ms) = (D::text(r, 2)?, D::int(r, 6)?);
                if created_at_ms < sink.start_from_ms {
                    continue;
                }
                let still = match excepted.get(&event_id) {
                    Some(status) => status != "delivered",
                    None => {
                        let (part, key) = (self.part_of(r, total)?, self.sort_key(r)?);
                        positions.get(&part).is_none_or(|p| !p.passed(created_at_ms, &key))
                    }
                };
                if still {
                    needed.insert(event_id);
                }
            }
        }
        Ok(needed)
    }

    /// The partition count of the sink whose leases are keyed `lease_key` (0: not made yet).
    pub(super) async fn partition_total(&self, lease_key: &str) -> Result<u32, StoreError> {
        let (parts, _) = self.lease_tables();
        let sql = format!("SELECT COUNT(*) FROM {parts} WHERE sink_table = {}", D::param(1));
        Ok(D::int(&sqlx::query(&sql).bind(lease_key.to_string()).fetch_one(&self.pool).await?, 0)? as u32)
    }

    /// What `sink`'s exceptions and positions say of the events `event_ids`, by event id
    /// (an event the outbox no longer has is left out): three statements, whatever their
    /// number.
    pub(super) async fn judged(
        &self,
        sink: &RegisteredSink,
        total: u32,
        event_ids: &[&String],
    ) -> Result<HashMap<String, Judged>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let rows = self.rows_by_event_id(&mut conn, total, event_ids).await?;
        let placed = rows
            .iter()
            .map(|r| Ok((D::text(r, 2)?, self.part_of(r, total)?, D::int(r, 6)?, self.sort_key(r)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        let mut parts: Vec<u32> = placed.iter().map(|p| p.1).collect();
        parts.sort_unstable();
        parts.dedup();
        let positions = self.positions_on(&mut conn, sink, &parts).await?;
        let mut exceptions = HashMap::new();
        for chunk in event_ids.chunks(500) {
            let sql = format!(
                "SELECT event_id, {STATE_COLUMNS} FROM {}_exceptions WHERE sink = {} AND event_id IN ({})",
                self.table,
                D::param(1),
                super::sql::params::<D>(2, chunk.len())
            );
            let mut q = sqlx::query(&sql).bind(sink.name.clone());
            for id in chunk {
                q = q.bind((*id).clone());
            }
            for r in q.fetch_all(&mut *conn).await? {
                exceptions.insert(D::text(&r, 0)?, Self::decode_state(&r, 1)?);
            }
        }
        Ok(placed
            .into_iter()
            .map(|(id, part, created_at_ms, key)| {
                let judged = match exceptions.remove(&id) {
                    Some(state) => Judged::Excepted(state),
                    None => Judged::Passed(positions.get(&part).is_some_and(|p| p.passed(created_at_ms, &key))),
                };
                (id, judged)
            })
            .collect())
    }

    /// `sink`'s events among its exceptions in any of `search`'s statuses and matching the
    /// rest of it, newest first, at most `limit`, older than `cursor`: `(event id, created)`.
    pub(super) async fn search_exceptions(
        &self,
        sink: &str,
        search: &super::search::Search,
        cursor: Option<&super::search::Cursor>,
        limit: u32,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let (mut filter, mut binds) = super::search::conditions::<D>(search, 2);
        if let Some(cursor) = cursor {
            let (sql, values) = super::search::before::<D>(cursor, "event_id", binds.len() + 2);
            filter.push_str(&sql);
            binds.extend(values);
        }
        let sql = format!(
            "SELECT event_id, created_at_ms FROM {}_exceptions WHERE sink = {} AND status IN ({}){filter} \
             ORDER BY created_at_ms DESC, event_id DESC LIMIT {limit}",
            self.table,
            D::param(1),
            super::search::status_list(&search.statuses),
        );
        let mut q = sqlx::query(&sql).bind(sink.to_string());
        for value in &binds {
            q = bind_key::<D>(q, value);
        }
        let rows = q.fetch_all(&self.pool).await?;
        rows.iter().map(|r| Ok((D::text(r, 0)?, D::int(r, 1)?))).collect()
    }
});

/// What a sink's exceptions and positions say of one event.
#[derive(Debug, Clone)]
pub(super) enum Judged {
    /// It has an exception.
    Excepted(ExceptionState),
    /// It has none: finished if its partition's position has passed it, else waiting.
    Passed(bool),
}

for_every_dialect!(impl {
    /// One step of replaying to `sink` the events `filter` selects: of up to `limit` rows
    /// after `after` in key order, those finished for it (delivered or failed, at or before
    /// its position or by exception) become `pending` exceptions, and wait again. With
    /// `write` false, nothing is written: the step counts.
    pub(super) async fn consumer_replay_step(
        &self,
        sink: &RegisteredSink,
        total: u32,
        filter: &super::ReplayFilter,
        (now_ms, write): (i64, bool),
        after: Option<KeyValue>,
        limit: u32,
    ) -> Result<super::Step, StoreError> {
        self.consumer_move_step(sink, total, filter, None, (now_ms, write), after, limit).await
    }

    /// One step of an operator's discard for `sink` of the events `filter` selects: of up to
    /// `limit` rows after `after` in key order, those waiting for it (past its position with
    /// no exception, or a `pending` or `retryable` one) become `failed` exceptions with
    /// `reason` as their last error.
    pub(super) async fn consumer_discard_step(
        &self,
        sink: &RegisteredSink,
        total: u32,
        filter: &super::ReplayFilter,
        (reason, now_ms): (&str, i64),
        after: Option<KeyValue>,
        limit: u32,
    ) -> Result<super::Step, StoreError> {
        self.consumer_move_step(sink, total, filter, Some(reason), (now_ms, true), after, limit).await
    }

    /// [`Self::consumer_replay_step`] (`discard` `None`) or
    /// [`Self::consumer_discard_step`] (`discard` the reason).
    #[allow(clippy::too_many_arguments)]
    async fn consumer_move_step(
        &self,
        sink: &RegisteredSink,
        total: u32,
        filter: &super::ReplayFilter,
        discard: Option<&str>,
        (now_ms, write): (i64, bool),
        after: Option<KeyValue>,
        limit: u32,
    ) -> Result<super::Step, StoreError> {
        let total = total.max(1);
        let key = self.profile.key.column();
        let part = D::partition_expr(total).unwrap_or_else(|| "0".to_string());
        let (conditions, values) = filter.conditions("", D::param, 2);
        let next = 2 + 2 + values.len();
        let sql = format!(
            "SELECT {key}, app_code, event_id, event_type, room_id, created_at_ms, {part} FROM {} \
             WHERE created_at_ms >= {}{conditions} AND {key} > {} ORDER BY {key} LIMIT {}",
            self.table,
            D::param(1),
            D::param(next),
            D::param(next + 1)
        );
        let mut q = sqlx::query(&sql).bind(sink.start_from_ms).bind(filter.from_ms).bind(filter.to_ms.unwrap_or(i64::MAX));
        for value in values {
            q = q.bind(value);
        }
        let after = after.unwrap_or(KeyValue::first(self.profile.key));
        let picked = bind_key::<D>(q, &after).bind(i64::from(limit)).fetch_all(&self.pool).await?;
        let next = if picked.len() < limit as usize { None } else { picked.last().map(|r| self.key_of(r)).transpose()? };
        let parts: Vec<u32> = (0..total).collect();
        let _writing = if write { self.writing().await } else { None };
        let mut conn = self.pool.acquire().await?;
        let positions = self.positions_on(&mut conn, sink, &parts).await?;
        let mut rows = 0;
        for r in &picked {
            let (event_id, created_at_ms) = (D::text(r, 2)?, D::int(r, 5)?);
            let partition = if D::PARTITION_HASH.is_some() {
                D::int(r, 6)? as u32
            } else {
                partition_of(&D::text(r, 1)?, &D::text(r, 4)?, total)
            };
            let state = self.exception_state(&sink.name, &event_id).await?;
            let finished = match state.as_ref().map(|s| s.status) {
                Some(status) => matches!(status, Status::Delivered | Status::Failed),
                None => positions.get(&partition).is_some_and(|p| p.passed(created_at_ms, &self.key_of(r).unwrap_or(KeyValue::Int(0)))),
            };
            // A replay moves what is finished; a discard what still waits.
            if finished == discard.is_some() {
                continue;
            }
            rows += 1;
            if write {
                let e = Exception {
                    event_id,
                    app_code: D::text(r, 1)?,
                    room_id: D::text(r, 4)?,
                    event_type: D::text(r, 3)?,
                    fence: Fence { partition, epoch: 0 },
                    created_at_ms,
                    status: if discard.is_some() { Status::Failed } else { Status::Pending },
                    // A replay starts the event's count again; a discard keeps it.
                    counted: match discard {
                        Some(_) => state.as_ref().map_or(0, |s| s.retry_count),
                        None => 0,
                    },
                    next_retry_at_ms: 0,
                    last_error: discard.map(|why| crate::text::clip_chars(why, 512).into_owned()),
                    plugin_digest: None,
                };
                // Over whatever it had.
                let sql = format!(
                    "DELETE FROM {}_exceptions WHERE sink = {} AND event_id = {}",
                    self.table,
                    D::param(1),
                    D::param(2)
                );
                sqlx::query(&sql).bind(sink.name.clone()).bind(e.event_id.clone()).execute(&mut *conn).await?;
                self.write_exception(&mut conn, &sink.name, &e, now_ms).await?;
            }
        }
        Ok(super::Step { rows, next })
    }
});

for_every_dialect!(impl {
    /// Makes `sink`, kept so far in its copy of the outbox (`<table>__<sink>`), a consumer:
    /// its positions and exceptions derived from the copy, then the copy dropped. Run with
    /// the sink's hosts stopped (nothing delivers it, nothing fans out); producers may go on
    /// writing. Returns the exceptions written; `None` when the sink has no copy (or another
    /// host converted it meanwhile). Refuses, naming them, while hosts hold live leases on
    /// the copy: they are of an earlier version (this one converts before it delivers), and
    /// would go on writing into a table about to be dropped.
    ///
    /// Every partition's position is the last outbox row created before the earliest of: a
    /// row the copy has not finished (`pending`, `delivering`), a row not fanned out yet, the
    /// sink's start while its back-fill is unfinished, and the settle horizon. So every row
    /// at or before it is finished in the copy, or absent from it (purged once delivered, or
    /// before the sink's start). The copy's `retryable` and `failed` rows, and its
    /// `delivered` rows past the position, become exceptions with their state.
    pub(super) async fn consumer_from_copy(&self, sink: &RegisteredSink, now_ms: i64) -> Result<Option<u64>, StoreError> {
        let copy = &sink.table;
        if sink.is_first(&self.table) {
            return Ok(None);
        }
        if !self.copy_exists(copy).await? {
            return Ok(None);
        }
        let live = self.copy_deliverers(copy, now_ms).await?;
        if !live.is_empty() {
            if !self.copy_exists(copy).await? {
                return Ok(None);
            }
            return Err(StoreError::Query(format!(
                "sink {:?} is still delivered from its copy table {copy} by hosts of an earlier version ({}): \
                 stop them (or wait for their leases to run out), then start this version, which turns the \
                 copy into the sink's positions and exceptions",
                sink.name,
                live.join(", ")
            )));
        }
        match self.convert_copy(sink, now_ms).await {
            // Another host of this version converted the copy meanwhile.
            Err(_) if !self.copy_exists(copy).await? => Ok(None),
            converted => converted,
        }
    }

    /// Whether `copy` (a sink's copy table of an earlier version) is there.
    async fn copy_exists(&self, copy: &str) -> Result<bool, StoreError> {
        let mut conn = self.pool.acquire().await?;
        Ok(self.sink_copy(copy).describe_on(&mut conn).await?.is_some())
    }

    /// The hosts with a live lease on `copy`'s partitions or among its claimers.
    async fn copy_deliverers(&self, copy: &str, now_ms: i64) -> Result<Vec<String>, StoreError> {
        let t = &self.table;
        let mut live = Vec::new();
        for hosts in [format!("{t}_owners"), format!("{t}_claimers")] {
            let sql = format!(
                "SELECT owner FROM {hosts} WHERE sink_table = {} AND lease_until_ms > {} ORDER BY owner",
                D::param(1),
                D::param(2)
            );
            let rows = sqlx::query(&sql).bind(copy.to_string()).bind(now_ms).fetch_all(&self.pool).await?;
            for r in &rows {
                live.push(D::text(r, 0)?);
            }
        }
        Ok(live)
    }

    /// [`Self::consumer_from_copy`] once nothing delivers the copy.
    async fn convert_copy(&self, sink: &RegisteredSink, now_ms: i64) -> Result<Option<u64>, StoreError> {
        let copy = &sink.table;
        let t = &self.table;
        let key = self.profile.key.column();
        let total = match self.partition_total(copy).await? {
            0 => super::partitions::DEFAULT_PARTITIONS,
            made => made,
        };
        let _writing = self.writing().await;
        let mut tx = self.begin_writing().await?;
        let unfinished = format!("SELECT MIN(created_at_ms) FROM {copy} WHERE status IN ('pending', 'delivering')");
        let unfanned = format!(
            "SELECT MIN(created_at_ms) FROM {t} WHERE fanned_out_at_ms = 0 AND created_at_ms >= {}",
            D::param(1)
        );
        let mut before = now_ms - SETTLE_MS;
        if let Some(at) = D::opt_int(&sqlx::query(&unfinished).fetch_one(&mut *tx).await?, 0)? {
            before = before.min(at);
        }
        if let Some(at) = D::opt_int(&sqlx::query(&unfanned).bind(sink.start_from_ms).fetch_one(&mut *tx).await?, 0)? {
            before = before.min(at);
        }
        if sink.backfilled_at_ms.is_none() {
            before = before.min(sink.start_from_ms);
        }
        let last = format!(
            "SELECT created_at_ms, {key} FROM {t} WHERE created_at_ms < {} AND created_at_ms >= {} \
             ORDER BY created_at_ms DESC, {key} DESC LIMIT 1",
            D::param(1),
            D::param(2)
        );
        let position = match sqlx::query(&last).bind(before).bind(sink.start_from_ms).fetch_optional(&mut *tx).await? {
            Some(r) => Some((D::int(&r, 0)?, self.key_of_column(&r, 1)?)),
            None => None,
        };
        let part = D::partition_expr(total).unwrap_or_else(|| "0".to_string());
        let excepted = format!(
            "SELECT event_id, app_code, room_id, event_type, created_at_ms, status, retry_count, next_retry_at_ms, \
             last_error, plugin_digest, {part} FROM {copy} \
             WHERE status IN ('retryable', 'failed') OR (status = 'delivered' AND created_at_ms >= {})",
            D::param(1)
        );
        let rows = sqlx::query(&excepted).bind(before).fetch_all(&mut *tx).await?;
        for r in &rows {
            let (app_code, room_id) = (D::text(r, 1)?, D::text(r, 2)?);
            let partition = if D::PARTITION_HASH.is_some() {
                D::int(r, 10)? as u32
            } else {
                partition_of(&app_code, &room_id, total)
            };
            let e = Exception {
                event_id: D::text(r, 0)?,
                app_code,
                room_id,
                event_type: D::text(r, 3)?,
                fence: Fence { partition, epoch: 0 },
                created_at_ms: D::int(r, 4)?,
                status: Status::parse(&D::text(r, 5)?).unwrap_or(Status::Retryable),
                counted: i32::try_from(D::int(r, 6)?).unwrap_or(i32::MAX),
                next_retry_at_ms: D::int(r, 7)?,
                last_error: D::opt_text(r, 8)?,
                plugin_digest: D::opt_text(r, 9)?.filter(|d| !d.is_empty()),
            };
            // Anew: the copy's state is the whole truth.
            let forget =
                format!("DELETE FROM {t}_exceptions WHERE sink = {} AND event_id = {}", D::param(1), D::param(2));
            sqlx::query(&forget).bind(sink.name.clone()).bind(e.event_id.clone()).execute(&mut *tx).await?;
            self.write_exception(&mut tx, &sink.name, &e, now_ms).await?;
        }
        if let Some(position) = &position {
            self.set_every_position(&mut tx, &sink.name, total, position, now_ms).await?;
        }
        tx.commit().await?;
        let drop_copy = format!("DROP TABLE IF EXISTS {copy}");
        sqlx::query(&drop_copy).execute(&self.pool).await?;
        tracing::info!(sink = %sink.name, copy = %copy, exceptions = rows.len(), position_ms = position.as_ref().map(|p| p.0), "a sink's copy of the outbox became its positions and exceptions");
        Ok(Some(rows.len() as u64))
    }

    /// `sink`'s positions and exceptions, kept in `old` partitions, made those of `new`
    /// (`partitions --set`, every host stopped), in the caller's transaction. Every new
    /// partition starts at the lowest old position, which passes only what was finished in
    /// every old partition; a row past it that its old partition's position passed, with no
    /// exception, is written a `delivered` exception (it is not delivered again); each
    /// exception's partition is computed anew. Returns the `delivered` exceptions written.
    pub(super) async fn renumber_consumer(
        &self,
        tx: &mut <D::Db as Database>::Connection,
        sink: &RegisteredSink,
        (old, new): (u32, u32),
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        let exceptions = format!("{}_exceptions", self.table);
        let all: Vec<u32> = (0..old).collect();
        let positions = self.positions_on(&mut *tx, sink, &all).await?;
        let lowest = positions.values().map(|p| (p.created_at_ms, p.key.clone())).min();
        let highest = positions.values().map(|p| (p.created_at_ms, p.key.clone())).max();
        let (Some(lowest), Some(highest)) = (lowest, highest) else { return Ok(0) };
        let known = self.exceptions_on(&mut *tx, &sink.name, &all, lowest.0).await?;
        let mut written = 0;
        let mut after = lowest.clone();
        while after < highest {
            let rows = self.rows_after(&mut *tx, &Walk::over(old, &all, &after, highest.0, RENUMBER_ROWS)).await?;
            for r in &rows {
                let (created_at_ms, key) = (D::int(r, 6)?, self.sort_key(r)?);
                after = (created_at_ms, key.clone());
                let event_id = D::text(r, 2)?;
                let passed = positions.get(&self.part_of(r, old)?).is_some_and(|p| p.passed(created_at_ms, &key));
                if !passed || known.contains_key(&event_id) {
                    continue;
                }
                // Its partition is computed below, with every other exception's.
                let e = self.exception_of(r, Fence { partition: 0, epoch: 0 }, Status::Delivered)?;
                self.write_exception(&mut *tx, &sink.name, &e, now_ms).await?;
                written += 1;
            }
            if rows.len() < RENUMBER_ROWS as usize {
                break;
            }
        }
        let forget = format!("DELETE FROM {}_positions WHERE sink = {}", self.table, D::param(1));
        sqlx::query(&forget).bind(sink.name.clone()).execute(&mut *tx).await?;
        self.set_every_position(&mut *tx, &sink.name, new, &lowest, now_ms).await?;
        match D::partition_expr(new) {
            Some(expr) => {
                let sql = format!("UPDATE {exceptions} SET part = {expr} WHERE sink = {}", D::param(1));
                sqlx::query(&sql).bind(sink.name.clone()).execute(&mut *tx).await?;
            }
            None => {
                let sql = format!("SELECT event_id, app_code, room_id FROM {exceptions} WHERE sink = {}", D::param(1));
                let update = format!(
                    "UPDATE {exceptions} SET part = {} WHERE sink = {} AND event_id = {}",
                    D::param(1),
                    D::param(2),
                    D::param(3)
                );
                for r in sqlx::query(&sql).bind(sink.name.clone()).fetch_all(&mut *tx).await? {
                    let part = partition_of(&D::text(&r, 1)?, &D::text(&r, 2)?, new);
                    sqlx::query(&update)
                        .bind(i64::from(part))
                        .bind(sink.name.clone())
                        .bind(D::text(&r, 0)?)
                        .execute(&mut *tx)
                        .await?;
                }
            }
        }
        Ok(written)
    }

    /// The event of a row read by [`Self::rows_after`] as an exception in `fence` with
    /// `status`, nothing counted.
    fn exception_of(&self, r: &<D::Db as Database>::Row, fence: Fence, status: Status) -> Result<Exception, sqlx::Error> {
        Ok(Exception {
            event_id: D::text(r, 2)?,
            app_code: D::text(r, 1)?,
            room_id: D::text(r, 4)?,
            event_type: D::text(r, 3)?,
            fence,
            created_at_ms: D::int(r, 6)?,
            status,
            counted: 0,
            next_retry_at_ms: 0,
            last_error: None,
            plugin_digest: None,
        })
    }

    /// Puts each of `sink`'s `total` partitions at `(created_at_ms, key)`.
    async fn set_every_position(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        sink: &str,
        total: u32,
        (created_at_ms, key): &(i64, KeyValue),
        now_ms: i64,
    ) -> Result<(), StoreError> {
        for part in 0..total {
            sqlx::query(&self.consumers.set_position)
                .bind(sink.to_string())
                .bind(i64::from(part))
                .bind(*created_at_ms)
                .bind(key_text(key))
                .bind(now_ms)
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }

    /// The key in column `i` of `row`.
    fn key_of_column(&self, row: &<D::Db as Database>::Row, i: usize) -> Result<KeyValue, sqlx::Error> {
        if self.profile.key.is_text() { D::text(row, i).map(KeyValue::Text) } else { D::int(row, i).map(KeyValue::Int) }
    }
});
