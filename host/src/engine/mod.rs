//! The delivery engine: a claimer keeps claimed rows buffered ahead of the deliveries; a
//! delivery starts as soon as a slot is free, events of one room one at a time in claim
//! order (across claims); outcomes go to one writer that batches them. `poll_interval` is
//! only the longest idle wait: an insert wakes an idle worker sooner (`wake_up`).
//!
//! Rows come in and outcomes go back one of two ways, each in its own file: row claims
//! under leases (`ordering: none`, `claims.rs`), or partition ownership with the owner's
//! memory of what it read (`per_room`, `owner.rs`). This file runs either: it takes rows
//! (`claim_rows` or `read_ready`), gives back the ones it will not start (`release`),
//! writes outcomes (`write`) and keeps the host among the sink's hosts (a heartbeat of
//! either kind).

pub mod breaker;
pub mod dbclock;
pub mod settings;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::ops::metrics::Metrics;

mod attempt;
mod buffer;
mod claims;
mod owner;
mod rate;
mod retry;
mod sizing;

use breaker::{Admit, Breaker, Transition, Verdict};
use buffer::{Buffer, InOrder, RoomKey, room_of};

use crate::sandbox::{Deliver, FailureClass, Turn};
use crate::store::{Claimed, Mark, Outcome, Store, now_ms};
use crate::text::printable;
use crate::text::short_error;
use rate::TokenBucket;
pub use retry::after_failure;
use settings::RoomOrdering;
use settings::{WakeUp, WorkerConfig};
use sizing::ClaimSize;

/// A delivery starts only if this much lease is left after its `publish_timeout`;
/// otherwise the row is handed back, so a lease never runs out under a healthy delivery.
const START_MARGIN_MS: i64 = 1_000;
/// At most this many outcomes go into one write.
const MAX_MARKS_PER_WRITE: usize = 500;
/// The longest wait between attempts to reach a database that is down.
const MAX_DB_BACKOFF: Duration = Duration::from_secs(30);

/// What the worker reports as it goes, for tests and the admin endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signal {
    /// A claim returned this many rows.
    Claimed(usize),
    /// A claim found nothing to do.
    Idle,
    /// This many outcomes were written to the table.
    Recorded(usize),
    /// Claimed rows that were never started were handed back.
    Released(usize),
    /// The loop has stopped and every outcome has been written.
    Stopped,
}

/// How long this process's worker ids are on `node_id` (`<node_id>-<pid>-<8 hex digits>`),
/// for the check that the table's `worker_id` column holds them.
pub fn worker_id_len(node_id: &str) -> usize {
    node_id.len() + 1 + std::process::id().to_string().len() + 1 + 8
}

/// An outcome on its way to the writer (its event id names it if it cannot be written
/// before shutdown gives up), and what it says about the destination.
struct Pending {
    mark: Mark,
    verdict: Verdict,
    /// Whether it was the circuit breaker's half-open probe.
    probe: bool,
}

/// The sink a worker delivers through, swapped whole by a reload: a delivery takes the one
/// that is current when it starts and finishes on it.
pub struct SinkSlot {
    current: std::sync::RwLock<Arc<dyn Deliver>>,
}

impl SinkSlot {
    /// A slot holding `sink`.
    pub fn new(sink: Arc<dyn Deliver>) -> SinkSlot {
        SinkSlot { current: std::sync::RwLock::new(sink) }
    }

    /// The sink new deliveries start on.
    pub fn get(&self) -> Arc<dyn Deliver> {
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Puts `sink` in for the deliveries that start from now on; returns the one it replaces
    /// (deliveries under way keep it until they finish).
    pub fn swap(&self, sink: Arc<dyn Deliver>) -> Arc<dyn Deliver> {
        std::mem::replace(&mut *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner), sink)
    }
}

/// The `room_outbox` worker (room-service's compensation worker, as a product), for one sink.
pub struct Worker {
    store: Arc<dyn Store>,
    sink: Arc<SinkSlot>,
    config: WorkerConfig,
    node_id: String,
    worker_id: String,
    signals: broadcast::Sender<Signal>,
    metrics: Arc<Metrics>,
    /// The database's clock, which leases and due times are judged by.
    clock: dbclock::DbClock,
    /// Under per-room order: what this host, as its partitions' owner, has read and not yet
    /// recorded (rows are not claimed; see [`owner`]).
    tracker: Option<Arc<owner::Tracker>>,
}

impl Worker {
    /// A worker named after `node_id` plus a per-process suffix, so that two processes on
    /// one node never share leases.
    pub fn new(
        store: Arc<dyn Store>,
        sink: Arc<dyn Deliver>,
        config: WorkerConfig,
        node_id: &str,
        metrics: Arc<Metrics>,
    ) -> Arc<Worker> {
        let random = crate::clock::random_u64();
        let worker_id = format!("{node_id}-{}-{:08x}", std::process::id(), random as u32);
        debug_assert_eq!(worker_id.len(), worker_id_len(node_id));
        let (signals, _) = broadcast::channel(1024);
        let sink = Arc::new(SinkSlot::new(sink));
        // A consumer takes no row claims: its hosts own partitions whatever its ordering.
        let tracker = (config.ordering == RoomOrdering::PerRoom || store.is_consumer()).then(Default::default);
        Arc::new(Worker {
            store,
            sink,
            config,
            node_id: node_id.to_string(),
            worker_id,
            signals,
            metrics,
            clock: Default::default(),
            tracker,
        })
    }

    /// The slot a reload swaps a new build of the sink into.
    pub fn sink_slot(&self) -> &Arc<SinkSlot> {
        &self.sink
    }

    /// The id written into `worker_id` of the rows this worker holds.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// Progress signals from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Signal> {
        self.signals.subscribe()
    }

    fn signal(&self, s: Signal) {
        let _ = self.signals.send(s);
    }

    /// Delivers until `shutdown` is cancelled, then stops claiming, lets in-flight
    /// deliveries finish (each bounded by `publish_timeout`), hands back every row it
    /// claimed but did not start, and returns once every outcome is written.
    ///
    /// Claiming and delivering overlap: a claimer task keeps up to two batches claimed
    /// ahead, and a delivery starts whenever a slot is free and some room's next event is
    /// ready (see [`buffer`]).
    ///
    /// While the database is away, writing outcomes is retried for `shutdown_grace` after
    /// the last delivery has finished; then the outcomes still unwritten are logged by event
    /// id and left to lease expiry, and this returns an error.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) -> anyhow::Result<()> {
        let (marks, rx) = mpsc::unbounded_channel();
        let give_up = CancellationToken::new();
        let recorder = tokio::spawn(self.clone().record(rx, give_up.clone()));
        tracing::info!(
            worker = "room_outbox",
            node_id = %self.node_id,
            worker_id = %self.worker_id,
            sink = self.sink.get().name(),
            "worker started"
        );
        let outstanding = Arc::new(Outstanding::default());
        let (claims, mut claimed) = mpsc::unbounded_channel();
        let mut breaker = Breaker::new(self.config.breaker);
        let (gate, gate_rx) = watch::channel(breaker.state());
        // Partition leases under per-room order; under `none`, this host's place among the
        // sink's hosts (see `join_hosts`).
        let keeper = {
            let stop = shutdown.child_token();
            let keeping = match self.tracker.clone() {
                Some(tracker) => tokio::spawn(self.clone().keep_partitions(tracker, stop.clone())),
                None => tokio::spawn(self.clone().keep_announced(stop.clone())),
            };
            (keeping, stop)
        };
        let claimer = tokio::spawn(self.clone().claim_ahead(outstanding.clone(), claims, gate_rx, shutdown.clone()));
        // A sink that keeps order across deliveries in flight may have several of a room's.
        let mut buffer = Buffer::new(self.sink.get().room_pipeline()).with_room_limit(self.config.room_rate_limit);
        let mut held_shown = (std::time::Instant::now(), 0);
        let mut acks = InOrder::default();
        let mut running: JoinSet<(RoomKey, Pending)> = JoinSet::new();
        let mut claiming = true;
        let mut bucket = self.config.rate_limit.map(|limit| TokenBucket::new(limit, std::time::Instant::now()));
        // When the rate limit has the next token for a delivery that is ready to start.
        let mut next_token = None;
        loop {
            if let Some(moved) = breaker.poll(std::time::Instant::now()) {
                self.breaker_moved(&moved, &gate);
            }
            if matches!(breaker.state(), breaker::State::Open | breaker::State::Misconfigured) && buffer.len() > 0 {
                // Paused: what is buffered goes back unattempted, for any host to take.
                let unstarted = buffer.drain();
                outstanding.freed(unstarted.len());
                self.release(&unstarted).await;
            }
            buffer.wake_held(std::time::Instant::now());
            if self.config.room_rate_limit.is_some() {
                self.show_held_rooms(&buffer, &mut held_shown);
            }
            if !shutdown.is_cancelled() {
                next_token = self
                    .start_ready(&mut buffer, (&mut running, &mut acks), &outstanding, bucket.as_mut(), &mut breaker)
                    .await;
            }
            if !claiming && running.is_empty() {
                break;
            }
            let token_wait = sleep_until_or_never(next_token);
            let room_token_wait = sleep_until_or_never(buffer.next_token());
            let probe_wait = sleep_until_or_never(breaker.reopens_at());
            let seen_back = seen_back(breaker.unavailable_since().map(|since| (self.sink.get(), since)));
            tokio::select! {
                () = token_wait => {}
                () = room_token_wait => {}
                () = probe_wait => {}
                () = seen_back => {
                    if let Some(moved) = breaker.seen_back(std::time::Instant::now()) {
                        self.breaker_moved(&moved, &gate);
                    }
                }
                rows = claimed.recv(), if claiming => match rows {
                    Some((seq, rows)) => {
                        // A rate-limited room's rows past its cap: read again later.
                        let over = buffer.push(self.admit(seq, rows, &outstanding));
                        outstanding.freed(over.len());
                        self.release(&over).await;
                    }
                    None => claiming = false,
                },
                Some(done) = running.join_next() => {
                    let (key, pending) = done.expect("delivery tasks catch their panics");
                    let event_id = pending.mark.event_id.clone();
                    for pending in acks.finished(&key, &event_id, pending) {
                        // The breaker first, so that the claimer woken by the freed slot sees
                        // where it went.
                        if let Some(moved) = breaker.record(&pending.verdict, pending.probe, std::time::Instant::now()) {
                            self.breaker_moved(&moved, &gate);
                        }
                        let holds = self.holds_room_back(&pending.mark.outcome);
                        if let Some(tracker) = &self.tracker {
                            tracker.finished(&pending.mark.event_id, &key, holds);
                        }
                        if holds {
                            // The rest of the room's run must not overtake the event that failed.
                            let rest = buffer.take_room(&key);
                            outstanding.freed(rest.len());
                            self.release(&rest).await;
                        }
                        buffer.done(&key);
                        outstanding.finished();
                        let _ = marks.send(pending);
                    }
                }
                () = shutdown.cancelled(), if buffer.len() > 0 => {
                    let unstarted = buffer.drain();
                    outstanding.freed(unstarted.len());
                    self.release(&unstarted).await;
                }
            }
        }
        let _ = claimer.await;
        // Rows the last claim brought in while shutting down.
        let unstarted = buffer.drain();
        if !unstarted.is_empty() {
            self.release(&unstarted).await;
        }
        drop(marks);
        self.wind_down(recorder, give_up, keeper).await
    }

    /// After the last delivery: lets the recorder write what is left within
    /// `shutdown_grace`, gives up the partitions (once every outcome is written), and says how
    /// the worker ended.
    async fn wind_down(
        &self,
        recorder: tokio::task::JoinHandle<Vec<Pending>>,
        give_up: CancellationToken,
        (keeper, stop): (tokio::task::JoinHandle<()>, CancellationToken),
    ) -> anyhow::Result<()> {
        let grace = self.config.shutdown_grace;
        let give_up_later = {
            let give_up = give_up.clone();
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                give_up.cancel();
            })
        };
        let unwritten = match recorder.await {
            Ok(unwritten) => unwritten,
            Err(e) => {
                tracing::error!(worker = "room_outbox", error = %e, "outcome recorder failed");
                Vec::new()
            }
        };
        give_up_later.abort();
        stop.cancel();
        let _ = keeper.await;
        if unwritten.is_empty() {
            self.leave_partitions().await;
        }
        if !unwritten.is_empty() {
            let ids: Vec<&str> = unwritten.iter().map(|p| p.mark.event_id.as_str()).collect();
            tracing::error!(
                worker = "room_outbox",
                node_id = %self.node_id,
                unwritten = ids.len(),
                event_ids = %ids.join(","),
                "shutdown grace ran out with outcomes unwritten (database unavailable); these rows stay delivering until their lease expires, then any host delivers them again"
            );
            self.signal(Signal::Stopped);
            anyhow::bail!(
                "{} outcome(s) could not be written within outbox_worker.shutdown_grace {}; their rows return to the queue when their leases expire",
                ids.len(),
                crate::units::format_duration(grace)
            );
        }
        tracing::info!(worker = "room_outbox", node_id = %self.node_id, "worker stopped");
        self.signal(Signal::Stopped);
        Ok(())
    }

    /// Keeps the buffer topped up: claims whenever at most one claim's worth is claimed and
    /// not finished, and waits (`wake_up`, `poll_interval`) when the table has no more.
    /// Behind a full claim the next one may grow (see [`sizing`]).
    /// While the sink's circuit breaker is open it claims nothing; half-open, one row for
    /// the probe.
    async fn claim_ahead(
        self: Arc<Self>,
        outstanding: Arc<Outstanding>,
        claims: mpsc::UnboundedSender<(u64, Vec<Claimed>)>,
        mut gate: watch::Receiver<breaker::State>,
        shutdown: CancellationToken,
    ) {
        let lease_ms = self.config.lease.as_millis() as i64;
        let mut size =
            ClaimSize::new(self.claim_size(), self.config.claim_growth_on(self.store.backend()), self.config.lease);
        let mut backoff = Duration::from_millis(100);
        let wake = self.store.inserted();
        let listening = match self.config.wake_up {
            WakeUp::Auto | WakeUp::Notify => self.store.listen_for_inserts(wake.clone(), shutdown.child_token()),
            WakeUp::Probe | WakeUp::Poll => false,
        };
        let probing = self.config.wake_up == WakeUp::Probe || (self.config.wake_up == WakeUp::Auto && !listening);
        tracing::debug!(listening, probing, "idle wake-up");
        while !shutdown.is_cancelled() {
            let state = *gate.borrow_and_update();
            let wanted = match state {
                breaker::State::Closed => size.rows(outstanding.finished_total(), std::time::Instant::now()) as usize,
                breaker::State::HalfOpen => 1,
                breaker::State::Open | breaker::State::Misconfigured => 0,
            };
            // Room for a whole claim: at most one claim's worth ahead of the deliveries
            // (half-open: nothing outstanding but the probe).
            let ahead =
                if state == breaker::State::Closed { outstanding.count() > wanted } else { outstanding.count() > 0 };
            if wanted == 0 || ahead {
                tokio::select! {
                    () = outstanding.space.notified() => {}
                    _ = gate.changed() => {}
                    () = shutdown.cancelled() => break,
                }
                continue;
            }
            // Outcomes the writer has not caught up with are rows still unfinished in the
            // table: read no more until it has (memory stays bounded by the writer's pace).
            if let Some(tracker) = &self.tracker
                && tracker.unrecorded() > wanted + 2 * MAX_MARKS_PER_WRITE
            {
                tokio::select! {
                    () = tracker.recorded.notified() => {}
                    () = shutdown.cancelled() => break,
                }
                continue;
            }
            let asked_at = (std::time::Instant::now(), outstanding.finished_total());
            self.clock.sync(self.store.as_ref()).await;
            let now = self.clock.now_ms();
            let claim = async {
                match &self.tracker {
                    Some(tracker) => self.read_ready(tracker, wanted).await,
                    None => self.claim_rows(wanted, now, now + lease_ms).await,
                }
            };
            // A claim stuck on a database that is away must not hold shutdown past its grace.
            let stuck = async {
                shutdown.cancelled().await;
                tokio::time::sleep(self.config.shutdown_grace).await;
            };
            let rows = tokio::select! {
                rows = claim => rows,
                () = stuck => break,
            };
            let (seq, rows, at_end) = match rows {
                Ok(read) => read,
                Err(e) => {
                    self.metrics.db_error("claim", &e);
                    tracing::warn!(worker = "room_outbox", node_id = %self.node_id, error = %e, retry_in_ms = backoff.as_millis() as u64, "claim failed; will retry");
                    sleep_or_cancel(backoff, &shutdown).await;
                    backoff = (backoff * 2).min(MAX_DB_BACKOFF);
                    continue;
                }
            };
            backoff = Duration::from_millis(100);
            self.metrics.db_ok("claim");
            if rows.is_empty() {
                if at_end {
                    self.signal(Signal::Idle);
                    self.idle_wait(&wake, probing, &shutdown).await;
                }
                continue;
            }
            if shutdown.is_cancelled() {
                // The claim was under way when shutdown began: nothing of it starts.
                self.release(&rows).await;
                break;
            }
            let full = !at_end;
            if state == breaker::State::Closed {
                size.claimed(wanted as u32, rows.len(), asked_at);
            }
            self.note_claim(&rows);
            outstanding.taken(rows.len());
            if claims.send((seq, rows)).is_err() {
                break;
            }
            if !full {
                self.idle_wait(&wake, probing, &shutdown).await;
            }
        }
    }

    /// The rows of a claim or read that go into the buffer: under per-room order, not those
    /// whose room was held back after the read began.
    fn admit(&self, seq: u64, rows: Vec<Claimed>, outstanding: &Outstanding) -> Vec<Claimed> {
        let Some(tracker) = &self.tracker else { return rows };
        let (rows, dropped) = tracker.admit(seq, rows);
        outstanding.freed(dropped);
        rows
    }

    /// Tells the console which rooms wait for their rate limit: when their number changes,
    /// else at most every quarter second.
    fn show_held_rooms(&self, buffer: &Buffer, (at, shown): &mut (std::time::Instant, usize)) {
        let count = buffer.held_count();
        if count != *shown || at.elapsed() >= Duration::from_millis(250) {
            (*at, *shown) = (std::time::Instant::now(), count);
            self.metrics.rooms_held(buffer.held_rooms());
        }
    }

    /// Rows per claim: `batch_size`, or under a rate limit no more than a quarter of a
    /// lease's worth of starts, so that the (at most two) claims waiting in the buffer all
    /// start well within their leases.
    fn claim_size(&self) -> u32 {
        let batch = self.config.batch_size;
        match self.config.rate_limit {
            Some(limit) => {
                let quarter_lease = limit.per_second * self.config.lease.as_secs_f64() / 4.0;
                batch.min((quarter_lease.floor() as u32).max(1))
            }
            None => batch,
        }
    }

    /// Counts a claim and logs its lease rescues.
    fn note_claim(&self, rows: &[Claimed]) {
        let rescued = rows.iter().filter(|c| c.rescued).count();
        self.metrics.claimed(rows.len(), rescued);
        for row in rows.iter().filter(|c| c.rescued) {
            tracing::warn!(
                worker = "room_outbox",
                node_id = %self.node_id,
                event_id = %row.event_id,
                event_type = %row.event_type,
                room_id = %row.room_id,
                retry_count = row.retry_count,
                status = "delivering",
                "reclaimed after another worker's lease expired"
            );
        }
        self.signal(Signal::Claimed(rows.len()));
    }

    /// Starts deliveries while a slot is free, a room's next event is ready, and the rate
    /// limit (if any) has a token. A row whose lease would not outlast its `publish_timeout`
    /// is handed back instead, so a lease never runs out under a healthy delivery. Returns
    /// when the rate limit will have the next token, if it stopped the starts.
    async fn start_ready(
        self: &Arc<Self>,
        buffer: &mut Buffer,
        (running, acks): (&mut JoinSet<(RoomKey, Pending)>, &mut InOrder<Pending>),
        outstanding: &Outstanding,
        mut bucket: Option<&mut TokenBucket>,
        breaker: &mut Breaker,
    ) -> Option<std::time::Instant> {
        let timeout_ms = self.config.publish_timeout.as_millis() as i64;
        let mut late = Vec::new();
        let mut next_token = None;
        while running.len() < self.config.concurrency as usize {
            if let Some(at) = bucket.as_mut().and_then(|b| b.ready(std::time::Instant::now())) {
                next_token = buffer.has_ready().then_some(at);
                break;
            }
            if !buffer.has_ready() {
                break;
            }
            let probe = match breaker.admit() {
                Admit::Any => false,
                Admit::Probe => true,
                Admit::Nothing => break,
            };
            let Some(row) = buffer.start_next() else { break };
            let key = room_of(&row);
            if self
                .tracker
                .as_ref()
                .is_some_and(|t| !t.may_start(row.lease.fence, self.clock.now_ms(), timeout_ms + START_MARGIN_MS))
            {
                // Its partition was lost, or its lease was not renewed in time: the row is
                // read again under a renewed lease, or by the partition's next owner, and the
                // rest of its room with it, so that none of it overtakes the row.
                if probe {
                    breaker.probe_not_run();
                }
                let rest = buffer.take_room(&key);
                buffer.done(&key);
                late.push(row);
                late.extend(rest);
                continue;
            }
            if row.lease.lock_until_ms - self.clock.now_ms() < timeout_ms + START_MARGIN_MS {
                if probe {
                    breaker.probe_not_run();
                }
                buffer.done(&key);
                late.push(row);
                continue;
            }
            if let Some(bucket) = bucket.as_mut() {
                bucket.take();
            }
            let this = self.clone();
            let sink = self.sink.get();
            let turn = acks.started(&key, &row.event_id);
            running.spawn(async move {
                let delivery = AssertUnwindSafe(this.deliver_one(&*sink, &row, turn));
                let (outcome, verdict) = match delivery.catch_unwind().await {
                    Ok(done) => done,
                    Err(panic) => (this.after_panic(&row, panic), Verdict::Neutral),
                };
                let Claimed { id, lease, event_id, .. } = row;
                let mark = Mark { plugin_digest: sink.digest(), id, event_id, lease, outcome };
                (key, Pending { mark, verdict, probe })
            });
        }
        if !late.is_empty() {
            outstanding.freed(late.len());
            self.release(&late).await;
        }
        next_token
    }

    /// Waits `poll_interval` for more work, or less: until an insert is heard (`LISTEN`, or
    /// this process's own store), a probe finds a pending row, or shutdown.
    async fn idle_wait(&self, wake: &tokio::sync::Notify, probing: bool, shutdown: &CancellationToken) {
        let until = tokio::time::Instant::now() + self.config.poll_interval;
        loop {
            let next =
                if probing { (tokio::time::Instant::now() + self.config.probe_interval).min(until) } else { until };
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = wake.notified() => return,
                () = shutdown.cancelled() => return,
            }
            if tokio::time::Instant::now() >= until {
                return;
            }
            // A failing probe is not an outage to report: the next claim will say so.
            if probing && self.store.has_pending().await.unwrap_or(false) {
                return;
            }
        }
    }

    /// A delivery task panicked (a host bug, never the sink's doing: sink faults are caught
    /// in the sandbox). The row must not stay `delivering`: record a retryable attempt.
    fn after_panic(&self, row: &Claimed, panic: Box<dyn std::any::Any + Send>) -> Outcome {
        let (event_id, attempt) = (row.event_id.as_str(), row.retry_count.saturating_add(1));
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let error = short_error(&format!("host panicked while delivering: {}", printable(&what, 300)));
        self.metrics.delivery_panic();
        self.metrics.failed(&row.event_type, FailureClass::Trap.as_str(), None);
        tracing::error!(worker = "room_outbox", node_id = %self.node_id, event_id, attempt, error, "delivery task panicked; recorded as retryable");
        let next_retry_at_ms = self.clock.now_ms().saturating_add(retry::millis(self.config.retry_interval));
        Outcome::Retry { error, next_retry_at_ms }
    }

    /// Rows that will not start here: under per-room order forgotten, to be read again;
    /// claimed rows handed back (see `claims.rs`).
    async fn release(&self, rows: &[Claimed]) {
        if rows.is_empty() {
            return;
        }
        match &self.tracker {
            Some(tracker) => tracker.forget(rows),
            None => self.hand_back(rows).await,
        }
    }

    /// Whether, under per-room order, this outcome holds its room's later events back: a
    /// retry or a deferral, or a failure when `failed_blocks_room`.
    fn holds_room_back(&self, outcome: &Outcome) -> bool {
        self.config.ordering == RoomOrdering::PerRoom
            && match outcome {
                Outcome::Delivered => false,
                Outcome::Retry { .. } | Outcome::Defer { .. } => true,
                Outcome::Fail { .. } => self.config.failed_blocks_room,
            }
    }

    /// The circuit breaker moved: log it, export it, and tell the claimer.
    fn breaker_moved(&self, moved: &Transition, gate: &watch::Sender<breaker::State>) {
        let cool_down_ms = moved.cool_down.map(retry::millis);
        let next_probe_at_ms = cool_down_ms.map(|ms| now_ms().saturating_add(ms));
        self.metrics.breaker_moved(moved.to, &moved.reason, next_probe_at_ms);
        let current = self.sink.get();
        let (state, reason, sink) = (moved.to.as_str(), moved.reason.as_str(), current.name());
        match moved.to {
            breaker::State::Open => tracing::warn!(
                worker = "room_outbox",
                node_id = %self.node_id,
                sink,
                state,
                reason,
                cool_down_ms,
                "sink circuit breaker open: deliveries paused, waiting rows are not attempted"
            ),
            breaker::State::Misconfigured => tracing::error!(
                worker = "room_outbox",
                node_id = %self.node_id,
                sink,
                state,
                reason,
                cool_down_ms,
                "sink misconfigured: deliveries paused, waiting rows keep their attempts; fix the config and restart (a probe retries after the cool-down)"
            ),
            breaker::State::HalfOpen => {
                tracing::info!(worker = "room_outbox", node_id = %self.node_id, sink, state, reason, "sink circuit breaker half-open: one probe delivery")
            }
            breaker::State::Closed => {
                tracing::info!(worker = "room_outbox", node_id = %self.node_id, sink, state, reason, "sink circuit breaker closed: delivering again")
            }
        }
        gate.send_replace(moved.to);
    }

    /// Delivers one row through `sink` and decides its outcome (see `attempt.rs`).
    async fn deliver_one(&self, sink: &dyn Deliver, row: &Claimed, turn: Turn) -> (Outcome, Verdict) {
        attempt::deliver_one(sink, (&self.config, &self.metrics, &self.node_id, &self.clock), row, turn).await
    }

    /// Writes a batch of outcomes: under their row leases (`claims.rs`), or fenced by
    /// partition under per-room order (`owner.rs`).
    async fn write(&self, marks: &[Mark]) -> Result<u64, crate::store::StoreError> {
        let now = self.clock.now_ms();
        match self.tracker {
            Some(_) => self.write_owned(marks, now).await,
            None => self.write_claimed(marks, now).await,
        }
    }

    /// Writes outcomes as they arrive, several per write when they queue up, retrying
    /// while the database is unavailable.
    ///
    /// Once `give_up` is cancelled (shutdown's grace has run out) it stops retrying and
    /// returns the outcomes it could not write.
    async fn record(
        self: Arc<Self>,
        mut rx: mpsc::UnboundedReceiver<Pending>,
        give_up: CancellationToken,
    ) -> Vec<Pending> {
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            while batch.len() < MAX_MARKS_PER_WRITE {
                match rx.try_recv() {
                    Ok(pending) => batch.push(pending),
                    Err(_) => break,
                }
            }
            let marks: Vec<Mark> = batch.iter().map(|p| p.mark.clone()).collect();
            let mut backoff = Duration::from_millis(100);
            loop {
                let written = tokio::select! {
                    written = self.write(&marks) => written,
                    () = give_up.cancelled() => Err(crate::store::StoreError::Unavailable("shutdown grace ran out".into())),
                };
                match written {
                    Ok(_) => {
                        self.metrics.db_ok("mark");
                        if let Some(tracker) = &self.tracker {
                            tracker.written(&marks);
                        }
                        // A finished event makes its room's next one claimable: claim again
                        // now rather than at the next poll.
                        if self.tracker.is_some() {
                            self.store.inserted().notify_one();
                        }
                        break;
                    }
                    Err(_) if give_up.is_cancelled() => {
                        rx.close();
                        while let Ok(pending) = rx.try_recv() {
                            batch.push(pending);
                        }
                        return batch;
                    }
                    Err(e) => {
                        self.metrics.db_error("mark", &e);
                        tracing::warn!(worker = "room_outbox", node_id = %self.node_id, error = %e, outcomes = batch.len(), "could not record outcomes; will retry");
                        tokio::select! {
                            () = tokio::time::sleep(backoff) => {}
                            () = give_up.cancelled() => {}
                        }
                        backoff = (backoff * 2).min(MAX_DB_BACKOFF);
                    }
                }
            }
            self.signal(Signal::Recorded(batch.len()));
        }
        Vec::new()
    }
}

/// Sleeps until `at`, or forever when there is none (a `select!` arm that never fires).
async fn sleep_until_or_never(at: Option<std::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

/// While the breaker is open for a destination found unavailable (since then): until the
/// sink sees it answer again; otherwise never.
async fn seen_back(unavailable: Option<(Arc<dyn Deliver>, std::time::Instant)>) {
    match unavailable {
        Some((sink, since)) => sink.reached_since(since).await,
        None => std::future::pending().await,
    }
}

async fn sleep_or_cancel(duration: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(duration) => {}
        _ = shutdown.cancelled() => {}
    }
}

/// Rows claimed and not yet finished, shared by the claimer (which adds) and the deliveries
/// (which free); the claimer waits for space. Also counts the deliveries that finished, for
/// the claimer's sizing.
#[derive(Default)]
struct Outstanding {
    outstanding: std::sync::atomic::AtomicUsize,
    finished: std::sync::atomic::AtomicU64,
    space: tokio::sync::Notify,
}

impl Outstanding {
    fn count(&self) -> usize {
        self.outstanding.load(std::sync::atomic::Ordering::Acquire)
    }

    fn taken(&self, rows: usize) {
        self.outstanding.fetch_add(rows, std::sync::atomic::Ordering::AcqRel);
    }

    /// A delivery finished: its row is freed and counted.
    fn finished(&self) {
        self.finished.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.freed(1);
    }

    fn finished_total(&self) -> u64 {
        self.finished.load(std::sync::atomic::Ordering::Acquire)
    }

    fn freed(&self, rows: usize) {
        if rows > 0 {
            self.outstanding.fetch_sub(rows, std::sync::atomic::Ordering::AcqRel);
            self.space.notify_one();
        }
    }
}
