//! Prometheus metrics with room-service's names, through the official client
//! (`prometheus-client`, OpenMetrics text). Counters and histograms are updated as the host
//! goes; the gauges that need a database query are refreshed on an interval
//! (`admin.stats_interval`), never per scrape.
//!
//! Counters are registered without their `_total` suffix: the client adds it, so the samples
//! are `room_outbox_publish_success_total` and so on.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::ops::health::DbHealth;
use crate::store::{Stats, Status};

/// Rooms held by their rate limit that the console lists per sink, at most.
const MAX_HELD_SHOWN: usize = 50;

/// A room whose next event waits for its rate limit (`rate_limit.per_room`), as the console
/// shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldRoom {
    /// The room's app.
    pub app_code: String,
    /// The room.
    pub room_id: String,
    /// Its rows waiting on this host.
    pub queued: usize,
}

/// Where a sink's circuit breaker is: the engine keeps it, the metrics and the page show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkState {
    /// Deliveries start freely.
    Closed,
    /// One probe may start.
    HalfOpen,
    /// Nothing starts until the cool-down has passed.
    Open,
    /// Nothing starts until the cool-down has passed: the sink's config denies where it
    /// sends.
    Misconfigured,
}

impl SinkState {
    /// The label used in logs, metrics and the status page.
    pub fn as_str(self) -> &'static str {
        match self {
            SinkState::Closed => "closed",
            SinkState::HalfOpen => "half_open",
            SinkState::Open => "open",
            SinkState::Misconfigured => "misconfigured",
        }
    }

    /// The value of the `room_outbox_sink_state` gauge.
    pub fn gauge(self) -> i64 {
        match self {
            SinkState::Closed => 0,
            SinkState::HalfOpen => 1,
            SinkState::Open => 2,
            SinkState::Misconfigured => 3,
        }
    }
}

/// Upper bounds of the latency buckets, in milliseconds.
const LATENCY_BUCKETS_MS: [f64; 13] =
    [1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0];
/// Upper bounds of the claimed-batch-size buckets.
const BATCH_BUCKETS: [f64; 12] = [0.0, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 5000.0, 10000.0];
/// The budgets of [`Metrics::sink_limit`], all exported from the start.
const SINK_LIMITS: [&str; 7] = ["log", "message", "skip_reason", "stdio", "requests", "request_bytes", "retry_after"];
/// The database operations of [`Metrics::db_error`], all exported from the start.
const DB_OPERATIONS: [&str; 5] = ["claim", "mark", "release", "partitions", "stats"];
/// The push-backs of [`Metrics::pushed_back`], all exported from the start.
/// Distinct `event_type` label values kept; later types are counted under `other`.
pub const MAX_EVENT_TYPES: usize = 100;
/// The longest `event_type` kept as a label value.
const MAX_EVENT_TYPE_CHARS: usize = 64;
/// The label value of every event type past the cap.
pub const OTHER_EVENT_TYPE: &str = "other";
const PRESSURES: [&str; 4] = ["room_throttled", "throttled", "unavailable", "misconfigured"];
/// The results of [`Metrics::reloaded`], all exported from the start.
const RELOAD_RESULTS: [&str; 3] = ["ok", "unchanged", "refused"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SinkLabel {
    sink: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    sink: String,
    event_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    sink: String,
    event_type: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    sink: String,
    limit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PressureLabels {
    sink: String,
    pressure: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    sink: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    sink: String,
    to: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    sink: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BrokerLabel {
    broker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BrokerErrorLabels {
    broker: String,
    kind: String,
}

/// The kinds of a broker's publish errors: `unavailable` (push-back) and `refused`.
pub const BROKER_ERRORS: [&str; 2] = ["unavailable", "refused"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS_MS)
}

fn batch_histogram() -> Histogram {
    Histogram::new(BATCH_BUCKETS)
}

/// Everything `/metrics` shows, for one host and all its sinks: the families every sink's
/// [`Metrics`] writes into under its own `sink` label.
struct Families {
    registry: Mutex<Registry>,
    success: Family<EventLabels, Counter>,
    skipped: Family<EventLabels, Counter>,
    failure: Family<FailureLabels, Counter>,
    latency: Family<SinkLabel, Histogram, fn() -> Histogram>,
    claims: Family<SinkLabel, Counter>,
    claimed_rows: Family<SinkLabel, Histogram, fn() -> Histogram>,
    rescues: Family<SinkLabel, Counter>,
    handed_back: Family<SinkLabel, Counter>,
    fenced: Family<SinkLabel, Counter>,
    db_errors: Family<OpLabel, Counter>,
    sink_limits: Family<LimitLabels, Counter>,
    panics: Family<SinkLabel, Counter>,
    log_dropped: Counter,
    trace_spans: Family<ResultLabel, Counter>,
    pending: Family<StatusLabels, Gauge>,
    rows: Family<StatusLabels, Gauge>,
    oldest_waiting_age_ms: Family<SinkLabel, Gauge>,
    stats_up: Family<SinkLabel, Gauge>,
    db_health: DbHealth,
    push_backs: Family<PressureLabels, Counter>,
    sink_state: Family<SinkLabel, Gauge>,
    breaker_transitions: Family<TransitionLabels, Counter>,
    reloads: Family<ReloadLabels, Counter>,
    broker_latency: Family<BrokerLabel, Histogram, fn() -> Histogram>,
    broker_in_flight: Family<BrokerLabel, Gauge>,
    broker_duplicates: Family<BrokerLabel, Counter>,
    broker_errors: Family<BrokerErrorLabels, Counter>,
    broker_up: Family<BrokerLabel, Gauge>,
    /// Each broker's connection state, by name (readiness and the page show it).
    brokers: Mutex<std::collections::BTreeMap<String, BrokerReport>>,
    /// The sinks paused as misconfigured, with why (readiness names them).
    misconfigured: Mutex<std::collections::BTreeMap<String, String>>,
    /// Each of this host's sinks' circuit breakers, by sink (the console shows them).
    breakers: Mutex<std::collections::BTreeMap<String, BreakerReport>>,
    /// The rooms each sink holds back by `rate_limit.per_room` now (at most [`MAX_HELD_SHOWN`]).
    rooms_held: Mutex<std::collections::BTreeMap<String, Vec<HeldRoom>>>,
    rooms_held_gauge: Family<SinkLabel, Gauge>,
    /// The brokers each relay of this host publishes to, by sink.
    relays: Mutex<std::collections::BTreeMap<String, std::collections::BTreeSet<String>>>,
    /// The `event_type` label values in use: at most [`MAX_EVENT_TYPES`], the rest `other`.
    event_types: std::sync::RwLock<std::collections::HashSet<String>>,
}

/// One sink's view of the host's metrics: what it records carries its `sink` label. The
/// database's health and the dropped log lines are the host's, shared by every view.
pub struct Metrics {
    sink: String,
    shared: std::sync::Arc<Families>,
    delivered_total: AtomicU64,
}

impl Families {
    fn register(&self) {
        let mut r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        r.register("room_outbox_pending_total", "Rows waiting for delivery (pending, retryable)", self.pending.clone());
        r.register("room_outbox_rows", "Rows by status, in each sink's delivery state", self.rows.clone());
        r.register(
            "room_outbox_oldest_pending_age_ms",
            "Age of the oldest pending or retryable row (0 when none)",
            self.oldest_waiting_age_ms.clone(),
        );
        r.register(
            "room_outbox_stats_up",
            "Whether the table counts have been read at least once",
            self.stats_up.clone(),
        );
        r.register("room_outbox_publish_success", "Events the sink delivered (skipped included)", self.success.clone());
        r.register("room_outbox_publish_failure", "Failed delivery attempts by kind", self.failure.clone());
        r.register("room_outbox_skipped", "Events the sink does not carry, stored as delivered", self.skipped.clone());
        r.register("room_outbox_publish_latency_ms", "Time of one sink call, sandbox included", self.latency.clone());
        r.register("room_outbox_claims", "Claims that returned at least one row", self.claims.clone());
        r.register("room_outbox_claim_batch_size", "Rows per non-empty claim", self.claimed_rows.clone());
        r.register(
            "room_outbox_lease_rescues",
            "Rows claimed again after another worker's lease expired",
            self.rescues.clone(),
        );
        r.register(
            "room_outbox_handed_back",
            "Claimed rows handed back unstarted (shutdown, short lease)",
            self.handed_back.clone(),
        );
        r.register(
            "room_outbox_fenced_outcomes",
            "Outcomes not written because this host had lost the row's partition to another",
            self.fenced.clone(),
        );
        r.register("room_outbox_db_errors", "Failed database operations by operation", self.db_errors.clone());
        r.register(
            "room_outbox_sink_limit_hits",
            "Times a sink went past a budget; the excess was dropped or clamped",
            self.sink_limits.clone(),
        );
        r.register(
            "room_outbox_delivery_panics",
            "Delivery tasks that panicked; their rows were recorded as retryable",
            self.panics.clone(),
        );
        r.register(
            "room_outbox_sink_push_backs",
            "Retryable failures the sink said concern its room or whole destination; deferred, not counted",
            self.push_backs.clone(),
        );
        r.register(
            "room_outbox_sink_state",
            "The sink's circuit breaker: 0 closed, 1 half-open (probing), 2 open (paused), 3 misconfigured (paused)",
            self.sink_state.clone(),
        );
        r.register(
            "room_outbox_rooms_held",
            "Rooms whose next event waits for their rate limit (rate_limit.per_room) on this host",
            self.rooms_held_gauge.clone(),
        );
        r.register(
            "room_outbox_sink_state_transitions",
            "Circuit breaker transitions by the state entered",
            self.breaker_transitions.clone(),
        );
        r.register(
            "room_outbox_sink_reloads",
            "Reloads of a sink's plugin by result: ok (a new build delivers), unchanged, refused (the old one goes on)",
            self.reloads.clone(),
        );
        r.register(
            "room_outbox_broker_publish_latency_ms",
            "Time from publishing an event's records to the broker's last ack",
            self.broker_latency.clone(),
        );
        r.register(
            "room_outbox_broker_acks_in_flight",
            "Records published to the broker and not yet acknowledged",
            self.broker_in_flight.clone(),
        );
        r.register(
            "room_outbox_broker_duplicates",
            "Records the broker reported it already had (its dedup dropped them)",
            self.broker_duplicates.clone(),
        );
        r.register(
            "room_outbox_broker_errors",
            "Publishes that failed by kind: unavailable (deferred, no attempt counted) or refused",
            self.broker_errors.clone(),
        );
        r.register(
            "room_outbox_broker_up",
            "1 while the broker can be reached (its last publish or probe got an answer), 0 while not",
            self.broker_up.clone(),
        );
        r.register(
            "room_outbox_log_lines_dropped",
            "Log lines dropped because the log output was closed, broken or too slow",
            self.log_dropped.clone(),
        );
        r.register(
            "room_outbox_trace_spans",
            "Spans by result: exported, dropped (the export queue was full), failed (their export failed)",
            self.trace_spans.clone(),
        );
    }
}

/// A broker's connection state as readiness, the status page and `/api/status` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerReport {
    /// `nats`, `redis`, `rabbitmq` or `mqtt`.
    pub kind: &'static str,
    /// Whether its last publish or probe got an answer.
    pub up: bool,
    /// Since when it is up or down, UTC milliseconds.
    pub since_ms: i64,
    /// While down, why (short, one line, secret-free).
    pub error: Option<String>,
}

/// Longest broker error kept for readiness and the page, in bytes.
const BROKER_ERROR_BYTES: usize = 300;

/// One broker's series and connection state, as a relay records them: fetched once, so a
/// publish costs no label lookups.
#[derive(Clone)]
pub struct BrokerMetrics {
    name: String,
    kind: &'static str,
    latency: Histogram,
    in_flight: Gauge,
    duplicates: Counter,
    unavailable: Counter,
    refused: Counter,
    up: Gauge,
    shared: std::sync::Arc<Families>,
}

impl BrokerMetrics {
    /// `records` published now wait for the broker's acks (negative: no longer).
    pub fn in_flight(&self, records: i64) {
        self.in_flight.inc_by(records);
    }

    /// A publish ended after `took`: acknowledged, with `duplicates` records the broker
    /// already had, or failed with an error of `error_kind` (of [`BROKER_ERRORS`]). Either
    /// way the broker answered, except when it was unavailable.
    pub fn published(&self, took: Duration, result: Result<u64, &'static str>) {
        match result {
            Ok(duplicates) => {
                self.latency.observe(took.as_secs_f64() * 1000.0);
                self.duplicates.inc_by(duplicates);
            }
            Err(kind) => {
                let errors = if kind == "unavailable" { &self.unavailable } else { &self.refused };
                errors.inc();
            }
        }
    }

    /// The broker answered (`Ok`), or could not be reached, with why.
    pub fn reached(&self, result: Result<(), &str>) {
        let up = result.is_ok();
        if up && self.up.get() == 1 {
            return; // the publish path's common case: no lock
        }
        self.up.set(i64::from(up));
        let mut brokers = self.shared.brokers.lock().unwrap_or_else(|p| p.into_inner());
        let error = result.err().map(|e| crate::text::printable(&crate::redact::scrub(e), BROKER_ERROR_BYTES));
        match brokers.get_mut(&self.name) {
            Some(report) if report.up == up => report.error = error,
            _ => {
                let report = BrokerReport { kind: self.kind, up, since_ms: crate::clock::now_ms(), error };
                brokers.insert(self.name.clone(), report);
            }
        }
    }
}

/// A lock whose holder panicked is still read: what it guards is a report, whole at every
/// write.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The sink's circuit breaker as the status page and `/api/status` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerReport {
    /// `closed`, `half_open` or `open`.
    pub state: SinkState,
    /// When it got there, UTC milliseconds (0: closed since start).
    pub since_ms: i64,
    /// Why it got there.
    pub reason: String,
    /// While open, when the next probe may start, UTC milliseconds.
    pub next_probe_at_ms: Option<i64>,
}

impl Metrics {
    /// Metrics for a host whose (first) sink is named `sink`.
    pub fn new(sink: &str) -> Metrics {
        let shared = Families {
            registry: Mutex::new(Registry::default()),
            success: Family::default(),
            skipped: Family::default(),
            failure: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            claims: Family::default(),
            claimed_rows: Family::new_with_constructor(batch_histogram),
            rescues: Family::default(),
            handed_back: Family::default(),
            fenced: Family::default(),
            db_errors: Family::default(),
            sink_limits: Family::default(),
            panics: Family::default(),
            log_dropped: Counter::default(),
            trace_spans: Family::default(),
            pending: Family::default(),
            rows: Family::default(),
            oldest_waiting_age_ms: Family::default(),
            stats_up: Family::default(),
            db_health: DbHealth::default(),
            push_backs: Family::default(),
            sink_state: Family::default(),
            breaker_transitions: Family::default(),
            reloads: Family::default(),
            broker_latency: Family::new_with_constructor(latency_histogram),
            broker_in_flight: Family::default(),
            broker_duplicates: Family::default(),
            broker_errors: Family::default(),
            broker_up: Family::default(),
            brokers: Mutex::default(),
            misconfigured: Mutex::default(),
            breakers: Mutex::default(),
            rooms_held: Mutex::default(),
            rooms_held_gauge: Family::default(),
            relays: Mutex::default(),
            event_types: Default::default(),
        };
        shared.register();
        for op in DB_OPERATIONS {
            let _ = shared.db_errors.get_or_create(&OpLabel { op: op.into() });
        }
        Metrics::view(std::sync::Arc::new(shared), sink)
    }

    /// Another sink's view of the same metrics.
    pub fn for_sink(&self, sink: &str) -> Metrics {
        Metrics::view(self.shared.clone(), sink)
    }

    fn view(shared: std::sync::Arc<Families>, sink: &str) -> Metrics {
        let m = Metrics { sink: sink.to_string(), shared, delivered_total: AtomicU64::new(0) };
        lock(&m.shared.breakers).entry(m.sink.clone()).or_insert(BreakerReport {
            state: SinkState::Closed,
            since_ms: 0,
            reason: String::new(),
            next_probe_at_ms: None,
        });
        // Series that should read 0 rather than be missing before anything happens.
        let f = &m.shared;
        for limit in SINK_LIMITS {
            let _ = f.sink_limits.get_or_create(&m.limit_labels(limit));
        }
        let _ = f.panics.get_or_create(&m.sink_label());
        let _ = f.claims.get_or_create(&m.sink_label());
        let _ = f.rescues.get_or_create(&m.sink_label());
        let _ = f.handed_back.get_or_create(&m.sink_label());
        let _ = f.fenced.get_or_create(&m.sink_label());
        let _ = f.stats_up.get_or_create(&m.sink_label());
        let _ = f.oldest_waiting_age_ms.get_or_create(&m.sink_label());
        for pressure in PRESSURES {
            let _ = f.push_backs.get_or_create(&PressureLabels { sink: m.sink.clone(), pressure: pressure.into() });
        }
        f.sink_state.get_or_create(&m.sink_label()).set(SinkState::Closed.gauge());
        for to in [SinkState::Open, SinkState::HalfOpen, SinkState::Closed, SinkState::Misconfigured] {
            let _ =
                f.breaker_transitions.get_or_create(&TransitionLabels { sink: m.sink.clone(), to: to.as_str().into() });
        }
        for status in Status::ALL {
            let _ = f.rows.get_or_create(&m.status_labels(status));
        }
        for status in [Status::Pending, Status::Retryable] {
            let _ = f.pending.get_or_create(&m.status_labels(status));
        }
        for result in RELOAD_RESULTS {
            let _ = f.reloads.get_or_create(&ReloadLabels { sink: m.sink.clone(), result: result.into() });
        }
        m
    }

    /// A reload of the sink ended: `ok` (a new build delivers), `unchanged`, or `refused`.
    pub fn reloaded(&self, result: &'static str) {
        self.shared.reloads.get_or_create(&ReloadLabels { sink: self.sink.clone(), result: result.into() }).inc();
    }

    /// Broker `broker`'s series (at 0 before its first publish) and connection state (up
    /// when first seen: it has just been connected to), fetched once for every publish to
    /// come.
    pub fn broker(&self, broker: &str, kind: &'static str) -> BrokerMetrics {
        let f = &self.shared;
        let label = BrokerLabel { broker: broker.to_string() };
        let error = |kind: &str| {
            f.broker_errors.get_or_create(&BrokerErrorLabels { broker: broker.into(), kind: kind.into() }).clone()
        };
        let series = BrokerMetrics {
            name: broker.to_string(),
            kind,
            latency: f.broker_latency.get_or_create(&label).clone(),
            in_flight: f.broker_in_flight.get_or_create(&label).clone(),
            duplicates: f.broker_duplicates.get_or_create(&label).clone(),
            unavailable: error("unavailable"),
            refused: error("refused"),
            up: f.broker_up.get_or_create(&label).clone(),
            shared: self.shared.clone(),
        };
        lock(&f.relays).entry(self.sink.clone()).or_default().insert(broker.to_string());
        let known = f.brokers.lock().unwrap_or_else(|p| p.into_inner()).contains_key(broker);
        if !known {
            series.reached(Ok(()));
        }
        series
    }

    /// Every broker a relay of this host publishes to, by name, with its connection state.
    pub fn brokers(&self) -> Vec<(String, BrokerReport)> {
        let brokers = self.shared.brokers.lock().unwrap_or_else(|p| p.into_inner());
        brokers.iter().map(|(name, report)| (name.clone(), report.clone())).collect()
    }

    /// The sink these metrics are labelled with.
    pub fn sink(&self) -> &str {
        &self.sink
    }

    fn status_labels(&self, status: Status) -> StatusLabels {
        StatusLabels { sink: self.sink.clone(), status: status.as_str().into() }
    }

    fn sink_label(&self) -> SinkLabel {
        SinkLabel { sink: self.sink.clone() }
    }

    fn event_labels(&self, event_type: &str) -> EventLabels {
        EventLabels { sink: self.sink.clone(), event_type: self.event_type_label(event_type) }
    }

    /// `event_type` as a label value: the first [`MAX_EVENT_TYPES`] types seen (each at most
    /// [`MAX_EVENT_TYPE_CHARS`] plain characters) as they are, any other as `other`, so that
    /// a producer writing many types cannot grow the metrics without bound.
    fn event_type_label(&self, event_type: &str) -> String {
        let known = &self.shared.event_types;
        if known.read().unwrap_or_else(|p| p.into_inner()).contains(event_type) {
            return event_type.to_string();
        }
        let plain = event_type.len() <= MAX_EVENT_TYPE_CHARS
            && event_type.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
        let mut known = known.write().unwrap_or_else(|p| p.into_inner());
        if plain && (known.len() < MAX_EVENT_TYPES || known.contains(event_type)) {
            known.insert(event_type.to_string());
            return event_type.to_string();
        }
        OTHER_EVENT_TYPE.to_string()
    }

    fn limit_labels(&self, limit: &str) -> LimitLabels {
        LimitLabels { sink: self.sink.clone(), limit: limit.to_string() }
    }

    /// A delivery the sink accepted (`skipped` is also counted apart).
    pub fn delivered(&self, event_type: &str, skipped: bool, took: Duration) {
        self.shared.success.get_or_create(&self.event_labels(event_type)).inc();
        if skipped {
            self.shared.skipped.get_or_create(&self.event_labels(event_type)).inc();
        }
        self.shared.latency.get_or_create(&self.sink_label()).observe(took.as_secs_f64() * 1000.0);
        self.delivered_total.fetch_add(1, Ordering::Relaxed);
    }

    /// Deliveries counted so far (all event types), for the benchmark's exactly-once check.
    pub fn delivered_total(&self) -> u64 {
        self.delivered_total.load(Ordering::Relaxed)
    }

    /// A failed attempt of this `kind` (retryable, permanent, timeout, trap).
    pub fn failed(&self, event_type: &str, kind: &str, took: Option<Duration>) {
        let labels = FailureLabels {
            sink: self.sink.clone(),
            event_type: self.event_type_label(event_type),
            kind: kind.to_string(),
        };
        self.shared.failure.get_or_create(&labels).inc();
        if let Some(took) = took {
            self.shared.latency.get_or_create(&self.sink_label()).observe(took.as_secs_f64() * 1000.0);
        }
    }

    /// A claim returned `rows` rows, `rescued` of them with an expired lease.
    pub fn claimed(&self, rows: usize, rescued: usize) {
        self.shared.claims.get_or_create(&self.sink_label()).inc();
        self.shared.claimed_rows.get_or_create(&self.sink_label()).observe(rows as f64);
        self.shared.rescues.get_or_create(&self.sink_label()).inc_by(rescued as u64);
    }

    /// An outcome fenced off: its partition had moved to another host.
    pub fn fenced(&self) {
        self.shared.fenced.get_or_create(&self.sink_label()).inc();
    }

    /// Rows handed back unstarted.
    pub fn handed_back(&self, rows: u64) {
        self.shared.handed_back.get_or_create(&self.sink_label()).inc_by(rows);
    }

    /// A sink went past one of its budgets (`log`, `message`, `skip_reason`, `stdio`,
    /// `requests`, `request_bytes`, `retry_after`); the excess was dropped or clamped.
    pub fn sink_limit(&self, limit: &'static str) {
        self.shared.sink_limits.get_or_create(&self.limit_labels(limit)).inc();
    }

    /// A delivery task panicked; its row was recorded as retryable.
    pub fn delivery_panic(&self) {
        self.shared.panics.get_or_create(&self.sink_label()).inc();
    }

    /// The sink pushed back (`room_throttled`, `throttled`, `unavailable`).
    pub fn pushed_back(&self, pressure: &'static str) {
        self.shared
            .push_backs
            .get_or_create(&PressureLabels { sink: self.sink.clone(), pressure: pressure.into() })
            .inc();
    }

    /// The circuit breaker moved to `state`.
    pub fn breaker_moved(&self, state: SinkState, reason: &str, next_probe_at_ms: Option<i64>) {
        self.shared.sink_state.get_or_create(&self.sink_label()).set(state.gauge());
        self.shared
            .breaker_transitions
            .get_or_create(&TransitionLabels { sink: self.sink.clone(), to: state.as_str().into() })
            .inc();
        // A probe (half-open) does not end a misconfiguration; only getting past the policy does.
        let mut paused = self.shared.misconfigured.lock().unwrap_or_else(|p| p.into_inner());
        match state {
            SinkState::Misconfigured => {
                paused.insert(self.sink.clone(), reason.to_string());
            }
            SinkState::Closed | SinkState::Open => {
                paused.remove(&self.sink);
            }
            SinkState::HalfOpen => {}
        }
        drop(paused);
        let report =
            BreakerReport { state, since_ms: crate::clock::now_ms(), reason: reason.to_string(), next_probe_at_ms };
        lock(&self.shared.breakers).insert(self.sink.clone(), report);
    }

    /// The rooms this sink holds back by their rate limit now, most rows waiting first.
    pub fn rooms_held(&self, mut held: Vec<HeldRoom>) {
        self.shared.rooms_held_gauge.get_or_create(&self.sink_label()).set(held.len() as i64);
        held.truncate(MAX_HELD_SHOWN);
        lock(&self.shared.rooms_held).insert(self.sink.clone(), held);
    }

    /// The rooms this host's sink `sink` holds back by their rate limit (see [`Metrics::rooms_held`]).
    pub fn rooms_held_of(&self, sink: &str) -> Vec<HeldRoom> {
        lock(&self.shared.rooms_held).get(sink).cloned().unwrap_or_default()
    }

    /// Every sink of this host paused as misconfigured, by name, with why.
    pub fn misconfigured(&self) -> Vec<(String, String)> {
        let paused = self.shared.misconfigured.lock().unwrap_or_else(|p| p.into_inner());
        paused.iter().map(|(sink, why)| (sink.clone(), why.clone())).collect()
    }

    /// This sink's circuit breaker, for the console and the API.
    pub fn breaker(&self) -> BreakerReport {
        self.breaker_of(&self.sink).expect("a view's sink has a breaker from its start")
    }

    /// The circuit breaker of this host's sink `sink`; `None` when this host does not
    /// deliver it.
    pub fn breaker_of(&self, sink: &str) -> Option<BreakerReport> {
        lock(&self.shared.breakers).get(sink).cloned()
    }

    /// The brokers this host's relay `sink` publishes to, with their connection state.
    pub fn brokers_of(&self, sink: &str) -> Vec<(String, BrokerReport)> {
        let names = lock(&self.shared.relays).get(sink).cloned().unwrap_or_default();
        let brokers = lock(&self.shared.brokers);
        names.into_iter().filter_map(|name| brokers.get(&name).map(|b| (name, b.clone()))).collect()
    }

    /// A database operation failed: counted, and remembered for readiness and the page.
    pub fn db_error(&self, operation: &'static str, error: &dyn std::fmt::Display) {
        self.shared.db_errors.get_or_create(&OpLabel { op: operation.into() }).inc();
        self.shared.db_health.failed(operation, error, crate::clock::now_ms());
    }

    /// A claim or an outcome write succeeded: ends its run of failures.
    pub fn db_ok(&self, operation: &'static str) {
        self.shared.db_health.succeeded(operation);
    }

    /// The run of failed claims and writes, and the last database error.
    pub fn db_health(&self) -> &DbHealth {
        &self.shared.db_health
    }

    /// The latest table counts (from the periodic refresh).
    pub fn set_stats(&self, stats: &Stats, now_ms: i64) {
        for status in Status::ALL {
            let n = stats.count(status);
            self.shared.rows.get_or_create(&self.status_labels(status)).set(n);
            if matches!(status, Status::Pending | Status::Retryable) {
                self.shared.pending.get_or_create(&self.status_labels(status)).set(n);
            }
        }
        let age = stats.oldest_waiting_created_at_ms.map_or(0, |c| (now_ms - c).max(0));
        self.shared.oldest_waiting_age_ms.get_or_create(&self.sink_label()).set(age);
        self.shared.stats_up.get_or_create(&self.sink_label()).set(1);
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let registry = self.shared.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Log lines are counted where they are dropped, outside any one host's metrics.
        let dropped = crate::logging::dropped_lines();
        self.shared.log_dropped.inc_by(dropped.saturating_sub(self.shared.log_dropped.get()));
        // So are spans, where tracing is on.
        if crate::ops::traces::enabled() {
            for (result, count) in crate::ops::traces::span_counts() {
                let counter = self.shared.trace_spans.get_or_create(&ResultLabel { result: result.into() });
                counter.inc_by(count.saturating_sub(counter.get()));
            }
        }
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
            tracing::warn!(error = %e, "could not encode the metrics");
        }
        out
    }
}

/// The content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative() {
        let m = Metrics::new("fake");
        m.delivered("RoomGiftSent", false, Duration::from_millis(3));
        m.delivered("RoomGiftSent", true, Duration::from_millis(700));
        let text = m.render();
        assert!(text.contains("room_outbox_publish_latency_ms_bucket{le=\"2.5\",sink=\"fake\"} 0\n"), "{text}");
        assert!(text.contains("room_outbox_publish_latency_ms_bucket{le=\"5.0\",sink=\"fake\"} 1\n"), "{text}");
        assert!(text.contains("room_outbox_publish_latency_ms_bucket{le=\"1000.0\",sink=\"fake\"} 2\n"), "{text}");
        assert!(text.contains("room_outbox_publish_latency_ms_bucket{le=\"+Inf\",sink=\"fake\"} 2\n"), "{text}");
        assert!(text.contains("room_outbox_publish_latency_ms_count{sink=\"fake\"} 2\n"), "{text}");
        assert!(text.contains("room_outbox_publish_success_total{sink=\"fake\",event_type=\"RoomGiftSent\"} 2\n"));
        assert!(text.contains("room_outbox_skipped_total{sink=\"fake\",event_type=\"RoomGiftSent\"} 1\n"));
        assert_eq!(m.delivered_total(), 2);
    }

    #[test]
    fn label_values_are_escaped_and_odd_event_types_are_other() {
        let m = Metrics::new("a\"b");
        m.failed("x\ny", "trap", None);
        let text = m.render();
        assert!(text.contains("{sink=\"a\\\"b\",event_type=\"other\",kind=\"trap\"} 1"), "{text}");
    }

    #[test]
    fn event_type_label_values_are_capped() {
        let m = Metrics::new("fake");
        for i in 0..MAX_EVENT_TYPES + 50 {
            m.delivered(&format!("Type{i}"), false, Duration::from_millis(1));
        }
        m.delivered("Type0", false, Duration::from_millis(1));
        m.delivered(&"T".repeat(65), false, Duration::from_millis(1));
        let text = m.render();
        let series = text.lines().filter(|l| l.starts_with("room_outbox_publish_success_total{")).count();
        assert_eq!(series, MAX_EVENT_TYPES + 1, "the kept types and other");
        assert!(text.contains("room_outbox_publish_success_total{sink=\"fake\",event_type=\"Type0\"} 2\n"), "{text}");
        assert!(text.contains("room_outbox_publish_success_total{sink=\"fake\",event_type=\"other\"} 51\n"), "{text}");
    }

    #[test]
    fn zero_series_are_there_before_anything_happens() {
        let text = Metrics::new("fake").render();
        for line in [
            "room_outbox_db_errors_total{op=\"claim\"} 0",
            "room_outbox_sink_limit_hits_total{sink=\"fake\",limit=\"retry_after\"} 0",
            "room_outbox_delivery_panics_total{sink=\"fake\"} 0",
            "room_outbox_rows{sink=\"fake\",status=\"failed\"} 0",
            "room_outbox_pending_total{sink=\"fake\",status=\"retryable\"} 0",
            "room_outbox_stats_up{sink=\"fake\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }
}
