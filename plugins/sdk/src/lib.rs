//! The guest SDK for outbox-host sinks. A sink is a type implementing [`Sink`], exported
//! with [`export!`]; the SDK carries the WIT contract, generates its bindings, and gives the
//! sink what it needs without touching them:
//!
//! - [`Event`]: the event, its body decoded into the typed room-event message
//!   ([`Event::body`]) and into JSON ([`Event::to_json`]);
//! - [`Config`]: typed access to the sink's `config:` map, collecting "missing key" and
//!   "bad value" [`ConfigProblem`]s that `check-config` reports;
//! - [`http`]: requests over the host's `http.send`, and [`http::classify`], which turns a
//!   reply into an outcome (2xx delivered; 408, 429 and 5xx retryable, honouring
//!   `Retry-After`; other statuses permanent);
//! - [`log`]: lines in the host's log (the host tags them with the sink and the event);
//! - [`traceparent`]: the attempt's trace context, for a sink that puts it in a body.
//!
//! ```ignore
//! struct Echo { url: String }
//!
//! impl outbox_sink::Sink for Echo {
//!     fn configure(config: &mut outbox_sink::Config) -> Self {
//!         Echo { url: config.required("url", "where to POST events") }
//!     }
//!
//!     fn deliver(&self, event: &outbox_sink::Event) -> outbox_sink::Delivery {
//!         let request = outbox_sink::http::Request::post(&self.url).json(&event.to_json());
//!         outbox_sink::http::classify("echo", request.send())
//!     }
//! }
//!
//! outbox_sink::export!(Echo);
//! ```
//!
//! Natively (`cargo test`), the host's imports are answered by [`testing::Harness`], so a
//! sink's logic is unit-tested without building a component.

pub mod config;
pub mod http;
pub mod log;
#[cfg(not(target_family = "wasm"))]
pub mod testing;

mod event;
mod host;

pub use config::{Config, ConfigProblem};
pub use event::Event;
pub use outbox_proto as proto;
pub use outbox_proto::EventBody;
pub use serde_json;

/// The WIT bindings of world `outbox:sink/sink`, generated once here. Sinks do not need
/// them; [`export!`] uses them.
#[doc(hidden)]
pub mod bindings {
    #![allow(missing_docs, clippy::too_many_arguments)] // generated from wit/sink.wit
    wit_bindgen::generate!({
        path: "../../wit",
        world: "sink",
        default_bindings_module: "outbox_sink::bindings",
        pub_export_macro: true,
        export_macro_name: "export_sink",
    });
}

/// What a delivery comes to: an [`Outcome`], or a [`Failure`].
pub type Delivery = Result<Outcome, Failure>;

/// A destination. The host calls the exported functions in a fresh instance each time, so
/// `configure` runs before every delivery and every config check: keep it cheap.
pub trait Sink: Sized {
    /// Reads the sink's settings from its `config:` map. Report what is missing or wrong
    /// through `config` (its typed getters do it for you) and return any value: the host
    /// refuses to start while there are problems, and a delivery fails permanently.
    /// `check-config` is answered by running this, so a check and a delivery never read the
    /// config differently.
    fn configure(config: &mut Config) -> Self;

    /// Delivers one event.
    fn deliver(&self, event: &Event) -> Delivery;
}

/// The destination took the event, or does not carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The destination accepted the event.
    Delivered,
    /// The sink does not carry this event type; stored as delivered and counted apart.
    Skipped(String),
}

/// Whether trying again can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Try again later.
    Retryable,
    /// Retrying cannot help; an operator must look.
    Permanent,
}

/// What a retryable failure says about more than its event (the host's `flow.push-back`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pressure {
    /// Only the event's room is over a frequency limit: the room waits, others go on.
    RoomThrottled,
    /// The destination asks every caller to slow down: the host pauses the sink.
    Throttled,
    /// The destination cannot take anything now: the host pauses the sink.
    Unavailable,
}

/// A failed delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Retryable or permanent.
    pub kind: FailureKind,
    /// Short and free of secrets: it becomes the row's `last_error`.
    pub message: String,
    /// The earliest the host should try again, in milliseconds from now.
    pub retry_after_ms: Option<u64>,
    /// Set when a retryable failure concerns the room or the whole destination: the host
    /// then defers the event without counting the attempt.
    pub pressure: Option<Pressure>,
}

impl Failure {
    /// A failure worth retrying.
    pub fn retryable(message: impl Into<String>) -> Failure {
        Failure { kind: FailureKind::Retryable, message: message.into(), retry_after_ms: None, pressure: None }
    }

    /// A failure retrying cannot fix.
    pub fn permanent(message: impl Into<String>) -> Failure {
        Failure { kind: FailureKind::Permanent, message: message.into(), retry_after_ms: None, pressure: None }
    }

    /// Not before `ms` milliseconds from now.
    pub fn after_ms(mut self, ms: u64) -> Failure {
        self.retry_after_ms = Some(ms);
        self
    }

    /// Says the failure concerns more than the event (ignored unless retryable).
    pub fn pressure(mut self, pressure: Pressure) -> Failure {
        self.pressure = Some(pressure);
        self
    }
}

/// Exports a [`Sink`] as the component's `deliver` and `check-config`:
/// `outbox_sink::export!(MySink);` once, at the crate's root.
#[macro_export]
macro_rules! export {
    ($sink:ty) => {
        #[cfg(target_family = "wasm")]
        const _: () = {
            struct Export;

            impl $crate::bindings::Guest for Export {
                fn deliver(
                    event: $crate::bindings::Event,
                ) -> ::core::result::Result<$crate::bindings::Outcome, $crate::bindings::Failure> {
                    $crate::__deliver::<$sink>(event)
                }

                fn check_config() -> ::std::vec::Vec<::std::string::String> {
                    $crate::__check_config::<$sink>()
                }
            }

            $crate::bindings::export_sink!(Export);
        };
        // Natively (unit tests), the sink is reached through `testing::Harness` instead.
        #[cfg(not(target_family = "wasm"))]
        const _: fn() -> ::std::vec::Vec<::std::string::String> = $crate::__check_config::<$sink>;
    };
}

/// [`deliver`], in WIT terms.
#[doc(hidden)]
pub fn __deliver<S: Sink>(event: bindings::Event) -> Result<bindings::Outcome, bindings::Failure> {
    deliver::<S>(&Event::from(event)).map(Into::into).map_err(Into::into)
}

/// One delivery: the sink's settings, then its `deliver`; a push-back goes to the host.
pub(crate) fn deliver<S: Sink>(event: &Event) -> Delivery {
    let (sink, problems) = configured::<S>();
    if !problems.is_empty() {
        return Err(Failure::permanent(format!("sink config: {}", problems.join("; "))));
    }
    let result = sink.deliver(event);
    if let Err(Failure { kind: FailureKind::Retryable, pressure: Some(pressure), .. }) = &result {
        host::push_back((*pressure).into());
    }
    result
}

/// The W3C `traceparent` of this attempt's span while the host exports traces (WIT 0.1.3),
/// for a sink that carries the trace in a body or a message of its own: the host already
/// sets it on every [`http`] request. `None` when the host does not trace.
pub fn traceparent() -> Option<String> {
    host::traceparent()
}

/// Tells the host that the failure about to be returned concerns more than the event. A
/// [`Failure`] with a [`Failure::pressure`] does this for you; the host ignores it when the
/// delivery does not fail retryably.
pub fn push_back(pressure: Pressure) {
    host::push_back(pressure.into());
}

impl From<Pressure> for host::Pressure {
    fn from(pressure: Pressure) -> Self {
        match pressure {
            Pressure::RoomThrottled => host::Pressure::RoomThrottled,
            Pressure::Throttled => host::Pressure::Throttled,
            Pressure::Unavailable => host::Pressure::Unavailable,
        }
    }
}

impl From<host::Pressure> for Pressure {
    fn from(pressure: host::Pressure) -> Self {
        match pressure {
            host::Pressure::RoomThrottled => Pressure::RoomThrottled,
            host::Pressure::Throttled => Pressure::Throttled,
            host::Pressure::Unavailable => Pressure::Unavailable,
        }
    }
}

/// `check-config`: the problems [`Sink::configure`] finds (already in WIT terms).
#[doc(hidden)]
pub fn __check_config<S: Sink>() -> Vec<String> {
    configured::<S>().1
}

/// The sink as its `config:` map makes it, and what is wrong with that map.
fn configured<S: Sink>() -> (S, Vec<String>) {
    let mut config = Config::from_host();
    let sink = S::configure(&mut config);
    (sink, config.problems().iter().map(ToString::to_string).collect())
}

impl From<Outcome> for bindings::Outcome {
    fn from(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Delivered => bindings::Outcome::Delivered,
            Outcome::Skipped(reason) => bindings::Outcome::Skipped(reason),
        }
    }
}

impl From<Failure> for bindings::Failure {
    fn from(failure: Failure) -> Self {
        bindings::Failure {
            kind: match failure.kind {
                FailureKind::Retryable => bindings::outbox::sink::types::FailureKind::Retryable,
                FailureKind::Permanent => bindings::outbox::sink::types::FailureKind::Permanent,
            },
            message: failure.message,
            retry_after_ms: failure.retry_after_ms,
        }
    }
}
