//! A relay confined to its broker's `allowed_destinations` (decision 0196), against real
//! brokers: a destination aimed at another stream, at the JetStream API, at `$SYS`, at a
//! foreign Redis stream or at the host's own dedup markers is never published. Per event,
//! the row fails for good with the reason; a template whose literal start cannot fit
//! refuses start and `check-config`. What the foreign target held is intact afterwards.
//!
//! The control-plane destinations cannot come out of the default relay's fields (it writes
//! a field's `$` as `_`), so a relay that returns them is built here without the start-up
//! check, as a third-party relay would return them at run time.

use std::sync::Arc;
use std::time::Duration;

use outbox_host::config::Config;
use outbox_host::ops::metrics::Metrics;
use outbox_host::relay::RelaySink;
use outbox_host::sandbox::relay::RelayRuntime;
use outbox_host::sandbox::{AttemptFailure, Deliver, Delivered, FailureClass};
use outbox_host::store::{NewEvent, Status};
use outbox_test_support::brokers::{Broker, BrokerServer, NatsServer};

use crate::binary::{run_cli_beside, write_config};
use crate::support::{Running, TestConfig, World};

/// One attempt of `event` through the config's relay and broker, as the engine makes it,
/// without the start-up check of the destination template.
async fn attempt(config: &Config, event: &NewEvent) -> Result<Delivered, AttemptFailure> {
    let timeout = Duration::from_secs(10);
    let metrics = Arc::new(Metrics::new("relay"));
    let sink = &config.sinks[0];
    let runtime = RelayRuntime::load_checked(&sink.sandbox, 1, timeout, metrics.clone()).await.unwrap();
    let publisher = outbox_host::relay::connect(&config.brokers[0]).await.unwrap();
    let relay = RelaySink::new(runtime, publisher, &metrics, 1);
    let event = outbox_host::envelope::first_attempt(event).unwrap();
    relay.deliver(&event, timeout).await
}

/// `attempt` failed for good, saying `why`.
fn assert_refused(attempt: Result<Delivered, AttemptFailure>, why: &str) {
    match attempt {
        Err(failure) => {
            assert_eq!(failure.class, FailureClass::Permanent, "{failure:?}");
            assert!(failure.message.contains(why), "{why:?} not in {:?}", failure.message);
        }
        Ok(delivered) => panic!("published: {delivered:?}"),
    }
}

/// Start and `check-config` both refuse `config`, naming `why`.
async fn assert_start_refused(world: &World, config: &TestConfig, why: &str) {
    let refused = outbox_host::app::Host::start(config.parse()).await.err().expect("start refused");
    let text = format!("{refused:#}");
    assert!(text.contains(why), "{why:?} not in {text}");
    assert!(text.contains("sink.config.destination"), "{text}");
    write_config(world, &config.yaml());
    let out = run_cli_beside(world, &["check-config"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "check-config passed");
    assert!(stderr.contains(why), "{why:?} not in {stderr}");
}

mod nats {
    use super::*;
    use crate::relay::{STREAM, relay_config};

    /// A stream nobody in the config owns, holding `n` messages on `other.x`.
    async fn other_stream(nats: &NatsServer, n: usize) -> async_nats::jetstream::Context {
        let jetstream = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
        let config = async_nats::jetstream::stream::Config {
            name: "OTHER".into(),
            subjects: vec!["other.>".into()],
            ..Default::default()
        };
        jetstream.create_stream(config).await.unwrap();
        for i in 0..n {
            jetstream.publish("other.x", format!("m{i}").into()).await.unwrap().await.unwrap();
        }
        jetstream
    }

    async fn messages(jetstream: &async_nats::jetstream::Context, stream: &str) -> u64 {
        jetstream.get_stream(stream).await.unwrap().info().await.unwrap().state.messages
    }

    /// By default a relay publishes into its stream's subjects only: an event whose
    /// destination is another stream's subject fails with the reason, never published, while
    /// the room next to it is delivered.
    #[tokio::test]
    async fn a_destination_in_another_stream_fails_the_event_and_leaves_that_stream_intact() {
        let world = World::new().await;
        let nats = NatsServer::start().await;
        let jetstream = other_stream(&nats, 100).await;
        let config = relay_config(&world, &nats, true).set(&["sink", "config", "destination"], "{room_id}.gift");
        let mut host = Running::start(config.parse()).await;
        let ours = world.produce("RoomGiftSent", "rooms", Status::Pending).await;
        let theirs = world.produce("RoomGiftSent", "other", Status::Pending).await;
        host.wait_status(&world, &[&ours], Status::Delivered).await;
        host.wait_status(&world, &[&theirs], Status::Failed).await;
        host.stop().await;
        let row = world.row(&theirs).await;
        let error = row.last_error.unwrap_or_default();
        assert!(error.contains("destination \"other.gift\" is outside allowed_destinations [\"rooms.>\"]"), "{error}");
        assert_eq!(messages(&jetstream, "OTHER").await, 100, "the other stream is intact");
        assert_eq!(messages(&jetstream, STREAM).await, 1, "the allowed event landed");
    }

    /// The JetStream API and `$SYS` are refused whatever `allowed_destinations` says: per
    /// event (never published: the stream the purge names keeps its messages), and at start
    /// and by `check-config` for a template that begins there.
    #[tokio::test]
    async fn the_jetstream_api_and_sys_are_refused_per_event_and_at_start() {
        let world = World::new().await;
        let nats = NatsServer::start().await;
        let jetstream = other_stream(&nats, 100).await;
        for destination in ["$JS.API.STREAM.PURGE.OTHER", "$SYS.REQ.SERVER.PING", "_INBOX.stolen"] {
            let config = relay_config(&world, &nats, true)
                .set(&["brokers", "events", "allowed_destinations"], "[\">\"]")
                .set(&["sink", "config", "destination"], destination);
            let event = world.event("RoomGiftSent", "room-1", Status::Pending);
            assert_refused(attempt(&config.parse(), &event).await, "control plane");
            assert_start_refused(&world, &config, "control plane").await;
        }
        assert_eq!(messages(&jetstream, "OTHER").await, 100, "no purge reached OTHER");
    }

    /// Explicit patterns narrow the default, and a template whose literal start fits none
    /// of them refuses start.
    #[tokio::test]
    async fn a_template_outside_the_patterns_refuses_start_and_check_config() {
        let world = World::new().await;
        let nats = NatsServer::start().await;
        let config = relay_config(&world, &nats, true)
            .set(&["brokers", "events", "allowed_destinations"], "[\"rooms.app-1.*\"]")
            .set(&["sink", "config", "destination"], "rooms.other.{room_id}");
        assert_start_refused(&world, &config, "no destination beginning \"rooms.other.\"").await;
    }
}

mod redis {
    use super::*;
    use crate::brokers::relay_config;
    use ::redis::AsyncCommands as _;

    /// A Redis relay allowed `rooms:*` never adds to (or trims, with `max_len`) another
    /// application's stream, and never touches the host's own dedup markers.
    #[tokio::test]
    async fn a_foreign_stream_and_the_dedup_markers_are_never_written() {
        let world = World::new().await;
        let server = BrokerServer::of(Broker::Redis).await;
        let client = ::redis::Client::open(server.url()).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        for i in 0..10 {
            let _: String = connection.xadd("orders:gift", "*", &[("n", i)]).await.unwrap();
        }
        // The markers are `outbox-dedup:{<stream>}:<id>`; a template cannot write braces, but a
        // third-party relay could return any key under the prefix.
        let marker = "outbox-dedup:rooms:gift:evt-x";
        let _: () = connection.set(marker, "kept").await.unwrap();

        let config = relay_config(&world, "redis", &server.url(), "{room_id}:gift", &[("max_len", "1")])
            .set(&["brokers", "events", "allowed_destinations"], "[\"rooms:*\"]");
        let mut host = Running::start(config.parse()).await;
        let ours = world.produce("RoomGiftSent", "rooms", Status::Pending).await;
        let theirs = world.produce("RoomGiftSent", "orders", Status::Pending).await;
        host.wait_status(&world, &[&ours], Status::Delivered).await;
        host.wait_status(&world, &[&theirs], Status::Failed).await;
        host.stop().await;
        let error = world.row(&theirs).await.last_error.unwrap_or_default();
        assert!(error.contains("destination \"orders:gift\" is outside allowed_destinations"), "{error}");
        let len: u64 = connection.xlen("orders:gift").await.unwrap();
        assert_eq!(len, 10, "the foreign stream neither grew nor was trimmed");

        // A relay that returns the marker's key, allowed everything: refused all the same.
        let config = relay_config(&world, "redis", &server.url(), marker, &[])
            .set(&["brokers", "events", "allowed_destinations"], "[\"*\"]");
        let event = world.event("RoomGiftSent", "room-1", Status::Pending);
        assert_refused(attempt(&config.parse(), &event).await, "control plane");
        assert_start_refused(&world, &config, "control plane").await;
        let kept: String = connection.get(marker).await.unwrap();
        assert_eq!(kept, "kept", "the marker is untouched");
    }
}

mod mqtt {
    use super::*;
    use crate::brokers::relay_config;

    /// `$` topics are the broker's own: refused per event and at start, whatever the
    /// patterns; a topic outside them fails the event.
    #[tokio::test]
    async fn sys_topics_and_topics_outside_the_patterns_are_refused() {
        let world = World::new().await;
        let server = BrokerServer::of(Broker::Mosquitto).await;
        let config = relay_config(&world, "mqtt", &server.url(), "$SYS/broker/forged", &[])
            .set(&["brokers", "events", "allowed_destinations"], "[\"#\"]");
        let event = world.event("RoomGiftSent", "room-1", Status::Pending);
        assert_refused(attempt(&config.parse(), &event).await, "control plane");
        assert_start_refused(&world, &config, "control plane").await;

        let config = relay_config(&world, "mqtt", &server.url(), "{room_id}/events", &[])
            .set(&["brokers", "events", "allowed_destinations"], "[\"rooms/#\"]");
        let event = world.event("RoomGiftSent", "devices", Status::Pending);
        assert_refused(attempt(&config.parse(), &event).await, "is outside allowed_destinations [\"rooms/#\"]");
        let event = world.event("RoomGiftSent", "rooms", Status::Pending);
        assert!(matches!(attempt(&config.parse(), &event).await, Ok(Delivered::Delivered)));
    }
}

mod rabbitmq {
    use super::*;
    use crate::brokers::{RABBITMQ, relay_config};

    /// On the default exchange a routing key names any queue: `amq.` (the server's own
    /// queues, direct reply-to) is refused whatever the patterns, and a queue outside them
    /// fails the event.
    #[tokio::test]
    async fn the_default_exchange_reaches_only_the_queues_allowed() {
        let world = World::new().await;
        let config = relay_config(&world, "rabbitmq", RABBITMQ, "amq.rabbitmq.reply-to", &[])
            .set(&["brokers", "events", "allowed_destinations"], "[\"#\"]");
        let event = world.event("RoomGiftSent", "room-1", Status::Pending);
        assert_refused(attempt(&config.parse(), &event).await, "control plane");
        assert_start_refused(&world, &config, "control plane").await;

        let config = relay_config(&world, "rabbitmq", RABBITMQ, "{room_id}", &[])
            .set(&["brokers", "events", "allowed_destinations"], "[\"room-events\"]");
        let event = world.event("RoomGiftSent", "billing", Status::Pending);
        assert_refused(attempt(&config.parse(), &event).await, "is outside allowed_destinations [\"room-events\"]");
    }
}
