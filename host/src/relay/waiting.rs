//! A broker that could not be reached when the host started is waited for, as the
//! database is (decision 0198): the relay starts without it, tries to connect every
//! [`RETRY_EVERY`], and meanwhile defers its events without counting attempts, while
//! readiness (`/readyz` 503), the page and `room_outbox_broker_up` name the broker. Once the
//! broker answers, the connection it made (its stream or exchange checked) publishes, as a
//! broker reached at start would.

use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use super::confine::Destinations;
use super::settings::{BrokerConfig, BrokerKind};
use super::{Acks, Publish, PublishError, connect};
use crate::sandbox::relay::Record;

/// How often a broker not reached yet is tried again.
pub const RETRY_EVERY: Duration = Duration::from_secs(2);

/// A broker not reached yet: connecting in the background until it answers.
pub struct Waiting {
    config: BrokerConfig,
    /// The connection, once made.
    reached: OnceLock<Arc<dyn Publish>>,
    /// Why the last try failed.
    last_error: Mutex<String>,
    /// What `allowed_destinations` says, until the broker's own default can be read.
    configured: Destinations,
    trying: tokio::task::JoinHandle<()>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.trying.abort();
    }
}

impl Waiting {
    /// Starts waiting for `config`'s broker, which just failed with `first_error`.
    pub fn start(config: &BrokerConfig, first_error: String) -> Arc<Waiting> {
        Arc::new_cyclic(|me: &Weak<Waiting>| Waiting {
            config: config.clone(),
            reached: OnceLock::new(),
            last_error: Mutex::new(first_error),
            configured: Destinations::of(config, Vec::new()),
            trying: tokio::spawn(keep_trying(me.clone())),
        })
    }

    fn last_error(&self) -> String {
        self.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Tries to connect every [`RETRY_EVERY`] until it does, or the waiting publisher is gone.
async fn keep_trying(me: Weak<Waiting>) {
    loop {
        tokio::time::sleep(RETRY_EVERY).await;
        let Some(waiting) = me.upgrade() else { return };
        match connect(&waiting.config).await {
            Ok(publisher) => {
                tracing::info!(broker = %waiting.config.name, "the broker answers now; its relays publish");
                let _ = waiting.reached.set(publisher);
                return;
            }
            Err(e) => *waiting.last_error.lock().unwrap_or_else(|p| p.into_inner()) = format!("{e:#}"),
        }
    }
}

#[async_trait::async_trait]
impl Publish for Waiting {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn kind(&self) -> BrokerKind {
        self.config.kind
    }

    /// The connection's own once it is made (a NATS stream's subjects are read then).
    fn destinations(&self) -> &Destinations {
        self.reached.get().map_or(&self.configured, |p| p.destinations())
    }

    fn connected(&self) -> bool {
        self.reached.get().is_some()
    }

    async fn probe(&self) -> Result<(), String> {
        match self.reached.get() {
            Some(publisher) => publisher.probe().await,
            None => Err(self.last_error()),
        }
    }

    async fn send(&self, event_id: &str, records: Vec<Record>) -> Result<Acks, PublishError> {
        match self.reached.get() {
            Some(publisher) => publisher.send(event_id, records).await,
            None => Err(PublishError::Unavailable("not reached since start".into())),
        }
    }
}
