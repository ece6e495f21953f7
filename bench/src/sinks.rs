//! What several sinks cost: one host draining the same events through 1, 2 and 4 no-op
//! WebAssembly sinks, each with its own delivery state (the first in the outbox's columns,
//! the others as consumers of the outbox: positions and exceptions).

use std::time::Instant;

use anyhow::ensure;
use outbox_host::app::Host;
use outbox_host::config::Config;
use outbox_host::store::Status;
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
