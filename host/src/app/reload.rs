//! Hot reload of a sink: a change to its plugin file, `SIGHUP`, or `POST
//! /api/sinks/NAME/reload` compiles and checks the new build off the delivery path (as
//! `check-config` does), then swaps it in at once. Deliveries under way finish on the old
//! build; new ones start on the new. A build that does not load, targets another world, or
//! fails its config check is refused with one log line and a metric, and the old one keeps
//! delivering.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::SinkConfig;
use crate::engine::SinkSlot;
use crate::ops::metrics::Metrics;
use crate::ops::{ReloadError, Reloaded};
use crate::relay::{Publish, RelaySink};
use crate::sandbox::relay::RelayRuntime;
use crate::sandbox::{Deliver, SinkRuntime};

/// How often a watched plugin file is looked at.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// One sink this host can reload.
struct Reloadable {
    config: SinkConfig,
    slot: Arc<SinkSlot>,
    metrics: Arc<Metrics>,
    /// A relay's broker connection, which stays, and its `room_pipeline`.
    relay: Option<Relay>,
    /// One reload of a sink at a time.
    busy: tokio::sync::Mutex<()>,
}

/// A relay's broker connection and `room_pipeline`: a reload swaps the mapping, not them.
#[derive(Clone)]
pub struct Relay {
    /// The broker connection, opened at start.
    pub publisher: Arc<dyn Publish>,
    /// `brokers.NAME.room_pipeline`.
    pub room_pipeline: u32,
}

/// The config key of the default relay's destination template (and of any relay that
/// follows it): its literal start, up to the first `{field}`, is checked against the
/// broker's `allowed_destinations` when the relay loads.
const DESTINATION_KEY: &str = "destination";

/// The sink `config` describes, its plugin loaded and checked: a WebAssembly sink, or a
/// relay publishing through `relay`.
pub async fn build(
    config: &SinkConfig,
    relay: Option<&Relay>,
    metrics: Arc<Metrics>,
) -> anyhow::Result<Arc<dyn Deliver>> {
    let (sandbox, worker) = (&config.sandbox, &config.worker);
    let (concurrency, timeout) = (worker.concurrency, worker.publish_timeout);
    Ok(match relay {
        None => Arc::new(SinkRuntime::load_checked(sandbox, concurrency, timeout, metrics).await?),
        Some(relay) => {
            let runtime = RelayRuntime::load_checked(sandbox, concurrency, timeout, metrics.clone()).await?;
            // A broker not reached since start has no defaults to check against yet: its
            // relay's records are checked one by one once it answers.
            if let Some(template) = sandbox.config.0.get(DESTINATION_KEY).filter(|_| relay.publisher.connected()) {
                let literal = template.split('{').next().unwrap_or_default();
                relay.publisher.destinations().admits_some_with_prefix(literal).map_err(|why| {
                    anyhow::anyhow!("sink.config.{DESTINATION_KEY}: {template:?} cannot fit the broker: {why}")
                })?;
            }
            Arc::new(RelaySink::new(runtime, relay.publisher.clone(), &metrics, relay.room_pipeline))
        }
    })
}

/// The sinks of this host, reloadable by name.
#[derive(Default)]
pub struct Reloader {
    sinks: Vec<Reloadable>,
}

impl Reloader {
    /// Adds a sink whose worker delivers through `slot`.
    /// A relay's `relay` stays across reloads.
    pub fn add(&mut self, config: SinkConfig, slot: Arc<SinkSlot>, metrics: Arc<Metrics>, relay: Option<Relay>) {
        self.sinks.push(Reloadable { config, slot, metrics, relay, busy: Default::default() });
    }

    /// The names of the sinks it can reload.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.sinks.iter().map(|s| s.config.name())
    }

    /// Loads and checks the sink's plugin file anew and, if it is a new build that passes,
    /// swaps it in. `trigger` says why, for the log.
    pub async fn reload(&self, name: &str, trigger: &str) -> Result<Reloaded, ReloadError> {
        let sink =
            self.sinks.iter().find(|s| s.config.name() == name).ok_or_else(|| ReloadError::UnknownSink(name.into()))?;
        let _one_at_a_time = sink.busy.lock().await;
        let current = sink.slot.get().digest();
        let loaded = match trusted(&sink.config.sandbox.plugin) {
            // A relay's new build publishes through the same connection as before.
            Ok(()) => build(&sink.config, sink.relay.as_ref(), sink.metrics.clone()).await,
            Err(why) => Err(anyhow::anyhow!("sink.plugin {}: {why}", sink.config.sandbox.plugin.display())),
        };
        match loaded {
            Ok(loaded) => {
                let to: Arc<str> = loaded.digest().unwrap_or_else(|| "none".into());
                if current.as_deref() == Some(&*to) {
                    sink.metrics.reloaded("unchanged");
                    tracing::info!(sink = name, trigger, plugin = %to, "sink reload: the plugin is the build already delivering");
                    return Ok(Reloaded::Unchanged(to));
                }
                sink.slot.swap(loaded);
                sink.metrics.reloaded("ok");
                tracing::info!(
                    sink = name,
                    trigger,
                    from = %current.as_deref().unwrap_or("none"),
                    to = %to,
                    "sink reloaded: new deliveries use the new build, those under way finish on the old one"
                );
                Ok(Reloaded::Swapped { from: current, to })
            }
            Err(e) => {
                let why = format!("{e:#}");
                sink.metrics.reloaded("refused");
                tracing::error!(
                    sink = name,
                    trigger,
                    plugin = %current.as_deref().unwrap_or("none"),
                    error = %why,
                    "sink reload refused: the old build keeps delivering"
                );
                Err(ReloadError::Refused(why))
            }
        }
    }

    /// Reloads every sink (`SIGHUP`); a refusal of one does not stop the others.
    pub async fn reload_all(&self, trigger: &str) {
        for name in self.names() {
            let _ = self.reload(name, trigger).await;
        }
    }

    /// Until `stop`, reloads each sink whose plugin file changes (its size, modification time,
    /// inode or content: a deploy that renames a new file over the old one is seen, and so is
    /// a rewrite in place that keeps the size and the modification time).
    pub async fn watch(self: Arc<Self>, stop: CancellationToken) {
        let mut seen: Vec<Option<FileStamp>> = self.sinks.iter().map(|s| stamp(&s.config.sandbox.plugin)).collect();
        loop {
            tokio::select! {
                () = tokio::time::sleep(WATCH_INTERVAL) => {}
                () = stop.cancelled() => return,
            }
            for (i, sink) in self.sinks.iter().enumerate().filter(|(_, s)| s.config.watch_plugin) {
                let now = stamp(&sink.config.sandbox.plugin);
                if now.is_some() && now != seen[i] {
                    seen[i] = now;
                    let _ = self.reload(sink.config.name(), "plugin file changed").await;
                }
            }
        }
    }
}

/// What says a file changed: its metadata and a digest of its content.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
    inode: u64,
    digest: [u8; 32],
}

fn stamp(path: &Path) -> Option<FileStamp> {
    use sha2::Digest as _;
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path).ok()?;
    let digest = sha2::Sha256::digest(std::fs::read(path).ok()?).into();
    Some(FileStamp { len: meta.len(), modified: meta.modified().ok(), inode: meta.ino(), digest })
}

/// Refuses a plugin file another user could have written: one that is group- or
/// world-writable, or not owned by the user this host runs as (a reload runs whatever the
/// file holds, with this host's egress and database).
fn trusted(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot be read: {e}"))?;
    let mode = meta.mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "is writable by other users (mode {mode:04o}): a reload would run what they wrote; chmod go-w it"
        ));
    }
    // `/proc/self` belongs to the user this process runs as.
    let ours =
        std::fs::metadata("/proc/self").map(|m| m.uid()).map_err(|e| format!("cannot tell this host's user: {e}"))?;
    if meta.uid() != ours {
        return Err(format!("is owned by uid {}, not by this host's user (uid {ours}): chown it", meta.uid()));
    }
    Ok(())
}

/// Reloads every sink of `reloader` on each `SIGHUP`, until `stop`.
pub fn reload_on_sighup(reloader: Arc<Reloader>, stop: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                got = hup.recv() => {
                    if got.is_none() {
                        return;
                    }
                    tracing::info!("SIGHUP: reloading the sinks");
                    reloader.reload_all("SIGHUP").await;
                }
                () = stop.cancelled() => return,
            }
        }
    });
    Ok(())
}

#[async_trait::async_trait]
impl crate::ops::Reload for Reloader {
    async fn reload(&self, name: &str, trigger: &str) -> Result<Reloaded, ReloadError> {
        Reloader::reload(self, name, trigger).await
    }
}
