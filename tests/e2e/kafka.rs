//! Relaying into Kafka through the default relay (`plugins/relay`), against a tansu of each
//! test's own (a Kafka-protocol broker, `scripts/ensure-kafka.sh`), its records read back by
//! an independent consumer: keyed by room, a room's events in one partition in its order;
//! a host killed mid-drain loses nothing (the duplicates counted by `outbox-dedup-id`); a
//! broker stopped mid-drain costs no attempt; a topic that does not exist fails the attempt
//! naming it; a missing topic refuses start and `check-config` unless `create_topic`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use outbox_host::store::{NewEvent, Status};
use outbox_test_support::RELAY;
use outbox_test_support::brokers::{Broker, BrokerServer, KafkaRecord, kafka_records};

use crate::breaker::get;
use crate::brokers::{events, ids};
use crate::support::{PATIENCE, Running, SinkSpec, TestConfig, World, metric};

const TOPIC: &str = "rooms";

/// A host's config relaying through the default relay to Kafka broker `events` at `bootstrap`,
/// topic [`TOPIC`] (4 partitions, created by the host), each event to `destination` (a
/// relay template) keyed by its room.
fn kafka_config(world: &World, bootstrap: &str, destination: &str) -> TestConfig {
    let relay = SinkSpec {
        name: "relay",
        plugin: RELAY,
        allowed_hosts: Vec::new(),
        config: format!("destination: \"{destination}\""),
    };
    world
        .setup_with("ordering: per_room\nbatch_size: 50\nconcurrency: 8", &relay)
        .set(&["sink", "broker"], "events")
        .set(&["brokers", "events", "kind"], "kafka")
        .set(&["brokers", "events", "bootstrap"], &format!("[\"{bootstrap}\"]"))
        .set(&["brokers", "events", "topic"], TOPIC)
        .set(&["brokers", "events", "create_topic"], "true")
        .set(&["brokers", "events", "partitions"], "4")
}

/// What the topic holds against what was produced: every event at least once; each room's
/// records keyed by the room, all in one partition, their first copies in the room's order.
/// Returns how many records repeat an event already read (by `outbox-dedup-id`).
fn check_topic(events: &[NewEvent], records: &[KafkaRecord]) -> usize {
    let mut first_copies: HashMap<String, Vec<String>> = HashMap::new();
    let mut partitions: HashMap<String, HashSet<i32>> = HashMap::new();
    let mut seen = HashSet::new();
    let mut duplicates = 0;
    for record in records {
        let id = record.header("outbox-dedup-id").expect("an outbox-dedup-id header").to_string();
        assert_eq!(record.header("outbox-event-id"), Some(id.as_str()), "one record per event: its id is the dedup id");
        let room = record.header("outbox-room-id").expect("an outbox-room-id header").to_string();
        assert_eq!(record.key.as_deref(), Some(room.as_str()), "the record's key is its room");
        partitions.entry(room.clone()).or_default().insert(record.partition);
        if seen.insert(id.clone()) {
            first_copies.entry(room).or_default().push(id);
        } else {
            duplicates += 1;
        }
    }
    let mut expected: HashMap<String, Vec<String>> = HashMap::new();
    for e in events {
        expected.entry(e.room_id.clone()).or_default().push(e.event_id.clone());
    }
    for (room, ids) in &expected {
        assert_eq!(first_copies.get(room), Some(ids), "{room}: every event, in the room's order");
        assert_eq!(partitions[room].len(), 1, "{room}: in one partition, not {:?}", partitions[room]);
    }
    duplicates
}

/// 100 rooms × 100 events: the host creates the topic with 4 partitions; each event is one
/// record keyed by its room, a room's records in one partition in the room's order, the
/// rooms spread over the partitions; a clean run writes each event exactly once.
#[tokio::test]
async fn a_hundred_rooms_of_a_hundred_events_keep_each_rooms_order_in_one_partition() {
    let world = World::new().await;
    let server = BrokerServer::of(Broker::Kafka).await;
    let events = events(&world, 100, 100);
    for chunk in events.chunks(2_000) {
        world.producer.insert(chunk).await.unwrap();
    }
    let mut host = Running::start(kafka_config(&world, &server.address(), TOPIC).with_admin().parse()).await;
    let base = format!("http://{}", host.admin.unwrap());
    host.wait_for_within("10,000 events delivered", Duration::from_secs(300), || async {
        world.producer.stats().await.unwrap().count(Status::Delivered) == 10_000
    })
    .await;
    assert_eq!(metric(&base, "room_outbox_broker_up{broker=\"events\"}").await, 1.0);
    let series = "room_outbox_broker_publish_latency_ms_count{broker=\"events\"}";
    assert_eq!(metric(&base, series).await, 10_000.0, "10,000 acknowledged publishes");
    host.stop().await;
    let records = kafka_records(&server.address(), TOPIC).await;
    assert_eq!(records.len(), 10_000, "one record per event");
    assert_eq!(check_topic(&events, &records), 0, "no duplicates in a clean run");
    let used: HashSet<i32> = records.iter().map(|r| r.partition).collect();
    assert!(used.len() >= 3, "100 rooms over 4 partitions used only {used:?}");
    let first: serde_json::Value = serde_json::from_slice(&records[0].payload).unwrap();
    assert_eq!(first["event_id"], records[0].header("outbox-event-id").unwrap(), "the payload is the event: {first}");
}

/// 100 rooms × 100 events, the host SIGKILLed with a fifth delivered, then started again:
/// every event is in the topic, each room's first copies in its order in one partition; what the kill made the
/// host send again is counted by `outbox-dedup-id` and reported.
#[tokio::test]
async fn a_host_killed_mid_drain_and_restarted_loses_nothing() {
    use crate::binary::{signal, spawn_host, wait_exit};
    let world = World::new().await;
    let server = BrokerServer::of(Broker::Kafka).await;
    let events = events(&world, 100, 100);
    for chunk in events.chunks(5_000) {
        world.producer.insert(chunk).await.unwrap();
    }
    let yaml = kafka_config(&world, &server.address(), TOPIC)
        .set(&["outbox_worker", "batch_size"], "500")
        .set(&["outbox_worker", "concurrency"], "64")
        .yaml();
    let delivered = || async { world.producer.stats().await.unwrap().count(Status::Delivered) };
    let first = spawn_host(&world, &yaml);
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while delivered().await < 2_000 {
        assert!(std::time::Instant::now() < deadline, "a fifth was not delivered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal(&first, "KILL");
    let killed_at = delivered().await;
    assert!(killed_at < 10_000, "the host was killed mid-drain, not after it");
    drop(wait_exit(first).await);

    let second = spawn_host(&world, &yaml);
    crate::binary::wait_table(&world, "every event delivered", |s| s.count(Status::Delivered) == 10_000).await;
    signal(&second, "TERM");
    assert!(wait_exit(second).await.status.success());
    let records = kafka_records(&server.address(), TOPIC).await;
    let duplicates = check_topic(&events, &records);
    assert_eq!(records.len(), 10_000 + duplicates);
    eprintln!(
        "kafka, host killed at {killed_at} of 10000 delivered: {} records, {duplicates} duplicates by outbox-dedup-id",
        records.len()
    );
}

/// The broker SIGKILLed with a tenth delivered and started again on its store: no attempt
/// is counted while it is away and readiness names it; everything lands after, each room
/// in its order.
#[tokio::test]
async fn a_broker_stopped_mid_drain_costs_no_attempt_and_everything_lands_after() {
    let world = World::new().await;
    let mut server = BrokerServer::of(Broker::Kafka).await;
    let events = events(&world, 20, 100);
    world.producer.insert(&events).await.unwrap();
    let mut host = Running::start(kafka_config(&world, &server.address(), TOPIC).with_admin().parse()).await;
    let base = format!("http://{}", host.admin.unwrap());
    host.wait_for("200 events delivered", || async {
        world.producer.stats().await.unwrap().count(Status::Delivered) >= 200
    })
    .await;
    server.stop();
    assert!(world.producer.stats().await.unwrap().count(Status::Delivered) < 2_000, "the drain was over");
    host.wait_for("readiness to name the missing broker", || async {
        let (status, body) = get(&format!("{base}/readyz")).await;
        status == 503 && body.starts_with("broker events (kafka) cannot be reached: ")
    })
    .await;
    assert_eq!(metric(&base, "room_outbox_broker_up{broker=\"events\"}").await, 0.0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = world.producer.stats().await.unwrap();
    assert_eq!(stats.count(Status::Failed), 0, "nothing failed while the broker was away");
    assert!(stats.count(Status::Delivered) < 2_000, "events were delivered with no broker");

    server.restart().await;
    host.wait_for_within("every event delivered after the restart", Duration::from_secs(120), || async {
        world.producer.stats().await.unwrap().count(Status::Delivered) == 2_000
    })
    .await;
    host.stop().await;
    for id in ids(&events) {
        let row = world.row(id).await;
        assert_eq!(row.retry_count, 0, "{id}: the broker's restart burned an attempt: {row:?}");
    }
    let records = kafka_records(&server.address(), TOPIC).await;
    let duplicates = check_topic(&events, &records);
    eprintln!("kafka, broker restarted mid-drain: {} records, {duplicates} duplicates", records.len());
}

/// A topic the relay may reach but that does not exist: the broker's answer fails the
/// attempt and counts it, naming the topic; once the topic exists the event lands there.
#[tokio::test]
async fn a_topic_that_does_not_exist_fails_the_attempt_naming_it_until_it_is_made() {
    let world = World::new().await;
    let server = BrokerServer::of(Broker::Kafka).await;
    let config = kafka_config(&world, &server.address(), "rooms-{room_id}")
        .set(&["brokers", "events", "allowed_destinations"], "[\"rooms*\"]");
    let mut host = Running::start(config.parse()).await;
    let event = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    host.wait_for("an attempt on a missing topic to count", || async { world.row(&event).await.retry_count >= 1 })
        .await;
    let row = world.row(&event).await;
    assert_ne!(row.status, Status::Delivered);
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("broker events: topic rooms-room-1 does not exist"), "{error}");

    create_topic(&server, "rooms-room-1").await;
    host.wait_for_within("the event delivered once its topic exists", PATIENCE * 2, || async {
        world.row(&event).await.status == Status::Delivered
    })
    .await;
    host.stop().await;
    let records = kafka_records(&server.address(), "rooms-room-1").await;
    assert_eq!(records.iter().map(|r| r.header("outbox-event-id").unwrap()).collect::<Vec<_>>(), [event.as_str()]);
}

/// Creates `topic` with one partition on `server`, as an operator would.
async fn create_topic(server: &BrokerServer, topic: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        rdkafka::ClientConfig::new().set("bootstrap.servers", server.address()).create().unwrap();
    let made = admin
        .create_topics([&NewTopic::new(topic, 1, TopicReplication::Fixed(-1))], &AdminOptions::new())
        .await
        .unwrap();
    assert!(made.iter().all(Result::is_ok), "{made:?}");
}

/// Without `create_topic`, a missing topic refuses start and `check-config`, naming it;
/// with it, `check-config` makes the topic with its partitions and passes.
#[tokio::test]
async fn a_missing_topic_refuses_start_and_check_config_unless_the_host_may_create_it() {
    use crate::binary::{run_cli_beside, write_config};
    let world = World::new().await;
    let server = BrokerServer::of(Broker::Kafka).await;
    let without = kafka_config(&world, &server.address(), TOPIC).set(&["brokers", "events", "create_topic"], "false");
    let missing = "broker events: topic rooms does not exist (set create_topic: true, or create it)";
    let refused = outbox_host::app::Host::start(without.parse()).await.err().expect("refused");
    assert!(format!("{refused:#}").contains(missing), "{refused:#}");
    write_config(&world, &without.yaml());
    let out = run_cli_beside(&world, &["check-config"]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(missing), "{}", String::from_utf8_lossy(&out.stderr));

    write_config(&world, &kafka_config(&world, &server.address(), TOPIC).yaml());
    let out = run_cli_beside(&world, &["check-config"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("config OK: sink relay loads and relays to broker events, which answers;"), "{stdout}");
    let address = server.address();
    let partitions = tokio::task::spawn_blocking(move || {
        use rdkafka::consumer::{BaseConsumer, Consumer as _};
        let consumer: BaseConsumer =
            rdkafka::ClientConfig::new().set("bootstrap.servers", address).set("group.id", "check").create().unwrap();
        let metadata = consumer.fetch_metadata(Some(TOPIC), Duration::from_secs(10)).unwrap();
        metadata.topics()[0].partitions().len()
    })
    .await
    .unwrap();
    assert_eq!(partitions, 4, "check-config created the topic with its partitions");
}

/// A relay aimed by an event's field at the cluster's own topics or at a topic outside the
/// broker's (by default its `topic`) fails that event for good; nothing reaches them.
#[tokio::test]
async fn a_relay_never_reaches_the_clusters_own_topics_or_another_topic() {
    let world = World::new().await;
    let server = BrokerServer::of(Broker::Kafka).await;
    create_topic(&server, "audit").await;
    let mut host = Running::start(kafka_config(&world, &server.address(), "{app_code}").parse()).await;
    let aimed = |app_code: &str| NewEvent {
        app_code: app_code.to_string(),
        ..world.event("RoomGiftSent", "room-1", Status::Pending)
    };
    let (internal, other, fine) = (aimed("__consumer_offsets"), aimed("audit"), aimed(TOPIC));
    world.producer.insert(&[internal.clone(), other.clone(), fine.clone()]).await.unwrap();
    host.wait_status(&world, &[&internal.event_id, &other.event_id], Status::Failed).await;
    host.wait_status(&world, &[&fine.event_id], Status::Delivered).await;
    host.stop().await;
    let internal_why = world.row(&internal.event_id).await.last_error.unwrap_or_default();
    assert!(internal_why.contains("control plane"), "{internal_why}");
    let other_why = world.row(&other.event_id).await.last_error.unwrap_or_default();
    assert!(other_why.contains("outside allowed_destinations"), "{other_why}");
    assert!(kafka_records(&server.address(), "audit").await.is_empty(), "nothing reached topic audit");
    assert_eq!(kafka_records(&server.address(), TOPIC).await.len(), 1);
}

/// A cluster that cannot be reached: `check-config` fails within the start-up timeout,
/// naming the broker and the client's reason, and the SASL password is nowhere in what it
/// prints.
#[tokio::test]
async fn a_cluster_out_of_reach_fails_check_config_naming_it_without_the_password() {
    use crate::binary::{run_cli_beside, write_config};
    let world = World::new().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let config = kafka_config(&world, &closed.to_string(), TOPIC)
        .set(&["brokers", "events", "user"], "relay")
        .set(&["brokers", "events", "password"], "pw-never-printed-7731")
        .set(&["brokers", "events", "sasl_mechanism"], "SCRAM-SHA-256");
    write_config(&world, &config.yaml());
    let out = run_cli_beside(&world, &["check-config"]).await;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{stdout}");
    assert!(stderr.contains(&format!("broker events: cannot reach kafka://{closed}")), "{stderr}");
    assert!(!stdout.contains("pw-never-printed-7731") && !stderr.contains("pw-never-printed-7731"), "{stderr}");
}

/// A cluster that requires SASL SCRAM: the entry's `user`, `password` and
/// `sasl_mechanism` get the events through; a wrong password refuses `check-config` as a
/// refusal (not a cluster to wait for), and is printed nowhere.
#[tokio::test]
async fn a_cluster_that_requires_scram_takes_the_entrys_credentials_and_refuses_a_wrong_password() {
    use crate::binary::{run_cli_beside, write_config};
    let world = World::new().await;
    let mut server = BrokerServer::of(Broker::Kafka).await;
    server.add_kafka_user("relay", "right-pw-5512");
    server.require_authentication().await;
    let with = |password: &str| {
        kafka_config(&world, &server.address(), TOPIC)
            .set(&["brokers", "events", "user"], "relay")
            .set(&["brokers", "events", "password"], password)
            .set(&["brokers", "events", "sasl_mechanism"], "SCRAM-SHA-512")
    };
    write_config(&world, &with("wrong-pw-9918").yaml());
    let out = run_cli_beside(&world, &["check-config"]).await;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{stdout}");
    assert!(stderr.contains("broker events: cannot reach kafka://") && stderr.contains("uthentication"), "{stderr}");
    assert!(!stdout.contains("wrong-pw-9918") && !stderr.contains("wrong-pw-9918"), "{stderr}");

    let events = events(&world, 5, 10);
    world.producer.insert(&events).await.unwrap();
    let mut host = Running::start(with("right-pw-5512").parse()).await;
    host.wait_status(&world, &ids(&events), Status::Delivered).await;
    host.stop().await;
    // Read back by a consumer without credentials, once the broker takes such clients again.
    server.require_authentication_no_more().await;
    let records = kafka_records(&server.address(), TOPIC).await;
    assert_eq!((records.len(), check_topic(&events, &records)), (50, 0), "each event once, in room order");
}
