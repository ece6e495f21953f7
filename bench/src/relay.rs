//! What relaying costs, per broker (a `nats-server -js`, a `redis-server` or a tansu (Kafka)
//! of the run's own, an exchange of the machine's RabbitMQ): the broker's own floor (this process publishing
//! the same records with the host's publisher, acks awaited with as many in flight as the
//! host's concurrency), the host draining the table into it through the default relay
//! (`plugins/relay`, WebAssembly) and through the same mapping written natively, the two
//! mappings alone, and insert-to-ack latency under a steady producer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::ensure;
use outbox_host::config::{Config, WorkerConfig};
use outbox_host::ops::metrics::Metrics;
use outbox_host::relay::{Publish, publish_in_turn, settings::BrokerConfig, settings::BrokerKind};
use outbox_host::sandbox::relay::{Record, RelayRuntime};
use outbox_host::sandbox::{AttemptFailure, Deliver, Delivered, Event, FailureClass, Turn};
use outbox_test_support::brokers::{Broker, BrokerServer};
use prost::Message as _;
use serde_json::{Value, json};

use crate::db::Db;

const STREAM: &str = "BENCH";
const KAFKA_TOPIC: &str = "rooms";
const KAFKA_PARTITIONS: u32 = 4;

/// The most events the mapping-alone figure routes (enough for a steady µs per event).
pub const MAPPING_EVENTS: usize = 20_000;

/// The record the default relay makes of `event` with `format: protobuf` and `destination`
/// (a template naming `{room_id}` only): the same destination, key, headers and payload.
fn native_record(event: &Event, destination: &str) -> Record {
    let payload = outbox_proto::EventEnvelope {
        app_code: event.app_code.clone(),
        event_id: event.event_id.clone(),
        room_id: event.room_id.clone(),
        event_type: event.event_type.clone(),
        room_version: event.room_version,
        occurred_at_ms: event.occurred_at_ms,
        body: event.body.clone(),
    }
    .encode_to_vec();
    Record {
        destination: destination.replace("{room_id}", &event.room_id),
        key: Some(event.room_id.clone()),
        headers: vec![
            ("outbox-event-id".into(), event.event_id.clone()),
            ("outbox-event-type".into(), event.event_type.clone()),
            ("outbox-app-code".into(), event.app_code.clone()),
            ("outbox-room-id".into(), event.room_id.clone()),
            ("outbox-room-version".into(), event.room_version.to_string()),
            ("outbox-occurred-at-ms".into(), event.occurred_at_ms.to_string()),
            ("content-type".into(), "application/x-protobuf".into()),
        ],
        payload,
    }
}

/// The event a sink is handed for `row`.
fn event_of(row: &outbox_host::store::NewEvent) -> anyhow::Result<Event> {
    outbox_host::envelope::first_attempt(row).map_err(anyhow::Error::msg)
}

/// The relay with its mapping written in Rust: what the WebAssembly mapping costs on top.
struct NativeRelay {
    publisher: Arc<dyn Publish>,
    destination: &'static str,
}

#[async_trait::async_trait]
impl Deliver for NativeRelay {
    fn name(&self) -> &str {
        "native-relay"
    }

    async fn deliver(&self, event: &Event, timeout: Duration) -> Result<Delivered, AttemptFailure> {
        self.deliver_in_turn(event, timeout, Turn::default()).await
    }

    fn room_pipeline(&self) -> u32 {
        outbox_host::relay::settings::DEFAULT_ROOM_PIPELINE
    }

    /// As the WebAssembly relay does: map, wait for the room's turn, publish.
    async fn deliver_in_turn(
        &self,
        event: &Event,
        timeout: Duration,
        mut turn: Turn,
    ) -> Result<Delivered, AttemptFailure> {
        let record = native_record(event, self.destination);
        let failed = |message: String| AttemptFailure {
            class: FailureClass::Retryable,
            message,
            retry_after: None,
            pressure: None,
        };
        if !turn.wait().await {
            return Err(failed("an earlier event of the room was not published".into()));
        }
        let deadline = tokio::time::Instant::now() + timeout;
        publish_in_turn(self.publisher.as_ref(), &event.event_id, vec![record], deadline, &mut turn)
            .await
            .map_err(|e| failed(format!("{e:?}")))?;
        Ok(Delivered::Delivered)
    }
}

/// A broker of the run's own: a `nats-server -js` or a `redis-server` started for it, or an
/// exchange of the machine's RabbitMQ with an exclusive queue bound to every room.
pub enum Target {
    Nats(BrokerServer),
    Redis(BrokerServer),
    /// A tansu with topic `rooms` of 4 partitions, which the host creates.
    Kafka(BrokerServer),
    Rabbitmq {
        connection: lapin::Connection,
        exchange: String,
        queue: String,
    },
}

/// The machine's RabbitMQ.
const RABBITMQ: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

impl Target {
    /// A fresh broker of `kind`, holding nothing.
    pub async fn start(kind: BrokerKind) -> anyhow::Result<Target> {
        use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
        use lapin::types::FieldTable;
        Ok(match kind {
            BrokerKind::Nats => Target::Nats(BrokerServer::of(Broker::Nats).await),
            BrokerKind::Redis => Target::Redis(BrokerServer::of(Broker::Redis).await),
            BrokerKind::Rabbitmq => {
                let connection = lapin::Connection::connect(RABBITMQ, lapin::ConnectionProperties::default()).await?;
                let channel = connection.create_channel().await?;
                let suffix = outbox_host::clock::random_u64() as u32;
                let (exchange, queue) = (format!("outbox-bench-{suffix:08x}"), format!("outbox-bench-{suffix:08x}"));
                let auto_delete = ExchangeDeclareOptions { auto_delete: true, ..ExchangeDeclareOptions::default() };
                channel
                    .exchange_declare(&exchange, lapin::ExchangeKind::Topic, auto_delete, FieldTable::default())
                    .await?;
                let exclusive = QueueDeclareOptions { exclusive: true, ..QueueDeclareOptions::default() };
                channel.queue_declare(&queue, exclusive, FieldTable::default()).await?;
                channel
                    .queue_bind(&queue, &exchange, "rooms.#", QueueBindOptions::default(), FieldTable::default())
                    .await?;
                Target::Rabbitmq { connection, exchange, queue }
            }
            BrokerKind::Kafka => Target::Kafka(BrokerServer::of(Broker::Kafka).await),
            BrokerKind::Mqtt => anyhow::bail!("the benchmark relays to nats, redis, rabbitmq and kafka"),
        })
    }

    fn kind(&self) -> BrokerKind {
        match self {
            Target::Nats(_) => BrokerKind::Nats,
            Target::Redis(_) => BrokerKind::Redis,
            Target::Kafka(_) => BrokerKind::Kafka,
            Target::Rabbitmq { .. } => BrokerKind::Rabbitmq,
        }
    }

    fn url(&self) -> String {
        match self {
            Target::Nats(server) | Target::Redis(server) => server.url(),
            Target::Kafka(server) => format!("kafka://{}", server.address()),
            Target::Rabbitmq { .. } => RABBITMQ.into(),
        }
    }

    /// The destination template of the relay: a subject or routing key per room, on Redis
    /// a stream per room, on Kafka one topic (the room is the key).
    pub fn destination(&self) -> &'static str {
        match self {
            Target::Redis(_) => "rooms:{room_id}",
            Target::Kafka(_) => KAFKA_TOPIC,
            _ => "rooms.{room_id}",
        }
    }

    /// The broker's entry in `brokers:`.
    fn broker(&self) -> BrokerConfig {
        let mut broker = BrokerConfig::new("bench", self.kind(), &self.url());
        match self {
            Target::Nats(_) => {
                broker.stream = STREAM.into();
                broker.create_stream = true;
                broker.subjects = vec!["rooms.>".into()];
            }
            Target::Redis(_) => broker.allowed_destinations = vec!["rooms:*".into()],
            Target::Kafka(server) => {
                broker.bootstrap = vec![server.address()];
                broker.topic = KAFKA_TOPIC.into();
                broker.create_topic = true;
                broker.partitions = KAFKA_PARTITIONS;
            }
            Target::Rabbitmq { exchange, .. } => broker.exchange = exchange.clone(),
        }
        broker
    }

    /// The same entry as YAML.
    fn yaml(&self) -> String {
        let extra = match self {
            Target::Nats(_) => format!(", stream: {STREAM}, create_stream: true, subjects: [\"rooms.>\"]"),
            Target::Redis(_) => ", allowed_destinations: [\"rooms:*\"]".to_string(),
            Target::Rabbitmq { exchange, .. } => format!(", exchange: {exchange}"),
            Target::Kafka(server) => {
                return format!(
                    "{{ kind: kafka, bootstrap: [\"{}\"], topic: {KAFKA_TOPIC}, create_topic: true, partitions: {KAFKA_PARTITIONS} }}",
                    server.address()
                );
            }
        };
        format!("{{ kind: {}, url: \"{}\"{extra} }}", self.kind().name(), self.url())
    }

    /// The messages the broker holds: the stream's, every room stream's, or the queue's.
    async fn messages(&self) -> anyhow::Result<u64> {
        match self {
            Target::Nats(server) => {
                let client = async_nats::connect(server.url()).await?;
                let mut stream = async_nats::jetstream::new(client).get_stream(STREAM).await?;
                Ok(stream.info().await?.state.messages)
            }
            Target::Redis(server) => {
                let mut connection = redis::Client::open(server.url())?.get_multiplexed_async_connection().await?;
                let count: u64 = redis::Script::new(
                    "local n = 0 for _, k in ipairs(redis.call('KEYS', 'rooms:*')) do n = n + redis.call('XLEN', k) end return n",
                )
                .invoke_async(&mut connection)
                .await?;
                Ok(count)
            }
            Target::Kafka(server) => {
                Ok(outbox_test_support::brokers::kafka_record_count(&server.address(), KAFKA_TOPIC).await)
            }
            Target::Rabbitmq { connection, queue, .. } => {
                let passive =
                    lapin::options::QueueDeclareOptions { passive: true, exclusive: true, ..Default::default() };
                let channel = connection.create_channel().await?;
                let queue = channel.queue_declare(queue, passive, lapin::types::FieldTable::default()).await?;
                Ok(u64::from(queue.message_count()))
            }
        }
    }
}

/// The WebAssembly relay (the default one, `format: protobuf`) on `db`, publishing to `target`.
async fn wasm_relay(db: &Db, target: &Target, cache: &std::path::Path) -> anyhow::Result<Arc<dyn Deliver>> {
    let config = relay_config(db, target, cache)?;
    outbox_host::app::load_sink(&config, &config.sinks[0], Arc::new(Metrics::new("relay"))).await
}

/// A host's config with the default relay (`format: protobuf`) as its sink.
fn relay_config(db: &Db, target: &Target, cache: &std::path::Path) -> anyhow::Result<Config> {
    let yaml = format!(
        "node_id: bench\ndatabase:\n  url: \"{}\"\nadmin:\n  listen: \"\"\n\
         brokers:\n  bench: {}\n\
         sink:\n  name: relay\n  plugin: {}\n  cache_dir: {}\n  broker: bench\n\
         \x20 config: {{ destination: \"{}\", format: protobuf }}\n",
        db.url(),
        target.yaml(),
        outbox_test_support::RELAY,
        cache.display(),
        target.destination(),
    );
    Ok(Config::from_yaml(&yaml, std::iter::empty(), &|_| None)?)
}

/// The mapping alone, one event after another with nothing else running: microseconds per
/// event through the WebAssembly relay (its instances kept, as in a drain) and natively.
/// What the drains' difference is made of, without the database's and the broker's noise.
async fn mapping_alone(db: &Db, target: &Target, cache: &std::path::Path, n: usize) -> anyhow::Result<(f64, f64)> {
    let config = relay_config(db, target, cache)?;
    let timeout = Duration::from_secs(10);
    let metrics = Arc::new(Metrics::new("relay"));
    let runtime = RelayRuntime::load_checked(&config.sinks[0].sandbox, 1, timeout, metrics).await?;
    let events: Vec<Event> = crate::events("mapping", n, 1_000).iter().map(event_of).collect::<Result<_, _>>()?;
    let per_event = |took: Duration| took.as_secs_f64() * 1e6 / n as f64;
    let started = Instant::now();
    for event in &events {
        let records = runtime.route(event, timeout).await.map_err(|e| anyhow::anyhow!("{e:?}"))?;
        ensure!(records.len() == 1, "the relay made {} records of one event", records.len());
    }
    let wasm = per_event(started.elapsed());
    let started = Instant::now();
    for event in &events {
        std::hint::black_box(native_record(event, target.destination()));
    }
    Ok((wasm, per_event(started.elapsed())))
}

/// The broker's floor: `n` records, as the relay makes them, published by this process with
/// `in_flight` acks outstanding at most; records per second.
async fn floor(target: &Target, n: usize, in_flight: usize) -> anyhow::Result<f64> {
    let publisher = outbox_host::relay::connect(&target.broker()).await?;
    let destination = target.destination();
    let events: Vec<Event> = crate::events("floor", n, 1_000).iter().map(event_of).collect::<Result<_, _>>()?;
    let started = Instant::now();
    let gate = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let mut tasks = tokio::task::JoinSet::new();
    for event in events {
        let (publisher, permit) = (publisher.clone(), gate.clone().acquire_owned().await?);
        tasks.spawn(async move {
            let _permit = permit;
            let record = native_record(&event, destination);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            publish_in_turn(publisher.as_ref(), &event.event_id, vec![record], deadline, &mut Turn::default()).await
        });
    }
    while let Some(done) = tasks.join_next().await {
        done?.map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    ensure!(target.messages().await? == n as u64, "the floor's broker does not hold {n} messages");
    Ok(rate)
}

/// The relay benchmark on `db`'s backend into a broker of `kind`, in `rounds` rounds: in
/// each, the floor, the drain through the WebAssembly relay and the one through the native
/// relay, one after the other, each checked (every row delivered, one message per event in
/// the broker), and the two mappings alone; then insert-to-ack latency at each of `rates`. The figures are the rounds'
/// medians, and each ratio the median of the rounds' own ratios: on a shared machine one
/// measurement can be a fifth off, and a round's three stand side by side.
pub async fn run(
    kind: BrokerKind,
    backend: outbox_host::store::Backend,
    (n, rounds): (usize, usize),
    rates: &[u32],
    seconds: u64,
    config: &WorkerConfig,
    cache: &std::path::Path,
) -> anyhow::Result<Value> {
    let mut measured = Vec::new();
    for _ in 0..rounds.max(1) {
        let floor_rate = floor(&Target::start(kind).await?, n, config.concurrency as usize).await?;

        let target = Target::start(kind).await?;
        let db = Db::fresh(backend).await?;
        let wasm = wasm_relay(&db, &target, cache).await?;
        let with_wasm = crate::drain(&db, n, 1, config, wasm.clone()).await?;
        ensure!(target.messages().await? == n as u64, "the WebAssembly relay's broker does not hold {n} messages");
        drop(target);

        let target = Target::start(kind).await?;
        let db = Db::fresh(backend).await?;
        let native = Arc::new(NativeRelay {
            publisher: outbox_host::relay::connect(&target.broker()).await?,
            destination: target.destination(),
        });
        let with_native = crate::drain(&db, n, 1, config, native.clone()).await?;
        ensure!(target.messages().await? == n as u64, "the native relay's broker does not hold {n} messages");
        let (route_wasm_us, route_native_us) = mapping_alone(&db, &target, cache, n.min(MAPPING_EVENTS)).await?;
        drop(target);
        measured.push(json!({
            "floor_per_s": floor_rate,
            "drain_wasm_per_s": with_wasm.per_second(),
            "drain_native_per_s": with_native.per_second(),
            "ratio_wasm_over_floor": with_wasm.per_second() / floor_rate,
            "mapping_cost": 1.0 - with_wasm.per_second() / with_native.per_second(),
            "route_wasm_us": route_wasm_us,
            "route_native_us": route_native_us,
            "cores_host": with_wasm.cores.host,
            "cores_server": with_wasm.cores.server,
        }));
    }

    let mut latencies = Vec::new();
    for rate in rates {
        let target = Target::start(kind).await?;
        let db = Db::fresh(backend).await?;
        let sink = wasm_relay(&db, &target, cache).await?;
        latencies.push(crate::latency(&db, *rate, seconds, sink).await?);
    }
    let mut out = json!({ "broker": kind.name(), "events": n, "rounds": measured.clone(), "latency": latencies });
    for figure in [
        "floor_per_s",
        "drain_wasm_per_s",
        "drain_native_per_s",
        "ratio_wasm_over_floor",
        "mapping_cost",
        "route_wasm_us",
        "route_native_us",
        "cores_host",
        "cores_server",
    ] {
        let mut values: Vec<f64> = measured.iter().filter_map(|m| m[figure].as_f64()).collect();
        values.sort_by(f64::total_cmp);
        out[figure] = json!(crate::percentile(&values, 50.0));
        out[format!("{figure}_range")] = json!([values.first(), values.last()]);
    }
    Ok(out)
}
