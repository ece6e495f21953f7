//! The one place the host generates bindings for `wit/sink.wit`.

#![allow(missing_docs)] // generated code; wit/sink.wit documents the contract

wasmtime::component::bindgen!({
    path: "../wit",
    world: "sink",
    imports: { default: async },
    exports: { default: async },
});

pub use outbox::sink::flow::Pressure as WitPressure;
pub use outbox::sink::http::{HttpError, Request as HttpRequest, Response as HttpResponse};
pub use outbox::sink::log::Level;
pub use outbox::sink::types::FailureKind;
