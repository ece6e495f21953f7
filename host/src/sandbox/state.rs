//! The per-delivery store data and the host's imports (`config`, `http`, `log`), with the
//! attempt's budgets: what a sink logs and asks for is counted, clipped and dropped here.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tokio::time::Instant;
use wasmtime::StoreLimits;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::{self, HttpError, HttpRequest, HttpResponse, Level, WitPressure};
use super::capture::Capture;
use super::http::HttpPolicy;
use super::settings::SinkBudgets;
use crate::ops::metrics::Metrics;
use crate::text::{printable, printable_within};

/// What every delivery of one sink shares.
pub struct Shared {
    pub name: String,
    pub settings: std::collections::BTreeMap<String, String>,
    pub http: HttpPolicy,
    pub budgets: SinkBudgets,
    pub metrics: Arc<Metrics>,
    /// Set once a clamped `retry-after-ms` has been logged: said once, counted always.
    pub retry_after_clamp_said: AtomicBool,
    /// Set for `try-sink`: records requests and log lines, and answers in a dry run.
    pub trial: Option<Arc<super::trial::Trial>>,
}

/// What one attempt has used of its budgets.
#[derive(Default)]
struct Spent {
    log_lines: u32,
    log_bytes: u64,
    dropped_lines: u32,
    requests: u32,
}

/// The per-delivery store data: a locked-down WASI context plus the host's imports.
pub struct DeliveryState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub limits: StoreLimits,
    pub(super) shared: Arc<Shared>,
    deadline: Instant,
    spent: Spent,
    /// The last `flow.push-back` of this attempt.
    pressure: Option<WitPressure>,
    /// The first request of this attempt that the sink's egress policy refused, and why.
    denied_by_policy: Option<String>,
    /// Whether this call is `check-config` (where `egress.declare` counts).
    checking_config: bool,
    /// The destinations declared while checking the config: (key, url), bounded.
    declared: Vec<(String, String)>,
}

/// Destinations one config check may declare; later ones are ignored.
const MAX_DECLARED: usize = 64;

impl DeliveryState {
    pub fn new(wasi: WasiCtx, limits: StoreLimits, shared: Arc<Shared>, deadline: Instant) -> Self {
        DeliveryState {
            wasi,
            table: ResourceTable::new(),
            limits,
            shared,
            deadline,
            spent: Spent::default(),
            pressure: None,
            denied_by_policy: None,
            checking_config: false,
            declared: Vec::new(),
        }
    }

    /// When the call running now must be over.
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Readies a reused store for its next call, over by `deadline`: fresh budgets and
    /// nothing left of the previous call's state.
    pub(super) fn rearm(&mut self, deadline: Instant) {
        self.deadline = deadline;
        self.spent = Spent::default();
        self.pressure = None;
        self.denied_by_policy = None;
    }

    /// One line into the host's log, within the attempt's line and byte budgets: escaped
    /// onto one line, clipped to `max_message_bytes`, dropped (and counted) past the budget.
    pub(super) fn emit(&mut self, level: tracing::Level, stream: Option<&'static str>, message: &str) {
        let budgets = &self.shared.budgets;
        if self.spent.log_lines >= budgets.max_log_lines || self.spent.log_bytes >= budgets.max_log_bytes {
            self.spent.dropped_lines += 1;
            return;
        }
        let (text, clipped) = printable_within(message, budgets.max_message_bytes as usize);
        if clipped {
            self.shared.metrics.sink_limit("message");
        }
        self.spent.log_lines += 1;
        self.spent.log_bytes += text.len() as u64;
        let sink = self.shared.name.as_str();
        let stream = stream.unwrap_or("log");
        if let Some(trial) = &self.shared.trial {
            trial.log(level, stream, &text);
            return;
        }
        match level {
            tracing::Level::TRACE => tracing::trace!(sink, stream, "{text}"),
            tracing::Level::DEBUG => tracing::debug!(sink, stream, "{text}"),
            tracing::Level::INFO => tracing::info!(sink, stream, "{text}"),
            tracing::Level::WARN => tracing::warn!(sink, stream, "{text}"),
            tracing::Level::ERROR => tracing::error!(sink, stream, "{text}"),
        }
    }

    /// In a trial, a line of the host's own about the attempt (the log line says it too).
    fn note(&self, text: String) {
        if let Some(trial) = &self.shared.trial {
            trial.log(tracing::Level::WARN, "host", &text);
        }
    }

    /// Marks this call as the config check: destinations it declares are kept.
    pub fn checking_config(&mut self) {
        self.checking_config = true;
    }

    /// The destinations the sink declared while its config was checked: (key, url).
    pub fn declared(&self) -> &[(String, String)] {
        &self.declared
    }

    /// Why the sink's egress policy (`allowed_hosts`, `allow_http`) refused a request of
    /// this attempt, if it did: a config mistake, not the destination's doing.
    pub fn denied_by_policy(&self) -> Option<&str> {
        self.denied_by_policy.as_deref()
    }

    /// What the sink's last `flow.push-back` said, if it called it.
    pub fn pressure(&self) -> Option<super::Pressure> {
        self.pressure.map(|p| match p {
            WitPressure::RoomThrottled => super::Pressure::RoomThrottled,
            WitPressure::Throttled => super::Pressure::Throttled,
            WitPressure::Unavailable => super::Pressure::Unavailable,
        })
    }

    /// Logs what the guest wrote to stdout and stderr (within the same budgets), then says
    /// what was dropped. Called once the attempt is over.
    pub fn finish(&mut self, stdout: &Capture, stderr: &Capture) {
        for (stream, capture) in [("stdout", stdout), ("stderr", stderr)] {
            let (kept, dropped) = capture.contents();
            for line in String::from_utf8_lossy(&kept).lines().filter(|l| !l.trim().is_empty()) {
                self.emit(tracing::Level::INFO, Some(stream), line);
            }
            if dropped > 0 {
                self.note(format!("{stream}: {dropped} bytes past sink.max_stdio_bytes were dropped"));
                self.shared.metrics.sink_limit("stdio");
                tracing::warn!(sink = %self.shared.name, stream, dropped_bytes = dropped, "sink wrote past sink.max_stdio_bytes; the rest was dropped");
            }
        }
        if self.spent.dropped_lines > 0 {
            self.note(format!(
                "{} further lines were dropped (sink.max_log_lines / sink.max_log_bytes)",
                self.spent.dropped_lines
            ));
            self.shared.metrics.sink_limit("log");
            tracing::warn!(
                sink = %self.shared.name,
                dropped_lines = self.spent.dropped_lines,
                "sink log budget exceeded (sink.max_log_lines / sink.max_log_bytes): further lines of this attempt were dropped"
            );
        }
    }
}

impl WasiView for DeliveryState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl bindings::outbox::sink::types::Host for DeliveryState {}

impl bindings::outbox::sink::config::Host for DeliveryState {
    async fn get(&mut self, key: String) -> Option<String> {
        self.shared.settings.get(&key).cloned()
    }
}

impl bindings::outbox::sink::http::Host for DeliveryState {
    async fn send(&mut self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let budgets = &self.shared.budgets;
        self.spent.requests += 1;
        if self.spent.requests > budgets.max_requests {
            self.shared.metrics.sink_limit("requests");
            return Err(HttpError::Denied(format!(
                "more than {} requests in one attempt (sink.max_requests)",
                budgets.max_requests
            )));
        }
        if req.body.len() as u64 > budgets.max_request_bytes {
            self.shared.metrics.sink_limit("request_bytes");
        }
        let result = match self.shared.trial.clone() {
            None => self.shared.http.send(req, self.deadline).await,
            Some(trial) => {
                trial.request(&req);
                let result = match trial.scripted() {
                    Some(reply) => self.shared.http.check(&req).map(|()| reply),
                    None => self.shared.http.send(req, self.deadline).await,
                };
                trial.reply(&result);
                result
            }
        };
        if let Err(HttpError::Denied(why)) = &result
            && self.denied_by_policy.is_none()
        {
            self.denied_by_policy = Some(why.clone());
        }
        result
    }
}

impl bindings::outbox::sink::egress::Host for DeliveryState {
    async fn declare(&mut self, key: String, url: String) {
        if self.checking_config && self.declared.len() < MAX_DECLARED {
            self.declared.push((printable(&key, 256), url.chars().take(2_048).collect()));
        }
    }
}

impl bindings::outbox::sink::flow::Host for DeliveryState {
    async fn push_back(&mut self, pressure: WitPressure) {
        self.pressure = Some(pressure);
    }
}

impl bindings::outbox::sink::trace::Host for DeliveryState {
    /// The attempt's span, from the task the delivery runs on (see `ops/traces.rs`).
    async fn traceparent(&mut self) -> Option<String> {
        crate::ops::traces::current().map(|attempt| attempt.traceparent().to_string())
    }
}

impl bindings::outbox::sink::log::Host for DeliveryState {
    async fn log(&mut self, level: Level, message: String) {
        let level = match level {
            Level::Trace => tracing::Level::TRACE,
            Level::Debug => tracing::Level::DEBUG,
            Level::Info => tracing::Level::INFO,
            Level::Warn => tracing::Level::WARN,
            Level::Error => tracing::Level::ERROR,
        };
        self.emit(level, None, &message);
    }
}
