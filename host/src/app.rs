//! The host's lifecycle in room-service's order: open the database and migrate, load the sink,
//! start the admin listener and the worker; on shutdown stop claiming, let in-flight
//! deliveries finish and record them, hand back what was not started, then close the
//! admin listener and the pool.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::engine::Worker;
use crate::ops::admin::{self, AdminState};
use crate::ops::metrics::Metrics;
use crate::sandbox::SinkRuntime;
use crate::store::{self, Store};
use crate::text::redact_url;

/// A started host: database open and migrated, sink loaded.
pub struct Host {
    config: Config,
    store: Arc<dyn Store>,
    worker: Option<Arc<Worker>>,
    metrics: Arc<Metrics>,
    admin: Option<tokio::net::TcpListener>,
}

/// Opens the configured database, saying which one could not be reached.
pub async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    store::open(&config.database.url, config.database.max_connections, &config.table)
        .await
        .with_context(|| format!("database.url {}", redact_url(&config.database.url)))
}

impl Host {
    /// Opens and migrates the database and loads the sink (unless the worker is disabled).
    pub async fn start(config: Config) -> anyhow::Result<Host> {
        for note in &config.notes {
            tracing::warn!("{note}");
        }
        let sink_config = config.require_sink("run")?.clone();
        let store = open_store(&config).await?;
        store.migrate().await.context("applying migrations")?;
        // Opened again: the store writes to the table as it is after migrating (a table
        // adopted from elsewhere may name rows by event_id, or take '' for "nothing").
        store.close().await;
        let store = open_store(&config).await?;
        check_schema(store.as_ref(), &config.node_id).await?;
        let metrics = Arc::new(Metrics::new(&sink_config.name));
        let worker = if config.worker.enabled {
            let sink = SinkRuntime::load_checked(
                &sink_config,
                config.worker.concurrency,
                config.worker.publish_timeout,
                metrics.clone(),
            )
            .await?;
            Some(Worker::new(store.clone(), Arc::new(sink), config.worker.clone(), &config.node_id, metrics.clone()))
        } else {
            None
        };
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
        Ok(Host { config, store, worker, metrics, admin })
    }

    /// The outbox store (tests inspect the table through it).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The worker, unless `outbox_worker.enabled` is false.
    pub fn worker(&self) -> Option<&Arc<Worker>> {
        self.worker.as_ref()
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
            sink: self.config.sink.as_ref().map(|s| s.name.clone()).unwrap_or_default(),
            guard: admin::Guard::new(&self.config.admin),
            unready_after_db_failures: self.config.admin.unready_after_db_failures,
        });
        let admin_stop = CancellationToken::new();
        let admin = self.admin.map(|listener| {
            if let Ok(bound) = listener.local_addr() {
                tracing::info!(listen = %bound, "admin listener up: /healthz /readyz");
            }
            admin::serve(listener, readiness.clone(), admin_stop.clone())
        });
        // The gauges are only read over the admin listener: without it, no query for them.
        let refresher = admin.is_some().then(|| {
            tokio::spawn(refresh_stats(
                self.store.clone(),
                self.metrics.clone(),
                self.config.admin.stats_interval,
                admin_stop.clone(),
            ))
        });
        readiness.worker_running.store(true, Ordering::Relaxed);
        let mark_draining = async {
            shutdown.cancelled().await;
            readiness.draining.store(true, Ordering::Relaxed);
            tracing::info!(worker = "room_outbox", node_id = %self.config.node_id, "shutting down: no new claims; finishing in-flight deliveries");
        };
        let worked = match self.worker.clone() {
            Some(worker) => {
                // Readiness flips (and says so) before the worker winds down.
                tokio::join!(mark_draining, worker.run(shutdown.clone())).1
            }
            None => {
                tracing::info!("outbox_worker.enabled is false: this host does not deliver");
                mark_draining.await;
                Ok(())
            }
        };
        readiness.worker_running.store(false, Ordering::Relaxed);
        admin_stop.cancel();
        // Each of these may wait on a database that is away: bounded by the grace period.
        let grace = self.config.worker.shutdown_grace;
        if let Some(task) = admin {
            let _ = tokio::time::timeout(grace, task).await;
        }
        if let Some(task) = refresher {
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
