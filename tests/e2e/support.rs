//! Shared set-up: a fresh SQLite file per test, the real fake sink, a collector server, and
//! a running host whose progress signals the tests wait on.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use outbox_host::app::Host;
use outbox_host::config::Config;
use outbox_host::store::{NewEvent, Row, SqliteStore, Status, Store, now_ms};
use outbox_host::worker::Signal;
use outbox_test_support::{Collector, FAKE_SINK};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long any wait in these tests may take before it fails.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// One test's world: its own database file, its own collector.
pub struct World {
    pub dir: tempfile::TempDir,
    pub collector: Collector,
    /// A producer's connection to the same database.
    pub producer: SqliteStore,
}

impl World {
    pub async fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let collector = Collector::start().await;
        let url = format!("sqlite://{}", dir.path().join("outbox.db").display());
        let producer = SqliteStore::connect(&url, 2, "room_outbox").await.unwrap();
        producer.migrate().await.unwrap();
        World {
            dir,
            collector,
            producer,
        }
    }

    pub fn db_url(&self) -> String {
        format!("sqlite://{}", self.dir.path().join("outbox.db").display())
    }

    /// The YAML of a host on this world's database with the fake sink reporting to the
    /// collector. `worker` and `sink_config` are extra lines for those sections.
    pub fn yaml(&self, worker: &str, sink_config: &str) -> String {
        let indent = |text: &str, by: &str| {
            text.lines()
                .map(|l| format!("{by}{l}\n"))
                .collect::<String>()
        };
        // Test defaults, each replaced by a line of `worker` naming the same key.
        let defaults = [
            "poll_interval: 50ms",
            "retry_interval: 50ms",
            "publish_timeout: 2s",
            "batch_size: 10",
            "concurrency: 4",
        ];
        let key = |line: &str| line.split(':').next().unwrap_or("").trim().to_string();
        let overridden: Vec<String> = worker.lines().map(key).collect();
        let worker_lines: Vec<&str> = defaults
            .into_iter()
            .filter(|d| !overridden.contains(&key(d)))
            .chain(worker.lines())
            .collect();
        format!(
            "node_id: test-node\n\
             database:\n  url: \"{db}\"\n\
             outbox_worker:\n{worker}\
             sink:\n  name: fake\n  plugin: \"{plugin}\"\n  cache_dir: \"{cache}\"\n  memory_limit: 16MiB\n  allowed_hosts: [\"{collector}\"]\n  config:\n    collector: \"{report}\"\n{sink}\
             admin:\n  listen: \"\"\n",
            db = self.db_url(),
            worker = indent(&worker_lines.join("\n"), "  "),
            plugin = FAKE_SINK,
            cache = sink_cache_dir().display(),
            collector = self.collector.host_port(),
            report = self.collector.url("/report"),
            sink = indent(sink_config, "    "),
        )
    }

    pub fn config(&self, worker: &str, sink_config: &str) -> Config {
        Config::from_yaml(&self.yaml(worker, sink_config), std::iter::empty(), &|_| {
            None
        })
        .unwrap_or_else(|e| panic!("test config refused: {e}"))
    }

    /// Inserts one event as room-service does (envelope and row agree), returning its id.
    pub async fn produce(&self, event_type: &str, room: &str, status: Status) -> String {
        let event_id = format!("evt-{}", outbox_host::random_u64());
        let body =
            outbox_proto::body_from_json(event_type, &serde_json::json!({ "room_id": room }))
                .expect("known event type")
                .unwrap();
        let envelope =
            outbox_host::envelope::encode("app-1", &event_id, event_type, room, 1, now_ms(), body);
        self.insert(&event_id, event_type, room, status, envelope)
            .await;
        event_id
    }

    /// Inserts a row with the given envelope bytes.
    pub async fn insert(
        &self,
        event_id: &str,
        event_type: &str,
        room: &str,
        status: Status,
        envelope: Vec<u8>,
    ) {
        let event = NewEvent {
            app_code: "app-1".into(),
            event_id: event_id.into(),
            event_type: event_type.into(),
            room_id: room.into(),
            status,
            envelope,
            created_at_ms: now_ms(),
        };
        self.producer.insert(&[event]).await.unwrap();
    }

    pub async fn row(&self, event_id: &str) -> Row {
        self.producer
            .get(event_id)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no row {event_id}"))
    }
}

/// Compiled sinks are cached across tests (which also exercises the cache).
fn sink_cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sink-cache")
}

/// A host running in this process.
pub struct Running {
    pub signals: broadcast::Receiver<Signal>,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    pub async fn start(config: Config) -> Running {
        let host = Host::start(config).await.expect("host starts");
        let worker = host.worker().expect("worker enabled").clone();
        let signals = worker.subscribe();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(host.run(shutdown.clone()));
        Running {
            signals,
            shutdown,
            task,
        }
    }

    /// Waits, re-checking after every worker signal, until `check` holds.
    pub async fn wait_for<F, Fut>(&mut self, what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if check().await {
                return;
            }
            tokio::select! {
                _ = self.signals.recv() => {}
                _ = tokio::time::sleep_until(deadline) => panic!("timed out waiting for {what}"),
            }
        }
    }

    /// Waits until the worker reports `signal`.
    pub async fn wait_signal(&mut self, what: &str, mut matches: impl FnMut(&Signal) -> bool) {
        let wait = async {
            loop {
                match self.signals.recv().await {
                    Ok(s) if matches(&s) => return,
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => {
                        panic!("worker gone while waiting for {what}")
                    }
                }
            }
        };
        tokio::time::timeout(PATIENCE, wait)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
    }

    /// Waits for `status` on every listed event.
    pub async fn wait_status(&mut self, world: &World, event_ids: &[&str], status: Status) {
        let what = format!("{event_ids:?} to be {status}");
        self.wait_for(&what, || async {
            for id in event_ids {
                if world.row(id).await.status != status {
                    return false;
                }
            }
            true
        })
        .await;
    }

    /// Shuts down as on SIGTERM and waits for the host to finish.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("host stops")
            .unwrap()
            .unwrap();
    }
}
