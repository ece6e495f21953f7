//! The producer's path with the `outbox-producer` crate: insert within the caller's own
//! transaction, and mark delivered after the producer's own publish, against a running host.

use std::time::Duration;

use outbox_host::engine::Signal;
use outbox_host::store::{Status, Store, now_ms};
use outbox_producer::{Backend, Error, Event, Outbox};

use crate::support::{PATIENCE, Running, World, per_backend};

per_backend!(
    a_rolled_back_insert_leaves_no_row_and_a_committed_one_is_delivered,
    marking_delivered_while_a_host_holds_the_row_wins
);

fn event(event_id: &str, room: &str) -> Event {
    Event {
        app_code: "default".into(),
        event_id: event_id.into(),
        event_type: "RoomGiftSent".into(),
        room_id: room.into(),
        envelope: outbox_host::envelope::encode("default", event_id, "RoomGiftSent", room, 1, now_ms(), vec![]),
        created_at_ms: now_ms(),
        delivered: false,
        trace_context: None,
    }
}

/// Runs `scenario` with a pool of the world's own database type.
macro_rules! on_pool {
    ($world:expr, $scenario:ident $(, $arg:expr)*) => {{
        let url = $world.db_url();
        if url.starts_with("sqlite:") {
            $scenario(&$world, sqlx::SqlitePool::connect(&url).await.unwrap() $(, $arg)*).await
        } else if url.starts_with("postgres") {
            $scenario(&$world, sqlx::PgPool::connect(&url).await.unwrap() $(, $arg)*).await
        } else {
            $scenario(&$world, sqlx::MySqlPool::connect(&url).await.unwrap() $(, $arg)*).await
        }
    }};
}

/// Runs `scenario` with a host on `table` (its `worker` and `sink` config lines), a pool of
/// the world's own database type, and a store on the table to read rows through.
macro_rules! with_host {
    ($world:expr, $table:expr, $worker:expr, $sink:expr, $scenario:ident) => {{
        let config = $world.setup($worker, $sink).set(&["outbox", "table"], $table);
        let mut host = Running::start(config.parse()).await;
        let rows = outbox_host::store::open(&$world.db_url(), 2, $table).await.unwrap();
        on_pool!($world, $scenario, &mut host, $table, rows.as_ref());
        host.stop().await;
    }};
}

async fn a_rolled_back_insert_leaves_no_row_and_a_committed_one_is_delivered(world: World) {
    inserts_in_transactions_on(&world, "room_outbox").await;
}

async fn marking_delivered_while_a_host_holds_the_row_wins(world: World) {
    marking_delivered_while_held_on(&world, "room_outbox").await;
}

/// Rolled back and committed inserts into `table` with a host running on it.
pub async fn inserts_in_transactions_on(world: &World, table: &str) {
    with_host!(world, table, "", "", insert_in_transactions);
}

async fn insert_in_transactions<DB: Backend>(
    world: &World,
    pool: sqlx::Pool<DB>,
    host: &mut Running,
    table: &str,
    rows: &dyn Store,
) where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let outbox = Outbox::<DB>::new(table).unwrap();

    let mut tx = pool.begin().await.unwrap();
    outbox.insert(&mut *tx, &event("evt-rolled-back", "room-1")).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(rows.get("evt-rolled-back").await.unwrap().is_none(), "a rolled-back insert left a row");

    let mut tx = pool.begin().await.unwrap();
    outbox.insert(&mut *tx, &event("evt-committed", "room-1")).await.unwrap();
    tx.commit().await.unwrap();
    host.wait_status_in(rows, &["evt-committed"], Status::Delivered).await;
    assert_eq!(world.collector.attempts_of("evt-committed").len(), 1);
    assert!(world.collector.attempts_of("evt-rolled-back").is_empty(), "the rolled-back event reached the sink");

    let again = outbox.insert(&pool, &event("evt-committed", "room-2")).await;
    assert!(matches!(again, Err(Error::Duplicate(ref id)) if id == "evt-committed"), "{again:?}");
}

/// The producer marks delivered a row of `table` that a running host holds.
pub async fn marking_delivered_while_held_on(world: &World, table: &str) {
    // The delivery hangs past publish_timeout, so the host's own outcome (a retryable timeout)
    // arrives after the producer has marked the row delivered.
    with_host!(world, table, "publish_timeout: 1s", "room.room-held: sleep:3000", mark_while_held);
}

async fn mark_while_held<DB: Backend>(
    world: &World,
    pool: sqlx::Pool<DB>,
    host: &mut Running,
    table: &str,
    rows: &dyn Store,
) where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let outbox = Outbox::<DB>::new(table).unwrap();
    outbox.insert(&pool, &event("evt-held", "room-held")).await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while world.collector.attempts_of("evt-held").is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the host never started the delivery");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The host owns the row's partition: the row is not claimed, and stays pending while
    // its delivery is in flight.
    let held = rows.get("evt-held").await.unwrap().unwrap();
    assert_eq!(held.status, Status::Pending, "the host's delivery wrote nothing yet");

    assert!(outbox.mark_delivered(&pool, "evt-held", now_ms()).await.unwrap(), "the producer's mark changed the row");
    assert_eq!(rows.get("evt-held").await.unwrap().unwrap().status, Status::Delivered);
    host.wait_signal("the host's late outcome to be written", |s| matches!(s, Signal::Recorded(_))).await;

    let row = rows.get("evt-held").await.unwrap().unwrap();
    assert_eq!(row.status, Status::Delivered, "the host's late retryable outcome undid the producer's delivered");
    assert_eq!((row.retry_count, row.last_error.as_deref()), (0, None), "the late failure left no trace on the row");
    assert!(row.delivered_at_ms.is_some());
    assert!(!outbox.mark_delivered(&pool, "evt-held", now_ms()).await.unwrap(), "marking twice changes nothing");
    assert!(!outbox.mark_delivered(&pool, "evt-unknown", now_ms()).await.unwrap());
}
