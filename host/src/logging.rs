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

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

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

/// Standard error that swallows its own failures: a log line that cannot be written is
/// counted and forgotten, never an error (which the subscriber would report by writing to
/// the same broken stderr, and panic).
struct ForgivingStderr;

impl Write for ForgivingStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if std::io::stderr().write_all(buf).is_err() {
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
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).with_span_list(false).try_init(),
    };
    // Already installed (a test that starts several hosts): keep the first.
    result.ok().map(|()| guard)
}

/// Writes `text` to stdout for the operator, ignoring a closed stdout (`outbox-host status |
/// head`) instead of panicking.
pub fn say(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// Writes `text` to stderr, ignoring a closed stderr.
pub fn complain(text: &str) {
    let _ = std::io::stderr().write_all(text.as_bytes());
}
