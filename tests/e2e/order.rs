//! Per-room order that survives retries (`outbox_worker.ordering: per_room`): a room's event
//! is attempted only when every earlier one is finished, while other rooms go on; across
//! several hosts on one table too.

use std::collections::HashMap;
use std::time::Duration;

use outbox_host::store::{NewEvent, Status};

use crate::support::{PATIENCE, Running, World, per_backend};

per_backend!(
    a_retried_event_holds_its_room_back_and_no_other_room,
    a_failed_event_lets_its_room_go_on_unless_configured_to_block,
    four_hosts_keep_two_hundred_rooms_in_order,
    rooms_stay_in_order_while_a_host_joins_and_another_leaves,
    a_row_that_appears_behind_the_sweep_goes_before_its_rooms_later_rows
);

/// What the sink received, as `(event_id, attempt)` in arrival order.
fn received(world: &World) -> Vec<(String, u32)> {
    world.collector.reports().into_iter().map(|r| (r.event_id, r.attempt)).collect()
}

async fn a_retried_event_holds_its_room_back_and_no_other_room(world: World) {
    // The room's second event (the only RoomMicChanged) fails twice, then goes through.
    let types = ["RoomGiftSent", "RoomMicChanged", "RoomGiftSent", "RoomGiftSent", "RoomGiftSent"];
    let room: Vec<_> = types.iter().map(|t| world.event(t, "room-o", Status::Pending)).collect();
    world.producer.insert(&room).await.unwrap();
    let config = world
        .setup("ordering: per_room\nretry_interval: 1s\npoll_interval: 100ms", "type.RoomMicChanged: fail-then-ok:2");
    let mut host = Running::start(config.parse()).await;

    // Once the second event has failed, other rooms' events arrive: they must not wait.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while world.collector.attempts_of(&room[1].event_id).is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the second event was never attempted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let others: Vec<_> =
        (0..20).map(|i| world.event("RoomUserJoined", &format!("room-x{i}"), Status::Pending)).collect();
    world.producer.insert(&others).await.unwrap();
    let ids: Vec<&str> = room.iter().chain(&others).map(|e| e.event_id.as_str()).collect();
    host.wait_status(&world, &ids, Status::Delivered).await;
    host.stop().await;

    let got = received(&world);
    let of_room: Vec<(String, u32)> =
        got.iter().filter(|(id, _)| room.iter().any(|e| &e.event_id == id)).cloned().collect();
    let expected: Vec<(String, u32)> = [(0, 1), (1, 1), (1, 2), (1, 3), (2, 1), (3, 1), (4, 1)]
        .into_iter()
        .map(|(i, attempt)| (room[i].event_id.clone(), attempt))
        .collect();
    assert_eq!(of_room, expected, "the room's events overtook its retried one");
    let position = |id: &str, attempt: u32| got.iter().position(|(e, a)| e == id && *a == attempt).unwrap();
    let retried_ok = position(&room[1].event_id, 3);
    for other in &others {
        assert!(position(&other.event_id, 1) < retried_ok, "another room waited for room-o's retries");
    }
}

async fn a_failed_event_lets_its_room_go_on_unless_configured_to_block(world: World) {
    let sink = "type.RoomMicChanged: permanent";
    for (blocks, room) in [(false, "room-goes-on"), (true, "room-blocked")] {
        let events: Vec<_> =
            ["RoomMicChanged", "RoomGiftSent"].iter().map(|t| world.event(t, room, Status::Pending)).collect();
        let marker = world.event("RoomUserJoined", &format!("{room}-marker"), Status::Pending);
        world.producer.insert(&events).await.unwrap();
        let worker = format!("ordering: per_room\nfailed_blocks_room: {blocks}\npoll_interval: 100ms");
        let mut host = Running::start(world.setup(&worker, sink).parse()).await;
        host.wait_status(&world, &[&events[0].event_id], Status::Failed).await;
        world.producer.insert(std::slice::from_ref(&marker)).await.unwrap();
        host.wait_status(&world, &[&marker.event_id], Status::Delivered).await;
        // The marker, inserted after the failure, went through: the host did claim since.
        let next = world.row(&events[1].event_id).await.status;
        if blocks {
            host.stop().await;
            assert_eq!(next, Status::Pending, "a failed event must hold its room back when failed_blocks_room is on");
            assert!(world.collector.attempts_of(&events[1].event_id).is_empty());
        } else {
            host.wait_status(&world, &[&events[1].event_id], Status::Delivered).await;
            host.stop().await;
        }
    }
}

/// 200 rooms × 50 events, as producers write them: the rooms' events interleaved, each
/// room's in order. Returns where each event stands in its room.
async fn two_hundred_rooms(world: &World) -> HashMap<String, (usize, usize)> {
    let mut events = Vec::new();
    let mut place: HashMap<String, (usize, usize)> = HashMap::new();
    for i in 0..PER_ROOM {
        for room in 0..ROOMS {
            let event = world.event("RoomGiftSent", &format!("room-{room}"), Status::Pending);
            place.insert(event.event_id.clone(), (room, i));
            events.push(event);
        }
    }
    for chunk in events.chunks(1_000) {
        world.producer.insert(chunk).await.unwrap();
    }
    place
}

const ROOMS: usize = 200;
const PER_ROOM: usize = 50;

/// Every event reached the sink once, and each room's in order.
fn assert_once_in_order(world: &World, place: &HashMap<String, (usize, usize)>) {
    let got = received(world);
    assert_eq!(got.len(), ROOMS * PER_ROOM, "each event delivered once");
    let mut next = vec![0; ROOMS];
    for (id, _) in &got {
        let (room, i) = place[id];
        assert_eq!(i, next[room], "room-{room}: event {i} reached the sink when event {} was due", next[room]);
        next[room] += 1;
    }
}

async fn four_hosts_keep_two_hundred_rooms_in_order(world: World) {
    let place = two_hundred_rooms(&world).await;
    // Leases that outlast a loaded machine's waits: a clean run (see sinks.rs).
    let config = world
        .setup("ordering: per_room\nbatch_size: 100\nconcurrency: 16\npoll_interval: 100ms\npartition_lease: 30s", "");
    let mut hosts = Vec::new();
    for _ in 0..4 {
        hosts.push(Running::start(config.parse()).await);
    }
    hosts[0]
        .wait_for_within("every event delivered", Duration::from_secs(180), || async {
            world.producer.stats().await.unwrap().count(Status::Delivered) == (ROOMS * PER_ROOM) as i64
        })
        .await;
    for host in hosts {
        host.stop().await;
    }
    assert_once_in_order(&world, &place);
}

/// Partitions move while the rooms drain: a third host joins (the others give up its share
/// once they have drained it), then one of the first two leaves (its partitions go to the
/// others at once). Every event still arrives once, each room's in order.
async fn rooms_stay_in_order_while_a_host_joins_and_another_leaves(world: World) {
    let place = two_hundred_rooms(&world).await;
    // A slow sink, so that the drain outlasts the moves; short partition leases, so that
    // the moves happen within seconds.
    let config = world.setup(
        "ordering: per_room\nbatch_size: 50\nconcurrency: 8\npoll_interval: 100ms\npublish_timeout: 1s\npartition_lease: 4s",
        "default: sleep:20",
    );
    let mut first = Running::start(config.parse()).await;
    let second = Running::start(config.parse()).await;
    let delivered = || async { world.producer.stats().await.unwrap().count(Status::Delivered) };
    first
        .wait_for_within("a third delivered", Duration::from_secs(120), || async {
            delivered().await >= (ROOMS * PER_ROOM / 3) as i64
        })
        .await;
    let third = Running::start(config.parse()).await;
    let owners = || async { world.producer.partition_owners(outbox_host::store::now_ms()).await.unwrap() };
    first
        .wait_for_within("the joining host to own partitions", Duration::from_secs(60), || async {
            owners().await.iter().filter(|o| !o.partitions.is_empty()).count() == 3
        })
        .await;
    second.stop().await;
    first
        .wait_for_within("every event delivered", Duration::from_secs(180), || async {
            delivered().await == (ROOMS * PER_ROOM) as i64
        })
        .await;
    let owning: Vec<usize> = owners().await.iter().map(|o| o.partitions.len()).collect();
    assert_eq!(owning.iter().sum::<usize>(), 64, "every partition owned by the two hosts left: {owning:?}");
    first.stop().await;
    third.stop().await;
    assert_once_in_order(&world, &place);
}

/// A row can become visible behind the place the owner's sweep has reached: its insert
/// committed after a page read rows created after it (another producer committed first, or a
/// fan-out batch was copied late). Here the sweep is slow (pages of ten rows, a sink that
/// takes 10 ms an event) over 600 rooms' rows; when it is well past the 50th, room-x's first
/// event appears with the 50th's creation time, then its second event at the end. The
/// second must not go first, though the sweep reaches it before it goes round again.
async fn a_row_that_appears_behind_the_sweep_goes_before_its_rooms_later_rows(world: World) {
    let base = outbox_host::store::now_ms() - 60_000;
    let backlog: Vec<_> = (0..600)
        .map(|i| NewEvent {
            created_at_ms: base + i,
            ..world.event("RoomGiftSent", &format!("room-{i}"), Status::Pending)
        })
        .collect();
    world.producer.insert(&backlog).await.unwrap();
    let config = world.setup(
        "ordering: per_room\nbatch_size: 10\nclaim_growth: 1\nconcurrency: 2\npoll_interval: 100ms",
        "default: sleep:10",
    );
    let mut host = Running::start(config.parse()).await;
    host.wait_for("the sweep past the 100th row", || async { world.collector.reports().len() >= 100 }).await;
    let first = NewEvent { created_at_ms: base + 50, ..world.event("RoomGiftSent", "room-x", Status::Pending) };
    world.producer.insert(std::slice::from_ref(&first)).await.unwrap();
    let second = world.event("RoomGiftSent", "room-x", Status::Pending);
    world.producer.insert(std::slice::from_ref(&second)).await.unwrap();
    let reached = world.collector.reports().len();
    assert!(reached < 500, "the sweep ended before the rows came ({reached} delivered): the test proves nothing");
    host.wait_status(&world, &[&first.event_id, &second.event_id], Status::Delivered).await;
    host.stop().await;

    let got = received(&world);
    let position = |id: &str| got.iter().position(|(e, _)| e == id).expect("delivered");
    assert!(
        position(&first.event_id) < position(&second.event_id),
        "room-x's second event reached the sink before its first"
    );
    assert_eq!(got.len(), 602, "each event delivered once");
}
