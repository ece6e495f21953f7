//! What relaying costs, against a `nats-server -js` of the run's own: the broker's own
//! floor (this process publishing the same records straight to JetStream, acks awaited
//! with as many in flight as the host's concurrency), the host draining the table into
//! it through the default relay (`plugins/relay`, WebAssembly) and through the same mapping
//! written natively, and insert-to-ack latency under a steady producer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::ensure;
use outbox_host::config::{Config, WorkerConfig};
use outbox_host::ops::metrics::Metrics;
use outbox_host::relay::{Publish, settings::BrokerConfig, settings::BrokerKind};
use outbox_host::sandbox::relay::Record;
use outbox_host::sandbox::{AttemptFailure, Deliver, Delivered, Event, FailureClass, Turn};
use outbox_test_support::brokers::BrokerServer;
use prost::Message as _;
use serde_json::{Value, json};

use crate::db::Db;

const STREAM: &str = "BENCH";

/// The record the default relay makes of `event` with `format: protobuf` and
/// `destination: rooms.{room_id}`: the same destination, key, headers and payload.
fn native_record(event: &Event) -> Record {
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
        destination: format!("rooms.{}", event.room_id),
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
    let envelope = outbox_proto::EventEnvelope::decode(row.envelope.as_slice())?;
    Ok(Event {
        app_code: envelope.app_code,
        event_id: envelope.event_id,
        event_type: envelope.event_type,
        room_id: envelope.room_id,
        room_version: envelope.room_version,
        occurred_at_ms: envelope.occurred_at_ms,
        body: envelope.body,
        attempt: 1,
    })
}

/// The relay with its mapping written in Rust: what the WebAssembly mapping costs on top.
struct NativeRelay {
    publisher: Arc<dyn Publish>,
    calls: AtomicU64,
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
        self.calls.fetch_add(1, Ordering::Relaxed);
        let record = native_record(event);
        let failed = |message: String| AttemptFailure {
            class: FailureClass::Retryable,
            message,
            retry_after: None,
            pressure: None,
        };
        if !turn.wait().await {
            return Err(failed("an earlier event of the room was not published".into()));
        }
        self.publisher
            .publish(&event.event_id, vec![record], timeout, &mut turn)
            .await
            .map_err(|e| failed(format!("{e:?}")))?;
        Ok(Delivered::Delivered)
    }
}

/// The broker entry of the run's server.
fn broker(nats: &BrokerServer) -> BrokerConfig {
    let mut broker = BrokerConfig::new("bench", BrokerKind::Nats, &nats.url());
    broker.stream = STREAM.into();
    broker.create_stream = true;
    broker.subjects = vec!["rooms.>".into()];
    broker
}

/// The WebAssembly relay (the default one, `format: protobuf`) on `db`, publishing to `nats`.
async fn wasm_relay(db: &Db, nats: &BrokerServer, cache: &std::path::Path) -> anyhow::Result<Arc<dyn Deliver>> {
    let yaml = format!(
        "node_id: bench\ndatabase:\n  url: \"{}\"\nadmin:\n  listen: \"\"\n\
         brokers:\n  bench: {{ kind: nats, url: \"{}\", stream: {STREAM}, create_stream: true, subjects: [\"rooms.>\"] }}\n\
         sink:\n  name: relay\n  plugin: {}\n  cache_dir: {}\n  broker: bench\n\
         \x20 config: {{ destination: \"rooms.{{room_id}}\", format: protobuf }}\n",
        db.url(),
        nats.url(),
        outbox_test_support::RELAY,
        cache.display()
    );
    let config = Config::from_yaml(&yaml, std::iter::empty(), &|_| None)?;
    outbox_host::app::load_sink(&config, &config.sinks[0], Arc::new(Metrics::new("relay"))).await
}

/// The messages in the run's stream.
async fn stream_messages(nats: &BrokerServer) -> anyhow::Result<u64> {
    let client = async_nats::connect(nats.url()).await?;
    let mut stream = async_nats::jetstream::new(client).get_stream(STREAM).await?;
    Ok(stream.info().await?.state.messages)
}

/// The broker's floor: `n` records, as the relay makes them, published by this process with
/// `in_flight` acks outstanding at most; records per second.
async fn floor(nats: &BrokerServer, n: usize, in_flight: usize) -> anyhow::Result<f64> {
    let publisher = outbox_host::relay::connect(&broker(nats)).await?;
    let events: Vec<Event> = crate::events("floor", n, 1_000).iter().map(event_of).collect::<Result<_, _>>()?;
    let started = Instant::now();
    let gate = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let mut tasks = tokio::task::JoinSet::new();
    for event in events {
        let (publisher, permit) = (publisher.clone(), gate.clone().acquire_owned().await?);
        tasks.spawn(async move {
            let _permit = permit;
            let record = native_record(&event);
            publisher.publish(&event.event_id, vec![record], Duration::from_secs(30), &mut Turn::default()).await
        });
    }
    while let Some(done) = tasks.join_next().await {
        done?.map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// The relay benchmark on `db`'s backend: the floor, the drain through the WebAssembly
/// relay and the native one, each checked (every row delivered, one message per event in
/// the stream), and insert-to-ack latency at each of `rates`.
pub async fn run(
    backend: outbox_host::store::Backend,
    n: usize,
    rates: &[u32],
    seconds: u64,
    config: &WorkerConfig,
    cache: &std::path::Path,
) -> anyhow::Result<Value> {
    let nats = BrokerServer::start().await;
    let floor_rate = floor(&nats, n, config.concurrency as usize).await?;
    drop(nats);

    let nats = BrokerServer::start().await;
    let db = Db::fresh(backend).await?;
    let wasm = wasm_relay(&db, &nats, cache).await?;
    let with_wasm = crate::drain(&db, n, 1, config, wasm.clone()).await?;
    ensure!(stream_messages(&nats).await? == n as u64, "the WebAssembly relay's stream does not hold {n} messages");
    drop(nats);

    let nats = BrokerServer::start().await;
    let db = Db::fresh(backend).await?;
    let native = Arc::new(NativeRelay {
        publisher: outbox_host::relay::connect(&broker(&nats)).await?,
        calls: AtomicU64::new(0),
    });
    let with_native = crate::drain(&db, n, 1, config, native.clone()).await?;
    ensure!(stream_messages(&nats).await? == n as u64, "the native relay's stream does not hold {n} messages");
    drop(nats);

    let mut latencies = Vec::new();
    for rate in rates {
        let nats = BrokerServer::start().await;
        let db = Db::fresh(backend).await?;
        let sink = wasm_relay(&db, &nats, cache).await?;
        latencies.push(crate::latency(&db, *rate, seconds, sink).await?);
    }
    Ok(json!({
        "events": n,
        "jetstream_floor_per_s": floor_rate,
        "drain_wasm_per_s": with_wasm.per_second(),
        "drain_native_per_s": with_native.per_second(),
        "ratio_wasm_over_floor": with_wasm.per_second() / floor_rate,
        "mapping_cost": 1.0 - with_wasm.per_second() / with_native.per_second(),
        "cores_host": with_wasm.cores.host,
        "cores_server": with_wasm.cores.server,
        "latency": latencies,
    }))
}
