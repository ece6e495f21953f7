//! Shared set-up: a fresh SQLite file per test, the real fake sink, a collector server, and
//! a running host whose progress signals the tests wait on.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use outbox_host::app::Host;
use outbox_host::config::Config;
use outbox_host::engine::Signal;
use outbox_host::store::{NewEvent, Row, Status, Store, now_ms};
use outbox_test_support::{Collector, FAKE_SINK};
use serde_yaml_ng::{Mapping, Value};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long any wait in these tests may take before it fails.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub use outbox_test_support::db::TestDb;

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
        fake_sink_to("fake", &self.collector, config)
    }

    /// A host's config on this world's database with the fake sink reporting to the
    /// collector. `worker` and `sink_config` are extra `key: value` lines for those sections.
    pub fn setup(&self, worker: &str, sink_config: &str) -> TestConfig {
        self.setup_with(worker, &self.fake_sink(sink_config))
    }

    /// A host's config on this world's database with `sink`: the test defaults, then the
    /// `worker` lines (a later line wins over an earlier one with the same key).
    pub fn setup_with(&self, worker: &str, sink: &SinkSpec) -> TestConfig {
        let mut config = TestConfig::default()
            .set(&["node_id"], "test-node")
            .set(&["database", "url"], &self.db_url())
            .set(&["database", "max_connections"], "4")
            .value(&["sink"], sink_entry(sink, ""))
            .set(&["admin", "listen"], "");
        for (key, value) in
            ["poll_interval: 50ms", "retry_interval: 50ms", "publish_timeout: 2s", "batch_size: 10", "concurrency: 4"]
                .into_iter()
                .chain(worker.lines())
                .filter_map(split_line)
        {
            config = config.set(&["outbox_worker", key], value);
        }
        config
    }

    /// The YAML text of [`World::setup`].
    pub fn yaml(&self, worker: &str, sink_config: &str) -> String {
        self.setup(worker, sink_config).yaml()
    }

    /// The YAML text of [`World::setup_with`].
    pub fn yaml_with(&self, worker: &str, sink: &SinkSpec) -> String {
        self.setup_with(worker, sink).yaml()
    }

    /// [`World::setup_with`], parsed.
    pub fn config_with(&self, worker: &str, sink: &SinkSpec) -> Config {
        self.setup_with(worker, sink).parse()
    }

    /// [`World::setup`], parsed.
    pub fn config(&self, worker: &str, sink_config: &str) -> Config {
        self.setup(worker, sink_config).parse()
    }

    /// An event as room-service builds it (envelope and row agree), with a fresh id.
    pub fn event(&self, event_type: &str, room: &str, status: Status) -> NewEvent {
        self.event_with_id(&format!("evt-{:016x}", outbox_host::clock::random_u64()), event_type, room, status)
    }

    /// [`World::event`] with the id `event_id`.
    pub fn event_with_id(&self, event_id: &str, event_type: &str, room: &str, status: Status) -> NewEvent {
        let event_id = event_id.to_string();
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
            trace_context: None,
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

    /// After a shutdown that handed rows back: none is left `delivering`, `delivered` and
    /// `pending` add up to `total`, at least `handed_back` are `pending`, and every pending
    /// row has its lease cleared.
    pub async fn assert_handed_back(&self, ids: &[String], total: i64, handed_back: i64) {
        let stats = self.producer.stats().await.unwrap();
        assert_eq!(stats.count(Status::Delivering), 0, "left delivering: {stats:?}");
        assert_eq!(stats.count(Status::Delivered) + stats.count(Status::Pending), total, "{stats:?}");
        assert!(stats.count(Status::Pending) >= handed_back, "rows were not handed back: {stats:?}");
        for id in ids {
            let row = self.row(id).await;
            if row.status == Status::Pending {
                assert_eq!((row.worker_id, row.lock_until_ms), (None, 0), "{id} still leased");
            }
        }
    }

    pub async fn row(&self, event_id: &str) -> Row {
        self.producer.get(event_id).await.unwrap().unwrap_or_else(|| panic!("no row {event_id}"))
    }

    /// The table as a development version of the host left it before several sinks
    /// (versions 1 to 6): no registry, no `fanned_out_at_ms`, and its bookkeeping without
    /// checksums or routines.
    pub async fn as_before_several_sinks(&self) {
        for statement in [
            "DROP TABLE room_outbox_sinks",
            "ALTER TABLE room_outbox DROP COLUMN fanned_out_at_ms",
            "DROP TABLE room_outbox_migrations",
            "DROP TABLE room_outbox_routines",
            "CREATE TABLE room_outbox_migrations \
             (version BIGINT PRIMARY KEY, description VARCHAR(255) NOT NULL, applied_at_ms BIGINT NOT NULL)",
            "INSERT INTO room_outbox_migrations VALUES (1, 'create room outbox', 0), (2, 'wake up and claim', 0), \
             (3, 'claim procedure', 0), (4, 'room order', 0), (5, 'room runs', 0), (6, 'pick index', 0)",
        ] {
            self.db.execute(statement).await.unwrap();
        }
    }

    /// `n` gift events over 50 rooms in `status`, inserted by the producer in chunks.
    pub async fn produce_many(&self, n: usize, status: Status) -> Vec<NewEvent> {
        let events: Vec<NewEvent> =
            (0..n).map(|i| self.event("RoomGiftSent", &format!("room-{}", i % 50), status)).collect();
        for chunk in events.chunks(500) {
            self.producer.insert(chunk).await.unwrap();
        }
        events
    }
}

/// How many times `collector` saw each event.
pub fn counts(collector: &Collector) -> std::collections::HashMap<String, usize> {
    let mut seen = std::collections::HashMap::new();
    for r in collector.reports() {
        *seen.entry(r.event_id).or_insert(0) += 1;
    }
    seen
}

/// Whether PostgreSQL holds the index named `index` valid, on a connection of its own.
pub async fn postgres_index_valid(url: &str, index: &str) -> bool {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let valid = sqlx::query_scalar::<_, bool>(&format!(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = '{index}'::regclass"
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    valid
}

/// A test host's configuration as a YAML tree, set key by key (never spliced as text).
#[derive(Clone, Default)]
pub struct TestConfig {
    root: Mapping,
}

/// `key: value` of one test line, the value read as YAML (`10` a number, `50ms` a string).
fn split_line(line: &str) -> Option<(&str, &str)> {
    let (key, value) = line.split_once(':')?;
    Some((key.trim(), value.trim()))
}

impl TestConfig {
    /// Sets the key at `path` to `value`, read as a YAML scalar (`"10"` is a number,
    /// `"50ms"` a string, `"\"quoted\""` a string); an empty value is the empty string.
    pub fn set(self, path: &[&str], value: &str) -> TestConfig {
        let value = if value.is_empty() {
            Value::String(String::new())
        } else {
            serde_yaml_ng::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()))
        };
        self.value(path, value)
    }

    /// Sets the key at `path` to a YAML value.
    pub fn value(mut self, path: &[&str], value: Value) -> TestConfig {
        let (last, parents) = path.split_last().expect("a key");
        let mut map = &mut self.root;
        for key in parents {
            let entry = map.entry(Value::String(key.to_string())).or_insert_with(|| Value::Mapping(Mapping::new()));
            map = entry.as_mapping_mut().expect("a section");
        }
        map.insert(Value::String(last.to_string()), value);
        self
    }

    /// Makes `sink:` the first entry of `sinks:`, followed by `more` (see [`sink_entry`]).
    pub fn with_sinks(mut self, more: Vec<Value>) -> TestConfig {
        let first = self.root.remove("sink").expect("a sink: section");
        let list = std::iter::once(first).chain(more).collect();
        self.value(&["sinks"], Value::Sequence(list))
    }

    /// Turns the admin listener on, on a free loopback port.
    pub fn with_admin(self) -> TestConfig {
        self.set(&["admin", "listen"], "127.0.0.1:0")
    }

    /// The YAML text, for the real binary.
    pub fn yaml(&self) -> String {
        serde_yaml_ng::to_string(&self.root).expect("YAML")
    }

    /// The validated config, for a host in this process.
    pub fn parse(&self) -> Config {
        Config::from_yaml(&self.yaml(), std::iter::empty(), &|_| None)
            .unwrap_or_else(|e| panic!("test config refused: {e}"))
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

/// The fake sink named `name`, reporting to `collector`, with extra `config:` lines (a
/// second sink beside the world's own).
pub fn fake_sink_to(name: &'static str, collector: &Collector, config: &str) -> SinkSpec {
    SinkSpec {
        name,
        plugin: FAKE_SINK,
        allowed_hosts: vec![collector.host_port()],
        config: format!("collector: \"{}\"\n{config}", collector.url("/report")),
    }
}

/// One sink's section as [`World::setup_with`] writes it, with `extra` lines of its own
/// (`start_from: beginning`).
pub fn sink_entry(sink: &SinkSpec, extra: &str) -> Value {
    let mut entry = TestConfig::default()
        .set(&["name"], sink.name)
        .set(&["plugin"], sink.plugin)
        .set(&["cache_dir"], &sink_cache_dir().display().to_string())
        .set(&["memory_limit"], "16MiB")
        .set(&["allow_http"], "true")
        .value(
            &["allowed_hosts"],
            Value::Sequence(sink.allowed_hosts.iter().map(|h| Value::String(h.clone())).collect()),
        );
    for (key, value) in sink.config.lines().filter_map(split_line) {
        entry = entry.set(&["config", key], value);
    }
    for (key, value) in extra.lines().filter_map(split_line) {
        entry = entry.set(&[key], value);
    }
    Value::Mapping(entry.root)
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
    /// The host's own store (inserts through it wake the host at once).
    pub store: Arc<dyn Store>,
}

impl Running {
    pub async fn start(config: Config) -> Running {
        let host = Host::start(config).await.expect("host starts");
        let worker = host.worker().expect("worker enabled").clone();
        let signals = worker.subscribe();
        let admin = host.admin_addr();
        let store = host.store().clone();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(host.run(shutdown.clone()));
        Running { admin, signals, shutdown, task, store }
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
        self.wait_status_in(world.producer.as_ref(), event_ids, status).await
    }

    /// Waits for `status` on every listed event of `store`'s table.
    pub async fn wait_status_in(&mut self, store: &dyn Store, event_ids: &[&str], status: Status) {
        let what = format!("{event_ids:?} to be {status}");
        self.wait_for(&what, || async {
            for id in event_ids {
                if store.get(id).await.unwrap().map(|r| r.status) != Some(status) {
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
/// (the server ones skipped, and said so, when their URL is not set); those listed after
/// `servers:` on PostgreSQL and MySQL/MariaDB only.
macro_rules! per_backend {
    ($($name:ident),* $(,)? $(; servers: $($server:ident),* $(,)?)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $name() {
                super::$name($crate::support::World::on($crate::support::TestDb::sqlite()).await).await
            })*
        }
        mod postgres {
            $($(#[tokio::test]
            async fn $server() {
                let Some(db) = $crate::support::TestDb::postgres().await else { return };
                super::$server($crate::support::World::on(db).await).await
            })*)?
            $(#[tokio::test]
            async fn $name() {
                let Some(db) = $crate::support::TestDb::postgres().await else { return };
                super::$name($crate::support::World::on(db).await).await
            })*
        }
        mod mysql {
            $($(#[tokio::test]
            async fn $server() {
                let Some(db) = $crate::support::TestDb::mysql().await else { return };
                super::$server($crate::support::World::on(db).await).await
            })*)?
            $(#[tokio::test]
            async fn $name() {
                let Some(db) = $crate::support::TestDb::mysql().await else { return };
                super::$name($crate::support::World::on(db).await).await
            })*
        }
    };
}
pub(crate) use per_backend;

/// The first column of every row `sql` returns on `db`, as text (integers printed).
pub async fn query_strings(db: &TestDb, sql: &str) -> Vec<String> {
    use sqlx::Connection as _;
    fn text<R: sqlx::Row>(row: &R) -> String
    where
        for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        usize: sqlx::ColumnIndex<R>,
    {
        // MySQL hands a binary-collated column (the bookkeeping tables') over as bytes.
        row.try_get::<String, _>(0)
            .or_else(|_| row.try_get::<i64, _>(0).map(|n| n.to_string()))
            .or_else(|_| row.try_get::<Vec<u8>, _>(0).map(|b| String::from_utf8_lossy(&b).into_owned()))
            .unwrap()
    }
    if db.url.starts_with("sqlite:") {
        let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
        sqlx::raw_sql(sql).fetch_all(&mut c).await.unwrap().iter().map(text).collect()
    } else if db.url.starts_with("postgres") {
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::raw_sql(sql).fetch_all(&mut c).await.unwrap().iter().map(text).collect()
    } else {
        let mut c = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
        sqlx::raw_sql(sql).fetch_all(&mut c).await.unwrap().iter().map(text).collect()
    }
}

/// The entries `index` has returned to scans so far, by the server's own counters, with
/// this connection's own reads flushed to them first. `after`: wait (up to 15 s) until the
/// count has moved past it and then holds still for 300 ms, since other backends' counts
/// land when they flush (an idle one within about 10 s, a closing one as it exits), not
/// necessarily all at once; a claim reads something.
pub async fn entries_read(conn: &mut sqlx::PgConnection, index: &str, after: Option<i64>) -> i64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let mut last = None;
    loop {
        sqlx::query("SELECT pg_stat_force_next_flush()").execute(&mut *conn).await.unwrap();
        sqlx::query("SELECT pg_stat_clear_snapshot()").execute(&mut *conn).await.unwrap();
        let read: i64 = sqlx::query_scalar(
            "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = $1 AND schemaname = current_schema()",
        )
        .bind(index)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        match after {
            None => return read,
            Some(before) if read > before && last == Some(read) => return read,
            Some(before) => {
                let moved = read > before;
                assert!(std::time::Instant::now() < deadline, "{index}: no reads counted after the claim");
                last = moved.then_some(read);
                let pause = if moved { 300 } else { 50 };
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            }
        }
    }
}

/// `/metrics` of the admin listener at `base` (`http://host:port`), as text.
pub async fn metrics_text(base: &str) -> String {
    reqwest::get(format!("{base}/metrics")).await.expect("the admin listener answers").text().await.unwrap()
}

/// `/metrics` as `name{labels}` → value.
pub async fn scrape(base: &str) -> std::collections::HashMap<String, f64> {
    metrics_text(base)
        .await
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').unwrap();
            (name.to_string(), value.parse().unwrap())
        })
        .collect()
}

/// The value of one series of `/metrics`, e.g. `room_outbox_sink_state{sink="tencent-im"}`
/// (its labels as the host writes them); a missing one fails the test.
pub async fn metric(base: &str, series: &str) -> f64 {
    let samples = scrape(base).await;
    *samples.get(series).unwrap_or_else(|| {
        let mut names: Vec<&String> = samples.keys().collect();
        names.sort();
        panic!("no {series} in /metrics: {names:?}")
    })
}
