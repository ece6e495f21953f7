//! `outbox-bench`: how fast delivery is and where the time goes, measured side by side in
//! one run. Every drain is checked before its speed is reported: all rows `delivered`, and
//! the sink called exactly once per event.

mod cpu;
mod db;
mod failover;
mod floor;
mod idle;
mod relay;
mod search;
mod sinks;
mod traces;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use clap::Parser;
use outbox_host::config::{PluginConfig, RoomOrdering, SinkSettings, WorkerConfig};
use outbox_host::engine::{Signal, Worker};
use outbox_host::ops::metrics::Metrics;
use outbox_host::relay::settings::BrokerKind;
use outbox_host::sandbox::{AttemptFailure, Deliver, Delivered, Event, SinkRuntime};
use outbox_host::store::{Mark, NewEvent, Outcome, Status, Store, now_ms};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use db::Db;
use outbox_host::store::Backend;

/// Benchmark options; the defaults are the ones the README's table uses.
#[derive(Parser, Clone)]
#[command(name = "outbox-bench")]
struct Args {
    /// Events per drain.
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Events for the seed's loop (it delivers at most batch_size per poll_interval).
    #[arg(long, default_value_t = 3_000)]
    seed_events: usize,
    /// Events of the room-order drains over 1,000 rooms and over 50 (`ordering: none` against
    /// `per_room`).
    #[arg(long, default_value_t = 20_000)]
    order_events: usize,
    /// Events of the room-order drains of one hot room.
    #[arg(long, default_value_t = 1_000)]
    hot_events: usize,
    /// Events per worker count in the scale-out drains (server databases only).
    #[arg(long, default_value_t = 50_000)]
    scale_events: usize,
    /// Events per drain through 1, 2 and 4 sinks.
    #[arg(long, default_value_t = 20_000)]
    sink_events: usize,
    /// How long a later sink's destination is down in the paused-sink runs (after its
    /// first sink drained `--sink-events`), seconds.
    #[arg(long, default_value_t = 60)]
    pause_seconds: u64,
    /// Producer rates for the latency runs, events per second.
    #[arg(long, value_delimiter = ',', default_value = "500,5000")]
    rates: Vec<u32>,
    /// Length of each latency run, seconds.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Events of each relay drain (into a broker of the run's own).
    #[arg(long, default_value_t = 50_000)]
    relay_events: usize,
    /// Rounds of each relay's floor and drains (each figure is the rounds' median).
    #[arg(long, default_value_t = 3)]
    relay_rounds: usize,
    /// Producer rates for the relay's insert-to-ack latency runs (into JetStream and
    /// Kafka), events per second.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    relay_rates: Vec<u32>,
    /// Brokers of the relay's floor-and-drain pairs (nats, redis, rabbitmq, kafka).
    #[arg(long, value_delimiter = ',', default_value = "nats,redis,rabbitmq,kafka")]
    relay_brokers: Vec<String>,
    /// Rows of the table the console's searches are timed on (`--only search`).
    #[arg(long, default_value_t = 1_000_000)]
    search_rows: usize,
    /// Sink calls for the per-call cost.
    #[arg(long, default_value_t = 10_000)]
    calls: usize,
    /// Only these backends (sqlite, postgres, mysql); default: SQLite plus every server whose
    /// TEST_POSTGRES_URL / TEST_MYSQL_URL is set.
    #[arg(long, value_delimiter = ',')]
    backends: Vec<String>,
    /// `outbox_worker.claim_growth` for every drain; default: the backend's (4 on the
    /// server databases, 1 on SQLite). `--claim-growth 1` runs with claims of `batch_size`.
    #[arg(long)]
    claim_growth: Option<u32>,
    /// `outbox_worker.concurrency` for every drain (and the relay floors' acks in flight);
    /// default: the host's.
    #[arg(long)]
    concurrency: Option<u32>,
    /// Only the relay's figures (`--only relay`), only what several sinks cost (`--only
    /// sinks`), only the main drains with, on PostgreSQL, the floors they are measured
    /// against (`--only drains`), only the drain with tracing off and on (`--only
    /// tracing`), or only the console's searches on a table of `--search-rows` (`--only
    /// search`).
    #[arg(long)]
    only: Option<String>,
    /// Where to write the JSON results.
    #[arg(long, default_value = "target/bench/latest.json")]
    json: std::path::PathBuf,
}

/// The sink the benchmark's floor uses: no WebAssembly at all, just a count.
#[derive(Default)]
struct NativeNoop {
    calls: AtomicU64,
}

#[async_trait::async_trait]
impl Deliver for NativeNoop {
    fn name(&self) -> &str {
        "native-noop"
    }

    async fn deliver(&self, _event: &Event, _timeout: Duration) -> Result<Delivered, AttemptFailure> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        Ok(Delivered::Delivered)
    }
}

/// The fake sink answering `ok` to everything: the WebAssembly path with a no-op body.
fn wasm_noop(concurrency: u32, cache: &std::path::Path) -> anyhow::Result<SinkRuntime> {
    let config = PluginConfig {
        cache_dir: Some(cache.to_owned()),
        config: SinkSettings([("default".to_string(), "ok".to_string())].into()),
        ..PluginConfig::with_defaults("fake", outbox_test_support::FAKE_SINK.into())
    };
    SinkRuntime::load(&config, concurrency)
}

/// `n` events spread over `rooms` rooms, ids `<prefix>-<i>`, created now.
fn events(prefix: &str, n: usize, rooms: usize) -> Vec<NewEvent> {
    let base = now_ms();
    (0..n)
        .map(|i| {
            let event_id = format!("{prefix}-{i}");
            let room = format!("room-{}", i % rooms);
            let body = outbox_proto::body_from_json(
                "RoomGiftSent",
                &json!({ "room_id": room, "gift_id": "rose", "gift_count": 1 }),
            )
            .expect("known type")
            .expect("valid body");
            let envelope =
                outbox_host::envelope::encode("bench", &event_id, "RoomGiftSent", &room, i as i64, base, body);
            NewEvent {
                app_code: "bench".into(),
                event_id,
                event_type: "RoomGiftSent".into(),
                room_id: room,
                status: Status::Pending,
                envelope,
                created_at_ms: base,
                trace_context: None,
            }
        })
        .collect()
}

async fn fill(store: &dyn Store, n: usize, rooms: usize) -> anyhow::Result<()> {
    insert_all(store, &events("bench", n, rooms)).await
}

/// Inserts `events` in statements of 5,000 rows.
async fn insert_all(store: &dyn Store, events: &[outbox_host::store::NewEvent]) -> anyhow::Result<()> {
    for chunk in events.chunks(5_000) {
        store.insert(chunk).await?;
    }
    Ok(())
}

/// One measured drain.
struct Drain {
    events: usize,
    seconds: f64,
    /// Cores the host and the server used while it ran (not measured for the seed's loop).
    cores: cpu::Cores,
    /// Claims that returned rows, over all workers (not counted for the seed's loop).
    claims: u64,
    /// Outcome writes (each its own transaction), over all workers.
    outcome_writes: u64,
    /// On PostgreSQL: row updates, the share of them that were HOT, and WAL bytes, per
    /// delivered event.
    writes: Option<[f64; 3]>,
}

impl Drain {
    fn per_second(&self) -> f64 {
        self.events as f64 / self.seconds
    }

    /// Cores and claims, for the table.
    fn describe(&self) -> String {
        let claims = if self.claims > 0 {
            format!(
                "; {} claims, {:.0} rows each; {} outcome writes, {:.0} rows each",
                self.claims,
                self.events as f64 / self.claims as f64,
                self.outcome_writes,
                self.events as f64 / self.outcome_writes.max(1) as f64
            )
        } else {
            String::new()
        };
        let writes = self
            .writes
            .map(|[updates, hot, wal]| {
                format!("; {updates:.2} row updates ({:.0}% HOT) and {wal:.0} WAL bytes per event", hot * 100.0)
            })
            .unwrap_or_default();
        format!("{}{claims}{writes}", self.cores.describe())
    }
}

/// Fills a fresh table with `n` events and drains it with `workers` workers (each its own
/// pool), checking that every row ends `delivered` and that the sinks saw each event once.
async fn drain(
    db: &Db,
    n: usize,
    workers: usize,
    config: &WorkerConfig,
    sink: Arc<dyn Deliver>,
) -> anyhow::Result<Drain> {
    drain_rooms(db, n, 1_000, workers, config, sink).await
}

/// [`drain`] of `n` events spread over `rooms` rooms.
async fn drain_rooms(
    db: &Db,
    n: usize,
    rooms: usize,
    workers: usize,
    config: &WorkerConfig,
    sink: Arc<dyn Deliver>,
) -> anyhow::Result<Drain> {
    let producer = db.open().await?;
    fill(producer.as_ref(), n, rooms).await?;
    drain_filled(db, producer, n, workers, config, sink).await
}

/// [`drain`] of the `n` events `producer` wrote into `db`.
async fn drain_filled(
    db: &Db,
    producer: Arc<dyn Store>,
    n: usize,
    workers: usize,
    config: &WorkerConfig,
    sink: Arc<dyn Deliver>,
) -> anyhow::Result<Drain> {
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    let mut all_metrics = Vec::new();
    let mut trips = Vec::new();
    let writes_before = db.pg_writes().await?;
    let meter = cpu::Meter::start(db).await;
    let started = Instant::now();
    let mut stores = Vec::new();
    for _ in 0..workers {
        let metrics = Arc::new(Metrics::new(sink.name()));
        let store = db.open().await?;
        stores.push(store.clone());
        let worker = Worker::new(store, sink.clone(), config.clone(), "bench", metrics.clone());
        trips.push(tokio::spawn(count_round_trips(worker.subscribe())));
        tasks.push(tokio::spawn(worker.run(shutdown.clone())));
        all_metrics.push(metrics);
    }
    wait_drained(std::slice::from_ref(&producer), n, || {
        all_metrics.iter().map(|m| m.delivered_total()).sum::<u64>() >= n as u64
    })
    .await?;
    let seconds = started.elapsed().as_secs_f64();
    let cores = meter.read();
    shutdown.cancel();
    for task in tasks {
        task.await??;
    }
    let (mut claims, mut outcome_writes) = (0, 0);
    for counted in trips {
        let counted = counted.await?;
        claims += counted.claims - counted.empty_claims;
        outcome_writes += counted.writes;
    }
    // A backend reports its table counters when it ends: close the workers' connections
    // and give the server a moment before reading them.
    for store in stores {
        store.close().await;
    }
    let writes = match (writes_before, db.pg_writes_settled().await?) {
        (Some(before), Some(after)) => {
            let per = |after: i64, before: i64| (after - before) as f64 / n as f64;
            let updates = after.updates - before.updates;
            let hot = if updates > 0 { (after.hot - before.hot) as f64 / updates as f64 } else { 0.0 };
            Some([per(after.updates, before.updates), hot, per(after.wal, before.wal)])
        }
        _ => None,
    };
    let stats = producer.stats().await?;
    ensure!(
        stats.count(Status::Delivered) == n as i64 && stats.counts.iter().map(|(_, c)| c).sum::<i64>() == n as i64,
        "rows not all delivered: {stats:?}"
    );
    let delivered: u64 = all_metrics.iter().map(|m| m.delivered_total()).sum();
    ensure!(delivered == n as u64, "the sink was called {delivered} times for {n} events");
    producer.close().await;
    Ok(Drain { events: n, seconds, cores, claims, outcome_writes, writes })
}

/// Waits until every table in `states` has `n` rows delivered; returns when that was seen.
///
/// Reading a table's counts scans it, and a scan every few milliseconds takes a large part
/// of a two-core machine's database from the drain being measured (it did: the first
/// sittings' drains ran beside a near-continuous `GROUP BY status` over the table). So the
/// table is read only once `sinks_done` (the sinks' own call counts, read in process) says
/// every event was delivered; then until the outcomes are written.
pub(crate) async fn wait_drained(
    states: &[Arc<dyn Store>],
    n: usize,
    sinks_done: impl Fn() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(3_600);
    'wait: loop {
        ensure!(Instant::now() < deadline, "the drain did not finish within an hour");
        tokio::time::sleep(Duration::from_millis(if sinks_done() { 2 } else { 10 })).await;
        if !sinks_done() {
            continue;
        }
        for state in states {
            if state.stats().await?.count(Status::Delivered) < n as i64 {
                continue 'wait;
            }
        }
        return Ok(());
    }
}

/// room-service's own in-process worker (`RunOutboxWorker`, "the seed"), as the baseline:
/// every `poll_interval`, claim one batch, deliver its events one by one, and record each
/// outcome on its own.
async fn seed_drain(db: &Db, n: usize, config: &WorkerConfig, sink: &dyn Deliver) -> anyhow::Result<Drain> {
    let store = db.open().await?;
    fill(store.as_ref(), n, 1_000).await?;
    let lease_ms = config.lease.as_millis() as i64;
    let started = Instant::now();
    let mut delivered = 0;
    while delivered < n {
        ensure!(started.elapsed() < Duration::from_secs(3_600), "the seed's loop did not finish within an hour");
        let now = now_ms();
        for row in store.claim("seed", now, now + lease_ms, config.batch_size).await? {
            let event = outbox_host::envelope::to_event(&row).map_err(anyhow::Error::msg)?;
            sink.deliver(&event, config.publish_timeout).await.map_err(|f| anyhow::anyhow!(f.message))?;
            store.mark(&[Mark::of(&row, Outcome::Delivered)], now_ms()).await?;
            delivered += 1;
        }
        tokio::time::sleep(config.poll_interval).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let stats = store.stats().await?;
    ensure!(stats.count(Status::Delivered) == n as i64, "rows not all delivered: {stats:?}");
    store.close().await;
    Ok(Drain { events: n, seconds, cores: cpu::Cores::default(), claims: 0, outcome_writes: 0, writes: None })
}

/// The `p`th percentile of sorted values (the nearest rank; 0 when there are none).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// A steady producer while one host runs with the default config: insert-to-delivered
/// latency.
async fn latency(db: &Db, rate: u32, seconds: u64, sink: Arc<dyn Deliver>) -> anyhow::Result<Value> {
    let producer = db.open().await?;
    let shutdown = CancellationToken::new();
    let metrics = Arc::new(Metrics::new(sink.name()));
    let worker = Worker::new(db.open().await?, sink, WorkerConfig::default(), "bench", metrics);
    let trips = tokio::spawn(count_round_trips(worker.subscribe()));
    let task = tokio::spawn(worker.run(shutdown.clone()));
    let per_tick = (rate / 100).max(1) as usize;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut produced = 0;
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        tick.tick().await;
        producer.insert(&events(&format!("lat-{produced}"), per_tick, 50)).await?;
        produced += per_tick;
    }
    // A run that falls behind is a result, not an error: what was still waiting two
    // minutes after the producer stopped is reported, with the delivered events' figures.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut delivered = producer.stats().await?.count(Status::Delivered);
    while delivered < produced as i64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        delivered = producer.stats().await?.count(Status::Delivered);
    }
    shutdown.cancel();
    task.await??;
    let trips = trips.await?;
    let mut ms: Vec<f64> = db.latencies_ms().await?.into_iter().map(|l| l as f64).collect();
    ensure!(ms.len() as i64 >= delivered, "{} latencies for {delivered} delivered events", ms.len());
    ms.sort_by(f64::total_cmp);
    producer.close().await;
    Ok(json!({
        "events": produced,
        "undelivered_after_120_s": produced.saturating_sub(ms.len()),
        "rate_per_s": rate,
        "seconds": seconds,
        "p50_ms": percentile(&ms, 50.0),
        "p95_ms": percentile(&ms, 95.0),
        "p99_ms": percentile(&ms, 99.0),
        "max_ms": ms.last().copied().unwrap_or(0.0),
        "claims": trips.claims,
        "empty_claims": trips.empty_claims,
        "outcome_writes": trips.writes,
        "signals_missed": trips.missed,
    }))
}

/// The worker's database round trips over a run, counted from its signals.
#[derive(Default)]
struct RoundTrips {
    claims: u64,
    empty_claims: u64,
    writes: u64,
    /// Signals the counter fell behind on (the counts are short by up to this many).
    missed: u64,
}

async fn count_round_trips(mut signals: tokio::sync::broadcast::Receiver<Signal>) -> RoundTrips {
    let mut trips = RoundTrips::default();
    loop {
        match signals.recv().await {
            Ok(Signal::Claimed(_)) => trips.claims += 1,
            Ok(Signal::Idle) => {
                trips.claims += 1;
                trips.empty_claims += 1;
            }
            Ok(Signal::Recorded(_)) => trips.writes += 1,
            Ok(Signal::Stopped) | Err(tokio::sync::broadcast::error::RecvError::Closed) => return trips,
            Ok(Signal::Released(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => trips.missed += missed,
        }
    }
}

/// Fresh-store instantiate + `deliver` of the fake sink, in process, with the median of
/// each phase (store, instantiate, call, teardown).
async fn per_call(runtime: &SinkRuntime, calls: usize) -> anyhow::Result<Value> {
    let event = Event {
        app_code: "bench".into(),
        event_id: "evt".into(),
        event_type: "RoomGiftSent".into(),
        room_id: "room".into(),
        room_version: 1,
        occurred_at_ms: 0,
        body: vec![],
        attempt: 1,
    };
    for _ in 0..200 {
        runtime.deliver(&event, Duration::from_secs(3)).await.map_err(|f| anyhow::anyhow!(f.message))?;
    }
    let (mut total, mut phases) = (Vec::with_capacity(calls), [(); 4].map(|()| Vec::with_capacity(calls)));
    for _ in 0..calls {
        let start = Instant::now();
        let (delivered, p) = runtime.deliver_timed(&event, Duration::from_secs(3)).await;
        total.push(start.elapsed().as_secs_f64() * 1e6);
        delivered.map_err(|f| anyhow::anyhow!(f.message))?;
        for (samples, d) in phases.iter_mut().zip([p.store, p.instantiate, p.call, p.teardown]) {
            samples.push(d.as_secs_f64() * 1e6);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        percentile(&v, 50.0)
    };
    let [store, instantiate, call, teardown] = phases.map(median);
    total.sort_by(f64::total_cmp);
    Ok(json!({
        "calls": calls,
        "median_us": percentile(&total, 50.0),
        "p99_us": percentile(&total, 99.0),
        "phase_median_us": { "store": store, "instantiate": instantiate, "call": call, "teardown": teardown },
    }))
}

/// The real release binary drains `n` events from SQLite; its peak resident memory.
async fn memory(n: usize) -> anyhow::Result<Value> {
    let binary = std::env::current_exe()?.with_file_name("outbox-host");
    ensure!(binary.exists(), "{} is missing: build it with `cargo build --release -p outbox-host`", binary.display());
    let db = Db::fresh(Backend::Sqlite).await?;
    let producer = db.open().await?;
    fill(producer.as_ref(), n, 1_000).await?;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("outbox.yaml");
    std::fs::write(
        &config,
        format!(
            "database:\n  url: \"{}\"\nsink:\n  name: fake\n  plugin: \"{}\"\n  config:\n    default: ok\nadmin:\n  listen: \"\"\nlog:\n  level: warn\n",
            db.url(),
            outbox_test_support::FAKE_SINK
        ),
    )?;
    let started = Instant::now();
    let mut child = std::process::Command::new(&binary)
        .args(["--config", config.to_str().unwrap(), "run"])
        .stdout(std::process::Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(3_600);
    let mut peak_kib = 0;
    while producer.stats().await?.count(Status::Delivered) < n as i64 {
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", child.id())) {
            peak_kib = status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or(peak_kib);
        }
        if Instant::now() > deadline || child.try_wait()?.is_some() {
            bail!("the host exited or stalled before delivering {n} events");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
    let status = child.wait()?;
    ensure!(status.success(), "the host exited with {status}");
    Ok(
        json!({ "events": n, "seconds": seconds, "peak_rss_mib": peak_kib as f64 / 1024.0, "process_start_included": true }),
    )
}

fn row(table: &mut Vec<[String; 5]>, backend: &str, scenario: &str, events: usize, seconds: f64, note: String) {
    let rate = if seconds > 0.0 { format!("{:.0}", events as f64 / seconds) } else { "-".into() };
    table.push([
        backend.into(),
        scenario.into(),
        format!("{events}"),
        format!("{seconds:.2}"),
        format!("{rate}  {note}"),
    ]);
}

/// What every scenario runs with: the command line, the worker's settings, the WASM no-op.
#[derive(Clone, Copy)]
struct Setup<'a> {
    args: &'a Args,
    config: &'a WorkerConfig,
    wasm: &'a Arc<dyn Deliver>,
}

/// The figures of one run: the printed table's rows, the JSON results, the servers' versions.
#[derive(Default)]
struct Report {
    table: Vec<[String; 5]>,
    results: Vec<Value>,
    versions: serde_json::Map<String, Value>,
}

/// The drain of `args.events` through the WASM no-op sink and a native no-op, and the seed's loop; returns the two drains' rates.
async fn drains(r: &mut Report, backend: Backend, setup: Setup<'_>) -> anyhow::Result<(f64, f64)> {
    let r_versions = &mut r.versions;
    let (table, results, name) = (&mut r.table, &mut r.results, db::name(backend));
    let Setup { args, config, wasm } = setup;
    eprintln!("{name}: drains of {} events …", args.events);
    let version = Db::fresh(backend).await?.version().await?;
    r_versions.insert(name.into(), json!(version));

    let with_wasm = drain(&Db::fresh(backend).await?, args.events, 1, config, wasm.clone()).await?;
    let native: Arc<dyn Deliver> = Arc::new(NativeNoop::default());
    let floor = drain(&Db::fresh(backend).await?, args.events, 1, config, native).await?;
    eprintln!("{name}: the seed's loop, {} events …", args.seed_events);
    let seed = seed_drain(&Db::fresh(backend).await?, args.seed_events, config, wasm.as_ref()).await?;
    let wasm_vs_native = with_wasm.per_second() / floor.per_second();
    let vs_seed = with_wasm.per_second() / seed.per_second();
    row(
        table,
        name,
        "drain, WASM no-op sink",
        with_wasm.events,
        with_wasm.seconds,
        format!("{wasm_vs_native:.2}× native; {}", with_wasm.describe()),
    );
    row(table, name, "drain, native no-op (floor)", floor.events, floor.seconds, floor.describe());
    row(
        table,
        name,
        "the seed's loop (1 batch/tick, 1 by 1)",
        seed.events,
        seed.seconds,
        format!("ours {vs_seed:.1}× faster"),
    );
    results.push(json!({
        "backend": name,
        "drain_wasm": { "events": with_wasm.events, "seconds": with_wasm.seconds, "per_s": with_wasm.per_second(),
                        "cores_host": with_wasm.cores.host, "cores_server": with_wasm.cores.server,
                        "claims": with_wasm.claims, "outcome_writes": with_wasm.outcome_writes,
                        "row_updates_per_event": with_wasm.writes.map(|w| w[0]),
                        "hot_update_share": with_wasm.writes.map(|w| w[1]),
                        "wal_bytes_per_event": with_wasm.writes.map(|w| w[2]) },
        "drain_native": { "events": floor.events, "seconds": floor.seconds, "per_s": floor.per_second(),
                          "cores_host": floor.cores.host, "cores_server": floor.cores.server,
                          "claims": floor.claims, "outcome_writes": floor.outcome_writes },
        "seed_loop": { "events": seed.events, "seconds": seed.seconds, "per_s": seed.per_second() },
        "ratio_wasm_over_native": wasm_vs_native,
        "ratio_ours_over_seed": vs_seed,
    }));
    Ok((with_wasm.per_second(), floor.per_second()))
}

/// What per-room order costs: the same drain with `ordering: none` and `per_room`, over many rooms, few, and one.
async fn room_order(r: &mut Report, backend: Backend, setup: Setup<'_>) -> anyhow::Result<()> {
    let (table, results, name) = (&mut r.table, &mut r.results, db::name(backend));
    let Setup { args, config, wasm } = setup;
    let free_config = WorkerConfig { ordering: RoomOrdering::None, ..config.clone() };
    let ordered_config = WorkerConfig { ordering: RoomOrdering::PerRoom, ..config.clone() };
    for (label, n, rooms) in [
        ("1,000 rooms", args.order_events, 1_000),
        ("50 rooms", args.order_events, 50),
        ("one hot room", args.hot_events, 1),
    ] {
        eprintln!("{name}: room order over {label}, {n} events, none, then per_room …");
        let free = drain_rooms(&Db::fresh(backend).await?, n, rooms, 1, &free_config, wasm.clone()).await?;
        let ordered = drain_rooms(&Db::fresh(backend).await?, n, rooms, 1, &ordered_config, wasm.clone()).await?;
        let cost = ordered.per_second() / free.per_second();
        row(table, name, &format!("{label}, ordering: none"), free.events, free.seconds, String::new());
        row(
            table,
            name,
            &format!("{label}, ordering: per_room"),
            ordered.events,
            ordered.seconds,
            format!("{cost:.2}× of none"),
        );
        results.push(json!({
            "backend": name,
            "room_order": label,
            "none_per_s": free.per_second(),
            "per_room_per_s": ordered.per_second(),
            "per_room_over_none": cost,
        }));
    }
    Ok(())
}

/// One line of [`several_sinks`]: the sinks, events/s, writes and WAL per event, cores, and
/// processor microseconds per event.
type SinksRow = (usize, f64, Option<[f64; 2]>, cpu::Cores, f64);

/// What several sinks cost: the same events through 1, 2 and 4 no-op sinks.
async fn several_sinks(r: &mut Report, backend: Backend, args: &Args, cache: &Path) -> anyhow::Result<()> {
    let (table, results, name) = (&mut r.table, &mut r.results, db::name(backend));
    // What several sinks cost: the same events through 1, 2 and 4 no-op sinks, each
    // with its own state.
    let mut per_sinks: Vec<SinksRow> = Vec::new();
    for count in [1usize, 2, 4] {
        eprintln!("{name}: {} events through {count} sink(s) …", args.sink_events);
        let d = sinks::drain(&Db::fresh(backend).await?, args.sink_events, count, cache).await?;
        let per_s = args.sink_events as f64 / d.seconds;
        let one = per_sinks.first().map(|&(_, one, writes, ..): &SinksRow| (per_s / one, writes));
        let mut note = one.map(|(r, _)| format!("{r:.2}× of 1 sink")).unwrap_or_default();
        if let Some([rows, wal]) = d.writes {
            let wal_vs_one = match one {
                Some((_, Some([_, one_wal]))) => format!(" ({:.2}× of 1 sink)", wal / one_wal),
                _ => String::new(),
            };
            note.push_str(&format!("; {rows:.2} row writes and {wal:.0} WAL bytes{wal_vs_one} per event"));
        }
        let cpu_us = d.cpu_us_per_event(args.sink_events);
        note.push_str(&format!("; {}, {cpu_us:.1} µs of processor per event", d.cores.describe()));
        eprintln!("{name}: {count} sink(s), every event to each: {per_s:.0} events/s; {note}");
        row(table, name, &format!("{count} sink(s), every event to each"), args.sink_events, d.seconds, note);
        per_sinks.push((count, per_s, d.writes, d.cores, cpu_us));
    }
    eprintln!(
        "{name}: {} events through 2 sinks, the later one's destination down for {} s …",
        args.sink_events, args.pause_seconds
    );
    let p = sinks::paused(backend, args.sink_events, Duration::from_secs(args.pause_seconds), cache).await?;
    let note = format!(
        "first sink {:.0} events/s with the later one's destination down, {:.0}/s with it up: {:.2}×; \
         the later sink failed {} attempts while down and delivered every event {:.1} s after its destination came back \
         ({:.1} s from the start with it up)",
        args.sink_events as f64 / p.other_down,
        args.sink_events as f64 / p.other_up,
        p.other_up / p.other_down,
        p.attempts_down,
        p.catch_up,
        p.later_up
    );
    eprintln!("{name}: {note}");
    row(table, name, "2 sinks, the later one's destination down", args.sink_events, p.other_down, note);
    results.push(json!({
        "backend": name,
        "paused_sink": {
            "pause_seconds": args.pause_seconds,
            "first_sink_seconds_destination_up": p.other_up,
            "first_sink_seconds_destination_down": p.other_down,
            "later_sink_attempts_while_down": p.attempts_down,
            "later_sink_catch_up_seconds": p.catch_up,
            "later_sink_seconds_destination_up": p.later_up,
        },
        "sinks": per_sinks.iter().map(|(count, per_s, writes, cores, cpu_us)| json!({
            "sinks": count, "events_per_s": per_s,
            "row_writes_per_event": writes.map(|w| w[0]), "wal_bytes_per_event": writes.map(|w| w[1]),
            "cores_host": cores.host, "cores_server": cores.server, "cpu_us_per_event": cpu_us,
        })).collect::<Vec<_>>(),
    }));
    Ok(())
}

/// Latency at each of `args.rates`.
async fn latencies(r: &mut Report, backend: Backend, args: &Args, wasm: &Arc<dyn Deliver>) -> anyhow::Result<()> {
    let (table, results, name) = (&mut r.table, &mut r.results, db::name(backend));
    for rate in &args.rates {
        eprintln!("{name}: latency at {rate}/s for {}s …", args.seconds);
        let lat = latency(&Db::fresh(backend).await?, *rate, args.seconds, wasm.clone()).await?;
        let behind = match lat["undelivered_after_120_s"].as_u64() {
            Some(0) | None => String::new(),
            Some(n) => format!("FELL BEHIND: {n} undelivered 120 s after the producer stopped; of the rest: "),
        };
        table.push([
            name.into(),
            format!("latency @{rate}/s for {}s", args.seconds),
            format!("{}", lat["events"]),
            "-".into(),
            format!(
                "{behind}p50 {} ms, p95 {} ms, p99 {} ms, max {} ms; {} claims ({} empty), {} outcome writes",
                lat["p50_ms"],
                lat["p95_ms"],
                lat["p99_ms"],
                lat["max_ms"],
                lat["claims"],
                lat["empty_claims"],
                lat["outcome_writes"]
            ),
        ]);
        results.push(json!({ "backend": name, "latency": lat }));
    }
    Ok(())
}

/// The relay into each broker: its floor, the drain through the WebAssembly and the native
/// mapping, and (into JetStream and Kafka) insert-to-ack latency.
async fn relays(r: &mut Report, backend: Backend, setup: Setup<'_>, cache: &Path) -> anyhow::Result<()> {
    let (table, results, name) = (&mut r.table, &mut r.results, db::name(backend));
    let Setup { args, config, .. } = setup;
    let n = args.relay_events;
    for broker in &args.relay_brokers {
        let kind = BrokerKind::parse(broker).with_context(|| format!("--relay-brokers: no broker kind {broker}"))?;
        let latency_too = matches!(kind, BrokerKind::Nats | BrokerKind::Kafka);
        let rates: &[u32] = if latency_too { &args.relay_rates } else { &[] };
        let rounds = args.relay_rounds.max(1);
        eprintln!("{name}: relay into {broker}, {n} events, {rounds} round(s) …");
        let relay = relay::run(kind, backend, (n, rounds), rates, args.seconds, config, cache).await?;
        // The rounds' lowest and highest, `scale`d, to `digits` places.
        let range = |figure: &str, scale: f64, digits: usize| {
            let ends = &relay[format!("{figure}_range")];
            let end = |i: usize| ends[i].as_f64().unwrap_or(0.0) * scale;
            if rounds > 1 { format!(" ({:.digits$}–{:.digits$})", end(0), end(1)) } else { String::new() }
        };
        let seconds = |per_s: &Value| n as f64 / per_s.as_f64().unwrap_or(f64::INFINITY);
        row(
            table,
            name,
            &format!("{broker} publish floor (no database)"),
            n,
            seconds(&relay["floor_per_s"]),
            if rounds > 1 { format!("median of {rounds} rounds") } else { String::new() },
        );
        row(
            table,
            name,
            &format!("relay drain into {broker}, WebAssembly mapping"),
            n,
            seconds(&relay["drain_wasm_per_s"]),
            format!(
                "{:.2}×{} the {broker} floor; mapping costs {:.0}%{} of the native drain",
                relay["ratio_wasm_over_floor"].as_f64().unwrap_or(0.0),
                range("ratio_wasm_over_floor", 1.0, 2),
                relay["mapping_cost"].as_f64().unwrap_or(0.0) * 100.0,
                range("mapping_cost", 100.0, 0),
            ),
        );
        row(
            table,
            name,
            &format!("relay drain into {broker}, native mapping"),
            n,
            seconds(&relay["drain_native_per_s"]),
            String::new(),
        );
        table.push([
            name.into(),
            "relay mapping alone, one event after another".into(),
            format!("{}", n.min(relay::MAPPING_EVENTS)),
            "-".into(),
            format!(
                "WebAssembly {:.1} µs{}, native {:.1} µs{} per event",
                relay["route_wasm_us"].as_f64().unwrap_or(0.0),
                range("route_wasm_us", 1.0, 1),
                relay["route_native_us"].as_f64().unwrap_or(0.0),
                range("route_native_us", 1.0, 1),
            ),
        ]);
        for lat in relay["latency"].as_array().into_iter().flatten() {
            table.push([
                name.into(),
                format!("relay insert→{broker} ack @{}/s for {}s", lat["rate_per_s"], args.seconds),
                format!("{}", lat["events"]),
                "-".into(),
                format!(
                    "p50 {} ms, p95 {} ms, p99 {} ms, max {} ms; {} undelivered after 120 s",
                    lat["p50_ms"], lat["p95_ms"], lat["p99_ms"], lat["max_ms"], lat["undelivered_after_120_s"]
                ),
            ]);
        }
        results.push(json!({ "backend": name, "relay": relay }));
    }
    Ok(())
}

/// A SIGKILLed owner's rooms taken over, and an idle host's statements.
async fn failover_and_idle(r: &mut Report, backend: Backend, wasm: &Arc<dyn Deliver>) -> anyhow::Result<()> {
    let (table, results, name) = (&mut r.table, &mut r.results, db::name(backend));
    eprintln!("{name}: the owner of every partition SIGKILLed, another host started …");
    let taken_over = failover::measure(backend).await?;
    table.push([
        name.into(),
        format!("failover after a SIGKILL (partition lease {} s)", failover::LEASE_MS / 1_000),
        format!("{}", taken_over.held),
        "-".into(),
        format!("its rooms delivering again after {:.1} s", taken_over.first_ms / 1_000.0),
    ]);
    results.push(json!({
        "backend": name,
        "failover": { "partition_lease_ms": failover::LEASE_MS, "left": taken_over.held,
                      "first_ms": taken_over.first_ms },
    }));

    eprintln!("{name}: an idle host for 5 s …");
    let idle = idle::queries_per_second(&Db::fresh(backend).await?, wasm.clone(), 5).await?;
    table.push([name.into(), "idle host, statements/s".into(), "-".into(), "-".into(), format!("{idle:.1}")]);
    results.push(json!({ "backend": name, "idle_statements_per_s": idle }));
    Ok(())
}

/// PostgreSQL's floors: pgbench's claim-and-mark, and the same on a lean table, against the
/// drains' rates.
async fn floors(r: &mut Report, args: &Args, wasm_rate: f64, native_rate: f64) -> anyhow::Result<()> {
    let (table, results, name) = (&mut r.table, &mut r.results, db::name(Backend::Postgres));
    eprintln!("{name}: pgbench's claim-and-mark floor, {} rows …", args.events);
    let floor_rate = floor::pgbench(args.events / 1_000 * 1_000).await?;
    let (wasm_ratio, native_ratio) = (wasm_rate / floor_rate, native_rate / floor_rate);
    table.push([
        name.into(),
        "database floor (pgbench claim 1,000 + mark)".into(),
        format!("{}", args.events),
        "-".into(),
        format!("{floor_rate:.0}  WASM drain {wasm_ratio:.2}×, native drain {native_ratio:.2}× of it"),
    ]);
    eprintln!("{name}: the lean claim-and-mark floor, {} rows …", args.events);
    let lean = floor::lean(args.events / 1_000 * 1_000).await?;
    let lean_ratio = wasm_rate / lean.rate;
    table.push([
        name.into(),
        "lean floor (pgbench claim 1,000 + mark, lean table)".into(),
        format!("{}", args.events),
        "-".into(),
        format!("{:.0}  WASM drain {lean_ratio:.2}× of it; {:.0} WAL bytes per row", lean.rate, lean.wal_bytes_per_row),
    ]);
    results.push(json!({
        "backend": name,
        "pgbench_floor_per_s": floor_rate,
        "ratio_wasm_over_floor": wasm_ratio,
        "ratio_native_over_floor": native_ratio,
        "lean_floor_per_s": lean.rate,
        "lean_floor_wal_bytes_per_row": lean.wal_bytes_per_row,
        "ratio_wasm_over_lean_floor": lean_ratio,
    }));
    Ok(())
}

/// Scale-out: the same drain by 1, 2 and 4 workers.
async fn scale_out(r: &mut Report, backend: Backend, setup: Setup<'_>) -> anyhow::Result<()> {
    let (table, results, name) = (&mut r.table, &mut r.results, db::name(backend));
    let Setup { args, config, wasm } = setup;
    let mut scale = Vec::new();
    for workers in [1usize, 2, 4] {
        eprintln!("{name}: {workers} worker(s), {} events …", args.scale_events);
        let d = drain(&Db::fresh(backend).await?, args.scale_events, workers, config, wasm.clone()).await?;
        row(table, name, &format!("scale-out, {workers} worker(s)"), d.events, d.seconds, d.describe());
        scale.push(json!({ "workers": workers, "events": d.events, "seconds": d.seconds, "per_s": d.per_second(),
                           "cores_host": d.cores.host, "cores_server": d.cores.server, "claims": d.claims }));
    }
    results.push(json!({ "backend": name, "scale_out": scale }));
    Ok(())
}

fn main() -> anyhow::Result<()> {
    // As the host binary does, before the runtime's threads allocate: the drains run here.
    outbox_host::allocator::tune();
    tokio::runtime::Runtime::new()?.block_on(bench(Args::parse()))
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let mut backends = vec![Backend::Sqlite];
    for (backend, var) in [(Backend::Postgres, "TEST_POSTGRES_URL"), (Backend::Mysql, "TEST_MYSQL_URL")] {
        if std::env::var(var).is_ok_and(|v| !v.is_empty()) {
            backends.push(backend);
        } else {
            eprintln!("note: {var} is not set: no {} figures", db::name(backend));
        }
    }
    if !args.backends.is_empty() {
        backends.retain(|b| args.backends.iter().any(|n| n == db::name(*b)));
    }
    let cache = tempfile::tempdir()?;
    let defaults = WorkerConfig::default();
    let concurrency = args.concurrency.unwrap_or(defaults.concurrency);
    let config = WorkerConfig { claim_growth: args.claim_growth, concurrency, ..defaults };
    let wasm: Arc<dyn Deliver> = Arc::new(wasm_noop(config.concurrency, cache.path())?);
    let mut r = Report::default();
    let setup = Setup { args: &args, config: &config, wasm: &wasm };

    for backend in &backends {
        if args.only.as_deref() == Some("sinks") {
            several_sinks(&mut r, *backend, &args, cache.path()).await?;
            continue;
        }
        if args.only.as_deref() == Some("tracing") {
            traces::tracing_cost(&mut r, *backend, setup).await?;
            continue;
        }
        if args.only.as_deref() == Some("search") {
            search::search_timings(&mut r, *backend, &args).await?;
            continue;
        }
        if *backend != Backend::Mysql && args.only.as_deref() != Some("drains") {
            relays(&mut r, *backend, setup, cache.path()).await?;
        }
        if args.only.as_deref() == Some("relay") {
            continue;
        }
        let (wasm_rate, native_rate) = drains(&mut r, *backend, setup).await?;
        if args.only.as_deref() == Some("drains") {
            if *backend == Backend::Postgres {
                floors(&mut r, &args, wasm_rate, native_rate).await?;
            }
            continue;
        }
        room_order(&mut r, *backend, setup).await?;
        traces::tracing_cost(&mut r, *backend, setup).await?;
        several_sinks(&mut r, *backend, &args, cache.path()).await?;
        search::search_timings(&mut r, *backend, &args).await?;
        latencies(&mut r, *backend, &args, &wasm).await?;
        failover_and_idle(&mut r, *backend, &wasm).await?;
        if *backend == Backend::Postgres {
            floors(&mut r, &args, wasm_rate, native_rate).await?;
        }
        if *backend != Backend::Sqlite {
            scale_out(&mut r, *backend, setup).await?;
        }
    }

    let Report { table, results, versions } = r;
    eprintln!("per-call cost, {} calls …", args.calls);
    let runtime = wasm_noop(1, cache.path())?;
    let call = per_call(&runtime, args.calls).await?;
    eprintln!("memory: the release binary draining {} events from SQLite …", args.events);
    let mem = memory(args.events).await.context("memory run")?;

    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!(
        "outbox-bench on {cores} cores; batch_size {}, claim_growth {}, concurrency {}, poll_interval {:?}",
        config.batch_size,
        config.claim_growth.map_or("the backend's".to_string(), |g| g.to_string()),
        config.concurrency,
        config.poll_interval
    );
    println!("{:<9} {:<40} {:>8} {:>9}  events/s", "backend", "scenario", "events", "seconds");
    for [backend, scenario, events, seconds, rest] in &table {
        println!("{backend:<9} {scenario:<40} {events:>8} {seconds:>9}  {rest}");
    }
    println!(
        "per call (fresh store + instantiate + deliver, fake sink): median {:.1} µs, p99 {:.1} µs",
        call["median_us"].as_f64().unwrap_or(0.0),
        call["p99_us"].as_f64().unwrap_or(0.0)
    );
    let phase = |name: &str| call["phase_median_us"][name].as_f64().unwrap_or(0.0);
    println!(
        "  median by phase: store {:.1} µs, instantiate {:.1} µs, call {:.1} µs, teardown {:.1} µs",
        phase("store"),
        phase("instantiate"),
        phase("call"),
        phase("teardown")
    );
    println!(
        "memory (release binary, SQLite drain of {} events in {:.1} s): peak RSS {:.1} MiB",
        mem["events"],
        mem["seconds"].as_f64().unwrap_or(0.0),
        mem["peak_rss_mib"].as_f64().unwrap_or(0.0)
    );

    let report = json!({
        "date_ms": now_ms(),
        "machine": { "cores": cores, "os": std::env::consts::OS, "arch": std::env::consts::ARCH },
        "databases": versions,
        "config": {
            "events": args.events, "seed_events": args.seed_events, "scale_events": args.scale_events,
            "rates": args.rates, "seconds": args.seconds, "calls": args.calls,
            "batch_size": config.batch_size, "claim_growth": config.claim_growth, "concurrency": config.concurrency,
            "poll_interval_ms": config.poll_interval.as_millis() as u64,
            "publish_timeout_ms": config.publish_timeout.as_millis() as u64,
        },
        "results": results,
        "per_call": call,
        "memory": mem,
    });
    if let Some(dir) = args.json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)? + "\n")?;
    eprintln!("wrote {}", args.json.display());
    Ok(())
}
