//! `outbox-host`: the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use outbox_host::app::{self, Host};
use outbox_host::config::{Config, ConfigError, LogFormat};
use outbox_host::logging::{complain, say};
use outbox_host::store::{Backend, NewEvent, Status, now_ms};
use tokio_util::sync::CancellationToken;

/// `--version`: the release, the build's git revision, and the sink contract versions a
/// plugin may be built for (`sandbox::contract`; a test keeps the two in step).
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ngit revision: ",
    env!("OUTBOX_GIT_REV"),
    "\nsink contract: outbox:sink@0.1.0 to 0.1.3 (wit/sink.wit; a sink built for any of them loads)"
);

/// Drains the room_outbox table and delivers each event through a sandboxed WebAssembly sink.
#[derive(Parser)]
#[command(name = "outbox-host", version, long_version = LONG_VERSION)]
struct Cli {
    /// The YAML config file. Without this flag, ./outbox.yaml is read if it exists.
    #[arg(long, short, global = true, env = "OUTBOX_CONFIG")]
    config: Option<PathBuf>,
    /// Log as JSON lines instead of text (overrides log.format).
    #[arg(long, global = true)]
    json_logs: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply migrations and deliver until SIGINT/SIGTERM.
    Run,
    /// Create or upgrade the outbox table, then exit.
    Migrate,
    /// Counts per status, the oldest waiting event and the most frequent errors.
    Status,
    /// Insert room events as a producer would, for trying a sink.
    Enqueue {
        #[command(flatten)]
        event: EventArgs,
        /// How many events to insert.
        #[arg(long, short = 'n', default_value_t = 1)]
        count: u32,
        /// Tenant / app code.
        #[arg(long, default_value = "default")]
        app_code: String,
        /// Insert as already delivered (as after a successful synchronous publish).
        #[arg(long)]
        delivered: bool,
    },
    /// Validate the config and load the sink plugin, saying exactly what is wrong.
    CheckConfig,
    /// One event: its row, its envelope and its decoded body, as JSON.
    Show {
        /// The event's id.
        event_id: String,
    },
    /// Move failed events back to pending, by id, type, error text, or all.
    Retry {
        /// One event.
        #[arg(long)]
        event_id: Option<String>,
        /// Every failed event of this type.
        #[arg(long = "event-type")]
        event_type: Option<String>,
        /// Every failed event whose error contains this text.
        #[arg(long)]
        error: Option<String>,
        /// Every failed event.
        #[arg(long)]
        all: bool,
        /// Do not ask before moving more than a handful.
        #[arg(long, short)]
        yes: bool,
        /// The sink whose failed events to retry (default: the first).
        #[arg(long)]
        sink: Option<String>,
    },
    /// Deliver a range of events again to one sink only (its delivered and failed ones).
    Replay {
        /// The sink, by name.
        #[arg(long)]
        sink: String,
        /// Events created at or after this RFC 3339 time (or date).
        #[arg(long)]
        from: String,
        /// Events created before this RFC 3339 time (default: now).
        #[arg(long)]
        to: Option<String>,
        /// Only events of this type.
        #[arg(long = "event-type")]
        event_type: Option<String>,
        /// Only events of this room.
        #[arg(long)]
        room: Option<String>,
        /// Count the events the replay would deliver again, and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask before replaying more than a thousand events.
        #[arg(long, short)]
        yes: bool,
    },
    /// Run one delivery through a sink in the sandbox, without a database, and show every
    /// request it made (credentials redacted), each reply, its log lines and the outcome.
    TrySink(TrySinkArgs),
    /// Write a new sink crate built on the outbox-sink SDK, ready to build and test.
    NewSink {
        /// The sink's crate name, e.g. slack-sink.
        name: String,
        /// Where to write it (default: ./NAME).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The outbox-sink SDK it depends on (default: plugins/sdk of this host's checkout).
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Change how many partitions a sink's rooms hash to (per-room order), with every host
    /// of the sink stopped; without --set, show each sink's partitions and owners.
    Partitions {
        /// The new count, 1 to 4096.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
        set: Option<u32>,
        /// Only this sink (default: every sink).
        #[arg(long)]
        sink: Option<String>,
    },
    /// Delete delivered rows older than DURATION (e.g. 7d), in bounded batches.
    Purge {
        /// Age of the delivered rows to delete, e.g. 7d or 72h.
        #[arg(long)]
        delivered_before: String,
        /// Rows per delete statement.
        #[arg(long, default_value_t = outbox_host::ops::PURGE_BATCH)]
        batch: u32,
    },
}

/// The event `enqueue` inserts and `try-sink` delivers.
#[derive(clap::Args)]
struct EventArgs {
    /// Event type, e.g. RoomGiftSent.
    #[arg(long = "type", short = 't')]
    event_type: String,
    /// Room id.
    #[arg(long, short)]
    room: String,
    /// The event body as JSON (fields of the type's protobuf message).
    #[arg(long, short)]
    body: Option<String>,
}

/// `try-sink`'s flags.
#[derive(clap::Args)]
struct TrySinkArgs {
    /// The sink's .wasm component.
    #[arg(long)]
    plugin: PathBuf,
    /// A key of the sink's `config:` map, as KEY=VALUE (repeat for more).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// A host the sink may reach, as in `allowed_hosts` (repeat for more).
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_hosts: Vec<String>,
    /// Allow plain http:// URLs (`allow_http`).
    #[arg(long)]
    allow_http: bool,
    #[command(flatten)]
    event: EventArgs,
    /// The attempt number the sink sees.
    #[arg(long, default_value_t = 1)]
    attempt: u32,
    /// `publish_timeout` for the delivery, e.g. 5s.
    #[arg(long, default_value = "5s")]
    timeout: String,
    /// Do not send requests: check them against the egress rules and answer with --reply.
    #[arg(long)]
    dry_run: bool,
    /// The dry run's reply status.
    #[arg(long, default_value_t = 200)]
    reply: u16,
    /// The dry run's reply body.
    #[arg(long, default_value = "")]
    reply_body: String,
    /// A header of the dry run's reply, as "Name: value" (repeat for more).
    #[arg(long = "reply-header", value_name = "NAME: VALUE")]
    reply_headers: Vec<String>,
}

/// `retry` asks before moving more rows than this, unless `--yes`.
const RETRY_WITHOUT_ASKING: i64 = 10;

/// `replay` asks before delivering more events again than this, unless `--yes`.
const REPLAY_WITHOUT_ASKING: u64 = 1_000;

fn main() -> ExitCode {
    outbox_host::allocator::tune();
    let cli = Cli::parse();
    // The sink author's tools need no config file and no database.
    let command = match cli.command {
        Command::TrySink(args) => return try_sink(args),
        Command::NewSink { name, dir, sdk } => return new_sink(&name, dir, sdk),
        other => other,
    };
    let (path, optional) = match &cli.config {
        Some(path) => (path.clone(), false),
        None => (PathBuf::from("outbox.yaml"), true),
    };
    let mut config = match Config::load(&path, optional) {
        Ok(config) => config,
        Err(e) => {
            complain(&format!("outbox-host: {e}\n"));
            return ExitCode::from(2);
        }
    };
    if cli.json_logs {
        config.log.format = LogFormat::Json;
    }
    let _flush_logs_at_exit = outbox_host::logging::init(&config.log);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let result = runtime.block_on(execute(command, config));
    // Tasks still parked on a database that is away must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            complain(&format!("outbox-host: {e:#}\n"));
            let refused = e.downcast_ref::<ConfigError>().is_some()
                || e.downcast_ref::<outbox_host::sandbox::SinkConfigProblems>().is_some();
            if refused { ExitCode::from(2) } else { ExitCode::FAILURE }
        }
    }
}

async fn execute(command: Command, config: Config) -> anyhow::Result<()> {
    match command {
        Command::Run => {
            let shutdown = CancellationToken::new();
            app::cancel_on_signals(shutdown.clone())?;
            let traces = outbox_host::ops::traces::start(&config.tracing)?;
            let ran = match Host::start_waiting(config, &shutdown).await? {
                Some(host) => host.run(shutdown).await,
                None => Ok(()),
            };
            if let Some(traces) = traces {
                traces.shutdown().await;
            }
            ran
        }
        Command::Migrate => migrate(&config).await,
        Command::Status => status(&config).await,
        Command::Enqueue { event, count, app_code, delivered } => {
            enqueue(&config, event, count, app_code, delivered).await
        }
        Command::Show { event_id } => show(&config, &event_id).await,
        Command::Retry { event_id, event_type, error, all, yes, sink } => {
            let filter =
                outbox_host::ops::retry_filter(event_id, event_type, error, None, all).map_err(anyhow::Error::msg)?;
            retry_failed(&config, filter, yes, sink).await
        }
        Command::Replay { sink, from, to, event_type, room, dry_run, yes } => {
            let filter = outbox_host::ops::replay_filter(&from, to.as_deref(), event_type, room)?;
            let store = app::open_store(&config).await?;
            let replayed = replay(store.clone(), &sink, &filter, dry_run, yes).await;
            store.close().await;
            say(&replayed?);
            Ok(())
        }
        Command::Purge { delivered_before, batch } => purge(&config, &delivered_before, batch).await,
        Command::Partitions { set, sink } => {
            let store = app::open_store(&config).await?;
            let done = partitions(store.clone(), set, sink.as_deref()).await;
            store.close().await;
            say(&done?);
            Ok(())
        }
        Command::TrySink(_) | Command::NewSink { .. } => unreachable!("handled before the config is read"),
        Command::CheckConfig => check_config(&config).await,
    }
}

/// `migrate`: creates, upgrades or adopts the table and registers the configured sinks.
async fn migrate(config: &Config) -> anyhow::Result<()> {
    let (store, migrated) = app::migrated_store(config).await?;
    let registered = match app::register_sinks(config, store.as_ref(), migrated).await {
        Ok(_) => converted(store.as_ref()).await,
        Err(e) => Err(e),
    };
    store.close().await;
    say(&format!("{} is up to date\n", config.table));
    for sink in registered? {
        let state = if sink.is_first(&config.table) {
            format!("({})", sink.table)
        } else {
            format!("(a consumer of {})", config.table)
        };
        say(&format!("sink {} is registered {state}\n", sink.name));
    }
    Ok(())
}

/// Every registered sink's copy table of an earlier version turned into its positions and
/// exceptions; the registry afterwards.
async fn converted(store: &dyn outbox_host::store::Store) -> anyhow::Result<Vec<outbox_host::store::RegisteredSink>> {
    let sinks = store.sinks().await?;
    app::convert_copies(store, &sinks).await?;
    Ok(sinks)
}

/// `status`: each sink's counts and partition owners.
async fn status(config: &Config) -> anyhow::Result<()> {
    let store = app::open_store(config).await?;
    let stats = store.stats().await?;
    let sinks = store.sinks().await.unwrap_or_default();
    let first = sinks.iter().find(|s| s.is_first(&config.table)).map(|s| format!(" (sink {})", s.name));
    say(&outbox_host::ops::report::status(&format!("{}{}", config.table, first.unwrap_or_default()), &stats, now_ms()));
    let clock = store.clock_ms().await?;
    say(&outbox_host::ops::report::owners(&store.partition_owners(clock).await?));
    // Every other sink is a consumer of the outbox: its positions and exceptions.
    for sink in sinks.iter().filter(|s| !s.is_first(&config.table)) {
        let own = store.clone().sink_store(sink).await?;
        let stats = own.stats().await?;
        let title = format!("{} (sink {}, reading it as a consumer)", config.table, sink.name);
        say(&format!("\n{}", outbox_host::ops::report::status(&title, &stats, now_ms())));
        say(&outbox_host::ops::report::owners(&own.partition_owners(clock).await?));
    }
    store.close().await;
    Ok(())
}

/// `enqueue`: inserts `count` events as a producer would, after registering the sinks.
async fn enqueue(
    config: &Config,
    event: EventArgs,
    count: u32,
    app_code: String,
    delivered: bool,
) -> anyhow::Result<()> {
    let EventArgs { event_type, room, body } = event;
    let body = outbox_host::envelope::body_from_json_text(&event_type, body.as_deref())?;
    let status = if delivered { Status::Delivered } else { Status::Pending };
    let base = now_ms();
    let events: Vec<NewEvent> = (0..count)
        .map(|i| {
            let event_id = format!("evt-{base}-{i}-{:08x}", outbox_host::clock::random_u64() as u32);
            let envelope = outbox_host::envelope::encode(
                &app_code,
                &event_id,
                &event_type,
                &room,
                i64::from(i) + 1,
                base,
                body.clone(),
            );
            NewEvent {
                app_code: app_code.clone(),
                event_id,
                event_type: event_type.clone(),
                room_id: room.clone(),
                status,
                envelope,
                created_at_ms: base,
                trace_context: None,
            }
        })
        .collect();
    // As `migrate` does: the configured sinks are registered before the first event.
    let (store, migrated) = app::migrated_store(config).await?;
    let inserted = match app::register_sinks(config, store.as_ref(), migrated).await {
        Ok(_) => store.insert(&events).await.map_err(anyhow::Error::from),
        Err(e) => Err(e),
    };
    store.close().await;
    inserted?;
    say(&format!("enqueued {count} {event_type} event(s) for room {room} as {status}\n"));
    if let (Some(first), Some(last)) = (events.first(), events.last()) {
        say(&format!("event ids {} .. {}\n", first.event_id, last.event_id));
    }
    Ok(())
}

/// `show ID`: one event with every sink's state of it, as JSON.
async fn show(config: &Config, event_id: &str) -> anyhow::Result<()> {
    let store = app::open_store(config).await?;
    let described = match store.get(event_id).await {
        Ok(Some(row)) => outbox_host::ops::describe_everywhere(store.clone(), &row).await.map(Some),
        other => other.map(|_| None),
    };
    store.close().await;
    let described = described?.with_context(|| format!("no event {event_id} in {}", config.table))?;
    let json = serde_json::to_string_pretty(&described)?;
    say(&format!("{}\n", outbox_host::text::json_for_terminal(&json)));
    Ok(())
}

/// `retry`: moves the failed events `filter` matches back to pending, asking first above
/// [`RETRY_WITHOUT_ASKING`] unless `yes`.
async fn retry_failed(
    config: &Config,
    filter: outbox_host::store::RetryFilter,
    yes: bool,
    sink: Option<String>,
) -> anyhow::Result<()> {
    let outbox = app::open_store(config).await?;
    let store = match &sink {
        Some(name) => outbox_host::ops::sink_state(outbox.clone(), name).await?,
        None => outbox.clone(),
    };
    let matching = store.count_failed(&filter).await?;
    if matching > RETRY_WITHOUT_ASKING && !yes && !confirm(&format!("Move {matching} failed events back to pending?"))?
    {
        store.close().await;
        anyhow::bail!("nothing moved ({matching} failed events match; pass --yes to move them without asking)");
    }
    let moved = outbox_host::ops::retry(store.as_ref(), &filter).await?;
    store.close().await;
    say(&format!("moved {moved} failed event(s) back to pending\n"));
    Ok(())
}

/// `purge`: deletes delivered rows older than `delivered_before` that no sink still needs.
async fn purge(config: &Config, delivered_before: &str, batch: u32) -> anyhow::Result<()> {
    let age = match outbox_host::units::parse_duration_ms(delivered_before) {
        Ok(ms) if ms > 0 => ms,
        Ok(_) => anyhow::bail!("--delivered-before must be positive"),
        Err(why) => anyhow::bail!("--delivered-before: {why}"),
    };
    let store = app::open_store(config).await?;
    let deleted = outbox_host::ops::purge(store.as_ref(), now_ms() - age, batch.max(1)).await;
    store.close().await;
    say(&format!("deleted {} delivered row(s) older than {delivered_before} from {}\n", deleted?, config.table));
    Ok(())
}

/// `check-config`: loads and checks every sink's plugin, then says what the config means.
async fn check_config(config: &Config) -> anyhow::Result<()> {
    let sinks = config.require_sinks("deliver")?;
    let metrics = outbox_host::ops::metrics::Metrics::new(sinks[0].name());
    for sink in sinks {
        app::load_sink(config, sink, std::sync::Arc::new(metrics.for_sink(sink.name())))
            .await
            .with_context(|| format!("sink {}", sink.name()))?;
    }
    for note in &config.notes {
        say(&format!("note: {note}\n"));
    }
    for sink in sinks {
        let w = &sink.worker;
        say(&format!(
            "config OK: sink {} loads{}; database {}; table {}; batch_size {}{}, publish_timeout {}, concurrency {}, lease {}\n",
            sink.name(),
            match &sink.broker {
                Some(broker) => format!(" and relays to broker {broker}, which answers"),
                None => String::new(),
            },
            outbox_host::redact::url(&config.database.url),
            config.table,
            w.batch_size,
            match Backend::from_url(&config.database.url).map(|b| w.claim_growth_on(b)) {
                Ok(growth) if growth > 1 => format!(
                    " (up to {} behind a backlog)",
                    outbox_host::engine::settings::largest_claim(w.batch_size, growth)
                ),
                _ => String::new(),
            },
            outbox_host::units::format_duration(w.publish_timeout),
            w.concurrency,
            outbox_host::units::format_duration(w.lease),
        ));
    }
    Ok(())
}

/// `try-sink`: exit 0 when the event would be stored as delivered, 1 when the attempt
/// failed, 2 when the sink or its config is refused.
fn try_sink(args: TrySinkArgs) -> ExitCode {
    let options = try_options(args);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let result = options.and_then(|options| runtime.block_on(outbox_host::sinkdev::try_sink(options)));
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    match result {
        Ok(report) => {
            say(&report.render());
            if report.delivered() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(e) => {
            complain(&format!("outbox-host: {e:#}\n"));
            ExitCode::from(2)
        }
    }
}

fn try_options(args: TrySinkArgs) -> anyhow::Result<outbox_host::sinkdev::TryOptions> {
    let pair = |text: &str, sep: char, flag: &str| {
        text.split_once(sep)
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .filter(|(k, _)| !k.is_empty())
            .with_context(|| format!("{flag} {text:?}: expected KEY{sep}VALUE"))
    };
    let settings = args.set.iter().map(|s| pair(s, '=', "--set")).collect::<anyhow::Result<_>>()?;
    // Names in lower case, as a real reply's reach the sink.
    let headers = args
        .reply_headers
        .iter()
        .map(|h| pair(h, ':', "--reply-header").map(|(k, v)| (k.to_ascii_lowercase(), v)))
        .collect::<anyhow::Result<_>>()?;
    let timeout = match outbox_host::units::parse_duration_ms(&args.timeout) {
        Ok(ms) if ms > 0 => std::time::Duration::from_millis(ms as u64),
        _ => anyhow::bail!("--timeout {:?}: expected a duration such as 5s", args.timeout),
    };
    let dry_run = args.dry_run.then(|| outbox_host::sandbox::trial::ScriptedReply {
        status: args.reply,
        headers,
        body: args.reply_body.into_bytes(),
    });
    Ok(outbox_host::sinkdev::TryOptions {
        plugin: args.plugin,
        settings,
        allowed_hosts: args.allow_hosts,
        allow_http: args.allow_http,
        event_type: args.event.event_type,
        room: args.event.room,
        body: args.event.body,
        attempt: args.attempt,
        timeout,
        dry_run,
    })
}

/// `new-sink`: writes the crate and says how to build it.
fn new_sink(name: &str, dir: Option<PathBuf>, sdk: Option<PathBuf>) -> ExitCode {
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    let sdk = sdk.unwrap_or_else(outbox_host::sinkdev::default_sdk_path);
    match outbox_host::sinkdev::new_sink(name, &dir, &sdk) {
        Ok(files) => {
            for file in files {
                say(&format!("wrote {}\n", file.display()));
            }
            let library = name.replace('-', "_");
            say(&format!(
                "next: cd {} && cargo test && cargo build --release --target wasm32-wasip2\n      (the component is target/wasm32-wasip2/release/{library}.wasm)\n",
                dir.display()
            ));
            ExitCode::SUCCESS
        }
        Err(e) => {
            complain(&format!("outbox-host: {e:#}\n"));
            ExitCode::from(2)
        }
    }
}

/// `replay`: counts first; replays unless `dry_run`, asking before more than
/// [`REPLAY_WITHOUT_ASKING`] events unless `yes`. Returns what to say.
async fn replay(
    store: std::sync::Arc<dyn outbox_host::store::Store>,
    sink: &str,
    filter: &outbox_host::store::ReplayFilter,
    dry_run: bool,
    yes: bool,
) -> anyhow::Result<String> {
    let matching = outbox_host::ops::count_replay(store.clone(), sink, filter).await?;
    if dry_run {
        return Ok(format!("would replay {matching} event(s) to sink {sink} (dry run: nothing changed)\n"));
    }
    if matching > REPLAY_WITHOUT_ASKING
        && !yes
        && !confirm(&format!("Deliver {matching} events again to sink {sink}?"))?
    {
        anyhow::bail!("nothing replayed ({matching} events match; pass --yes to replay them without asking)");
    }
    let replayed = outbox_host::ops::replay(store, sink, filter).await?;
    Ok(format!("replaying {replayed} event(s) to sink {sink}\n"))
}

/// Asks on the terminal; refuses when there is no terminal to ask on.
fn confirm(question: &str) -> anyhow::Result<bool> {
    use std::io::{BufRead as _, IsTerminal as _};
    if !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    say(&format!("{question} [y/N] "));
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// `partitions`: each sink's partition owners, or (`--set`) a new count for every sink, or
/// `only` one, refused while a host holds one of its partitions.
async fn partitions(
    store: std::sync::Arc<dyn outbox_host::store::Store>,
    set: Option<u32>,
    only: Option<&str>,
) -> anyhow::Result<String> {
    let sinks = store.sinks().await?;
    if let Some(name) = only.filter(|n| !sinks.iter().any(|s| s.name == *n)) {
        let known: Vec<&str> = sinks.iter().map(|s| s.name.as_str()).collect();
        anyhow::bail!("no sink {name:?} on this table; its sinks: {}", known.join(", "));
    }
    let now = store.clock_ms().await?;
    let mut out = String::new();
    for sink in sinks.iter().filter(|s| only.is_none_or(|n| n == s.name)) {
        let own = store.clone().sink_store(sink).await?;
        match set {
            None => {
                out.push_str(&format!("sink {}: ", sink.name));
                out.push_str(&outbox_host::ops::report::owners(&own.partition_owners(now).await?));
            }
            Some(total) => match own.set_partitions(total, now).await? {
                Ok(before) => {
                    out.push_str(&format!("sink {}: {before} partition(s) made {total}\n", sink.name));
                }
                Err(owners) => anyhow::bail!(
                    "sink {}: hosts hold its partitions ({}): stop every host of the sink first (or wait {} for a killed host's leases to run out); nothing changed",
                    sink.name,
                    owners.join(", "),
                    "partition_lease"
                ),
            },
        }
    }
    Ok(out)
}
