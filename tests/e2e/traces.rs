//! One trace from the producer's transaction to the destination (issue 49), on PostgreSQL
//! with the real binary: a producer span writes rows with the `outbox-producer` crate; the
//! host delivers them through the webhook sink to a receiver and through the default relay
//! to a NATS JetStream of the test's own; an OTLP receiver built on the official protobuf
//! definitions (`otlp.rs` of the test support) takes the host's spans.

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::trace::{Span as _, TraceContextExt as _, Tracer as _, TracerProvider as _};
use outbox_host::store::{Status, now_ms};
use outbox_test_support::WEBHOOK_SINK;
use outbox_test_support::brokers::NatsServer;
use outbox_test_support::db::TestDb;
use outbox_test_support::otlp::{KIND_CLIENT, KIND_PRODUCER, OtlpReceiver, STATUS_ERROR, Span};
use outbox_test_support::webhook::{Answer, Receiver, SECRET};

use crate::binary::{free_port, signal, spawn_host, spawn_with, wait_exit, wait_table};
use crate::support::{PATIENCE, SinkSpec, TestConfig, World, sink_entry};

/// The tracestate the producer's context carries, which a relay passes on unchanged.
const STATE: &str = "congo=t61rcWkgMzE";

/// The webhook sink first, then the default relay into `nats` as a consumer; tracing on,
/// exporting to `otlp` every 100 ms.
fn traced_config(world: &World, receiver: &Receiver, nats: &NatsServer, endpoint: &str) -> TestConfig {
    let webhook = SinkSpec {
        name: "webhook",
        plugin: WEBHOOK_SINK,
        allowed_hosts: vec![receiver.host_port()],
        config: format!("url: \"{}\"\nsecret: \"{SECRET}\"\n", receiver.url("events")),
    };
    let relay = crate::relay::nats_relay();
    world
        .setup_with("ordering: per_room\nretry_interval: 100ms", &webhook)
        .with_sinks(vec![sink_entry(&relay, "broker: events\nstart_from: beginning")])
        .set(&["brokers", "events", "kind"], "nats")
        .set(&["brokers", "events", "url"], &nats.url())
        .set(&["brokers", "events", "stream"], "TRACED")
        .set(&["brokers", "events", "create_stream"], "true")
        .set(&["brokers", "events", "subjects"], "[\"rooms.>\"]")
        .set(&["tracing", "enabled"], "true")
        .set(&["tracing", "endpoint"], endpoint)
        .set(&["tracing", "export_every"], "100ms")
        .set(&["tracing", "service_name"], "outbox-host-test")
}

/// Inserts one event of `room` with the producer crate, its `trace_context` as given.
async fn produce(world: &World, room: &str, trace_context: Option<String>) -> String {
    let pool = sqlx::PgPool::connect(&world.db_url()).await.unwrap();
    let outbox = outbox_producer::Outbox::<sqlx::Postgres>::new("room_outbox").unwrap();
    let event_id = format!("evt-{room}");
    let event = outbox_producer::Event {
        app_code: "app-1".into(),
        event_id: event_id.clone(),
        event_type: "RoomGiftSent".into(),
        room_id: room.into(),
        envelope: outbox_host::envelope::encode("app-1", &event_id, "RoomGiftSent", room, 1, now_ms(), vec![]),
        created_at_ms: now_ms(),
        delivered: false,
        trace_context,
    };
    let mut tx = pool.begin().await.unwrap();
    outbox.insert(&mut *tx, &event).await.unwrap();
    tx.commit().await.unwrap();
    pool.close().await;
    event_id
}

/// Every message of the stream, by event id: its headers.
async fn stream_headers(nats: &NatsServer) -> HashMap<String, HashMap<String, String>> {
    let client = async_nats::connect(nats.url()).await.unwrap();
    let jetstream = async_nats::jetstream::new(client);
    let Ok(mut stream) = jetstream.get_stream("TRACED").await else { return HashMap::new() };
    let count = stream.info().await.unwrap().state.messages;
    let mut out = HashMap::new();
    for sequence in 1..=count {
        let m = stream.get_raw_message(sequence).await.unwrap();
        let headers: HashMap<String, String> = m
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.first().map(|v| v.to_string()).unwrap_or_default()))
            .collect();
        out.insert(headers.get("outbox-event-id").cloned().unwrap_or_default(), headers);
    }
    out
}

/// Waits until `done` holds of the spans received, which it returns.
async fn wait_spans(otlp: &OtlpReceiver, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let spans = otlp.spans();
        if done(&spans) {
            return spans;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}: {spans:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn one_trace_runs_from_the_producer_through_the_webhook_and_jetstream() {
    let Some(db) = TestDb::postgres().await else { return };
    let world = World::on(db).await;
    let otlp = OtlpReceiver::start().await;
    // The webhook answers 408 (retryable) to the first request of room-retry, then 204.
    let receiver = Receiver::start([("room-retry", Answer::Sequence(vec![Answer::Status(408)]))]).await;
    let nats = NatsServer::start().await;

    // The producer's request: a span of its own tracer, current while the rows are written.
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let producer_span = provider.tracer("room-service").start("gift command");
    // The request came with a vendor's tracestate, which the span keeps.
    let state = opentelemetry::trace::TraceState::from_key_value([("congo", "t61rcWkgMzE")]).unwrap();
    let started = producer_span.span_context();
    let producer = opentelemetry::trace::SpanContext::new(
        started.trace_id(),
        started.span_id(),
        started.trace_flags(),
        false,
        state,
    );
    let cx = opentelemetry::Context::new().with_remote_span_context(producer.clone());
    let written = {
        let _current = cx.attach();
        outbox_producer::current_trace_context()
    };
    let written = written.expect("the producer's span is current");
    let producer_parent = format!("00-{}-{}-01", producer.trace_id(), producer.span_id());
    assert_eq!(written, format!("{producer_parent};{STATE}"), "what the crate writes");
    let traced = produce(&world, "room-1", Some(written.clone())).await;
    let retried = produce(&world, "room-retry", Some(written.clone())).await;
    let plain = produce(&world, "room-plain", None).await;
    let bad = produce(&world, "room-bad", Some("00-not-a-trace-01;congo=x".into())).await;
    let events = [&traced, &retried, &plain, &bad];

    let config = traced_config(&world, &receiver, &nats, &otlp.endpoint());
    let host = spawn_host(&world, &config.yaml());
    wait_table(&world, "the webhook to deliver every event", |s| s.count(Status::Delivered) == 4).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while stream_headers(&nats).await.len() < 4 {
        assert!(tokio::time::Instant::now() < deadline, "the relay did not publish every event");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // 5 webhook attempts and their 5 requests, 4 relay attempts.
    let spans = wait_spans(&otlp, "every attempt's span", |spans| spans.len() >= 14).await;
    signal(&host, "TERM");
    let output = wait_exit(host).await;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let log = String::from_utf8_lossy(&output.stderr).into_owned();

    let deliveries = |event: &str| -> Vec<Span> {
        let mut of: Vec<Span> = spans
            .iter()
            .filter(|s| s.name == "deliver webhook" && s.attr("messaging.message.id") == event)
            .cloned()
            .collect();
        of.sort_by_key(|s| s.attr("outbox.attempt").parse::<u32>().unwrap());
        of
    };
    let publish = |event: &str| -> Span {
        let of: Vec<&Span> =
            spans.iter().filter(|s| s.name == "publish events" && s.attr("messaging.message.id") == event).collect();
        assert_eq!(of.len(), 1, "one relay attempt of {event}: {of:#?}");
        of[0].clone()
    };
    assert!(spans.iter().all(|s| s.service == "outbox-host-test"), "{spans:#?}");

    // The delivery is a child of the producer's span, in its trace.
    let delivered = deliveries(&traced);
    assert_eq!(delivered.len(), 1, "{delivered:#?}");
    let delivery = &delivered[0];
    assert_eq!(
        (delivery.trace_id.as_str(), delivery.parent_span_id.as_str()),
        (producer.trace_id().to_string().as_str(), producer.span_id().to_string().as_str())
    );
    assert_eq!(delivery.kind, KIND_PRODUCER);
    assert_eq!(delivery.attr("messaging.system"), "outbox-host");
    assert_eq!(delivery.attr("messaging.destination.name"), "webhook");
    assert_eq!(delivery.attr("outbox.room_id"), "room-1");
    assert_eq!(delivery.attr("outbox.outcome"), "delivered");
    assert_eq!(delivery.attr("outbox.attempt"), "1");
    assert!(delivery.attr("outbox.waited_ms").parse::<i64>().unwrap() >= 0, "{delivery:?}");

    // The receiver saw the attempt's span as the request's parent.
    let request = receiver.received_for(&traced);
    assert_eq!(request.len(), 1);
    assert_eq!(request[0].headers["traceparent"], format!("00-{}-{}-01", delivery.trace_id, delivery.span_id));
    // The request itself is a child span with its method, host and status.
    let http: Vec<&Span> = spans.iter().filter(|s| s.parent_span_id == delivery.span_id).collect();
    assert_eq!(http.len(), 1, "{http:#?}");
    assert_eq!((http[0].name.as_str(), http[0].kind), ("POST", KIND_CLIENT));
    assert_eq!(http[0].attr("http.request.method"), "POST");
    assert_eq!(http[0].attr("server.address"), "127.0.0.1");
    assert_eq!(http[0].attr("http.response.status_code"), "204");

    // The relay's attempt is in the same trace, and the message carries the creation
    // context unchanged.
    let relayed = publish(&traced);
    assert_eq!(
        (relayed.trace_id.as_str(), relayed.parent_span_id.as_str()),
        (delivery.trace_id.as_str(), producer.span_id().to_string().as_str())
    );
    assert_eq!((relayed.kind, relayed.attr("messaging.system")), (KIND_PRODUCER, "nats"));
    let messages = stream_headers(&nats).await;
    assert_eq!(messages[&traced]["traceparent"], producer_parent);
    assert_eq!(messages[&traced]["tracestate"], STATE);

    // A failed then retried attempt: two spans, with their outcomes.
    let attempts = deliveries(&retried);
    let outcomes: Vec<(&str, &str, &str, i32)> = attempts
        .iter()
        .map(|s| (s.attr("outbox.attempt"), s.attr("outbox.outcome"), s.attr("error.type"), s.status))
        .collect();
    assert_eq!(outcomes, [("1", "retryable", "retryable", STATUS_ERROR), ("2", "delivered", "", 0)]);
    assert!(attempts.iter().all(|s| s.trace_id == delivery.trace_id), "{attempts:#?}");
    let requests = receiver.received_for(&retried);
    assert_eq!(requests.iter().map(|r| r.status).collect::<Vec<_>>(), [408, 204]);
    for (request, attempt) in requests.iter().zip(&attempts) {
        assert_eq!(request.headers["traceparent"], format!("00-{}-{}-01", attempt.trace_id, attempt.span_id));
    }

    // A row without a context, and one whose context does not read, start traces of their
    // own and are delivered all the same; the relay passes on no context for them.
    for event in [&plain, &bad] {
        let own = deliveries(event);
        assert_eq!(own.len(), 1, "{own:#?}");
        assert_eq!(own[0].attr("outbox.outcome"), "delivered");
        assert_eq!(own[0].parent_span_id, "", "a root span");
        assert_ne!(own[0].trace_id, delivery.trace_id);
        let request = &receiver.received_for(event)[0];
        assert_eq!(request.headers["traceparent"], format!("00-{}-{}-01", own[0].trace_id, own[0].span_id));
        assert!(!messages[event.as_str()].contains_key("traceparent"), "{:?}", messages[event.as_str()]);
        assert_eq!(publish(event).parent_span_id, "");
    }
    for event in events {
        assert_eq!(world.row(event).await.status, Status::Delivered);
    }

    // The attempt's log lines carry its trace and span.
    let line = log
        .lines()
        .find(|l| l.contains("event delivered") && l.contains(traced.as_str()) && l.contains("webhook"))
        .or_else(|| log.lines().find(|l| l.contains("event delivered") && l.contains(traced.as_str())))
        .unwrap_or_else(|| panic!("no delivery line for {traced}:\n{log}"));
    assert!(line.contains(&delivery.trace_id), "{line}");
}

/// An exporter that is down leaves delivery untouched: every event is delivered, and the
/// spans that could not be sent are counted on `/metrics`.
#[tokio::test]
async fn an_exporter_that_is_down_leaves_delivery_untouched() {
    let world = World::new().await;
    // Nothing listens on this port.
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let port = free_port();
    let config = world
        .setup("", "default: ok")
        .set(&["admin", "listen"], &format!("127.0.0.1:{port}"))
        .set(&["tracing", "enabled"], "true")
        .set(&["tracing", "endpoint"], &endpoint)
        .set(&["tracing", "export_every"], "50ms")
        .set(&["tracing", "export_timeout"], "1s");
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(world.produce("RoomGiftSent", &format!("room-{i}"), Status::Pending).await);
    }
    let host = spawn_host(&world, &config.yaml());
    wait_table(&world, "every event delivered", |s| s.count(Status::Delivered) == 20).await;
    let base = format!("http://127.0.0.1:{port}");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let failed = loop {
        let failed = crate::support::metric(&base, "room_outbox_trace_spans_total{result=\"failed\"}").await;
        if failed >= 40.0 {
            break failed;
        }
        assert!(tokio::time::Instant::now() < deadline, "the failed exports were not counted ({failed})");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Each attempt's span, and its request's: the fake sink reports every attempt to the
    // test's collector over HTTP.
    assert_eq!(failed, 40.0, "two spans per attempt, each lost once");
    signal(&host, "TERM");
    let output = wait_exit(host).await;
    assert!(output.status.success(), "a down exporter does not hold shutdown");
    let log = String::from_utf8_lossy(&output.stderr);
    assert_eq!(log.matches("could not export spans").count(), 1, "said once:\n{log}");
    for id in &ids {
        assert_eq!(world.row(id).await.status, Status::Delivered);
    }
}

/// The same spans over OTLP/gRPC, to a server of the official `TraceService`; and a sink
/// that asks for its attempt's context (WIT 0.1.3 `trace.traceparent`) gets the one the
/// host also puts on its request.
#[tokio::test]
async fn spans_go_to_a_grpc_collector_and_a_sink_can_read_its_context() {
    let world = World::new().await;
    let otlp = OtlpReceiver::start_grpc().await;
    let config = world
        .setup("", &format!("default: trace:{}", world.collector.url("/trace")))
        .set(&["tracing", "enabled"], "true")
        .set(&["tracing", "endpoint"], &otlp.endpoint())
        .set(&["tracing", "protocol"], "grpc")
        .set(&["tracing", "export_every"], "100ms");
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(world.produce("RoomGiftSent", &format!("room-{i}"), Status::Pending).await);
    }
    let host = spawn_host(&world, &config.yaml());
    wait_table(&world, "every event delivered", |s| s.count(Status::Delivered) == 5).await;
    // Each attempt's span, the request with which the fake sink reports it, and its post of
    // the context.
    let spans = wait_spans(&otlp, "every attempt's span", |spans| spans.len() >= 15).await;
    signal(&host, "TERM");
    assert!(wait_exit(host).await.status.success());
    let mut traceparents = Vec::new();
    for id in &ids {
        let of: Vec<&Span> = spans.iter().filter(|s| s.attr("messaging.message.id") == id).collect();
        assert_eq!(of.len(), 1, "{id}: {spans:#?}");
        assert_eq!(
            (of[0].name.as_str(), of[0].kind, of[0].attr("outbox.outcome")),
            ("deliver fake", KIND_PRODUCER, "delivered")
        );
        assert_eq!(of[0].service, "outbox-host");
        let requests = spans.iter().filter(|s| s.parent_span_id == of[0].span_id && s.kind == KIND_CLIENT).count();
        assert_eq!(requests, 2, "{id}: the report request and the post of the context");
        traceparents.push(format!("00-{}-{}-01", of[0].trace_id, of[0].span_id));
    }
    let mut posted: Vec<(String, String)> = world
        .collector
        .seen()
        .into_iter()
        .filter(|seen| seen.path == "/trace")
        .map(|seen| {
            let header = seen.headers.iter().find(|(name, _)| name == "traceparent").map(|(_, v)| v.clone());
            let body = seen.json.as_ref().and_then(|j| j["traceparent"].as_str().map(str::to_string));
            (body.unwrap_or_default(), header.unwrap_or_default())
        })
        .collect();
    posted.sort();
    traceparents.sort();
    let expected: Vec<(String, String)> = traceparents.iter().map(|t| (t.clone(), t.clone())).collect();
    assert_eq!(posted, expected, "each sink read its attempt's context, the one on its request");
}

/// The standard variables alone point the exporter: the collector's URL, its headers (a
/// signal's own over the general one's; an API key never in the log) and the timeout. A
/// collector's partial success counts the spans it rejected as failed.
#[tokio::test]
async fn the_standard_variables_set_the_collector_and_its_headers() {
    let world = World::new().await;
    let otlp = OtlpReceiver::start().await;
    otlp.reject(1);
    let port = free_port();
    let config = world
        .setup("", "default: ok")
        .set(&["admin", "listen"], &format!("127.0.0.1:{port}"))
        .set(&["tracing", "enabled"], "true")
        .set(&["tracing", "export_every"], "50ms");
    for i in 0..10 {
        world.produce("RoomGiftSent", &format!("room-{i}"), Status::Pending).await;
    }
    let traces_url = format!("{}/v1/traces", otlp.endpoint());
    let host = spawn_with(
        &world,
        &config.yaml(),
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces_url.as_str()),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s3cr3t%21key,x-tenant=rooms"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-tenant=audio-rooms"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "3000"),
        ],
    );
    wait_table(&world, "every event delivered", |s| s.count(Status::Delivered) == 10).await;
    // Each attempt's span and its report request's.
    wait_spans(&otlp, "every span", |spans| spans.len() >= 20).await;
    let base = format!("http://127.0.0.1:{port}");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let (exported, failed) = loop {
        let exported = crate::support::metric(&base, "room_outbox_trace_spans_total{result=\"exported\"}").await;
        let failed = crate::support::metric(&base, "room_outbox_trace_spans_total{result=\"failed\"}").await;
        if exported + failed >= 20.0 {
            break (exported, failed);
        }
        assert!(tokio::time::Instant::now() < deadline, "the exports were not counted ({exported}, {failed})");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let requests = otlp.requests() as f64;
    assert_eq!((exported, failed), (20.0 - requests, requests), "one span of each request rejected");
    assert_eq!(otlp.header("api-key"), vec![Some("s3cr3t!key".to_string()); otlp.requests()]);
    assert_eq!(otlp.header("x-tenant"), vec![Some("audio-rooms".to_string()); otlp.requests()]);
    assert_eq!(otlp.header("content-type")[0].as_deref(), Some("application/x-protobuf"));
    signal(&host, "TERM");
    let output = wait_exit(host).await;
    assert!(output.status.success());
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(log.contains("exporting traces over OTLP") && log.contains("headers=2"), "{log}");
    assert!(!log.contains("s3cr3t"), "the API key reached the log:\n{log}");
}

/// A variable that does not read stops the host at start, naming it (and never the value).
#[tokio::test]
async fn a_bad_otlp_variable_refuses_start() {
    let world = World::new().await;
    let config = world.setup("", "default: ok").set(&["tracing", "enabled"], "true");
    let host = spawn_with(
        &world,
        &config.yaml(),
        &[("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"), ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=%zzs3cr3t")],
    );
    let output = wait_exit(host).await;
    assert!(!output.status.success());
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(log.contains("OTEL_EXPORTER_OTLP_TIMEOUT") && log.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{log}");
    assert!(!log.contains("s3cr3t"), "{log}");
}
