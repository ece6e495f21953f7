//! `outbox-soak` (`make soak`): everything at the edges at once, on the real binary. Several
//! hosts deliver through two sinks while a producer writes steadily, and meanwhile hosts
//! are SIGKILLed and restarted, the database connection is cut through a TCP proxy, one
//! sink's plugin is hot-reloaded, a third sink is added with `start_from: beginning` by a
//! rolling restart, and a purge and a replay run. Afterwards it prints, per sink: events
//! received at least once (must be all), duplicates (bounded by the killed and cut-off hosts
//! times the rows one host holds leased), rows left `delivering` (must be 0) and per-room
//! order violations (must be 0); and exits 1 if any of those does not hold.

mod faults;
mod storm;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use outbox_host::store::{NewEvent, Status, Store, now_ms};
use outbox_test_support::Collector;
use outbox_test_support::db::TestDb;
use outbox_test_support::proxy::TcpProxy;

use faults::{Fault, schedule};

/// Soak options; the defaults are the full run the README's table comes from.
#[derive(Parser, Clone)]
#[command(name = "outbox-soak")]
struct Args {
    /// Events the producer writes.
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Hosts running at once.
    #[arg(long, default_value_t = 4)]
    hosts: usize,
    /// Rooms the events are spread over (each room's events must arrive in order).
    #[arg(long, default_value_t = 1_000)]
    rooms: usize,
    /// Events per second the producer writes.
    #[arg(long, default_value_t = 2_500)]
    rate: usize,
    /// The `outbox-host` binary the hosts run (default: the one beside this program).
    #[arg(long)]
    host_bin: Option<PathBuf>,
    /// Only these backends (postgres, mysql); default: both.
    #[arg(long, value_delimiter = ',')]
    backends: Vec<String>,
    /// How long the hosts may take to finish every sink's events after the producer stops.
    #[arg(long, default_value_t = 600)]
    drain_seconds: u64,
    /// A folder to write, per backend and sink, each event received more than once (its id,
    /// its creation time, its receipts, whether the replay covered it).
    #[arg(long)]
    details: Option<PathBuf>,
    /// The kill storm instead of the soak: 10 chunks of 2,000 events one second apart, each
    /// over its own 100 rooms as two 1,000-row inserts, created up to 2 s ahead of the
    /// database's clock, while a random host is SIGKILLed (and started again) every 1 to 1.6
    /// s for 20 s; `--events`, `--rooms` and `--rate` do not apply.
    #[arg(long)]
    storm: bool,
    /// Runs per backend.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// The storm's seed (which host is killed when); default: from the clock, printed.
    #[arg(long)]
    seed: Option<u64>,
    /// The hosts' `outbox_worker` settings left at their defaults (else short leases and
    /// timeouts, so that a killed host's rows come back within seconds).
    #[arg(long)]
    default_worker: bool,
    /// The hosts' log level.
    #[arg(long, default_value = "warn")]
    log_level: String,
}

/// The hosts' delivery settings: leases short enough that a killed host's rows come back
/// within seconds.
const BATCH_SIZE: usize = 64;
/// The most rows one host holds leased for one sink: two claims ahead of its deliveries,
/// each grown to at most `claim_growth` (4 on the server databases) × `batch_size`. A host
/// killed, or cut off until its leases expire, may have delivered each of them without its
/// outcome being written: the duplicates one such fault can cause.
const HELD_PER_HOST: usize = 2 * 4 * BATCH_SIZE;
const WORKER: &str = "  batch_size: 64\n  concurrency: 32\n  publish_timeout: 1s\n  lease_duration: 7s\n  \
                      poll_interval: 200ms\n  retry_interval: 200ms\n  shutdown_grace: 5s\n";

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match soak(Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The cause last, after any backtrace: CI shows a failure's tail.
            eprintln!("{e:?}\n\noutbox-soak failed: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn soak(args: Args) -> anyhow::Result<()> {
    let backends =
        if args.backends.is_empty() { vec!["postgres".into(), "mysql".into()] } else { args.backends.clone() };
    let mut failed = false;
    let mut rows = Vec::new();
    for backend in &backends {
        for run in 1..=args.runs.max(1) {
            let db = match backend.as_str() {
                "postgres" => TestDb::postgres().await,
                "mysql" => TestDb::mysql().await,
                other => bail!("--backends: {other:?} is not postgres or mysql"),
            };
            let db =
                db.with_context(|| format!("{backend}: set TEST_POSTGRES_URL / TEST_MYSQL_URL (make soak does)"))?;
            let soak = Soak::new(&args, backend, db).await?;
            let report = if args.storm {
                let seed = args.seed.unwrap_or_else(|| now_ms() as u64);
                println!(
                    "== {backend}, storm {run} of {}: {} hosts, {} events over {} rooms, seed {seed}",
                    args.runs,
                    args.hosts,
                    storm::CHUNKS * storm::CHUNK_EVENTS,
                    storm::CHUNKS * storm::CHUNK_ROOMS
                );
                soak.storm(seed).await?
            } else {
                println!(
                    "== {backend}: {} hosts, {} events over {} rooms at {}/s",
                    args.hosts, args.events, args.rooms, args.rate
                );
                soak.run().await?
            };
            for sink in &report {
                failed |= !sink.holds();
            }
            rows.extend(report);
        }
    }
    println!();
    println!(
        "| backend | sink | events | received at least once | duplicates (bound) | replayed again | left delivering | order violations |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} (≤ {}) | {} | {} | {} |",
            r.backend,
            r.sink,
            r.events,
            r.received,
            r.duplicates,
            r.duplicate_bound,
            r.replayed,
            r.delivering,
            r.order_violations
        );
    }
    if failed {
        bail!("the soak found events lost, rows left delivering, order broken or duplicates past their bound");
    }
    println!("0 lost, 0 left delivering, 0 out of order");
    Ok(())
}

/// One sink's line of the table.
struct SinkReport {
    backend: String,
    sink: &'static str,
    events: usize,
    received: usize,
    duplicates: usize,
    duplicate_bound: usize,
    replayed: usize,
    delivering: i64,
    order_violations: usize,
}

impl SinkReport {
    fn holds(&self) -> bool {
        self.received == self.events
            && self.delivering == 0
            && self.order_violations == 0
            && self.duplicates <= self.duplicate_bound
    }
}

/// One event as the producer wrote it.
struct Produced {
    event_id: String,
    room: usize,
    seq: usize,
    created_at_ms: i64,
}

/// One soak on one database.
struct Soak {
    args: Args,
    backend: String,
    db: TestDb,
    dir: tempfile::TempDir,
    bin: PathBuf,
    proxy: TcpProxy,
    collectors: [Collector; 3],
    hosts: Vec<Option<Child>>,
    kills: usize,
    /// Hosts running during each cut of the database, summed.
    cut_hosts: usize,
    /// When each kill or cut began.
    faults_at: Vec<Instant>,
    /// Whether the hosts run with the third sink now.
    third_sink: bool,
}

const SINKS: [&str; 3] = ["a", "b", "c"];

impl Soak {
    async fn new(args: &Args, backend: &str, db: TestDb) -> anyhow::Result<Soak> {
        let bin = match &args.host_bin {
            Some(bin) => bin.clone(),
            None => std::env::current_exe()?.with_file_name("outbox-host"),
        };
        anyhow::ensure!(bin.exists(), "{} is missing: build outbox-host first", bin.display());
        let proxy = TcpProxy::in_front_of(&db.url, false).await;
        let dir = tempfile::tempdir()?;
        std::fs::copy(outbox_test_support::FAKE_SINK, dir.path().join("a.wasm"))?;
        Ok(Soak {
            args: args.clone(),
            backend: backend.to_string(),
            db,
            dir,
            bin,
            proxy,
            collectors: [Collector::start().await, Collector::start().await, Collector::start().await],
            hosts: Vec::new(),
            kills: 0,
            cut_hosts: 0,
            faults_at: Vec::new(),
            third_sink: false,
        })
    }

    /// The hosts' config with the first `sinks` sinks, its database reached through the proxy.
    fn config(&self, sinks: usize) -> anyhow::Result<PathBuf> {
        let url = self.proxy.url_through(&self.db.url);
        let cache = self.dir.path().join("cache");
        let worker = if self.args.default_worker { "  enabled: true\n" } else { WORKER };
        let mut yaml = format!(
            "database:\n  url: \"{url}\"\n  max_connections: 6\nadmin:\n  listen: \"\"\nlog:\n  level: {}\noutbox_worker:\n{worker}sinks:\n",
            self.args.log_level
        );
        for (i, name) in SINKS.iter().take(sinks).enumerate() {
            let plugin =
                if i == 0 { self.dir.path().join("a.wasm") } else { PathBuf::from(outbox_test_support::FAKE_SINK) };
            let collector = &self.collectors[i];
            yaml.push_str(&format!(
                "  - name: {name}\n    plugin: \"{}\"\n    cache_dir: \"{}\"\n    allow_http: true\n    allowed_hosts: [\"{}\"]\n    \
                 start_from: beginning\n    config:\n      collector: \"{}\"\n",
                plugin.display(),
                cache.display(),
                collector.host_port(),
                collector.url("/report")
            ));
        }
        let path = self.dir.path().join(format!("outbox-{sinks}.yaml"));
        std::fs::write(&path, yaml)?;
        Ok(path)
    }

    fn command(&self, config: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(&self.bin);
        command.arg("--config").arg(config).args(args).stdin(Stdio::null());
        command
    }

    /// Starts host `i` on `config`, its log in the soak's folder.
    fn start_host(&mut self, i: usize, config: &Path) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("host-{i}.log")))?;
        let child = self
            .command(config, &["run"])
            .env("OUTBOX__NODE_ID", format!("soak-{i}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting outbox-host")?;
        if i < self.hosts.len() {
            self.hosts[i] = Some(child);
        } else {
            self.hosts.push(Some(child));
        }
        Ok(())
    }

    /// SIGTERM, then waiting for the host to drain and exit (SIGKILL past a minute).
    async fn stop_host(&mut self, i: usize) {
        let Some(mut child) = self.hosts[i].take() else { return };
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    fn kill_host(&mut self, i: usize) {
        if let Some(mut child) = self.hosts[i].take() {
            let _ = child.kill();
            let _ = child.wait();
            self.kills += 1;
            self.faults_at.push(Instant::now());
        }
    }

    /// Runs `outbox-host <args>` to its end, saying what it printed.
    fn cli(&self, config: &Path, args: &[&str]) -> anyhow::Result<String> {
        let out = self.command(config, args).output()?;
        anyhow::ensure!(
            out.status.success(),
            "outbox-host {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    async fn run(mut self) -> anyhow::Result<Vec<SinkReport>> {
        let two = self.config(2)?;
        let three = self.config(3)?;
        // The deployment order: a migration job, the producer, then the hosts.
        println!("   migrate: {}", self.cli(&two, &["migrate"])?.replace('\n', "; "));
        let producer = outbox_host::store::open(&self.db.url, 4, "room_outbox").await?;
        let production = Duration::from_secs_f64(self.args.events as f64 / self.args.rate as f64);
        let writing = tokio::spawn(produce(producer.clone(), self.args.events, self.args.rooms, self.args.rate));
        for i in 0..self.args.hosts {
            self.start_host(i, &two)?;
        }
        let started = Instant::now();
        let production_began = now_ms();
        let mut replay_range = None;
        for (at, fault) in schedule(self.args.hosts) {
            let when = production.mul_f64(at);
            tokio::time::sleep(when.saturating_sub(started.elapsed())).await;
            let t = started.elapsed().as_secs_f64();
            match fault {
                Fault::Kill(i) => {
                    self.kill_host(i);
                    println!("   {t:5.1}s SIGKILL host {i}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let config = if self.third_sink { three.clone() } else { two.clone() };
                    self.start_host(i, &config)?;
                }
                Fault::CutDatabase(seconds) => {
                    self.proxy.cut();
                    self.cut_hosts += self.hosts.iter().flatten().count();
                    self.faults_at.push(Instant::now());
                    println!("   {t:5.1}s database connections cut for {seconds} s");
                    tokio::time::sleep(Duration::from_secs(seconds)).await;
                    self.proxy.restore();
                }
                Fault::HotReload => {
                    let next = self.dir.path().join("a.next");
                    std::fs::write(&next, another_build(&std::fs::read(outbox_test_support::FAKE_SINK)?))?;
                    std::fs::rename(&next, self.dir.path().join("a.wasm"))?;
                    println!("   {t:5.1}s sink a's plugin replaced (hot reload)");
                }
                Fault::AddThirdSink => {
                    println!("   {t:5.1}s rolling restart adding sink c (start_from: beginning)");
                    self.third_sink = true;
                    for i in 0..self.hosts.len() {
                        self.stop_host(i).await;
                        self.start_host(i, &three)?;
                    }
                }
                Fault::Purge => {
                    let said = self.cli(&three, &["purge", "--delivered-before", "1s"])?;
                    println!("   {t:5.1}s purge: {}", said.replace('\n', "; "));
                }
                Fault::Replay => {
                    // The first two seconds of events: long delivered by now.
                    let (from, to) = (production_began, production_began + 2_000);
                    let (from_text, to_text) =
                        (outbox_host::units::format_rfc3339_ms(from), outbox_host::units::format_rfc3339_ms(to));
                    let said =
                        self.cli(&three, &["replay", "--sink", "b", "--from", &from_text, "--to", &to_text, "--yes"])?;
                    println!("   {t:5.1}s {said} (created {from_text} to {to_text})");
                    // "replaying N event(s) to sink b"
                    let moved = said.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
                    replay_range = Some((from, to, moved));
                }
            }
        }
        let produced = writing.await??;
        println!("   {:5.1}s the producer wrote {} events", started.elapsed().as_secs_f64(), produced.len());
        let drained = self.drain(&producer, &produced).await;
        for i in 0..self.hosts.len() {
            self.stop_host(i).await;
        }
        drained?;
        let report = self.report(&producer, &produced, replay_range).await?;
        self.keep_logs()?;
        producer.close().await;
        Ok(report)
    }

    /// The most rows one host holds for one sink (see [`HELD_PER_HOST`]), at the default
    /// batch size with `--default-worker`.
    fn held_per_host(&self) -> usize {
        if self.args.default_worker {
            HELD_PER_HOST / BATCH_SIZE * outbox_host::engine::settings::DEFAULT_BATCH_SIZE as usize
        } else {
            HELD_PER_HOST
        }
    }

    /// What a consumer's hosts may deliver again after the faults, besides what they held:
    /// a consumer's host remembers its deliveries of the last settle time (positions stay
    /// [`SETTLE_MS`] behind, and move at heartbeats), and a host killed or cut off loses
    /// that memory, so its partitions' next owner delivers them again (decision 0203). For
    /// each fault, the sink's receipts from a settle time and a heartbeat (and a margin)
    /// before it until a partition lease after it: every host's, since which host sent
    /// which is not known.
    fn remembered_at_faults(&self, reports: &[outbox_test_support::Report]) -> usize {
        let lease = outbox_host::engine::settings::DEFAULT_PARTITION_LEASE;
        let before = Duration::from_millis(outbox_host::store::SETTLE_MS as u64) + lease / 3 + Duration::from_secs(2);
        self.faults_at
            .iter()
            .map(|at| {
                let from = at.checked_sub(before).unwrap_or(*at);
                reports.iter().filter(|r| r.at >= from && r.at <= *at + lease).count()
            })
            .sum()
    }

    /// Copies the hosts' logs into the details folder, if there is one.
    fn keep_logs(&self) -> anyhow::Result<()> {
        if let Some(dir) = &self.args.details {
            for i in 0..self.hosts.len() {
                let log = self.dir.path().join(format!("host-{i}.log"));
                std::fs::copy(&log, dir.join(format!("{}-host-{i}.log", self.backend)))?;
            }
        }
        Ok(())
    }

    /// Waits until every sink has received every event and its table has nothing waiting
    /// or in flight.
    async fn drain(&self, outbox: &Arc<dyn Store>, produced: &[Produced]) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(self.args.drain_seconds);
        let sinks = outbox.sinks().await?;
        loop {
            let mut done = true;
            for (i, name) in SINKS.iter().enumerate() {
                let Some(sink) = sinks.iter().find(|s| s.name == *name) else { continue };
                let stats = outbox.clone().sink_store(sink).await?.stats().await?;
                let open =
                    stats.count(Status::Pending) + stats.count(Status::Retryable) + stats.count(Status::Delivering);
                let seen: HashSet<String> = self.collectors[i].reports().into_iter().map(|r| r.event_id).collect();
                done &= open == 0 && seen.len() >= produced.len();
            }
            if done {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the sinks did not finish within {} s of the producer", self.args.drain_seconds);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn report(
        &self,
        outbox: &Arc<dyn Store>,
        produced: &[Produced],
        replay_range: Option<(i64, i64, usize)>,
    ) -> anyhow::Result<Vec<SinkReport>> {
        let sinks = outbox.sinks().await?;
        let by_id: HashMap<&str, &Produced> = produced.iter().map(|p| (p.event_id.as_str(), p)).collect();
        let mut out = Vec::new();
        // The sinks the hosts ran with.
        let used = if self.third_sink { SINKS.len() } else { 2 };
        for (i, name) in SINKS.iter().take(used).enumerate() {
            let sink = sinks.iter().find(|s| s.name == *name).with_context(|| format!("sink {name} not registered"))?;
            let stats = outbox.clone().sink_store(sink).await?.stats().await?;
            let reports = self.collectors[i].reports();
            // Receipts per event, and each room's events in the order they first arrived.
            let mut receipts: HashMap<&str, usize> = HashMap::new();
            // (seq, the attempt number of its first receipt) per room.
            let mut first_order: HashMap<usize, Vec<(usize, u32)>> = HashMap::new();
            for r in &reports {
                let Some(p) = by_id.get(r.event_id.as_str()) else { continue };
                let n = receipts.entry(p.event_id.as_str()).or_insert(0);
                *n += 1;
                if *n == 1 {
                    first_order.entry(p.room).or_default().push((p.seq, r.attempt));
                }
            }
            // Receipts past the first; of those in the replayed range, as many as the replay
            // moved back are its intended second deliveries, the rest duplicates.
            let in_range = |p: &Produced| {
                *name == "b"
                    && replay_range.is_some_and(|(from, to, _)| p.created_at_ms >= from && p.created_at_ms < to)
            };
            let extra = |p: &Produced| receipts.get(p.event_id.as_str()).map_or(0, |n| n.saturating_sub(1));
            let again_in_range = produced.iter().filter(|p| in_range(p) && extra(p) > 0).count();
            let replayed_again = again_in_range.min(replay_range.map_or(0, |(_, _, moved)| moved));
            let duplicates = produced.iter().map(extra).sum::<usize>() - replayed_again;
            if let Some(dir) = &self.args.details {
                std::fs::create_dir_all(dir)?;
                let mut lines = String::from("event_id\tcreated_at_ms\treceipts\tin_replay_range\n");
                for p in produced.iter().filter(|p| extra(p) > 0) {
                    let n = receipts.get(p.event_id.as_str()).copied().unwrap_or(0);
                    lines.push_str(&format!("{}\t{}\t{n}\t{}\n", p.event_id, p.created_at_ms, in_range(p)));
                }
                std::fs::write(dir.join(format!("{}-{name}.tsv", self.backend)), lines)?;
            }
            let backwards = |seqs: &[(usize, u32)]| seqs.windows(2).filter(|w| w[1].0 < w[0].0).count();
            let order_violations = first_order.values().map(|seqs| backwards(seqs)).sum();
            // Each room whose events first arrived out of order, in the order they arrived
            // (`seq@attempt`): in the details folder, and the first few on stderr.
            let mut rooms: Vec<_> = first_order.iter().filter(|(_, seqs)| backwards(seqs) > 0).collect();
            rooms.sort();
            let lines: Vec<String> = rooms
                .iter()
                .map(|(room, seqs)| {
                    let arrivals: Vec<String> = seqs.iter().map(|(seq, attempt)| format!("{seq}@{attempt}")).collect();
                    format!("{room}\t{}", arrivals.join(" "))
                })
                .collect();
            for line in lines.iter().take(5) {
                eprintln!("   {} sink {name}: room {line}", self.backend);
            }
            if let Some(dir) = &self.args.details {
                let text = format!("room\tfirst arrivals (seq@attempt)\n{}\n", lines.join("\n"));
                std::fs::write(dir.join(format!("{}-{name}-order.tsv", self.backend)), text)?;
            }
            out.push(SinkReport {
                backend: self.backend.clone(),
                sink: name,
                events: produced.len(),
                received: receipts.len(),
                duplicates,
                duplicate_bound: (self.kills + self.cut_hosts) * self.held_per_host()
                    + if i == 0 { 0 } else { self.remembered_at_faults(&reports) },
                replayed: replayed_again,
                delivering: stats.count(Status::Delivering),
                order_violations,
            });
        }
        Ok(out)
    }
}

/// Writes `events` events over `rooms` rooms at `rate` per second, in chunks, each room's
/// events numbered in the order they are written.
async fn produce(outbox: Arc<dyn Store>, events: usize, rooms: usize, rate: usize) -> anyhow::Result<Vec<Produced>> {
    const CHUNK: usize = 50;
    let rooms = rooms.max(1);
    let started = Instant::now();
    let mut produced = Vec::with_capacity(events);
    let mut next_seq = vec![0usize; rooms];
    while produced.len() < events {
        let mut chunk = Vec::new();
        for i in produced.len()..events.min(produced.len() + CHUNK) {
            let room = i % rooms;
            chunk.push(event(room, next_seq[room], now_ms()));
            next_seq[room] += 1;
        }
        let rows: Vec<NewEvent> = chunk.iter().map(|(row, _)| row.clone()).collect();
        outbox.insert(&rows).await?;
        produced.extend(chunk.into_iter().map(|(_, p)| p));
        let due = Duration::from_secs_f64(produced.len() as f64 / rate.max(1) as f64);
        tokio::time::sleep(due.saturating_sub(started.elapsed())).await;
    }
    Ok(produced)
}

/// Event `seq` of room `room`, as room-service writes it, created at `now` by the producer's
/// clock.
fn event(room: usize, seq: usize, now: i64) -> (NewEvent, Produced) {
    let event_id = format!("soak-{room:05}-{seq:06}");
    let room_id = format!("room-{room}");
    let body = outbox_proto::body_from_json("RoomGiftSent", &serde_json::json!({ "room_id": room_id }))
        .and_then(Result::ok)
        .unwrap_or_default();
    let envelope =
        outbox_host::envelope::encode("soak", &event_id, "RoomGiftSent", &room_id, seq as i64 + 1, now, body);
    let row = NewEvent {
        app_code: "soak".into(),
        event_id: event_id.clone(),
        event_type: "RoomGiftSent".into(),
        room_id,
        status: Status::Pending,
        envelope,
        created_at_ms: now,
        trace_context: None,
    };
    (row, Produced { event_id, room, seq, created_at_ms: now })
}

/// The same component with a custom section appended: another build (another digest) that
/// behaves the same.
fn another_build(wasm: &[u8]) -> Vec<u8> {
    let name = b"outbox-soak-build";
    let mut payload = vec![name.len() as u8];
    payload.extend_from_slice(name);
    payload.extend_from_slice(now_ms().to_string().as_bytes());
    let mut out = wasm.to_vec();
    out.push(0);
    out.push(payload.len() as u8);
    out.extend(payload);
    out
}
