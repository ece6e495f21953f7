//! A host that crashed left a row `delivering`; once its lease is over, a worker delivers
//! it. (The lease and fencing rules themselves are in the store conformance suite.)

use outbox_host::store::{Status, now_ms};

use crate::support::{Running, World, per_backend};

per_backend!(worker_delivers_a_row_whose_lease_expired);

async fn worker_delivers_a_row_whose_lease_expired(world: World) {
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let past = now_ms() - 120_000;
    world.producer.claim("crashed-host", past, past + 1_000, 10).await.unwrap();
    assert_eq!(world.row(&id).await.status, Status::Delivering);

    let mut host = Running::start(world.config("", "")).await;
    host.wait_status(&world, &[&id], Status::Delivered).await;
    host.stop().await;
    assert_eq!(world.collector.attempts_of(&id).len(), 1);
}
