//! The host's imports, in the contract's own types (the bindings generated from the WIT): in
//! a component, the real ones; natively, whatever answers were given to
//! [`native::answer_with`] (the [`crate::testing`] harness does), else none: config keys are
//! absent, requests fail and log lines are dropped. The SDK's modules turn their own types
//! into these and back, so this module knows none of them.

pub(crate) use crate::bindings::outbox::sink::flow::Pressure;
pub(crate) use crate::bindings::outbox::sink::http::{HttpError, Request, Response};
pub(crate) use crate::bindings::outbox::sink::log::Level;

#[cfg(target_family = "wasm")]
pub(crate) fn config_get(key: &str) -> Option<String> {
    crate::bindings::outbox::sink::config::get(key)
}

#[cfg(target_family = "wasm")]
pub(crate) fn send(request: &Request) -> Result<Response, HttpError> {
    crate::bindings::outbox::sink::http::send(request)
}

#[cfg(target_family = "wasm")]
pub(crate) fn log(level: Level, message: &str) {
    crate::bindings::outbox::sink::log::log(level, message);
}

#[cfg(target_family = "wasm")]
pub(crate) fn push_back(pressure: Pressure) {
    crate::bindings::outbox::sink::flow::push_back(pressure);
}

#[cfg(target_family = "wasm")]
pub(crate) fn declare(key: &str, url: &str) {
    crate::bindings::outbox::sink::egress::declare(key, url);
}

#[cfg(target_family = "wasm")]
pub(crate) fn traceparent() -> Option<String> {
    crate::bindings::outbox::sink::trace::traceparent()
}

/// Natively there is no attempt, so no trace.
#[cfg(not(target_family = "wasm"))]
pub(crate) fn traceparent() -> Option<String> {
    None
}

#[cfg(not(target_family = "wasm"))]
pub(crate) use native::{config_get, declare, log, push_back, send};

/// Outside a component: the answers of the current thread.
#[cfg(not(target_family = "wasm"))]
pub(crate) mod native {
    use std::cell::Cell;

    use super::{HttpError, Level, Pressure, Request, Response};

    /// What answers each import.
    pub(crate) struct Answers {
        pub config_get: fn(&str) -> Option<String>,
        pub send: fn(&Request) -> Result<Response, HttpError>,
        pub log: fn(Level, &str),
        pub push_back: fn(Pressure),
        pub declare: fn(&str, &str),
    }

    thread_local! {
        static ANSWERS: Cell<Option<&'static Answers>> = const { Cell::new(None) };
    }

    /// From now on, on this thread, `answers` answer the imports (`None`: nothing does).
    pub(crate) fn answer_with(answers: Option<&'static Answers>) {
        ANSWERS.with(|current| current.set(answers));
    }

    fn answers() -> Option<&'static Answers> {
        ANSWERS.with(Cell::get)
    }

    pub(crate) fn config_get(key: &str) -> Option<String> {
        answers().and_then(|a| (a.config_get)(key))
    }

    pub(crate) fn send(request: &Request) -> Result<Response, HttpError> {
        match answers() {
            Some(a) => (a.send)(request),
            None => Err(HttpError::Transport("no testing::Harness is running".into())),
        }
    }

    pub(crate) fn log(level: Level, message: &str) {
        if let Some(a) = answers() {
            (a.log)(level, message);
        }
    }

    pub(crate) fn push_back(pressure: Pressure) {
        if let Some(a) = answers() {
            (a.push_back)(pressure);
        }
    }

    pub(crate) fn declare(key: &str, url: &str) {
        if let Some(a) = answers() {
            (a.declare)(key, url);
        }
    }
}
