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

per_backend!(a_rooms_events_stay_in_order_across_claims);

/// Shutdown with a full buffer: the delivery in flight finishes, every row claimed but not
/// started goes back to `pending` at once, and nothing is left `delivering`.
#[tokio::test]
async fn shutdown_hands_back_every_buffered_row() {
    let world = World::new().await;
    let mut ids = Vec::new();
    for i in 0..100 {
        ids.push(world.produce("RoomGiftSent", &format!("room-{i}"), Status::Pending).await);
    }
    let config = world.config("batch_size: 50\nconcurrency: 1\npublish_timeout: 5s", "default: sleep:300");
    let mut host = Running::start(config).await;
    host.wait_for("a full buffer and a delivery in flight", || async {
        let stats = world.producer.stats().await.unwrap();
        stats.count(Status::Delivering) >= 50 && !world.collector.reports().is_empty()
    })
    .await;
    host.stop().await;
    world.assert_handed_back(&ids, 100, 90).await;
}
