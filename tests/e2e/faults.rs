//! The deterministic fault harness (issue 47, decision 0199): hosts of the real engine, the
//! real fake sink in wasmtime and a real database, each host's store wrapped so that at
//! named steps (a page read, an outcome write, a heartbeat, giving partitions up, a sweep's
//! ceiling) it fails the statement, delays it, loses the answer of one that committed, or
//! pauses the whole host's database traffic past its leases. Producers whose clocks run up
//! to 5 s ahead of or behind the database's write multi-row INSERTs while the hosts read,
//! so rows commit out of `created_at` order. Hosts start at different times and one may
//! stop mid-drain.
//!
//! A seed names a schedule (what the producers write, when the hosts start and stop, which
//! faults fire at which call); the same seed makes the same schedule. After each schedule:
//! every event delivered, each room's first arrivals in the order the room's events were
//! written, and no event delivered twice unless the schedule paused a host (its leases
//! lapse, and what it had in flight is delivered again by the next owner, by design).
//!
//! `make test` runs [`SHORT`] seeds per database; `make soak` runs `OUTBOX_FAULT_SCHEDULES`
//! of them. `OUTBOX_FAULT_SEED=<seed>` replays one; a failure prints its seed and schedule.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_host::config::Config;
use outbox_host::engine::Worker;
use outbox_host::ops::metrics::Metrics;
use outbox_host::sandbox::SinkRuntime;
use outbox_host::store::schema::TableInfo;
use outbox_host::store::{
    Backend, Claimed, Claims, Heartbeat, Held, Holding, Inspection, KeyValue, Mark, Migrated, Minute, NewEvent,
    OwnedRead, OwnerView, Page, Partitions, Producer, RegisteredSink, ReplayFilter, RetryFilter, Row, Schema,
    SinkRegistry, Stats, Status, Step as CopyStep, Store, StoreError,
};
use outbox_test_support::Collector;
use tokio_util::sync::CancellationToken;

use crate::support::{World, fake_sink_to, per_backend};

per_backend!(
    seeded_fault_schedules_lose_nothing_and_keep_room_order,
    seeded_fault_schedules_lose_nothing_and_keep_room_order_for_a_consumer
);

/// Schedules per database in `make test`.
const SHORT: u64 = 24;
/// Of them, for a sink after the first (each waits out the settle horizon at its end).
const SHORT_CONSUMER: u64 = 8;
/// Schedules run at once (each on a table of its own).
const AT_ONCE: usize = 2;
/// How long one schedule may take to deliver everything.
const DRAIN_LIMIT: Duration = Duration::from_secs(90);

/// The worker settings of every host: short leases, so that a paused host loses its
/// partitions within a few seconds, and few partitions, so that they change hands often.
const WORKER: &str = "ordering: per_room\nbatch_size: 20\nconcurrency: 8\npublish_timeout: 500ms\n\
                      partition_lease: 3s\npoll_interval: 100ms\npartitions: 8\nshutdown_grace: 5s";
/// The partition lease above.
const LEASE_MS: u64 = 3_000;

async fn seeded_fault_schedules_lose_nothing_and_keep_room_order(world: World) {
    run_schedules(world, false).await
}

/// The same schedules, delivering a sink after the first: a consumer of the outbox with its
/// positions and exceptions (issue 48).
async fn seeded_fault_schedules_lose_nothing_and_keep_room_order_for_a_consumer(world: World) {
    run_schedules(world, true).await
}

async fn run_schedules(world: World, consumer: bool) {
    let seeds: Vec<u64> = match std::env::var("OUTBOX_FAULT_SEED") {
        Ok(seed) => vec![seed.parse().expect("OUTBOX_FAULT_SEED is a number")],
        Err(_) => {
            let count = std::env::var("OUTBOX_FAULT_SCHEDULES").ok().and_then(|n| n.parse().ok()).unwrap_or(SHORT);
            // A consumer's schedule waits out the settle time at its end: an eighth as many.
            let count = if consumer { count.div_ceil(8).max(SHORT_CONSUMER) } else { count };
            // Each database its own seeds, the same on every run.
            let base = match Backend::from_url(&world.db_url()).expect("a database URL") {
                Backend::Sqlite => 1_000,
                Backend::Postgres => 2_000,
                Backend::Mysql => 3_000,
            };
            (base..base + count).collect()
        }
    };
    let harness = Arc::new(Harness::new(world, consumer).await);
    let mut failures = Vec::new();
    let mut duplicates = 0;
    for chunk in seeds.chunks(AT_ONCE) {
        let runs: Vec<_> = chunk
            .iter()
            .map(|seed| {
                let harness = harness.clone();
                let seed = *seed;
                tokio::spawn(async move { (seed, harness.run(seed).await) })
            })
            .collect();
        for run in runs {
            match run.await.expect("a schedule's task") {
                (_, Ok(made)) => duplicates += made,
                (seed, Err(why)) => failures.push(format!("seed {seed}: {why}\n  replay: OUTBOX_FAULT_SEED={seed}")),
            }
        }
    }
    let backend = Backend::from_url(&harness.world.db_url()).expect("a database URL");
    let sink = if consumer { "a sink after the first" } else { "the first sink" };
    println!(
        "{} schedules on {backend:?}, {sink}: {duplicates} duplicate deliveries, all after a paused or killed host",
        seeds.len()
    );
    assert!(failures.is_empty(), "{} of {} schedules failed:\n{}", failures.len(), seeds.len(), failures.join("\n"));
}

/// A small seeded generator (xorshift64*): a seed names one schedule on every machine.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// In `low..=high`.
    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Where a fault fires: a host's store call of this kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Point {
    /// A page of the owned partitions' rows.
    Read,
    /// A batch of outcomes, fenced by the partitions' epochs.
    Write,
    /// A heartbeat: renew, give up, take.
    Heartbeat,
    /// Giving every partition up at a clean stop.
    Leave,
    /// A sweep's ceiling (the newest key).
    Ceiling,
}

const POINTS: [Point; 5] = [Point::Read, Point::Write, Point::Heartbeat, Point::Leave, Point::Ceiling];

/// What a fault does.
#[derive(Clone, Copy, Debug)]
enum Action {
    /// The statement fails (the database away for it).
    Fail,
    /// The statement waits this long first.
    Delay(u64),
    /// The statement commits, and its answer is lost: the host sees a failure.
    LostAck,
    /// Every database call of the host waits this long from here (a stopped process, a
    /// network partition): its leases lapse.
    Pause(u64),
}

#[derive(Clone, Debug)]
struct Fault {
    host: usize,
    point: Point,
    /// Which call of that kind (1: the first).
    nth: u32,
    action: Action,
}

#[derive(Debug)]
struct Writer {
    /// Its clock against the database's.
    offset_ms: i64,
    rooms: Vec<String>,
    events: usize,
    /// Rows per INSERT, at most.
    batch: usize,
    /// Pause between INSERTs, at most.
    gap_ms: u64,
}

#[derive(Debug)]
struct Schedule {
    /// When each host starts, from the schedule's start.
    starts_ms: Vec<u64>,
    /// A host that stops cleanly (SIGTERM) mid-drain, and when.
    stop: Option<(usize, u64)>,
    /// Hosts killed (SIGKILL: every task dropped where it is, nothing written, leases left
    /// to lapse), when, and how long after a new host starts in its place.
    kills: Vec<(usize, u64, u64)>,
    writers: Vec<Writer>,
    faults: Vec<Fault>,
}

impl Schedule {
    fn of(seed: u64) -> Schedule {
        let mut rng = Rng::new(seed);
        let hosts = rng.between(2, 3) as usize;
        let starts_ms = (0..hosts).map(|i| if i == 0 { 0 } else { rng.between(0, 1_500) }).collect();
        let stop = rng.chance(30).then(|| (rng.between(0, hosts as u64 - 1) as usize, rng.between(300, 2_000)));
        let kills = if rng.chance(40) {
            (0..rng.between(1, 3))
                .map(|_| (rng.between(0, hosts as u64 - 1) as usize, rng.between(200, 2_500), rng.between(100, 1_500)))
                .collect()
        } else {
            Vec::new()
        };
        let rooms_each = rng.between(3, 12);
        let writers = (0..rng.between(2, 3))
            .map(|w| Writer {
                offset_ms: rng.between(0, 10_000) as i64 - 5_000,
                rooms: (0..rooms_each).map(|r| format!("w{w}-r{r}")).collect(),
                events: rng.between(60, 160) as usize,
                batch: rng.between(1, 40) as usize,
                gap_ms: rng.between(0, 120),
            })
            .collect();
        let faults = (0..rng.between(0, 5))
            .map(|_| {
                let point = POINTS[rng.between(0, POINTS.len() as u64 - 1) as usize];
                let action = match rng.between(0, 99) {
                    0..=34 => Action::Fail,
                    35..=69 => Action::Delay(rng.between(20, 800)),
                    70..=89 if point == Point::Write => Action::LostAck,
                    70..=89 => Action::Fail,
                    _ => Action::Pause(LEASE_MS * 3 / 2),
                };
                Fault { host: rng.between(0, hosts as u64 - 1) as usize, point, nth: rng.between(1, 30) as u32, action }
            })
            .collect();
        Schedule { starts_ms, stop, kills, writers, faults }
    }

    /// Whether a fault may make an event go out twice: a paused host's leases lapse while
    /// its deliveries are under way; a killed host's deliveries were under way.
    fn may_duplicate(&self) -> bool {
        !self.kills.is_empty() || self.faults.iter().any(|f| matches!(f.action, Action::Pause(_)))
    }
}

/// One host's faults, the calls it has made of each kind, and whether it is paused.
struct HostFaults {
    faults: Vec<Fault>,
    calls: Mutex<HashMap<Point, u32>>,
    paused_until: Mutex<Option<tokio::time::Instant>>,
}

impl HostFaults {
    fn new(faults: Vec<Fault>) -> Arc<HostFaults> {
        Arc::new(HostFaults { faults, calls: Mutex::default(), paused_until: Mutex::default() })
    }

    /// Before a call at `point`: waits out a pause, then applies the faults of this call.
    /// `Ok(true)`: make the call, then fail it (a lost answer).
    async fn before(&self, point: Option<Point>) -> Result<bool, StoreError> {
        let paused = *self.paused_until.lock().unwrap();
        if let Some(until) = paused {
            tokio::time::sleep_until(until).await;
        }
        let Some(point) = point else { return Ok(false) };
        let nth = {
            let mut calls = self.calls.lock().unwrap();
            let n = calls.entry(point).or_insert(0);
            *n += 1;
            *n
        };
        let mut lose_answer = false;
        for fault in self.faults.iter().filter(|f| f.point == point && f.nth == nth) {
            match fault.action {
                Action::Fail => return Err(StoreError::Unavailable(format!("fault harness: {point:?} #{nth} fails"))),
                Action::Delay(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                Action::LostAck => lose_answer = true,
                Action::Pause(ms) => {
                    let until = tokio::time::Instant::now() + Duration::from_millis(ms);
                    *self.paused_until.lock().unwrap() = Some(until);
                    tokio::time::sleep_until(until).await;
                }
            }
        }
        Ok(lose_answer)
    }

    /// Runs `call` at `point` under this host's faults.
    async fn at<T>(
        &self,
        point: Option<Point>,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let lose_answer = self.before(point).await?;
        let answer = call.await?;
        if lose_answer {
            return Err(StoreError::Unavailable("fault harness: the answer was lost after the commit".into()));
        }
        Ok(answer)
    }
}

/// A real store behind a host's faults.
struct Faulty {
    inner: Arc<dyn Store>,
    faults: Arc<HostFaults>,
}

#[async_trait]
impl Schema for Faulty {
    async fn migrate(&self) -> Result<Migrated, StoreError> {
        self.inner.migrate().await
    }
    fn backend(&self) -> Backend {
        self.inner.backend()
    }
    async fn describe(&self) -> Result<Option<TableInfo>, StoreError> {
        self.inner.describe().await
    }
    fn table(&self) -> &str {
        self.inner.table()
    }
    async fn ping(&self) -> Result<(), StoreError> {
        self.faults.at(None, self.inner.ping()).await
    }
    async fn clock_ms(&self) -> Result<i64, StoreError> {
        self.faults.at(None, self.inner.clock_ms()).await
    }
    async fn close(&self) {
        self.inner.close().await
    }
}

#[async_trait]
impl Claims for Faulty {
    async fn claim(&self, worker_id: &str, now_ms: i64, until: i64, limit: u32) -> Result<Vec<Claimed>, StoreError> {
        self.faults.at(Some(Point::Read), self.inner.claim(worker_id, now_ms, until, limit)).await
    }
    async fn mark(&self, marks: &[Mark], now_ms: i64) -> Result<u64, StoreError> {
        self.faults.at(Some(Point::Write), self.inner.mark(marks, now_ms)).await
    }
    async fn release(&self, rows: &[Held], now_ms: i64) -> Result<u64, StoreError> {
        self.faults.at(None, self.inner.release(rows, now_ms)).await
    }
    async fn has_pending(&self) -> Result<bool, StoreError> {
        self.faults.at(None, self.inner.has_pending()).await
    }
    fn is_consumer(&self) -> bool {
        self.inner.is_consumer()
    }
    fn inserted(&self) -> Arc<tokio::sync::Notify> {
        self.inner.inserted()
    }
    fn listen_for_inserts(&self, wake: Arc<tokio::sync::Notify>, stop: CancellationToken) -> bool {
        self.inner.listen_for_inserts(wake, stop)
    }
}

#[async_trait]
impl Producer for Faulty {
    async fn insert(&self, events: &[NewEvent]) -> Result<(), StoreError> {
        self.inner.insert(events).await
    }
}

#[async_trait]
impl Inspection for Faulty {
    async fn get(&self, event_id: &str) -> Result<Option<Row>, StoreError> {
        self.inner.get(event_id).await
    }
    async fn stats(&self) -> Result<Stats, StoreError> {
        self.faults.at(None, self.inner.stats()).await
    }
    async fn history(&self, since_ms: i64) -> Result<Vec<Minute>, StoreError> {
        self.inner.history(since_ms).await
    }
    async fn recent_failures(&self, limit: u32) -> Result<Vec<Row>, StoreError> {
        self.inner.recent_failures(limit).await
    }
    async fn neighbours(&self, row: &Row) -> Result<[Option<Row>; 2], StoreError> {
        self.inner.neighbours(row).await
    }
    async fn search(&self, search: &outbox_host::store::Search) -> Result<outbox_host::store::Found, StoreError> {
        self.inner.search(search).await
    }
    async fn count_failed(&self, filter: &RetryFilter) -> Result<i64, StoreError> {
        self.inner.count_failed(filter).await
    }
    async fn retry_failed(&self, filter: &RetryFilter, now_ms: i64) -> Result<u64, StoreError> {
        self.inner.retry_failed(filter, now_ms).await
    }
    async fn purge_delivered(&self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
        self.inner.purge_delivered(before_ms, limit).await
    }
}

#[async_trait]
impl SinkRegistry for Faulty {
    async fn sinks(&self) -> Result<Vec<RegisteredSink>, StoreError> {
        self.inner.sinks().await
    }
    async fn register_sink(
        &self,
        name: &str,
        start_from_ms: i64,
        may_be_first: bool,
        now_ms: i64,
    ) -> Result<RegisteredSink, StoreError> {
        self.inner.register_sink(name, start_from_ms, may_be_first, now_ms).await
    }
    async fn sink_store(self: Arc<Self>, sink: &RegisteredSink) -> Result<Arc<dyn Store>, StoreError> {
        let inner = self.inner.clone().sink_store(sink).await?;
        Ok(Arc::new(Faulty { inner, faults: self.faults.clone() }))
    }
    async fn count_replayable(&self, filter: &ReplayFilter) -> Result<i64, StoreError> {
        self.inner.count_replayable(filter).await
    }
    async fn replay(
        &self,
        filter: &ReplayFilter,
        now_ms: i64,
        after: Option<KeyValue>,
        limit: u32,
    ) -> Result<CopyStep, StoreError> {
        self.inner.replay(filter, now_ms, after, limit).await
    }

    async fn discard(
        &self,
        filter: &ReplayFilter,
        reason: &str,
        now_ms: i64,
        after: Option<KeyValue>,
        limit: u32,
    ) -> Result<CopyStep, StoreError> {
        self.inner.discard(filter, reason, now_ms, after, limit).await
    }
}

#[async_trait]
impl outbox_host::store::Consumers for Faulty {
    async fn positions(
        &self,
        sink: &RegisteredSink,
        parts: &[u32],
    ) -> Result<Vec<outbox_host::store::Position>, StoreError> {
        self.inner.positions(sink, parts).await
    }
    async fn read_consumer(
        &self,
        sink: &RegisteredSink,
        read: &OwnedRead<'_>,
        finished: &outbox_host::store::Finished<'_>,
    ) -> Result<Page, StoreError> {
        self.inner.read_consumer(sink, read, finished).await
    }
    async fn settle(&self, settle: &outbox_host::store::Settle<'_>) -> Result<outbox_host::store::Settled, StoreError> {
        self.inner.settle(settle).await
    }
    async fn consumer_from_copy(&self, sink: &RegisteredSink, now_ms: i64) -> Result<Option<u64>, StoreError> {
        self.inner.consumer_from_copy(sink, now_ms).await
    }
}

#[async_trait]
impl Partitions for Faulty {
    async fn keep_partitions(&self, beat: &Heartbeat<'_>) -> Result<Holding, StoreError> {
        self.faults.at(Some(Point::Heartbeat), self.inner.keep_partitions(beat)).await
    }
    async fn read_owned(&self, read: &OwnedRead<'_>) -> Result<Page, StoreError> {
        self.faults.at(Some(Point::Read), self.inner.read_owned(read)).await
    }
    async fn newest_key(&self) -> Result<Option<i64>, StoreError> {
        self.faults.at(Some(Point::Ceiling), self.inner.newest_key()).await
    }
    async fn index_partitions(&self, total: u32) -> Result<bool, StoreError> {
        self.inner.index_partitions(total).await
    }
    async fn failed_rooms(&self, rooms: &[(String, String)]) -> Result<Vec<(String, String, i64)>, StoreError> {
        self.faults.at(None, self.inner.failed_rooms(rooms)).await
    }
    async fn mark_owned(&self, owner: &str, marks: &[Mark], now_ms: i64) -> Result<(u64, Vec<usize>), StoreError> {
        self.faults.at(Some(Point::Write), self.inner.mark_owned(owner, marks, now_ms)).await
    }
    async fn leave_partitions(&self, owner: &str) -> Result<(), StoreError> {
        self.faults.at(Some(Point::Leave), self.inner.leave_partitions(owner)).await
    }
    async fn announce(
        &self,
        owner: &str,
        ordering: &str,
        now_ms: i64,
        until_ms: i64,
    ) -> Result<Vec<(String, String)>, StoreError> {
        self.faults.at(Some(Point::Heartbeat), self.inner.announce(owner, ordering, now_ms, until_ms)).await
    }
    async fn partition_owners(&self, now_ms: i64) -> Result<Vec<OwnerView>, StoreError> {
        self.inner.partition_owners(now_ms).await
    }
    async fn set_partitions(&self, total: u32, now_ms: i64) -> Result<Result<u32, Vec<String>>, StoreError> {
        self.inner.set_partitions(total, now_ms).await
    }
}

/// One run of a host: which host of the schedule, its clean stop, its kill, and how it ended.
type Incarnation = (usize, CancellationToken, CancellationToken, tokio::sync::oneshot::Receiver<Result<(), String>>);

/// What every schedule of one database shares: the database, one collector and one loaded
/// sink (the events of each schedule are its own, so its reports are told apart by id).
struct Harness {
    world: World,
    collector: Collector,
    config: Config,
    /// The hosts deliver a second sink, `audit`, a consumer of the outbox.
    consumer: bool,
}

impl Harness {
    async fn new(world: World, consumer: bool) -> Harness {
        let collector = Collector::start().await;
        let config = world.setup_with(WORKER, &fake_sink_to("fake", &collector, "")).parse();
        // Loaded once here, so that every host after finds it compiled in the cache.
        let worker = &config.sinks[0].worker;
        let metrics = Arc::new(Metrics::new("fake"));
        SinkRuntime::load_checked(&config.sinks[0].sandbox, worker.concurrency, worker.publish_timeout, metrics)
            .await
            .expect("the fake sink loads");
        Harness { world, collector, config, consumer }
    }

    /// Runs the schedule of `seed` on a table of its own; the duplicate deliveries it made.
    async fn run(&self, seed: u64) -> Result<usize, String> {
        let schedule = Schedule::of(seed);
        let said = |why: String| format!("{why}\n  schedule: {schedule:?}");
        let table = format!("fh_{seed}");
        let url = self.world.db_url();
        let store = outbox_host::store::open(&url, 2, &table).await.map_err(|e| said(e.to_string()))?;
        let migrated = store.migrate().await.map_err(|e| said(e.to_string()))?;
        let mut config = self.config.clone();
        config.table = table.clone();
        let registered = outbox_host::app::register_sinks(&config, store.as_ref(), migrated)
            .await
            .map_err(|e| said(format!("{e:#}")))?;
        let first = registered.into_iter().next().expect("one sink");
        // The sink the hosts deliver, and its view of the outbox.
        let (sink, view) = if self.consumer {
            let audit = store
                .register_sink("audit", 0, false, outbox_host::store::now_ms())
                .await
                .map_err(|e| said(e.to_string()))?;
            (audit.clone(), store.clone().sink_store(&audit).await.map_err(|e| said(e.to_string()))?)
        } else {
            (first, store.clone())
        };

        let started = tokio::time::Instant::now();
        // The writers: each its own rooms, its own clock, INSERTs of several rows at once.
        let mut written: Vec<tokio::task::JoinHandle<Vec<NewEvent>>> = Vec::new();
        for (w, writer) in schedule.writers.iter().enumerate() {
            let producer = outbox_host::store::open(&url, 1, &table).await.map_err(|e| said(e.to_string()))?;
            let (offset, rooms, events, batch, gap) =
                (writer.offset_ms, writer.rooms.clone(), writer.events, writer.batch, writer.gap_ms);
            let mut rng = Rng::new(seed ^ (w as u64 + 1) << 32);
            let template = self.world.event("RoomGiftSent", "room", Status::Pending);
            written.push(tokio::spawn(async move {
                let mut all = Vec::with_capacity(events);
                let mut last_ms = 0;
                while all.len() < events {
                    let n = (rng.between(1, batch as u64) as usize).min(events - all.len());
                    let now = outbox_host::store::now_ms() + offset;
                    let rows: Vec<NewEvent> = (0..n)
                        .map(|_| {
                            last_ms = now.max(last_ms + 1);
                            let room = &rooms[rng.between(0, rooms.len() as u64 - 1) as usize];
                            let id = format!("evt-{seed}-{w}-{}", all.len());
                            let mut event = event_like(&template, &id, room);
                            event.created_at_ms = last_ms;
                            all.push(event.clone());
                            event
                        })
                        .collect();
                    producer.insert(&rows).await.expect("a writer's INSERT");
                    tokio::time::sleep(Duration::from_millis(rng.between(0, gap))).await;
                }
                producer.close().await;
                all
            }));
        }

        // The hosts, each starting when the schedule says, one perhaps stopping early, some
        // killed and started again.
        let hosts: Arc<Mutex<Vec<Incarnation>>> = Arc::default();
        let mut lives = Vec::new();
        for (i, start_ms) in schedule.starts_ms.iter().enumerate() {
            let at = started + Duration::from_millis(*start_ms);
            let stop_at = schedule.stop.filter(|(host, _)| *host == i).map(|(_, ms)| at + Duration::from_millis(ms));
            lives.push((i, at, stop_at));
        }
        for (i, at, stop_at) in lives {
            let host = self.host(&schedule, i, &url, &table, &sink, &config, at, stop_at);
            hosts.lock().unwrap().push(host);
        }
        let mut killers = Vec::new();
        for (i, kill_ms, back_ms) in schedule.kills.iter().copied() {
            let kill_at = started + Duration::from_millis(kill_ms);
            let back_at = kill_at + Duration::from_millis(back_ms);
            let host = self.host(&schedule, i, &url, &table, &sink, &config, back_at, None);
            let hosts = hosts.clone();
            killers.push(tokio::spawn(async move {
                tokio::time::sleep_until(kill_at).await;
                // Every incarnation of host `i` so far (one started by an earlier kill and not
                // running yet dies before it starts).
                let mut hosts = hosts.lock().unwrap();
                for (_, _, kill, _) in hosts.iter().filter(|(of, ..)| *of == i) {
                    kill.cancel();
                }
                hosts.push(host);
            }));
        }
        let mut events = Vec::new();
        for writer in written {
            events.extend(writer.await.map_err(|e| said(format!("a writer: {e}")))?);
        }
        // A host that stopped early leaves the rest to the others; if every host stopped,
        // the schedule says nothing is left to deliver them: none does.
        let deadline = tokio::time::Instant::now() + DRAIN_LIMIT;
        loop {
            let delivered = view.stats().await.map(|s| s.count(Status::Delivered)).unwrap_or(0);
            if delivered == events.len() as i64 {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(said(format!("{delivered} of {} delivered after {DRAIN_LIMIT:?}", events.len())));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for killer in killers {
            killer.await.map_err(|e| said(format!("a killer: {e}")))?;
        }
        let hosts = std::mem::take(&mut *hosts.lock().unwrap());
        for (_, stop, ..) in &hosts {
            stop.cancel();
        }
        for (_, _, _, ended) in hosts {
            match tokio::time::timeout(Duration::from_secs(30), ended).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => return Err(said(format!("a host ended with {e}"))),
                Ok(Err(_)) => return Err(said("a host's thread ended without a word".into())),
                Err(_) => return Err(said("a host did not stop within 30 s".into())),
            }
        }
        store.close().await;
        self.judge(&schedule, &events).map_err(said)
    }

    /// Host `i`'s next incarnation: a thread with a runtime of its own, its own connections,
    /// its own instance of the sink and its faults, started at `at` and, if `stop_at`,
    /// stopped cleanly then. Killing it drops the runtime: every task of the host (its
    /// deliveries, its heartbeat) ends where it is and its connections close, as with
    /// SIGKILL.
    #[allow(clippy::too_many_arguments)]
    fn host(
        &self,
        schedule: &Schedule,
        i: usize,
        url: &str,
        table: &str,
        sink: &RegisteredSink,
        config: &Config,
        at: tokio::time::Instant,
        stop_at: Option<tokio::time::Instant>,
    ) -> Incarnation {
        let faults = HostFaults::new(schedule.faults.iter().filter(|f| f.host == i).cloned().collect());
        let (url, table, sink, config) = (url.to_string(), table.to_string(), sink.clone(), config.clone());
        let (stop, kill) = (CancellationToken::new(), CancellationToken::new());
        let (until, killed) = (stop.clone(), kill.clone());
        let (done, ended) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            let outcome = runtime.block_on(async move {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = killed.cancelled() => return Ok(()),
                }
                let inner = outbox_host::store::open(&url, 3, &table).await.map_err(|e| e.to_string())?;
                // The faults sit between the engine and the sink's store (a consumer's own
                // calls to the outbox go round them).
                let faulty: Arc<dyn Store> = Arc::new(Faulty { inner, faults });
                let sink_store = faulty.sink_store(&sink).await.map_err(|e| e.to_string())?;
                let worker_config = config.sinks[0].worker.clone();
                let metrics = Arc::new(Metrics::new("fake"));
                let sink = SinkRuntime::load_checked(
                    &config.sinks[0].sandbox,
                    worker_config.concurrency,
                    worker_config.publish_timeout,
                    metrics.clone(),
                )
                .await
                .map_err(|e| format!("{e:#}"))?;
                let worker = Worker::new(sink_store.clone(), Arc::new(sink), worker_config, &format!("fh{i}"), metrics);
                if let Some(stop_at) = stop_at {
                    let early = until.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep_until(stop_at).await;
                        early.cancel();
                    });
                }
                let ended = tokio::select! {
                    ran = worker.run(until) => ran.map_err(|e| format!("{e:#}")),
                    () = killed.cancelled() => Ok(()),
                };
                sink_store.close().await;
                ended
            });
            // Every task the host spawned ends with its runtime.
            drop(runtime);
            let _ = done.send(outcome);
        });
        (i, stop, kill, ended)
    }

    /// Every event reached the sink; each room's first arrivals are in the order its events
    /// were written; none went out twice unless a host was paused. Returns the duplicates.
    fn judge(&self, schedule: &Schedule, events: &[NewEvent]) -> Result<usize, String> {
        let ours: HashMap<&str, &str> = events.iter().map(|e| (e.event_id.as_str(), e.room_id.as_str())).collect();
        let mut first: HashMap<&str, Vec<&str>> = HashMap::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        let reports = self.collector.reports();
        for report in reports.iter().filter(|r| ours.contains_key(r.event_id.as_str())) {
            let n = seen.entry(report.event_id.clone()).or_insert(0);
            *n += 1;
            if *n == 1 {
                first.entry(ours[report.event_id.as_str()]).or_default().push(report.event_id.as_str());
            }
        }
        let missing = events.iter().filter(|e| !seen.contains_key(&e.event_id)).count();
        if missing > 0 {
            return Err(format!("{missing} event(s) delivered in the table never reached the sink"));
        }
        let mut written: HashMap<&str, Vec<&str>> = HashMap::new();
        for e in events {
            written.entry(e.room_id.as_str()).or_default().push(e.event_id.as_str());
        }
        let out_of_order: Vec<String> = written
            .iter()
            .filter(|(room, ids)| first.get(*room) != Some(*ids))
            .map(|(room, ids)| format!("{room}: written {ids:?}, first arrivals {:?}", first.get(*room)))
            .collect();
        if !out_of_order.is_empty() {
            return Err(format!("{} room(s) out of order:\n    {}", out_of_order.len(), out_of_order.join("\n    ")));
        }
        let duplicates: usize = seen.values().map(|n| n - 1).sum();
        if duplicates > 0 && !schedule.may_duplicate() {
            let twice: Vec<&String> = seen.iter().filter(|(_, n)| **n > 1).map(|(id, _)| id).collect();
            return Err(format!("{duplicates} duplicate deliveries with no host paused: {twice:?}"));
        }
        Ok(duplicates)
    }
}

/// `template` (an event as room-service builds it) as event `id` of `room`.
fn event_like(template: &NewEvent, id: &str, room: &str) -> NewEvent {
    let body = outbox_proto::body_from_json("RoomGiftSent", &serde_json::json!({ "room_id": room }))
        .expect("known event type")
        .unwrap();
    let envelope =
        outbox_host::envelope::encode(&template.app_code, id, "RoomGiftSent", room, 1, template.created_at_ms, body);
    NewEvent { event_id: id.to_string(), room_id: room.to_string(), envelope, ..template.clone() }
}

#[test]
fn a_seed_makes_the_same_schedule_every_time() {
    for seed in [1, 2_000, 3_017] {
        assert_eq!(format!("{:?}", Schedule::of(seed)), format!("{:?}", Schedule::of(seed)));
    }
    assert_ne!(format!("{:?}", Schedule::of(1)), format!("{:?}", Schedule::of(2)));
}
