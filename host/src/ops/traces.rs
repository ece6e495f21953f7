//! OpenTelemetry traces: one span per attempt, a child of the trace its producer wrote with
//! the row, exported over OTLP (decision 0206).
//!
//! - **The row's context.** `trace_context` holds the producer's W3C `traceparent` and, after
//!   a `;`, its `tracestate`. [`Creation::read`] checks it as the W3C propagator does; text it
//!   cannot read (or longer than [`MAX_CONTEXT_CHARS`]) is as if there were none: the attempt
//!   starts a trace of its own, and delivery goes on.
//! - **The attempt's span.** [`start_attempt`] opens `deliver {sink}` (a relay's: `publish
//!   {broker}`), kind PRODUCER, with the messaging attributes; [`AttemptSpan::end`] adds the
//!   outcome. While the sink runs, the attempt is this task's [`current`] one: the host's
//!   HTTP import adds its `traceparent` to each request and opens a child span per request,
//!   and a relay's records carry the creation context ([`AttemptTrace::creation_headers`]).
//! - **Export.** Spans go into a bounded queue ([`TracingConfig::queue_size`]); a full queue
//!   drops the span and counts it, so delivery never waits on the exporter. One task encodes
//!   and sends batches over OTLP (HTTP/protobuf or gRPC; [`super::otlp`]). Nothing here runs
//!   while tracing is off: no tracer, no span, no header.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanData, SpanProcessor};

pub use super::otlp::Protocol;
use super::otlp::{self, Exporter, Target};

/// The longest `trace_context` read: a `traceparent` (55 characters), `;` and a `tracestate`
/// of the 512 characters W3C asks every vendor to pass on, with room to spare.
pub const MAX_CONTEXT_CHARS: usize = 1024;

/// `tracing:`: whether and where spans are exported. The exporter's endpoint, headers and
/// timeout, and the sampler, also follow the standard `OTEL_*` variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracingConfig {
    /// Export spans (default false).
    pub enabled: bool,
    /// The collector: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// else the protocol's default (`http://localhost:4318`, `http://localhost:4317`).
    pub endpoint: Option<String>,
    /// `http/protobuf` (default) or `grpc`, else `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` /
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub protocol: Option<Protocol>,
    /// Spans waiting for export at most; past it, spans are dropped and counted.
    pub queue_size: usize,
    /// Spans per export request at most.
    pub batch_size: usize,
    /// The longest wait before a batch that is not full goes out.
    pub export_every: Duration,
    /// The longest one export request may take (else `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` /
    /// `OTEL_EXPORTER_OTLP_TIMEOUT`, in ms, else 10 s).
    pub export_timeout: Option<Duration>,
    /// `service.name` (else `OTEL_SERVICE_NAME`, else `outbox-host`).
    pub service_name: Option<String>,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            enabled: false,
            endpoint: None,
            protocol: None,
            queue_size: 2048,
            batch_size: 512,
            export_every: Duration::from_secs(1),
            export_timeout: None,
            service_name: None,
        }
    }
}

/// The process's tracer while tracing is on ([`start`] to [`Exporting::shutdown`]).
static TRACER: RwLock<Option<SdkTracer>> = RwLock::new(None);
/// Whether [`TRACER`] is set: what an attempt looks at first, so that tracing off costs it
/// one load.
static ON: AtomicBool = AtomicBool::new(false);

fn tracer() -> Option<SdkTracer> {
    if !ON.load(Ordering::Acquire) {
        return None;
    }
    TRACER.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// What happened to spans since start: exported, dropped on a full queue, lost with a
/// failed export. `/metrics` shows them as `room_outbox_trace_spans_total`.
static EXPORTED: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);

/// The span counts, by result (`exported`, `dropped`, `failed`).
pub fn span_counts() -> [(&'static str, u64); 3] {
    [
        ("exported", EXPORTED.load(Ordering::Relaxed)),
        ("dropped", DROPPED.load(Ordering::Relaxed)),
        ("failed", FAILED.load(Ordering::Relaxed)),
    ]
}

/// Whether spans are made (tracing is on in this process).
pub fn enabled() -> bool {
    ON.load(Ordering::Acquire)
}

/// The running export: [`Exporting::shutdown`] sends what is queued, within a bound.
pub struct Exporting {
    provider: SdkTracerProvider,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
    export_timeout: Duration,
}

impl Exporting {
    /// Stops making spans and sends those still queued, waiting at most the export timeout.
    pub async fn shutdown(self) {
        ON.store(false, Ordering::Release);
        TRACER.write().unwrap_or_else(|p| p.into_inner()).take();
        self.stop.cancel();
        if tokio::time::timeout(self.export_timeout, self.task).await.is_err() {
            tracing::warn!("the last spans were not exported within tracing.export_timeout; they are dropped");
        }
        let _ = self.provider.shutdown();
    }
}

/// Starts tracing as `config` says, if it is enabled: the exporter, the queue and the task
/// that sends batches, from within the runtime; one at a time per process (the benchmark
/// starts and stops it between drains). `Err`: the exporter cannot be
/// built from this config (a bad endpoint), for the operator to fix.
pub fn start(config: &TracingConfig) -> anyhow::Result<Option<Exporting>> {
    if !config.enabled || std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    if enabled() {
        anyhow::bail!("tracing was started twice in one process");
    }
    let target = Target::resolve(config.protocol, config.endpoint.as_deref(), config.export_timeout, |name| {
        std::env::var(name).ok()
    })
    .map_err(|why| anyhow::anyhow!("tracing: {why}"))?;
    let exporter =
        Exporter::new(&target).map_err(|e| anyhow::anyhow!("tracing: cannot set up the OTLP exporter: {e}"))?;
    let service = config
        .service_name
        .clone()
        .or_else(|| std::env::var("OTEL_SERVICE_NAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "outbox-host".to_string());
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(service).build();
    let queue = Arc::new(Queue {
        spans: std::sync::Mutex::new(Vec::new()),
        full: tokio::sync::Notify::new(),
        capacity: config.queue_size.max(1),
        batch: config.batch_size.max(1),
    });
    let stop = tokio_util::sync::CancellationToken::new();
    let batches =
        Batches { exporter, resource: resource.clone(), every: config.export_every, size: config.batch_size.max(1) };
    let task = tokio::spawn(batches.run(queue.clone(), stop.clone()));
    let provider = SdkTracerProvider::builder().with_resource(resource).with_span_processor(Enqueue(queue)).build();
    *TRACER.write().unwrap_or_else(|p| p.into_inner()) = Some(provider.tracer("outbox-host"));
    ON.store(true, Ordering::Release);
    tracing::info!(
        protocol = ?target.protocol,
        endpoint = %crate::redact::url(&target.url),
        headers = target.headers.len(),
        queue_size = config.queue_size,
        "exporting traces over OTLP"
    );
    Ok(Some(Exporting { provider, stop, task, export_timeout: target.timeout }))
}

/// The spans waiting for export: at most `capacity`. The export task is woken only when a
/// batch's worth is waiting (else it looks every `export_every`): an ended span costs a
/// push under a lock, never a task's wake-up.
#[derive(Debug)]
struct Queue {
    spans: std::sync::Mutex<Vec<SpanData>>,
    full: tokio::sync::Notify,
    capacity: usize,
    batch: usize,
}

impl Queue {
    /// Everything waiting, taken out.
    fn take(&self) -> Vec<SpanData> {
        std::mem::take(&mut *self.spans.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The span processor: each ended, sampled span into the bounded queue, or dropped.
#[derive(Debug)]
struct Enqueue(Arc<Queue>);

impl SpanProcessor for Enqueue {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let queue = &self.0;
        let waiting = {
            let mut spans = queue.spans.lock().unwrap_or_else(|p| p.into_inner());
            if spans.len() >= queue.capacity {
                DROPPED.fetch_add(1, Ordering::Relaxed);
                return;
            }
            spans.push(span);
            spans.len()
        };
        if waiting == queue.batch {
            queue.full.notify_one();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The export task's part: the exporter, and what each batch is sent with.
struct Batches {
    exporter: Exporter,
    resource: opentelemetry_sdk::Resource,
    every: Duration,
    size: usize,
}

impl Batches {
    /// Sends the queue's spans in batches of at most `size`, whenever a batch's worth is
    /// waiting and at least `every`; on `stop`, what is queued, then returns.
    async fn run(mut self, queue: Arc<Queue>, stop: tokio_util::sync::CancellationToken) {
        let mut said_failed = false;
        // The last request's size: the next one's first guess.
        let mut last = 0;
        loop {
            let stopping = tokio::select! {
                () = queue.full.notified() => false,
                () = tokio::time::sleep(self.every) => false,
                () = stop.cancelled() => true,
            };
            let batch = queue.take();
            for chunk in batch.chunks(self.size) {
                let count = chunk.len() as u64;
                let mut request = Vec::with_capacity(last);
                otlp::encode(chunk, &self.resource, &mut request);
                last = request.len();
                let request = bytes::Bytes::from(request);
                match self.exporter.export(request, count).await {
                    Ok(rejected) => {
                        EXPORTED.fetch_add(count - rejected, Ordering::Relaxed);
                        FAILED.fetch_add(rejected, Ordering::Relaxed);
                        said_failed = false;
                    }
                    Err(why) => {
                        FAILED.fetch_add(count, Ordering::Relaxed);
                        if !said_failed {
                            // Said once per run of failures; every lost span is counted.
                            tracing::warn!(error = %why, "could not export spans; they are dropped (counted in room_outbox_trace_spans_total)");
                            said_failed = true;
                        }
                    }
                }
            }
            if stopping {
                return;
            }
        }
    }
}

/// The producer's context of one row, as checked.
#[derive(Debug, Clone)]
pub struct Creation {
    cx: Context,
    traceparent: String,
    tracestate: Option<String>,
}

impl Creation {
    /// The row's `trace_context`, if it holds a valid W3C `traceparent` (and optionally a
    /// `tracestate` after `;`). The header values come out as the W3C format writes them
    /// (so a valid context passes on unchanged).
    pub fn read(column: Option<&str>) -> Option<Creation> {
        let text = column?.trim();
        if text.is_empty() || text.len() > MAX_CONTEXT_CHARS {
            return None;
        }
        let (traceparent, tracestate) = match text.split_once(';') {
            Some((parent, state)) => (parent.trim(), Some(state.trim())),
            None => (text, None),
        };
        match canonical(traceparent) {
            Some((trace_id, span_id, flags)) => {
                // What nearly every producer writes, read without the propagator's
                // allocations; the same context as it reads (a test holds the two alike).
                let state = tracestate.map_or_else(TraceState::default, |s| s.parse().unwrap_or_default());
                let sc = SpanContext::new(trace_id, span_id, flags, true, state);
                Some(Creation::of(sc, Some(traceparent)))
            }
            None => Creation::read_with_propagator(traceparent, tracestate),
        }
    }

    /// As the SDK's W3C propagator reads the two headers.
    fn read_with_propagator(traceparent: &str, tracestate: Option<&str>) -> Option<Creation> {
        let mut carrier = HashMap::with_capacity(2);
        carrier.insert("traceparent".to_string(), traceparent.to_string());
        if let Some(state) = tracestate {
            carrier.insert("tracestate".to_string(), state.to_string());
        }
        let cx = TraceContextPropagator::new().extract(&carrier);
        let sc = cx.span().span_context().clone();
        sc.is_valid().then(|| Creation::of(sc, None))
    }

    /// The creation `sc`; `written`: its `traceparent` when the text read is already as
    /// the W3C format writes it.
    fn of(sc: SpanContext, written: Option<&str>) -> Creation {
        let state = sc.trace_state().header();
        Creation {
            traceparent: written.map_or_else(|| format_traceparent(&sc), str::to_string),
            tracestate: (!state.is_empty()).then_some(state),
            cx: Context::new().with_remote_span_context(sc),
        }
    }
}

/// A `traceparent` exactly as the W3C format writes a version-00 one (lowercase hex ids, not
/// all zeros; flags `00` or `01`), read; else `None`, for the propagator to judge.
fn canonical(traceparent: &str) -> Option<(TraceId, SpanId, TraceFlags)> {
    let b = traceparent.as_bytes();
    let lower_hex = |part: &[u8]| part.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let shaped = b.len() == 55 && b.starts_with(b"00-") && b[35] == b'-' && b[52] == b'-';
    if !shaped || !lower_hex(&b[3..35]) || !lower_hex(&b[36..52]) {
        return None;
    }
    let flags = match &b[53..] {
        b"00" => TraceFlags::NOT_SAMPLED,
        b"01" => TraceFlags::SAMPLED,
        _ => return None,
    };
    let trace_id = TraceId::from_hex(&traceparent[3..35]).ok()?;
    let span_id = SpanId::from_hex(&traceparent[36..52]).ok()?;
    (trace_id != TraceId::INVALID && span_id != SpanId::INVALID).then_some((trace_id, span_id, flags))
}

fn format_traceparent(sc: &opentelemetry::trace::SpanContext) -> String {
    format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8())
}

/// Who an attempt is for: a sink's `deliver {sink}`, or a relay's `publish {broker}`.
#[derive(Debug, Clone, Copy)]
pub struct Messaging<'a> {
    /// `deliver` (a sink) or `publish` (a relay).
    pub operation: &'static str,
    /// `messaging.system`: `outbox-host` for a sink, the broker's kind for a relay.
    pub system: &'static str,
    /// `messaging.destination.name`: the sink's name, or the broker's.
    pub destination: &'a str,
}

/// One row's attempt, as its span needs it.
pub struct AttemptInfo<'a> {
    /// The row's `trace_context`.
    pub trace_context: Option<&'a str>,
    /// Its event id.
    pub event_id: &'a str,
    /// Its event type.
    pub event_type: &'a str,
    /// Its room.
    pub room_id: &'a str,
    /// This attempt's number (1 for the first).
    pub attempt: u32,
    /// How long the event waited before this attempt, in ms (since it was created).
    pub waited_ms: i64,
}

/// The context of the attempt running in this task: its span's, and the row's creation.
pub struct AttemptTrace {
    cx: Context,
    /// Written when first asked for (most attempts make no request).
    traceparent: std::sync::OnceLock<String>,
    creation: Option<Creation>,
}

impl AttemptTrace {
    /// `traceparent` naming the attempt's span, for a request the attempt makes.
    pub fn traceparent(&self) -> &str {
        self.traceparent.get_or_init(|| format_traceparent(self.cx.span().span_context()))
    }

    /// The creation context's headers (`traceparent`, and `tracestate` when there is one),
    /// for a relay's records: the messaging conventions pass a message's creation context
    /// on unchanged. None for a row without a context.
    pub fn creation_headers(&self) -> Vec<(String, String)> {
        let Some(creation) = &self.creation else { return Vec::new() };
        let mut headers = vec![("traceparent".to_string(), creation.traceparent.clone())];
        if let Some(state) = &creation.tracestate {
            headers.push(("tracestate".to_string(), state.clone()));
        }
        headers
    }

    /// Opens a child span of the attempt for one HTTP request (kind CLIENT, named by its
    /// method), for [`HttpSpan::end`] to close with the response.
    pub fn http_span(&self, method: &str, host: &str, port: Option<u16>) -> Option<HttpSpan> {
        let tracer = tracer()?;
        let method = crate::text::printable(method, 16);
        let mut attributes = vec![
            KeyValue::new("http.request.method", method.clone()),
            KeyValue::new("server.address", crate::text::printable(host, 255)),
        ];
        if let Some(port) = port {
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        let builder = tracer.span_builder(method).with_kind(SpanKind::Client).with_attributes(attributes);
        Some(HttpSpan { span: tracer.build_with_context(builder, &self.cx) })
    }

    /// `trace_id` and `span_id` of the attempt's span, for its log lines (hex once shown).
    pub fn ids(&self) -> (opentelemetry::trace::TraceId, opentelemetry::trace::SpanId) {
        let span = self.cx.span();
        let sc = span.span_context();
        (sc.trace_id(), sc.span_id())
    }
}

/// One HTTP request's span.
pub struct HttpSpan {
    span: opentelemetry_sdk::trace::Span,
}

impl HttpSpan {
    /// Closes the span with the response's status, or the error that stood for it.
    pub fn end(mut self, status: Result<u16, &str>) {
        match status {
            Ok(code) => {
                self.span.set_attribute(KeyValue::new("http.response.status_code", i64::from(code)));
                if code >= 400 {
                    self.span.set_attribute(KeyValue::new("error.type", code.to_string()));
                    self.span.set_status(Status::error(""));
                }
            }
            Err(kind) => {
                self.span.set_attribute(KeyValue::new("error.type", kind.to_string()));
                self.span.set_status(Status::error(""));
            }
        }
        self.span.end();
    }
}

tokio::task_local! {
    static ATTEMPT: Arc<AttemptTrace>;
}

/// The attempt running in this task, if tracing is on.
pub fn current() -> Option<Arc<AttemptTrace>> {
    ATTEMPT.try_with(Arc::clone).ok()
}

/// An attempt's open span ([`start_attempt`]).
pub struct AttemptSpan {
    trace: Arc<AttemptTrace>,
}

/// Opens the span of one attempt, a child of the row's creation context (a new trace where
/// it has none, or none that reads), if tracing is on.
pub fn start_attempt(messaging: Messaging<'_>, info: &AttemptInfo<'_>) -> Option<AttemptSpan> {
    let tracer = tracer()?;
    let creation = Creation::read(info.trace_context);
    let parent = creation.as_ref().map_or_else(Context::new, |c| c.cx.clone());
    let builder = tracer
        .span_builder(format!("{} {}", messaging.operation, messaging.destination))
        .with_kind(SpanKind::Producer)
        .with_attributes([
            KeyValue::new("messaging.system", messaging.system),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.operation.name", messaging.operation),
            KeyValue::new("messaging.destination.name", messaging.destination.to_string()),
            KeyValue::new("messaging.message.id", info.event_id.to_string()),
            KeyValue::new("outbox.event_type", info.event_type.to_string()),
            KeyValue::new("outbox.room_id", info.room_id.to_string()),
            KeyValue::new("outbox.attempt", i64::from(info.attempt)),
            KeyValue::new("outbox.waited_ms", info.waited_ms.max(0)),
        ]);
    let span = tracer.build_with_context(builder, &parent);
    let cx = parent.with_span(span);
    Some(AttemptSpan { trace: Arc::new(AttemptTrace { cx, traceparent: std::sync::OnceLock::new(), creation }) })
}

impl AttemptSpan {
    /// Runs `attempt` as this task's current attempt ([`current`]).
    pub async fn scope<F: std::future::Future>(&self, attempt: F) -> F::Output {
        ATTEMPT.scope(self.trace.clone(), attempt).await
    }

    /// The attempt's trace.
    pub fn trace(&self) -> &AttemptTrace {
        &self.trace
    }

    /// Closes the span with the attempt's outcome (`delivered`, `skipped`, `retryable`,
    /// `failed`, `deferred`) and, on a failure, its kind as `error.type`.
    pub fn end(self, outcome: &str, error_type: Option<&str>) {
        let span = self.trace.cx.span();
        span.set_attribute(KeyValue::new("outbox.outcome", outcome.to_string()));
        if let Some(kind) = error_type {
            span.set_attribute(KeyValue::new("error.type", kind.to_string()));
            span.set_status(Status::error(""));
        }
        span.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_context_reads_and_passes_on_unchanged() {
        let creation = Creation::read(Some(PARENT)).expect("valid");
        assert_eq!(creation.cx.span().span_context().trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(creation.traceparent, PARENT);
        assert_eq!(creation.tracestate, None);
        let with_state = format!("{PARENT};congo=t61rcWkgMzE,rojo=00f067aa0ba902b7");
        let creation = Creation::read(Some(&with_state)).expect("valid with a state");
        assert_eq!(creation.traceparent, PARENT);
        assert_eq!(creation.tracestate.as_deref(), Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"));
    }

    #[test]
    fn what_does_not_read_is_no_context() {
        let long = format!("{PARENT};{}", "k=v,".repeat(300));
        for bad in [
            "",
            "   ",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            ";congo=t61rcWkgMzE",
            long.as_str(),
        ] {
            assert!(Creation::read(Some(bad)).is_none(), "{bad:?} read as a context");
        }
        assert!(Creation::read(None).is_none());
    }

    /// Arbitrary text never panics and never reads as a context unless it is one: a
    /// seeded generator of mutations of a valid `traceparent` and of random bytes.
    #[test]
    fn fuzzed_contexts_never_panic() {
        let mut next = crate::text::xorshift(0x9e37_79b9_7f4a_7c15_u64);
        let alphabet: Vec<char> = "0123456789abcdefABCDEF-;=, \t\u{0}\u{7f}é\n".chars().collect();
        for _ in 0..20_000 {
            let mut text: Vec<char> = PARENT.chars().collect();
            for _ in 0..(next() % 4) {
                let at = (next() % (text.len() as u64 + 1)) as usize;
                let c = alphabet[(next() % alphabet.len() as u64) as usize];
                match next() % 3 {
                    0 if at < text.len() => text[at] = c,
                    1 if at < text.len() => {
                        text.remove(at);
                    }
                    _ => text.insert(at, c),
                }
            }
            let text: String = text.into_iter().collect();
            if let Some(creation) = Creation::read(Some(&text)) {
                // What reads is a well-formed version-00 header.
                let parts: Vec<&str> = creation.traceparent.split('-').collect();
                assert_eq!(parts.len(), 4, "{text:?}");
                assert_eq!((parts[0], parts[1].len(), parts[2].len(), parts[3].len()), ("00", 32, 16, 2), "{text:?}");
                assert!(creation.traceparent.chars().all(|c| c.is_ascii_hexdigit() || c == '-'));
            }
        }
    }

    /// The fast read of a well-written `traceparent` gives what the SDK's propagator gives,
    /// for the same seeded mutations (and `tracestate`s, valid or not) as above.
    #[test]
    fn the_fast_read_agrees_with_the_propagator() {
        let mut next = crate::text::xorshift(0x2545_f491_4f6c_dd1d_u64);
        let alphabet: Vec<char> = "0123456789abcdefABCDEF-".chars().collect();
        let states = [None, Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"), Some("not a state"), Some("")];
        let mut fast = 0;
        for i in 0..20_000 {
            let mut text: Vec<char> = PARENT.chars().collect();
            for _ in 0..(next() % 3) {
                let at = (next() % text.len() as u64) as usize;
                text[at] = alphabet[(next() % alphabet.len() as u64) as usize];
            }
            let parent: String = text.into_iter().collect();
            let tracestate = states[i % states.len()];
            if canonical(&parent).is_none() {
                continue;
            }
            fast += 1;
            let column = match tracestate {
                Some(state) => format!("{parent};{state}"),
                None => parent.clone(),
            };
            let read = Creation::read(Some(&column)).expect("a canonical traceparent reads");
            let by_propagator =
                Creation::read_with_propagator(&parent, tracestate).expect("and the propagator reads it");
            let span = |c: &Creation| c.cx.span().span_context().clone();
            assert_eq!(span(&read), span(&by_propagator), "{column:?}");
            assert_eq!(read.traceparent, by_propagator.traceparent, "{column:?}");
            assert_eq!(read.tracestate, by_propagator.tracestate, "{column:?}");
            assert!(span(&read).is_remote());
        }
        // Most single-character mutations keep the form: the comparison ran often.
        assert!(fast > 5_000, "only {fast} canonical mutations");
        // And what the fast read declines is still read by the propagator where it can be.
        let upper_flags = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-02";
        assert!(canonical(upper_flags).is_none());
        assert_eq!(Creation::read(Some(upper_flags)).expect("flags 02").traceparent, format!("{}-00", &PARENT[..52]));
    }

    #[test]
    fn protocols_by_their_otel_names() {
        assert_eq!(Protocol::parse("grpc"), Ok(Protocol::Grpc));
        assert_eq!(Protocol::parse("http/protobuf"), Ok(Protocol::HttpProtobuf));
        assert!(Protocol::parse("http/json").unwrap_err().contains("http/json"));
    }
}
