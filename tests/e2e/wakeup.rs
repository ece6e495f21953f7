//! An idle host learns of new rows long before its next poll: by `LISTEN`/`NOTIFY` on
//! PostgreSQL, by a cheap probe elsewhere, and at once for inserts through its own store.

use std::time::Duration;

use outbox_host::engine::Signal;
use outbox_host::store::Status;

use crate::support::{Running, TestDb, World, per_backend};

/// Far longer than any wait below: a delivery that needed the poll would fail the test.
const POLL: &str = "poll_interval: 60s\nretry_interval: 60s";
/// How long a woken host may take.
const WOKEN_WITHIN: Duration = Duration::from_secs(10);

async fn delivered_within(world: &World, id: &str, what: &str) {
    let deadline = tokio::time::Instant::now() + WOKEN_WITHIN;
    while world.row(id).await.status != Status::Delivered {
        assert!(tokio::time::Instant::now() < deadline, "{what}: not delivered within {WOKEN_WITHIN:?}, so not woken");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An independent producer's plain insert wakes an idle host (default `wake_up: auto`).
async fn an_insert_by_another_producer_wakes_an_idle_host(world: World) {
    let mut host = Running::start(world.config(POLL, "")).await;
    host.wait_signal("the first, empty claim", |s| *s == Signal::Idle).await;
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    delivered_within(&world, &id, "an insert by another producer").await;
    host.stop().await;
}

per_backend!(an_insert_by_another_producer_wakes_an_idle_host);

/// With no probing and no `LISTEN`, an insert through the host's own store still wakes it.
#[tokio::test]
async fn an_insert_through_the_hosts_own_store_wakes_it_at_once() {
    let world = World::new().await;
    let mut host = Running::start(world.config(&format!("{POLL}\nwake_up: poll"), "")).await;
    host.wait_signal("the first, empty claim", |s| *s == Signal::Idle).await;
    let event = world.event("RoomGiftSent", "room-1", Status::Pending);
    host.store.insert(std::slice::from_ref(&event)).await.unwrap();
    delivered_within(&world, &event.event_id, "an insert through the host's store").await;
    host.stop().await;
}

/// After PostgreSQL kills the listening connection, the host listens again by itself.
#[tokio::test]
async fn postgres_wake_ups_resume_after_the_listening_connection_is_killed() {
    let Some(db) = TestDb::postgres().await else { return };
    let world = World::on(db).await;
    let mut host = Running::start(world.config(&format!("{POLL}\nwake_up: notify"), "")).await;
    host.wait_signal("the first, empty claim", |s| *s == Signal::Idle).await;
    let first = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    delivered_within(&world, &first, "before the kill").await;

    let killed = crate::scale::kill_connections(&world.db).await;
    assert!(killed >= 1, "no connection of the host was killed");
    // Past the reconnection, wake-ups come again.
    let deadline = tokio::time::Instant::now() + WOKEN_WITHIN;
    let second = world.produce("RoomGiftSent", "room-2", Status::Pending).await;
    while world.row(&second).await.status != Status::Delivered {
        assert!(tokio::time::Instant::now() < deadline, "no wake-up after the listening connection was killed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    host.stop().await;
}
