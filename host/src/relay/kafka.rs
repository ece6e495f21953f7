//! Kafka: each record produced to the topic its destination names, with the record's key as
//! the Kafka key (the relay's `key`, by default the room: a room's events share a partition)
//! and its headers as record headers, with `outbox-dedup-id` set by the host. Delivered once
//! the partition leader acknowledged it with every in-sync replica (`acks=all`).
//!
//! The producer is idempotent: the broker drops a batch the client sends again after a lost
//! ack, and keeps a partition's records in the order they were produced, which is what a
//! room's pipelined events rely on. An event delivered again after its ack was lost to the
//! host (a kill, a timeout) is a second record with the same `outbox-dedup-id`. The client
//! is librdkafka (decision 0210); it connects, reconnects and batches by itself. It may not
//! create topics by producing to them (`allow.auto.create.topics=false`): a relay reaches
//! only topics that exist.

use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};

use super::confine::Destinations;
use super::settings::{BrokerConfig, BrokerKind};
use super::{Acks, Publish, PublishError, START_TIMEOUT, Unreachable, dedup_id};
use crate::sandbox::relay::Record;

/// The header that carries a record's dedup id (the event's id, with the record's index
/// when an event makes several).
pub const DEDUP_HEADER: &str = "outbox-dedup-id";

/// How long the client keeps trying to deliver a record before it gives up on it (the
/// event is then retried, as after any lost ack).
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long what the client said about its connections explains a failure: an older
/// reason would name a trouble that has passed.
const HEARD_FOR: Duration = Duration::from_secs(30);

/// What the client said last about its connections: librdkafka reports a broker it cannot
/// reach, or that refuses its credentials, through this callback, not through a call.
#[derive(Clone, Default)]
struct Heard {
    broker: String,
    last: Arc<Mutex<Option<(Instant, RDKafkaErrorCode, String)>>>,
}

impl Heard {
    /// What the client said last, if it said it within [`HEARD_FOR`].
    fn last(&self) -> Option<(RDKafkaErrorCode, String)> {
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        last.as_ref().filter(|(at, ..)| at.elapsed() < HEARD_FOR).map(|(_, code, reason)| (*code, reason.clone()))
    }
}

impl ClientContext for Heard {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        let message = crate::text::printable(message, 300);
        match level {
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error => {
                tracing::warn!(broker = %self.broker, facility, message = %message, "the Kafka client says")
            }
            _ => tracing::debug!(broker = %self.broker, facility, message = %message, "the Kafka client says"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let code = error.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail);
        let reason = crate::text::printable(reason, 300);
        tracing::debug!(broker = %self.broker, error = %reason, "the Kafka client lost or could not make a connection");
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), code, reason));
    }
}

type Producer = FutureProducer<Heard>;

/// A Kafka producer, idempotent, on the cluster `bootstrap` names.
pub struct KafkaPublisher {
    name: String,
    topic: String,
    settings: ClientConfig,
    heard: Heard,
    /// Replaced when the client reports a fatal error (an idempotent producer that lost its
    /// sequence), after which it produces nothing.
    producer: RwLock<Producer>,
    destinations: Destinations,
}

/// The client's settings for `config`: idempotent, `acks=all`, Java's partitioner (a key's
/// partition is the one Java clients choose), no topic created by producing, TLS and SASL
/// as the entry says.
fn client_settings(config: &BrokerConfig) -> ClientConfig {
    let mut settings = ClientConfig::new();
    settings
        .set("bootstrap.servers", config.bootstrap.join(","))
        .set("client.id", "outbox-host")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("allow.auto.create.topics", "false")
        .set("message.timeout.ms", MESSAGE_TIMEOUT.as_millis().to_string())
        // A topic missing from the cluster's metadata is unknown at once, not after 30 s.
        .set("topic.metadata.propagation.max.ms", "1000")
        .set("reconnect.backoff.max.ms", "1000")
        .set("log.connection.close", "false");
    let sasl = config.user.is_some();
    let protocol = match (config.tls, sasl) {
        (false, false) => "plaintext",
        (true, false) => "ssl",
        (false, true) => "sasl_plaintext",
        (true, true) => "sasl_ssl",
    };
    settings.set("security.protocol", protocol);
    if let Some(ca) = &config.ca_file {
        settings.set("ssl.ca.location", ca.display().to_string());
    }
    if let (Some(user), Some(password)) = (&config.user, &config.password) {
        settings
            .set("sasl.mechanism", &config.sasl_mechanism)
            .set("sasl.username", user)
            .set("sasl.password", password);
    }
    settings
}

/// Whether `code`, which the client reported while it could not answer, says the cluster
/// could not be reached (rather than refused the host: credentials, TLS).
fn is_unreachable_code(code: RDKafkaErrorCode) -> bool {
    !matches!(
        code,
        RDKafkaErrorCode::Authentication
            | RDKafkaErrorCode::SaslAuthenticationFailed
            | RDKafkaErrorCode::SSL
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::TopicAuthorizationFailed
    )
}

impl KafkaPublisher {
    /// Makes the producer and finds the topic (creating it when `create_topic` says so); a
    /// cluster that cannot be reached is an [`Unreachable`] error, one that refuses the
    /// credentials or has no such topic an error naming the broker.
    pub async fn connect(config: &BrokerConfig) -> anyhow::Result<KafkaPublisher> {
        let name = &config.name;
        let settings = client_settings(config);
        let heard = Heard { broker: name.clone(), ..Heard::default() };
        let producer: Producer = settings
            .create_with_context(heard.clone())
            .map_err(|e| anyhow::anyhow!("broker {name}: the Kafka client refuses its settings: {e}"))?;
        let exists = match topic_state(&producer, &config.topic, START_TIMEOUT).await {
            Ok(exists) => exists,
            Err(e) => {
                let said = format!("broker {name}: cannot reach {}: {}", config.url, heard_or(&heard, &e));
                let reachable_but_refused = heard.last().is_some_and(|(code, _)| !is_unreachable_code(code));
                return Err(if reachable_but_refused { anyhow::anyhow!(said) } else { Unreachable(said).into() });
            }
        };
        if !exists {
            if !config.create_topic {
                anyhow::bail!(
                    "broker {name}: topic {} does not exist (set create_topic: true, or create it)",
                    config.topic
                );
            }
            create_topic(&settings, &heard, config).await?;
        }
        let destinations = Destinations::of(config, vec![config.topic.clone()]);
        tracing::info!(broker = %name, topic = %config.topic, allowed_destinations = ?destinations.patterns(), "relaying to Kafka");
        Ok(KafkaPublisher {
            name: name.clone(),
            topic: config.topic.clone(),
            settings,
            heard,
            producer: RwLock::new(producer),
            destinations,
        })
    }

    /// The producer, made anew when the one in use has failed for good.
    fn producer(&self) -> Result<Producer, PublishError> {
        let current = self.producer.read().unwrap_or_else(PoisonError::into_inner).clone();
        let Some((code, why)) = current.client().fatal_error() else { return Ok(current) };
        let mut slot = self.producer.write().unwrap_or_else(PoisonError::into_inner);
        if slot.client().fatal_error().is_some() {
            tracing::warn!(broker = %self.name, error = ?code, reason = %why, "the Kafka producer failed for good; making a new one");
            *slot = self
                .settings
                .create_with_context(self.heard.clone())
                .map_err(|e| PublishError::Unavailable(format!("a new producer: {e}")))?;
        }
        Ok(slot.clone())
    }
}

/// `error`, with what the client said last about its connections when that says more.
fn heard_or(heard: &Heard, error: &KafkaError) -> String {
    match heard.last() {
        Some((_, reason)) => format!("{error} ({reason})"),
        None => error.to_string(),
    }
}

/// Whether `topic` exists, by the cluster's metadata, asked within `timeout`.
async fn topic_state(producer: &Producer, topic: &str, timeout: Duration) -> Result<bool, KafkaError> {
    let producer = producer.clone();
    let topic = topic.to_string();
    // The client's metadata call blocks its thread until the answer or the timeout.
    let asked = tokio::task::spawn_blocking(move || {
        let metadata = producer.client().fetch_metadata(Some(&topic), timeout)?;
        Ok(metadata.topics().iter().any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty()))
    });
    asked.await.unwrap_or(Err(KafkaError::MetadataFetch(RDKafkaErrorCode::Fail)))
}

/// Creates `config.topic` with `config.partitions` partitions, replicated as the cluster's
/// default says; one another host created meanwhile is as good.
async fn create_topic(settings: &ClientConfig, heard: &Heard, config: &BrokerConfig) -> anyhow::Result<()> {
    let name = &config.name;
    let admin: AdminClient<Heard> = settings
        .create_with_context(heard.clone())
        .map_err(|e| anyhow::anyhow!("broker {name}: the Kafka admin client refuses its settings: {e}"))?;
    let wanted = NewTopic::new(&config.topic, config.partitions as i32, TopicReplication::Fixed(-1));
    let options = AdminOptions::new().operation_timeout(Some(START_TIMEOUT)).request_timeout(Some(START_TIMEOUT));
    let answers = tokio::time::timeout(START_TIMEOUT, admin.create_topics([&wanted], &options))
        .await
        .map_err(|_| anyhow::anyhow!("broker {name}: no answer about topic {} within {START_TIMEOUT:?}", config.topic))?
        .map_err(|e| anyhow::anyhow!("broker {name}: topic {} could not be created ({e})", config.topic))?;
    for answer in answers {
        match answer {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => anyhow::bail!("broker {name}: topic {topic} could not be created ({code})"),
        }
    }
    tracing::info!(broker = %name, topic = %config.topic, partitions = config.partitions, "created the topic");
    Ok(())
}

/// What `error`, from producing to `topic`, means for the attempt: a refusal (no such topic,
/// too large, not authorized, an invalid record) counts it; anything else is the cluster away.
fn judged(error: &KafkaError, topic: &str) -> PublishError {
    use RDKafkaErrorCode as Code;
    match error.rdkafka_error_code() {
        Some(Code::UnknownTopicOrPartition | Code::UnknownTopic | Code::UnknownPartition | Code::InvalidTopic) => {
            PublishError::Refused(format!("topic {topic} does not exist ({error})"))
        }
        Some(Code::MessageSizeTooLarge | Code::InvalidMessageSize | Code::MessageBatchTooLarge) => {
            PublishError::Refused(format!("the record is too large for topic {topic} ({error})"))
        }
        Some(Code::TopicAuthorizationFailed | Code::ClusterAuthorizationFailed) => {
            PublishError::Refused(format!("not authorized to produce to topic {topic} ({error})"))
        }
        Some(Code::InvalidRecord | Code::InvalidMessage | Code::PolicyViolation) => {
            PublishError::Refused(format!("topic {topic} refused the record ({error})"))
        }
        _ => PublishError::Unavailable(format!("produce to {topic}: {error}")),
    }
}

#[async_trait::async_trait]
impl Publish for KafkaPublisher {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> BrokerKind {
        BrokerKind::Kafka
    }

    fn destinations(&self) -> &Destinations {
        &self.destinations
    }

    /// Asks the cluster for its topic's metadata (the client reconnects by itself).
    async fn probe(&self) -> Result<(), String> {
        let producer = self.producer().map_err(|e| match e {
            PublishError::Unavailable(m) | PublishError::Refused(m) => format!("broker {}: {m}", self.name),
        })?;
        match topic_state(&producer, &self.topic, super::PROBE_TIMEOUT - Duration::from_millis(500)).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!("broker {}: topic {} is gone", self.name, self.topic)),
            Err(e) => Err(format!("broker {}: {}", self.name, heard_or(&self.heard, &e))),
        }
    }

    /// Hands every record to the client in order (its queue is the wire: it sends a
    /// partition's records in the order they came); the acks are awaited together.
    async fn send(&self, event_id: &str, records: Vec<Record>) -> Result<Acks, PublishError> {
        let producer = self.producer()?;
        let count = records.len();
        let mut acks = Vec::with_capacity(count);
        for (i, record) in records.into_iter().enumerate() {
            let id = dedup_id(event_id, i, count);
            let mut headers = OwnedHeaders::new_with_capacity(record.headers.len() + 1);
            for (name, value) in &record.headers {
                if !name.eq_ignore_ascii_case(DEDUP_HEADER) {
                    headers = headers.insert(Header { key: name.as_str(), value: Some(value.as_bytes()) });
                }
            }
            headers = headers.insert(Header { key: DEDUP_HEADER, value: Some(id.as_bytes()) });
            let mut produced =
                FutureRecord::<[u8], [u8]>::to(&record.destination).payload(&record.payload[..]).headers(headers);
            if let Some(key) = &record.key {
                produced = produced.key(key.as_bytes());
            }
            let ack = producer.send_result(produced).map_err(|(e, _)| judged(&e, &record.destination))?;
            acks.push((ack, record.destination));
        }
        Ok(Box::pin(async move {
            for (ack, topic) in acks {
                match ack.await {
                    Ok(Ok(_)) => {}
                    Ok(Err((e, _))) => return Err(judged(&e, &topic)),
                    Err(_) => {
                        return Err(PublishError::Unavailable(format!("the client dropped a record for {topic}")));
                    }
                }
            }
            // The broker's dedup of a batch sent again is invisible to the client.
            Ok(0)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_client_said_explains_failures_only_while_it_is_recent() {
        let heard = Heard { broker: "log".into(), ..Heard::default() };
        assert_eq!(heard.last(), None, "nothing said yet");
        heard.error(KafkaError::Global(RDKafkaErrorCode::AllBrokersDown), "127.0.0.1:9/bootstrap: Connect failed");
        assert_eq!(
            heard.last(),
            Some((RDKafkaErrorCode::AllBrokersDown, "127.0.0.1:9/bootstrap: Connect failed".to_string()))
        );
        let error = KafkaError::MetadataFetch(RDKafkaErrorCode::OperationTimedOut);
        assert!(heard_or(&heard, &error).ends_with("(127.0.0.1:9/bootstrap: Connect failed)"));

        let long_ago = Instant::now().checked_sub(HEARD_FOR + Duration::from_secs(1)).expect("the clock is past it");
        heard.last.lock().unwrap().as_mut().expect("said").0 = long_ago;
        assert_eq!(heard.last(), None, "a reason older than {HEARD_FOR:?} explains nothing now");
        assert_eq!(heard_or(&heard, &error), error.to_string());
    }
}
