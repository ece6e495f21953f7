//! Relaying into Redis Streams, RabbitMQ and MQTT through the default relay
//! (`plugins/relay`): Redis and Mosquitto of each test's own, RabbitMQ the machine's, with
//! an exchange and queues of each test's own. What each broker holds afterwards is read back
//! with its own client.

use std::collections::HashMap;
use std::time::Duration;

use outbox_host::store::{NewEvent, ReplayFilter, Status};
use outbox_test_support::RELAY;
use outbox_test_support::brokers::{Broker, BrokerServer};

use crate::support::{PATIENCE, Running, SinkSpec, TestConfig, World, metric};

/// The machine's RabbitMQ (Debian's package, started before the session).
pub(crate) const RABBITMQ: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A host's config relaying through the default relay to broker `events` of `kind` at
/// `url` with the broker's extra `keys`, each event to `destination` (a relay template).
pub(crate) fn relay_config(
    world: &World,
    kind: &str,
    url: &str,
    destination: &str,
    keys: &[(&str, &str)],
) -> TestConfig {
    let relay = SinkSpec {
        name: "relay",
        plugin: RELAY,
        allowed_hosts: Vec::new(),
        config: format!("destination: \"{destination}\""),
    };
    let mut config = world
        .setup_with("ordering: per_room\nbatch_size: 50\nconcurrency: 8", &relay)
        .set(&["sink", "broker"], "events")
        .set(&["brokers", "events", "kind"], kind)
        .set(&["brokers", "events", "url"], url);
    // Redis and MQTT have no default: the destinations the template's literal start leads to.
    let literal = destination.split('{').next().unwrap_or_default();
    let allowed = match kind {
        "redis" => Some(format!("[\"{literal}*\"]")),
        "mqtt" => Some(format!("[\"{literal}#\"]")),
        _ => None,
    };
    if let Some(allowed) = allowed {
        config = config.set(&["brokers", "events", "allowed_destinations"], &allowed);
    }
    for (key, value) in keys {
        config = config.set(&["brokers", "events", key], value);
    }
    config
}

/// `per_room` events over `rooms` rooms, room after room in turn.
pub(crate) fn events(world: &World, rooms: usize, per_room: usize) -> Vec<NewEvent> {
    (0..rooms * per_room)
        .map(|i| world.event("RoomGiftSent", &format!("room-{}", i % rooms), Status::Pending))
        .collect()
}

/// Each room's event ids, in the order they were produced.
fn by_room(events: &[NewEvent]) -> HashMap<String, Vec<String>> {
    let mut rooms: HashMap<String, Vec<String>> = HashMap::new();
    for e in events {
        rooms.entry(e.room_id.clone()).or_default().push(e.event_id.clone());
    }
    rooms
}

pub(crate) fn ids(events: &[NewEvent]) -> Vec<&str> {
    events.iter().map(|e| e.event_id.as_str()).collect()
}

/// Waits until every row of `ids` is delivered, however many attempts that takes.
async fn wait_delivered(host: &mut Running, world: &World, ids: &[&str]) {
    host.wait_for_within("every event delivered", PATIENCE, || async {
        for id in ids {
            if world.row(id).await.status != Status::Delivered {
                return false;
            }
        }
        true
    })
    .await;
}

/// A unique name for this test's exchange, queue or key prefix.
fn unique(what: &str) -> String {
    format!("outbox-test-{what}-{:08x}", outbox_host::clock::random_u64() as u32)
}

/// The creation context of [`traced_relay`]'s traced event, as its producer wrote it.
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACESTATE: &str = "congo=t61rcWkgMzE";

/// Relays two events of room `room-t` through the real binary with tracing on, the first
/// with a trace context and the second without, and returns their ids once both are
/// delivered; the publish spans went to `otlp`.
async fn traced_relay(
    world: &World,
    config: TestConfig,
    otlp: &outbox_test_support::otlp::OtlpReceiver,
) -> (String, String) {
    let traced = NewEvent {
        trace_context: Some(format!("{TRACEPARENT};{TRACESTATE}")),
        ..world.event("RoomGiftSent", "room-t", Status::Pending)
    };
    let plain = world.event("RoomGiftSent", "room-t", Status::Pending);
    world.producer.insert(&[traced.clone(), plain.clone()]).await.unwrap();
    let config = config
        .set(&["tracing", "enabled"], "true")
        .set(&["tracing", "endpoint"], &otlp.endpoint())
        .set(&["tracing", "export_every"], "100ms");
    let host = crate::binary::spawn_host(world, &config.yaml());
    crate::binary::wait_table(world, "both events relayed", |s| s.count(Status::Delivered) == 2).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while otlp.spans().len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no publish spans: {:?}", otlp.spans());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    crate::binary::signal(&host, "TERM");
    assert!(crate::binary::wait_exit(host).await.status.success());
    let spans = otlp.spans();
    let of_traced = spans.iter().find(|s| s.attr("messaging.message.id") == traced.event_id).expect("its span");
    assert_eq!(of_traced.name, "publish events");
    assert_eq!(
        (of_traced.trace_id.as_str(), of_traced.parent_span_id.as_str()),
        ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
    );
    (traced.event_id, plain.event_id)
}

mod redis_streams {
    use super::*;
    use redis::AsyncCommands as _;

    /// Every entry of stream `key`: its `outbox-event-id` field, in stream order.
    async fn entries(server: &BrokerServer, key: &str) -> Vec<String> {
        let client = redis::Client::open(server.url()).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        let reply: redis::streams::StreamRangeReply = connection.xrange_all(key).await.unwrap();
        reply
            .ids
            .iter()
            .map(|entry| entry.get::<String>("outbox-event-id").expect("an outbox-event-id field"))
            .collect()
    }

    /// 200 events over 10 rooms, each room to a stream of its own: every event lands once,
    /// in its room's order, with its key and payload fields; a replay of all of them adds
    /// no entry (each record's dedup marker is still there).
    #[tokio::test]
    async fn every_event_lands_once_in_its_rooms_stream_in_order_and_a_replay_adds_nothing() {
        let world = World::new().await;
        let server = BrokerServer::of(Broker::Redis).await;
        let events = events(&world, 10, 20);
        world.producer.insert(&events).await.unwrap();
        let config = relay_config(&world, "redis", &server.url(), "rooms:{room_id}", &[("dedup_window", "1h")]);
        let mut host = Running::start(config.with_admin().parse()).await;
        let base = format!("http://{}", host.admin.unwrap());
        host.wait_status(&world, &ids(&events), Status::Delivered).await;
        for (room, expected) in by_room(&events) {
            assert_eq!(entries(&server, &format!("rooms:{room}")).await, expected, "{room}: once each, in order");
        }
        let client = redis::Client::open(server.url()).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        let first: redis::streams::StreamRangeReply =
            connection.xrange_count("rooms:room-0", "-", "+", 1).await.unwrap();
        let entry = &first.ids[0];
        assert_eq!(entry.get::<String>("key").as_deref(), Some("room-0"), "the record's key");
        let payload: serde_json::Value = serde_json::from_slice(&entry.get::<Vec<u8>>("payload").unwrap()).unwrap();
        assert_eq!(payload["event_id"], events[0].event_id.as_str(), "the payload is the event as JSON: {payload}");

        let everything = ReplayFilter { from_ms: 0, to_ms: None, event_type: None, room_id: None, event_id: None };
        let replayed = outbox_host::ops::replay(world.producer.clone(), "relay", &everything).await.unwrap();
        assert_eq!(replayed, events.len() as u64);
        host.wait_status(&world, &ids(&events), Status::Delivered).await;
        let series = |name: &str| format!("room_outbox_broker_{name}{{broker=\"events\"}}");
        assert_eq!(metric(&base, &series("duplicates_total")).await, 200.0, "every replayed record a duplicate");
        assert_eq!(metric(&base, &series("publish_latency_ms_count")).await, 400.0, "400 acknowledged publishes");
        assert_eq!(metric(&base, &series("acks_in_flight")).await, 0.0);
        host.stop().await;
        for (room, expected) in by_room(&events) {
            assert_eq!(entries(&server, &format!("rooms:{room}")).await, expected, "{room}: the replay added nothing");
        }
    }

    /// A key of another type refuses the record: that attempt fails and counts, naming
    /// Redis's reason. A server that goes away defers the events with no attempt counted,
    /// and they land once it is back, without waiting out the breaker's cool-down.
    #[tokio::test]
    async fn a_key_of_another_type_fails_the_attempt_and_a_server_away_burns_none() {
        let world = World::new().await;
        let mut server = BrokerServer::of(Broker::Redis).await;
        let client = redis::Client::open(server.url()).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = connection.set("rooms:room-taken", "a string").await.unwrap();
        // A minute's cool-down: delivery resumes before it ends only because the relay's
        // probe sees the server back and cuts it short.
        let config = relay_config(&world, "redis", &server.url(), "rooms:{room_id}", &[])
            .set(&["sink", "breaker", "cool_down"], "60s")
            .set(&["sink", "breaker", "max_cool_down"], "60s");
        let mut host = Running::start(config.with_admin().parse()).await;
        let base = format!("http://{}", host.admin.unwrap());
        let errors = |kind: &str| format!("room_outbox_broker_errors_total{{broker=\"events\",kind=\"{kind}\"}}");
        let refused = world.produce("RoomGiftSent", "room-taken", Status::Pending).await;
        host.wait_for("the refused record's attempt to count", || async { world.row(&refused).await.retry_count >= 1 })
            .await;
        let row = world.row(&refused).await;
        assert_ne!(row.status, Status::Delivered);
        let error = row.last_error.unwrap_or_default();
        assert!(error.contains("broker events: XADD to") && error.contains("WRONGTYPE"), "{error}");

        server.stop();
        let during = events(&world, 3, 3);
        world.producer.insert(&during).await.unwrap();
        host.wait_for("an attempt to meet the missing server", || async {
            world.row(&during[0].event_id).await.status == Status::Retryable
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        for e in &during {
            let row = world.row(&e.event_id).await;
            assert_eq!(row.retry_count, 0, "a server away burned an attempt: {row:?}");
        }
        assert!(metric(&base, &errors("refused")).await >= 1.0, "the WRONGTYPE reply counted as refused");
        assert!(metric(&base, &errors("unavailable")).await >= 1.0, "the missing server counted as unavailable");
        server.restart().await;
        wait_delivered(&mut host, &world, &ids(&during)).await;
        host.stop().await;
        for (room, expected) in by_room(&during) {
            assert_eq!(
                entries(&server, &format!("rooms:{room}")).await,
                expected,
                "{room} once each after the restart"
            );
        }
    }
    /// A traced event's entry carries its creation context as fields; an untraced one's none.
    #[tokio::test]
    async fn a_traced_events_entry_carries_its_creation_context() {
        let world = World::new().await;
        let server = BrokerServer::of(Broker::Redis).await;
        let otlp = outbox_test_support::otlp::OtlpReceiver::start().await;
        let config = relay_config(&world, "redis", &server.url(), "rooms:{room_id}", &[]);
        let (traced, plain) = traced_relay(&world, config, &otlp).await;
        assert_eq!(
            otlp.spans().iter().find(|s| s.attr("messaging.message.id") == traced).unwrap().attr("messaging.system"),
            "redis"
        );
        let client = redis::Client::open(server.url()).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        let reply: redis::streams::StreamRangeReply = connection.xrange_all("rooms:room-t").await.unwrap();
        let field = |i: usize, name: &str| reply.ids[i].get::<String>(name);
        assert_eq!(reply.ids.len(), 2);
        assert_eq!(field(0, "outbox-event-id").as_deref(), Some(traced.as_str()));
        assert_eq!(field(0, "traceparent").as_deref(), Some(TRACEPARENT));
        assert_eq!(field(0, "tracestate").as_deref(), Some(TRACESTATE));
        assert_eq!(field(1, "outbox-event-id").as_deref(), Some(plain.as_str()));
        assert_eq!((field(1, "traceparent"), field(1, "tracestate")), (None, None));
    }
}

mod rabbitmq {
    use super::*;
    use lapin::options::{BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
    use lapin::types::{AMQPValue, FieldTable};
    use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

    async fn channel() -> (Connection, Channel) {
        let connection = Connection::connect(RABBITMQ, ConnectionProperties::default())
            .await
            .expect("the machine's RabbitMQ at 127.0.0.1:5672");
        let channel = connection.create_channel().await.unwrap();
        (connection, channel)
    }

    /// A topic exchange of this test's own, auto-deleted once unused.
    async fn exchange(channel: &Channel) -> String {
        let name = unique("exchange");
        let options = ExchangeDeclareOptions { auto_delete: true, ..Default::default() };
        channel.exchange_declare(&name, ExchangeKind::Topic, options, FieldTable::default()).await.unwrap();
        name
    }

    /// A queue of this test's own bound to `exchange` by `pattern`.
    async fn queue(channel: &Channel, exchange: &str, pattern: &str) -> String {
        let name = unique("queue");
        let options = QueueDeclareOptions { auto_delete: true, ..Default::default() };
        channel.queue_declare(&name, options, FieldTable::default()).await.unwrap();
        channel.queue_bind(&name, exchange, pattern, QueueBindOptions::default(), FieldTable::default()).await.unwrap();
        name
    }

    /// A message's text header `name`.
    fn header(properties: &lapin::BasicProperties, name: &str) -> Option<String> {
        match properties.headers().as_ref()?.inner().get(name) {
            Some(AMQPValue::LongString(s)) => Some(s.to_string()),
            _ => None,
        }
    }

    /// Every message in `queue`: (routing key, message id, `outbox-event-id` header,
    /// delivery mode), taken off it.
    async fn drain(channel: &Channel, queue: &str) -> Vec<(String, String, String, u8)> {
        let mut out = Vec::new();
        let take = BasicGetOptions { no_ack: true };
        while let Some(message) = channel.basic_get(queue, take).await.unwrap() {
            let properties = &message.delivery.properties;
            let header = header(properties, "outbox-event-id").unwrap_or_default();
            out.push((
                message.delivery.routing_key.to_string(),
                properties.message_id().as_ref().map(|m| m.to_string()).unwrap_or_default(),
                header,
                properties.delivery_mode().unwrap_or_default(),
            ));
        }
        out
    }

    /// 200 events over 10 rooms through a topic exchange into one bound queue: each once,
    /// confirmed, persistent, `message_id` = event id, each room's in order.
    #[tokio::test]
    async fn every_event_is_confirmed_into_the_bound_queue_once_in_room_order() {
        let world = World::new().await;
        let (_connection, channel) = channel().await;
        let exchange = exchange(&channel).await;
        let queue = queue(&channel, &exchange, "rooms.#").await;
        let events = events(&world, 10, 20);
        world.producer.insert(&events).await.unwrap();
        let config = relay_config(&world, "rabbitmq", RABBITMQ, "rooms.{room_id}", &[("exchange", &exchange)]);
        let mut host = Running::start(config.parse()).await;
        host.wait_status(&world, &ids(&events), Status::Delivered).await;
        host.stop().await;
        let messages = drain(&channel, &queue).await;
        assert_eq!(messages.len(), events.len(), "one message per event");
        let mut per_room: HashMap<String, Vec<String>> = HashMap::new();
        for (routing_key, message_id, event_id, mode) in messages {
            assert_eq!(message_id, event_id, "message_id is the event id");
            assert_eq!(mode, 2, "persistent");
            per_room.entry(routing_key.trim_start_matches("rooms.").to_string()).or_default().push(event_id);
        }
        assert_eq!(per_room, by_room(&events), "each room's events in order");
    }

    /// A traced event's message carries its creation context as AMQP headers; an untraced
    /// one's none.
    #[tokio::test]
    async fn a_traced_events_message_carries_its_creation_context() {
        let world = World::new().await;
        let (_connection, channel) = channel().await;
        let exchange = exchange(&channel).await;
        let queue = queue(&channel, &exchange, "rooms.#").await;
        let otlp = outbox_test_support::otlp::OtlpReceiver::start().await;
        let config = relay_config(&world, "rabbitmq", RABBITMQ, "rooms.{room_id}", &[("exchange", &exchange)]);
        let (traced, plain) = traced_relay(&world, config, &otlp).await;
        let mut headers = Vec::new();
        let take = BasicGetOptions { no_ack: true };
        while let Some(message) = channel.basic_get(&queue, take).await.unwrap() {
            let text = |name: &str| header(&message.delivery.properties, name);
            headers.push((text("outbox-event-id"), text("traceparent"), text("tracestate")));
        }
        assert_eq!(
            headers,
            [(Some(traced), Some(TRACEPARENT.to_string()), Some(TRACESTATE.to_string())), (Some(plain), None, None),]
        );
    }

    /// An event no queue is bound for is returned unroutable: its attempts fail and count,
    /// naming the routing key; once a queue is bound it is delivered there.
    #[tokio::test]
    async fn an_unroutable_event_fails_its_attempts_until_a_queue_is_bound() {
        let world = World::new().await;
        let (_connection, channel) = channel().await;
        let exchange = exchange(&channel).await;
        let config = relay_config(&world, "rabbitmq", RABBITMQ, "rooms.{room_id}", &[("exchange", &exchange)]);
        let mut host = Running::start(config.parse()).await;
        let event = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
        host.wait_for("an unroutable attempt to count", || async { world.row(&event).await.retry_count >= 1 }).await;
        let row = world.row(&event).await;
        assert_ne!(row.status, Status::Delivered, "an unroutable message was taken for delivered");
        let error = row.last_error.unwrap_or_default();
        assert!(error.contains("broker events: unroutable") && error.contains("rooms.room-1"), "{error}");

        let queue = queue(&channel, &exchange, "rooms.#").await;
        wait_delivered(&mut host, &world, &[&event]).await;
        host.stop().await;
        let messages = drain(&channel, &queue).await;
        assert_eq!(messages.iter().map(|m| m.2.as_str()).collect::<Vec<_>>(), vec![event.as_str()]);
    }

    /// `check-config` loads the relay and asks the broker: an exchange that exists passes,
    /// a missing one is named.
    #[tokio::test]
    async fn check_config_asks_the_broker_for_the_exchange() {
        use crate::binary::{run_cli_beside, write_config};
        let world = World::new().await;
        let (_connection, channel) = channel().await;
        let exchange = exchange(&channel).await;
        let config = relay_config(&world, "rabbitmq", RABBITMQ, "rooms.{room_id}", &[("exchange", &exchange)]);
        write_config(&world, &config.yaml());
        let out = run_cli_beside(&world, &["check-config"]).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("config OK: sink relay loads and relays to broker events, which answers;"), "{stdout}");

        let missing = unique("missing");
        let config = relay_config(&world, "rabbitmq", RABBITMQ, "rooms.{room_id}", &[("exchange", &missing)]);
        write_config(&world, &config.yaml());
        let out = run_cli_beside(&world, &["check-config"]).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains(&format!("broker events: exchange {missing} does not exist")), "{stderr}");
    }

    #[tokio::test]
    async fn a_missing_exchange_refuses_start_naming_it() {
        let world = World::new().await;
        let missing = unique("missing");
        let config = relay_config(&world, "rabbitmq", RABBITMQ, "rooms.{room_id}", &[("exchange", &missing)]);
        let refused = outbox_host::app::Host::start(config.parse()).await.err().expect("refused");
        let text = format!("{refused:#}");
        assert!(text.contains(&format!("broker events: exchange {missing} does not exist")), "{text}");
    }
}

mod mqtt {
    use super::*;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};

    /// What a subscriber to `rooms/#` received: (topic, user properties), in order.
    type Received = std::sync::Arc<std::sync::Mutex<Vec<(String, Vec<(String, String)>)>>>;

    /// A subscriber to `rooms/#` at QoS 1, subscribed when this returns.
    async fn subscribe(server: &BrokerServer) -> (AsyncClient, Received) {
        let port: u16 = server.url().rsplit(':').next().unwrap().parse().unwrap();
        let (client, mut events) = AsyncClient::new(MqttOptions::new(unique("subscriber"), "127.0.0.1", port), 64);
        client.subscribe("rooms/#", QoS::AtLeastOnce).await.unwrap();
        let received: Received = Default::default();
        let (subscribed, mut on_subscribed) = tokio::sync::mpsc::channel(1);
        let into = received.clone();
        tokio::spawn(async move {
            while let Ok(event) = events.poll().await {
                match event {
                    Event::Incoming(Packet::SubAck(_)) => {
                        let _ = subscribed.try_send(());
                    }
                    Event::Incoming(Packet::Publish(p)) => {
                        let topic = String::from_utf8_lossy(&p.topic).to_string();
                        let properties = p.properties.map(|p| p.user_properties).unwrap_or_default();
                        into.lock().unwrap().push((topic, properties));
                    }
                    _ => {}
                }
            }
        });
        on_subscribed.recv().await.expect("subscribed");
        (client, received)
    }

    /// A subscriber to `rooms/#` at QoS 1 with a session the broker keeps across a clean
    /// restart, reconnecting by itself: every `outbox-dedup-id` it received.
    async fn persistent_subscriber(server: &BrokerServer) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
        use rumqttc::v5::mqttbytes::v5::ConnectProperties;
        let port: u16 = server.url().rsplit(':').next().unwrap().parse().unwrap();
        let mut options = MqttOptions::new(unique("persistent"), "127.0.0.1", port);
        let mut properties = ConnectProperties::new();
        properties.session_expiry_interval = Some(3_600);
        options.set_clean_start(false).set_connect_properties(properties);
        let (client, mut events) = AsyncClient::new(options, 1_024);
        client.subscribe("rooms/#", QoS::AtLeastOnce).await.unwrap();
        let received: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
        let (subscribed, mut on_subscribed) = tokio::sync::mpsc::channel(1);
        let into = received.clone();
        tokio::spawn(async move {
            let _client = client;
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = subscribed.try_send(());
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let properties = p.properties.map(|p| p.user_properties).unwrap_or_default();
                        if let Some((_, id)) = properties.into_iter().find(|(n, _)| n == "outbox-dedup-id") {
                            into.lock().unwrap().push(id);
                        }
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        on_subscribed.recv().await.expect("subscribed");
        received
    }

    /// The broker restarted three times mid-drain (cleanly, so that the subscriber's session
    /// and its queued messages survive): each PUBACK settles the publish that carried it, so
    /// the rows delivered are exactly the dedup ids the persistent subscriber received. (The
    /// client's queue used to send publishes left over from before a reconnect first, and
    /// their PUBACKs settled later events, which could then be recorded delivered unsent.)
    #[tokio::test]
    async fn acks_settle_their_own_publish_across_three_broker_restarts() {
        let world = World::new().await;
        let mut server = BrokerServer::of(Broker::Mosquitto).await;
        let received = persistent_subscriber(&server).await;
        let events = events(&world, 10, 200);
        world.producer.insert(&events).await.unwrap();
        let config = relay_config(&world, "mqtt", &server.url(), "rooms/{room_id}", &[]);
        let mut host = Running::start(config.parse()).await;
        for restart in 1..=3_i64 {
            host.wait_for_within("the next share delivered", PATIENCE, || async {
                world.producer.stats().await.unwrap().count(Status::Delivered) >= restart * 400
            })
            .await;
            server.signal("TERM");
            tokio::time::sleep(Duration::from_millis(300)).await;
            server.restart().await;
        }
        wait_delivered(&mut host, &world, &ids(&events)).await;
        host.stop().await;
        let wanted: std::collections::BTreeSet<String> = events.iter().map(|e| e.event_id.clone()).collect();
        let mut got = std::collections::BTreeSet::new();
        for _ in 0..100 {
            got = received.lock().unwrap().iter().cloned().collect();
            if got == wanted {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let missing: Vec<&String> = wanted.difference(&got).collect();
        assert!(missing.is_empty(), "{} delivered row(s) the subscriber never received: {missing:?}", missing.len());
        assert_eq!(got, wanted, "and nothing else");
    }

    /// 100 events over 5 rooms, each room to a topic of its own at QoS 1: each arrives once
    /// (nothing was lost, so nothing was sent twice), with its headers as user properties
    /// and its dedup id, each room's in order.
    #[tokio::test]
    async fn every_event_arrives_once_with_its_headers_as_user_properties_in_room_order() {
        let world = World::new().await;
        let server = BrokerServer::of(Broker::Mosquitto).await;
        let (_subscriber, received) = subscribe(&server).await;
        let events = events(&world, 5, 20);
        world.producer.insert(&events).await.unwrap();
        let mut host =
            Running::start(relay_config(&world, "mqtt", &server.url(), "rooms/{room_id}", &[]).parse()).await;
        host.wait_status(&world, &ids(&events), Status::Delivered).await;
        host.stop().await;
        let mut per_room: HashMap<String, Vec<String>> = HashMap::new();
        for _ in 0..100 {
            if received.lock().unwrap().len() >= events.len() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let received = received.lock().unwrap().clone();
        assert_eq!(received.len(), events.len(), "one message per event");
        for (topic, properties) in received {
            let property = |name: &str| properties.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
            let event_id = property("outbox-event-id").expect("an outbox-event-id user property");
            assert_eq!(property("outbox-dedup-id").as_ref(), Some(&event_id));
            assert_eq!(property("outbox-key").as_deref(), topic.strip_prefix("rooms/"), "the key is the room");
            per_room.entry(topic.trim_start_matches("rooms/").to_string()).or_default().push(event_id);
        }
        assert_eq!(per_room, by_room(&events), "each room's events in order");
    }

    /// A traced event's message carries its creation context as user properties; an
    /// untraced one's none.
    #[tokio::test]
    async fn a_traced_events_message_carries_its_creation_context() {
        let world = World::new().await;
        let server = BrokerServer::of(Broker::Mosquitto).await;
        let (_subscriber, received) = subscribe(&server).await;
        let otlp = outbox_test_support::otlp::OtlpReceiver::start().await;
        let config = relay_config(&world, "mqtt", &server.url(), "rooms/{room_id}", &[]);
        let (traced, plain) = traced_relay(&world, config, &otlp).await;
        assert_eq!(
            otlp.spans().iter().find(|s| s.attr("messaging.message.id") == traced).unwrap().attr("messaging.system"),
            "mqtt"
        );
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while received.lock().unwrap().len() < 2 {
            assert!(tokio::time::Instant::now() < deadline, "both messages arrive");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let received = received.lock().unwrap().clone();
        let property = |i: usize, name: &str| received[i].1.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
        assert_eq!(received.len(), 2);
        assert_eq!(property(0, "outbox-event-id").as_deref(), Some(traced.as_str()));
        assert_eq!(property(0, "traceparent").as_deref(), Some(TRACEPARENT));
        assert_eq!(property(0, "tracestate").as_deref(), Some(TRACESTATE));
        assert_eq!(property(1, "outbox-event-id").as_deref(), Some(plain.as_str()));
        assert_eq!((property(1, "traceparent"), property(1, "tracestate")), (None, None));
    }

    /// A broker killed and restarted: the events meanwhile are deferred with no attempt
    /// counted, and delivered (PUBACKed by the new broker) once it is back.
    #[tokio::test]
    async fn a_broker_that_goes_away_defers_the_events_and_burns_no_attempts() {
        let world = World::new().await;
        let mut server = BrokerServer::of(Broker::Mosquitto).await;
        let mut host =
            Running::start(relay_config(&world, "mqtt", &server.url(), "rooms/{room_id}", &[]).parse()).await;
        let first = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
        host.wait_status(&world, &[&first], Status::Delivered).await;
        server.stop();
        let during = events(&world, 3, 3);
        world.producer.insert(&during).await.unwrap();
        host.wait_for("an attempt to meet the missing broker", || async {
            world.row(&during[0].event_id).await.status == Status::Retryable
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        for e in &during {
            let row = world.row(&e.event_id).await;
            assert_eq!(row.retry_count, 0, "a broker away burned an attempt: {row:?}");
        }
        server.restart().await;
        // Delivered means the restarted broker PUBACKed each (no subscriber: nothing
        // would hold the messages published before it subscribed).
        wait_delivered(&mut host, &world, &ids(&during)).await;
        host.stop().await;
        for e in &during {
            assert_eq!(world.row(&e.event_id).await.retry_count, 0, "an attempt counted after the restart");
        }
    }

    /// 1,000 events over 10 rooms; the broker is killed once 100 are delivered and started
    /// again: nothing fails, no attempt is burned, readiness names the broker while it is
    /// away, and the new broker acknowledges every event left (one PUBACKed publish per
    /// event in all).
    #[tokio::test]
    async fn a_broker_restarted_mid_drain_loses_nothing_and_burns_no_attempts() {
        let world = World::new().await;
        let mut server = BrokerServer::of(Broker::Mosquitto).await;
        let events = events(&world, 10, 100);
        world.producer.insert(&events).await.unwrap();
        let config = relay_config(&world, "mqtt", &server.url(), "rooms/{room_id}", &[]);
        let mut host = Running::start(config.with_admin().parse()).await;
        let base = format!("http://{}", host.admin.unwrap());
        host.wait_for("100 events delivered", || async {
            world.producer.stats().await.unwrap().count(Status::Delivered) >= 100
        })
        .await;
        server.stop();
        assert!(world.producer.stats().await.unwrap().count(Status::Delivered) < 1_000, "drained before the stop");
        host.wait_for("readiness to name the missing broker", || async {
            let (status, body) = crate::breaker::get(&format!("{base}/readyz")).await;
            status == 503 && body.starts_with("broker events (mqtt) cannot be reached: ")
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(world.producer.stats().await.unwrap().count(Status::Failed), 0);
        server.restart().await;
        wait_delivered(&mut host, &world, &ids(&events)).await;
        let acked = metric(&base, "room_outbox_broker_publish_latency_ms_count{broker=\"events\"}").await;
        assert_eq!(acked, 1_000.0, "one acknowledged publish per event");
        host.stop().await;
        for e in &events {
            let row = world.row(&e.event_id).await;
            assert_eq!(row.retry_count, 0, "the restart burned an attempt: {row:?}");
        }
    }
}
