//! Relaying into NATS JetStream through the default relay (`plugins/relay`), against a
//! `nats-server -js` of each test's own: every event lands once in the stream (a replay
//! is deduplicated by `Nats-Msg-Id`), each room's events in order on its subject; a broker
//! that goes away defers the events without burning attempts; a missing stream refuses
//! start naming it.

use std::collections::HashMap;
use std::time::Duration;

use outbox_host::store::{ReplayFilter, Status};
use outbox_test_support::RELAY;
use outbox_test_support::brokers::NatsServer;

use crate::support::{PATIENCE, Running, SinkSpec, TestConfig, World, per_backend};

per_backend!(
    every_event_lands_once_in_the_stream_in_room_order_and_a_replay_adds_nothing,
    a_broker_that_goes_away_defers_the_events_and_burns_no_attempts
);

const STREAM: &str = "ROOMS";

/// A host's config relaying to `nats` through the default relay, one subject per room.
fn relay_config(world: &World, nats: &NatsServer, create_stream: bool) -> TestConfig {
    let relay = SinkSpec {
        name: "nats",
        plugin: RELAY,
        allowed_hosts: Vec::new(),
        config: "destination: \"rooms.{room_id}\"".to_string(),
    };
    world
        .setup_with("ordering: per_room\nbatch_size: 50\nconcurrency: 8", &relay)
        .set(&["sink", "broker"], "events")
        .set(&["brokers", "events", "kind"], "nats")
        .set(&["brokers", "events", "url"], &nats.url())
        .set(&["brokers", "events", "stream"], STREAM)
        .set(&["brokers", "events", "create_stream"], if create_stream { "true" } else { "false" })
        .set(&["brokers", "events", "subjects"], "[\"rooms.>\"]")
}

/// Every message of the stream: (subject, `Nats-Msg-Id`, `outbox-event-id`), in stream order.
async fn stream_messages(nats: &NatsServer) -> Vec<(String, String, String)> {
    let client = async_nats::connect(nats.url()).await.unwrap();
    let jetstream = async_nats::jetstream::new(client);
    let mut stream = jetstream.get_stream(STREAM).await.unwrap();
    let count = stream.info().await.unwrap().state.messages;
    let mut out = Vec::new();
    for sequence in 1..=count {
        let m = stream.get_raw_message(sequence).await.unwrap();
        let header = |name: &str| m.headers.get(name).map(|v| v.to_string()).unwrap_or_default();
        out.push((m.subject.to_string(), header("Nats-Msg-Id"), header("outbox-event-id")));
    }
    out
}

async fn every_event_lands_once_in_the_stream_in_room_order_and_a_replay_adds_nothing(world: World) {
    let nats = NatsServer::start().await;
    let mut events = Vec::new();
    for _ in 0..25 {
        for room in 0..20 {
            events.push(world.event("RoomGiftSent", &format!("room-{room}"), Status::Pending));
        }
    }
    world.producer.insert(&events).await.unwrap();
    let mut host = Running::start(relay_config(&world, &nats, true).parse()).await;
    let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    host.wait_status(&world, &ids, Status::Delivered).await;

    let messages = stream_messages(&nats).await;
    assert_eq!(messages.len(), events.len(), "one message per event");
    let mut per_subject: HashMap<String, Vec<String>> = HashMap::new();
    for (subject, msg_id, event_id) in &messages {
        assert_eq!(msg_id, event_id, "Nats-Msg-Id is the event id");
        per_subject.entry(subject.clone()).or_default().push(event_id.clone());
    }
    for room in 0..20 {
        let expected: Vec<String> =
            events.iter().filter(|e| e.room_id == format!("room-{room}")).map(|e| e.event_id.clone()).collect();
        assert_eq!(per_subject[&format!("rooms.room-{room}")], expected, "room-{room} in order on its subject");
    }

    // Delivered again (a replay, as after a crash between the ack and the outcome's write):
    // the stream deduplicates by Nats-Msg-Id.
    let everything = ReplayFilter { from_ms: 0, to_ms: None, event_type: None, room_id: None };
    let replayed = outbox_host::ops::replay(world.producer.clone(), "nats", &everything).await.unwrap();
    assert_eq!(replayed, events.len() as u64);
    host.wait_status(&world, &ids, Status::Delivered).await;
    host.stop().await;
    assert_eq!(stream_messages(&nats).await.len(), events.len(), "the replay added no message");
}

async fn a_broker_that_goes_away_defers_the_events_and_burns_no_attempts(world: World) {
    let mut nats = NatsServer::start().await;
    let mut host = Running::start(relay_config(&world, &nats, true).parse()).await;
    let first = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    host.wait_status(&world, &[&first], Status::Delivered).await;

    nats.stop();
    let during: Vec<_> =
        (0..10).map(|i| world.event("RoomGiftSent", &format!("room-{}", i % 3), Status::Pending)).collect();
    world.producer.insert(&during).await.unwrap();
    let ids: Vec<&str> = during.iter().map(|e| e.event_id.as_str()).collect();
    // Attempted and deferred while the broker is away: retryable with no attempt counted.
    host.wait_for("an attempt to meet the missing broker", || async {
        world.row(ids[0]).await.status == Status::Retryable
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for id in &ids {
        let row = world.row(id).await;
        assert_eq!(row.retry_count, 0, "{id}: a broker outage burned an attempt: {row:?}");
        assert_ne!(row.status, Status::Failed);
    }

    nats.restart().await;
    host.wait_for_within("every event delivered after the broker came back", PATIENCE, || async {
        let mut all = true;
        for id in &ids {
            all &= world.row(id).await.status == Status::Delivered;
        }
        all
    })
    .await;
    host.stop().await;
    let in_stream: Vec<String> = stream_messages(&nats).await.into_iter().map(|(_, _, id)| id).collect();
    assert_eq!(in_stream.len(), 11, "the first event and the ten, once each: {in_stream:?}");
    for id in std::iter::once(first.as_str()).chain(ids.iter().copied()) {
        assert_eq!(in_stream.iter().filter(|i| *i == id).count(), 1, "{id} once in the stream");
    }
}

#[tokio::test]
async fn a_missing_stream_refuses_start_naming_it() {
    let world = World::new().await;
    let nats = NatsServer::start().await;
    let refused =
        outbox_host::app::Host::start(relay_config(&world, &nats, false).parse()).await.err().expect("refused");
    let text = format!("{refused:#}");
    assert!(text.contains(&format!("broker events: stream {STREAM} does not exist")), "{text}");
}

/// 50,000 events over 500 rooms through the real binary, SIGKILLed mid-drain and started
/// again: the stream holds exactly 50,000 messages. What the killed host had published but
/// not yet marked delivered is published again by the next one and dropped by the stream
/// (`Nats-Msg-Id`); every event is delivered, so each is in the stream once.
#[tokio::test]
async fn fifty_thousand_events_through_a_killed_host_make_exactly_fifty_thousand_messages() {
    use crate::binary::{signal, spawn_host, wait_exit};
    const EVENTS: i64 = 50_000;
    let world = World::new().await;
    let nats = NatsServer::start().await;
    let events: Vec<_> =
        (0..EVENTS).map(|i| world.event("RoomGiftSent", &format!("room-{}", i % 500), Status::Pending)).collect();
    for chunk in events.chunks(5_000) {
        world.producer.insert(chunk).await.unwrap();
    }
    let yaml = relay_config(&world, &nats, true)
        .set(&["outbox_worker", "batch_size"], "500")
        .set(&["outbox_worker", "concurrency"], "64")
        .yaml();
    let delivered = || async { world.producer.stats().await.unwrap().count(Status::Delivered) };
    let drained = |what: &'static str, at_least: i64| async move {
        let deadline = std::time::Instant::now() + Duration::from_secs(600);
        while delivered().await < at_least {
            assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let first = spawn_host(&world, &yaml);
    drained("a fifth delivered", EVENTS / 5).await;
    signal(&first, "KILL");
    let killed_at = delivered().await;
    assert!(killed_at < EVENTS, "the host was killed mid-drain, not after it");
    drop(wait_exit(first).await);

    let second = spawn_host(&world, &yaml);
    drained("every event delivered", EVENTS).await;
    signal(&second, "TERM");
    assert!(wait_exit(second).await.status.success());
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut stream = async_nats::jetstream::new(client).get_stream(STREAM).await.unwrap();
    let state = stream.info().await.unwrap().state.clone();
    assert_eq!(state.messages as i64, EVENTS, "exactly one message per event (killed at {killed_at} delivered)");
}

/// A hot room through a room pipeline of 4 (concurrency 16), against a frozen NATS server:
/// exactly 4 of the room's events are published and wait for their acks together (the
/// pipeline bounds them, not the concurrency); thawed, the room's 40 events are all in the
/// stream, in order, once each.
#[tokio::test]
async fn a_hot_rooms_events_are_pipelined_in_order_up_to_the_room_pipeline() {
    use crate::support::metric;
    let world = World::new().await;
    let nats = NatsServer::start().await;
    let config = relay_config(&world, &nats, true)
        .set(&["brokers", "events", "room_pipeline"], "4")
        .set(&["outbox_worker", "concurrency"], "16")
        .set(&["outbox_worker", "publish_timeout"], "20s")
        .with_admin();
    let mut host = Running::start(config.parse()).await;
    let base = format!("http://{}", host.admin.unwrap());
    let in_flight = || metric(&base, "room_outbox_broker_acks_in_flight{broker=\"events\"}");
    let first = world.produce("RoomGiftSent", "room-hot", Status::Pending).await;
    host.wait_status(&world, &[&first], Status::Delivered).await;

    nats.signal("STOP");
    let events: Vec<_> = (0..40).map(|_| world.event("RoomGiftSent", "room-hot", Status::Pending)).collect();
    world.producer.insert(&events).await.unwrap();
    host.wait_for("4 of the room's events awaiting their acks", || async { in_flight().await >= 4.0 }).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(in_flight().await, 4.0, "the room pipeline bounds what is in flight");
    nats.signal("CONT");
    let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    host.wait_status(&world, &ids, Status::Delivered).await;
    host.stop().await;
    let in_stream: Vec<String> = stream_messages(&nats).await.into_iter().map(|(_, _, id)| id).collect();
    let expected: Vec<String> = std::iter::once(first).chain(events.iter().map(|e| e.event_id.clone())).collect();
    assert_eq!(in_stream, expected, "the room's events once each, in order");
}
