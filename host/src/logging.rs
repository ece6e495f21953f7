//! Structured logs: human-readable lines by default, one JSON object per line on request.
//!
//! Logging never panics and never blocks delivery. Lines go through a bounded queue to a
//! writer thread; when the queue is full (stderr is slow or stuck) a line is dropped, and
//! when stderr is closed or broken (`outbox-host run | tee` with `tee` gone) the write fails
//! quietly. Both are counted in `room_outbox_log_lines_dropped_total`. Colour codes are
//! written only when stderr is a terminal.

use std::io::{IsTerminal as _, Write};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// `log:`.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// `text` (human-readable, the default) or `json`.
    pub format: LogFormat,
    /// A tracing filter such as `info` or `outbox_host=debug` (`RUST_LOG` wins when set).
    pub level: String,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line.
    Json,
}

/// Lines queued for the writer thread at most; past this, lines are dropped.
const QUEUE_LINES: usize = 16_384;

/// Writes that failed because stderr was closed or broken.
static FAILED_WRITES: AtomicU64 = AtomicU64::new(0);
/// Lines the full queue turned away.
static QUEUE_DROPS: OnceLock<ErrorCounter> = OnceLock::new();

/// Log lines lost so far: refused by a closed or broken stderr, or dropped from a full queue.
pub fn dropped_lines() -> u64 {
    FAILED_WRITES.load(Ordering::Relaxed) + QUEUE_DROPS.get().map_or(0, |c| c.dropped_lines() as u64)
}

/// Standard error that scrubs the config's credentials from every line (`redact::scrub`)
/// and swallows its own failures: a log line that cannot be written is
/// counted and forgotten, never an error (which the subscriber would report by writing to
/// the same broken stderr, and panic).
struct ForgivingStderr;

impl Write for ForgivingStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // One formatted line per write: the config's credentials never reach it (a line
        // with none is written as it is, without a copy).
        let text = String::from_utf8_lossy(buf);
        let line = crate::redact::scrub(&text);
        if std::io::stderr().write_all(line.as_bytes()).is_err() {
            FAILED_WRITES.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Installs the global subscriber. `RUST_LOG`, when set, wins over `log.level`. Keep the
/// returned guard until the process ends: dropping it flushes the queued lines.
pub fn init(config: &LogConfig) -> Option<WorkerGuard> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&config.level));
    let (writer, guard) =
        NonBlockingBuilder::default().lossy(true).buffered_lines_limit(QUEUE_LINES).finish(ForgivingStderr);
    let _ = QUEUE_DROPS.set(writer.error_counter());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).log_internal_errors(false);
    let result = match config.format {
        LogFormat::Text => builder.with_target(false).with_ansi(std::io::stderr().is_terminal()).try_init(),
        LogFormat::Json => builder.fmt_fields(JsonFields::new()).event_format(FlatJson).try_init(),
    };
    // Already installed (a test that starts several hosts): keep the first.
    result.ok().map(|()| guard)
}

/// Writes `text` to stdout for the operator, the config's credentials scrubbed, ignoring a closed stdout (`outbox-host status |
/// head`) instead of panicking.
pub fn say(text: &str) {
    let text = crate::redact::scrub(text);
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// Writes `text` to stderr, the config's credentials scrubbed, ignoring a closed stderr.
pub fn complain(text: &str) {
    let text = crate::redact::scrub(text);
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// One JSON object per line with the fields of the event's spans (outermost first) and of
/// the event itself side by side at the top level, so that a line of a delivery, the sink's
/// own lines included, carries `event_id` and the other fields of its `deliver` span.
struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut line = Map::new();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        line.insert("timestamp".into(), Value::String(timestamp));
        line.insert("level".into(), Value::String(event.metadata().level().to_string()));
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                let Some(fields) = extensions.get::<FormattedFields<N>>() else { continue };
                if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(fields) {
                    line.extend(fields);
                }
            }
        }
        event.record(&mut JsonVisitor(&mut line));
        line.insert("target".into(), Value::String(event.metadata().target().to_string()));
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// Collects an event's fields as JSON values.
struct JsonVisitor<'a>(&'a mut Map<String, Value>);

impl Visit for JsonVisitor<'_> {
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}").into());
    }
}
