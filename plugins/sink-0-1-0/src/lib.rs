//! A sink built against `outbox:sink@0.1.0` (its WIT is frozen in `wit/` beside this file),
//! kept so that the tests prove a host offering a later 0.1.x still loads and runs it. It
//! logs a line and delivers, or fails retryable when its config says `default: retryable`.

mod bindings {
    #![allow(missing_docs, clippy::too_many_arguments)] // generated from the frozen 0.1.0 WIT
    wit_bindgen::generate!({ path: "wit", world: "sink" });
}

use bindings::outbox::sink::types::FailureKind;
use bindings::outbox::sink::{config, log};
use bindings::{Event, Failure, Guest, Outcome};

struct Sink010;

impl Guest for Sink010 {
    fn check_config() -> Vec<String> {
        Vec::new()
    }

    fn deliver(event: Event) -> Result<Outcome, Failure> {
        log::log(log::Level::Info, &format!("0.1.0 sink got {}", event.event_id));
        match config::get("default").as_deref() {
            Some("retryable") => Err(Failure {
                kind: FailureKind::Retryable,
                message: "0.1.0 sink: retryable".into(),
                retry_after_ms: None,
            }),
            _ => Ok(Outcome::Delivered),
        }
    }
}

bindings::export!(Sink010 with_types_in bindings);
