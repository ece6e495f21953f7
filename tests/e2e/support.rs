//! Shared set-up: a fresh SQLite file per test, the real fake sink, a collector server, and
//! a running host whose progress signals the tests wait on.

use std::future::Future;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use outbox_host::app::Host;
use outbox_host::config::Config;
use outbox_host::engine::Signal;
use outbox_host::store::{Backend, NewEvent, Row, Status, Store, now_ms};
use outbox_test_support::{Collector, FAKE_SINK};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long any wait in these tests may take before it fails.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A database of the test's own: a SQLite file, a PostgreSQL schema or a MySQL database.
pub struct TestDb {
    pub url: String,
    pub backend: Backend,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("outbox.db").display());
        TestDb { url, backend: Backend::Sqlite, _dir: Some(dir) }
    }

    /// A fresh schema on `TEST_POSTGRES_URL`, or `None` (skipped) when it is not set.
    pub async fn postgres() -> Option<TestDb> {
        let base = server_url("TEST_POSTGRES_URL", "PostgreSQL")?;
        let schema = fresh_name();
        let admin = sqlx::PgPool::connect(&base).await.expect("connecting to TEST_POSTGRES_URL");
        sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&admin).await.unwrap();
        admin.close().await;
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-c%20search_path%3D{schema}&application_name={schema}");
        Some(TestDb { url, backend: Backend::Postgres, _dir: None })
    }

    /// A fresh database on `TEST_MYSQL_URL`, or `None` (skipped) when it is not set.
    pub async fn mysql() -> Option<TestDb> {
        let base = server_url("TEST_MYSQL_URL", "MySQL/MariaDB")?;
        let database = fresh_name();
        let admin = sqlx::MySqlPool::connect(&base).await.expect("connecting to TEST_MYSQL_URL");
        sqlx::query(&format!("CREATE DATABASE {database}")).execute(&admin).await.unwrap();
        admin.close().await;
        let mut url = reqwest::Url::parse(&base).unwrap();
        url.set_path(&database);
        Some(TestDb { url: url.to_string(), backend: Backend::Mysql, _dir: None })
    }

    /// The schema (PostgreSQL) or database (MySQL) name.
    pub fn name(&self) -> String {
        match self.backend {
            Backend::Postgres => self.url.rsplit("application_name=").next().unwrap().to_string(),
            _ => self.url.rsplit('/').next().unwrap().to_string(),
        }
    }
}

/// Test schemas and databases are named `outbox_t_…`; `.ci/run` drops old ones.
fn fresh_name() -> String {
    format!("outbox_t_{:016x}", outbox_host::clock::random_u64())
}

/// The server URL from `var`, or `None` after saying (once, past the test harness's output
/// capture) that these suites are skipped. With `OUTBOX_REQUIRE_SERVER_TESTS=1`, as CI sets
/// it, a missing URL fails the test instead.
fn server_url(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("OUTBOX_REQUIRE_SERVER_TESTS").is_err(),
                "{var} is not set but OUTBOX_REQUIRE_SERVER_TESTS is: the {what} suites must run"
            );
            static ONCE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
            let mut said = ONCE.lock().unwrap();
            if !said.contains(&var.to_string()) {
                said.push(var.to_string());
                let _ = writeln!(std::io::stderr(), "note: {var} is not set: the {what} suites are skipped");
            }
            None
        }
    }
}

/// One test's world: its own database, its own collector, a folder for files.
pub struct World {
    pub db: TestDb,
    pub dir: tempfile::TempDir,
    pub collector: Collector,
    /// A producer's connection to the same database.
    pub producer: Arc<dyn Store>,
}

impl World {
    /// A world on a fresh SQLite file.
    pub async fn new() -> World {
        World::on(TestDb::sqlite()).await
    }

    pub async fn on(db: TestDb) -> World {
        let dir = tempfile::tempdir().unwrap();
        let collector = Collector::start().await;
        let producer = outbox_host::store::open(&db.url, 2, "room_outbox").await.unwrap();
        producer.migrate().await.unwrap();
        World { db, dir, collector, producer }
    }

    pub fn db_url(&self) -> String {
        self.db.url.clone()
    }

    /// The fake sink reporting to this world's collector, with extra `config:` lines.
    pub fn fake_sink(&self, config: &str) -> SinkSpec {
        SinkSpec {
            name: "fake",
            plugin: FAKE_SINK,
            allowed_hosts: vec![self.collector.host_port()],
            config: format!("collector: \"{}\"\n{config}", self.collector.url("/report")),
        }
    }

    /// The YAML of a host on this world's database with the fake sink reporting to the
    /// collector. `worker` and `sink_config` are extra lines for those sections.
    pub fn yaml(&self, worker: &str, sink_config: &str) -> String {
        self.yaml_with(worker, &self.fake_sink(sink_config))
    }

    /// The YAML of a host on this world's database with `sink`; `worker` lines replace
    /// the test defaults (and earlier lines) they name.
    pub fn yaml_with(&self, worker: &str, sink: &SinkSpec) -> String {
        let indent = |text: &str, by: &str| text.lines().map(|l| format!("{by}{l}\n")).collect::<String>();
        let defaults =
            ["poll_interval: 50ms", "retry_interval: 50ms", "publish_timeout: 2s", "batch_size: 10", "concurrency: 4"];
        let key = |line: &str| line.split(':').next().unwrap_or("").trim().to_string();
        // A later line wins over an earlier one with the same key.
        let all: Vec<&str> = defaults.into_iter().chain(worker.lines()).collect();
        let worker_lines: Vec<&str> = all
            .iter()
            .enumerate()
            .filter(|(i, l)| !all[i + 1..].iter().any(|m| key(m) == key(l)))
            .map(|(_, l)| *l)
            .collect();
        let hosts: Vec<String> = sink.allowed_hosts.iter().map(|h| format!("\"{h}\"")).collect();
        format!(
            "node_id: test-node\n\
             database:\n  url: \"{db}\"\n  max_connections: 4\n\
             outbox_worker:\n{worker}\
             sink:\n  name: {name}\n  plugin: \"{plugin}\"\n  cache_dir: \"{cache}\"\n  memory_limit: 16MiB\n  allow_http: true\n  allowed_hosts: [{hosts}]\n  config:\n{config}\
             admin:\n  listen: \"\"\n",
            db = self.db_url(),
            worker = indent(&worker_lines.join("\n"), "  "),
            name = sink.name,
            plugin = sink.plugin,
            cache = sink_cache_dir().display(),
            hosts = hosts.join(", "),
            config = indent(&sink.config, "    "),
        )
    }

    /// [`World::yaml_with`], parsed.
    pub fn config_with(&self, worker: &str, sink: &SinkSpec) -> Config {
        Config::from_yaml(&self.yaml_with(worker, sink), std::iter::empty(), &|_| None)
            .unwrap_or_else(|e| panic!("test config refused: {e}"))
    }

    pub fn config(&self, worker: &str, sink_config: &str) -> Config {
        self.config_with(worker, &self.fake_sink(sink_config))
    }

    /// An event as room-service builds it (envelope and row agree), with a fresh id.
    pub fn event(&self, event_type: &str, room: &str, status: Status) -> NewEvent {
        let event_id = format!("evt-{:016x}", outbox_host::clock::random_u64());
        let body = outbox_proto::body_from_json(event_type, &serde_json::json!({ "room_id": room }))
            .expect("known event type")
            .unwrap();
        let envelope = outbox_host::envelope::encode("app-1", &event_id, event_type, room, 1, now_ms(), body);
        NewEvent {
            app_code: "app-1".into(),
            event_id,
            event_type: event_type.into(),
            room_id: room.into(),
            status,
            envelope,
            created_at_ms: now_ms(),
        }
    }

    /// Inserts one event as room-service does, returning its id.
    pub async fn produce(&self, event_type: &str, room: &str, status: Status) -> String {
        let event = self.event(event_type, room, status);
        self.producer.insert(std::slice::from_ref(&event)).await.unwrap();
        event.event_id
    }

    /// Inserts a row with the given envelope bytes.
    /// Inserts a row with the given envelope bytes (which may be garbage).
    pub async fn insert(&self, event_id: &str, event_type: &str, room: &str, status: Status, envelope: Vec<u8>) {
        let event = NewEvent { event_id: event_id.into(), envelope, ..self.event(event_type, room, status) };
        self.producer.insert(&[event]).await.unwrap();
    }

    pub async fn row(&self, event_id: &str) -> Row {
        self.producer.get(event_id).await.unwrap().unwrap_or_else(|| panic!("no row {event_id}"))
    }
}

/// Which sink a test host runs, and its settings.
pub struct SinkSpec {
    pub name: &'static str,
    pub plugin: &'static str,
    pub allowed_hosts: Vec<String>,
    /// Lines of the sink's `config:` map.
    pub config: String,
}

/// Compiled sinks are cached across tests (which also exercises the cache).
fn sink_cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sink-cache")
}

/// A host running in this process.
pub struct Running {
    /// The admin listener's address, when the config turned it on.
    pub admin: Option<std::net::SocketAddr>,
    pub signals: broadcast::Receiver<Signal>,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    pub async fn start(config: Config) -> Running {
        let host = Host::start(config).await.expect("host starts");
        let worker = host.worker().expect("worker enabled").clone();
        let signals = worker.subscribe();
        let admin = host.admin_addr();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(host.run(shutdown.clone()));
        Running { admin, signals, shutdown, task }
    }

    /// Waits, re-checking after every worker signal, until `check` holds.
    pub async fn wait_for<F, Fut>(&mut self, what: &str, check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        self.wait_for_within(what, PATIENCE, check).await
    }

    /// [`Running::wait_for`] with a patience of its own, for long runs.
    pub async fn wait_for_within<F, Fut>(&mut self, what: &str, patience: Duration, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + patience;
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
        tokio::time::timeout(PATIENCE, wait).await.unwrap_or_else(|_| panic!("timed out waiting for {what}"));
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
        tokio::time::timeout(PATIENCE, self.task).await.expect("host stops").unwrap().unwrap();
    }
}

/// Runs each listed `async fn(World)` as a test on SQLite, PostgreSQL and MySQL/MariaDB
/// (the server ones skipped, and said so, when their URL is not set).
macro_rules! per_backend {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $name() {
                super::$name($crate::support::World::on($crate::support::TestDb::sqlite()).await).await
            })*
        }
        mod postgres {
            $(#[tokio::test]
            async fn $name() {
                let Some(db) = $crate::support::TestDb::postgres().await else { return };
                super::$name($crate::support::World::on(db).await).await
            })*
        }
        mod mysql {
            $(#[tokio::test]
            async fn $name() {
                let Some(db) = $crate::support::TestDb::mysql().await else { return };
                super::$name($crate::support::World::on(db).await).await
            })*
        }
    };
}
pub(crate) use per_backend;
