//! Leases and fencing: an expired lease is reclaimed, an unexpired one never is, a stale
//! worker's late failure never overwrites a newer outcome, and delivered always wins.

use outbox_host::store::{Lease, Mark, Outcome, Status, Store, now_ms};

use crate::support::{Running, World};

#[tokio::test]
async fn unexpired_lease_is_never_claimed_and_expired_one_is() {
    let world = World::new().await;
    let id = world
        .produce("RoomGiftSent", "room-1", Status::Pending)
        .await;
    let store = &world.producer;
    let now = now_ms();

    let first = store
        .claim("worker-a", now, now + 60_000, 10)
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].event_id, id);
    assert!(
        store
            .claim("worker-b", now + 59_999, now + 120_000, 10)
            .await
            .unwrap()
            .is_empty(),
        "a live lease was claimed"
    );

    let rescued = store
        .claim("worker-b", now + 60_001, now + 120_000, 10)
        .await
        .unwrap();
    assert_eq!(rescued.len(), 1, "the expired lease was not reclaimed");
    let row = world.row(&id).await;
    assert_eq!(
        (row.status, row.worker_id.as_deref(), row.lock_until_ms),
        (Status::Delivering, Some("worker-b"), now + 120_000)
    );
}

/// A host that crashed left a row `delivering`; once its lease is over, a worker delivers it.
#[tokio::test]
async fn worker_delivers_a_row_whose_lease_expired() {
    let world = World::new().await;
    let id = world
        .produce("RoomGiftSent", "room-1", Status::Pending)
        .await;
    let past = now_ms() - 120_000;
    world
        .producer
        .claim("crashed-host", past, past + 1_000, 10)
        .await
        .unwrap();
    assert_eq!(world.row(&id).await.status, Status::Delivering);

    let mut host = Running::start(world.config("", "")).await;
    host.wait_status(&world, &[&id], Status::Delivered).await;
    host.stop().await;
    assert_eq!(world.collector.attempts_of(&id).len(), 1);
}

#[tokio::test]
async fn stale_workers_late_failure_does_not_overwrite_delivered() {
    let world = World::new().await;
    let id = world
        .produce("RoomGiftSent", "room-1", Status::Pending)
        .await;
    let store = &world.producer;
    let now = now_ms();
    let a = store
        .claim("worker-a", now, now + 1_000, 10)
        .await
        .unwrap()
        .remove(0);
    let b = store
        .claim("worker-b", now + 2_000, now + 60_000, 10)
        .await
        .unwrap()
        .remove(0);

    store
        .mark(
            &[Mark {
                id: b.id,
                lease: b.lease.clone(),
                outcome: Outcome::Delivered,
            }],
            now + 2_100,
        )
        .await
        .unwrap();
    let late = Mark {
        id: a.id,
        lease: a.lease.clone(),
        outcome: Outcome::Retry {
            error: "late".into(),
            next_retry_at_ms: now,
        },
    };
    assert_eq!(store.mark(&[late], now + 2_200).await.unwrap(), 0);
    let fail = Mark {
        id: a.id,
        lease: a.lease,
        outcome: Outcome::Fail {
            error: "late".into(),
        },
    };
    assert_eq!(store.mark(&[fail], now + 2_300).await.unwrap(), 0);

    let row = world.row(&id).await;
    assert_eq!(
        (row.status, row.retry_count, row.last_error),
        (Status::Delivered, 0, None)
    );
}

#[tokio::test]
async fn stale_workers_late_failure_does_not_touch_a_newer_lease() {
    let world = World::new().await;
    let id = world
        .produce("RoomGiftSent", "room-1", Status::Pending)
        .await;
    let store = &world.producer;
    let now = now_ms();
    let a = store
        .claim("worker-a", now, now + 1_000, 10)
        .await
        .unwrap()
        .remove(0);
    store
        .claim("worker-b", now + 2_000, now + 60_000, 10)
        .await
        .unwrap();

    let late = Mark {
        id: a.id,
        lease: a.lease,
        outcome: Outcome::Fail {
            error: "late".into(),
        },
    };
    assert_eq!(store.mark(&[late], now + 2_100).await.unwrap(), 0);
    let row = world.row(&id).await;
    assert_eq!(
        (row.status, row.worker_id.as_deref()),
        (Status::Delivering, Some("worker-b"))
    );
}

/// The sink did deliver, even if late: delivered wins over whoever holds the row now.
#[tokio::test]
async fn delivered_wins_even_from_a_stale_lease() {
    let world = World::new().await;
    let id = world
        .produce("RoomGiftSent", "room-1", Status::Pending)
        .await;
    let store = &world.producer;
    let now = now_ms();
    let a = store
        .claim("worker-a", now, now + 1_000, 10)
        .await
        .unwrap()
        .remove(0);
    let b = store
        .claim("worker-b", now + 2_000, now + 60_000, 10)
        .await
        .unwrap()
        .remove(0);
    store
        .mark(
            &[Mark {
                id: b.id,
                lease: b.lease,
                outcome: Outcome::Fail {
                    error: "permanent".into(),
                },
            }],
            now + 2_100,
        )
        .await
        .unwrap();
    store
        .mark(
            &[Mark {
                id: a.id,
                lease: a.lease,
                outcome: Outcome::Delivered,
            }],
            now + 2_200,
        )
        .await
        .unwrap();
    let row = world.row(&id).await;
    assert_eq!((row.status, row.last_error), (Status::Delivered, None));
}

#[tokio::test]
async fn release_hands_rows_back_at_once_only_under_the_same_lease() {
    let world = World::new().await;
    let id = world
        .produce("RoomGiftSent", "room-1", Status::Pending)
        .await;
    let store = &world.producer;
    let now = now_ms();
    let a = store
        .claim("worker-a", now, now + 60_000, 10)
        .await
        .unwrap()
        .remove(0);
    let wrong = Lease {
        worker_id: "worker-x".into(),
        lock_until_ms: a.lease.lock_until_ms,
    };
    assert_eq!(store.release(&[(a.id, wrong)], now).await.unwrap(), 0);
    assert_eq!(store.release(&[(a.id, a.lease)], now).await.unwrap(), 1);
    let row = world.row(&id).await;
    assert_eq!(
        (row.status, row.worker_id, row.lock_until_ms),
        (Status::Pending, None, 0)
    );
    assert_eq!(
        store
            .claim("worker-b", now, now + 60_000, 10)
            .await
            .unwrap()
            .len(),
        1,
        "not claimable at once"
    );
}

/// Claims come in created_at_ms order and never exceed the batch size.
#[tokio::test]
async fn claims_follow_creation_order_and_batch_size() {
    let world = World::new().await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            world
                .produce("RoomGiftSent", &format!("room-{i}"), Status::Pending)
                .await,
        );
    }
    let now = now_ms();
    let first = world
        .producer
        .claim("w", now, now + 60_000, 3)
        .await
        .unwrap();
    let second = world
        .producer
        .claim("w", now, now + 60_000, 3)
        .await
        .unwrap();
    let got: Vec<String> = first
        .iter()
        .chain(&second)
        .map(|c| c.event_id.clone())
        .collect();
    assert_eq!((first.len(), second.len()), (3, 2));
    assert_eq!(got, ids);
}
