//! Operating the host: the admin listener and its status page, the metrics, and the
//! operator actions shared by the command line and the HTTP API.

pub mod actions;
pub mod admin;
pub mod console;
pub mod health;
pub mod metrics;
pub mod otlp;
pub mod report;
pub mod traces;

pub use actions::{
    BULK_MAX, Bulk, PURGE_BATCH, REPLAY_STEP, ReplayError, SEARCH_PAGE, SearchRequest, SinkSummary, Story, bulk,
    bulk_selection, count_replay, describe, describe_everywhere, purge, replay, replay_filter, retry, retry_filter,
    search, search_request, sink_state, sink_summaries, sink_summary, states_everywhere, story,
};

use std::sync::Arc;

/// Reloads a sink's plugin by name (the admin API's `POST /api/sinks/NAME/reload`); the app
/// that wires the sinks does it.
#[async_trait::async_trait]
pub trait Reload: Send + Sync {
    /// Loads and checks the sink's plugin file anew and swaps it in if it is a new build;
    /// `trigger` says who asked, for the log.
    async fn reload(&self, name: &str, trigger: &str) -> Result<Reloaded, ReloadError>;
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reloaded {
    /// A new build is delivering now.
    Swapped {
        /// The build it replaced.
        from: Option<Arc<str>>,
        /// The build now delivering.
        to: Arc<str>,
    },
    /// The file holds the build already delivering.
    Unchanged(Arc<str>),
}

/// Why a reload did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// This host has no such sink.
    #[error("this host has no sink {0:?}")]
    UnknownSink(String),
    /// The new build was refused; the old one keeps delivering.
    #[error("{0}")]
    Refused(String),
}
