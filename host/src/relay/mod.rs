//! Relaying into a distributed log: a relay component (`sandbox::relay`) maps each event to
//! records, and the host publishes them to a broker of `brokers:` and waits for its acks.
//! Delivered means the broker acknowledged every record of the event. A broker that cannot
//! take a record (down, unreachable, no ack in time) is push-back: the event is deferred,
//! no attempt is burned, and the sink's breaker pauses it while the broker stays away. A
//! broker that answers but refuses a record (RabbitMQ returning it as unroutable, a Redis
//! key of another type, a Kafka topic that does not exist) fails the attempt, which is
//! retried and counted as any other.

pub mod confine;
pub mod kafka;
pub mod mqtt;
pub mod nats;
pub mod rabbitmq;
pub mod redis;
pub mod settings;
pub mod waiting;

use std::sync::Arc;
use std::time::Duration;

use crate::ops::metrics::{BrokerMetrics, Metrics};
use crate::sandbox::relay::{Record, RelayRuntime};
use crate::sandbox::{AttemptFailure, Deliver, Delivered, Event, FailureClass, Pressure, Turn};
use confine::Destinations;
use settings::{BrokerConfig, BrokerKind};

/// Why a broker did not take an event's records.
#[derive(Debug)]
pub enum PublishError {
    /// Down, unreachable, or no ack in time: push-back, no attempt burned.
    Unavailable(String),
    /// It answered and refused a record: the attempt fails.
    Refused(String),
}

/// The broker's acks of records already on the wire: how many of them it said it already
/// had (its dedup dropped them).
pub type Acks = std::pin::Pin<Box<dyn std::future::Future<Output = Result<u64, PublishError>> + Send>>;

/// A broker connection that puts an event's records on the wire and hands back the wait for
/// their acks. What is common to every broker (the deadline, the room's turn, the broker's
/// name in every message) is [`publish_in_turn`]'s.
#[async_trait::async_trait]
pub trait Publish: Send + Sync {
    /// The broker's name in `brokers:`.
    fn name(&self) -> &str;

    /// Which kind of broker it is.
    fn kind(&self) -> BrokerKind;

    /// Where its relays may publish.
    fn destinations(&self) -> &Destinations;

    /// Whether the broker has been reached since start (see [`waiting`]): until it has, its
    /// default destinations are not known and nothing is published.
    fn connected(&self) -> bool {
        true
    }

    /// Whether the broker can be reached now, without publishing (connecting again when the
    /// connection has gone); `Err` says why not, short and secret-free.
    async fn probe(&self) -> Result<(), String>;

    /// Puts `records` of event `event_id` on the wire, in order, in the connection's order
    /// (the room's next event may be sent as soon as this returns), and returns the wait for
    /// their acks. Messages are short and secret-free, without the broker's name.
    async fn send(&self, event_id: &str, records: Vec<Record>) -> Result<Acks, PublishError>;
}

/// Publishes `records` of event `event_id` through `publisher` by `deadline`: sends them,
/// lets the room's next event follow (`turn`), and awaits the acks. Returns how many records
/// the broker already had; every error names the broker.
pub async fn publish_in_turn(
    publisher: &dyn Publish,
    event_id: &str,
    records: Vec<Record>,
    deadline: tokio::time::Instant,
    turn: &mut Turn,
) -> Result<u64, PublishError> {
    let broker = publisher.name();
    let named = |e: PublishError| match e {
        PublishError::Unavailable(m) => PublishError::Unavailable(format!("broker {broker}: {m}")),
        PublishError::Refused(m) => PublishError::Refused(format!("broker {broker}: {m}")),
    };
    let budget = deadline.saturating_duration_since(tokio::time::Instant::now());
    let records = with_creation_context(records);
    let acks = tokio::time::timeout_at(deadline, publisher.send(event_id, records))
        .await
        .map_err(|_| PublishError::Unavailable(format!("broker {broker}: not sent within {budget:?}")))?
        .map_err(named)?;
    turn.sent();
    tokio::time::timeout_at(deadline, acks)
        .await
        .map_err(|_| PublishError::Unavailable(format!("broker {broker}: no ack within {budget:?}")))?
        .map_err(named)
}

/// `records` carrying the event's creation context (`traceparent`, `tracestate`) as the
/// messaging conventions ask, in place of any the relay set, while the attempt is traced.
fn with_creation_context(mut records: Vec<Record>) -> Vec<Record> {
    let Some(attempt) = crate::ops::traces::current() else { return records };
    let context = attempt.creation_headers();
    if context.is_empty() {
        return records;
    }
    for record in &mut records {
        record
            .headers
            .retain(|(name, _)| !name.eq_ignore_ascii_case("traceparent") && !name.eq_ignore_ascii_case("tracestate"));
        record.headers.extend(context.iter().cloned());
    }
    records
}

/// Connecting to broker `name` (at `shown`, redacted) within [`START_TIMEOUT`]: no answer in
/// time, or an error that `unreachable` says is one of reaching it, is [`Unreachable`]
/// (worth waiting for); any other error is a refusal. Every message names the broker.
pub(crate) async fn reach<T, E: std::fmt::Display>(
    name: &str,
    shown: &str,
    connecting: impl std::future::Future<Output = Result<T, E>>,
    unreachable: impl FnOnce(&E) -> bool,
) -> anyhow::Result<T> {
    match tokio::time::timeout(START_TIMEOUT, connecting).await {
        Err(_) => Err(Unreachable(format!("broker {name}: no answer from {shown} within {START_TIMEOUT:?}")).into()),
        Ok(Ok(reached)) => Ok(reached),
        Ok(Err(e)) => {
            let said = format!("broker {name}: cannot connect to {shown}: {e}");
            Err(if unreachable(&e) { Unreachable(said).into() } else { anyhow::anyhow!(said) })
        }
    }
}

/// A broker that did not answer at all (connection refused, no route, no answer in time),
/// as opposed to one that answered and refused (credentials, a missing stream): the first
/// is worth waiting for.
#[derive(Debug)]
pub struct Unreachable(pub String);

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unreachable {}

/// Whether `error` says the broker could not be reached (see [`Unreachable`]).
pub fn is_unreachable(error: &anyhow::Error) -> bool {
    error.chain().any(|e| e.is::<Unreachable>())
}

/// Connects to `broker` and checks what it needs there (a stream, an exchange); an
/// unreachable broker (an [`Unreachable`] error) or a missing stream or exchange is an
/// error naming the broker.
pub async fn connect(broker: &BrokerConfig) -> anyhow::Result<Arc<dyn Publish>> {
    Ok(match broker.kind {
        BrokerKind::Nats => Arc::new(nats::NatsPublisher::connect(broker).await?),
        BrokerKind::Redis => Arc::new(redis::RedisPublisher::connect(broker).await?),
        BrokerKind::Rabbitmq => Arc::new(rabbitmq::RabbitPublisher::connect(broker).await?),
        BrokerKind::Mqtt => Arc::new(mqtt::MqttPublisher::connect(broker).await?),
        BrokerKind::Kafka => Arc::new(kafka::KafkaPublisher::connect(broker).await?),
    })
}

/// [`connect`], but a broker that cannot be reached now is waited for: the publisher
/// returned connects in the background and defers every event until it has (see
/// [`waiting`]). A broker that answers and refuses (credentials, a missing stream or
/// exchange) is still an error.
pub async fn connect_waiting(broker: &BrokerConfig) -> anyhow::Result<Arc<dyn Publish>> {
    match connect(broker).await {
        Ok(publisher) => Ok(publisher),
        Err(e) if is_unreachable(&e) => {
            let error = format!("{e:#}");
            tracing::warn!(broker = %broker.name, error = %error, retry_every_ms = waiting::RETRY_EVERY.as_millis() as u64, "the broker cannot be reached at start-up; its relays wait for it");
            Ok(waiting::Waiting::start(broker, error))
        }
        Err(e) => Err(e),
    }
}

/// The dedup id of record `index` of `count` an event makes: the event id, with the
/// record's index when there are several.
pub fn dedup_id(event_id: &str, index: usize, count: usize) -> String {
    if count == 1 { event_id.to_string() } else { format!("{event_id}:{index}") }
}

/// How long connecting and the checks at start may take.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a relay asks its broker whether it can be reached, publishing or not: what
/// readiness and the page say of a broker is at most this old (or one probe's timeout).
pub const PROBE_EVERY: Duration = Duration::from_secs(2);
/// How long a probe may take before the broker counts as unreachable.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// A sink that relays: the mapping in WebAssembly, the publishing in the host.
pub struct RelaySink {
    runtime: RelayRuntime,
    publisher: Arc<dyn Publish>,
    metrics: BrokerMetrics,
    room_pipeline: u32,
    /// When a probe last found the broker reachable.
    answered: tokio::sync::watch::Receiver<Option<std::time::Instant>>,
    prober: tokio::task::JoinHandle<()>,
}

impl Drop for RelaySink {
    fn drop(&mut self) {
        self.prober.abort();
    }
}

impl RelaySink {
    /// The relay `runtime` publishing through `publisher`, recording into `metrics` under
    /// the broker's name, and probing the broker every [`PROBE_EVERY`] while it lives.
    /// `room_pipeline` of a room's events may be in flight at once.
    pub fn new(runtime: RelayRuntime, publisher: Arc<dyn Publish>, metrics: &Metrics, room_pipeline: u32) -> RelaySink {
        let metrics = metrics.broker(publisher.name(), publisher.kind().name());
        let (answers, answered) = tokio::sync::watch::channel(None);
        let prober = tokio::spawn(probe(Arc::downgrade(&publisher), metrics.clone(), answers));
        RelaySink { runtime, publisher, metrics, room_pipeline: room_pipeline.max(1), answered, prober }
    }
}

/// Asks the broker whether it can be reached every [`PROBE_EVERY`], until the publisher is
/// dropped; says into `answers` when it last could.
async fn probe(
    publisher: std::sync::Weak<dyn Publish>,
    metrics: BrokerMetrics,
    answers: tokio::sync::watch::Sender<Option<std::time::Instant>>,
) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(publisher) = publisher.upgrade() else { return };
        let answer = tokio::time::timeout(PROBE_TIMEOUT, publisher.probe()).await;
        let answer =
            answer.unwrap_or_else(|_| Err(format!("broker {}: no answer within {PROBE_TIMEOUT:?}", publisher.name())));
        metrics.reached(answer.as_ref().map(drop).map_err(String::as_str));
        if answer.is_ok() {
            answers.send_replace(Some(std::time::Instant::now()));
        }
    }
}

#[async_trait::async_trait]
impl Deliver for RelaySink {
    fn name(&self) -> &str {
        self.runtime.name()
    }

    async fn deliver(&self, event: &Event, timeout: Duration) -> Result<Delivered, AttemptFailure> {
        self.deliver_in_turn(event, timeout, Turn::default()).await
    }

    fn room_pipeline(&self) -> u32 {
        self.room_pipeline
    }

    fn messaging(&self) -> crate::ops::traces::Messaging<'_> {
        let system = self.publisher.kind().name();
        crate::ops::traces::Messaging { operation: "publish", system, destination: self.publisher.name() }
    }

    /// Routes the event (while the room's earlier events may still be routing or awaiting
    /// their acks), waits for its turn, publishes, and waits for the broker's acks.
    async fn deliver_in_turn(
        &self,
        event: &Event,
        timeout: Duration,
        mut turn: Turn,
    ) -> Result<Delivered, AttemptFailure> {
        let deadline = tokio::time::Instant::now() + timeout;
        let broker = self.publisher.name();
        let away = |message: String| AttemptFailure {
            class: FailureClass::Retryable,
            message,
            retry_after: None,
            pressure: Some(Pressure::Unavailable),
        };
        if !self.publisher.connected() {
            // Not reached since start: nothing to publish to, and its default destinations
            // are not known yet.
            return Err(away(format!("broker {broker}: not reached since start")));
        }
        let records = self.runtime.route(event, timeout).await?;
        // Confined before anything is published: the same event routes the same way again,
        // so a destination outside the broker's patterns fails it for good.
        for record in &records {
            self.publisher.destinations().admit(&record.destination).map_err(AttemptFailure::permanent)?;
        }
        let count = records.len() as i64;
        let in_line = tokio::time::timeout_at(deadline, turn.wait()).await;
        if !matches!(in_line, Ok(true)) {
            // Publishing now would put this event ahead of an earlier one of its room: the
            // room is deferred (no attempt counted), the broker is not judged by it.
            return Err(AttemptFailure {
                class: FailureClass::Retryable,
                message: format!("broker {broker}: an earlier event of room {} was not published", event.room_id),
                retry_after: None,
                pressure: Some(Pressure::RoomThrottled),
            });
        }
        if records.is_empty() {
            turn.sent();
            return Ok(Delivered::Skipped("not for this relay".to_string()));
        }
        let started = std::time::Instant::now();
        self.metrics.in_flight(count);
        let published = publish_in_turn(self.publisher.as_ref(), &event.event_id, records, deadline, &mut turn).await;
        self.metrics.in_flight(-count);
        let took = started.elapsed();
        match published {
            Ok(duplicates) => {
                self.metrics.published(took, Ok(duplicates));
                self.metrics.reached(Ok(()));
            }
            Err(PublishError::Unavailable(message)) => {
                self.metrics.published(took, Err("unavailable"));
                self.metrics.reached(Err(&message));
                return Err(away(message));
            }
            Err(PublishError::Refused(message)) => {
                self.metrics.published(took, Err("refused"));
                self.metrics.reached(Ok(()));
                return Err(AttemptFailure {
                    class: FailureClass::Retryable,
                    message,
                    retry_after: None,
                    pressure: None,
                });
            }
        }
        Ok(Delivered::Delivered)
    }

    fn digest(&self) -> Option<Arc<str>> {
        Some(self.runtime.digest())
    }

    /// A probe answered after `since`: the broker is back (the breaker's cool-down may end).
    async fn reached_since(&self, since: std::time::Instant) {
        let mut answered = self.answered.clone();
        if answered.wait_for(|at| at.is_some_and(|at| at > since)).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A broker whose sends go on the wire at once and whose acks come when `ack` says.
    struct Acking {
        destinations: Destinations,
        acks: std::sync::Mutex<Vec<tokio::sync::oneshot::Receiver<Result<u64, PublishError>>>>,
    }

    #[async_trait::async_trait]
    impl Publish for Acking {
        fn name(&self) -> &str {
            "events"
        }
        fn kind(&self) -> BrokerKind {
            BrokerKind::Nats
        }
        fn destinations(&self) -> &Destinations {
            &self.destinations
        }
        async fn probe(&self) -> Result<(), String> {
            Ok(())
        }
        async fn send(&self, _: &str, _: Vec<Record>) -> Result<Acks, PublishError> {
            let ack = self.acks.lock().unwrap().pop().expect("an ack for each send");
            Ok(Box::pin(async move { ack.await.unwrap_or(Err(PublishError::Unavailable("dropped".into()))) }))
        }
    }

    fn acking(n: usize) -> (Acking, Vec<tokio::sync::oneshot::Sender<Result<u64, PublishError>>>) {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..n).map(|_| tokio::sync::oneshot::channel()).unzip();
        let config = BrokerConfig::new("events", BrokerKind::Nats, "nats://127.0.0.1:4222");
        (Acking { destinations: Destinations::of(&config, vec![">".into()]), acks: receivers.into() }, senders)
    }

    /// The room's next event may be sent once this one is on the wire, before its acks; the
    /// acks decide the outcome; every error names the broker, and a missing ack ends at the
    /// deadline.
    #[tokio::test]
    async fn the_next_event_follows_the_send_and_the_acks_decide_naming_the_broker() {
        let (broker, mut acks) = acking(2);
        let (mut first, after_first) = Turn::after(None);
        let (mut second, _) = Turn::after(Some(after_first));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let publishing = publish_in_turn(&broker, "e1", Vec::new(), deadline, &mut first);
        tokio::pin!(publishing);
        tokio::select! {
            _ = &mut publishing => panic!("published before its ack"),
            went = second.wait() => assert!(went, "the next event waits for the send only"),
        }
        acks.pop().unwrap().send(Err(PublishError::Refused("nope".into()))).unwrap();
        match publishing.await {
            Err(PublishError::Refused(message)) => assert_eq!(message, "broker events: nope"),
            other => panic!("{other:?}"),
        }

        let (mut third, _) = Turn::after(None);
        let soon = tokio::time::Instant::now() + Duration::from_millis(50);
        match publish_in_turn(&broker, "e2", Vec::new(), soon, &mut third).await {
            Err(PublishError::Unavailable(message)) => {
                assert!(message.starts_with("broker events: no ack within"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }
}
