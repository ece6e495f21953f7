//! A sink after the first as the engine and the operator see it (issue 48, decision 0203):
//! a [`Store`] over the outbox read as a consumer, with its positions and exceptions
//! (`consumers.rs`), and its partition leases keyed by its registered table.
//!
//! The owner's memory of what it delivered past its positions lives here: a delivered event
//! costs no write of its own. Each outcome write and each heartbeat settles the positions
//! up to [`SETTLE_MS`] ago; what was delivered later stays in memory, and is not read
//! again. A partition given up (drained surplus, a clean stop) first has what is in memory
//! written as `delivered` exceptions, so that its next owner does not deliver it again; a
//! host killed loses its memory, and the next owner delivers those events again (at least
//! once).
//!
//! The sink's deliveries leave no time behind: [`Inspection::history`] shows its failures
//! only, and `delivered_last_minute` is 0.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;

use super::consumers::{Exception, Finished, Judged, Position, SETTLE_MS, SKIP_SLOTS, Settle, Settled};
use super::schema::TableInfo;
use super::search::{Cursor, Found, MAX_PAGE, SCAN_ROWS, Search};
use super::sql::{Dialect, SqlStore, for_every_dialect};
use super::{
    Backend, Claimed, Claims, Consumers, Fence, Heartbeat, Held, Holding, Inspection, KeyValue, Mark, Migrated, Minute,
    NewEvent, OwnedRead, OwnerView, Page, Partitions, Producer, RegisteredSink, ReplayFilter, RetryFilter, Row, Schema,
    SinkRegistry, Stats, Status, Step, Store, StoreError,
};

/// Rows one settle walks at most: it holds `settling`, which the owner's page reads and
/// outcome writes wait for.
const SETTLE_ROWS: u32 = 5_000;
/// Rows a settle that catches up walks at most, and how many such settles a heartbeat runs
/// one after another while each walk stops at its limit (see [`ConsumerStore::catch_up`]).
/// Each writes every position it moved, so fewer and longer walks write fewer rows.
const CATCH_UP_ROWS: u32 = 20_000;
const CATCH_UP_SETTLES: u32 = 4;

/// How long a row this owner read and has not finished holds its partition's position
/// (see [`Settle::in_hand`]): a settle time, the backlog a position stays behind anyway.
const IN_HAND: std::time::Duration = std::time::Duration::from_millis(SETTLE_MS as u64);
/// How often at most a batch of deliveries alone settles (a batch with a failure settles at
/// once: its exception is written there). Each settle is a fenced write that walks rows from
/// the positions; on every batch it cost four sinks a third of their speed (performance.md).
const SETTLE_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// What the owner keeps of an event it read, to write its exception or settle it.
#[derive(Debug, Clone)]
struct Meta {
    fence: Fence,
    created_at_ms: i64,
    key: KeyValue,
    /// It had an exception when read (`pending` or `retryable`): its delivery must be
    /// written, since the exception would bring it back.
    excepted: bool,
    app_code: String,
    room_id: String,
    event_type: String,
    /// When this owner first read it (read again, it keeps this).
    read_at: std::time::Instant,
}

impl Meta {
    fn exception(&self, event_id: &str, status: Status) -> Exception {
        Exception {
            event_id: event_id.to_string(),
            app_code: self.app_code.clone(),
            room_id: self.room_id.clone(),
            event_type: self.event_type.clone(),
            fence: self.fence,
            created_at_ms: self.created_at_ms,
            status,
            counted: 0,
            next_retry_at_ms: 0,
            last_error: None,
            plugin_digest: None,
        }
    }
}

/// The owner's memory.
#[derive(Default)]
struct Memory {
    /// Read and handed out, not yet finished.
    read: HashMap<String, Meta>,
    /// Delivered past the positions.
    finished: HashMap<String, Meta>,
    /// The keys of `finished`, where rows are keyed by number, as runs of consecutive keys.
    finished_keys: Runs,
    /// The fences of what `read` and `finished` hold (a superset after a removal).
    fences: HashSet<Fence>,
    /// The partitions held at the last heartbeat.
    holding: Vec<Fence>,
    /// `P`.
    total: u32,
    /// The newest key read (keys given in insert order), for the idle probe.
    newest_read: i64,
    /// The held partitions' positions, as this owner's last settle left them.
    positions: HashMap<u32, Position>,
    /// When a settle last wrote.
    settled_at: Option<std::time::Instant>,
}

impl Memory {
    /// Forgets what it read and delivered of partitions not in `held`: their next owner
    /// reads them.
    fn keep_only(&mut self, held: &[Fence]) {
        self.positions.retain(|part, _| held.iter().any(|f| f.partition == *part));
        if self.fences.iter().all(|f| held.contains(f)) {
            // Nothing of a partition given up: no walk over everything remembered.
            return;
        }
        self.read.retain(|_, m| held.contains(&m.fence));
        self.retain_finished(|m| held.contains(&m.fence));
        self.fences.retain(|f| held.contains(f));
    }

    fn remember_read(&mut self, event_id: String, mut meta: Meta) {
        self.fences.insert(meta.fence);
        if let Some(earlier) = self.read.get(&event_id) {
            meta.read_at = earlier.read_at;
        }
        self.read.insert(event_id, meta);
    }

    fn finish(&mut self, event_id: String, meta: Meta) {
        if let KeyValue::Int(key) = meta.key {
            self.finished_keys.insert(key);
        }
        self.fences.insert(meta.fence);
        self.finished.insert(event_id, meta);
    }

    fn unfinish(&mut self, event_id: &str) {
        if let Some(Meta { key: KeyValue::Int(key), .. }) = self.finished.remove(event_id) {
            self.finished_keys.remove(key);
        }
    }

    fn retain_finished(&mut self, keep: impl Fn(&Meta) -> bool) {
        let keys = &mut self.finished_keys;
        self.finished.retain(|_, m| {
            let kept = keep(m);
            if let (false, KeyValue::Int(key)) = (kept, &m.key) {
                keys.remove(*key);
            }
            kept
        });
    }

    /// The longest runs of consecutive keys delivered past the positions (at most
    /// [`SKIP_SLOTS`]), each as its first and last key: a page read leaves them out. Until
    /// a settle passes them (a settle time behind), they lie between the positions and the
    /// rows still to deliver, and every sweep would read them again only to drop them. Only
    /// rows in `finished` are in a run, so no row is left out that the read would keep: a
    /// row committed late among them has a key of its own, which ends a run.
    fn finished_runs(&self) -> Vec<(i64, i64)> {
        let mut runs: Vec<(i64, i64)> = self.finished_keys.runs().filter(|(first, last)| last > first).collect();
        if runs.len() > SKIP_SLOTS {
            runs.select_nth_unstable_by_key(SKIP_SLOTS - 1, |(first, last)| std::cmp::Reverse(last - first));
            runs.truncate(SKIP_SLOTS);
        }
        runs
    }
}

/// A set of keys kept as its runs of consecutive keys, first key to last: every page read
/// asks for the runs, so they are kept as keys come and go rather than found again by a
/// walk over every key (a settle time of deliveries).
#[derive(Default)]
struct Runs(BTreeMap<i64, i64>);

impl Runs {
    /// The run holding `key`, as its first and last key.
    fn around(&self, key: i64) -> Option<(i64, i64)> {
        self.0.range(..=key).next_back().map(|(&first, &last)| (first, last)).filter(|&(_, last)| last >= key)
    }

    fn insert(&mut self, key: i64) {
        if self.around(key).is_some() {
            return;
        }
        let last = key.checked_add(1).and_then(|next| self.0.remove(&next)).unwrap_or(key);
        let first = match self.0.range(..key).next_back() {
            Some((&first, &end)) if end.checked_add(1) == Some(key) => first,
            _ => key,
        };
        self.0.insert(first, last);
    }

    fn remove(&mut self, key: i64) {
        let Some((first, last)) = self.around(key) else { return };
        self.0.remove(&first);
        if first < key {
            self.0.insert(first, key - 1);
        }
        if key < last {
            self.0.insert(key + 1, last);
        }
    }

    fn runs(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.0.iter().map(|(&first, &last)| (first, last))
    }

    #[cfg(test)]
    fn keys(&self) -> Vec<i64> {
        self.runs().flat_map(|(first, last)| first..=last).collect()
    }
}

/// A sink after the first on the outbox of dialect `D`.
pub struct ConsumerStore<D: Dialect> {
    outbox: Arc<SqlStore<D>>,
    /// The sink's partition leases and hosts (keyed by its registered table).
    leases: SqlStore<D>,
    sink: RegisteredSink,
    memory: Mutex<Memory>,
    /// Held through each settle and what decides it: settles run one at a time (a position
    /// never moves back), and an outcome is judged against the positions it will meet; and
    /// through each page read, which sees one settle's positions, exceptions and memory.
    settling: tokio::sync::Mutex<()>,
}

/// [`for_every_dialect`] on [`ConsumerStore`], whose outbox is a whole [`Store`].
macro_rules! for_consumers {
    ($($item:tt)*) => {
        for_every_dialect!(on ConsumerStore [SqlStore<D>: Store,]; $($item)*);
    };
}

for_consumers!(impl {
    /// `sink` (not the first) as a consumer of `outbox`.
    pub(super) fn new(outbox: Arc<SqlStore<D>>, sink: &RegisteredSink) -> Self {
        let leases = outbox.sink_copy(&sink.table);
        ConsumerStore {
            outbox,
            leases,
            sink: sink.clone(),
            memory: Mutex::default(),
            settling: tokio::sync::Mutex::new(()),
        }
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Settles the held partitions as `owner` at `now_ms` (the database's clock), walking
    /// `limit` rows at most, writing `exceptions` first; `flush`: partitions about to be
    /// given up, whose delivered events in memory are written as exceptions. Forgets what
    /// the settle passed, and what it found of partitions no longer held. The caller holds
    /// `settling`.
    async fn settle_held(
        &self,
        owner: &str,
        now_ms: i64,
        mut exceptions: Vec<Exception>,
        flush: &[u32],
        limit: u32,
    ) -> Result<Settled, StoreError> {
        let (mut fences, total) = {
            let memory = self.memory();
            for (event_id, meta) in memory.finished.iter().filter(|(_, m)| flush.contains(&m.fence.partition)) {
                exceptions.push(meta.exception(event_id, Status::Delivered));
            }
            (memory.holding.clone(), memory.total)
        };
        for e in &exceptions {
            if !fences.contains(&e.fence) {
                fences.push(e.fence);
            }
        }
        let idle = exceptions.is_empty() && self.memory().finished.is_empty();
        if fences.is_empty() || total == 0 || idle {
            // Nothing delivered, nothing to write: the positions stay (a paused sink walks
            // nothing).
            return Ok(Settled::default());
        }
        let finished = |event_id: &str| self.memory().finished.contains_key(event_id);
        let in_hand = |event_id: &str| self.memory().read.get(event_id).is_some_and(|m| m.read_at.elapsed() < IN_HAND);
        let settle = Settle {
            sink: &self.sink,
            owner,
            total,
            fences: &fences,
            horizon_ms: now_ms - SETTLE_MS,
            finished: &finished as &Finished<'_>,
            in_hand: &in_hand as &Finished<'_>,
            exceptions: &exceptions,
            now_ms,
            limit,
        };
        let settled = self.outbox.settle_positions(&settle).await?;
        let mut memory = self.memory();
        memory.settled_at = Some(std::time::Instant::now());
        for event_id in &settled.passed {
            memory.unfinish(event_id);
        }
        for position in &settled.positions {
            memory.positions.insert(position.part, position.clone());
        }
        memory.retain_finished(|m| !flush.contains(&m.fence.partition));
        memory.keep_only(&settled.held.iter().copied().filter(|f| !flush.contains(&f.partition)).collect::<Vec<_>>());
        Ok(settled)
    }

    /// [`Partitions::keep_partitions`]'s settle and beat, under `settling`: what it holds
    /// afterwards, and whether the settle's walk stopped at its limit.
    async fn beat(&self, beat: &Heartbeat<'_>) -> Result<(Holding, bool), StoreError> {
        let _settling = self.settling.lock().await;
        let held: Vec<u32> = self.memory().holding.iter().map(|f| f.partition).collect();
        let mut release: Vec<u32> =
            held.into_iter().filter(|p| !beat.renew.contains(p)).chain(beat.release.iter().copied()).collect();
        release.sort_unstable();
        release.dedup();
        let settled = match self.settle_held(beat.owner, beat.now_ms, Vec::new(), &release, SETTLE_ROWS).await {
            Ok(settled) => settled,
            Err(e) => {
                let kept: Vec<u32> = beat.renew.iter().chain(&release).copied().collect();
                let renewal = self.leases.renew(&Heartbeat { renew: &kept, release: &[], ..beat.clone() }).await;
                if let Err(renewal) = renewal {
                    tracing::debug!(error = %renewal, "could not renew partition leases after a failed settle");
                }
                return Err(e);
            }
        };
        let holding = self.leases.heartbeat(&Heartbeat { release: &release, ..beat.clone() }).await?;
        let mut memory = self.memory();
        memory.holding = holding.owned.clone();
        memory.total = holding.total;
        memory.keep_only(&holding.owned);
        Ok((holding, settled.more))
    }

    /// Settles again, one settle at a time (page reads and outcome writes in between), while
    /// each walk stops at its limit, at most [`CATCH_UP_SETTLES`] times of [`CATCH_UP_ROWS`]
    /// rows. Past a backlog, the positions pass what the owner delivered as soon as it is a
    /// settle time old, instead of [`SETTLE_ROWS`] rows a heartbeat: the benchmark's 30,000
    /// events took six heartbeats (20 s) more, their leases renewed throughout and all of
    /// them held in memory. A settle that fails here loses nothing: the next heartbeat
    /// settles, and says so.
    async fn catch_up(&self, owner: &str, now_ms: i64) {
        for _ in 0..CATCH_UP_SETTLES {
            let _settling = self.settling.lock().await;
            match self.settle_held(owner, now_ms, Vec::new(), &[], CATCH_UP_ROWS).await {
                Ok(settled) if settled.more => {}
                Ok(_) => return,
                Err(e) => {
                    tracing::debug!(sink = %self.sink.name, error = %e, "a settle catching up failed; the next heartbeat settles");
                    return;
                }
            }
        }
    }

    /// The partition count, from memory or the partition table.
    async fn total(&self) -> Result<u32, StoreError> {
        let known = self.memory().total;
        if known > 0 {
            return Ok(known);
        }
        self.outbox.partition_total(&self.sink.table).await
    }

    /// The row as this sink sees it: the outbox's row with the sink's state (`None`: created
    /// before its start).
    async fn row_for_sink(&self, row: Row) -> Result<Option<Row>, StoreError> {
        Ok(self.rows_for_sink(vec![row]).await?.pop().flatten())
    }

    /// [`Self::row_for_sink`] of every row, in a few statements whatever their number.
    async fn rows_for_sink(&self, rows: Vec<Row>) -> Result<Vec<Option<Row>>, StoreError> {
        let start = self.sink.start_from_ms;
        let ids: Vec<String> = rows.iter().filter(|r| r.created_at_ms >= start).map(|r| r.event_id.clone()).collect();
        let total = self.total().await?.max(1);
        let mut judged = self.outbox.judged(&self.sink, total, &ids.iter().collect::<Vec<_>>()).await?;
        let for_sink = |mut row: Row| {
            if row.created_at_ms < start {
                return None;
            }
            row.worker_id = None;
            row.lock_until_ms = 0;
            match judged.remove(&row.event_id) {
                Some(Judged::Excepted(state)) => {
                    row.status = state.status;
                    row.retry_count = state.retry_count;
                    row.next_retry_at_ms = state.next_retry_at_ms;
                    row.last_error = state.last_error;
                    row.updated_at_ms = state.updated_at_ms;
                    row.plugin_digest = state.plugin_digest;
                    row.delivered_at_ms = (state.status == Status::Delivered).then_some(state.updated_at_ms);
                }
                passed => {
                    let passed = matches!(passed, Some(Judged::Passed(true)));
                    row.status = if passed { Status::Delivered } else { Status::Pending };
                    row.retry_count = 0;
                    row.next_retry_at_ms = 0;
                    row.last_error = None;
                    row.plugin_digest = None;
                    row.delivered_at_ms = None;
                }
            }
            Some(row)
        };
        Ok(rows.into_iter().map(for_sink).collect())
    }

    /// A search of this sink's events (see `search.rs`).
    async fn search_for_sink(&self, search: &Search) -> Result<Found, StoreError> {
        let limit = search.limit.clamp(1, MAX_PAGE);
        let wanted = |row: &Row| search.statuses.is_empty() || search.statuses.contains(&row.status);
        let excepted_only =
            !search.statuses.is_empty() && search.statuses.iter().all(|s| matches!(s, Status::Retryable | Status::Failed));
        if excepted_only {
            let mut found =
                self.outbox.search_exceptions(&self.sink.name, search, search.cursor.as_ref(), limit + 1).await?;
            let more = found.len() > limit as usize;
            found.truncate(limit as usize);
            let next = more
                .then(|| found.last().map(|(id, at)| Cursor { created_at_ms: *at, key: KeyValue::Text(id.clone()) }))
                .flatten();
            let mut rows = Vec::with_capacity(found.len());
            for (event_id, _) in &found {
                // Its state may have moved since: shown only while it still matches.
                if let Some(row) = self.get(event_id).await?.filter(wanted) {
                    rows.push(row);
                }
            }
            return Ok(Found { scanned: found.len() as u64, rows, next });
        }
        let mut found = Found::default();
        let mut cursor = search.cursor.clone();
        loop {
            let batch = (limit * 2).clamp(100, 500).min(SCAN_ROWS - found.scanned as u32);
            let rows = self.outbox.search_rows(search, false, cursor.as_ref(), batch).await?;
            let exhausted = rows.len() < batch as usize;
            found.scanned += rows.len() as u64;
            let cursors: Vec<Cursor> = rows.iter().map(|r| self.outbox.cursor_of(r)).collect();
            for (row, at) in self.rows_for_sink(rows).await?.into_iter().zip(cursors) {
                cursor = Some(at);
                if let Some(row) = row.filter(wanted) {
                    found.rows.push(row);
                    if found.rows.len() == limit as usize {
                        found.next = cursor;
                        return Ok(found);
                    }
                }
            }
            if exhausted {
                return Ok(found);
            }
            if found.scanned >= u64::from(SCAN_ROWS) {
                found.next = cursor;
                return Ok(found);
            }
        }
    }
});

for_consumers!(
    #[async_trait]
    impl Schema {
        async fn migrate(&self) -> Result<Migrated, StoreError> {
            self.outbox.migrate().await
        }

        fn backend(&self) -> Backend {
            D::BACKEND
        }

        async fn describe(&self) -> Result<Option<TableInfo>, StoreError> {
            self.outbox.describe().await
        }

        fn table(&self) -> &str {
            Schema::table(self.outbox.as_ref())
        }

        async fn ping(&self) -> Result<(), StoreError> {
            self.outbox.ping().await
        }

        async fn clock_ms(&self) -> Result<i64, StoreError> {
            self.outbox.clock_ms().await
        }

        async fn close(&self) {
            self.outbox.close().await
        }
    }
);

/// Why a sink after the first takes no row claims.
const NO_CLAIMS: &str = "a sink after the first is read by partition owners and takes no row claims";

for_consumers!(
    #[async_trait]
    impl Claims {
        async fn claim(&self, _: &str, _: i64, _: i64, _: u32) -> Result<Vec<Claimed>, StoreError> {
            Err(StoreError::Query(NO_CLAIMS.into()))
        }

        async fn mark(&self, _: &[Mark], _: i64) -> Result<u64, StoreError> {
            Err(StoreError::Query(NO_CLAIMS.into()))
        }

        /// Nothing is claimed, so nothing is handed back.
        async fn release(&self, _: &[Held], _: i64) -> Result<u64, StoreError> {
            Ok(0)
        }

        /// Whether a row was inserted past the newest this owner read (keys given in insert
        /// order); where rows are keyed by event id, never (the poll finds them).
        async fn has_pending(&self) -> Result<bool, StoreError> {
            let newest_read = self.memory().newest_read;
            Ok(self.outbox.newest().await?.is_some_and(|newest| newest > newest_read))
        }

        fn is_consumer(&self) -> bool {
            true
        }

        fn inserted(&self) -> Arc<tokio::sync::Notify> {
            self.outbox.inserted()
        }

        fn listen_for_inserts(
            &self,
            wake: Arc<tokio::sync::Notify>,
            stop: tokio_util::sync::CancellationToken,
        ) -> bool {
            self.outbox.listen_for_inserts(wake, stop)
        }
    }
);

for_consumers!(
    #[async_trait]
    impl Producer {
        async fn insert(&self, events: &[NewEvent]) -> Result<(), StoreError> {
            self.outbox.insert(events).await
        }
    }
);

for_consumers!(
    #[async_trait]
    impl Inspection {
        async fn get(&self, event_id: &str) -> Result<Option<Row>, StoreError> {
            match self.outbox.get(event_id).await? {
                Some(row) => self.row_for_sink(row).await,
                None => Ok(None),
            }
        }

        async fn stats(&self) -> Result<Stats, StoreError> {
            let total = self.total().await?;
            let counts = self.outbox.consumer_counts(&self.sink, total).await?;
            let excepted = |status: Status| counts.excepted.iter().find(|(s, _)| *s == status).map_or(0, |(_, n)| *n);
            let pending = counts.waiting + excepted(Status::Pending);
            let (retryable, failed) = (excepted(Status::Retryable), excepted(Status::Failed));
            let delivered = (counts.rows - pending - retryable - failed).max(0);
            Ok(Stats {
                counts: vec![
                    (Status::Pending, pending),
                    (Status::Delivering, 0),
                    (Status::Delivered, delivered),
                    (Status::Retryable, retryable),
                    (Status::Failed, failed),
                ],
                oldest_waiting_created_at_ms: counts.oldest_waiting_created_at_ms,
                top_errors: counts.top_errors,
                delivered_last_minute: 0,
                unknown_statuses: Vec::new(),
            })
        }

        async fn history(&self, since_ms: i64) -> Result<Vec<Minute>, StoreError> {
            let minutes = self.outbox.failed_exception_minutes(&self.sink.name, since_ms).await?;
            Ok(minutes.into_iter().map(|(start_ms, failed)| Minute { start_ms, delivered: 0, failed }).collect())
        }

        async fn recent_failures(&self, limit: u32) -> Result<Vec<Row>, StoreError> {
            let mut rows = Vec::new();
            for (event_id, _) in self.outbox.recent_exceptions(&self.sink.name, limit).await? {
                if let Some(row) = self.get(&event_id).await? {
                    rows.push(row);
                }
            }
            Ok(rows)
        }

        async fn neighbours(&self, row: &Row) -> Result<[Option<Row>; 2], StoreError> {
            let [before, after] = self.outbox.neighbours(row).await?;
            let mine = |found: Option<Row>| async move {
                match found {
                    Some(row) => self.row_for_sink(row).await,
                    None => Ok(None),
                }
            };
            Ok([mine(before).await?, mine(after).await?])
        }

        async fn search(&self, search: &Search) -> Result<Found, StoreError> {
            self.search_for_sink(search).await
        }

        async fn count_failed(&self, filter: &RetryFilter) -> Result<i64, StoreError> {
            self.outbox.count_failed_exceptions(&self.sink.name, filter).await
        }

        async fn retry_failed(&self, filter: &RetryFilter, now_ms: i64) -> Result<u64, StoreError> {
            self.outbox.retry_failed_exceptions(&self.sink.name, filter, now_ms).await
        }

        /// The outbox's rows are the first sink's to purge.
        async fn purge_delivered(&self, _: i64, _: u32) -> Result<u64, StoreError> {
            Ok(0)
        }
    }
);

for_consumers!(
    #[async_trait]
    impl SinkRegistry {
        async fn sinks(&self) -> Result<Vec<RegisteredSink>, StoreError> {
            self.outbox.sinks().await
        }

        async fn register_sink(
            &self,
            name: &str,
            start_from_ms: i64,
            may_be_first: bool,
            now_ms: i64,
        ) -> Result<RegisteredSink, StoreError> {
            self.outbox.register_sink(name, start_from_ms, may_be_first, now_ms).await
        }

        async fn sink_store(self: Arc<Self>, sink: &RegisteredSink) -> Result<Arc<dyn Store>, StoreError> {
            self.outbox.clone().sink_store(sink).await
        }

        async fn count_replayable(&self, filter: &ReplayFilter) -> Result<i64, StoreError> {
            let total = self.total().await?;
            let mut after = None;
            let mut count = 0;
            loop {
                let step =
                    self.outbox.consumer_replay_step(&self.sink, total, filter, (0, false), after, 1_000).await?;
                count += step.rows as i64;
                match step.next {
                    Some(next) => after = Some(next),
                    None => return Ok(count),
                }
            }
        }

        async fn replay(
            &self,
            filter: &ReplayFilter,
            now_ms: i64,
            after: Option<KeyValue>,
            limit: u32,
        ) -> Result<Step, StoreError> {
            let total = self.total().await?;
            self.outbox.consumer_replay_step(&self.sink, total, filter, (now_ms, true), after, limit).await
        }

        async fn discard(
            &self,
            filter: &ReplayFilter,
            reason: &str,
            now_ms: i64,
            after: Option<KeyValue>,
            limit: u32,
        ) -> Result<Step, StoreError> {
            let total = self.total().await?;
            self.outbox.consumer_discard_step(&self.sink, total, filter, (reason, now_ms), after, limit).await
        }
    }
);

for_consumers!(
    #[async_trait]
    impl Partitions {
        /// Settles first (a partition given up has its memory written), then beats.
        ///
        /// Given up is every partition held at the last heartbeat that the owner no longer
        /// renews: those it releases now, and those whose release an earlier heartbeat did
        /// not get to (a settle or a statement that failed). Their memory is written before
        /// any of them is released, and kept until it is.
        ///
        /// A settle that fails (SQLite busy, a statement cut) still leaves every lease renewed,
        /// those to be given up with them, and the heartbeat fails: a lease run out while
        /// settles failed would hand the partition, and the events delivered there that only
        /// memory holds, to another host, to be delivered again.
        ///
        /// A settle whose walk stopped at its limit is followed at once by more
        /// ([`ConsumerStore::catch_up`]).
        async fn keep_partitions(&self, beat: &Heartbeat<'_>) -> Result<Holding, StoreError> {
            let (holding, more) = self.beat(beat).await?;
            if more {
                self.catch_up(beat.owner, beat.now_ms).await;
            }
            Ok(holding)
        }

        /// Under `settling`: a settle of this owner committing while the page is read would
        /// leave its positions, exceptions and the memory of what was finished read from
        /// either side of it. A row it passed as a hole (read as waiting before, passed by
        /// its position after) would leave the page while its room's later rows stayed, and
        /// be handed out after them (the kill storm found rooms out of order that way); a
        /// `delivered` exception it forgot would come back as waiting.
        async fn read_owned(&self, read: &OwnedRead<'_>) -> Result<Page, StoreError> {
            let _settling = self.settling.lock().await;
            let finished = |event_id: &str| self.memory().finished.contains_key(event_id);
            let skip = self.memory().finished_runs();
            let (page, excepted) = self.outbox.consumer_page(&self.sink, read, &finished, &skip).await?;
            let mut memory = self.memory();
            for w in &page.waiting {
                let Some(fence) = w.row.lease.fence else { continue };
                let meta = Meta {
                    fence,
                    created_at_ms: w.row.created_at_ms,
                    key: w.key.clone(),
                    excepted: excepted.contains(&w.row.event_id),
                    app_code: w.row.app_code.clone(),
                    room_id: w.row.room_id.clone(),
                    event_type: w.row.event_type.clone(),
                    read_at: std::time::Instant::now(),
                };
                memory.remember_read(w.row.event_id.clone(), meta);
                if let KeyValue::Int(key) = w.key {
                    memory.newest_read = memory.newest_read.max(key);
                }
            }
            if let Some((_, KeyValue::Int(key))) = &page.last {
                memory.newest_read = memory.newest_read.max(*key);
            }
            Ok(page)
        }

        async fn newest_key(&self) -> Result<Option<i64>, StoreError> {
            self.outbox.newest().await
        }

        /// A consumer reads the outbox by creation time: the partition index of unfinished
        /// rows (the first sink's) is not its.
        async fn index_partitions(&self, _: u32) -> Result<bool, StoreError> {
            Ok(false)
        }

        async fn failed_rooms(&self, rooms: &[(String, String)]) -> Result<Vec<(String, String, i64)>, StoreError> {
            self.outbox.failed_exception_rooms(&self.sink.name, rooms).await
        }

        /// Delivered events go to memory; the others are written as exceptions, in the
        /// settle that follows. A mark of a partition lost (or of a row this store did not
        /// hand out under its fence) is not written. A write that fails leaves memory as it
        /// was, so that the same marks may be written again.
        async fn mark_owned(&self, owner: &str, marks: &[Mark], now_ms: i64) -> Result<(u64, Vec<usize>), StoreError> {
            let _settling = self.settling.lock().await;
            let mut exceptions = Vec::new();
            let mut fenced = Vec::new();
            let mut written: Vec<(usize, Fence)> = Vec::new();
            let mut delivered: Vec<String> = Vec::new();
            {
                let mut memory = self.memory();
                for (i, m) in marks.iter().enumerate() {
                    let meta = match memory.read.get(&m.event_id) {
                        Some(meta) if Some(meta.fence) == m.lease.fence => meta.clone(),
                        _ => {
                            fenced.push(i);
                            continue;
                        }
                    };
                    written.push((i, meta.fence));
                    // Behind the position (passed as a hole while under way) or with an
                    // exception: only a written `delivered` keeps it from coming back.
                    let behind = memory
                        .positions
                        .get(&meta.fence.partition)
                        .is_some_and(|p| p.passed(meta.created_at_ms, &meta.key));
                    match &m.outcome {
                        super::Outcome::Delivered if meta.excepted || behind => {
                            exceptions.push(Exception {
                                plugin_digest: m.plugin_digest.as_deref().map(str::to_string),
                                ..meta.exception(&m.event_id, Status::Delivered)
                            });
                        }
                        super::Outcome::Delivered => {
                            delivered.push(m.event_id.clone());
                            memory.finish(m.event_id.clone(), meta);
                        }
                        outcome => exceptions.push(Exception {
                            counted: outcome.counted(),
                            next_retry_at_ms: outcome.next_retry_at_ms(),
                            last_error: outcome.error().map(str::to_string),
                            plugin_digest: m.plugin_digest.as_deref().map(str::to_string),
                            ..meta.exception(&m.event_id, outcome.status())
                        }),
                    }
                }
            }
            // Deliveries alone are remembered until a settle at most `SETTLE_EVERY` away (or
            // the heartbeat's): judged against the same positions, held by the same fences.
            let recent = self.memory().settled_at.is_some_and(|at| at.elapsed() < SETTLE_EVERY);
            let held = if exceptions.is_empty() && recent {
                self.memory().holding.clone()
            } else {
                match self.settle_held(owner, now_ms, exceptions, &[], SETTLE_ROWS).await {
                    Ok(settled) => settled.held,
                    Err(e) => {
                        let mut memory = self.memory();
                        for event_id in &delivered {
                            memory.unfinish(event_id);
                        }
                        return Err(e);
                    }
                }
            };
            let mut memory = self.memory();
            let mut changed = 0;
            for (i, fence) in written {
                memory.read.remove(&marks[i].event_id);
                if held.contains(&fence) {
                    changed += 1;
                } else {
                    fenced.push(i);
                }
            }
            fenced.sort_unstable();
            Ok((changed, fenced))
        }

        /// Writes what is in memory (the next owners deliver none of it again), then gives
        /// every partition up.
        async fn leave_partitions(&self, owner: &str) -> Result<(), StoreError> {
            let _settling = self.settling.lock().await;
            let held: Vec<u32> = self.memory().holding.iter().map(|f| f.partition).collect();
            let now_ms = self.outbox.clock_ms().await?;
            self.settle_held(owner, now_ms, Vec::new(), &held, SETTLE_ROWS).await?;
            self.leases.leave(owner).await
        }

        async fn announce(
            &self,
            owner: &str,
            ordering: &str,
            now_ms: i64,
            until_ms: i64,
        ) -> Result<Vec<(String, String)>, StoreError> {
            self.leases.announce_ordering(owner, ordering, now_ms, until_ms).await
        }

        async fn partition_owners(&self, now_ms: i64) -> Result<Vec<OwnerView>, StoreError> {
            self.leases.owners(now_ms).await
        }

        /// The leases' count, and the positions and exceptions renumbered for it, in one
        /// transaction.
        async fn set_partitions(&self, total: u32, now_ms: i64) -> Result<Result<u32, Vec<String>>, StoreError> {
            let _writing = self.outbox.writing().await;
            let mut tx = self.outbox.begin_writing().await?;
            let set = self.leases.set_partition_count_on(&mut tx, total, now_ms).await?;
            if let Ok(old) = set
                && old > 0
                && old != total
            {
                let written = self.outbox.renumber_consumer(&mut tx, &self.sink, (old, total), now_ms).await?;
                tracing::info!(sink = %self.sink.name, from = old, to = total, delivered_exceptions = written, "renumbered a consumer's positions and exceptions");
            }
            tx.commit().await?;
            self.memory().total = 0;
            Ok(set)
        }
    }
);

for_consumers!(
    #[async_trait]
    impl Consumers {
        async fn positions(&self, sink: &RegisteredSink, parts: &[u32]) -> Result<Vec<Position>, StoreError> {
            self.outbox.positions_of(sink, parts).await
        }

        async fn read_consumer(
            &self,
            sink: &RegisteredSink,
            read: &OwnedRead<'_>,
            finished: &Finished<'_>,
        ) -> Result<Page, StoreError> {
            Ok(self.outbox.consumer_page(sink, read, finished, &[]).await?.0)
        }

        async fn settle(&self, settle: &Settle<'_>) -> Result<Settled, StoreError> {
            self.outbox.settle_positions(settle).await
        }

        async fn consumer_from_copy(&self, sink: &RegisteredSink, now_ms: i64) -> Result<Option<u64>, StoreError> {
            self.outbox.consumer_from_copy(sink, now_ms).await
        }
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(partition: u32, key: i64) -> Meta {
        Meta {
            fence: Fence { partition, epoch: 1 },
            created_at_ms: key,
            key: KeyValue::Int(key),
            excepted: false,
            app_code: "app".into(),
            room_id: format!("room{key}"),
            event_type: "RoomGiftSent".into(),
            read_at: std::time::Instant::now(),
        }
    }

    fn finished(keys: impl IntoIterator<Item = i64>) -> Memory {
        let mut memory = Memory::default();
        for key in keys {
            memory.finish(format!("evt-{key}"), meta((key % 2) as u32, key));
        }
        memory
    }

    #[test]
    fn a_key_not_delivered_ends_a_run_of_finished_keys() {
        // 7 was never delivered (a row committed late, or still under way): no run covers it.
        let memory = finished((1..=6).chain(8..=20));
        assert_eq!(memory.finished_runs(), vec![(1, 6), (8, 20)]);
        // A single key is no run worth a range.
        assert_eq!(finished([3, 5, 9]).finished_runs(), Vec::<(i64, i64)>::new());
    }

    #[test]
    fn only_the_longest_runs_are_left_out() {
        // 40 runs of growing length, each ended by a missing key.
        let mut keys = Vec::new();
        let mut next = 0;
        for length in 2..42 {
            keys.extend(next..next + length);
            next += length + 1;
        }
        let mut runs = finished(keys).finished_runs();
        runs.sort_unstable();
        assert_eq!(runs.len(), SKIP_SLOTS);
        let lengths: Vec<i64> = runs.iter().map(|(first, last)| last - first + 1).collect();
        assert_eq!(lengths, (26..42).collect::<Vec<_>>());
    }

    #[test]
    fn runs_kept_as_keys_come_and_go_are_the_runs_of_the_keys() {
        // Keys delivered and forgotten in a scrambled order (a fixed sequence, the same on
        // every run) against the runs found by a walk over the same keys as a plain set.
        let (mut runs, mut keys) = (Runs::default(), std::collections::BTreeSet::new());
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for step in 0..20_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let key = ((x >> 33) % 300) as i64;
            if step % 3 == 2 {
                runs.remove(key);
                keys.remove(&key);
            } else {
                runs.insert(key);
                keys.insert(key);
            }
            if step % 97 == 0 {
                let mut walked: Vec<(i64, i64)> = Vec::new();
                for &k in &keys {
                    match walked.last_mut() {
                        Some((_, last)) if *last + 1 == k => *last = k,
                        _ => walked.push((k, k)),
                    }
                }
                assert_eq!(runs.runs().collect::<Vec<_>>(), walked, "after step {step}");
            }
        }
        assert!(!keys.is_empty() && runs.keys() == keys.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn what_leaves_memory_leaves_the_runs() {
        let mut memory = finished(1..=10);
        memory.unfinish("evt-5");
        assert_eq!(memory.finished_runs(), vec![(1, 4), (6, 10)]);
        // Partition 1 (the odd keys) given up: its events are forgotten, and no run is left.
        memory.keep_only(&[Fence { partition: 0, epoch: 1 }]);
        assert!(memory.finished.values().all(|m| m.fence.partition == 0));
        assert_eq!(memory.finished_keys.keys(), vec![2, 4, 6, 8, 10]);
        assert_eq!(memory.finished_runs(), Vec::<(i64, i64)>::new());
        // Every partition still held: nothing is dropped.
        let before = memory.finished.len();
        memory.keep_only(&[Fence { partition: 0, epoch: 1 }]);
        assert_eq!(memory.finished.len(), before);
    }
}
