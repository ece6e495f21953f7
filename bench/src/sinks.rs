//! What several sinks cost: one host draining the same events through 1, 2 and 4 no-op
//! WebAssembly sinks, each with its own delivery state (the first in the outbox's columns,
//! the others as consumers of the outbox: positions and exceptions).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::ensure;
use outbox_host::app::Host;
use outbox_host::config::Config;
use outbox_host::ops::metrics::Metrics;
use outbox_host::store::{Backend, Status, Store};
use outbox_test_support::Collector;
use tokio_util::sync::CancellationToken;

use crate::cpu;
use crate::db::Db;

/// One drain through several sinks.
pub struct SinksDrain {
    /// Until every sink had every event.
    pub seconds: f64,
    /// On PostgreSQL, per event: rows the host wrote in every table of the schema and WAL
    /// bytes.
    pub writes: Option<[f64; 2]>,
    /// Cores the host and the server used while it ran.
    pub cores: cpu::Cores,
}

impl SinksDrain {
    /// Processor microseconds per event, host and server together (the host's alone where
    /// the server is not a process of this machine): on two shared cores, what bounds a
    /// drain that keeps them busy.
    pub fn cpu_us_per_event(&self, n: usize) -> f64 {
        (self.cores.host + self.cores.server.unwrap_or(0.0)) * self.seconds * 1e6 / n as f64
    }
}

/// Fills a fresh table with `n` events and drains it through `sinks` no-op sinks on one
/// host with the default config, then checks that each sink's state says delivered for
/// each and its sink was called once per event. The time is until every sink was called
/// once per event and the first sink's rows say so; the writes are counted once every
/// consumer's positions have settled (ten seconds behind, outside the timing) and the host
/// stopped.
pub async fn drain(db: &Db, n: usize, sinks: usize, cache: &std::path::Path) -> anyhow::Result<SinksDrain> {
    let producer = db.open().await?;
    crate::fill(producer.as_ref(), n, 1_000).await?;
    let config = config(db, sinks, "sink", cache)?;
    let host = Host::start(config).await?;
    // Each sink's state read through the producer's own pool, which outlives the host's.
    let mut states = Vec::new();
    for sink in producer.sinks().await? {
        states.push(producer.clone().sink_store(&sink).await?);
    }
    ensure!(states.len() == sinks, "{} sinks registered, {sinks} configured", states.len());
    let metrics: Vec<_> = host.sinks().iter().map(|s| s.metrics.clone()).collect();
    let writes_before = db.pg_writes().await?;
    let shutdown = CancellationToken::new();
    let meter = cpu::Meter::start(db).await;
    let started = Instant::now();
    let run = tokio::spawn(host.run(shutdown.clone()));
    crate::wait_drained(&states[..1], n, || metrics.iter().all(|m| m.delivered_total() >= n as u64)).await?;
    let seconds = started.elapsed().as_secs_f64();
    let cores = meter.read();
    // The consumers' positions settle behind the horizon, at their heartbeats: waited for,
    // so that stopping writes no memory.
    crate::wait_drained(&states, n, || true).await?;
    shutdown.cancel();
    run.await??;
    // The host's pool is closed by now.
    let writes = match (writes_before, db.pg_writes_settled().await?) {
        (Some(before), Some(after)) => {
            let per = |after: i64, before: i64| (after - before) as f64 / n as f64;
            Some([per(after.schema_rows, before.schema_rows), per(after.wal, before.wal)])
        }
        _ => None,
    };
    for (state, metrics) in states.iter().zip(&metrics) {
        let stats = state.stats().await?;
        ensure!(
            stats.count(Status::Delivered) == n as i64 && stats.counts.iter().map(|(_, c)| c).sum::<i64>() == n as i64,
            "{}: rows not all delivered: {stats:?}",
            state.table()
        );
        ensure!(
            metrics.delivered_total() == n as u64,
            "{}: the sink was called {} times for {n} events",
            metrics.sink(),
            metrics.delivered_total()
        );
    }
    producer.close().await;
    Ok(SinksDrain { seconds, writes, cores })
}

/// The default config with `sinks` no-op sinks starting from the beginning: `fake`, then
/// `<later>1`, `<later>2`, ….
fn config(db: &Db, sinks: usize, later: &str, cache: &std::path::Path) -> anyhow::Result<Config> {
    let entries: String = (0..sinks)
        .map(|i| {
            let name = if i == 0 { "fake".to_string() } else { format!("{later}{i}") };
            format!(
                "  - name: {name}\n    plugin: {}\n    cache_dir: {}\n    start_from: beginning\n    config: {{ default: ok }}\n",
                outbox_test_support::FAKE_SINK,
                cache.display()
            )
        })
        .collect();
    let yaml = format!("node_id: bench\ndatabase:\n  url: \"{}\"\nadmin:\n  listen: \"\"\nsinks:\n{entries}", db.url());
    Ok(Config::from_yaml(&yaml, std::iter::empty(), &|_| None)?)
}

/// A later sink whose destination is down while the first sink drains (issue 48's target: a
/// paused sink does not slow the others by more than 10%, and catches up after).
pub struct Paused {
    /// Seconds the first sink took to drain with the later sink's destination up, and down.
    pub other_up: f64,
    pub other_down: f64,
    /// The later sink's failed attempts while its destination was down (its breaker opens at
    /// the first push-back, so these are a handful, not one per event).
    pub attempts_down: u64,
    /// From the destination's return until the later sink had delivered every event.
    pub catch_up: f64,
    /// Seconds the later sink took to drain from the host's start with its destination up.
    pub later_up: f64,
}

/// Two runs on fresh tables of `n` events, one host with two sinks: the fake sink answering
/// `ok` first, then the webhook sink, a consumer, posting to a local receiver. In the first
/// run the receiver is up throughout; in the second nothing listens on its port (every post
/// refused, which the webhook sink reports as the destination unavailable) until `pause`
/// after the host started. Each run checks that both sinks delivered every event once and
/// that the receiver got every event.
pub async fn paused(backend: Backend, n: usize, pause: Duration, cache: &std::path::Path) -> anyhow::Result<Paused> {
    let receiver = Collector::start().await;
    let up = TwoSinks::start(Db::fresh(backend).await?, n, &receiver.host_port(), cache).await?;
    let other_up = up.first_drained().await?;
    let later_up = up.later_drained().await?;
    up.finish(&receiver).await?;

    // A port nothing listens on until the receiver comes back on it.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string();
    let down = TwoSinks::start(Db::fresh(backend).await?, n, &addr, cache).await?;
    let other_down = down.first_drained().await?;
    tokio::time::sleep_until((down.started + pause).into()).await;
    let attempts_down = down.later_failures();
    ensure!(down.metrics[1].delivered_total() == 0, "the later sink delivered while its destination was down");
    let receiver = Collector::start_on(&addr).await;
    let back = Instant::now();
    down.later_drained().await?;
    let catch_up = back.elapsed().as_secs_f64();
    down.finish(&receiver).await?;
    Ok(Paused { other_up, other_down, attempts_down, catch_up, later_up })
}

/// One host delivering a fresh table through the fake sink and a webhook sink posting to
/// `receiver` (`host:port`).
struct TwoSinks {
    producer: Arc<dyn Store>,
    states: Vec<Arc<dyn Store>>,
    metrics: Vec<Arc<Metrics>>,
    shutdown: CancellationToken,
    run: tokio::task::JoinHandle<anyhow::Result<()>>,
    started: Instant,
    n: usize,
    /// Kept for the run: a SQLite database's directory goes with it.
    _db: Db,
}

impl TwoSinks {
    async fn start(db: Db, n: usize, receiver: &str, cache: &std::path::Path) -> anyhow::Result<TwoSinks> {
        let producer = db.open().await?;
        crate::fill(producer.as_ref(), n, 1_000).await?;
        let yaml = format!(
            "node_id: bench\ndatabase:\n  url: \"{url}\"\nadmin:\n  listen: \"\"\nsinks:\n\
             \x20 - name: fake\n    plugin: {fake}\n    cache_dir: {cache}\n    config: {{ default: ok }}\n\
             \x20 - name: hook1\n    plugin: {hook}\n    cache_dir: {cache}\n    start_from: beginning\n\
             \x20   allowed_hosts: [\"{receiver}\"]\n    allow_http: true\n\
             \x20   config: {{ url: \"http://{receiver}/events\", secret: \"{SECRET}\" }}\n",
            url = db.url(),
            fake = outbox_test_support::FAKE_SINK,
            hook = outbox_test_support::WEBHOOK_SINK,
            cache = cache.display(),
        );
        let host = Host::start(Config::from_yaml(&yaml, std::iter::empty(), &|_| None)?).await?;
        let mut states = Vec::new();
        for sink in producer.sinks().await? {
            states.push(producer.clone().sink_store(&sink).await?);
        }
        ensure!(states.len() == 2, "{} sinks registered, 2 configured", states.len());
        let metrics = host.sinks().iter().map(|s| s.metrics.clone()).collect();
        let shutdown = CancellationToken::new();
        let started = Instant::now();
        let run = tokio::spawn(host.run(shutdown.clone()));
        Ok(TwoSinks { producer, states, metrics, shutdown, run, started, n, _db: db })
    }

    /// Seconds from the start until the first sink was called for every event and its rows
    /// say so.
    async fn first_drained(&self) -> anyhow::Result<f64> {
        let n = self.n as u64;
        crate::wait_drained(&self.states[..1], self.n, || self.metrics[0].delivered_total() >= n).await?;
        Ok(self.started.elapsed().as_secs_f64())
    }

    /// Seconds from the start until the later sink had delivered every event, by its own
    /// count (its positions settle up to ten seconds behind: [`TwoSinks::finish`] checks
    /// them).
    async fn later_drained(&self) -> anyhow::Result<f64> {
        let deadline = Instant::now() + Duration::from_secs(600);
        while self.metrics[1].delivered_total() < self.n as u64 {
            ensure!(Instant::now() < deadline, "the later sink did not deliver every event within ten minutes");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(self.started.elapsed().as_secs_f64())
    }

    /// The later sink's failed attempts so far, from the host's metrics.
    fn later_failures(&self) -> u64 {
        let text = self.metrics[1].render();
        let failures = text
            .lines()
            .filter(|l| l.starts_with("room_outbox_publish_failure_total{") && l.contains("sink=\"hook1\""));
        failures.filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum::<f64>() as u64
    }

    /// Waits until both sinks' states say delivered, stops the host, and checks each sink was
    /// called once per event and `receiver` got every event.
    async fn finish(self, receiver: &Collector) -> anyhow::Result<()> {
        let n = self.n as u64;
        crate::wait_drained(&self.states, self.n, || self.metrics.iter().all(|m| m.delivered_total() >= n)).await?;
        self.shutdown.cancel();
        self.run.await??;
        for metrics in &self.metrics {
            ensure!(
                metrics.delivered_total() == n,
                "{}: called {} times for {n} events",
                metrics.sink(),
                metrics.delivered_total()
            );
        }
        let ids: HashSet<String> = receiver
            .seen()
            .into_iter()
            .filter_map(|s| s.headers.into_iter().find(|(k, _)| k == "webhook-id").map(|(_, v)| v))
            .collect();
        ensure!(ids.len() == self.n, "the receiver got {} of {} events", ids.len(), self.n);
        self.producer.close().await;
        Ok(())
    }
}

/// The webhook sink's signing secret in the benchmark (a receiver here does not verify).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
