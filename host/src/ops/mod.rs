//! Operating the host: the admin listener and its status page, the metrics, and the
//! operator actions shared by the command line and the HTTP API.

pub mod actions;
pub mod admin;
pub mod health;
pub mod metrics;
pub mod page;
pub mod report;

pub use actions::{
    PURGE_BATCH, REPLAY_STEP, ReplayError, SinkSummary, count_replay, describe, describe_everywhere, purge,
    purge_everywhere, replay, replay_filter, retry, retry_filter, sink_state, sink_summaries,
};
