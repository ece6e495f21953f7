//! outbox-host: drains a transactional outbox table (`room_outbox`) and delivers every event
//! through a sandboxed WebAssembly sink, with at-least-once delivery, leases and fencing.
//!
//! The binary is a thin CLI over this library: [`app::Host`] wires a [`store::Store`], a
//! [`sandbox::SinkRuntime`] and an [`engine::Worker`] together; the integration tests drive
//! the same pieces. The modules, by what they serve:
//!
//! - the delivery engine: [`engine`] (claim, deliver, decide, record), [`envelope`];
//! - the sandbox: [`sandbox`] (the sink's component, its imports, egress, budgets);
//! - the store: [`store`] (the contract, one module per database, migrations);
//! - operations: [`ops`] (admin listener, status page, metrics, operator actions);
//! - the process: [`app`], [`config`], [`logging`];
//! - leaves that everything may use: [`clock`], [`text`], [`units`]; and the process's
//!   [`allocator`].

pub mod allocator;
pub mod app;
pub mod clock;
pub mod config;
pub mod engine;
pub mod envelope;
pub mod logging;
pub mod ops;
pub mod redact;
pub mod relay;
pub mod sandbox;
pub mod sinkdev;
pub mod store;
pub mod text;
pub mod units;
