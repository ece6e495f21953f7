//! What several sinks cost: one host draining the same events through 1, 2 and 4 no-op
//! WebAssembly sinks, each with its own delivery state (the first in the outbox's columns,
//! the others in their own tables, filled by the fan-out).

use std::time::Instant;

use anyhow::ensure;
use outbox_host::app::Host;
use outbox_host::config::Config;
use outbox_host::store::Status;
use tokio_util::sync::CancellationToken;

use crate::db::Db;

/// One drain through several sinks.
pub struct SinksDrain {
    /// Until every sink had every event.
    pub seconds: f64,
    /// On PostgreSQL, per event: rows the host wrote in every table of the schema and WAL
    /// bytes.
    pub writes: Option<[f64; 2]>,
}

/// Fills a fresh table with `n` events and drains it through `sinks` no-op sinks on one
/// host with the default config, after checking that each sink's state says delivered for
/// each and its sink was called once per event.
pub async fn drain(db: &Db, n: usize, sinks: usize, cache: &std::path::Path) -> anyhow::Result<SinksDrain> {
    let producer = db.open().await?;
    crate::fill(producer.as_ref(), n, 1_000).await?;
    let config = config(db, sinks, "copy", cache)?;
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
    let started = Instant::now();
    let run = tokio::spawn(host.run(shutdown.clone()));
    crate::wait_drained(&states, n, || metrics.iter().all(|m| m.delivered_total() >= n as u64)).await?;
    let seconds = started.elapsed().as_secs_f64();
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
    Ok(SinksDrain { seconds, writes })
}

/// [`drain`] with every sink after the first a consumer of the outbox (issue 48, not yet
/// the host's way): the same config and sinks, each delivered by a worker of its own on one
/// process, the first on the outbox's columns, the others on positions and exceptions. The
/// time is until every sink was called once per event; the writes are counted once every
/// consumer's positions have settled (ten seconds behind, outside the timing) and every
/// worker stopped.
pub async fn consumers_drain(db: &Db, n: usize, sinks: usize, cache: &std::path::Path) -> anyhow::Result<SinksDrain> {
    use std::sync::Arc;

    use outbox_host::engine::Worker;
    use outbox_host::ops::metrics::Metrics;

    let producer = db.open().await?;
    crate::fill(producer.as_ref(), n, 1_000).await?;
    // The index a consumer reads the outbox by, in creation order (the host does not build
    // it yet).
    let index = "CREATE INDEX room_outbox_created_idx ON room_outbox (created_at_ms, id)";
    db.execute(index).await?;
    let config = config(db, sinks, "consumer", cache)?;
    let store = outbox_host::store::open(db.url(), config.database.max_connections, &config.table).await?;
    let migrated = store.migrate().await?;
    let registered = outbox_host::app::register_sinks(&config, store.as_ref(), migrated).await?;
    let mut workers = Vec::new();
    let mut states = Vec::new();
    let mut metrics = Vec::new();
    for (i, (sink, entry)) in registered.iter().zip(&config.sinks).enumerate() {
        let state =
            if i == 0 { store.clone().sink_store(sink).await? } else { store.clone().consumer_store(sink).await? };
        let m = Arc::new(Metrics::new(entry.name()));
        let deliver = outbox_host::app::load_sink(&config, entry, m.clone()).await?;
        workers.push(Worker::new(state.clone(), deliver, entry.worker.clone(), "bench", m.clone()));
        states.push(state);
        metrics.push(m);
    }
    let writes_before = db.pg_writes().await?;
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let runs: Vec<_> = workers.iter().map(|w| tokio::spawn(w.clone().run(shutdown.clone()))).collect();
    let deadline = Instant::now() + std::time::Duration::from_secs(3_600);
    while !metrics.iter().all(|m| m.delivered_total() >= n as u64) {
        ensure!(Instant::now() < deadline, "the drain did not finish within an hour");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    // The consumers' positions settle behind the horizon, at their heartbeats: waited for,
    // so that stopping writes no memory.
    for state in &states {
        while state.stats().await?.count(Status::Delivered) < n as i64 {
            ensure!(Instant::now() < deadline, "the positions did not settle within an hour");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    shutdown.cancel();
    for run in runs {
        run.await??;
    }
    store.close().await;
    let writes = match (writes_before, db.pg_writes_settled().await?) {
        (Some(before), Some(after)) => {
            let per = |after: i64, before: i64| (after - before) as f64 / n as f64;
            Some([per(after.schema_rows, before.schema_rows), per(after.wal, before.wal)])
        }
        _ => None,
    };
    for (i, m) in metrics.iter().enumerate() {
        ensure!(
            m.delivered_total() == n as u64,
            "{}: the sink was called {} times for {n} events",
            m.sink(),
            m.delivered_total()
        );
        let stats = producer.clone().consumer_store(&registered[i]).await?.stats().await?;
        ensure!(stats.count(Status::Delivered) == n as i64, "{}: not all delivered: {stats:?}", m.sink());
    }
    producer.close().await;
    Ok(SinksDrain { seconds, writes })
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
