//! The host's lifecycle in room-service's order: open the database and migrate, load the sink,
//! start the admin listener and the worker; on shutdown stop claiming, let in-flight
//! deliveries finish and record them, hand back what was not started, then close the
//! admin listener and the pool. Hot reload (`reload`) lives here, with what wires the sinks.

pub mod reload;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, SinkConfig};
use crate::engine::Worker;
use crate::ops::admin::{self, AdminState};
use crate::ops::metrics::Metrics;
use crate::redact::url as redact_url;
use crate::sandbox::Deliver;
use crate::store::{self, RegisteredSink, Store};
use reload::{Relay, Reloader};

/// A started host: database open and migrated, sinks registered and loaded.
pub struct Host {
    config: Config,
    store: Arc<dyn Store>,
    sinks: Vec<SinkHost>,
    reloader: Arc<Reloader>,
    metrics: Arc<Metrics>,
    admin: Option<tokio::net::TcpListener>,
}

/// One configured sink on this host: where its state is, and its worker.
pub struct SinkHost {
    /// The sink as the table knows it.
    pub registered: RegisteredSink,
    /// Its delivery state: the outbox itself for the first sink, else its positions and
    /// exceptions as a consumer of the outbox.
    pub store: Arc<dyn Store>,
    /// Its worker, unless `outbox_worker.enabled` is false.
    pub worker: Option<Arc<Worker>>,
    /// Its view of the metrics.
    pub metrics: Arc<Metrics>,
}

/// Opens the configured database, saying which one could not be reached. On PostgreSQL each
/// wake-up listener holds a connection of the pool: with several sinks (a listener each, and
/// one for the fan-out), the pool grows by one per sink beyond the first, so that the
/// listeners never starve the claims and writes of `max_connections`.
pub async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    let postgres = store::Backend::from_url(&config.database.url) == Ok(store::Backend::Postgres);
    let listeners = if postgres && config.sinks.len() > 1 { config.sinks.len() as u32 } else { 0 };
    store::open(&config.database.url, config.database.max_connections + listeners, &config.table)
        .await
        .with_context(|| format!("database.url {}", redact_url(&config.database.url)))
}

/// Opens the database and brings the table to this host's migrations; returns the store
/// opened again on the table as it is afterwards (a table adopted from elsewhere may name
/// rows by event_id, or take '' for "nothing"), and what migrating found.
pub async fn migrated_store(config: &Config) -> anyhow::Result<(Arc<dyn Store>, store::Migrated)> {
    let store = open_store(config).await?;
    let migrated = store.migrate().await.context("applying migrations");
    store.close().await;
    let migrated = migrated?;
    Ok((open_store(config).await?, migrated))
}

/// Registers every configured sink on the table, in config order, so that `start_from: now`
/// means the moment a sink first appears in any command that migrates (`migrate`, `run`,
/// `enqueue`): a deployment that migrates before its producers start loses no event to a
/// sink whose first `run` comes later. A sink configured when `migrated` says the table was
/// just created starts from its beginning, whatever its `start_from`: no event is older.
pub async fn register_sinks(
    config: &Config,
    store: &dyn Store,
    migrated: store::Migrated,
) -> anyhow::Result<Vec<RegisteredSink>> {
    let mut registered: Vec<RegisteredSink> = Vec::new();
    for (i, sink) in config.sinks.iter().enumerate() {
        // Each a millisecond after the one before at least: the registry lists them in
        // config order.
        let now = registered.last().map_or(store::now_ms(), |last| store::now_ms().max(last.added_at_ms + 1));
        let start = if migrated.created { 0 } else { sink.start_from.start_ms(now) };
        registered.push(
            store
                .register_sink(sink.name(), start, i == 0, now)
                .await
                .with_context(|| format!("registering sink {} on {}", sink.name(), config.table))?,
        );
    }
    Ok(registered)
}

/// Turns the copy table an earlier version kept for each of `sinks` after the first into
/// its positions and exceptions (decision 0203), before anything of this version delivers
/// it; refuses, naming them, while hosts of that version still deliver it. `run` converts
/// its own sinks' copies, `migrate` every registered sink's.
pub async fn convert_copies(store: &dyn Store, sinks: &[RegisteredSink]) -> anyhow::Result<()> {
    for sink in sinks {
        let clock_ms = store.clock_ms().await?;
        if let Some(exceptions) = store
            .consumer_from_copy(sink, clock_ms)
            .await
            .with_context(|| format!("converting sink {}'s copy table {}", sink.name, sink.table))?
        {
            tracing::info!(sink = %sink.name, exceptions, "sink {} reads the outbox as a consumer now: its copy table {} is dropped", sink.name, sink.table);
        }
    }
    Ok(())
}

/// The sink a worker delivers through: the WebAssembly sink, or, for a sink with a
/// `broker:`, a relay publishing to that broker (connected, its stream checked).
pub async fn load_sink(config: &Config, sink: &SinkConfig, metrics: Arc<Metrics>) -> anyhow::Result<Arc<dyn Deliver>> {
    let relay = connect_broker(config, sink, false).await?;
    reload::build(sink, relay.as_ref(), metrics).await
}

/// For a sink with a `broker:`, that broker connected (its stream or exchange checked);
/// with `wait`, one that cannot be reached now is waited for (`relay::connect_waiting`).
async fn connect_broker(config: &Config, sink: &SinkConfig, wait: bool) -> anyhow::Result<Option<Relay>> {
    let Some(name) = &sink.broker else { return Ok(None) };
    let broker = config.brokers.iter().find(|b| b.name == *name).context("no such broker")?;
    let publisher =
        if wait { crate::relay::connect_waiting(broker).await? } else { crate::relay::connect(broker).await? };
    Ok(Some(Relay { publisher, room_pipeline: broker.room_pipeline }))
}

/// The longest pause between tries while the database cannot be reached at start-up.
const START_PAUSE_MAX: Duration = Duration::from_secs(10);

impl Host {
    /// Opens and migrates the database and loads the sink (unless the worker is disabled).
    pub async fn start(config: Config) -> anyhow::Result<Host> {
        log_notes(&config);
        Host::open(config).await
    }

    /// [`Host::start`], waiting while the database cannot be reached (it is starting, or
    /// away): each miss is logged and tried again after a pause that grows to
    /// [`START_PAUSE_MAX`], until the database answers, or `shutdown` (then `None`: nothing
    /// was claimed). A database that answers and refuses (a wrong password, no such
    /// database) and every other problem fail at once.
    pub async fn start_waiting(config: Config, shutdown: &CancellationToken) -> anyhow::Result<Option<Host>> {
        log_notes(&config);
        let mut pause = Duration::from_millis(500);
        loop {
            let error = tokio::select! {
                started = Host::open(config.clone()) => match started {
                    Ok(host) => return Ok(Some(host)),
                    Err(e) if unavailable(&e) => e,
                    Err(e) => return Err(e),
                },
                () = shutdown.cancelled() => return Ok(None),
            };
            tracing::warn!(error = %format!("{error:#}"), retry_in_ms = pause.as_millis() as u64, "the database cannot be reached at start-up; waiting for it");
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = shutdown.cancelled() => return Ok(None),
            }
            pause = (pause * 2).min(START_PAUSE_MAX);
        }
    }

    async fn open(config: Config) -> anyhow::Result<Host> {
        let sink_configs = config.require_sinks("run")?.to_vec();
        let (store, migrated) = migrated_store(&config).await?;
        check_schema(store.as_ref(), &config.node_id).await?;
        let metrics = Arc::new(Metrics::new(sink_configs[0].name()));
        let mut sinks = Vec::new();
        let mut reloader = Reloader::default();
        let registered = register_sinks(&config, store.as_ref(), migrated).await?;
        convert_copies(store.as_ref(), &registered).await?;
        for ((i, sink_config), registered) in sink_configs.iter().enumerate().zip(registered) {
            if i == 0 && !registered.is_first(&config.table) {
                tracing::warn!(sink = %registered.name, table = %registered.table, "this host's first sink is not the one the outbox's own status columns are for (that one was registered first); it keeps its state in its own table");
            }
            let sink_store = store.clone().sink_store(&registered).await?;
            let sink_metrics = if i == 0 { metrics.clone() } else { Arc::new(metrics.for_sink(sink_config.name())) };
            let mut relay = None;
            let worker = if config.worker.enabled {
                let context = || format!("sink {}", sink_config.name());
                relay = connect_broker(&config, sink_config, true).await.with_context(context)?;
                let sink =
                    reload::build(sink_config, relay.as_ref(), sink_metrics.clone()).await.with_context(context)?;
                let worker = Worker::new(
                    sink_store.clone(),
                    sink,
                    sink_config.worker.clone(),
                    &config.node_id,
                    sink_metrics.clone(),
                );
                worker.join_hosts().await.with_context(context)?;
                Some(worker)
            } else {
                None
            };
            if let Some(worker) = &worker {
                reloader.add(sink_config.clone(), worker.sink_slot().clone(), sink_metrics.clone(), relay);
            }
            sinks.push(SinkHost { registered, store: sink_store, worker, metrics: sink_metrics });
        }
        let admin = match config.admin.listen {
            Some(addr) => {
                if !addr.ip().is_loopback() && config.admin.token.is_none() {
                    tracing::warn!(
                        listen = %addr,
                        "SECURITY: the admin listener is reachable from the network and admin.token is not set: anyone who can reach it reads event bodies on /api/events and the status page (retry and purge stay refused without a token). Set admin.token, or listen on 127.0.0.1."
                    );
                }
                Some(admin::bind(addr).await?)
            }
            None => None,
        };
        Ok(Host { config, store, sinks, reloader: Arc::new(reloader), metrics, admin })
    }

    /// The outbox store (tests inspect the table through it).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The first sink's worker, unless `outbox_worker.enabled` is false.
    pub fn worker(&self) -> Option<&Arc<Worker>> {
        self.sinks.first().and_then(|s| s.worker.as_ref())
    }

    /// Reloads this host's sinks (a file change, `SIGHUP` and the admin API use it).
    pub fn reloader(&self) -> &Arc<Reloader> {
        &self.reloader
    }

    /// Every configured sink, in config order.
    pub fn sinks(&self) -> &[SinkHost] {
        &self.sinks
    }

    /// Where the admin listener is bound (`None` when `admin.listen` is empty).
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` is cancelled, then drains and closes everything.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let readiness = Arc::new(AdminState {
            store: self.store.clone(),
            metrics: self.metrics.clone(),
            worker_running: Default::default(),
            draining: Default::default(),
            table: self.config.table.clone(),
            node_id: self.config.node_id.clone(),
            guard: admin::Guard::new(&self.config.admin),
            reloader: self.reloader.clone(),
            unready_after_db_failures: self.config.admin.unready_after_db_failures,
            views: Default::default(),
        });
        let admin_stop = CancellationToken::new();
        let admin = self.admin.map(|listener| {
            if let Ok(bound) = listener.local_addr() {
                tracing::info!(listen = %bound, "admin listener up: /healthz /readyz");
            }
            admin::serve(listener, readiness.clone(), admin_stop.clone())
        });
        // The gauges are only read over the admin listener: without it, no query for them.
        let refreshers: Vec<_> = if admin.is_some() {
            self.sinks
                .iter()
                .map(|sink| {
                    tokio::spawn(refresh_stats(
                        sink.store.clone(),
                        sink.metrics.clone(),
                        self.config.admin.stats_interval,
                        admin_stop.clone(),
                    ))
                })
                .collect()
        } else {
            Vec::new()
        };
        let watcher = tokio::spawn(self.reloader.clone().watch(admin_stop.clone()));
        reload::reload_on_sighup(self.reloader.clone(), admin_stop.clone())?;
        readiness.worker_running.store(true, Ordering::Relaxed);
        let mark_draining = async {
            shutdown.cancelled().await;
            readiness.draining.store(true, Ordering::Relaxed);
            tracing::info!(worker = "room_outbox", node_id = %self.config.node_id, "shutting down: no new claims; finishing in-flight deliveries");
        };
        let workers: Vec<_> = self.sinks.iter().filter_map(|s| s.worker.clone()).collect();
        let worked = if workers.is_empty() {
            tracing::info!("outbox_worker.enabled is false: this host does not deliver");
            mark_draining.await;
            Ok(())
        } else {
            let runs = workers.into_iter().map(|worker| worker.run(shutdown.clone()));
            // Readiness flips (and says so) before the workers wind down.
            let results = tokio::join!(mark_draining, futures_util::future::join_all(runs)).1;
            results.into_iter().collect::<anyhow::Result<Vec<()>>>().map(|_| ())
        };
        readiness.worker_running.store(false, Ordering::Relaxed);
        admin_stop.cancel();
        // Each of these may wait on a database that is away: bounded by the grace period.
        let grace = self.config.worker.shutdown_grace;
        if let Some(task) = admin {
            let _ = tokio::time::timeout(grace, task).await;
        }
        let _ = watcher.await;
        for task in refreshers {
            let _ = tokio::time::timeout(grace, task).await;
        }
        if tokio::time::timeout(grace, self.store.close()).await.is_err() {
            tracing::warn!("the database pool did not close within outbox_worker.shutdown_grace");
        }
        tracing::info!(node_id = %self.config.node_id, "stopped");
        worked
    }
}

/// Refuses to start, listing every problem at once, when the table lacks a column, a type
/// or the index the host relies on (say, a column dropped or narrowed after `migrate`).
async fn check_schema(store: &dyn Store, node_id: &str) -> anyhow::Result<()> {
    let worker_id_chars = crate::engine::worker_id_len(node_id);
    let problems = match store.review(Some(worker_id_chars)).await.context("reading the table's columns")? {
        None => vec![format!("table {} does not exist: run `outbox-host migrate`", store.table())],
        Some(review) => {
            let missing = review.additions.iter().map(|a| format!("{a} is missing: run `outbox-host migrate`"));
            review.problems.into_iter().chain(missing).collect()
        }
    };
    if problems.is_empty() {
        return Ok(());
    }
    anyhow::bail!("the table {} cannot be used as it is:\n  - {}", store.table(), problems.join("\n  - "))
}

/// Refreshes the metrics' table counts every `interval` until `stop`.
async fn refresh_stats(
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    interval: std::time::Duration,
    stop: CancellationToken,
) {
    loop {
        match store.stats().await {
            Ok(stats) => metrics.set_stats(&stats, crate::store::now_ms()),
            Err(e) => {
                metrics.db_error("stats", &e);
                tracing::warn!(error = %e, "could not read the table counts for the metrics");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// The config's notes (settings that were adjusted, not refused), once per start.
fn log_notes(config: &Config) {
    for note in &config.notes {
        tracing::warn!("{note}");
    }
}

/// Whether `error` is the database being out of reach (worth waiting for).
fn unavailable(error: &anyhow::Error) -> bool {
    error
        .chain()
        .any(|cause| matches!(cause.downcast_ref::<store::StoreError>(), Some(store::StoreError::Unavailable(_))))
}

/// Cancels `shutdown` on the first SIGINT or SIGTERM and exits the process at once on the
/// second (leases then expire and another worker picks the rows up).
pub fn cancel_on_signals(shutdown: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        shutdown.cancel();
        tracing::info!("signal received: draining (send another to exit at once)");
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::warn!("second signal: exiting now; claimed rows return when their leases expire");
        std::process::exit(130);
    });
    Ok(())
}
