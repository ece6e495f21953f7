//! The component's glue: reads the config through the host, calls `http.send`, logs.

mod bindings {
    #![allow(missing_docs, clippy::too_many_arguments)] // generated from wit/sink.wit
    wit_bindgen::generate!({ path: "../../wit", world: "sink" });
}

use bindings::outbox::sink::flow::{self, Pressure};
use bindings::outbox::sink::http::{self, HttpError, Request};
use bindings::outbox::sink::log::{self, Level};
use bindings::outbox::sink::types::FailureKind;
use bindings::{Event, Failure, Guest, Outcome};

use crate::classify::{self, Verdict};
use crate::message::{self, RoomEvent};
use crate::settings::Settings;

struct TencentIm;

fn settings() -> Result<Settings, Vec<String>> {
    Settings::read(bindings::outbox::sink::config::get)
}

fn permanent(message: String) -> Failure {
    Failure { kind: FailureKind::Permanent, message, retry_after_ms: None }
}

fn retryable(message: String, retry_after_ms: Option<u64>) -> Failure {
    Failure { kind: FailureKind::Retryable, message, retry_after_ms }
}

impl Guest for TencentIm {
    fn check_config() -> Vec<String> {
        settings().err().unwrap_or_default()
    }

    fn deliver(event: Event) -> Result<Outcome, Failure> {
        let settings = settings().map_err(|problems| permanent(format!("sink config: {}", problems.join("; "))))?;
        if settings.skips(&event.event_type) {
            return Ok(Outcome::Skipped(format!("{} is not sent to Tencent IM", event.event_type)));
        }
        let event = RoomEvent {
            app_code: event.app_code,
            event_id: event.event_id,
            event_type: event.event_type,
            room_id: event.room_id,
            room_version: event.room_version,
            occurred_at_ms: event.occurred_at_ms,
            body: event.body,
        };
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let usersig = crate::usersig::generate(
            settings.sdk_app_id,
            &settings.secret_key,
            &settings.identifier,
            now,
            settings.usersig_expire_seconds,
        );
        let request = Request {
            method: "POST".into(),
            url: message::url(&settings, &usersig, message::random_of(&format!("{}#{now}", event.event_id))),
            headers: vec![("content-type".into(), "application/json".into())],
            body: message::body(&settings, &event).to_string().into_bytes(),
        };
        let response = http::send(&request).map_err(|e| match e {
            HttpError::Denied(why) => permanent(format!("Tencent IM endpoint refused by the host: {why}")),
            HttpError::InvalidRequest(why) => permanent(format!("Tencent IM request invalid: {why}")),
            HttpError::Transport(why) => {
                // Nothing gets through while the endpoint cannot be reached: pause the sink.
                flow::push_back(Pressure::Unavailable);
                retryable(format!("Tencent IM unreachable: {why}"), None)
            }
            HttpError::Timeout => retryable("Tencent IM did not answer within publish_timeout".into(), None),
            HttpError::TooLarge(limit) => retryable(format!("Tencent IM reply larger than {limit} bytes"), None),
        })?;
        match classify::reply(response.status, &response.body) {
            Verdict::Delivered => Ok(Outcome::Delivered),
            Verdict::Retry { message, retry_after_ms, unknown, pressure } => {
                if unknown {
                    log::log(Level::Warn, &format!("unknown Tencent IM error, retrying: {message}"));
                }
                if let Some(pressure) = pressure {
                    flow::push_back(match pressure {
                        classify::Pressure::RoomThrottled => Pressure::RoomThrottled,
                        classify::Pressure::Throttled => Pressure::Throttled,
                        classify::Pressure::Unavailable => Pressure::Unavailable,
                    });
                }
                Err(retryable(message, retry_after_ms))
            }
            Verdict::Permanent { message } => Err(permanent(message)),
        }
    }
}

bindings::export!(TencentIm with_types_in bindings);
