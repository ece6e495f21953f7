//! Relaying into NATS JetStream through the default relay (`plugins/relay`), against a
//! `nats-server -js` of each test's own: every event lands once in the stream (a replay
//! is deduplicated by `Nats-Msg-Id`), each room's events in order on its subject; a broker
//! that goes away, idle or mid-drain, defers the events without burning attempts while
//! readiness and the page say so; a missing stream refuses start and `check-config`,
//! naming it.

use std::collections::HashMap;
use std::time::Duration;

use outbox_host::store::{ReplayFilter, Status};
use outbox_test_support::RELAY;
use outbox_test_support::brokers::NatsServer;

use crate::breaker::get;
use crate::support::{PATIENCE, Running, SinkSpec, TestConfig, World, metric, per_backend};

per_backend!(
    every_event_lands_once_in_the_stream_in_room_order_and_a_replay_adds_nothing,
    a_broker_that_goes_away_defers_the_events_and_burns_no_attempts
);

pub(crate) const STREAM: &str = "ROOMS";

/// The default relay as sink `nats`, one subject per room (`rooms.{room_id}`).
pub(crate) fn nats_relay() -> SinkSpec {
    SinkSpec {
        name: "nats",
        plugin: RELAY,
        allowed_hosts: Vec::new(),
        config: "destination: \"rooms.{room_id}\"".to_string(),
    }
}

/// A host's config relaying to `nats` through the default relay, one subject per room.
pub(crate) fn relay_config(world: &World, nats: &NatsServer, create_stream: bool) -> TestConfig {
    world
        .setup_with("ordering: per_room\nbatch_size: 50\nconcurrency: 8", &nats_relay())
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

/// Every room's events, in the order they were produced, against every subject's messages
/// in stream order (the first copy of each: a replay may add none).
fn assert_room_order(events: &[outbox_host::store::NewEvent], messages: &[(String, String, String)]) {
    let mut per_subject: HashMap<&str, Vec<&str>> = HashMap::new();
    for (subject, _, event_id) in messages {
        let seen = per_subject.entry(subject.as_str()).or_default();
        if !seen.contains(&event_id.as_str()) {
            seen.push(event_id);
        }
    }
    let mut expected: HashMap<String, Vec<&str>> = HashMap::new();
    for e in events {
        expected.entry(format!("rooms.{}", e.room_id)).or_default().push(&e.event_id);
    }
    for (subject, ids) in &expected {
        assert_eq!(per_subject.get(subject.as_str()), Some(ids), "{subject}: every event, in room order");
    }
}

/// 100 rooms × 100 events.
async fn every_event_lands_once_in_the_stream_in_room_order_and_a_replay_adds_nothing(world: World) {
    let nats = NatsServer::start().await;
    let mut events = Vec::new();
    for _ in 0..100 {
        for room in 0..100 {
            events.push(world.event("RoomGiftSent", &format!("room-{room}"), Status::Pending));
        }
    }
    world.producer.insert(&events).await.unwrap();
    let mut host = Running::start(relay_config(&world, &nats, true).parse()).await;
    let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    host.wait_status(&world, &ids, Status::Delivered).await;

    let messages = stream_messages(&nats).await;
    assert_eq!(messages.len(), events.len(), "one message per event");
    for (_, msg_id, event_id) in &messages {
        assert_eq!(msg_id, event_id, "Nats-Msg-Id is the event id");
    }
    assert_room_order(&events, &messages);

    // Delivered again (a replay, as after a crash between the ack and the outcome's write):
    // the stream deduplicates by Nats-Msg-Id.
    let everything = ReplayFilter { from_ms: 0, to_ms: None, event_type: None, room_id: None, event_id: None };
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

/// 2,000 events over 20 rooms; the broker is stopped once 200 are delivered and started
/// again a few seconds later. Meanwhile no attempt is burned, nothing fails, readiness is
/// 503 naming the broker, and the page and `/api/status` show it down; afterwards every
/// event is delivered, each once in the stream and every room in order, and the host is
/// ready again.
#[tokio::test]
async fn a_broker_restarted_mid_drain_loses_nothing_and_readiness_says_it_was_away() {
    let world = World::new().await;
    let mut nats = NatsServer::start().await;
    let events: Vec<_> =
        (0..2_000).map(|i| world.event("RoomGiftSent", &format!("room-{}", i % 20), Status::Pending)).collect();
    world.producer.insert(&events).await.unwrap();
    let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    let mut host = Running::start(relay_config(&world, &nats, true).with_admin().parse()).await;
    let base = format!("http://{}", host.admin.unwrap());
    assert_eq!(get(&format!("{base}/readyz")).await, (200, "ready\n".into()));
    assert_eq!(metric(&base, "room_outbox_broker_up{broker=\"events\"}").await, 1.0);
    host.wait_for("200 events delivered", || async {
        world.producer.stats().await.unwrap().count(Status::Delivered) >= 200
    })
    .await;
    nats.stop();
    let delivered_at_stop = world.producer.stats().await.unwrap().count(Status::Delivered);
    assert!(delivered_at_stop < 2_000, "the drain was over before the broker stopped");

    host.wait_for("readiness to name the missing broker", || async {
        let (status, body) = get(&format!("{base}/readyz")).await;
        status == 503 && body.starts_with("broker events (nats) cannot be reached: ")
    })
    .await;
    assert_eq!(metric(&base, "room_outbox_broker_up{broker=\"events\"}").await, 0.0);
    let page = get(&format!("{base}/")).await.1;
    assert!(page.contains("<p class=\"broker down\" data-broker=\"events\""), "the page shows the broker down");
    let status: serde_json::Value = serde_json::from_str(&get(&format!("{base}/api/status")).await.1).unwrap();
    assert_eq!(status["brokers"][0]["name"], "events");
    assert_eq!(status["brokers"][0]["up"], false, "{status}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = world.producer.stats().await.unwrap();
    assert_eq!(stats.count(Status::Failed), 0, "nothing failed while the broker was away");
    assert!(stats.count(Status::Delivered) < 2_000, "events were delivered with no broker");

    nats.restart().await;
    host.wait_status(&world, &ids, Status::Delivered).await;
    host.wait_for("readiness once the broker is back", || async {
        get(&format!("{base}/readyz")).await == (200, "ready\n".to_string())
    })
    .await;
    let page = get(&format!("{base}/")).await.1;
    assert!(page.contains("<p class=\"broker up\" data-broker=\"events\""), "the page shows the broker up");
    host.stop().await;
    for id in &ids {
        let row = world.row(id).await;
        assert_eq!(row.retry_count, 0, "{id}: the restart burned an attempt: {row:?}");
    }
    let messages = stream_messages(&nats).await;
    assert_eq!(messages.len(), 2_000, "each event once in the stream (Nats-Msg-Id dropped what was sent again)");
    assert_room_order(&events, &messages);
}

/// The relay's plugin file replaced while it drains 2,000 events: the new build is swapped
/// in on the same broker connection, a file that is not a component is refused and the
/// build in place goes on; every event lands once, in room order, and the rows record both
/// builds.
#[tokio::test]
async fn a_relay_reloaded_mid_drain_keeps_its_broker_and_loses_nothing() {
    use crate::reload::{another_build, deploy, digest};
    let world = World::new().await;
    let nats = NatsServer::start().await;
    let original = std::fs::read(RELAY).unwrap();
    let plugin = world.dir.path().join("relay.wasm");
    std::fs::write(&plugin, &original).unwrap();
    let events: Vec<_> =
        (0..2_000).map(|i| world.event("RoomGiftSent", &format!("room-{}", i % 20), Status::Pending)).collect();
    world.producer.insert(&events).await.unwrap();
    let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    let config = relay_config(&world, &nats, true)
        .set(&["sink", "plugin"], plugin.to_str().unwrap())
        .set(&["sink", "rate_limit"], "200/s")
        .with_admin();
    let mut host = Running::start(config.parse()).await;
    let base = format!("http://{}", host.admin.unwrap());
    let reloads = |result: &str| format!("room_outbox_sink_reloads_total{{sink=\"nats\",result=\"{result}\"}}");
    host.wait_for("200 events delivered", || async {
        world.producer.stats().await.unwrap().count(Status::Delivered) >= 200
    })
    .await;
    let second = another_build(&original, "2");
    deploy(&plugin, &second);
    host.wait_for("the second build swapped in", || async { metric(&base, &reloads("ok")).await >= 1.0 }).await;
    deploy(&plugin, b"not a component at all");
    host.wait_for("the broken build refused", || async { metric(&base, &reloads("refused")).await >= 1.0 }).await;
    assert!(
        world.producer.stats().await.unwrap().count(Status::Delivered) < 2_000,
        "both reloads happened while it drained"
    );
    host.wait_status(&world, &ids, Status::Delivered).await;
    assert_eq!(metric(&base, "room_outbox_broker_up{broker=\"events\"}").await, 1.0);
    host.stop().await;

    let mut builds = std::collections::HashSet::new();
    for id in &ids {
        let row = world.row(id).await;
        assert_eq!(row.retry_count, 0, "{row:?}");
        builds.insert(row.plugin_digest.expect("the build recorded with the outcome"));
    }
    assert_eq!(builds, [digest(&original), digest(&second)].into(), "both builds relayed");
    let messages = stream_messages(&nats).await;
    assert_eq!(messages.len(), 2_000, "each event once in the stream");
    assert_room_order(&events, &messages);
}

/// A subject that no stream takes is refused by the server (no responders): the attempt
/// counts and `last_error` names the subject, while the broker is up (it answered).
#[tokio::test]
async fn a_subject_no_stream_takes_fails_the_attempt_naming_it() {
    let world = World::new().await;
    let nats = NatsServer::start().await;
    // Allowed everywhere (but the control plane), so that the server, not the host, refuses.
    let config = relay_config(&world, &nats, true)
        .set(&["brokers", "events", "allowed_destinations"], "[\">\"]")
        .set(&["sink", "config", "destination"], "elsewhere.{room_id}");
    let mut host = Running::start(config.with_admin().parse()).await;
    let base = format!("http://{}", host.admin.unwrap());
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    host.wait_for("the attempt to count", || async { world.row(&id).await.retry_count >= 1 }).await;
    let row = world.row(&id).await;
    assert_ne!(row.status, Status::Delivered);
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("broker events: no stream takes subject elsewhere.room-1"), "{error}");
    let refused = metric(&base, "room_outbox_broker_errors_total{broker=\"events\",kind=\"refused\"}").await;
    assert!(refused >= 1.0, "the refusal counted as refused: {refused}");
    assert_eq!(metric(&base, "room_outbox_broker_up{broker=\"events\"}").await, 1.0);
    host.stop().await;
}

/// A stream that does not exist (and is not to be created) refuses start and fails
/// `check-config`, each naming the broker and the stream; once created, `check-config` says
/// the broker answers.
#[tokio::test]
async fn a_missing_stream_refuses_start_and_check_config_naming_it() {
    use crate::binary::{run_cli_beside, write_config};
    let world = World::new().await;
    let nats = NatsServer::start().await;
    let config = relay_config(&world, &nats, false);
    let refused = outbox_host::app::Host::start(config.clone().parse()).await.err().expect("refused");
    let text = format!("{refused:#}");
    let named = format!("broker events: stream {STREAM} does not exist");
    assert!(text.contains(&named), "{text}");

    write_config(&world, &config.yaml());
    let out = run_cli_beside(&world, &["check-config"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "check-config passed with no stream");
    assert!(stderr.contains(&named), "{stderr}");

    write_config(&world, &relay_config(&world, &nats, true).yaml());
    let out = run_cli_beside(&world, &["check-config"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("relays to broker events, which answers;"), "{stdout}");
}

/// A broker that cannot be reached when the host starts is waited for, as the database is:
/// the host starts, readiness says 503 naming the broker, events wait without an attempt
/// counted; once the broker is up, the relay connects (creating its stream) and delivers
/// them, each once, and the host is ready. A SIGTERM'd `run` waiting so exits 0.
#[tokio::test]
async fn a_broker_out_of_reach_at_start_is_waited_for_naming_it() {
    let world = World::new().await;
    let mut nats = NatsServer::start().await;
    nats.stop();
    let mut host = Running::start(relay_config(&world, &nats, true).with_admin().parse()).await;
    let base = format!("http://{}", host.admin.unwrap());
    let events: Vec<_> =
        (0..200).map(|i| world.event("RoomGiftSent", &format!("room-{}", i % 10), Status::Pending)).collect();
    world.producer.insert(&events).await.unwrap();
    let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    host.wait_for("readiness to name the broker not reached", || async {
        let (status, body) = get(&format!("{base}/readyz")).await;
        status == 503 && body.starts_with("broker events (nats) cannot be reached: ")
    })
    .await;
    assert_eq!(metric(&base, "room_outbox_broker_up{broker=\"events\"}").await, 0.0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    for id in &ids {
        let row = world.row(id).await;
        assert!(row.status != Status::Delivered && row.retry_count == 0, "{id} with no broker: {row:?}");
    }

    nats.restart().await;
    host.wait_status(&world, &ids, Status::Delivered).await;
    host.wait_for("readiness once the broker answers", || async {
        get(&format!("{base}/readyz")).await == (200, "ready\n".to_string())
    })
    .await;
    host.stop().await;
    for id in &ids {
        assert_eq!(world.row(id).await.retry_count, 0, "{id}: waiting for the broker burned an attempt");
    }
    let messages = stream_messages(&nats).await;
    assert_eq!(messages.len(), events.len(), "each event once in the stream");
    assert_room_order(&events, &messages);

    // The real binary: it starts, logs the wait, and a SIGTERM while it waits exits 0.
    use crate::binary::{signal, spawn_host, wait_exit};
    let away = format!("nats://127.0.0.1:{}", crate::binary::free_port());
    let yaml = relay_config(&world, &nats, true).set(&["brokers", "events", "url"], &away).yaml();
    let child = spawn_host(&world, &yaml);
    tokio::time::sleep(Duration::from_secs(3)).await;
    signal(&child, "TERM");
    let output = wait_exit(child).await;
    let log = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "log:\n{log}");
    assert!(log.contains("the broker cannot be reached at start-up; its relays wait for it"), "log:\n{log}");
    assert!(log.contains(&format!("broker events: cannot connect to {away}")), "log:\n{log}");
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

/// A relay's instance that returned routes the next events too (`route` is pure), at most
/// the sink's concurrency of them kept: 200 events routed 8 at a time through a relay of
/// concurrency 2 each get their own record (destination, key, event id), whether their
/// instance was fresh or had routed before; a failure the mapping returns keeps the instance.
#[tokio::test]
async fn reused_relay_instances_route_each_event_as_its_own() {
    use outbox_host::config::{PluginConfig, SinkSettings};
    use outbox_host::sandbox::relay::RelayRuntime;
    let world = World::new().await;
    let settings = [("destination", "rooms.{room_id}"), ("format", "json")];
    let config = PluginConfig {
        cache_dir: Some(world.dir.path().join("cache")),
        config: SinkSettings(settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..PluginConfig::with_defaults("relay", RELAY.into())
    };
    let metrics = std::sync::Arc::new(outbox_host::ops::metrics::Metrics::new("relay"));
    let relay = RelayRuntime::load_checked(&config, 2, Duration::from_secs(5), metrics).await.unwrap();
    let event = |i: usize| outbox_host::sandbox::Event {
        app_code: "app".into(),
        event_id: format!("event-{i}"),
        event_type: "RoomGiftSent".into(),
        room_id: format!("room-{}", i % 7),
        room_version: i as i64,
        occurred_at_ms: 1,
        body: outbox_proto::body_from_json("RoomGiftSent", &serde_json::json!({ "gift_id": format!("gift-{i}") }))
            .unwrap()
            .unwrap(),
        attempt: 1,
    };
    for chunk in (0..200).collect::<Vec<_>>().chunks(8) {
        let routed = futures_util::future::join_all(chunk.iter().map(|&i| {
            let (relay, event) = (&relay, event(i));
            async move { (i, relay.route(&event, Duration::from_secs(5)).await) }
        }))
        .await;
        for (i, records) in routed {
            let records = records.unwrap_or_else(|f| panic!("event {i}: {}", f.message));
            assert_eq!(records.len(), 1);
            let record = &records[0];
            assert_eq!(record.destination, format!("rooms.room-{}", i % 7));
            assert_eq!(record.key.as_deref(), Some(format!("room-{}", i % 7).as_str()));
            let header = |name: &str| record.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
            assert_eq!(header("outbox-event-id"), Some(format!("event-{i}")));
            let payload: serde_json::Value = serde_json::from_slice(&record.payload).unwrap();
            assert_eq!(payload["body"]["gift_id"], format!("gift-{i}"), "{payload}");
        }
        let kept = relay.instances_kept();
        assert!((1..=2).contains(&kept), "{kept} instances kept for a concurrency of 2");
    }
    let mut broken = event(0);
    broken.body = vec![0xff, 0xff, 0xff];
    let Err(failure) = relay.route(&broken, Duration::from_secs(5)).await else {
        panic!("a body that does not decode was routed")
    };
    assert!(failure.message.contains("does not decode"), "{}", failure.message);
    assert!(relay.instances_kept() >= 1, "a failure the mapping returned keeps its instance");
    let records = relay.route(&event(7), Duration::from_secs(5)).await.unwrap();
    assert_eq!(records[0].destination, "rooms.room-0");
}
