//! NATS JetStream: each record published with `Nats-Msg-Id` set to the event's id (with the
//! record's index when an event makes several), so that the stream keeps one message per
//! record however often the event is delivered within the stream's duplicate window. An
//! event's records are sent at once and their acks awaited together.

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::{self, stream};
use async_nats::{ConnectErrorKind, HeaderMap};

use super::confine::Destinations;
use super::settings::{BrokerConfig, BrokerKind};
use super::{Acks, Publish, PublishError, START_TIMEOUT, dedup_id};
use crate::sandbox::relay::Record;

/// A JetStream publisher on one connection.
pub struct NatsPublisher {
    name: String,
    client: async_nats::Client,
    jetstream: jetstream::Context,
    destinations: Destinations,
}

impl NatsPublisher {
    /// Connects and finds the stream (creating it when `create_stream` says so); an
    /// unreachable broker or a missing stream is an error naming the broker.
    pub async fn connect(config: &BrokerConfig) -> anyhow::Result<NatsPublisher> {
        let name = &config.name;
        let mut options = async_nats::ConnectOptions::new().connection_timeout(START_TIMEOUT);
        if let Some(token) = &config.token {
            options = options.token(token.clone());
        }
        if let (Some(user), Some(password)) = (&config.user, &config.password) {
            options = options.user_and_password(user.clone(), password.clone());
        }
        let url = crate::redact::url(&config.url);
        let client = super::reach(name, &url, options.connect(config.url.as_str()), |e| {
            matches!(e.kind(), ConnectErrorKind::Io | ConnectErrorKind::TimedOut | ConnectErrorKind::Dns)
        })
        .await?;
        let jetstream = jetstream::new(client.clone());
        let stream = if config.create_stream {
            let wanted =
                stream::Config { name: config.stream.clone(), subjects: config.subjects.clone(), ..Default::default() };
            tokio::time::timeout(START_TIMEOUT, jetstream.get_or_create_stream(wanted))
                .await
                .map(|r| r.map_err(|e| e.to_string()))
        } else {
            tokio::time::timeout(START_TIMEOUT, jetstream.get_stream(&config.stream))
                .await
                .map(|r| r.map_err(|e| e.to_string()))
        };
        let stream = stream
            .map_err(|_| {
                anyhow::anyhow!("broker {name}: no answer about stream {} within {START_TIMEOUT:?}", config.stream)
            })?
            .map_err(|e| {
                anyhow::anyhow!(
                    "broker {name}: stream {} {} ({e})",
                    config.stream,
                    if config.create_stream {
                        "could not be created"
                    } else {
                        "does not exist (set create_stream: true, or create it)"
                    }
                )
            })?;
        // By default, a relay publishes into the stream's own subjects.
        let destinations = Destinations::of(config, stream.cached_info().config.subjects.clone());
        tracing::info!(broker = %name, stream = %config.stream, subjects = ?stream.cached_info().config.subjects, allowed_destinations = ?destinations.patterns(), "relaying to NATS JetStream");
        Ok(NatsPublisher { name: name.clone(), client, jetstream, destinations })
    }
}

#[async_trait::async_trait]
impl Publish for NatsPublisher {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> BrokerKind {
        BrokerKind::Nats
    }

    fn destinations(&self) -> &Destinations {
        &self.destinations
    }

    /// The client's own view: it reconnects by itself.
    async fn probe(&self) -> Result<(), String> {
        match self.client.connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            state => Err(format!("broker {}: not connected ({state:?})", self.name)),
        }
    }

    /// Sends every record at once; the acks are awaited together.
    async fn send(&self, event_id: &str, records: Vec<Record>) -> Result<Acks, PublishError> {
        let count = records.len();
        let mut acks = Vec::with_capacity(count);
        for (i, record) in records.into_iter().enumerate() {
            let mut headers = HeaderMap::new();
            for (name, value) in &record.headers {
                if !name.eq_ignore_ascii_case("Nats-Msg-Id") {
                    headers.insert(name.as_str(), value.as_str());
                }
            }
            headers.insert("Nats-Msg-Id", dedup_id(event_id, i, count).as_str());
            let sent = self
                .jetstream
                .publish_with_headers(record.destination.clone(), headers, record.payload.into())
                .await
                .map_err(|e| PublishError::Unavailable(format!("publish to {}: {e}", record.destination)))?;
            acks.push((sent, record.destination));
        }
        Ok(Box::pin(async move {
            let mut duplicates = 0;
            for (ack, destination) in acks {
                let ack = ack.into_future().await.map_err(|e| match e.kind() {
                    // No stream takes the subject: the server answered, and will answer so
                    // again until a stream covers it.
                    PublishErrorKind::StreamNotFound => {
                        PublishError::Refused(format!("no stream takes subject {destination} (no responders)"))
                    }
                    _ => PublishError::Unavailable(e.to_string()),
                })?;
                duplicates += u64::from(ack.duplicate);
            }
            Ok(duplicates)
        }))
    }
}
