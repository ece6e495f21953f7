//! The host's imports: the real ones in a component; natively, the [`crate::testing`]
//! harness of the current thread.

#[cfg(target_family = "wasm")]
use crate::{
    Pressure,
    http::{HttpError, Request, Response},
    log::Level,
};

#[cfg(target_family = "wasm")]
mod imports {
    pub use crate::bindings::outbox::sink::{config, egress, flow, http, log};
}

#[cfg(target_family = "wasm")]
pub(crate) fn config_get(key: &str) -> Option<String> {
    imports::config::get(key)
}

#[cfg(target_family = "wasm")]
pub(crate) fn send(request: &Request) -> Result<Response, HttpError> {
    use imports::http::{self, HttpError as E};
    let request = http::Request {
        method: request.method.clone(),
        url: request.url.clone(),
        headers: request.headers.clone(),
        body: request.body.clone(),
    };
    match http::send(&request) {
        Ok(r) => Ok(Response { status: r.status, headers: r.headers, body: r.body }),
        Err(E::Denied(why)) => Err(HttpError::Denied(why)),
        Err(E::InvalidRequest(why)) => Err(HttpError::InvalidRequest(why)),
        Err(E::Transport(why)) => Err(HttpError::Transport(why)),
        Err(E::Timeout) => Err(HttpError::Timeout),
        Err(E::TooLarge(limit)) => Err(HttpError::TooLarge(limit)),
    }
}

#[cfg(target_family = "wasm")]
pub(crate) fn log(level: Level, message: &str) {
    use imports::log::Level as L;
    let level = match level {
        Level::Trace => L::Trace,
        Level::Debug => L::Debug,
        Level::Info => L::Info,
        Level::Warn => L::Warn,
        Level::Error => L::Error,
    };
    imports::log::log(level, message);
}

#[cfg(target_family = "wasm")]
pub(crate) fn push_back(pressure: Pressure) {
    use imports::flow::Pressure as P;
    imports::flow::push_back(match pressure {
        Pressure::RoomThrottled => P::RoomThrottled,
        Pressure::Throttled => P::Throttled,
        Pressure::Unavailable => P::Unavailable,
    });
}

#[cfg(target_family = "wasm")]
pub(crate) fn declare(key: &str, url: &str) {
    imports::egress::declare(key, url);
}

#[cfg(not(target_family = "wasm"))]
pub(crate) use crate::testing::{config_get, declare, log, push_back, send};
