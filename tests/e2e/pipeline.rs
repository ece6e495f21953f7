//! The continuous pipeline: a room's events reach the sink one at a time and in order across
//! many claims while other rooms run in parallel, and shutdown hands back every buffered row.

use std::time::Duration;

use outbox_host::store::Status;

use crate::support::{Running, World, per_backend};

/// One room's 1,000 events over claims of 50, 16 deliveries at a time: the sink receives
/// them in creation order and never two at once (each takes 2 ms, so two starts closer than
/// that would mean overlap); other rooms' events overlap each other meanwhile.
async fn a_rooms_events_stay_in_order_across_claims(world: World) {
    const HOT: usize = 1_000;
    let mut hot = Vec::new();
    let mut batch = Vec::new();
    for i in 0..HOT {
        let event = world.event("RoomGiftSent", "room-hot", Status::Pending);
        hot.push(event.event_id.clone());
        batch.push(event);
        if i % 40 == 0 {
            batch.push(world.event("RoomUserJoined", &format!("room-cold-{i}"), Status::Pending));
        }
    }
    for chunk in batch.chunks(200) {
        world.producer.insert(chunk).await.unwrap();
    }
    let sink = "room.room-hot: sleep:2\ndefault: sleep:150";
    let mut host = Running::start(world.config("batch_size: 50\nconcurrency: 16", sink)).await;
    host.wait_for_within("every event delivered", Duration::from_secs(120), || async {
        world.producer.stats().await.unwrap().count(Status::Delivered) == batch.len() as i64
    })
    .await;
    host.stop().await;

    let reports = world.collector.reports();
    let seen: Vec<&str> = reports.iter().filter(|r| hot.contains(&r.event_id)).map(|r| r.event_id.as_str()).collect();
    assert_eq!(seen, hot.iter().map(String::as_str).collect::<Vec<_>>(), "the hot room's events out of order");
    let starts: Vec<std::time::Instant> = reports.iter().filter(|r| hot.contains(&r.event_id)).map(|r| r.at).collect();
    let overlapping = starts.windows(2).filter(|w| w[1] - w[0] < Duration::from_millis(2)).count();
    assert_eq!(overlapping, 0, "two of the hot room's events were in flight at once");
    let cold: Vec<std::time::Instant> = reports.iter().filter(|r| !hot.contains(&r.event_id)).map(|r| r.at).collect();
    let mut cold_sorted = cold.clone();
    cold_sorted.sort();
    assert!(
        cold_sorted.windows(2).any(|w| w[1] - w[0] < Duration::from_millis(150)),
        "no two other rooms' deliveries overlapped"
    );
}

/// Shutdown with a full buffer of claimed rows (`ordering: none`): the delivery in flight
/// finishes, every row claimed but not started goes back to `pending` at once, and nothing
/// is left `delivering`.
#[tokio::test]
async fn shutdown_hands_back_every_buffered_row() {
    let world = World::new().await;
    let mut ids = Vec::new();
    for i in 0..100 {
        ids.push(world.produce("RoomGiftSent", &format!("room-{i}"), Status::Pending).await);
    }
    let config =
        world.config("ordering: none\nbatch_size: 50\nconcurrency: 1\npublish_timeout: 5s", "default: sleep:300");
    let mut host = Running::start(config).await;
    host.wait_for("a full buffer and a delivery in flight", || async {
        let stats = world.producer.stats().await.unwrap();
        stats.count(Status::Delivering) >= 50 && !world.collector.reports().is_empty()
    })
    .await;
    host.stop().await;
    world.assert_handed_back(&ids, 100, 90).await;
}

/// Behind a backlog, claims grow on the server databases (up to `claim_growth`, by default
/// 4, times `batch_size`) while the sink keeps up, and every event is still delivered once;
/// on SQLite they stay `batch_size`. A slow sink keeps `batch_size` claims everywhere: the
/// rows in hand must start within a quarter of the lease at the rate it delivers.
async fn claims_grow_behind_a_backlog_only_as_far_as_the_sink_keeps_up(world: World) {
    let server = world.producer.backend() != outbox_host::store::Backend::Sqlite;
    // Fast: 1,000 events in 500 rooms, claims of 10 by default.
    let fast: Vec<_> =
        (0..1_000).map(|i| world.event("RoomGiftSent", &format!("room-{}", i % 500), Status::Pending)).collect();
    for chunk in fast.chunks(200) {
        world.producer.insert(chunk).await.unwrap();
    }
    let mut host = Running::start(world.config("concurrency: 8", "")).await;
    let claims = claim_sizes(&host);
    host.wait_for_within("every event delivered", Duration::from_secs(60), || async {
        world.producer.stats().await.unwrap().count(Status::Delivered) == fast.len() as i64
    })
    .await;
    host.stop().await;
    let claims = claims.await.unwrap();
    assert_eq!(claims.iter().sum::<usize>(), fast.len(), "claims {claims:?} did not take each event once");
    let largest = claims.iter().copied().max().unwrap();
    if server {
        assert!(largest > 10 && largest <= 40, "claims {claims:?}: none grew, or one past 4 × batch_size");
    } else {
        assert_eq!(largest, 10, "SQLite's claims grew: {claims:?}");
    }
    let mut delivered: Vec<String> = world.collector.reports().into_iter().map(|r| r.event_id).collect();
    delivered.sort();
    let mut expected: Vec<String> = fast.iter().map(|e| e.event_id.clone()).collect();
    expected.sort();
    assert_eq!(delivered, expected, "the sink did not receive every event exactly once");

    // Slow: one delivery at a time, 150 ms each (under 7 a second): a quarter of a 10 s lease
    // holds 16 starts, less than two claims of 20.
    let slow: Vec<_> = (0..60).map(|i| world.event("RoomGiftSent", &format!("slow-{i}"), Status::Pending)).collect();
    world.producer.insert(&slow).await.unwrap();
    let config = "batch_size: 10\nconcurrency: 1\npublish_timeout: 500ms\nlease_duration: 10s\nclaim_growth: 4";
    let mut host = Running::start(world.config(config, "default: sleep:150")).await;
    let claims = claim_sizes(&host);
    host.wait_for("40 slow deliveries", || async {
        world.producer.stats().await.unwrap().count(Status::Delivered) >= (fast.len() + 40) as i64
    })
    .await;
    host.stop().await;
    let claims = claims.await.unwrap();
    assert!(claims.len() >= 4, "claims {claims:?}: too few to have grown");
    assert!(claims.iter().all(|&n| n == 10), "a slow sink's claims grew: {claims:?}");
}

/// The rows of every claim the host makes from now until it stops.
fn claim_sizes(host: &Running) -> tokio::task::JoinHandle<Vec<usize>> {
    let mut signals = host.signals.resubscribe();
    tokio::spawn(async move {
        let mut sizes = Vec::new();
        loop {
            match signals.recv().await {
                Ok(outbox_host::engine::Signal::Claimed(n)) => sizes.push(n),
                Ok(outbox_host::engine::Signal::Stopped) | Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    return sizes;
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => panic!("{n} signals missed"),
            }
        }
    })
}

per_backend!(
    a_rooms_events_stay_in_order_across_claims,
    claims_grow_behind_a_backlog_only_as_far_as_the_sink_keeps_up,
    a_pipelined_sink_keeps_several_of_a_rooms_events_in_flight_in_order
);

/// A sink that declares it keeps order across deliveries in flight (as a broker publisher on
/// one connection does): here the real fake sink, declared so by the test.
struct Pipelined(std::sync::Arc<dyn outbox_host::sandbox::Deliver>);

#[async_trait::async_trait]
impl outbox_host::sandbox::Deliver for Pipelined {
    fn name(&self) -> &str {
        self.0.name()
    }

    async fn deliver(
        &self,
        event: &outbox_host::sandbox::Event,
        timeout: Duration,
    ) -> Result<outbox_host::sandbox::Delivered, outbox_host::sandbox::AttemptFailure> {
        self.0.deliver(event, timeout).await
    }

    fn room_pipeline(&self) -> u32 {
        4
    }
}

/// Per-room order with a room pipeline of 4: one room's 40 events start in order with
/// several in flight at once (never a fifth before one of four has ended: each takes 100
/// ms or more), and their outcomes are recorded in the room's order, although every fourth
/// takes 300 ms and the three behind it end first.
async fn a_pipelined_sink_keeps_several_of_a_rooms_events_in_flight_in_order(world: World) {
    let events: Vec<_> = (0..40)
        .map(|i| world.event(if i % 4 == 0 { "RoomMicChanged" } else { "RoomGiftSent" }, "room-hot", Status::Pending))
        .collect();
    world.producer.insert(&events).await.unwrap();
    let config =
        world.config("concurrency: 8\npublish_timeout: 2s", "default: sleep:100\ntype.RoomMicChanged: sleep:300");
    let sink = outbox_host::sandbox::SinkRuntime::load(&config.sinks[0].sandbox, 8).unwrap();
    let metrics = std::sync::Arc::new(outbox_host::ops::metrics::Metrics::new("fake"));
    let worker = outbox_host::engine::Worker::new(
        world.producer.clone(),
        std::sync::Arc::new(Pipelined(std::sync::Arc::new(sink))),
        config.worker,
        "n",
        metrics,
    );
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(worker.run(shutdown.clone()));
    let deadline = tokio::time::Instant::now() + crate::support::PATIENCE;
    while world.producer.stats().await.unwrap().count(Status::Delivered) < 40 {
        assert!(tokio::time::Instant::now() < deadline, "the room was not delivered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    task.await.unwrap().unwrap();

    let reports = world.collector.reports();
    let mut started: Vec<&str> = reports.iter().map(|r| r.event_id.as_str()).collect();
    // Deliveries in flight together report to the collector over separate requests, which
    // may arrive in any order; but an event starts only once the one four before it has
    // ended, after its report arrived.
    let position = |id: &str| started.iter().position(|s| *s == id).unwrap();
    for i in 4..events.len() {
        assert!(
            position(&events[i - 4].event_id) < position(&events[i].event_id),
            "event {i} started before event {} had ended",
            i - 4
        );
    }
    started.sort_unstable();
    let mut ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(started, ids, "an event was not delivered, or twice");
    let at: Vec<std::time::Instant> = reports.iter().map(|r| r.at).collect();
    assert!(at.windows(2).any(|w| w[1] - w[0] < Duration::from_millis(50)), "never two in flight at once");
    // A fifth starts only once the first of four has ended, 100 ms after it started (less
    // what the reports' arrival may shift).
    let fifths = at.windows(5).filter(|w| w[4] - w[0] < Duration::from_millis(80)).count();
    assert_eq!(fifths, 0, "five of the room's events in flight at once");
    let mut recorded = Vec::new();
    for e in &events {
        recorded.push(world.row(&e.event_id).await.delivered_at_ms.unwrap());
    }
    assert!(recorded.windows(2).all(|w| w[0] <= w[1]), "outcomes recorded out of the room's order: {recorded:?}");
}
