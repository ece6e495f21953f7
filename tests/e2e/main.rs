//! End-to-end tests: the real host (in process, or the real binary where signals matter)
//! against a real SQLite file and the real fake sink `.wasm` built from `plugins/fake`.

mod acceptance;
mod admin;
mod adoption;
mod binary;
mod breaker;
mod brokers;
mod browser;
mod claims;
mod confinement;
mod conformance;
mod edges;
mod egress;
mod flow;
mod handover;
mod hostile;
mod leases;
mod operations;
mod order;
mod partitions;
mod permissions;
mod pipeline;
mod process;
mod producer;
mod redaction;
mod relay;
mod release;
mod reload;
mod sandbox;
mod scale;
mod sinkdev;
mod sinks;
mod support;
mod tencent;
mod wakeup;
mod webhook;
