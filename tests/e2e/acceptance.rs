//! The acceptance tests of the seed guide, adapted to a separate host.

use std::time::Duration;

use outbox_host::engine::Signal;
use outbox_host::store::Status;

use crate::support::{Running, World, per_backend};

per_backend!(
    sync_publish_failure_leaves_event_pending_with_retry_count_zero,
    worker_delivers_the_same_event_id_and_marks_it_delivered,
    failed_delivery_becomes_retryable_with_count_and_error,
    fail_then_succeed_ends_delivered,
    producer_marked_delivered_is_never_claimed,
    cancel_stops_claiming_and_in_flight_finishes_within_publish_timeout,
    non_im_events_are_skipped_and_stored_delivered,
);

/// Seed: "同步 IM 失败后 outbox pending" — a failed synchronous publish leaves the row
/// pending with retry_count untouched; only the worker's own attempts count.
async fn sync_publish_failure_leaves_event_pending_with_retry_count_zero(world: World) {
    let id = world.produce("RoomUserJoined", "room-1", Status::Pending).await;
    let row = world.row(&id).await;
    assert_eq!((row.status, row.retry_count, row.worker_id.as_deref()), (Status::Pending, 0, None));

    let mut host = Running::start(world.config("", "")).await;
    host.wait_status(&world, &[&id], Status::Delivered).await;
    assert_eq!(world.row(&id).await.retry_count, 0);
    host.stop().await;
}

/// Seed: "worker 补投成功" — the sink receives the same event_id and the row ends delivered.
async fn worker_delivers_the_same_event_id_and_marks_it_delivered(world: World) {
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let mut host = Running::start(world.config("", "")).await;
    host.wait_status(&world, &[&id], Status::Delivered).await;

    let attempts = world.collector.attempts_of(&id);
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0].attempt, 1);
    let row = world.row(&id).await;
    assert_eq!(row.last_error, None);
    assert_eq!(row.worker_id, None);
    assert!(row.delivered_at_ms.is_some());
    host.stop().await;
}

/// Seed: "worker 补投失败" — retryable, retry_count+1, last_error set, next retry scheduled.
async fn failed_delivery_becomes_retryable_with_count_and_error(world: World) {
    let id = world.produce("RoomGiftSent", "room-bad", Status::Pending).await;
    let config = world.config("retry_interval: 1h", "room.room-bad: retryable");
    let mut host = Running::start(config).await;
    host.wait_status(&world, &[&id], Status::Retryable).await;
    host.stop().await;

    let row = world.row(&id).await;
    assert_eq!(row.retry_count, 1);
    assert_eq!(row.last_error.as_deref(), Some("fake: scripted retryable failure"));
    let wait = row.next_retry_at_ms - row.updated_at_ms;
    assert!((3_599_000..=3_600_000).contains(&wait), "next retry in {wait} ms, wanted the 1h retry_interval");
    assert_eq!(world.collector.attempts_of(&id).len(), 1, "not retried before next_retry_at_ms");
}

/// Seed: "下一轮成功" — first attempt fails, the next succeeds: delivered, error cleared.
async fn fail_then_succeed_ends_delivered(world: World) {
    let id = world.produce("RoomMicChanged", "room-flaky", Status::Pending).await;
    let mut host = Running::start(world.config("", "room.room-flaky: fail-then-ok:1")).await;
    host.wait_status(&world, &[&id], Status::Delivered).await;
    host.stop().await;

    let row = world.row(&id).await;
    assert_eq!(row.retry_count, 1);
    assert_eq!(row.last_error, None);
    let attempts: Vec<u32> = world.collector.attempts_of(&id).iter().map(|r| r.attempt).collect();
    assert_eq!(attempts, vec![1, 2]);
}

/// Seed: "同步 IM 成功" — a row the producer marked delivered is never claimed.
async fn producer_marked_delivered_is_never_claimed(world: World) {
    let done = world.produce("RoomGiftSent", "room-1", Status::Delivered).await;
    let pending = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let before = world.row(&done).await;
    let mut host = Running::start(world.config("", "")).await;
    host.wait_status(&world, &[&pending], Status::Delivered).await;
    host.wait_signal("an idle claim", |s| *s == Signal::Idle).await;
    host.stop().await;

    assert!(world.collector.attempts_of(&done).is_empty(), "the sink saw a producer-delivered event");
    assert_eq!(world.row(&done).await, before, "the producer-delivered row was touched");
}

/// Seed: "worker cancel" — after cancellation no new batch is claimed, and the in-flight
/// delivery finishes (and is recorded) within publish_timeout.
async fn cancel_stops_claiming_and_in_flight_finishes_within_publish_timeout(world: World) {
    let slow = world.produce("RoomGiftSent", "room-slow", Status::Pending).await;
    let mut host = Running::start(world.config("publish_timeout: 3s", "room.room-slow: sleep:800")).await;
    host.wait_signal("the slow event's claim", |s| *s == Signal::Claimed(1)).await;

    let cancelled_at = tokio::time::Instant::now();
    host.shutdown.cancel();
    let late = world.produce("RoomGiftSent", "room-late", Status::Pending).await;
    let mut signals = host.signals;
    tokio::time::timeout(Duration::from_secs(10), host.task).await.expect("host stops").unwrap().unwrap();
    let took = cancelled_at.elapsed();

    assert!(took < Duration::from_secs(3) + Duration::from_secs(1), "drain took {took:?}, beyond publish_timeout");
    assert_eq!(world.row(&slow).await.status, Status::Delivered, "the in-flight outcome was recorded");
    let late_row = world.row(&late).await;
    assert_eq!((late_row.status, late_row.worker_id), (Status::Pending, None), "a batch was claimed after cancel");
    while let Ok(signal) = signals.try_recv() {
        assert!(!matches!(signal, Signal::Claimed(_)), "claimed after cancel: {signal:?}");
    }
}

/// Seed: "非 IM 事件" — RoomCreated, RoomHeatChanged and RoomRankChanged are skipped by the
/// sink and stored as delivered.
async fn non_im_events_are_skipped_and_stored_delivered(world: World) {
    let sink = "type.RoomCreated: skip\ntype.RoomHeatChanged: skip\ntype.RoomRankChanged: skip";
    let mut ids = Vec::new();
    for event_type in ["RoomCreated", "RoomHeatChanged", "RoomRankChanged"] {
        ids.push(world.produce(event_type, "room-1", Status::Pending).await);
    }
    let mut host = Running::start(world.config("", sink)).await;
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    host.wait_status(&world, &refs, Status::Delivered).await;
    host.stop().await;
    for id in &ids {
        let row = world.row(id).await;
        assert_eq!((row.retry_count, row.last_error), (0, None));
        assert_eq!(world.collector.attempts_of(id)[0].behaviour, "skip");
    }
}
