//! A sink built against `outbox:sink@0.2.0` (its WIT, in `wit/` beside this file, is 0.1.0's
//! under a new version), a contract this host does not offer: the tests check that the host
//! refuses it with both versions named, before anything is delivered.

mod bindings {
    #![allow(missing_docs, clippy::too_many_arguments)] // generated from the 0.2.0 WIT
    wit_bindgen::generate!({ path: "wit", world: "sink" });
}

use bindings::outbox::sink::log;
use bindings::{Event, Failure, Guest, Outcome};

struct Sink020;

impl Guest for Sink020 {
    fn check_config() -> Vec<String> {
        Vec::new()
    }

    fn deliver(event: Event) -> Result<Outcome, Failure> {
        log::log(log::Level::Info, &format!("0.2.0 sink got {}", event.event_id));
        Ok(Outcome::Delivered)
    }
}

bindings::export!(Sink020 with_types_in bindings);
