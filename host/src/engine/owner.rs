//! Per-room order by partition ownership: the host that leases a partition is the only one
//! that delivers its rooms, so it reads their rows without claiming them and keeps each
//! room's order in memory.
//!
//! The owner reads its partitions' unfinished rows in `(created_at_ms, key)` order, in
//! sweeps: a sweep starts at the oldest row and pages on until the end. Within a sweep a
//! room is blocked from its first row that may not start (a retry not yet due, another
//! worker's live lease, an outcome that holds the room back): none of its later rows start
//! before the next sweep finds the room's head free. Rows already in memory (queued, in
//! flight, or finished and not yet written) are known by event id and never read twice.
//!
//! The table does not say what is in flight, so the [`Tracker`] does, with one clock that
//! orders reads, outcomes and writes:
//! - a read's rows are dropped when their room was held back after the read began (its
//!   snapshot predates the outcome), and until they are, a later read takes none of the
//!   room's rows past them (a new sweep would otherwise start the room's later rows ahead
//!   of the ones dropped);
//! - a written outcome stays known until a read begins after it (the reads before it may
//!   still see the row unfinished).
//!
//! A row can become visible behind the sweep's place: its insert committed after a page
//! read rows that sort after it (another producer's insert, or a fan-out batch, committed
//! first). Its room's next row, inserted after it committed, must not start in the same
//! sweep. So a sweep that goes on past its first page reads its [`Ceiling`] before that
//! page: the newest key given so far (keys are given in insert order), or for tables keyed
//! by event id, the database's clock less [`CLOCK_MARGIN_MS`]. Its later pages leave rows
//! past the ceiling (and their rooms) to the next sweep.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Worker;
use super::buffer::{RoomKey, room_of};
use crate::store::{Claimed, Fence, Heartbeat, Holding, KeyValue, Mark, OwnedRead, Page, Store};

/// The most pages one read walks before it hands over what it found.
const MAX_PAGES: usize = 16;
/// The most short heartbeats in a row while a host is below its share (about a partition
/// lease's worth at the default eighth of a heartbeat): past them a host whose share stays
/// out of reach (a live host that never gives up its surplus) beats at the normal pace.
const QUICK_BEATS: u32 = 24;
/// Short heartbeats at a host's start (about two and a half seconds at the default lease).
const STARTING_BEATS: u32 = 6;
/// Where rows are keyed by event id, a sweep's later pages leave the rows created less than
/// this before the sweep began (by the database's clock; the producers' clocks may be
/// behind it by as much) to the next sweep.
const CLOCK_MARGIN_MS: i64 = 2_000;

/// What a sweep's later pages may take: rows inserted before its first page was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ceiling {
    /// Keys up to this one (keys given in insert order).
    Key(i64),
    /// Rows created before this time (tables keyed by event id).
    Created(i64),
}

impl Ceiling {
    fn admits(self, waiting: &crate::store::Waiting) -> bool {
        match (self, &waiting.key) {
            (Ceiling::Key(newest), KeyValue::Int(key)) => *key <= newest,
            (Ceiling::Key(_), KeyValue::Text(_)) => true,
            (Ceiling::Created(before), _) => waiting.row.created_at_ms < before,
        }
    }
}

/// What the owner knows of a row it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    /// Queued or in flight; taken by the read that began at clock `read_at`.
    Started { read_at: u64 },
    /// Its outcome is decided and not yet written; `holds`: it holds its room back.
    Finished { holds: bool },
    /// Its outcome was written at clock `at`.
    Written { at: u64, holds: bool },
}

/// Rows read and not yet forgotten, the rooms held back, the sweep, and the partitions held.
#[derive(Default)]
struct State {
    clock: u64,
    /// By event id: what is known of the row, and its partition.
    known: HashMap<String, (Known, u32)>,
    /// When each room was last held back or had rows forgotten.
    touched: HashMap<RoomKey, u64>,
    /// Which sweep this is: a page read in an earlier one is not used.
    sweep: u64,
    /// Where the sweep goes on from.
    after: Option<(i64, KeyValue)>,
    /// Rooms blocked for the rest of this sweep.
    blocked: HashSet<RoomKey>,
    /// The key of the last row [`Tracker::select`] took.
    last_key: Option<KeyValue>,
    /// What this sweep's later pages may take; `None`: it ends at its first page.
    ceiling: Option<Ceiling>,
    /// Whether this sweep, and the one before it, went on past their first page (then the
    /// next sweep reads its ceiling first).
    went_on: bool,
    paged: bool,
    holding: Holding,
}

impl State {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn touch(&mut self, room: &RoomKey) {
        let now = self.tick();
        self.touched.insert(room.clone(), now);
        self.blocked.insert(room.clone());
    }

    fn new_sweep(&mut self) {
        self.sweep += 1;
        self.after = None;
        self.blocked.clear();
        self.ceiling = None;
        self.paged = std::mem::take(&mut self.went_on);
    }
}

/// The owner's memory of what it read, shared by the reader, the delivery loop and the
/// outcome writer.
#[derive(Default)]
pub(super) struct Tracker {
    state: Mutex<State>,
    /// Notified when outcomes have been written.
    pub recorded: tokio::sync::Notify,
}

/// One read's start: its clock, where it goes on from, and what it may read.
pub(super) struct ReadStart {
    pub seq: u64,
    pub sweep: u64,
    pub after: Option<(i64, KeyValue)>,
    pub owned: Vec<Fence>,
    pub total: u32,
    /// At a sweep's start: whether to read its ceiling (the sweep before went on past its
    /// first page). Past it: whether the sweep has one (it may go on).
    pub ceiling: bool,
}

impl Tracker {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Begins a page: forgets outcomes written before it (the page's snapshot sees them).
    /// Surplus partitions, which are being drained, are not read.
    pub fn begin_read(&self) -> ReadStart {
        let mut s = self.state();
        let seq = s.tick();
        s.known.retain(|_, (k, _)| !matches!(k, Known::Written { at, .. } if *at < seq));
        let owned = read_of(&s.holding);
        let ceiling = if s.after.is_none() { s.paged } else { s.ceiling.is_some() };
        ReadStart { seq, sweep: s.sweep, after: s.after.clone(), owned, total: s.holding.total, ceiling }
    }

    /// Sets the ceiling of `sweep`, read before its first page.
    pub fn set_ceiling(&self, sweep: u64, ceiling: Ceiling) {
        let mut s = self.state();
        if s.sweep == sweep && s.after.is_none() {
            s.ceiling = Some(ceiling);
        }
    }

    /// Ends a sweep that has no ceiling where it would go on past its first page: the next
    /// sweep reads one first.
    pub fn restart_sweep(&self, sweep: u64) {
        let mut s = self.state();
        if s.sweep == sweep {
            s.went_on = true;
            s.new_sweep();
        }
    }

    /// Up to `wanted` rows of `page` that may start now, in order, marked started; moves the
    /// sweep on to the last row it looked at. `failed`: rooms with a `failed` row and its
    /// creation time, which block the room's later rows (`failed_blocks_room`). Returns the
    /// rows and whether the sweep ended. A page of an earlier `sweep` (partitions were
    /// gained while it was read) is not used: the new sweep reads it again. `seq`: the clock
    /// of the read the page belongs to, by which [`Tracker::admit`] judges its rows.
    pub fn select(
        &self,
        page: Page,
        (seq, sweep): (u64, u64),
        wanted: usize,
        now_ms: i64,
        failed: &[(String, String, i64)],
    ) -> (Vec<Claimed>, bool) {
        let mut s = self.state();
        let mut ready = Vec::new();
        if s.sweep != sweep || wanted == 0 {
            return (ready, false);
        }
        // A later page: only rows inserted before the sweep began.
        let ceiling = if s.after.is_some() { s.ceiling } else { None };
        s.went_on |= ceiling.is_some();
        for waiting in page.waiting {
            if ready.len() >= wanted {
                // Full: the sweep goes on from the last row taken.
                let last: &Claimed = ready.last().expect("at least one row is wanted");
                s.after = Some((last.created_at_ms, s.last_key.take().expect("set with each row taken")));
                return (ready, false);
            }
            let room = room_of(&waiting.row);
            if s.blocked.contains(&room) {
                continue;
            }
            if ceiling.is_some_and(|c| !c.admits(&waiting)) {
                s.blocked.insert(room);
                continue;
            }
            let hold = match s.known.get(&waiting.row.event_id).map(|(k, _)| *k) {
                // Taken by a read whose rows are still on their way to the buffer, and its
                // room held back since that read began: `admit` will drop it, so the room's
                // later rows must not be taken past it (they would start ahead of it).
                Some(Known::Started { read_at }) if s.touched.get(&room).is_some_and(|at| *at > read_at) => true,
                Some(Known::Started { .. })
                | Some(Known::Finished { holds: false })
                | Some(Known::Written { holds: false, .. }) => {
                    continue;
                }
                Some(Known::Finished { holds: true }) | Some(Known::Written { holds: true, .. }) => true,
                None => {
                    !waiting.due(now_ms)
                        || failed
                            .iter()
                            .any(|(app, r, at)| (app, r) == (&room.0, &room.1) && *at <= waiting.row.created_at_ms)
                }
            };
            if hold {
                s.blocked.insert(room);
                continue;
            }
            let partition = waiting.row.lease.fence.map_or(0, |f| f.partition);
            s.known.insert(waiting.row.event_id.clone(), (Known::Started { read_at: seq }, partition));
            s.last_key = Some(waiting.key);
            ready.push(waiting.row);
        }
        s.last_key = None;
        if page.at_end {
            s.new_sweep();
        } else {
            s.after = page.last;
        }
        (ready, page.at_end)
    }

    /// Keeps the rows of a read that began at `seq` whose room was not held back since;
    /// forgets the others.
    pub fn admit(&self, seq: u64, rows: Vec<Claimed>) -> (Vec<Claimed>, usize) {
        let mut s = self.state();
        let (keep, drop): (Vec<Claimed>, Vec<Claimed>) =
            rows.into_iter().partition(|r| s.touched.get(&room_of(r)).is_none_or(|at| *at < seq));
        for row in &drop {
            s.known.remove(&row.event_id);
        }
        // No later read began before `seq`.
        s.touched.retain(|_, at| *at >= seq);
        (keep, drop.len())
    }

    /// A row's outcome is decided.
    pub fn finished(&self, event_id: &str, room: &RoomKey, holds: bool) {
        let mut s = self.state();
        if let Some((known, _)) = s.known.get_mut(event_id) {
            *known = Known::Finished { holds };
        }
        if holds {
            s.touch(room);
        }
    }

    /// Rows that will not start now (handed back): read again from the next sweep on.
    pub fn forget(&self, rows: &[Claimed]) {
        let mut s = self.state();
        for row in rows {
            s.known.remove(&row.event_id);
            s.touch(&room_of(row));
        }
    }

    /// These outcomes are in the table (or were fenced off: then the partition's new owner
    /// has the row).
    pub fn written(&self, marks: &[Mark]) {
        self.written_now(marks);
        self.recorded.notify_one();
    }

    fn written_now(&self, marks: &[Mark]) {
        let mut s = self.state();
        for m in marks {
            let at = s.tick();
            if let Some((known, _)) = s.known.get_mut(&m.event_id) {
                let holds = matches!(known, Known::Finished { holds: true });
                *known = Known::Written { at, holds };
            }
        }
    }

    /// Rows whose outcome is decided and not yet written.
    pub fn unrecorded(&self) -> usize {
        self.state().known.values().filter(|(k, _)| matches!(k, Known::Finished { .. })).count()
    }

    /// Rows read and not yet recorded.
    pub fn in_flight(&self) -> usize {
        self.state().known.values().filter(|(k, _)| !matches!(k, Known::Written { .. })).count()
    }

    /// Whether a delivery of the row may start at `now_ms`: its partition is still held
    /// under its epoch, with at least `needed_ms` of the lease left (a delivery that starts
    /// ends before any other host may take the room).
    pub fn may_start(&self, fence: Option<Fence>, now_ms: i64, needed_ms: i64) -> bool {
        let s = self.state();
        fence.is_some_and(|f| s.holding.owned.contains(&f)) && s.holding.lease_until_ms - now_ms >= needed_ms
    }

    /// The partitions held now.
    pub fn held(&self) -> Vec<u32> {
        self.state().holding.owned.iter().map(|f| f.partition).collect()
    }

    /// Surplus partitions with nothing read and unrecorded, to give up: from now on nothing
    /// of theirs starts here (a read under way may still bring rows of them).
    pub fn release_drained(&self) -> Vec<u32> {
        let mut s = self.state();
        let busy: HashSet<u32> =
            s.known.values().filter(|(k, _)| !matches!(k, Known::Written { .. })).map(|(_, p)| *p).collect();
        let drained: Vec<u32> = s.holding.surplus.iter().copied().filter(|p| !busy.contains(p)).collect();
        s.holding.owned.retain(|f| !drained.contains(&f.partition));
        s.holding.surplus.retain(|p| !drained.contains(p));
        drained
    }

    /// The heartbeat's result. Returns (gained, lost).
    ///
    /// A partition read from now on that was not read before (gained, or surplus no more
    /// because the share grew back) starts a new sweep: the sweep went on past its rooms'
    /// rows while it was not read, and their later rows must not start ahead of them.
    pub fn hold(&self, holding: Holding) -> (Vec<u32>, Vec<u32>) {
        let mut s = self.state();
        let before: HashSet<Fence> = s.holding.owned.iter().copied().collect();
        let after: HashSet<Fence> = holding.owned.iter().copied().collect();
        let gained: Vec<u32> = after.difference(&before).map(|f| f.partition).collect();
        let lost: Vec<u32> = before.difference(&after).map(|f| f.partition).collect();
        let was_read = read_of(&s.holding);
        if read_of(&holding).iter().any(|f| !was_read.contains(f)) {
            s.new_sweep();
        }
        s.holding = holding;
        (gained, lost)
    }
}

/// The partitions an owner reads, in partition order: those it holds, less the surplus it
/// drains.
fn read_of(holding: &Holding) -> Vec<Fence> {
    holding.owned.iter().filter(|f| !holding.surplus.contains(&f.partition)).copied().collect()
}

impl Worker {
    /// Keeps this host's partition leases: a heartbeat every third of `partition_lease`,
    /// which renews them, gives up drained surplus, and takes free or expired partitions up
    /// to this host's share.
    ///
    /// For its first [`STARTING_BEATS`] heartbeats, and while it holds less than its share
    /// (at most [`QUICK_BEATS`] in a row), it beats every eighth of a heartbeat: hosts that
    /// start together see each other within a short beat, and the first, which took every
    /// partition, gives the others their share a beat or two later instead of two or three
    /// heartbeats later. A host alone starts at once. Past its start, a host gives up
    /// surplus at its normal pace.
    pub(super) async fn keep_partitions(self: Arc<Self>, tracker: Arc<Tracker>, shutdown: CancellationToken) {
        let lease_ms = self.config.partition_lease.as_millis() as i64;
        let every = self.config.partition_lease / 3;
        let quick = (every / 8).max(Duration::from_millis(50));
        let wake = self.store.inserted();
        let mut backoff = Duration::from_millis(100);
        let mut told = false;
        let mut indexed = None;
        let mut beats = 0;
        let mut quick_beats = 0;
        while !shutdown.is_cancelled() {
            self.clock.sync(self.store.as_ref()).await;
            let release = tracker.release_drained();
            let renew = tracker.held();
            let beat = Heartbeat {
                owner: &self.worker_id,
                partitions: self.config.partitions,
                in_flight: tracker.in_flight() as i64,
                now_ms: self.clock.now_ms(),
                lease_ms,
                renew: &renew,
                release: &release,
            };
            let wait = match self.store.keep_partitions(&beat).await {
                Ok(holding) => {
                    backoff = Duration::from_millis(100);
                    self.metrics.db_ok("partitions");
                    let (owned, share) = (holding.owned.len(), holding.share);
                    let below_share = owned < share;
                    if indexed != Some(holding.total) {
                        indexed = Some(holding.total);
                        tokio::spawn(index_partitions(self.store.clone(), holding.total, shutdown.clone()));
                    }
                    if holding.total != self.config.partitions && !std::mem::replace(&mut told, true) {
                        tracing::warn!(worker = "room_outbox", node_id = %self.node_id, table_partitions = holding.total, configured = self.config.partitions, "the sink's partitions were made with another count, which stands: `outbox-host partitions --set N` changes it, with every host of the sink stopped");
                    }
                    let (gained, lost) = tracker.hold(holding);
                    if !lost.is_empty() {
                        tracing::warn!(worker = "room_outbox", node_id = %self.node_id, worker_id = %self.worker_id, partitions = ?lost, "lost partitions to another host (this host's lease ran out); their outcomes in flight are not written");
                    }
                    if !gained.is_empty() {
                        tracing::info!(worker = "room_outbox", node_id = %self.node_id, worker_id = %self.worker_id, partitions = ?gained, owned, share, "took partitions");
                        wake.notify_one();
                    }
                    if !release.is_empty() {
                        tracing::info!(worker = "room_outbox", node_id = %self.node_id, worker_id = %self.worker_id, partitions = ?release, "gave up drained partitions to a joining host");
                    }
                    beats += 1;
                    quick_beats = if below_share { quick_beats + 1 } else { 0 };
                    if beats <= STARTING_BEATS || (below_share && quick_beats <= QUICK_BEATS) { quick } else { every }
                }
                Err(e) => {
                    self.metrics.db_error("partitions", &e);
                    tracing::warn!(worker = "room_outbox", node_id = %self.node_id, error = %e, "could not renew partition leases; will retry");
                    backoff = (backoff * 2).min(every);
                    backoff
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => {}
            }
        }
    }

    /// Up to `wanted` rows of the owned partitions that may start now, from as many pages as
    /// that takes (at most [`MAX_PAGES`]), and the clock of the read's start; `None` when
    /// there was nothing, at the end of a sweep.
    pub(super) async fn read_ready(
        &self,
        tracker: &Tracker,
        wanted: usize,
    ) -> Result<(u64, Vec<Claimed>, bool), crate::store::StoreError> {
        let mut ready = Vec::new();
        let mut first = None;
        for _ in 0..MAX_PAGES {
            let start = tracker.begin_read();
            let seq = *first.get_or_insert(start.seq);
            if start.owned.is_empty() {
                return Ok((seq, ready, true));
            }
            if start.after.is_some() && !start.ceiling {
                tracker.restart_sweep(start.sweep);
                continue;
            }
            if start.after.is_none() && start.ceiling {
                match self.ceiling().await {
                    Ok(ceiling) => tracker.set_ceiling(start.sweep, ceiling),
                    Err(_) if !ready.is_empty() => return Ok((seq, ready, false)),
                    Err(e) => return Err(e),
                }
            }
            // A sweep's first page meets the rows in flight again (they are still unfinished
            // in the table); after that the sweep is past them.
            let known = if start.after.is_none() { tracker.in_flight() } else { 0 };
            let limit = (wanted - ready.len() + known).min(super::settings::MAX_BATCH_SIZE as usize).max(1);
            let read = OwnedRead {
                owner: &self.worker_id,
                total: start.total,
                owned: &start.owned,
                after: start.after,
                limit: limit as u32,
            };
            let (page, failed) = match self.read_page(&read).await {
                Ok(read) => read,
                // The rows taken from earlier pages are marked started and the sweep has
                // moved past them: they go on (dropped, their rooms' later rows would start
                // ahead of them); the error comes back at the next read.
                Err(_) if !ready.is_empty() => return Ok((seq, ready, false)),
                Err(e) => return Err(e),
            };
            let (taken, at_end) =
                tracker.select(page, (seq, start.sweep), wanted - ready.len(), self.clock.now_ms(), &failed);
            ready.extend(taken);
            if at_end || ready.len() >= wanted {
                return Ok((seq, ready, at_end));
            }
        }
        Ok((first.unwrap_or_default(), ready, false))
    }

    /// The ceiling of a sweep that begins now.
    async fn ceiling(&self) -> Result<Ceiling, crate::store::StoreError> {
        Ok(match self.store.newest_key().await? {
            Some(key) => Ceiling::Key(key),
            None => Ceiling::Created(self.clock.now_ms() - CLOCK_MARGIN_MS),
        })
    }

    /// One page of the owned partitions' waiting rows, and (with `failed_blocks_room`) the
    /// rooms among them that have a `failed` row.
    async fn read_page(
        &self,
        read: &OwnedRead<'_>,
    ) -> Result<(Page, Vec<(String, String, i64)>), crate::store::StoreError> {
        let page = self.store.read_owned(read).await?;
        if !self.config.failed_blocks_room {
            return Ok((page, Vec::new()));
        }
        let mut rooms: Vec<(String, String)> =
            page.waiting.iter().map(|w| (w.row.app_code.clone(), w.row.room_id.clone())).collect();
        rooms.sort();
        rooms.dedup();
        let failed = self.store.failed_rooms(&rooms).await?;
        Ok((page, failed))
    }

    /// Joins the sink's hosts under this host's `ordering`; refuses, naming the live hosts
    /// and their ordering, when they deliver the sink with another (a room's order would
    /// not hold between them). A refused host leaves at once, so that it does not hold back
    /// a host that starts after it with theirs.
    pub async fn join_hosts(&self) -> anyhow::Result<()> {
        let now = self.store.clock_ms().await?;
        let until = now + self.config.partition_lease.as_millis() as i64;
        let mine = self.config.ordering.name();
        let others = self.store.announce(&self.worker_id, mine, now, until).await?;
        let Some((_, theirs)) = others.first() else { return Ok(()) };
        let _ = self.store.leave_partitions(&self.worker_id).await;
        let hosts: Vec<&str> = others.iter().map(|(owner, _)| owner.as_str()).collect();
        anyhow::bail!(
            "host(s) {} deliver this sink with outbox_worker.ordering: {theirs}, and this host is configured with \
             ordering: {mine}. All hosts of a sink deliver with one ordering (a room's order would not hold between \
             them): set ordering: {theirs} here, or stop those hosts before changing it",
            hosts.join(", ")
        )
    }

    /// Writes a batch of outcomes fenced by partition: a mark whose partition this host
    /// lost is not written (the partition's new owner delivers the row).
    pub(super) async fn write_owned(&self, marks: &[Mark], now_ms: i64) -> Result<u64, crate::store::StoreError> {
        let (changed, fenced) = self.store.mark_owned(&self.worker_id, marks, now_ms).await?;
        for i in fenced {
            let m = &marks[i];
            self.metrics.fenced();
            tracing::warn!(worker = "room_outbox", node_id = %self.node_id, worker_id = %self.worker_id, event_id = %m.event_id, partition = m.lease.fence.map(|f| f.partition), "outcome not written: this host no longer owns the row's partition (another host delivers it)");
        }
        Ok(changed)
    }

    /// Gives up this host's partitions at a clean shutdown, so that the others take them at
    /// once rather than when the leases run out.
    pub(super) async fn leave_partitions(&self) {
        let left = tokio::time::timeout(self.config.shutdown_grace, self.store.leave_partitions(&self.worker_id)).await;
        match left {
            Ok(Ok(())) => {
                tracing::info!(worker = "room_outbox", node_id = %self.node_id, worker_id = %self.worker_id, "gave up this host's partitions")
            }
            _ => {
                tracing::warn!(worker = "room_outbox", node_id = %self.node_id, "could not give up this host's partitions; others take them when their leases run out")
            }
        }
    }
}

/// Finds or builds the partition index for `total` partitions (an owner of some partitions
/// then reads only their rows), trying again every minute while it cannot (a user without
/// `CREATE`, or the migration lock held elsewhere); reads go on without it meanwhile.
async fn index_partitions(store: Arc<dyn Store>, total: u32, shutdown: CancellationToken) {
    while !shutdown.is_cancelled() {
        match store.index_partitions(total).await {
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(worker = "room_outbox", error = %e, partitions = total, "could not build the partition index; owners read every partition's waiting rows until it is there (trying again in a minute)");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(60)) => {}
            () = shutdown.cancelled() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Lease, Status, Waiting};

    fn fence(partition: u32) -> Fence {
        Fence { partition, epoch: 1 }
    }

    fn holding(owned: &[u32], surplus: &[u32]) -> Holding {
        Holding {
            total: 4,
            owned: owned.iter().map(|p| fence(*p)).collect(),
            share: owned.len() - surplus.len(),
            surplus: surplus.to_vec(),
            lease_until_ms: i64::MAX,
        }
    }

    /// Row `key` of `room` in `partition`, created at `key` ms.
    fn waiting(room: &str, partition: u32, key: i64) -> Waiting {
        Waiting {
            row: Claimed {
                id: key,
                app_code: "app".into(),
                event_id: format!("{room}-{key}"),
                event_type: "RoomGiftSent".into(),
                room_id: room.into(),
                envelope: Vec::new(),
                created_at_ms: key,
                retry_count: 0,
                trace_context: None,
                lease: Lease { worker_id: "w".into(), lock_until_ms: i64::MAX, fence: Some(fence(partition)) },
                rescued: false,
            },
            status: Status::Pending,
            next_retry_at_ms: 0,
            lock_until_ms: 0,
            key: KeyValue::Int(key),
        }
    }

    /// The fault harness's order violation on MariaDB (seed 3110: a room's run of events
    /// delivered after its later ones): a read's rows were on their way to the buffer when
    /// their room was held back and a new sweep began; the new sweep's first page met them
    /// as started and took the room's later rows past them. `admit` then dropped the earlier
    /// rows (their room held back since their read began) and kept the later ones.
    #[test]
    fn a_rooms_rows_dropped_on_their_way_to_the_buffer_are_not_overtaken_by_a_new_sweep() {
        let tracker = Tracker::default();
        tracker.hold(holding(&[0], &[]));
        let a = tracker.begin_read();
        let page = Page {
            waiting: vec![waiting("r", 0, 12), waiting("r", 0, 27)],
            last: Some((27, KeyValue::Int(27))),
            at_end: false,
        };
        let (taken_a, _) = tracker.select(page, (a.seq, a.sweep), 10, 0, &[]);
        assert_eq!(taken_a.len(), 2);
        // Before read A's rows reach the buffer, the room is held back (its row 10 handed
        // back) and a new sweep begins.
        tracker.forget(&[waiting("r", 0, 10).row]);
        tracker.restart_sweep(a.sweep);
        let b = tracker.begin_read();
        assert_eq!(b.after, None, "a new sweep, from the oldest row");
        let page = Page {
            waiting: vec![waiting("r", 0, 12), waiting("r", 0, 27), waiting("r", 0, 28)],
            last: Some((28, KeyValue::Int(28))),
            at_end: true,
        };
        let (taken_b, _) = tracker.select(page, (b.seq, b.sweep), 10, 0, &[]);
        let (kept_a, dropped_a) = tracker.admit(a.seq, taken_a);
        assert_eq!((kept_a.len(), dropped_a), (0, 2), "read A's rows are dropped: their room was held back since");
        let (kept_b, _) = tracker.admit(b.seq, taken_b);
        let ids: Vec<&str> = kept_b.iter().map(|r| r.event_id.as_str()).collect();
        assert!(ids.is_empty(), "the room's row 28 must not start ahead of 12 and 27: {ids:?}");
        // The next sweep takes the room from its oldest row, in order.
        let c = tracker.begin_read();
        let page = Page {
            waiting: vec![waiting("r", 0, 10), waiting("r", 0, 12), waiting("r", 0, 27), waiting("r", 0, 28)],
            last: Some((28, KeyValue::Int(28))),
            at_end: true,
        };
        let (taken_c, _) = tracker.select(page, (c.seq, c.sweep), 10, 0, &[]);
        let ids: Vec<&str> = taken_c.iter().map(|r| r.event_id.as_str()).collect();
        assert_eq!(ids, ["r-10", "r-12", "r-27", "r-28"]);
    }

    /// The soak's order violation: a surplus partition is not read while the sweep goes on
    /// past its rooms' rows; when the share grows back and it is read again, the read must
    /// start from the oldest row, or the room's later rows (past the sweep's place) start
    /// ahead of the ones the sweep went past.
    #[test]
    fn a_partition_read_again_after_surplus_starts_a_new_sweep() {
        let tracker = Tracker::default();
        tracker.hold(holding(&[0, 1], &[1]));
        let start = tracker.begin_read();
        assert_eq!(start.owned, vec![fence(0)], "surplus is not read");
        // The page's rows of partition 0; partition 1's row at 15 is in the table, unread.
        let page = Page {
            waiting: vec![waiting("a", 0, 10), waiting("a", 0, 20)],
            last: Some((20, KeyValue::Int(20))),
            at_end: false,
        };
        let (taken, at_end) = tracker.select(page, (start.seq, start.sweep), 10, 0, &[]);
        assert_eq!((taken.len(), at_end), (2, false));
        assert_eq!(tracker.begin_read().after, Some((20, KeyValue::Int(20))), "the sweep goes on past 15");

        // The share grew back: partition 1 is held as before and read again.
        let (gained, lost) = tracker.hold(holding(&[0, 1], &[]));
        assert_eq!((gained, lost), (vec![], vec![]));
        let start = tracker.begin_read();
        assert_eq!(start.owned, vec![fence(0), fence(1)]);
        assert_eq!(start.after, None, "a new sweep, from the oldest row (partition 1's row at 15)");
        assert!(start.sweep > 1);
    }

    #[test]
    fn a_partition_that_becomes_surplus_or_is_released_keeps_the_sweep() {
        let tracker = Tracker::default();
        tracker.hold(holding(&[0, 1], &[]));
        let start = tracker.begin_read();
        let page = Page { waiting: vec![waiting("a", 0, 10)], last: Some((10, KeyValue::Int(10))), at_end: false };
        tracker.select(page, (start.seq, start.sweep), 10, 0, &[]);
        tracker.hold(holding(&[0, 1], &[1]));
        assert_eq!(tracker.begin_read().after, Some((10, KeyValue::Int(10))));
        tracker.hold(holding(&[0], &[]));
        let start = tracker.begin_read();
        assert_eq!((start.owned, start.after), (vec![fence(0)], Some((10, KeyValue::Int(10)))));
    }
}
