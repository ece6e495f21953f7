//! Relaying into a distributed log: a relay component (`sandbox::relay`) maps each event to
//! records, and the host publishes them to a broker of `brokers:` and waits for its acks.
//! Delivered means the broker acknowledged every record of the event. A broker that cannot
//! take a record (down, unreachable, no ack in time) is push-back: the event is deferred,
//! no attempt is burned, and the sink's breaker pauses it while the broker stays away.

pub mod nats;
pub mod settings;

use std::sync::Arc;
use std::time::Duration;

use crate::sandbox::relay::RelayRuntime;
use crate::sandbox::{AttemptFailure, Deliver, Delivered, Event, FailureClass, Pressure};
use nats::NatsPublisher;

/// A sink that relays: the mapping in WebAssembly, the publishing in the host.
pub struct RelaySink {
    runtime: RelayRuntime,
    publisher: Arc<NatsPublisher>,
}

impl RelaySink {
    /// The relay `runtime` publishing through `publisher`.
    pub fn new(runtime: RelayRuntime, publisher: Arc<NatsPublisher>) -> RelaySink {
        RelaySink { runtime, publisher }
    }
}

#[async_trait::async_trait]
impl Deliver for RelaySink {
    fn name(&self) -> &str {
        self.runtime.name()
    }

    async fn deliver(&self, event: &Event, timeout: Duration) -> Result<Delivered, AttemptFailure> {
        let deadline = tokio::time::Instant::now() + timeout;
        let records = self.runtime.route(event, timeout).await?;
        if records.is_empty() {
            return Ok(Delivered::Skipped("not for this relay".to_string()));
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.publisher.publish(&event.event_id, records, left).await.map_err(|message| AttemptFailure {
            class: FailureClass::Retryable,
            message,
            retry_after: None,
            pressure: Some(Pressure::Unavailable),
        })?;
        Ok(Delivered::Delivered)
    }

    fn digest(&self) -> Option<Arc<str>> {
        Some(self.runtime.digest())
    }
}
