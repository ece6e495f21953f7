//! The YAML configuration: room-service's `outbox_worker` block with its names, defaults and
//! rules, plus what a standalone host needs (database, table, node id, sink, admin, log).
//!
//! Loading is strict: unknown keys are errors, and every problem is reported at once,
//! each naming its key. Non-positive `poll_interval`, `batch_size`, `publish_timeout` and
//! `concurrency` fall back to their defaults (room-service's rule), with a note in the log.

mod read;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use read::Fields;
use serde_yaml_ng::Value;

pub use crate::engine::breaker::BreakerSettings;
pub use crate::engine::settings::*;
pub use crate::logging::{LogConfig, LogFormat};
pub use crate::ops::admin::settings::*;
pub use crate::ops::traces::{Protocol as TracingProtocol, TracingConfig};
use crate::redact::url as redact_url;
pub use crate::sandbox::settings::*;
pub use crate::store::DEFAULT_TABLE;
use crate::units::{self, format_duration};

/// Environment variables starting with this override config keys:
/// `OUTBOX__OUTBOX_WORKER__BATCH_SIZE=50` sets `outbox_worker.batch_size`.
pub const ENV_PREFIX: &str = "OUTBOX__";

/// Default `database.url`: the embedded SQLite file next to where the host runs.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://outbox.db";
/// Default `database.max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;
/// Identifier length limits: PostgreSQL truncates past 63 bytes, MySQL refuses past 64.
const POSTGRES_MAX_IDENTIFIER: usize = 63;
const MYSQL_MAX_IDENTIFIER: usize = 64;
/// The suffix of the migrations bookkeeping table, `<table>_migrations`.
pub const MIGRATIONS_SUFFIX: &str = "_migrations";

/// One `sink:`: its plugin as the sandbox loads it, and how the engine delivers through it.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// The plugin, its egress rules and budgets.
    pub sandbox: PluginConfig,
    /// Which events a sink added to a table that already has events starts from.
    pub start_from: StartFrom,
    /// Reload the sink when its plugin file changes (`watch_plugin`, default true).
    pub watch_plugin: bool,
    /// `outbox_worker` with this sink's own `concurrency`, `publish_timeout`, retry keys,
    /// `rate_limit` and `breaker` applied.
    pub worker: WorkerConfig,
    /// A relay's broker (`broker:`, a name of `brokers:`): the plugin is then a relay
    /// (world `outbox:relay/relay`) whose records the host publishes there.
    pub broker: Option<String>,
}

impl SinkConfig {
    /// The sink's name.
    pub fn name(&self) -> &str {
        &self.sandbox.name
    }
}

/// `start_from`: where a sink added to a table with events begins. Read once, when the
/// sink is registered on the table; afterwards it keeps where it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartFrom {
    /// Events created from the moment it is registered (the default).
    #[default]
    Now,
    /// Every event still in the table.
    Beginning,
    /// Events created at or after this time, UTC milliseconds.
    At(i64),
}

impl StartFrom {
    /// The earliest `created_at_ms` the sink takes, registering at `now_ms`.
    pub fn start_ms(self, now_ms: i64) -> i64 {
        match self {
            StartFrom::Now => now_ms,
            StartFrom::Beginning => 0,
            StartFrom::At(ms) => ms,
        }
    }
}

/// The whole host configuration, validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// Names this host in `worker_id` and in logs (default: the machine's hostname).
    pub node_id: String,
    /// Where the outbox table lives.
    pub database: DatabaseConfig,
    /// Which table holds the outbox.
    pub table: String,
    /// room-service's worker block plus our additions.
    pub worker: WorkerConfig,
    /// The WebAssembly sinks every event goes to, each with its own delivery state (`sinks:`,
    /// or the one-sink shorthand `sink:`; required by `run` and `check-config`). The first
    /// is the one the outbox's own status columns are for.
    pub sinks: Vec<SinkConfig>,
    /// The brokers relays publish to (`brokers:`, by name).
    pub brokers: Vec<crate::relay::settings::BrokerConfig>,
    /// The admin HTTP listener.
    pub admin: AdminConfig,
    /// Log output.
    pub log: LogConfig,
    /// OpenTelemetry traces (`tracing:`; off by default).
    pub tracing: TracingConfig,
    /// Things worth telling the operator that are not errors (a value fell back to its default).
    pub notes: Vec<String>,
}

/// `database:`.
#[derive(Clone)]
pub struct DatabaseConfig {
    /// `sqlite://path`, `postgres://…` or `mysql://…`.
    pub url: String,
    /// Pool size.
    pub max_connections: u32,
}

impl fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("url", &redact_url(&self.url))
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

/// Why a config was refused: every problem, each naming its key.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration{}:\n  - {}", source_name(.source_file), .problems.join("\n  - "))]
pub struct ConfigError {
    /// The file, if one was read.
    pub source_file: Option<PathBuf>,
    /// One line per problem, `key: why`.
    pub problems: Vec<String>,
}

fn source_name(file: &Option<PathBuf>) -> String {
    file.as_ref().map(|f| format!(" in {}", f.display())).unwrap_or_default()
}

impl Config {
    /// The sinks, or an error saying one is needed for `what`.
    pub fn require_sinks(&self, what: &str) -> Result<&[SinkConfig], ConfigError> {
        if self.sinks.is_empty() {
            return Err(ConfigError {
                source_file: None,
                problems: vec![format!("sink: (or sinks:) is required to {what} (at least sink.name and sink.plugin)")],
            });
        }
        Ok(&self.sinks)
    }

    /// Every credential the config holds: the database's and each broker's (in its URL, or
    /// its `token` and `password`), each sink's config values under names that carry one
    /// (`secret_key`, `token`, …) and its proxy's, and the admin token.
    pub fn credentials(&self) -> Vec<String> {
        use crate::redact::{credentials_in_url, is_secret_name};
        let mut found = credentials_in_url(&self.database.url);
        for broker in &self.brokers {
            found.extend(credentials_in_url(&broker.url));
            found.extend(broker.token.iter().chain(&broker.password).cloned());
        }
        for sink in &self.sinks {
            let settings = &sink.sandbox.config.0;
            found.extend(settings.iter().filter(|(key, _)| is_secret_name(key)).map(|(_, value)| value.clone()));
            found.extend(sink.sandbox.proxy.iter().flat_map(|proxy| credentials_in_url(proxy)));
        }
        found.extend(self.admin.token.iter().cloned());
        found
    }

    /// The sink named `name`.
    pub fn sink(&self, name: &str) -> Option<&SinkConfig> {
        self.sinks.iter().find(|s| s.name() == name)
    }

    /// Reads and validates a config file, with `${VAR}` and `OUTBOX__…` overrides from the
    /// process environment. A missing file is an error unless `optional` (then defaults).
    pub fn load(path: &Path, optional: bool) -> Result<Config, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if optional && e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                return Err(ConfigError {
                    source_file: Some(path.to_owned()),
                    problems: vec![format!("cannot read the file: {e}")],
                });
            }
        };
        Self::from_yaml(&text, std::env::vars(), &|name| std::env::var(name).ok()).map_err(|mut e| {
            e.source_file = Some(path.to_owned());
            e
        })
    }

    /// Parses and validates YAML text. `vars` supplies `OUTBOX__…` overrides and `env`
    /// resolves `${VAR}`; tests pass their own.
    pub fn from_yaml(
        text: &str,
        vars: impl Iterator<Item = (String, String)>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut problems = Vec::new();
        let mut root: Value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_yaml_ng::from_str(text)
                .map_err(|e| ConfigError { source_file: None, problems: vec![format!("not valid YAML: {e}")] })?
        };
        read::apply_overrides(&mut root, vars, &mut problems);
        read::expand_env(&mut root, "", env, &mut problems);
        let mut notes = Vec::new();
        let mut fields = Fields::root(root, &mut problems);
        let config = read_config(&mut fields, &mut notes);
        fields.finish();
        // Before anything is printed, the problems included: whatever this config holds
        // that is a credential is scrubbed from every output of the process from now on.
        crate::redact::remember(config.credentials());
        if problems.is_empty() {
            Ok(Config { notes, ..config })
        } else {
            Err(ConfigError { source_file: None, problems })
        }
    }
}

/// Every key the parser reads, as dotted paths (`sinks[].name`); `docs/configuration.md`
/// lists the same (a test checks).
pub fn known_keys() -> std::collections::BTreeSet<String> {
    read::recording(|| {
        let every_section = "sink: {breaker: {}}\nsinks: [{breaker: {}, rate_limit: {}}]\nbrokers: {NAME: {}}\n";
        let _ = Config::from_yaml(every_section, std::iter::empty(), &|_| None);
    })
}

fn read_config(f: &mut Fields<'_>, notes: &mut Vec<String>) -> Config {
    let node_id = f.take::<String>("node_id").unwrap_or_else(default_node_id);
    if !is_name(&node_id, 64) {
        f.problem("node_id", "must be 1-64 characters of letters, digits, '.', '_' or '-'");
    }
    let mut backend = None;
    let database = f.section("database", |f| {
        let url = f.take::<String>("url").unwrap_or_else(|| DEFAULT_DATABASE_URL.into());
        match crate::store::Backend::from_url(&url) {
            Ok(b) => backend = Some(b),
            Err(why) => f.problem("url", why),
        }
        let max_connections = f.take::<u32>("max_connections").unwrap_or(DEFAULT_MAX_CONNECTIONS);
        if max_connections == 0 {
            f.problem("max_connections", "must be at least 1");
        }
        DatabaseConfig { url, max_connections }
    });
    let table = f.section("outbox", |f| {
        let table = f.take::<String>("table").unwrap_or_else(|| DEFAULT_TABLE.into());
        if !is_identifier(&table) {
            f.problem("table", format!("{table:?} is not a plain SQL identifier (letters, digits and '_', not starting with a digit, at most 63)"));
        } else if table.chars().any(|c| c.is_ascii_uppercase()) {
            // The host writes the name unquoted, which PostgreSQL folds to lower case and MySQL
            // on Linux does not: one spelling everywhere, or a check would miss what is there.
            f.problem(
                "table",
                format!("{table:?} has upper-case letters: use lower case ({:?})", table.to_ascii_lowercase()),
            );
        } else if let Some(limit) = backend.and_then(identifier_limit) {
            let bookkeeping = format!("{table}{MIGRATIONS_SUFFIX}");
            if bookkeeping.len() > limit {
                f.problem(
                    "table",
                    format!(
                        "{table:?} is too long: its migrations table {bookkeeping:?} would exceed this database's {limit}-character identifier limit (use at most {} characters)",
                        limit - MIGRATIONS_SUFFIX.len()
                    ),
                );
            }
        }
        table
    });
    let (worker, lease_explicit) = f.section("outbox_worker", |f| read_worker(f, notes, backend));
    let mut sinks = Vec::new();
    if f.has("sink") {
        sinks.push(f.section("sink", |f| read_sink(f, notes, &worker, lease_explicit)));
    }
    let listed = f.has("sinks");
    if listed {
        let entries = f.list("sinks", |f| read_sink(f, notes, &worker, lease_explicit));
        if entries.is_empty() {
            f.problem("sinks", "lists no sink (each entry needs at least name and plugin)");
        }
        if sinks.is_empty() {
            sinks = entries;
            check_sink_names(f, &sinks, listed, &table, backend);
        } else {
            f.problem("sinks", "cannot be set together with sink: (sink: is the one-sink shorthand of sinks:)");
        }
    } else {
        check_sink_names(f, &sinks, listed, &table, backend);
    }
    let brokers = f.entries("brokers", read_broker);
    for sink in &sinks {
        if let Some(broker) = &sink.broker
            && !brokers.iter().any(|b| b.name == *broker)
        {
            f.problem("brokers", format!("has no broker {broker:?}, which sink {} names", sink.name()));
        }
    }
    let admin = f.section("admin", |f| read_admin(f, notes));
    let log = f.section("log", |f| {
        let format = match f.take::<String>("format").as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                f.problem("format", format!("{other:?} is not one of text, json"));
                LogFormat::Text
            }
        };
        let level = f.take::<String>("level").unwrap_or_else(|| "info".into());
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&level) {
            f.problem("level", format!("{level:?} is not a log filter: {e}"));
        }
        LogConfig { format, level }
    });
    let tracing = f.section("tracing", |f| read_tracing(f, notes));
    Config { node_id, database, table, worker, sinks, brokers, admin, log, tracing, notes: Vec::new() }
}

/// `tracing:`. The `OTEL_*` variables fill in what it leaves out (see `ops/traces.rs`).
fn read_tracing(f: &mut Fields<'_>, notes: &mut Vec<String>) -> TracingConfig {
    let defaults = TracingConfig::default();
    let enabled = f.take::<bool>("enabled").unwrap_or(false);
    let endpoint = f.take::<String>("endpoint").filter(|e| !e.is_empty());
    if let Some(endpoint) = &endpoint {
        match url::Url::parse(endpoint) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.host_str().is_some() => {}
            _ => f.problem(
                "endpoint",
                format!("{:?} is not an http:// or https:// URL of a collector", redact_url(endpoint)),
            ),
        }
    }
    let protocol = f.take::<String>("protocol").and_then(|p| match TracingProtocol::parse(&p) {
        Ok(protocol) => Some(protocol),
        Err(why) => {
            f.problem("protocol", why);
            None
        }
    });
    let count = |f: &mut Fields<'_>, key: &str, default: usize| {
        let n = f.take::<u64>(key).map_or(default, |n| n as usize);
        if n == 0 {
            f.problem(key, "must be at least 1");
        }
        n
    };
    let queue_size = count(f, "queue_size", defaults.queue_size);
    let batch_size = count(f, "batch_size", defaults.batch_size);
    let export_every = positive_duration(f, "export_every", defaults.export_every, notes);
    let export_timeout = f
        .has("export_timeout")
        .then(|| positive_duration(f, "export_timeout", crate::ops::otlp::DEFAULT_TIMEOUT, notes));
    let service_name = f.take::<String>("service_name").filter(|s| !s.is_empty());
    TracingConfig { enabled, endpoint, protocol, queue_size, batch_size, export_every, export_timeout, service_name }
}

/// Sink names are unique (state is keyed by them), and so are the tables they give
/// (`<table>__<name>`), which must also fit the database's identifier limit.
fn check_sink_names(
    f: &mut Fields<'_>,
    sinks: &[SinkConfig],
    listed: bool,
    table: &str,
    backend: Option<crate::store::Backend>,
) {
    let key = |i: usize| if listed { format!("sinks[{i}].name") } else { "sink.name".into() };
    let mut problems = Vec::new();
    for (i, sink) in sinks.iter().enumerate() {
        let own = crate::store::sinks::sink_table(table, sink.name());
        if let Some(other) = sinks[..i].iter().find(|o| o.name() == sink.name()) {
            problems
                .push((key(i), format!("{:?} is used twice: each sink's state is kept under its name", other.name())));
        } else if let Some(other) = sinks[..i].iter().find(|o| crate::store::sinks::sink_table(table, o.name()) == own)
        {
            problems.push((key(i), format!("{:?} and {:?} would share the table {own}", other.name(), sink.name())));
        }
        if let Some(limit) = backend.and_then(identifier_limit)
            && own.len() + crate::store::sinks::LONGEST_OBJECT_SUFFIX > limit
        {
            problems.push((
                key(i),
                format!(
                    "{:?} is too long for this table: its own table {own} and its indexes would exceed the database's {limit}-character identifier limit",
                    sink.name()
                ),
            ));
        }
    }
    for (key, why) in problems {
        f.problem(&key, why);
    }
}

/// The identifier length limit of a server database (SQLite has none that matters).
fn identifier_limit(backend: crate::store::Backend) -> Option<usize> {
    match backend {
        crate::store::Backend::Postgres => Some(POSTGRES_MAX_IDENTIFIER),
        crate::store::Backend::Mysql => Some(MYSQL_MAX_IDENTIFIER),
        crate::store::Backend::Sqlite => None,
    }
}

fn read_admin(f: &mut Fields<'_>, notes: &mut Vec<String>) -> AdminConfig {
    let stats_interval = positive_duration(f, "stats_interval", DEFAULT_STATS_INTERVAL, notes);
    let unready_after_db_failures =
        positive_count(f, "unready_after_db_failures", DEFAULT_UNREADY_AFTER_DB_FAILURES, notes);
    let text = f.take::<String>("listen").unwrap_or_else(|| DEFAULT_ADMIN_LISTEN.into());
    let listen = if text.is_empty() {
        None
    } else {
        match text.parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(_) => {
                f.problem(
                    "listen",
                    format!("{text:?} is not an address such as 127.0.0.1:9464 (empty turns the admin listener off)"),
                );
                None
            }
        }
    };
    let token = f.take::<String>("token").filter(|t| !t.is_empty());
    if let Some(token) = &token
        && (token.len() < 16 || token.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        f.problem("token", "must be at least 16 characters without spaces (e.g. `openssl rand -hex 32`)");
    }
    let allowed_hosts = f.take::<Vec<String>>("allowed_hosts").unwrap_or_default();
    for host in &allowed_hosts {
        if host.is_empty() || !host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-')) {
            f.problem("allowed_hosts", format!("{host:?} is not a host name (the Host header without its port)"));
        }
    }
    let allowed_hosts = allowed_hosts.into_iter().map(|h| h.to_ascii_lowercase()).collect();
    AdminConfig { listen, stats_interval, unready_after_db_failures, token, allowed_hosts }
}

/// Reads a duration key; non-positive values fall back to `default` with a note.
fn positive_duration(f: &mut Fields<'_>, key: &str, default: Duration, notes: &mut Vec<String>) -> Duration {
    let Some(text) = f.take_duration(key) else {
        return default;
    };
    match units::parse_duration_ms(&text) {
        Ok(ms) if ms > 0 => Duration::from_millis(ms as u64),
        Ok(_) => {
            notes.push(format!(
                "{}: {text:?} is not positive; using the default {}",
                f.key_path(key),
                format_duration(default)
            ));
            default
        }
        Err(why) => {
            f.problem(key, why);
            default
        }
    }
}

/// Reads a count key; non-positive values fall back to `default` with a note.
fn positive_count(f: &mut Fields<'_>, key: &str, default: u32, notes: &mut Vec<String>) -> u32 {
    match f.take::<i64>(key) {
        None => default,
        Some(n) if n > 0 => u32::try_from(n).unwrap_or(u32::MAX),
        Some(n) => {
            notes.push(format!("{}: {n} is not positive; using the default {default}", f.key_path(key)));
            default
        }
    }
}

/// `outbox_worker:`, and whether `lease_duration` was set (a sink's own `concurrency` or
/// `publish_timeout` then has to fit it, rather than resizing it).
fn read_worker(
    f: &mut Fields<'_>,
    notes: &mut Vec<String>,
    backend: Option<crate::store::Backend>,
) -> (WorkerConfig, bool) {
    let enabled = f.take::<bool>("enabled").unwrap_or(true);
    let poll_interval = positive_duration(f, "poll_interval", DEFAULT_POLL_INTERVAL, notes);
    let batch_size = positive_count(f, "batch_size", DEFAULT_BATCH_SIZE, notes);
    if batch_size > MAX_BATCH_SIZE {
        f.problem("batch_size", format!("{batch_size} is more than {MAX_BATCH_SIZE}"));
    }
    let claim_growth = read_claim_growth(f, batch_size);
    let publish_timeout = positive_duration(f, "publish_timeout", DEFAULT_PUBLISH_TIMEOUT, notes);
    let retry_strategy = read_retry_strategy(f).unwrap_or(RetryStrategy::FixedInterval);
    let retry_interval = positive_duration(f, "retry_interval", poll_interval, notes);
    let max_retry_interval = read_max_retry_interval(f, retry_interval, notes);
    let concurrency = read_concurrency(f, DEFAULT_CONCURRENCY, notes);
    let lease_explicit = f.has("lease_duration");
    let min_lease = WorkerConfig::min_lease(batch_size, concurrency, publish_timeout);
    let lease = match f.take_duration("lease_duration") {
        None => WorkerConfig::default_lease(batch_size, concurrency, publish_timeout),
        Some(text) => match units::parse_duration_ms(&text) {
            Ok(ms) if ms >= min_lease.as_millis() as i64 => Duration::from_millis(ms as u64),
            Ok(ms) if ms <= 0 => {
                let default = WorkerConfig::default_lease(batch_size, concurrency, publish_timeout);
                notes.push(format!(
                    "{}: {text:?} is not positive; using the default {}",
                    f.key_path("lease_duration"),
                    format_duration(default)
                ));
                default
            }
            Ok(_) => {
                f.problem(
                    "lease_duration",
                    format!(
                        "{text} cannot cover a batch: {batch_size} events, {concurrency} at a time, each up to {} needs at least {}",
                        format_duration(publish_timeout),
                        format_duration(min_lease)
                    ),
                );
                min_lease
            }
            Err(why) => {
                f.problem("lease_duration", why);
                min_lease
            }
        },
    };
    let max_attempts = f.take::<u32>("max_attempts").unwrap_or(0);
    let shutdown_grace = positive_duration(f, "shutdown_grace", DEFAULT_SHUTDOWN_GRACE, notes);
    let wake_up = match f.take::<String>("wake_up").as_deref() {
        None | Some("auto") => WakeUp::Auto,
        Some("notify") if backend.is_some_and(|b| b != crate::store::Backend::Postgres) => {
            f.problem("wake_up", "notify needs PostgreSQL (LISTEN/NOTIFY); use probe or poll on this database");
            WakeUp::Auto
        }
        Some("notify") => WakeUp::Notify,
        Some("probe") => WakeUp::Probe,
        Some("poll") => WakeUp::Poll,
        Some(other) => {
            f.problem("wake_up", format!("{other:?} is not one of auto, notify, probe, poll"));
            WakeUp::Auto
        }
    };
    let probe_interval = positive_duration(f, "probe_interval", DEFAULT_PROBE_INTERVAL, notes);
    let ordering = match f.take::<String>("ordering").as_deref() {
        None | Some("per_room") => RoomOrdering::PerRoom,
        Some("none") => RoomOrdering::None,
        Some(other) => {
            f.problem("ordering", format!("{other:?} is not one of per_room, none"));
            RoomOrdering::PerRoom
        }
    };
    let failed_blocks_room = f.take::<bool>("failed_blocks_room").unwrap_or(false);
    let partitions = f.take::<i64>("partitions").unwrap_or(i64::from(DEFAULT_PARTITIONS));
    if !(1..=i64::from(MAX_PARTITIONS)).contains(&partitions) {
        f.problem("partitions", format!("{partitions} is not between 1 and {MAX_PARTITIONS}"));
    }
    let min_partition_lease = WorkerConfig::min_partition_lease(publish_timeout);
    let partition_lease =
        positive_duration(f, "partition_lease", DEFAULT_PARTITION_LEASE.max(min_partition_lease), notes);
    if partition_lease < min_partition_lease {
        f.problem(
            "partition_lease",
            format!(
                "{} is shorter than {}: a delivery starts only while the lease has publish_timeout ({}) and a second left, renewed every third of it",
                format_duration(partition_lease),
                format_duration(min_partition_lease),
                format_duration(publish_timeout)
            ),
        );
    }
    let worker = WorkerConfig {
        enabled,
        poll_interval,
        batch_size,
        claim_growth,
        publish_timeout,
        retry_interval,
        retry_strategy,
        max_retry_interval,
        concurrency,
        lease,
        max_attempts,
        shutdown_grace,
        wake_up,
        probe_interval,
        // From the `sink:` section, set by `read_config`.
        rate_limit: None,
        room_rate_limit: None,
        breaker: BreakerSettings::default(),
        ordering,
        failed_blocks_room,
        partitions: partitions.clamp(1, i64::from(MAX_PARTITIONS)) as u32,
        partition_lease,
    };
    (worker, lease_explicit)
}

/// `claim_growth`, if set: a whole factor of at least 1 that keeps a grown claim within
/// [`MAX_BATCH_SIZE`]. Unset, the backend's default applies (and is cut to that bound).
fn read_claim_growth(f: &mut Fields<'_>, batch_size: u32) -> Option<u32> {
    let growth = f.take::<i64>("claim_growth")?;
    if growth < 1 {
        f.problem("claim_growth", format!("{growth} is less than 1 (1: claims never grow past batch_size)"));
        return None;
    }
    if growth.saturating_mul(i64::from(batch_size)) > i64::from(MAX_BATCH_SIZE) {
        f.problem(
            "claim_growth",
            format!("{growth} × batch_size {batch_size} is more than {MAX_BATCH_SIZE} rows per claim"),
        );
        return None;
    }
    u32::try_from(growth).ok()
}

/// `retry_strategy`, if set and known.
fn read_retry_strategy(f: &mut Fields<'_>) -> Option<RetryStrategy> {
    let name = f.take::<String>("retry_strategy").filter(|n| !n.is_empty())?;
    match RetryStrategy::ALL.iter().find(|(n, _)| *n == name) {
        Some((_, strategy)) => Some(*strategy),
        None => {
            let known: Vec<&str> = RetryStrategy::ALL.iter().map(|(n, _)| *n).collect();
            f.problem("retry_strategy", format!("{name:?} is not one of {}", known.join(", ")));
            None
        }
    }
}

/// `max_retry_interval` (default: a minute, or `retry_interval` if longer); set, it may not
/// be shorter than `retry_interval`.
fn read_max_retry_interval(f: &mut Fields<'_>, retry_interval: Duration, notes: &mut Vec<String>) -> Duration {
    let explicit = f.has("max_retry_interval");
    let max = positive_duration(f, "max_retry_interval", DEFAULT_MAX_RETRY_INTERVAL.max(retry_interval), notes);
    if explicit && max < retry_interval {
        f.problem(
            "max_retry_interval",
            format!("{} is shorter than retry_interval ({})", format_duration(max), format_duration(retry_interval)),
        );
    }
    max
}

/// `concurrency`, 1 to 1024.
fn read_concurrency(f: &mut Fields<'_>, default: u32, notes: &mut Vec<String>) -> u32 {
    let concurrency = positive_count(f, "concurrency", default, notes);
    if concurrency > 1024 {
        f.problem("concurrency", format!("{concurrency} is more than 1024"));
    }
    concurrency
}

/// A sink's own delivery settings over `outbox_worker`'s: `concurrency`, `publish_timeout`,
/// `retry_strategy`, `retry_interval`, `max_retry_interval`, `max_attempts`. The lease is
/// sized for them, or, where `lease_duration` is set, must cover them.
fn read_delivery_overrides(
    f: &mut Fields<'_>,
    notes: &mut Vec<String>,
    global: &WorkerConfig,
    lease_explicit: bool,
) -> WorkerConfig {
    let mut worker = global.clone();
    worker.concurrency = read_concurrency(f, global.concurrency, notes);
    worker.publish_timeout = positive_duration(f, "publish_timeout", global.publish_timeout, notes);
    worker.retry_strategy = read_retry_strategy(f).unwrap_or(global.retry_strategy);
    worker.retry_interval = positive_duration(f, "retry_interval", global.retry_interval, notes);
    if f.has("max_retry_interval") {
        worker.max_retry_interval = read_max_retry_interval(f, worker.retry_interval, notes);
    } else {
        worker.max_retry_interval = global.max_retry_interval.max(worker.retry_interval);
    }
    worker.max_attempts = f.take::<u32>("max_attempts").unwrap_or(global.max_attempts);
    let min_partition_lease = WorkerConfig::min_partition_lease(worker.publish_timeout);
    if worker.partition_lease < min_partition_lease {
        notes.push(format!(
            "{}: partition leases of this sink last {} (its publish_timeout needs more than outbox_worker.partition_lease)",
            f.key_path("publish_timeout"),
            format_duration(min_partition_lease)
        ));
        worker.partition_lease = min_partition_lease;
    }
    let min_lease = WorkerConfig::min_lease(worker.batch_size, worker.concurrency, worker.publish_timeout);
    if !lease_explicit {
        worker.lease = WorkerConfig::default_lease(worker.batch_size, worker.concurrency, worker.publish_timeout);
    } else if worker.lease < min_lease {
        f.problem(
            "publish_timeout",
            format!(
                "with concurrency {} this sink needs a lease of at least {}, more than outbox_worker.lease_duration ({})",
                worker.concurrency,
                format_duration(min_lease),
                format_duration(worker.lease)
            ),
        );
    }
    worker
}

/// `start_from: now | beginning | <RFC 3339 time>`.
fn read_start_from(f: &mut Fields<'_>) -> StartFrom {
    match f.take::<String>("start_from").as_deref() {
        None | Some("now") => StartFrom::Now,
        Some("beginning") => StartFrom::Beginning,
        Some(text) => match units::parse_rfc3339_ms(text) {
            Ok(ms) => StartFrom::At(ms),
            Err(why) => {
                f.problem("start_from", format!("{why}; or now, or beginning"));
                StartFrom::Now
            }
        },
    }
}

fn read_sink(f: &mut Fields<'_>, notes: &mut Vec<String>, global: &WorkerConfig, lease_explicit: bool) -> SinkConfig {
    let name = f.take::<String>("name").unwrap_or_default();
    if !is_name(&name, 64) {
        f.problem("name", "is required: 1-64 characters of letters, digits, '.', '_' or '-'");
    }
    let plugin = f.take::<PathBuf>("plugin").unwrap_or_default();
    if plugin.as_os_str().is_empty() {
        f.problem("plugin", "is required: the path of the sink's .wasm component");
    }
    let allowed_hosts = f.take::<Vec<String>>("allowed_hosts").unwrap_or_default();
    for host in &allowed_hosts {
        if let Err(why) = crate::sandbox::HostPattern::parse(host) {
            f.problem("allowed_hosts", why);
        }
    }
    let size = |f: &mut Fields<'_>, key: &str, default: u64, min: u64, max: u64| {
        let Some(text) = f.take::<Value>(key) else {
            return default;
        };
        let parsed = match &text {
            Value::Number(n) => n.as_u64().ok_or_else(|| "must be a positive size".to_string()),
            Value::String(s) => units::parse_bytes(s),
            _ => Err("must be a size such as \"64MiB\"".into()),
        };
        match parsed {
            Ok(n) if (min..=max).contains(&n) => n,
            Ok(n) => {
                f.problem(key, format!("{n} bytes is outside {min}..={max}"));
                default
            }
            Err(why) => {
                f.problem(key, why);
                default
            }
        }
    };
    let memory_limit = size(f, "memory_limit", DEFAULT_MEMORY_LIMIT, 1 << 20, 4 << 30);
    let max_response_bytes = size(f, "max_response_bytes", DEFAULT_MAX_RESPONSE_BYTES, 1024, 64 << 20);
    let cache_dir = match f.take::<String>("cache_dir") {
        Some(dir) if dir.is_empty() => None,
        Some(dir) => Some(PathBuf::from(dir)),
        None => default_cache_dir(),
    };
    let allow_http = f.take::<bool>("allow_http").unwrap_or(false);
    let proxy = f.take::<String>("proxy").filter(|p| !p.is_empty());
    if let Some(proxy) = &proxy
        && reqwest::Proxy::all(proxy.as_str()).is_err()
    {
        f.problem("proxy", format!("{:?} is not a proxy URL such as http://proxy:3128", redact_url(proxy)));
    }
    let defaults = SinkBudgets::default();
    let count = |f: &mut Fields<'_>, key: &str, default: u32, max: u32| match f.take::<i64>(key) {
        None => default,
        Some(n) if (1..=i64::from(max)).contains(&n) => n as u32,
        Some(n) => {
            f.problem(key, format!("{n} is outside 1..={max}"));
            default
        }
    };
    let max_retry_after = positive_duration(f, "max_retry_after", defaults.max_retry_after, notes);
    let budgets = SinkBudgets {
        max_retry_after,
        max_log_lines: count(f, "max_log_lines", defaults.max_log_lines, 100_000),
        max_log_bytes: size(f, "max_log_bytes", defaults.max_log_bytes, 1024, 64 << 20),
        max_message_bytes: size(f, "max_message_bytes", defaults.max_message_bytes, 64, 1 << 20),
        max_skip_reason_bytes: size(f, "max_skip_reason_bytes", defaults.max_skip_reason_bytes, 16, 64 << 10),
        max_stdio_bytes: size(f, "max_stdio_bytes", defaults.max_stdio_bytes, 0, 64 << 20),
        max_requests: count(f, "max_requests", defaults.max_requests, 10_000),
        max_request_bytes: size(f, "max_request_bytes", defaults.max_request_bytes, 0, 256 << 20),
    };
    let config = SinkSettings(f.string_map("config"));
    let (rate_limit, room_rate_limit) = if f.is_section("rate_limit") {
        if f.take::<serde_yaml_ng::Value>("rate_burst").is_some() {
            f.problem("rate_burst", "with rate_limit as a section, its burst is rate_limit.burst");
        }
        f.section("rate_limit", |f| (read_rate(f, "per_sink", "burst"), read_rate(f, "per_room", "per_room_burst")))
    } else {
        (read_rate(f, "rate_limit", "rate_burst"), None)
    };
    let breaker =
        if f.has("breaker") { f.section("breaker", |f| read_breaker(f, notes)) } else { BreakerSettings::default() };
    let start_from = read_start_from(f);
    let watch_plugin = f.take::<bool>("watch_plugin").unwrap_or(true);
    let broker = f.take::<String>("broker").filter(|b| !b.is_empty());
    let worker = WorkerConfig {
        rate_limit,
        room_rate_limit,
        breaker,
        ..read_delivery_overrides(f, notes, global, lease_explicit)
    };
    if worker.room_rate_limit.is_some() && worker.ordering == RoomOrdering::None {
        f.problem(
            "rate_limit.per_room",
            "needs ordering: per_room (the default): under ordering: none a held room's rows would go back to the claim that takes them again first",
        );
    }
    let sandbox = PluginConfig {
        name,
        plugin,
        allowed_hosts,
        memory_limit,
        max_response_bytes,
        cache_dir,
        allow_http,
        proxy,
        budgets,
        config,
    };
    SinkConfig { sandbox, start_from, watch_plugin, worker, broker }
}

/// One entry of `brokers:`: `kind`, `url`, `room_pipeline` (default 8), credentials (`token`
/// for NATS, or `user` and `password`), and the keys of its kind: NATS `stream`, `create_stream` (default false) and
/// `subjects` (required to create the stream); Redis `dedup_window` (default 24h) and
/// `max_len`; RabbitMQ `exchange` (default: the default exchange); Kafka `bootstrap` in place
/// of `url`, `topic`, `create_topic`, `partitions`, `tls`, `ca_file` and `sasl_mechanism`. A
/// key of another kind is refused, naming the kind it belongs to.
fn read_broker(name: &str, f: &mut Fields<'_>) -> crate::relay::settings::BrokerConfig {
    use crate::relay::settings::{BrokerConfig, BrokerKind, MAX_ROOM_PIPELINE};
    if !is_name(name, 64) {
        f.problem("", "a broker's name is 1-64 characters of letters, digits, '.', '_' or '-'");
    }
    let kind = match f.take::<String>("kind") {
        Some(kind) => BrokerKind::parse(&kind).unwrap_or_else(|| {
            f.problem("kind", format!("{kind:?} is not one of {}", BrokerKind::NAMES.join(", ")));
            BrokerKind::Nats
        }),
        None => {
            f.problem("kind", format!("is required: one of {}", BrokerKind::NAMES.join(", ")));
            BrokerKind::Nats
        }
    };
    let mut broker = BrokerConfig::new(name, kind, "");
    if kind == BrokerKind::Kafka {
        if f.has("url") {
            f.problem("url", "is not a key of kafka brokers: they take bootstrap: [\"host:port\", …]");
        }
        let _ = f.take::<String>("url");
        broker.bootstrap = read_bootstrap(f);
        broker.url = format!("kafka://{}", broker.bootstrap.join(","));
    } else {
        broker.url = f.take::<String>("url").unwrap_or_default();
        let schemes = kind.schemes();
        if !schemes.iter().any(|scheme| broker.url.starts_with(&format!("{scheme}://"))) {
            let forms: Vec<String> = schemes.iter().map(|s| format!("{s}://host:port")).collect();
            f.problem("url", format!("is required: {}", forms.join(" or ")));
        }
    }
    match f.take::<i64>("room_pipeline") {
        None => {}
        Some(n) if (1..=i64::from(MAX_ROOM_PIPELINE)).contains(&n) => broker.room_pipeline = n as u32,
        Some(n) => f.problem("room_pipeline", format!("{n} is not between 1 and {MAX_ROOM_PIPELINE}")),
    }
    // Each kind's own keys: present under another kind, they are refused.
    let only = |f: &mut Fields<'_>, key: &str, of: BrokerKind| {
        if kind != of && f.has(key) {
            f.problem(key, format!("is a key of kind {} brokers, not {}", of.name(), kind.name()));
        }
    };
    for key in ["stream", "create_stream", "subjects", "token"] {
        only(f, key, BrokerKind::Nats);
    }
    for key in ["dedup_window", "max_len"] {
        only(f, key, BrokerKind::Redis);
    }
    only(f, "exchange", BrokerKind::Rabbitmq);
    for key in ["bootstrap", "topic", "create_topic", "partitions", "tls", "ca_file", "sasl_mechanism"] {
        only(f, key, BrokerKind::Kafka);
    }
    broker.stream = f.take::<String>("stream").unwrap_or_default();
    if kind == BrokerKind::Nats && !is_name(&broker.stream, 64) {
        f.problem("stream", "is required: the JetStream stream's name (letters, digits, '.', '_' or '-')");
    }
    broker.create_stream = f.take::<bool>("create_stream").unwrap_or(false);
    broker.subjects = f.take::<Vec<String>>("subjects").unwrap_or_default();
    if broker.create_stream && broker.subjects.is_empty() {
        f.problem("subjects", "is required with create_stream: true (e.g. [\"rooms.>\"])");
    }
    if let Some(text) = f.take_duration("dedup_window") {
        match units::parse_duration_ms(&text) {
            Ok(ms) if ms >= 1_000 => broker.dedup_window = Duration::from_millis(ms as u64),
            Ok(_) => f.problem("dedup_window", format!("{text:?} is shorter than a second")),
            Err(why) => f.problem("dedup_window", why),
        }
    }
    broker.max_len = match f.take::<i64>("max_len") {
        Some(n) if n > 0 => Some(n as u64),
        Some(n) => {
            f.problem("max_len", format!("{n} is not a positive number of entries"));
            None
        }
        None => None,
    };
    broker.exchange = f.take::<String>("exchange").unwrap_or_default();
    broker.token = f.take::<String>("token").filter(|t| !t.is_empty());
    broker.user = f.take::<String>("user").filter(|u| !u.is_empty());
    broker.password = f.take::<String>("password").filter(|p| !p.is_empty());
    if broker.user.is_some() != broker.password.is_some() {
        f.problem("user", "and password go together");
    }
    read_kafka_keys(f, &mut broker);
    broker.allowed_destinations = read_allowed_destinations(f, &broker);
    broker
}

/// Kafka's `bootstrap`: one or more `host:port`, nothing else (no scheme, no credentials).
fn read_bootstrap(f: &mut Fields<'_>) -> Vec<String> {
    const FORM: &str = "is required: a list of the cluster's host:port, e.g. [\"127.0.0.1:9092\"]";
    let servers = f.take::<Vec<String>>("bootstrap").unwrap_or_default();
    if servers.is_empty() {
        f.problem("bootstrap", FORM);
    }
    for server in &servers {
        let fine = server.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty()
                && host.len() <= 253
                && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '[' | ']' | ':'))
                && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !fine {
            let shown = crate::text::printable(server, 80);
            f.problem("bootstrap", format!("{shown:?} is not host:port"));
        }
    }
    servers
}

/// A Kafka broker's own keys: `topic` (required), `create_topic`, `partitions`, `tls`,
/// `ca_file`, `sasl_mechanism` (read after `user` and `password`, which it goes with).
fn read_kafka_keys(f: &mut Fields<'_>, broker: &mut crate::relay::settings::BrokerConfig) {
    use crate::relay::settings::{BrokerKind, MAX_PARTITIONS, SASL_MECHANISMS};
    broker.topic = f.take::<String>("topic").unwrap_or_default();
    if broker.kind == BrokerKind::Kafka {
        if let Some(why) = crate::relay::confine::topic_problem(&broker.topic) {
            f.problem("topic", format!("is required: the topic records go to by default ({why})"));
        } else if broker.topic.starts_with("__") {
            f.problem("topic", "names one of the cluster's own topics (__…), which a relay never reaches");
        }
    }
    broker.create_topic = f.take::<bool>("create_topic").unwrap_or(false);
    match f.take::<i64>("partitions") {
        None => {}
        Some(n) if (1..=i64::from(MAX_PARTITIONS)).contains(&n) => broker.partitions = n as u32,
        Some(n) => f.problem("partitions", format!("{n} is not between 1 and {MAX_PARTITIONS}")),
    }
    broker.tls = f.take::<bool>("tls").unwrap_or(false);
    broker.ca_file = f.take::<String>("ca_file").map(std::path::PathBuf::from);
    if let Some(path) = &broker.ca_file {
        if !broker.tls {
            f.problem("ca_file", "is for tls: true");
        } else if let Err(e) = std::fs::metadata(path) {
            f.problem("ca_file", format!("{}: {e}", path.display()));
        }
    }
    if let Some(mechanism) = f.take::<String>("sasl_mechanism") {
        if !SASL_MECHANISMS.contains(&mechanism.as_str()) {
            f.problem("sasl_mechanism", format!("{mechanism:?} is not one of {}", SASL_MECHANISMS.join(", ")));
        } else if broker.user.is_none() {
            f.problem("sasl_mechanism", "is for user and password, which are not set");
        }
        broker.sasl_mechanism = mechanism;
    }
}

/// `allowed_destinations`: patterns in the broker's own syntax, none on its control plane.
/// Required where the kind has no default: Redis and MQTT, and RabbitMQ's default exchange
/// (where a routing key names any queue of the vhost).
fn read_allowed_destinations(f: &mut Fields<'_>, broker: &crate::relay::settings::BrokerConfig) -> Vec<String> {
    use crate::relay::settings::BrokerKind;
    const KEY: &str = "allowed_destinations";
    let patterns = f.take::<Vec<String>>(KEY);
    for pattern in patterns.iter().flatten() {
        if let Some(why) = crate::relay::confine::pattern_problem(broker.kind, pattern) {
            f.problem(KEY, why);
        }
    }
    let example = match broker.kind {
        BrokerKind::Redis => Some("the streams relays may add to, e.g. [\"rooms:*\"] (Redis glob)"),
        BrokerKind::Mqtt => Some("the topics relays may publish to, e.g. [\"rooms/#\"]"),
        BrokerKind::Rabbitmq if broker.exchange.is_empty() => Some(
            "the queues relays may publish to through the default exchange, e.g. [\"room-events\"] (or set exchange)",
        ),
        _ => None,
    };
    match (patterns, example) {
        (Some(patterns), _) if patterns.is_empty() => {
            f.problem(KEY, "is empty: no relay could publish anywhere (leave it out for the kind's default)");
            Vec::new()
        }
        (Some(patterns), _) => patterns,
        (None, Some(example)) => {
            f.problem(KEY, format!("is required for a {} broker: {example}", broker.kind.name()));
            Vec::new()
        }
        (None, None) => Vec::new(),
    }
}

/// `sink.breaker`: `failures` (0: only the sink's push-back opens it), `cool_down`,
/// `max_cool_down` (at least `cool_down`).
fn read_breaker(f: &mut Fields<'_>, notes: &mut Vec<String>) -> BreakerSettings {
    let defaults = BreakerSettings::default();
    let failures = match f.take::<i64>("failures") {
        None => defaults.failures,
        Some(n) if (0..=1_000_000).contains(&n) => n as u32,
        Some(n) => {
            f.problem(
                "failures",
                format!("{n} is outside 0..=1000000 (0: only the sink's push-back opens the breaker)"),
            );
            defaults.failures
        }
    };
    let cool_down = positive_duration(f, "cool_down", defaults.cool_down, notes);
    let max_cool_down = positive_duration(f, "max_cool_down", defaults.max_cool_down.max(cool_down), notes);
    if max_cool_down < cool_down {
        f.problem(
            "max_cool_down",
            format!("{} is shorter than cool_down {}", format_duration(max_cool_down), format_duration(cool_down)),
        );
    }
    BreakerSettings { failures, cool_down, max_cool_down }
}

/// A rate at `key` such as `200/s` (also `/m`, `/h`), with its burst at `burst_key`
/// (default: a tenth of a second's worth, at least 1): `rate_limit` and `rate_burst` on a
/// sink, or inside `rate_limit:` as a section `per_sink` and `burst`, `per_room` and
/// `per_room_burst`.
fn read_rate(f: &mut Fields<'_>, key: &str, burst_key: &str) -> Option<RateLimit> {
    let burst = f.take::<u32>(burst_key);
    let Some(text) = f.take::<String>(key) else {
        if burst.is_some() {
            f.problem(burst_key, format!("has no effect without {key}"));
        }
        return None;
    };
    let per = |unit: &str| match unit.trim() {
        "s" | "1s" => Some(1.0),
        "m" | "1m" => Some(60.0),
        "h" | "1h" => Some(3_600.0),
        _ => None,
    };
    let parsed = text.split_once('/').and_then(|(n, unit)| Some((n.trim().parse::<f64>().ok()?, per(unit)?)));
    let per_second = match parsed {
        Some((n, seconds)) if n > 0.0 && n.is_finite() => n / seconds,
        _ => {
            f.problem(key, format!("{text:?} is not a rate such as \"200/s\", \"600/m\" or \"1000/h\""));
            return None;
        }
    };
    let burst = match burst {
        Some(0) => {
            f.problem(burst_key, "must be at least 1");
            1
        }
        Some(n) => n,
        None => ((per_second / 10.0).ceil() as u32).max(1),
    };
    Some(RateLimit { per_second, burst })
}

fn default_node_id() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| is_name(h, 64))
        .unwrap_or_else(|| "outbox-host".into())
}

fn is_name(text: &str, max: usize) -> bool {
    !text.is_empty()
        && text.len() <= max
        && text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// A plain SQL identifier that is safe to splice into statements unquoted.
pub fn is_identifier(text: &str) -> bool {
    let mut chars = text.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && text.len() <= 63
}

#[cfg(test)]
mod tests;
