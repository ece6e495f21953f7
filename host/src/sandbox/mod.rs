//! The sandbox: a sink is a WebAssembly component implementing world `outbox:sink/sink`.
//! It is compiled (or loaded from the compile cache) and pre-instantiated once; every
//! delivery runs in a fresh store with a memory cap, an epoch deadline and an outer
//! timeout, so a trap, an endless loop, a memory bomb or a hang fails that one attempt.

pub mod settings;

mod bindings;
mod cache;
mod capture;
pub mod contract;
mod egress;
mod http;
pub mod relay;
mod state;
pub mod trial;
mod turn;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use tokio::time::Instant;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, StoreLimitsBuilder, Trap,
    UpdateDeadline,
};
use wasmtime_wasi::WasiCtxBuilder;

pub use bindings::{Event, FailureKind};
use bindings::{Outcome, SinkPre};
use capture::Capture;
pub use egress::HostPattern;
use http::{HttpPolicy, PolicySettings};
use settings::PluginConfig;
use state::{DeliveryState, Shared};
pub use turn::Turn;

use crate::ops::metrics::Metrics;
use crate::text::{printable, printable_within};

/// How often the epoch advances; the granularity of the CPU deadline.
const EPOCH_TICK: Duration = Duration::from_millis(10);
/// Bytes of memory, table and stack a pooled slot keeps resident between deliveries.
const KEEP_RESIDENT: usize = 64 << 10;
/// At most this many config problems a sink reports are shown, each at most this long.
const MAX_CONFIG_PROBLEMS: usize = 20;
const MAX_CONFIG_PROBLEM_BYTES: usize = 300;

/// Anything the worker can hand events to: the WebAssembly runtime, or a native stand-in
/// (the benchmark's floor).
#[async_trait::async_trait]
pub trait Deliver: Send + Sync + 'static {
    /// The sink's name, for logs and metrics.
    fn name(&self) -> &str;
    /// One attempt, bounded by `timeout`.
    async fn deliver(&self, event: &Event, timeout: Duration) -> Result<Delivered, AttemptFailure>;
    /// Which build this is (`sha256:<hex>` of the component), recorded with each outcome.
    fn digest(&self) -> Option<Arc<str>> {
        None
    }
    /// Who an attempt's span names (`deliver {sink}`; a relay's is `publish {broker}`).
    fn messaging(&self) -> crate::ops::traces::Messaging<'_> {
        crate::ops::traces::Messaging { operation: "deliver", system: "outbox-host", destination: self.name() }
    }
    /// How many events of one room may be in flight at once under per-room order: 1, unless
    /// the sink keeps order across deliveries in flight (a publisher on one connection to a
    /// broker that acknowledges in order, and fails every later one when one fails). The
    /// engine still starts a room's events in order and records their outcomes in order.
    fn room_pipeline(&self) -> u32 {
        1
    }
    /// One attempt under a room pipeline, with the event's [`Turn`] in its room: a sink that
    /// keeps order puts the event on the wire only once the turn has come, and says when it
    /// has. By default the turn is given up at once (order across deliveries in flight is
    /// then the sink's own affair).
    async fn deliver_in_turn(
        &self,
        event: &Event,
        timeout: Duration,
        mut turn: Turn,
    ) -> Result<Delivered, AttemptFailure> {
        turn.sent();
        self.deliver(event, timeout).await
    }
    /// Resolves once the destination has been seen reachable after `since` (the breaker
    /// opened then), for a sink that checks on its own; by default never.
    async fn reached_since(&self, since: std::time::Instant) {
        let _ = since;
        std::future::pending::<()>().await;
    }
}

#[async_trait::async_trait]
impl Deliver for SinkRuntime {
    fn name(&self) -> &str {
        SinkRuntime::name(self)
    }

    async fn deliver(&self, event: &Event, timeout: Duration) -> Result<Delivered, AttemptFailure> {
        SinkRuntime::deliver(self, event, timeout).await
    }

    fn digest(&self) -> Option<Arc<str>> {
        Some(self.core.digest.clone())
    }
}

/// What a sink did with an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// The destination accepted it.
    Delivered,
    /// The sink does not carry this type (stored as delivered).
    Skipped(String),
}

/// Why an attempt failed, as the worker and the metrics classify it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    /// The sink said retryable.
    Retryable,
    /// The sink said permanent.
    Permanent,
    /// The attempt ran past `publish_timeout` (in the guest or waiting on the host).
    Timeout,
    /// The guest trapped, hit its memory cap, or could not be instantiated.
    Trap,
}

impl FailureClass {
    /// The label used in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Retryable => "retryable",
            FailureClass::Permanent => "permanent",
            FailureClass::Timeout => "timeout",
            FailureClass::Trap => "trap",
        }
    }
}

/// What a sink's `flow.push-back` said about its retryable failure: it concerns more than
/// the event, so the event is deferred without counting the attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pressure {
    /// The event's room is over a frequency limit.
    RoomThrottled,
    /// The destination asks every caller to slow down.
    Throttled,
    /// The destination cannot take anything now.
    Unavailable,
    /// Not the sink's word but the host's: the sink's egress policy refused a request of
    /// the failed attempt, so its config, not the event, is wrong.
    Misconfigured,
}

impl Pressure {
    /// The label used in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Pressure::RoomThrottled => "room_throttled",
            Pressure::Throttled => "throttled",
            Pressure::Unavailable => "unavailable",
            Pressure::Misconfigured => "misconfigured",
        }
    }
}

/// A failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptFailure {
    /// Which kind of failure.
    pub class: FailureClass,
    /// Short and secret-free: becomes `last_error`.
    pub message: String,
    /// The sink's hint for the next attempt.
    pub retry_after: Option<Duration>,
    /// Set when a retryable failure concerns the room or the whole destination.
    pub pressure: Option<Pressure>,
}

impl AttemptFailure {
    fn new(class: FailureClass, message: impl Into<String>) -> Self {
        AttemptFailure { class, message: message.into(), retry_after: None, pressure: None }
    }

    /// A failure retrying cannot help (e.g. an envelope that does not decode).
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::new(FailureClass::Permanent, message)
    }
}

/// A loaded sink, ready to deliver events concurrently.
pub struct SinkRuntime {
    core: Core,
    pre: SinkPre<DeliveryState>,
}

/// What every loaded component has, a sink's or a relay's: its engine, its settings and
/// budgets, the memory cap, the epoch ticker, and the digest of its build.
struct Core {
    engine: Engine,
    shared: Arc<Shared>,
    memory_limit: usize,
    ticker_stop: Arc<AtomicBool>,
    digest: Arc<str>,
}

impl Drop for Core {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

/// A component read and compiled (or taken from the cache) for one world, its imports
/// checked against the contract `contract` names, and a linker with WASI p2 in it.
struct Compiled {
    engine: Engine,
    component: wasmtime::component::Component,
    linker: Linker<DeliveryState>,
    memory_limit: usize,
    bytes: Vec<u8>,
}

impl Compiled {
    /// Reads and compiles `config.plugin` for a pool of `concurrency` instances;
    /// `contract` checks the versions of the world it was built for.
    fn load(
        config: &PluginConfig,
        concurrency: u32,
        contract: impl Fn(&Engine, &wasmtime::component::Component) -> Result<(), String>,
    ) -> anyhow::Result<Compiled> {
        let plugin = &config.plugin;
        let bytes = std::fs::read(plugin).with_context(|| format!("sink.plugin: cannot read {}", plugin.display()))?;
        let memory_limit = usize::try_from(config.memory_limit).unwrap_or(usize::MAX);
        let engine = Engine::new(&engine_config(concurrency, memory_limit))?;
        let cache = config.cache_dir.as_deref().map(cache::open).transpose()?;
        let component = cache::load(&engine, &bytes, cache.as_ref()).map_err(|e| {
            let hint = if bytes.starts_with(b"\0asm\x01\0\0\0") {
                " (this is a core wasm module, not a component: build the sink for wasm32-wasip2)"
            } else {
                ""
            };
            anyhow::anyhow!("sink.plugin: {} is not a usable WebAssembly component{hint}: {e:#}", plugin.display())
        })?;
        contract(&engine, &component).map_err(|why| anyhow::anyhow!("sink.plugin: {} {why}", plugin.display()))?;
        let mut linker = Linker::<DeliveryState>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        Ok(Compiled { engine, component, linker, memory_limit, bytes })
    }

    /// The core of the loaded component, its host state shared by its calls.
    fn core(
        self,
        config: &PluginConfig,
        metrics: Arc<Metrics>,
        trial: Option<Arc<trial::Trial>>,
    ) -> anyhow::Result<Core> {
        let allowed = config
            .allowed_hosts
            .iter()
            .map(|h| HostPattern::parse(h).map_err(anyhow::Error::msg))
            .collect::<Result<_, _>>()?;
        let http = HttpPolicy::new(PolicySettings {
            allowed,
            allow_http: config.allow_http,
            proxy: config.proxy.as_deref(),
            max_response_bytes: config.max_response_bytes,
            max_request_bytes: config.budgets.max_request_bytes,
        })?;
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            settings: config.config.0.clone(),
            http,
            budgets: config.budgets.clone(),
            metrics,
            retry_after_clamp_said: AtomicBool::new(false),
            trial,
        });
        let ticker_stop = Arc::new(AtomicBool::new(false));
        spawn_epoch_ticker(self.engine.weak(), ticker_stop.clone());
        let digest = format!("sha256:{:x}", <sha2::Sha256 as sha2::Digest>::digest(&self.bytes)).into();
        Ok(Core { engine: self.engine, shared, memory_limit: self.memory_limit, ticker_stop, digest })
    }
}

impl SinkRuntime {
    /// Compiles (or loads from cache), links and pre-instantiates the sink's component.
    /// `concurrency` sizes the instance pool. Errors say what is wrong with the plugin.
    pub fn load(config: &PluginConfig, concurrency: u32) -> anyhow::Result<SinkRuntime> {
        Self::load_with(config, concurrency, Arc::new(Metrics::new(&config.name)))
    }

    /// [`SinkRuntime::load`], counting what the sink exceeds into `metrics`.
    pub fn load_with(config: &PluginConfig, concurrency: u32, metrics: Arc<Metrics>) -> anyhow::Result<SinkRuntime> {
        Self::load_inner(config, concurrency, metrics, None)
    }

    fn load_inner(
        config: &PluginConfig,
        concurrency: u32,
        metrics: Arc<Metrics>,
        trial: Option<Arc<trial::Trial>>,
    ) -> anyhow::Result<SinkRuntime> {
        let plugin = &config.plugin;
        let mut compiled = Compiled::load(config, concurrency, |engine, component| {
            contract::check(&contract::targets(engine, component))
        })?;
        bindings::Sink::add_to_linker::<_, HasSelf<_>>(&mut compiled.linker, |s| s)?;
        let instance_pre = compiled.linker.instantiate_pre(&compiled.component).map_err(|e| {
            anyhow::anyhow!(
                "sink.plugin: {} needs imports the host does not grant (only outbox:sink config/http/log/flow and WASI p2 without files, env or sockets): {e:#}",
                plugin.display()
            )
        })?;
        let pre = SinkPre::new(instance_pre).map_err(|e| {
            anyhow::anyhow!(
                "sink.plugin: {} does not implement world {}/sink@{} (it must export `deliver`): {e:#}",
                plugin.display(),
                contract::PACKAGE,
                contract::VERSION
            )
        })?;
        Ok(SinkRuntime { core: compiled.core(config, metrics, trial)?, pre })
    }

    /// Loads the sink (compiling off the async runtime) and asks it to check its config;
    /// problems it reports refuse start-up like any other config problem.
    /// Problems it reports are shown under `sink.config.` (so they cannot pose as the host's
    /// own keys), escaped, and bounded in number and length.
    pub async fn load_checked(
        config: &PluginConfig,
        concurrency: u32,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<SinkRuntime> {
        Self::checked(config, concurrency, timeout, metrics, None).await
    }

    /// [`SinkRuntime::load_checked`] for `try-sink`: what the sink does is recorded in
    /// `trial` (and its log lines go there, not to the host's log).
    pub async fn load_trial(
        config: &PluginConfig,
        timeout: Duration,
        trial: Arc<trial::Trial>,
    ) -> anyhow::Result<SinkRuntime> {
        Self::checked(config, 1, timeout, Arc::new(Metrics::new(&config.name)), Some(trial)).await
    }

    async fn checked(
        config: &PluginConfig,
        concurrency: u32,
        timeout: Duration,
        metrics: Arc<Metrics>,
        trial: Option<Arc<trial::Trial>>,
    ) -> anyhow::Result<SinkRuntime> {
        let owned = config.clone();
        let runtime =
            tokio::task::spawn_blocking(move || SinkRuntime::load_inner(&owned, concurrency, metrics, trial)).await??;
        let problems = runtime.check_config(timeout).await.map_err(|f| {
            anyhow::anyhow!("sink.plugin: {} failed its config check: {}", config.plugin.display(), f.message)
        })?;
        if !problems.is_empty() {
            return Err(SinkConfigProblems(sink_problems(problems)).into());
        }
        Ok(runtime)
    }

    /// The sink's configured name.
    pub fn name(&self) -> &str {
        &self.core.shared.name
    }

    /// `sha256:<hex>` of the component this runtime was loaded from.
    pub fn digest_text(&self) -> &str {
        &self.core.digest
    }

    /// Runs one delivery in a fresh store, bounded by `timeout`.
    /// What the sink returns is bounded here: reasons and messages are escaped and clipped,
    /// and a `retry-after-ms` above `sink.max_retry_after` is clamped to it.
    pub async fn deliver(&self, event: &Event, timeout: Duration) -> Result<Delivered, AttemptFailure> {
        self.deliver_timed(event, timeout).await.0
    }

    /// [`SinkRuntime::deliver`], also saying where its time went (the benchmark's breakdown).
    pub async fn deliver_timed(&self, event: &Event, timeout: Duration) -> (Result<Delivered, AttemptFailure>, Phases) {
        let started = std::time::Instant::now();
        let mut call = self.core.fresh_store(timeout);
        let stored = std::time::Instant::now();
        let mut instantiated = stored;
        let run = async {
            let sink = self.pre.instantiate_async(&mut call.store).await?;
            instantiated = std::time::Instant::now();
            sink.call_deliver(&mut call.store, event).await
        };
        let returned = tokio::time::timeout_at(call.deadline, run).await;
        let called = std::time::Instant::now();
        let pressure = call.store.data().pressure();
        let denied = call.store.data().denied_by_policy().map(str::to_string);
        let outcome = self.core.finish(call, returned, timeout);
        let finished = std::time::Instant::now();
        let phases = Phases {
            store: stored - started,
            instantiate: instantiated.saturating_duration_since(stored),
            call: called.saturating_duration_since(instantiated),
            teardown: finished - called,
        };
        let result = match (outcome, denied) {
            // A failure after the policy refused a request is the config's, whatever the
            // sink made of it: deferred, never failed for good (see `Pressure::Misconfigured`).
            (Ok(Err(_)), Some(why)) => Err(AttemptFailure {
                class: FailureClass::Retryable,
                message: printable_within(&why, self.core.shared.budgets.max_message_bytes as usize).0,
                retry_after: None,
                pressure: Some(Pressure::Misconfigured),
            }),
            (outcome, _) => outcome.and_then(|o| self.bounded(o, pressure)),
        };
        (result, phases)
    }

    /// What the sink returned, bounded: reasons and messages escaped and clipped, a long
    /// `retry-after-ms` clamped. A push-back counts only with a retryable failure.
    fn bounded(
        &self,
        outcome: Result<Outcome, bindings::Failure>,
        pressure: Option<Pressure>,
    ) -> Result<Delivered, AttemptFailure> {
        let budgets = &self.core.shared.budgets;
        match outcome {
            Ok(Outcome::Delivered) => Ok(Delivered::Delivered),
            Ok(Outcome::Skipped(reason)) => {
                let (reason, clipped) = printable_within(&reason, budgets.max_skip_reason_bytes as usize);
                if clipped {
                    self.core.shared.metrics.sink_limit("skip_reason");
                }
                Ok(Delivered::Skipped(reason))
            }
            Err(failure) => {
                let (message, clipped) = printable_within(&failure.message, budgets.max_message_bytes as usize);
                if clipped {
                    self.core.shared.metrics.sink_limit("message");
                }
                let (class, pressure) = match failure.kind {
                    FailureKind::Retryable => (FailureClass::Retryable, pressure),
                    FailureKind::Permanent => (FailureClass::Permanent, None),
                };
                Err(AttemptFailure {
                    class,
                    message,
                    retry_after: failure.retry_after_ms.map(|ms| self.clamp_retry_after(ms)),
                    pressure,
                })
            }
        }
    }

    fn clamp_retry_after(&self, ms: u64) -> Duration {
        let max = self.core.shared.budgets.max_retry_after;
        let asked = Duration::from_millis(ms);
        if asked <= max {
            return asked;
        }
        self.core.shared.metrics.sink_limit("retry_after");
        if !self.core.shared.retry_after_clamp_said.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                sink = %self.core.shared.name,
                asked_ms = ms,
                max = %crate::units::format_duration(max),
                "sink asked to wait longer than sink.max_retry_after; clamped (said once, counted in room_outbox_sink_limit_hits_total)"
            );
        }
        max
    }

    /// Asks the sink whether its `config:` map lets it deliver: one line per problem.
    /// Each destination the sink declared meanwhile (`egress.declare`, WIT 0.1.2) that its
    /// egress policy denies is a problem too, naming the sink's key, the URL and the host's
    /// key to change: a config that cannot deliver is refused before it consumes any event.
    pub async fn check_config(&self, timeout: Duration) -> Result<Vec<String>, AttemptFailure> {
        let mut call = self.core.fresh_store(timeout);
        call.store.data_mut().checking_config();
        let run = async {
            let sink = self.pre.instantiate_async(&mut call.store).await?;
            sink.call_check_config(&mut call.store).await
        };
        let returned = tokio::time::timeout_at(call.deadline, run).await;
        let declared = call.store.data().declared().to_vec();
        let mut problems = self.core.finish(call, returned, timeout)?;
        // Only what the policy denies: a declared URL that does not parse is the sink's own
        // to report (and an empty one is a key it found missing).
        for (key, url) in declared {
            if let Err(bindings::HttpError::Denied(why)) = self.core.shared.http.check_destination(&url) {
                problems.push(format!("{key}: {} cannot be reached: {why}", printable(&url, 512)));
            }
        }
        Ok(problems)
    }
}

impl Core {
    /// A fresh store for one call of an export: a locked-down WASI context with captured
    /// stdout and stderr, the memory cap, and an epoch deadline at `timeout`.
    fn fresh_store(&self, timeout: Duration) -> ExportCall {
        let deadline = Instant::now() + timeout;
        let stdio_limit = usize::try_from(self.shared.budgets.max_stdio_bytes).unwrap_or(usize::MAX);
        let (stdout, stderr) = (Capture::new(stdio_limit), Capture::new(stdio_limit));
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let limits = StoreLimitsBuilder::new().memory_size(self.memory_limit).trap_on_grow_failure(true).build();
        let mut store = Store::new(&self.engine, DeliveryState::new(wasi, limits, self.shared.clone(), deadline));
        store.limiter(|s| &mut s.limits);
        // Check the deadline on every tick, yielding in between so that a guest spinning in
        // a loop never holds a runtime thread, and trap once it has passed.
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|store| {
            if Instant::now() >= store.data().deadline() {
                Err(Trap::Interrupt.into())
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        ExportCall { store, deadline, stdout, stderr }
    }

    /// `call`'s store, after a call that returned normally, readied for another call over
    /// within `timeout`.
    fn rearm(call: &mut ExportCall, timeout: Duration) {
        call.deadline = Instant::now() + timeout;
        call.store.data_mut().rearm(call.deadline);
        call.store.set_epoch_deadline(1);
    }

    /// Logs what the call wrote and turns its result (or its running out of time) into the
    /// export's value or the attempt's failure.
    fn finish<T>(
        &self,
        mut call: ExportCall,
        returned: Result<wasmtime::Result<T>, tokio::time::error::Elapsed>,
        timeout: Duration,
    ) -> Result<T, AttemptFailure> {
        self.settle(&mut call, returned, timeout)
    }

    /// [`Core::finish`], keeping the store (for another call when this one returned).
    fn settle<T>(
        &self,
        call: &mut ExportCall,
        returned: Result<wasmtime::Result<T>, tokio::time::error::Elapsed>,
        timeout: Duration,
    ) -> Result<T, AttemptFailure> {
        call.store.data_mut().finish(&call.stdout, &call.stderr);
        match returned {
            Err(_) => Err(timed_out(timeout)),
            Ok(Err(e)) => Err(classify_error(&e, timeout, self.memory_limit)),
            Ok(Ok(value)) => Ok(value),
        }
    }
}

/// Where one delivery's time went.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// A fresh store: WASI context, stdio captures, limits, deadline.
    pub store: Duration,
    /// Instantiating the pre-linked component in it.
    pub instantiate: Duration,
    /// The `deliver` call, arguments and result included.
    pub call: Duration,
    /// Logging what it wrote, and dropping the store (its pooled slot goes back).
    pub teardown: Duration,
}

/// One call of an export in its own store.
struct ExportCall {
    store: Store<DeliveryState>,
    deadline: Instant,
    stdout: Capture,
    stderr: Capture,
}

/// What a sink's `check-config` reported: config problems like any other, which refuse
/// start-up (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n  - {}", .0.join("\n  - "))]
pub struct SinkConfigProblems(pub Vec<String>);

/// A sink's own config problems as the host shows them: under `sink.config.`, escaped onto
/// one line, clipped, and at most [`MAX_CONFIG_PROBLEMS`] of them.
fn sink_problems(problems: Vec<String>) -> Vec<String> {
    let total = problems.len();
    let mut shown: Vec<String> = problems
        .into_iter()
        .take(MAX_CONFIG_PROBLEMS)
        .map(|p| {
            let p = printable(&p, MAX_CONFIG_PROBLEM_BYTES);
            let p = p.strip_prefix("sink.config.").unwrap_or(&p);
            format!("sink.config.{p} (reported by the sink)")
        })
        .collect();
    if total > MAX_CONFIG_PROBLEMS {
        shown.push(format!("sink.config: … and {} more problems reported by the sink", total - MAX_CONFIG_PROBLEMS));
    }
    shown
}

fn engine_config(concurrency: u32, memory_limit: usize) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.concurrency_support(false);
    // Room for every in-flight delivery plus the ones being torn down.
    let instances = concurrency.saturating_mul(2).saturating_add(8);
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(instances)
        .total_core_instances(instances.saturating_mul(8))
        .total_memories(instances.saturating_mul(2))
        .total_tables(instances.saturating_mul(4))
        .total_stacks(instances)
        .max_memory_size(memory_limit)
        // Reset the first KEEP_RESIDENT bytes of a finished delivery's memory, tables and
        // stack by zeroing them rather than handing the pages back to the kernel: page
        // faults and TLB shootdowns were most of a small sink's per-delivery cost
        // (profiled). Larger values made the zeroing itself the cost; 64 KiB measured best.
        .linear_memory_keep_resident(KEEP_RESIDENT)
        .table_keep_resident(KEEP_RESIDENT)
        .async_stack_keep_resident(KEEP_RESIDENT)
        // Where the kernel has PAGEMAP_SCAN (Linux 6.7+), reset only the pages a delivery
        // dirtied, back to the sink's initial image, and keep them resident: no page faults
        // on the next delivery's stack and heap. The same fresh state, at a quarter of the
        // cost (bench: median 60 → 16 µs per delivery, the guest's call 27 → 3 µs).
        // Elsewhere `Auto` falls back to the settings above. Batching decommits measured
        // slower.
        .pagemap_scan(wasmtime::Enabled::Auto);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    config
}

fn spawn_epoch_ticker(engine: wasmtime::EngineWeak, stop: Arc<AtomicBool>) {
    std::thread::Builder::new()
        .name("outbox-epoch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(EPOCH_TICK);
                match engine.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => break,
                }
            }
        })
        .expect("spawning the epoch ticker thread");
}

fn timed_out(timeout: Duration) -> AttemptFailure {
    AttemptFailure::new(
        FailureClass::Timeout,
        format!("sink did not finish within publish_timeout {}", crate::units::format_duration(timeout)),
    )
}

fn classify_error(e: &wasmtime::Error, timeout: Duration, memory_limit: usize) -> AttemptFailure {
    let text = format!("{e:#}");
    if text.contains("growing memory") || text.contains("memory growth failure") {
        return AttemptFailure::new(
            FailureClass::Trap,
            format!("sink exceeded its memory limit of {} MiB", memory_limit >> 20),
        );
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => timed_out(timeout),
        Some(trap) => AttemptFailure::new(FailureClass::Trap, format!("sink trapped: {trap}")),
        None => AttemptFailure::new(FailureClass::Trap, crate::text::short_error(&format!("sink failed: {text}"))),
    }
}
