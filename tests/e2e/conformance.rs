//! The store contract, written once and run against every backend: claim order and batch
//! size, leases, fencing, delivered wins, retry timing, failed rows, hand-back, rows the
//! producer delivered, concurrent claimers, batched outcomes, stats, migrations.

use std::collections::HashSet;
use std::sync::Arc;

use outbox_host::store::{Held, Lease, Mark, Outcome, RetryFilter, Status, Store, StoreError, now_ms};

use crate::support::{World, per_backend};

per_backend!(
    claims_follow_creation_order_and_batch_size,
    unexpired_lease_is_never_claimed_and_expired_one_is,
    stale_failure_does_not_overwrite_delivered,
    stale_failure_does_not_touch_a_newer_lease,
    delivered_wins_even_from_a_stale_lease,
    retryable_rows_wait_for_next_retry_at,
    failed_rows_are_never_claimed,
    producer_delivered_rows_are_never_claimed,
    release_hands_rows_back_at_once_only_under_the_same_lease,
    one_mark_call_writes_every_kind_of_outcome,
    concurrent_claimers_never_share_a_row,
    stats_count_statuses_age_and_errors,
    duplicate_event_ids_are_refused_by_name,
    migrations_are_idempotent_and_follow_the_table_name,
    an_expired_lease_claimed_again_is_flagged_as_a_rescue,
    operator_retry_moves_failed_rows_back_by_each_filter,
    purge_deletes_old_delivered_rows_in_bounded_batches,
    history_and_recent_failures_describe_the_last_hour,
);

async fn claims_follow_creation_order_and_batch_size(world: World) {
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(world.produce("RoomGiftSent", &format!("room-{i}"), Status::Pending).await);
    }
    let now = now_ms();
    let first = world.producer.claim("w", now, now + 60_000, 3).await.unwrap();
    let second = world.producer.claim("w", now, now + 60_000, 3).await.unwrap();
    let got: Vec<String> = first.iter().chain(&second).map(|c| c.event_id.clone()).collect();
    assert_eq!((first.len(), second.len()), (3, 2));
    assert_eq!(got, ids);
    assert_eq!(first[0].lease, Lease { worker_id: "w".into(), lock_until_ms: now + 60_000, fence: None });
    assert!(world.producer.claim("w", now, now + 60_000, 3).await.unwrap().is_empty());
}

async fn unexpired_lease_is_never_claimed_and_expired_one_is(world: World) {
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let store = &world.producer;
    let now = now_ms();
    assert_eq!(store.claim("worker-a", now, now + 60_000, 10).await.unwrap().len(), 1);
    assert!(
        store.claim("worker-b", now + 59_999, now + 120_000, 10).await.unwrap().is_empty(),
        "a live lease was claimed"
    );
    let row = world.row(&id).await;
    assert_eq!((row.status, row.worker_id.as_deref()), (Status::Delivering, Some("worker-a")));

    let rescued = store.claim("worker-b", now + 60_001, now + 120_000, 10).await.unwrap();
    assert_eq!(rescued.len(), 1, "the expired lease was not reclaimed");
    let row = world.row(&id).await;
    assert_eq!(
        (row.status, row.worker_id.as_deref(), row.lock_until_ms),
        (Status::Delivering, Some("worker-b"), now + 120_000)
    );
}

async fn stale_failure_does_not_overwrite_delivered(world: World) {
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let store = &world.producer;
    let now = now_ms();
    let a = store.claim("worker-a", now, now + 1_000, 10).await.unwrap().remove(0);
    let b = store.claim("worker-b", now + 2_000, now + 60_000, 10).await.unwrap().remove(0);
    store.mark(&[Mark::of(&b, Outcome::Delivered)], now + 2_100).await.unwrap();

    let late_retry = Mark::of(&a, Outcome::Retry { error: "late".into(), next_retry_at_ms: now });
    let late_fail = Mark::of(&a, Outcome::Fail { error: "late".into() });
    assert_eq!(store.mark(&[late_retry], now + 2_200).await.unwrap(), 0);
    assert_eq!(store.mark(&[late_fail], now + 2_300).await.unwrap(), 0);
    let row = world.row(&id).await;
    assert_eq!((row.status, row.retry_count, row.last_error), (Status::Delivered, 0, None));
}

async fn stale_failure_does_not_touch_a_newer_lease(world: World) {
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let store = &world.producer;
    let now = now_ms();
    let a = store.claim("worker-a", now, now + 1_000, 10).await.unwrap().remove(0);
    store.claim("worker-b", now + 2_000, now + 60_000, 10).await.unwrap();
    let late = Mark::of(&a, Outcome::Fail { error: "late".into() });
    assert_eq!(store.mark(&[late], now + 2_100).await.unwrap(), 0);
    let row = world.row(&id).await;
    assert_eq!((row.status, row.worker_id.as_deref(), row.retry_count), (Status::Delivering, Some("worker-b"), 0));
}

/// The sink did deliver, even if late: delivered wins over whoever holds the row now.
async fn delivered_wins_even_from_a_stale_lease(world: World) {
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let store = &world.producer;
    let now = now_ms();
    let a = store.claim("worker-a", now, now + 1_000, 10).await.unwrap().remove(0);
    let b = store.claim("worker-b", now + 2_000, now + 60_000, 10).await.unwrap().remove(0);
    let fail = Mark::of(&b, Outcome::Fail { error: "permanent".into() });
    store.mark(&[fail], now + 2_100).await.unwrap();
    store.mark(&[Mark::of(&a, Outcome::Delivered)], now + 2_200).await.unwrap();
    let row = world.row(&id).await;
    assert_eq!((row.status, row.last_error, row.delivered_at_ms), (Status::Delivered, None, Some(now + 2_200)));
}

async fn retryable_rows_wait_for_next_retry_at(world: World) {
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let store = &world.producer;
    let now = now_ms();
    let a = store.claim("w", now, now + 60_000, 10).await.unwrap().remove(0);
    let retry = Outcome::Retry { error: "busy".into(), next_retry_at_ms: now + 5_000 };
    assert_eq!(store.mark(&[Mark::of(&a, retry)], now).await.unwrap(), 1);
    let row = world.row(&id).await;
    assert_eq!((row.status, row.retry_count, row.last_error.as_deref()), (Status::Retryable, 1, Some("busy")));
    assert_eq!((row.worker_id, row.lock_until_ms, row.next_retry_at_ms), (None, 0, now + 5_000));

    assert!(
        store.claim("w", now + 4_999, now + 60_000, 10).await.unwrap().is_empty(),
        "claimed before next_retry_at_ms"
    );
    let again = store.claim("w", now + 5_000, now + 65_000, 10).await.unwrap();
    assert_eq!((again.len(), again[0].retry_count), (1, 1));
}

async fn failed_rows_are_never_claimed(world: World) {
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let store = &world.producer;
    let now = now_ms();
    let a = store.claim("w", now, now + 60_000, 10).await.unwrap().remove(0);
    store.mark(&[Mark::of(&a, Outcome::Fail { error: "bad group".into() })], now).await.unwrap();
    assert!(store.claim("w", now + 86_400_000, now + 86_460_000, 10).await.unwrap().is_empty());
    let row = world.row(&id).await;
    assert_eq!((row.status, row.retry_count, row.last_error.as_deref()), (Status::Failed, 1, Some("bad group")));
}

async fn producer_delivered_rows_are_never_claimed(world: World) {
    let id = world.produce("RoomGiftSent", "room-1", Status::Delivered).await;
    let before = world.row(&id).await;
    let now = now_ms();
    assert!(world.producer.claim("w", now + 86_400_000, now + 86_460_000, 10).await.unwrap().is_empty());
    assert_eq!(world.row(&id).await, before);
}

async fn release_hands_rows_back_at_once_only_under_the_same_lease(world: World) {
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let store = &world.producer;
    let now = now_ms();
    let a = store.claim("worker-a", now, now + 60_000, 10).await.unwrap().remove(0);
    let wrong = Lease { worker_id: "worker-x".into(), lock_until_ms: a.lease.lock_until_ms, fence: None };
    assert_eq!(store.release(&[Held { id: a.id, event_id: a.event_id.clone(), lease: wrong }], now).await.unwrap(), 0);
    assert_eq!(store.release(&[Held::from(&a)], now).await.unwrap(), 1);
    let row = world.row(&id).await;
    assert_eq!((row.status, row.worker_id, row.lock_until_ms, row.retry_count), (Status::Pending, None, 0, 0));
    assert_eq!(store.claim("worker-b", now, now + 60_000, 10).await.unwrap().len(), 1, "not claimable at once");
}

async fn one_mark_call_writes_every_kind_of_outcome(world: World) {
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(world.produce("RoomGiftSent", &format!("room-{i}"), Status::Pending).await);
    }
    let now = now_ms();
    let claimed = world.producer.claim("w", now, now + 60_000, 10).await.unwrap();
    let marks: Vec<Mark> = claimed
        .iter()
        .enumerate()
        .map(|(i, c)| {
            Mark::of(
                c,
                match i % 3 {
                    0 => Outcome::Delivered,
                    1 => Outcome::Retry { error: format!("retry {i}"), next_retry_at_ms: now + i as i64 },
                    _ => Outcome::Fail { error: format!("fail {i}") },
                },
            )
        })
        .collect();
    assert_eq!(world.producer.mark(&marks, now).await.unwrap(), 6);
    for (i, id) in ids.iter().enumerate() {
        let row = world.row(id).await;
        let expected = match i % 3 {
            0 => (Status::Delivered, None, 0),
            1 => (Status::Retryable, Some(format!("retry {i}")), now + i as i64),
            _ => (Status::Failed, Some(format!("fail {i}")), 0),
        };
        assert_eq!((row.status, row.last_error, row.next_retry_at_ms), expected, "row {i}");
        assert_eq!(row.worker_id, None);
    }
}

/// Four claimers with pools of their own race over the same rows: every row is claimed
/// exactly once.
async fn concurrent_claimers_never_share_a_row(world: World) {
    const ROWS: usize = 400;
    let events: Vec<_> =
        (0..ROWS).map(|i| world.event("RoomGiftSent", &format!("room-{}", i % 37), Status::Pending)).collect();
    world.producer.insert(&events).await.unwrap();
    let mut tasks = Vec::new();
    for w in 0..4 {
        let store: Arc<dyn Store> = outbox_host::store::open(&world.db.url, 2, "room_outbox").await.unwrap();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let now = now_ms();
                let got = store.claim(&format!("w{w}"), now, now + 60_000, 7).await.unwrap();
                if got.is_empty() {
                    return mine;
                }
                mine.extend(got.into_iter().map(|c| c.event_id));
            }
        }));
    }
    let mut seen = HashSet::new();
    let mut total = 0;
    for task in tasks {
        for id in task.await.unwrap() {
            total += 1;
            assert!(seen.insert(id.clone()), "{id} was claimed twice");
        }
    }
    assert_eq!((total, seen.len()), (ROWS, ROWS));
}

async fn stats_count_statuses_age_and_errors(world: World) {
    let store = &world.producer;
    assert_eq!(store.stats().await.unwrap().oldest_waiting_created_at_ms, None);
    for i in 0..4 {
        world.produce("RoomGiftSent", &format!("room-{i}"), Status::Pending).await;
    }
    world.produce("RoomGiftSent", "room-x", Status::Delivered).await;
    let now = now_ms();
    let claimed = store.claim("w", now, now + 60_000, 3).await.unwrap();
    let marks: Vec<Mark> =
        claimed.iter().map(|c| Mark::of(c, Outcome::Fail { error: "group not found".into() })).take(2).collect();
    store.mark(&marks, now).await.unwrap();
    let stats = store.stats().await.unwrap();
    let counts: Vec<(Status, i64)> = Status::ALL.iter().map(|s| (*s, stats.count(*s))).collect();
    assert_eq!(
        counts,
        vec![
            (Status::Pending, 1),
            (Status::Delivering, 1),
            (Status::Retryable, 0),
            (Status::Failed, 2),
            (Status::Delivered, 1)
        ]
    );
    assert_eq!(stats.top_errors, vec![("group not found".to_string(), 2)]);
    let oldest = stats.oldest_waiting_created_at_ms.expect("one row is waiting");
    assert!(oldest <= now_ms());
}

async fn duplicate_event_ids_are_refused_by_name(world: World) {
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let again =
        outbox_host::store::NewEvent { event_id: id.clone(), ..world.event("RoomGiftSent", "room-1", Status::Pending) };
    match world.producer.insert(&[again]).await {
        Err(StoreError::Duplicate(named)) => assert_eq!(named, id),
        other => panic!("expected a duplicate error, got {other:?}"),
    }
}

async fn migrations_are_idempotent_and_follow_the_table_name(world: World) {
    world.producer.migrate().await.unwrap();
    let other: Arc<dyn Store> = outbox_host::store::open(&world.db.url, 2, "second_outbox").await.unwrap();
    other.migrate().await.unwrap();
    other.migrate().await.unwrap();
    other.insert(&[world.event("RoomGiftSent", "room-1", Status::Pending)]).await.unwrap();
    assert_eq!(other.stats().await.unwrap().count(Status::Pending), 1);
    assert_eq!(world.producer.stats().await.unwrap().count(Status::Pending), 0, "the tables are separate");
}

async fn an_expired_lease_claimed_again_is_flagged_as_a_rescue(world: World) {
    world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let now = now_ms();
    let first = world.producer.claim("a", now, now + 1_000, 10).await.unwrap();
    assert!(!first[0].rescued, "a pending row is no rescue");
    let again = world.producer.claim("b", now + 2_000, now + 60_000, 10).await.unwrap();
    assert!(again[0].rescued, "an expired lease claimed again is a rescue");
}

async fn operator_retry_moves_failed_rows_back_by_each_filter(world: World) {
    let mut ids = Vec::new();
    for (room, event_type) in [
        ("a", "RoomGiftSent"),
        ("b", "RoomGiftSent"),
        ("c", "RoomUserJoined"),
        ("d", "RoomGiftSent"),
        ("e", "RoomGiftSent"),
    ] {
        ids.push(world.produce(event_type, room, Status::Pending).await);
    }
    settle(&world, |room| match room {
        "a" => Outcome::Fail { error: "Tencent IM error 10010: group 50% gone".into() },
        "b" | "c" => Outcome::Fail { error: "bad group".into() },
        "d" => Outcome::Retry { error: "bad group".into(), next_retry_at_ms: 0 },
        _ => Outcome::Delivered,
    })
    .await;
    let store = &world.producer;
    assert_eq!(store.count_failed(&RetryFilter::All).await.unwrap(), 3);
    assert_eq!(store.count_failed(&RetryFilter::ErrorContains("50% gone".into())).await.unwrap(), 1);
    assert_eq!(store.count_failed(&RetryFilter::ErrorContains("_".into())).await.unwrap(), 0, "_ is no wildcard");
    assert_eq!(store.count_failed(&RetryFilter::ErrorIs("bad group".into())).await.unwrap(), 2);

    let now = now_ms();
    assert_eq!(store.retry_failed(&RetryFilter::EventType("RoomUserJoined".into()), now).await.unwrap(), 1);
    assert_eq!(store.retry_failed(&RetryFilter::EventId(ids[0].clone()), now).await.unwrap(), 1);
    assert_eq!(
        store.retry_failed(&RetryFilter::EventId(ids[4].clone()), now).await.unwrap(),
        0,
        "a delivered row moved"
    );
    let row = world.row(&ids[0]).await;
    assert_eq!((row.status, row.retry_count, row.worker_id), (Status::Pending, 0, None));
    assert_eq!(
        row.last_error.as_deref(),
        Some("Tencent IM error 10010: group 50% gone"),
        "the reason is kept for context"
    );
    assert_eq!(store.retry_failed(&RetryFilter::All, now).await.unwrap(), 1);
    assert_eq!(world.row(&ids[3]).await.status, Status::Retryable, "only failed rows move");
    assert_eq!(store.count_failed(&RetryFilter::All).await.unwrap(), 0);
    assert_eq!(store.claim("w", now, now + 60_000, 10).await.unwrap().len(), 4, "retried rows are claimable at once");
}

async fn purge_deletes_old_delivered_rows_in_bounded_batches(world: World) {
    let mut events: Vec<_> =
        (0..25).map(|i| world.event("RoomGiftSent", &format!("r{i}"), Status::Delivered)).collect();
    events.push(world.event("RoomGiftSent", "waiting", Status::Pending));
    world.producer.insert(&events).await.unwrap();
    let store = &world.producer;
    assert_eq!(
        store.purge_delivered(now_ms() - 3_600_000, 10).await.unwrap(),
        0,
        "rows younger than the cut were purged"
    );
    let cut = now_ms() + 1_000;
    assert_eq!(store.purge_delivered(cut, 10).await.unwrap(), 10);
    assert_eq!(store.purge_delivered(cut, 10).await.unwrap(), 10);
    assert_eq!(store.purge_delivered(cut, 10).await.unwrap(), 5);
    assert_eq!(store.purge_delivered(cut, 10).await.unwrap(), 0);
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.count(Status::Delivered), stats.count(Status::Pending)), (0, 1), "only delivered rows go");
}

async fn history_and_recent_failures_describe_the_last_hour(world: World) {
    for room in ["ok-1", "ok-2", "ok-3", "bad-1", "flaky-1"] {
        world.produce("RoomGiftSent", room, Status::Pending).await;
    }
    settle(&world, |room| match room {
        r if r.starts_with("ok") => Outcome::Delivered,
        r if r.starts_with("bad") => Outcome::Fail { error: "bad".into() },
        _ => Outcome::Retry { error: "flaky".into(), next_retry_at_ms: 0 },
    })
    .await;
    let history = world.producer.history(now_ms() - 3_600_000).await.unwrap();
    let delivered: i64 = history.iter().map(|m| m.delivered).sum();
    let failed: i64 = history.iter().map(|m| m.failed).sum();
    assert_eq!((delivered, failed), (3, 1), "{history:?}");
    assert!(history.iter().all(|m| m.start_ms % 60_000 == 0), "{history:?}");
    assert_eq!(world.producer.stats().await.unwrap().delivered_last_minute, 3);

    let recent = world.producer.recent_failures(10).await.unwrap();
    let mut rooms: Vec<&str> = recent.iter().map(|r| r.room_id.as_str()).collect();
    rooms.sort();
    assert_eq!(rooms, ["bad-1", "flaky-1"]);
}

/// Marks every claimed row with the outcome `outcome_of` picks by room.
async fn settle(world: &World, outcome_of: impl Fn(&str) -> Outcome) {
    let now = now_ms();
    let claimed = world.producer.claim("w", now, now + 60_000, 100).await.unwrap();
    let marks: Vec<Mark> = claimed.iter().map(|c| Mark::of(c, outcome_of(&c.room_id))).collect();
    world.producer.mark(&marks, now).await.unwrap();
}
