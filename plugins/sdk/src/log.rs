//! Lines in the host's log. The host tags them with the sink and the event, escapes them
//! onto one line and keeps at most `sink.max_log_lines` per attempt.

/// How much a line matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Very detailed.
    Trace,
    /// For debugging.
    Debug,
    /// Normal.
    Info,
    /// Something looks wrong.
    Warn,
    /// Something failed.
    Error,
}

/// Logs `message` at `level`.
pub fn log(level: Level, message: &str) {
    crate::host::log(level.into(), message);
}

impl From<Level> for crate::host::Level {
    fn from(level: Level) -> Self {
        use crate::host::Level as L;
        match level {
            Level::Trace => L::Trace,
            Level::Debug => L::Debug,
            Level::Info => L::Info,
            Level::Warn => L::Warn,
            Level::Error => L::Error,
        }
    }
}

impl From<crate::host::Level> for Level {
    fn from(level: crate::host::Level) -> Self {
        use crate::host::Level as L;
        match level {
            L::Trace => Level::Trace,
            L::Debug => Level::Debug,
            L::Info => Level::Info,
            L::Warn => Level::Warn,
            L::Error => Level::Error,
        }
    }
}

/// Logs at debug level.
pub fn debug(message: &str) {
    log(Level::Debug, message);
}

/// Logs at info level.
pub fn info(message: &str) {
    log(Level::Info, message);
}

/// Logs at warn level.
pub fn warn(message: &str) {
    log(Level::Warn, message);
}

/// Logs at error level.
pub fn error(message: &str) {
    log(Level::Error, message);
}
