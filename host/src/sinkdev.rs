//! Tools for sink authors: `try-sink` (one delivery in the sandbox, no database) and
//! `new-sink` (a ready crate built on the `outbox-sink` SDK).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use crate::sandbox::relay::RelayRuntime;
use crate::sandbox::settings::PluginConfig;
use crate::sandbox::trial::{ScriptedReply, Step, Trial};
use crate::sandbox::{Delivered, Event, SinkRuntime};

/// What `try-sink` runs.
#[derive(Debug, Clone)]
pub struct TryOptions {
    /// The component.
    pub plugin: PathBuf,
    /// The sink's `config:` map.
    pub settings: Vec<(String, String)>,
    /// Its `allowed_hosts`.
    pub allowed_hosts: Vec<String>,
    /// `allow_http`.
    pub allow_http: bool,
    /// The event.
    pub event_type: String,
    /// The event's room.
    pub room: String,
    /// Its body, as JSON fields of the type's message.
    pub body: Option<String>,
    /// The attempt number the sink sees.
    pub attempt: u32,
    /// `publish_timeout`.
    pub timeout: Duration,
    /// Answer requests with this instead of sending them.
    pub dry_run: Option<ScriptedReply>,
}

/// What a trial delivery came to.
pub struct TryReport {
    /// What the sink did, in order.
    pub steps: Vec<Step>,
    /// A relay's records for the event (a relay publishes nothing here: it has no broker).
    pub records: Vec<crate::sandbox::relay::Record>,
    /// The values of the sink's config keys that name credentials (`--set secret_key=…`):
    /// shown as `***` wherever they appear.
    pub secrets: Vec<String>,
    /// The outcome, as the host classified and bounded it.
    pub outcome: Result<Delivered, crate::sandbox::AttemptFailure>,
}

impl TryReport {
    /// The report as `try-sink` prints it, every configured secret's value shown as `***`
    /// wherever it appears (a sink may log or send one by mistake).
    pub fn render(&self) -> String {
        let mut out = self.transcript();
        for secret in &self.secrets {
            out = out.replace(secret.as_str(), "***");
        }
        out
    }

    /// [`TryReport::render`] before the secrets are hidden.
    fn transcript(&self) -> String {
        let mut out = String::new();
        for step in &self.steps {
            match step {
                Step::Request { method, url, headers, body } => {
                    let _ = writeln!(out, "request  {method} {url}");
                    for (name, value) in headers {
                        let _ = writeln!(out, "         {name}: {value}");
                    }
                    if !body.is_empty() {
                        let _ = writeln!(out, "         body: {body}");
                    }
                }
                Step::Reply { status, headers, body, scripted } => {
                    let _ = writeln!(out, "reply    {status}{}", if *scripted { " (scripted: --dry-run)" } else { "" });
                    for (name, value) in headers {
                        let _ = writeln!(out, "         {name}: {value}");
                    }
                    if !body.is_empty() {
                        let _ = writeln!(out, "         body: {body}");
                    }
                }
                Step::Error(why) => {
                    let _ = writeln!(out, "reply    none: {why}");
                }
                Step::Log { level, stream, text } => {
                    let from = if *stream == "log" { String::new() } else { format!(" ({stream})") };
                    let _ = writeln!(out, "log      {}{from}: {text}", level.as_str().to_ascii_lowercase());
                }
            }
        }
        for (i, record) in self.records.iter().enumerate() {
            let key = record.key.as_deref().map(|k| format!(" (key {k})")).unwrap_or_default();
            let _ = writeln!(out, "record   {} of {}: {}{key}", i + 1, self.records.len(), record.destination);
            // The host bounded them and refused control characters; characters that reorder
            // or hide text are still the relay's, and are shown escaped.
            for (name, value) in &record.headers {
                let _ = writeln!(out, "         {name}: {}", crate::text::printable(value, SHOWN_HEADER_BYTES));
            }
            let _ =
                writeln!(out, "         payload ({} bytes): {}", record.payload.len(), shown_payload(&record.payload));
        }
        let _ = match &self.outcome {
            Ok(Delivered::Delivered) if !self.records.is_empty() => writeln!(
                out,
                "outcome  routed: {} record(s), which the host would publish to the relay's broker (try-sink publishes nothing)",
                self.records.len()
            ),
            Ok(Delivered::Delivered) => writeln!(out, "outcome  delivered"),
            Ok(Delivered::Skipped(why)) => writeln!(out, "outcome  skipped: {why}"),
            Err(failure) => {
                let mut notes = Vec::new();
                if let Some(after) = failure.retry_after {
                    notes.push(format!("retry after {}", crate::units::format_duration(after)));
                }
                if let Some(pressure) = failure.pressure {
                    notes.push(format!("pushes back: {}", pressure.as_str()));
                }
                let notes = if notes.is_empty() { String::new() } else { format!(" ({})", notes.join("; ")) };
                writeln!(out, "outcome  {}: {}{notes}", failure.class.as_str(), failure.message)
            }
        };
        out
    }

    /// Whether the event would be stored as delivered.
    pub fn delivered(&self) -> bool {
        self.outcome.is_ok()
    }
}

/// The most of a relay's header value the report shows.
const SHOWN_HEADER_BYTES: usize = 1 << 10;

/// A payload as the report shows it: printable UTF-8 up to 2 KiB (escaped), or the first
/// 64 bytes in hex.
fn shown_payload(payload: &[u8]) -> String {
    const SHOWN: usize = 2 << 10;
    match std::str::from_utf8(payload) {
        Ok(text) => crate::text::printable(text, SHOWN),
        Err(_) => {
            let hex: String = payload.iter().take(64).map(|b| format!("{b:02x}")).collect();
            format!("{hex}{}", if payload.len() > 64 { "…" } else { "" })
        }
    }
}

/// Loads the sink as `run` would, checks its config, and delivers one event. A relay (a
/// component of world `outbox:relay/relay`) routes the event instead, and the report shows
/// its records.
pub async fn try_sink(options: TryOptions) -> anyhow::Result<TryReport> {
    let body = crate::envelope::body_from_json_text(&options.event_type, options.body.as_deref())?;
    let mut config = PluginConfig::with_defaults("try", options.plugin.clone());
    for host in &options.allowed_hosts {
        crate::sandbox::HostPattern::parse(host).map_err(|why| anyhow::anyhow!("--allow-host {host}: {why}"))?;
    }
    config.allowed_hosts = options.allowed_hosts.clone();
    config.allow_http = options.allow_http;
    config.config.0 = options.settings.iter().cloned().collect();
    let now = crate::store::now_ms();
    let event = Event {
        app_code: "default".into(),
        event_id: format!("try-{now}"),
        event_type: options.event_type.clone(),
        room_id: options.room.clone(),
        room_version: 1,
        occurred_at_ms: now,
        body,
        attempt: options.attempt.max(1),
    };
    // Longest first, so that a secret containing another is hidden whole.
    let mut secrets: Vec<String> = options
        .settings
        .iter()
        .filter(|(key, value)| crate::redact::is_secret_name(key) && value.len() >= crate::redact::MIN_SECRET_CHARS)
        .map(|(_, value)| value.clone())
        .collect();
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let trial = Arc::new(Trial::new(options.dry_run.clone()));
    let runtime = match SinkRuntime::load_trial(&config, options.timeout, trial.clone()).await {
        Ok(runtime) => runtime,
        Err(not_a_sink) => {
            let metrics = Arc::new(crate::ops::metrics::Metrics::new("try"));
            let relay = match RelayRuntime::load_checked(&config, 1, options.timeout, metrics).await {
                Ok(relay) => relay,
                // A relay whose config has problems: those, not "not a sink".
                Err(e) if e.is::<crate::sandbox::SinkConfigProblems>() => return Err(e),
                Err(_) => return Err(not_a_sink),
            };
            let (records, outcome) = match relay.route(&event, options.timeout).await {
                Ok(records) if records.is_empty() => {
                    (records, Ok(Delivered::Skipped("not for this relay".to_string())))
                }
                Ok(records) => (records, Ok(Delivered::Delivered)),
                Err(failure) => (Vec::new(), Err(failure)),
            };
            return Ok(TryReport { steps: Vec::new(), records, secrets, outcome });
        }
    };
    let outcome = runtime.deliver(&event, options.timeout).await;
    Ok(TryReport { steps: trial.steps(), records: Vec::new(), secrets, outcome })
}

/// `new-sink`'s crate: the template in `plugins/template`, renamed.
const TEMPLATE: &[(&str, &str)] = &[
    ("Cargo.toml", include_str!("../../plugins/template/Cargo.toml")),
    ("README.md", include_str!("../../plugins/template/README.md")),
    ("src/lib.rs", include_str!("../../plugins/template/src/lib.rs")),
    (".gitignore", include_str!("../../plugins/template/.gitignore")),
];

/// The template's own name, replaced by the new sink's.
const TEMPLATE_NAME: &str = "my-sink";

/// Where the SDK is in the checkout this binary was built from.
pub fn default_sdk_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/sdk")
}

/// Writes a new sink crate named `name` into `dir` (which must not exist or be empty), its
/// `outbox-sink` dependency pointing at `sdk`. Returns the files written.
pub fn new_sink(name: &str, dir: &Path, sdk: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    anyhow::ensure!(
        valid,
        "sink name {name:?}: use 1-64 lowercase letters, digits, '-' or '_', starting with a letter"
    );
    if dir.exists() && dir.read_dir().map(|mut d| d.next().is_some()).unwrap_or(true) {
        anyhow::bail!("{} already exists and is not empty; pick another --dir", dir.display());
    }
    let sdk = std::fs::canonicalize(sdk)
        .with_context(|| format!("the outbox-sink SDK is not at {} (pass --sdk DIR)", sdk.display()))?;
    anyhow::ensure!(sdk.join("Cargo.toml").exists(), "{} is not the outbox-sink SDK (no Cargo.toml)", sdk.display());
    let library = name.replace('-', "_");
    let mut written = Vec::new();
    for (file, text) in TEMPLATE {
        let text = text
            .replace("path = \"../sdk\"", &format!("path = {:?}", sdk.display().to_string()))
            .replace(TEMPLATE_NAME, name)
            .replace(&TEMPLATE_NAME.replace('-', "_"), &library);
        let path = dir.join(file);
        std::fs::create_dir_all(path.parent().unwrap_or(dir))?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}
