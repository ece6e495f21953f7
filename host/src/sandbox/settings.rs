//! `sink:`: one sink's plugin, egress rules and budgets, as the sandbox needs them. The
//! config module reads them from YAML; everything here only describes them.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// Default `sink.memory_limit`: linear memory one delivery may use.
pub const DEFAULT_MEMORY_LIMIT: u64 = 64 << 20;
/// Default `sink.max_response_bytes`: the largest HTTP response body handed to a sink.
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 1 << 20;
/// Default `sink.max_retry_after`: a sink's `retry-after-ms` above this is clamped to it.
pub const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// Default `sink.max_log_lines`: `log.log` calls kept per attempt.
pub const DEFAULT_MAX_LOG_LINES: u32 = 100;
/// Default `sink.max_log_bytes`: bytes of `log.log` messages kept per attempt.
pub const DEFAULT_MAX_LOG_BYTES: u64 = 64 << 10;
/// Default `sink.max_message_bytes`: the longest single log message or failure message.
pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 4 << 10;
/// Default `sink.max_skip_reason_bytes`: the longest `skipped` reason.
pub const DEFAULT_MAX_SKIP_REASON_BYTES: u64 = 512;
/// Default `sink.max_stdio_bytes`: captured stdout (and, apart, stderr) per attempt.
pub const DEFAULT_MAX_STDIO_BYTES: u64 = 16 << 10;
/// Default `sink.max_requests`: `http.send` calls per attempt.
pub const DEFAULT_MAX_REQUESTS: u32 = 16;
/// Default `sink.max_request_bytes`: the largest request body a sink may send.
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 1 << 20;

/// What the sandbox needs of one `sink:`: its plugin, egress rules and budgets. The rest of
/// a sink's settings (its delivery settings, `start_from`, `watch_plugin`) are the config's.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// A short name for logs and metrics.
    pub name: String,
    /// The `.wasm` component.
    pub plugin: PathBuf,
    /// Hosts the sink may reach through `http.send` (`host`, `host:port` or `*.domain`).
    pub allowed_hosts: Vec<String>,
    /// Linear memory one delivery may use.
    pub memory_limit: u64,
    /// The largest HTTP response body handed to the sink.
    pub max_response_bytes: u64,
    /// Where compiled components are cached (`None` disables the cache).
    pub cache_dir: Option<PathBuf>,
    /// Whether plain `http://` URLs may be used (only `https://` otherwise).
    pub allow_http: bool,
    /// A proxy for the sink's requests; the host's `HTTP(S)_PROXY` environment never applies.
    pub proxy: Option<String>,
    /// What one attempt may emit and send.
    pub budgets: SinkBudgets,
    /// The sink's own settings, read by it through `config.get`.
    pub config: SinkSettings,
}

impl PluginConfig {
    /// A sink with every default (no hosts allowed, plain http off): `try-sink` starts here.
    pub fn with_defaults(name: &str, plugin: PathBuf) -> PluginConfig {
        PluginConfig {
            name: name.into(),
            plugin,
            allowed_hosts: Vec::new(),
            memory_limit: DEFAULT_MEMORY_LIMIT,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            cache_dir: default_cache_dir(),
            allow_http: false,
            proxy: None,
            budgets: SinkBudgets::default(),
            config: SinkSettings::default(),
        }
    }
}

/// `$XDG_CACHE_HOME/outbox-host`, else `~/.cache/outbox-host`: the default `sink.cache_dir`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("outbox-host"))
}

/// Bounds on what one attempt of a sink may emit or ask for; the excess is clamped or dropped
/// (and counted), never trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkBudgets {
    /// A `retry-after-ms` above this is clamped to it.
    pub max_retry_after: Duration,
    /// `log.log` lines kept per attempt.
    pub max_log_lines: u32,
    /// Bytes of log messages kept per attempt.
    pub max_log_bytes: u64,
    /// The longest single log message or failure message.
    pub max_message_bytes: u64,
    /// The longest `skipped` reason.
    pub max_skip_reason_bytes: u64,
    /// Captured bytes of stdout, and apart of stderr, per attempt.
    pub max_stdio_bytes: u64,
    /// `http.send` calls per attempt.
    pub max_requests: u32,
    /// The largest request body.
    pub max_request_bytes: u64,
}

impl Default for SinkBudgets {
    fn default() -> Self {
        SinkBudgets {
            max_retry_after: DEFAULT_MAX_RETRY_AFTER,
            max_log_lines: DEFAULT_MAX_LOG_LINES,
            max_log_bytes: DEFAULT_MAX_LOG_BYTES,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_skip_reason_bytes: DEFAULT_MAX_SKIP_REASON_BYTES,
            max_stdio_bytes: DEFAULT_MAX_STDIO_BYTES,
            max_requests: DEFAULT_MAX_REQUESTS,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
        }
    }
}

/// The sink's `config:` map. Values may be secrets, so `Debug` shows only the keys.
#[derive(Clone, Default)]
pub struct SinkSettings(pub BTreeMap<String, String>);

impl fmt::Debug for SinkSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}
