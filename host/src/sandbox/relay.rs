//! A relay: a component of world `outbox:relay/relay` (`wit/relay/relay.wit`) that maps an
//! event to the records a broker should hold. It runs as a sink does (a fresh instance per
//! call, the memory cap, the deadline, bounded logs) with fewer imports: its config and
//! `log`, no HTTP. What it returns is bounded before the host publishes it.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::HasSelf;

use super::state::DeliveryState;
use super::{AttemptFailure, Compiled, Core, Event, ExportCall, FailureClass, PluginConfig, sink_problems};
use crate::ops::metrics::Metrics;
use crate::text::printable_within;

pub mod bindings {
    #![allow(missing_docs)] // generated code; wit/relay/relay.wit documents the contract

    wasmtime::component::bindgen!({
        path: "../wit/relay",
        world: "relay",
        imports: { default: async },
        exports: { default: async },
    });
}

use bindings::outbox::relay::log::Level;
use bindings::outbox::relay::types::FailureKind;

/// The relay contract's package.
pub const PACKAGE: &str = "outbox:relay";
/// The version of `wit/relay/relay.wit` this host is built from.
pub const VERSION: super::contract::Version = super::contract::Version { major: 0, minor: 1, patch: 0 };

/// The most records one event may make.
pub const MAX_RECORDS: usize = 16;
/// The most headers one record may carry, and the longest name or value.
const MAX_HEADERS: usize = 32;
const MAX_HEADER_BYTES: usize = 4 << 10;
/// The longest destination or key.
const MAX_DESTINATION_BYTES: usize = 256;

/// One message for a broker (the WIT record), bounded before it is published.
pub use bindings::outbox::relay::types::RelayRecord as Record;

/// How many events one relay instance routes before it is dropped for a fresh one: a bound
/// on what a mapping that keeps state (or leaks memory) can carry from event to event.
const ROUTES_PER_INSTANCE: u32 = 1_000;

/// A loaded relay, ready to route events concurrently.
pub struct RelayRuntime {
    core: Core,
    pre: bindings::RelayPre<DeliveryState>,
    /// Instances whose last `route` returned, kept for the next events: `route` is pure, so
    /// an instance serves many events and each event skips a store, an instantiation and a
    /// teardown. One that traps or runs out of time is dropped, never reused.
    warm: std::sync::Mutex<Vec<Warm>>,
    /// How many instances may wait in `warm`: the sink's concurrency.
    keep_warm: usize,
}

/// An instance of the relay and its store, ready for another `route`.
struct Warm {
    call: ExportCall,
    relay: bindings::Relay,
    routed: u32,
}

impl RelayRuntime {
    /// Compiles (or loads from the cache), links and pre-instantiates the relay component,
    /// then asks it to check its config: its problems refuse start-up, as a sink's do.
    pub async fn load_checked(
        config: &PluginConfig,
        concurrency: u32,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<RelayRuntime> {
        let owned = config.clone();
        let runtime = tokio::task::spawn_blocking(move || Self::load(&owned, concurrency, metrics)).await??;
        let problems = runtime.check_config(timeout).await.map_err(|f| {
            anyhow::anyhow!("sink.plugin: {} failed its config check: {}", config.plugin.display(), f.message)
        })?;
        if !problems.is_empty() {
            return Err(super::SinkConfigProblems(sink_problems(problems)).into());
        }
        Ok(runtime)
    }

    fn load(config: &PluginConfig, concurrency: u32, metrics: Arc<Metrics>) -> anyhow::Result<RelayRuntime> {
        let plugin = &config.plugin;
        let mut compiled = Compiled::load(config, concurrency, |engine, component| {
            super::contract::check_package(
                PACKAGE,
                VERSION,
                "the relay against this host's wit/relay/relay.wit",
                &super::contract::targets_of(engine, component, PACKAGE),
            )
        })?;
        bindings::Relay::add_to_linker::<_, HasSelf<_>>(&mut compiled.linker, |s| s)?;
        let instance_pre = compiled.linker.instantiate_pre(&compiled.component).map_err(|e| {
            anyhow::anyhow!(
                "sink.plugin: {} needs imports a relay does not get (only outbox:relay config and log, and WASI p2 without files, env or sockets): {e:#}",
                plugin.display()
            )
        })?;
        let pre = bindings::RelayPre::new(instance_pre).map_err(|e| {
            anyhow::anyhow!(
                "sink.plugin: {} is not a relay (world {PACKAGE}/relay@{VERSION}, exporting `route`): {e:#}",
                plugin.display()
            )
        })?;
        let core = compiled.core(config, metrics, None)?;
        Ok(RelayRuntime { core, pre, warm: Default::default(), keep_warm: concurrency.max(1) as usize })
    }

    /// How many instances wait for the next event now (at most the sink's concurrency).
    pub fn instances_kept(&self) -> usize {
        self.warm.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The relay's configured name.
    pub fn name(&self) -> &str {
        &self.core.shared.name
    }

    /// `sha256:<hex>` of the component.
    pub fn digest(&self) -> Arc<str> {
        self.core.digest.clone()
    }

    /// The records of `event`, bounded; an empty list: not for this relay.
    /// An instance that has routed before serves it when one is free (see
    /// [`ROUTES_PER_INSTANCE`]); otherwise a fresh one.
    pub async fn route(&self, event: &Event, timeout: Duration) -> Result<Vec<Record>, AttemptFailure> {
        let warm = self.warm.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let (mut call, warm_relay, routed) = match warm {
            Some(Warm { mut call, relay, routed }) => {
                Core::rearm(&mut call, timeout);
                (call, Some(relay), routed)
            }
            None => (self.core.fresh_store(timeout), None, 0),
        };
        let event = bindings::outbox::relay::types::Event {
            app_code: event.app_code.clone(),
            event_id: event.event_id.clone(),
            event_type: event.event_type.clone(),
            room_id: event.room_id.clone(),
            room_version: event.room_version,
            occurred_at_ms: event.occurred_at_ms,
            body: event.body.clone(),
            attempt: event.attempt,
        };
        let deadline = call.deadline;
        let run = async {
            let relay = match warm_relay {
                Some(relay) => relay,
                None => self.pre.instantiate_async(&mut call.store).await?,
            };
            let routed = relay.call_route(&mut call.store, &event).await?;
            Ok((relay, routed))
        };
        let returned = tokio::time::timeout_at(deadline, run).await;
        // A trap or a timeout drops the store here: only an instance that returned is kept.
        let (relay, routed_now) = self.core.settle(&mut call, returned, timeout)?;
        if routed + 1 < ROUTES_PER_INSTANCE {
            let mut warm = self.warm.lock().unwrap_or_else(|p| p.into_inner());
            if warm.len() < self.keep_warm {
                warm.push(Warm { call, relay, routed: routed + 1 });
            }
        }
        match routed_now {
            Ok(records) => self.bounded(records),
            Err(failure) => {
                let max = self.core.shared.budgets.max_message_bytes as usize;
                let message = printable_within(&failure.message, max).0;
                let class = match failure.kind {
                    FailureKind::Retryable => FailureClass::Retryable,
                    FailureKind::Permanent => FailureClass::Permanent,
                };
                Err(AttemptFailure { class, message, retry_after: None, pressure: None })
            }
        }
    }

    /// The relay's config problems (empty: none).
    pub async fn check_config(&self, timeout: Duration) -> Result<Vec<String>, AttemptFailure> {
        let mut call = self.core.fresh_store(timeout);
        let run = async {
            let relay = self.pre.instantiate_async(&mut call.store).await?;
            relay.call_check_config(&mut call.store).await
        };
        let returned = tokio::time::timeout_at(call.deadline, run).await;
        self.core.finish(call, returned, timeout)
    }

    /// What the relay returned, refused when over a bound (a permanent failure: the same
    /// event maps the same way again). The payload's bound is `sink.max_request_bytes`.
    fn bounded(
        &self,
        records: Vec<bindings::outbox::relay::types::RelayRecord>,
    ) -> Result<Vec<Record>, AttemptFailure> {
        let max_payload = self.core.shared.budgets.max_request_bytes;
        let refuse = |why: String| Err(AttemptFailure::permanent(format!("the relay returned {why}")));
        if records.len() > MAX_RECORDS {
            return refuse(format!("{} records for one event (at most {MAX_RECORDS})", records.len()));
        }
        let mut out = Vec::with_capacity(records.len());
        for r in records {
            let fits = |text: &str| !text.is_empty() && text.len() <= MAX_DESTINATION_BYTES;
            let plain = |text: &str| text.chars().all(|c| c.is_ascii_graphic());
            if !fits(&r.destination) || !plain(&r.destination) {
                return refuse(format!(
                    "the destination {:?}: it must be 1 to {MAX_DESTINATION_BYTES} printable characters without spaces",
                    printable_within(&r.destination, 80).0
                ));
            }
            if r.key.as_deref().is_some_and(|k| !fits(k) || !plain(k)) {
                return refuse("a key that is empty, too long, or not plain printable text".to_string());
            }
            if r.headers.len() > MAX_HEADERS
                || r.headers.iter().any(|(n, v)| {
                    n.is_empty()
                        || n.len() > MAX_HEADER_BYTES
                        || v.len() > MAX_HEADER_BYTES
                        || !plain(n)
                        || v.chars().any(char::is_control)
                })
            {
                return refuse(format!(
                    "headers over their bounds (at most {MAX_HEADERS}, names and values of at most {MAX_HEADER_BYTES} bytes, no control characters)"
                ));
            }
            if r.payload.len() as u64 > max_payload {
                return refuse(format!(
                    "a payload of {} bytes (sink.max_request_bytes is {max_payload})",
                    r.payload.len()
                ));
            }
            out.push(r);
        }
        Ok(out)
    }
}

impl bindings::outbox::relay::types::Host for DeliveryState {}

impl bindings::outbox::relay::config::Host for DeliveryState {
    async fn get(&mut self, key: String) -> Option<String> {
        self.shared.settings.get(&key).cloned()
    }
}

impl bindings::outbox::relay::log::Host for DeliveryState {
    async fn log(&mut self, level: Level, message: String) {
        let level = match level {
            Level::Debug => tracing::Level::DEBUG,
            Level::Info => tracing::Level::INFO,
            Level::Warn => tracing::Level::WARN,
            Level::Error => tracing::Level::ERROR,
        };
        self.emit(level, None, &message);
    }
}
