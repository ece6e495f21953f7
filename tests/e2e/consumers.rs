//! Sinks as consumers (issue 48): a sink's positions and exceptions in the outbox's
//! `<table>_positions` and `<table>_exceptions`, read and settled through the store on every
//! database. What is in the tables afterwards is what a sink's state is.

use std::collections::HashSet;

use outbox_host::store::{
    Exception, Fence, Finished, Heartbeat, KeyValue, NewEvent, OwnedRead, Position, RegisteredSink, Settle, Status,
    Store, now_ms,
};

use crate::support::{World, per_backend, query_strings};

per_backend!(
    a_position_moves_over_finished_rows_and_what_it_passes_unfinished_waits,
    a_row_committed_late_behind_finished_rows_becomes_an_exception_and_waits,
    a_row_its_owner_has_in_hand_stops_the_position_without_an_exception,
    a_sink_that_delivers_nothing_writes_nothing,
    no_position_passes_the_settle_horizon,
    a_settle_from_a_lost_partition_writes_nothing,
    a_sink_that_starts_later_reads_nothing_created_before,
    the_operator_sees_a_consumers_own_state,
    a_sinks_copy_becomes_its_positions_and_exceptions_while_producers_write,
    an_event_retried_then_delivered_is_not_read_again,
    a_partition_no_longer_renewed_is_given_up_with_what_its_owner_delivered,
    a_heartbeat_whose_settle_fails_still_renews_every_lease,
    a_heartbeat_passes_a_whole_backlog_delivered_past_the_horizon,
    a_new_partition_count_keeps_what_a_consumer_has_waiting_no_more_no_less
);

/// The partitions of the tests' sink.
const TOTAL: u32 = 4;

/// A second sink, `audit`, whose partition leases are the outbox's own (the leases the
/// tests' `beat` takes).
fn audit(start_from_ms: i64) -> RegisteredSink {
    RegisteredSink {
        name: "audit".into(),
        table: "room_outbox".into(),
        start_from_ms,
        added_at_ms: 0,
        backfilled_at_ms: Some(0),
    }
}

/// One heartbeat of `owner` at `now`, with a one-second lease.
async fn beat(store: &dyn Store, owner: &str, now: i64) -> Vec<Fence> {
    let beat =
        Heartbeat { owner, partitions: TOTAL, in_flight: 0, now_ms: now, lease_ms: 1_000, renew: &[], release: &[] };
    store.keep_partitions(&beat).await.unwrap().owned
}

/// One heartbeat of `owner` at `now` renewing `renew`, with a ten-second lease (a test's
/// partitions stay held through it).
fn held_for_ten_seconds<'a>(owner: &'a str, renew: &'a [u32], now: i64) -> Heartbeat<'a> {
    Heartbeat { owner, partitions: TOTAL, in_flight: 0, now_ms: now, lease_ms: 10_000, renew, release: &[] }
}

/// A settle by `host-a` of `fences` at `now`, up to `now`, writing no exception.
fn settling<'a>(sink: &'a RegisteredSink, fences: &'a [Fence], finished: &'a Finished<'a>, now: i64) -> Settle<'a> {
    Settle {
        sink,
        owner: "host-a",
        total: TOTAL,
        fences,
        horizon_ms: now,
        finished,
        in_hand: &nothing_in_hand,
        exceptions: &[],
        now_ms: now,
        limit: 100,
    }
}

/// An owner with no unfinished row in hand.
fn nothing_in_hand(_: &str) -> bool {
    false
}

/// `n` events of one room, created one millisecond apart from `first_ms`, inserted.
async fn room_events(world: &World, room: &str, first_ms: i64, n: usize) -> Vec<NewEvent> {
    let events: Vec<NewEvent> = (0..n)
        .map(|i| NewEvent { created_at_ms: first_ms + i as i64, ..world.event("RoomGiftSent", room, Status::Pending) })
        .collect();
    world.producer.insert(&events).await.unwrap();
    events
}

/// Every waiting event of `sink` for `owner`, as `(event id, status, retry count)`, reading
/// pages of two so that a page's end and the next page's start are crossed.
async fn waiting(
    store: &dyn Store,
    sink: &RegisteredSink,
    owned: &[Fence],
    finished: &HashSet<String>,
) -> Vec<(String, Status, i32)> {
    let mut all = Vec::new();
    let mut after: Option<(i64, KeyValue)> = None;
    loop {
        let read = OwnedRead { owner: "host-a", total: TOTAL, owned, after: after.clone(), limit: 2 };
        let page = store.read_consumer(sink, &read, &|id: &str| finished.contains(id)).await.unwrap();
        all.extend(page.waiting.iter().map(|w| (w.row.event_id.clone(), w.status, w.row.retry_count)));
        if page.at_end {
            return all;
        }
        after = page.last;
        assert!(after.is_some(), "a page not at the end says where the next starts");
    }
}

fn ids(events: &[NewEvent], which: &[usize]) -> HashSet<String> {
    which.iter().map(|&i| events[i].event_id.clone()).collect()
}

/// The position of the partition of `events` (one room's), as the database places the
/// room (PostgreSQL and MariaDB hash it in SQL, SQLite's partitions are the host's).
async fn position_of(world: &World, sink: &RegisteredSink, events: &[NewEvent], fences: &[Fence]) -> Position {
    let store = world.producer.as_ref();
    let parts: Vec<u32> = fences.iter().map(|f| f.partition).collect();
    let positions = store.positions(sink, &parts).await.unwrap();
    let (app, room) = (&events[0].app_code, &events[0].room_id);
    let url = world.db_url();
    let part = if url.starts_with("sqlite") {
        outbox_host::store::partitions::partition_of(app, room, TOTAL)
    } else {
        let hash = if url.starts_with("postgres") {
            format!("(((hashtextextended('{app}:{room}', 0) % {TOTAL}) + {TOTAL}) % {TOTAL})")
        } else {
            format!("CAST(CRC32('{app}:{room}') % {TOTAL} AS SIGNED)")
        };
        query_strings(&world.db, &format!("SELECT {hash}")).await[0].parse().unwrap()
    };
    positions.iter().find(|p| p.part == part).cloned().expect("the room's partition is held")
}

async fn exception_status(world: &World, event_id: &str) -> Vec<String> {
    query_strings(
        &world.db,
        &format!("SELECT status FROM room_outbox_exceptions WHERE sink = 'audit' AND event_id = '{event_id}'"),
    )
    .await
}

fn retry(event: &NewEvent, fence: Fence, error: &str) -> Exception {
    Exception {
        event_id: event.event_id.clone(),
        app_code: event.app_code.clone(),
        room_id: event.room_id.clone(),
        event_type: event.event_type.clone(),
        fence,
        created_at_ms: event.created_at_ms,
        status: Status::Retryable,
        counted: 1,
        next_retry_at_ms: 0,
        last_error: Some(error.into()),
        plugin_digest: None,
    }
}

/// Five events of one room; the owner delivered the first, second and fourth, the fifth
/// failed for now. The position moves over all five: the third, passed unfinished, becomes
/// a `pending` exception, the fifth is `retryable`. Both wait, with their counts; once they
/// are delivered nothing waits, and the third's `delivered` exception, behind the position,
/// goes.
async fn a_position_moves_over_finished_rows_and_what_it_passes_unfinished_waits(world: World) {
    let store = world.producer.as_ref();
    let sink = audit(0);
    let now = now_ms();
    let events = room_events(&world, "room-1", now - 60_000, 5).await;
    let fences = beat(store, "host-a", now).await;
    assert_eq!(fences.len(), TOTAL as usize);
    let everything: Vec<String> = events.iter().map(|e| e.event_id.clone()).collect();
    let read = waiting(store, &sink, &fences, &HashSet::new()).await;
    assert_eq!(read.iter().map(|w| w.0.clone()).collect::<Vec<_>>(), everything, "every event waits, in order");
    assert!(read.iter().all(|w| w.1 == Status::Pending && w.2 == 0));
    let fence = {
        let read = OwnedRead { owner: "host-a", total: TOTAL, owned: &fences, after: None, limit: 1 };
        store.read_consumer(&sink, &read, &|_: &str| false).await.unwrap().waiting[0].row.lease.fence.unwrap()
    };

    let finished = ids(&events, &[0, 1, 3]);
    let finished_by = |id: &str| finished.contains(id);
    let settle = Settle {
        exceptions: &[retry(&events[4], fence, "503 from the destination")],
        ..settling(&sink, &fences, &finished_by, now)
    };
    let settled = store.settle(&settle).await.unwrap();
    assert!(settled.fenced.is_empty());
    assert_eq!(settled.held.len(), TOTAL as usize);
    let mut passed = settled.passed.clone();
    passed.sort();
    let mut expected: Vec<String> = finished.iter().cloned().collect();
    expected.sort();
    assert_eq!(passed, expected, "the delivered ones are passed");
    let position = position_of(&world, &sink, &events, &fences).await;
    assert_eq!((position.part, position.created_at_ms), (fence.partition, events[4].created_at_ms));
    assert_eq!(exception_status(&world, &events[2].event_id).await, ["pending"], "the hole is an exception");
    assert_eq!(exception_status(&world, &events[4].event_id).await, ["retryable"]);
    assert_eq!(exception_status(&world, &events[3].event_id).await, Vec::<String>::new(), "delivered: no write");

    assert_eq!(
        waiting(store, &sink, &fences, &HashSet::new()).await,
        vec![(events[2].event_id.clone(), Status::Pending, 0), (events[4].event_id.clone(), Status::Retryable, 1)],
        "behind the position, the third and the fifth wait, the fifth with its retry"
    );

    // The third is delivered: its exception says so, and goes once it is behind every
    // position; the fifth is delivered, and a later retry outcome does not undo it.
    let delivered = |i: usize| Exception {
        status: Status::Delivered,
        counted: 0,
        last_error: None,
        ..retry(&events[i], fence, "")
    };
    let nothing = |_: &str| false;
    store.settle(&Settle { exceptions: &[delivered(2)], finished: &nothing, ..settle.clone() }).await.unwrap();
    assert_eq!(exception_status(&world, &events[2].event_id).await, Vec::<String>::new());
    assert_eq!(
        waiting(store, &sink, &fences, &HashSet::new()).await,
        vec![(events[4].event_id.clone(), Status::Retryable, 1)]
    );
    store.settle(&Settle { exceptions: &[delivered(4)], finished: &nothing, ..settle.clone() }).await.unwrap();
    assert!(waiting(store, &sink, &fences, &HashSet::new()).await.is_empty());
    store.settle(&Settle { finished: &nothing, ..settle.clone() }).await.unwrap();
    assert_eq!(exception_status(&world, &events[4].event_id).await, ["delivered"]);
    assert!(waiting(store, &sink, &fences, &HashSet::new()).await.is_empty());
    // The first sink's state is the row's own, untouched.
    assert_eq!(world.row(&events[0].event_id).await.status, Status::Pending);
}

/// The hazard positions bring: a producer's transaction commits a row created before rows
/// the owner already delivered. The settle that passes it makes it a `pending` exception,
/// and it waits; nothing else is written for the delivered rows.
async fn a_row_committed_late_behind_finished_rows_becomes_an_exception_and_waits(world: World) {
    let store = world.producer.as_ref();
    let sink = audit(0);
    let now = now_ms();
    let fences = beat(store, "host-a", now).await;
    let first = room_events(&world, "room-7", now - 60_000, 1).await;
    let after = room_events(&world, "room-7", now - 60_000 + 10, 1).await;
    let read = waiting(store, &sink, &fences, &HashSet::new()).await;
    assert_eq!(read.len(), 2);
    // Delivered both; meanwhile the late row, created between them, commits.
    let late = room_events(&world, "room-7", now - 60_000 + 5, 1).await;
    let finished: HashSet<String> = [first[0].event_id.clone(), after[0].event_id.clone()].into();
    let finished_by = |id: &str| finished.contains(id);
    let settle = settling(&sink, &fences, &finished_by, now);
    let settled = store.settle(&settle).await.unwrap();
    assert_eq!(settled.passed.len(), 2);
    assert_eq!(exception_status(&world, &late[0].event_id).await, ["pending"]);
    assert_eq!(query_strings(&world.db, "SELECT COUNT(*) FROM room_outbox_exceptions").await, ["1"]);
    let mut events = first.clone();
    events.extend(late.clone());
    events.extend(after.clone());
    assert_eq!(position_of(&world, &sink, &events, &fences).await.created_at_ms, after[0].created_at_ms);
    assert_eq!(
        waiting(store, &sink, &fences, &HashSet::new()).await,
        vec![(late[0].event_id.clone(), Status::Pending, 0)],
        "the late row waits; the others were delivered"
    );
}

/// A row its owner read and has not finished yet (waiting behind its room, or in flight),
/// with finished rows after it and all of them older than the horizon: the position stops
/// before it and writes no exception for it (a catch-up past the horizon once made a
/// `pending` exception of every such row, each then written again as `delivered`). Once it
/// is finished, the position passes it and the rows after it. (A row not in hand is passed
/// as a hole: the test above.)
async fn a_row_its_owner_has_in_hand_stops_the_position_without_an_exception(world: World) {
    let store = world.producer.as_ref();
    let sink = audit(0);
    let now = now_ms();
    let fences = beat(store, "host-a", now).await;
    let events = room_events(&world, "room-4", now - 60_000, 4).await;
    let finished = ids(&events, &[0, 2, 3]);
    let finished_by = |id: &str| finished.contains(id);
    let in_hand = |id: &str| id == events[1].event_id;
    let settle = Settle { in_hand: &in_hand, ..settling(&sink, &fences, &finished_by, now) };
    let settled = store.settle(&settle).await.unwrap();
    assert_eq!(settled.passed, [events[0].event_id.clone()], "only the row before the one in hand is passed");
    assert_eq!(query_strings(&world.db, "SELECT COUNT(*) FROM room_outbox_exceptions").await, ["0"]);
    assert_eq!(position_of(&world, &sink, &events, &fences).await.created_at_ms, events[0].created_at_ms);
    let left: Vec<String> = waiting(store, &sink, &fences, &finished).await.into_iter().map(|(id, _, _)| id).collect();
    assert_eq!(left, [events[1].event_id.clone()], "the row in hand still waits; the finished ones are not read");

    // Finished now: the position passes it and the rows after it, still without an exception.
    let all = ids(&events, &[1, 2, 3]);
    let all_by = |id: &str| all.contains(id);
    let settled = store.settle(&settling(&sink, &fences, &all_by, now)).await.unwrap();
    assert_eq!(settled.passed.len(), 3, "{settled:?}");
    assert_eq!(query_strings(&world.db, "SELECT COUNT(*) FROM room_outbox_exceptions").await, ["0"]);
    assert_eq!(position_of(&world, &sink, &events, &fences).await.created_at_ms, events[3].created_at_ms);
    assert!(waiting(store, &sink, &fences, &HashSet::new()).await.is_empty(), "every event finished for the sink");
}

/// Rows created after the horizon stay past the position even when finished: a producer's
/// transaction still open may commit rows created before them.
async fn no_position_passes_the_settle_horizon(world: World) {
    let store = world.producer.as_ref();
    let sink = audit(0);
    let now = now_ms();
    let fences = beat(store, "host-a", now).await;
    let events = room_events(&world, "room-3", now - 3_000, 3).await;
    let finished = ids(&events, &[0, 1, 2]);
    let finished_by = |id: &str| finished.contains(id);
    let settle = Settle { horizon_ms: events[1].created_at_ms, ..settling(&sink, &fences, &finished_by, now) };
    let settled = store.settle(&settle).await.unwrap();
    assert_eq!(settled.passed.len(), 2, "{settled:?}");
    assert!(!settled.passed.contains(&events[2].event_id));
    assert_eq!(position_of(&world, &sink, &events, &fences).await.created_at_ms, events[1].created_at_ms);
    // Finished past the position: not read again while the owner remembers it.
    assert!(waiting(store, &sink, &fences, &finished).await.is_empty());
    assert_eq!(waiting(store, &sink, &fences, &HashSet::new()).await.len(), 1, "forgotten, it waits again");
}

/// An owner that delivered nothing (its destination away) writes nothing: its partitions'
/// rows wait past their positions, however many there are.
async fn a_sink_that_delivers_nothing_writes_nothing(world: World) {
    let store = world.producer.as_ref();
    let sink = audit(0);
    let now = now_ms();
    let fences = beat(store, "host-a", now).await;
    let events = room_events(&world, "room-5", now - 60_000, 20).await;
    let finished_by = |_: &str| false;
    let settle = settling(&sink, &fences, &finished_by, now);
    let settled = store.settle(&settle).await.unwrap();
    assert!(settled.passed.is_empty());
    assert_eq!(query_strings(&world.db, "SELECT COUNT(*) FROM room_outbox_positions").await, ["0"]);
    assert_eq!(query_strings(&world.db, "SELECT COUNT(*) FROM room_outbox_exceptions").await, ["0"]);
    assert_eq!(waiting(store, &sink, &fences, &HashSet::new()).await.len(), events.len());
}

/// Owner `a`'s leases run out and `b` takes every partition: `a`'s settle, written
/// afterwards, records no exception and moves no position.
async fn a_settle_from_a_lost_partition_writes_nothing(world: World) {
    let store = world.producer.as_ref();
    let sink = audit(0);
    let now = now_ms();
    let events = room_events(&world, "room-2", now - 60_000, 2).await;
    let a = beat(store, "host-a", now).await;
    let later = now + 2_000;
    let b = beat(store, "host-b", later).await;
    assert_eq!(b.len(), TOTAL as usize, "b takes every partition over");
    let finished = ids(&events, &[0]);
    let parts: Vec<u32> = (0..TOTAL).collect();
    let finished_by = |id: &str| finished.contains(id);
    let settle = Settle { exceptions: &[retry(&events[1], a[0], "late")], ..settling(&sink, &a, &finished_by, later) };
    let settled = store.settle(&settle).await.unwrap();
    assert_eq!(settled.fenced, parts, "every partition a lost is fenced");
    assert!(settled.passed.is_empty() && settled.positions.is_empty());
    assert_eq!(query_strings(&world.db, "SELECT COUNT(*) FROM room_outbox_positions").await, ["0"]);
    assert_eq!(query_strings(&world.db, "SELECT COUNT(*) FROM room_outbox_exceptions").await, ["0"]);
    // b, holding them, settles.
    let settled =
        store.settle(&Settle { owner: "host-b", fences: &b, exceptions: &[], ..settle.clone() }).await.unwrap();
    assert_eq!(settled.passed, vec![events[0].event_id.clone()]);
}

/// A sink registered with `start_from: now` stands at its start: the rows created before are
/// neither read nor walked.
async fn a_sink_that_starts_later_reads_nothing_created_before(world: World) {
    let store = world.producer.as_ref();
    let now = now_ms();
    let events = room_events(&world, "room-4", now - 60_000, 4).await;
    let sink = audit(events[2].created_at_ms);
    let fences = beat(store, "host-a", now).await;
    let read = waiting(store, &sink, &fences, &HashSet::new()).await;
    assert_eq!(
        read.iter().map(|w| w.0.clone()).collect::<Vec<_>>(),
        vec![events[2].event_id.clone(), events[3].event_id.clone()]
    );
    let finished = ids(&events, &[2]);
    let finished_by = |id: &str| finished.contains(id);
    let settle = settling(&sink, &fences, &finished_by, now);
    assert_eq!(store.settle(&settle).await.unwrap().passed, vec![events[2].event_id.clone()]);
}

/// A sink after the first, as its store shows it to the engine and the operator: one owner
/// reads, delivers some events and fails others; each event's status, the counts, the
/// failures, a room held by its failure, an operator's retry and replay all read the
/// sink's positions and exceptions, never the row's own status (the first sink's). An
/// event delivered within the settle time reads `pending` until a settle or a clean stop
/// writes it.
async fn the_operator_sees_a_consumers_own_state(world: World) {
    use outbox_host::store::{Mark, Outcome, ReplayFilter, RetryFilter};

    let store = world.producer.clone();
    let now = now_ms();
    let audit = store.register_sink("audit", 0, false, now).await.unwrap();
    let consumer = store.clone().sink_store(&audit).await.unwrap();
    let room1 = room_events(&world, "room-1", now - 60_000, 4).await;
    let room2 = room_events(&world, "room-2", now - 60_000, 1).await;
    let recent = room_events(&world, "room-3", now, 1).await;
    let beat = held_for_ten_seconds("host-a", &[], now);
    let owned = consumer.keep_partitions(&beat).await.unwrap().owned;
    let read = OwnedRead { owner: "host-a", total: TOTAL, owned: &owned, after: None, limit: 100 };
    let page = consumer.read_owned(&read).await.unwrap();
    assert_eq!(page.waiting.len(), 6, "every event waits for the new sink");
    let row_of = |id: &str| page.waiting.iter().find(|w| w.row.event_id == id).unwrap().row.clone();
    let mark = |id: &str, outcome: Outcome| Mark::of(&row_of(id), outcome);
    let marks = vec![
        mark(&room1[0].event_id, Outcome::Delivered),
        mark(&room1[1].event_id, Outcome::Fail { error: "400 bad request".into() }),
        mark(&room1[2].event_id, Outcome::Retry { error: "503".into(), next_retry_at_ms: now + 60_000 }),
        mark(&room2[0].event_id, Outcome::Delivered),
        mark(&recent[0].event_id, Outcome::Delivered),
    ];
    assert_eq!(consumer.mark_owned("host-a", &marks, now).await.unwrap(), (5, vec![]));

    let status = |id: String| {
        let consumer = consumer.clone();
        async move { consumer.get(&id).await.unwrap().unwrap().status }
    };
    assert_eq!(status(room1[0].event_id.clone()).await, Status::Delivered);
    let failed = consumer.get(&room1[1].event_id).await.unwrap().unwrap();
    assert_eq!(
        (failed.status, failed.retry_count, failed.last_error.as_deref()),
        (Status::Failed, 1, Some("400 bad request"))
    );
    assert_eq!(status(room1[2].event_id.clone()).await, Status::Retryable);
    assert_eq!(status(room1[3].event_id.clone()).await, Status::Pending);
    assert_eq!(status(room2[0].event_id.clone()).await, Status::Delivered);
    assert_eq!(status(recent[0].event_id.clone()).await, Status::Pending, "delivered, not settled yet");
    assert_eq!(world.row(&room1[0].event_id).await.status, Status::Pending, "the first sink's own status");

    let stats = consumer.stats().await.unwrap();
    let counts: Vec<i64> = [Status::Pending, Status::Delivered, Status::Retryable, Status::Failed]
        .iter()
        .map(|s| stats.count(*s))
        .collect();
    assert_eq!(counts, vec![2, 2, 1, 1], "{stats:?}");
    assert_eq!(stats.oldest_waiting_created_at_ms, Some(room1[2].created_at_ms));
    assert!(stats.top_errors.iter().any(|(e, n)| e == "400 bad request" && *n == 1), "{stats:?}");
    let recent_failures: Vec<String> =
        consumer.recent_failures(10).await.unwrap().into_iter().map(|r| r.event_id).collect();
    assert_eq!(recent_failures.len(), 2);
    assert!(recent_failures.contains(&room1[1].event_id) && recent_failures.contains(&room1[2].event_id));
    assert_eq!(consumer.history(now - 3_600_000).await.unwrap().iter().map(|m| m.failed).sum::<i64>(), 1);
    let rooms = [("app-1".to_string(), "room-1".to_string()), ("app-1".to_string(), "room-2".to_string())];
    assert_eq!(
        consumer.failed_rooms(&rooms).await.unwrap(),
        vec![("app-1".into(), "room-1".into(), room1[1].created_at_ms)]
    );

    // An operator's retry of the failed event, then a replay of the delivered ones.
    assert_eq!(consumer.count_failed(&RetryFilter::All).await.unwrap(), 1);
    assert_eq!(consumer.retry_failed(&RetryFilter::EventId(room1[1].event_id.clone()), now).await.unwrap(), 1);
    let retried = consumer.get(&room1[1].event_id).await.unwrap().unwrap();
    assert_eq!((retried.status, retried.retry_count), (Status::Pending, 0));
    assert_eq!(store.get(&room1[1].event_id).await.unwrap().unwrap().status, Status::Pending, "first sink untouched");
    let everything = ReplayFilter { from_ms: 0, to_ms: None, event_type: None, room_id: None, event_id: None };
    assert_eq!(consumer.count_replayable(&everything).await.unwrap(), 2, "the two settled deliveries");
    assert_eq!(consumer.replay(&everything, now, None, 100).await.unwrap().rows, 2);
    assert_eq!(status(room1[0].event_id.clone()).await, Status::Pending);
    assert_eq!(status(room2[0].event_id.clone()).await, Status::Pending);

    // A clean stop writes what the owner delivered within the settle time.
    consumer.leave_partitions("host-a").await.unwrap();
    assert_eq!(status(recent[0].event_id.clone()).await, Status::Delivered);
    assert_eq!(exception_status(&world, &recent[0].event_id).await, ["delivered"]);
}

/// An existing deployment's second sink, kept in its copy of the outbox, becomes a consumer
/// while a producer goes on writing: every event keeps the state the copy gave it (delivered
/// before and past the first pending one, failed with its count and error, retryable,
/// pending), the rows
/// not fanned out yet and those written during the change wait, the copy is gone, and the
/// consumer's reads bring back exactly what waits.
async fn a_sinks_copy_becomes_its_positions_and_exceptions_while_producers_write(world: World) {
    let store = world.producer.clone();
    let now = now_ms();
    store.register_sink("im", 0, true, now).await.unwrap();
    let audit = store.register_sink("audit", 0, false, now + 1).await.unwrap();
    let mut fanned = Vec::new();
    for r in 0..5 {
        fanned.extend(room_events(&world, &format!("room-{r}"), now - 60_000 + r * 100, 6).await);
    }
    fanned.sort_by_key(|e| e.created_at_ms);
    // The copy an earlier version kept, as its fan-out and its host left it: every row so
    // far copied and marked fanned out, each with its state for `audit`.
    let delivered = |i: usize| matches!(i, 0..=9 | 12..=14 | 20 | 25);
    let ids = |pick: &dyn Fn(usize) -> bool| {
        let picked: Vec<String> = (0..30).filter(|i| pick(*i)).map(|i| format!("'{}'", fanned[i].event_id)).collect();
        picked.join(", ")
    };
    let copy = &audit.table;
    for sql in [
        format!("CREATE TABLE {copy} AS SELECT * FROM room_outbox WHERE 1 = 0"),
        format!("INSERT INTO {copy} SELECT * FROM room_outbox"),
        format!("UPDATE room_outbox SET fanned_out_at_ms = {now}"),
        format!(
            "UPDATE {copy} SET status = 'delivered', delivered_at_ms = {now} WHERE event_id IN ({})",
            ids(&delivered)
        ),
        format!(
            "UPDATE {copy} SET status = 'failed', retry_count = 1, last_error = '400 bad request' WHERE event_id IN ({})",
            ids(&|i| i == 10)
        ),
        format!(
            "UPDATE {copy} SET status = 'retryable', retry_count = 1, last_error = '503', next_retry_at_ms = {} \
             WHERE event_id IN ({})",
            now + 60_000,
            ids(&|i| i == 11)
        ),
    ] {
        world.db.execute(&sql).await.unwrap();
    }
    let unfanned = room_events(&world, "room-9", now - 30_000, 5).await;

    // A producer writes while the copy becomes positions and exceptions.
    let writer = {
        let producer = world.producer.clone();
        let template = world.event("RoomGiftSent", "room-live", Status::Pending);
        tokio::spawn(async move {
            let mut written = Vec::new();
            for i in 0..40 {
                let event = NewEvent { event_id: format!("live-{i}"), created_at_ms: now_ms(), ..template.clone() };
                producer.insert(std::slice::from_ref(&event)).await.unwrap();
                written.push(event);
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            written
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(
        store.consumer_from_copy(&audit, now_ms()).await.unwrap(),
        Some(4),
        "failed, retryable, and the two delivered past the first pending"
    );
    let live = writer.await.unwrap();
    assert_eq!(store.consumer_from_copy(&audit, now_ms()).await.unwrap(), None, "no copy left");
    let copies = if world.db_url().starts_with("sqlite") {
        "SELECT COUNT(*) FROM sqlite_master WHERE name = 'room_outbox__audit'"
    } else if world.db_url().starts_with("postgres") {
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_name = 'room_outbox__audit' AND table_schema = current_schema()"
    } else {
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_name = 'room_outbox__audit' AND table_schema = DATABASE()"
    };
    assert_eq!(query_strings(&world.db, copies).await, ["0"], "the copy is dropped");

    let consumer = store.clone().sink_store(&audit).await.unwrap();
    let mut expected: Vec<(String, Status)> = Vec::new();
    for (i, e) in fanned.iter().enumerate() {
        let status = match i {
            i if delivered(i) => Status::Delivered,
            10 => Status::Failed,
            11 => Status::Retryable,
            _ => Status::Pending,
        };
        expected.push((e.event_id.clone(), status));
    }
    expected.extend(unfanned.iter().chain(&live).map(|e| (e.event_id.clone(), Status::Pending)));
    for (id, status) in &expected {
        assert_eq!(consumer.get(id).await.unwrap().unwrap().status, *status, "{id}");
    }
    let failed = consumer.get(&fanned[10].event_id).await.unwrap().unwrap();
    assert_eq!((failed.retry_count, failed.last_error.as_deref()), (1, Some("400 bad request")));

    // What the consumer reads is exactly what waits: nothing delivered comes back.
    let beat = Heartbeat {
        owner: "new-host",
        partitions: 64,
        in_flight: 0,
        now_ms: now_ms(),
        lease_ms: 10_000,
        renew: &[],
        release: &[],
    };
    let owned = consumer.keep_partitions(&beat).await.unwrap().owned;
    let mut read: Vec<String> = Vec::new();
    let mut after = None;
    loop {
        let page = consumer
            .read_owned(&OwnedRead { owner: "new-host", total: 64, owned: &owned, after, limit: 7 })
            .await
            .unwrap();
        read.extend(page.waiting.iter().map(|w| w.row.event_id.clone()));
        if page.at_end {
            break;
        }
        after = page.last;
    }
    read.sort();
    let mut waiting: Vec<String> = expected
        .iter()
        .filter(|(_, s)| matches!(s, Status::Pending | Status::Retryable))
        .map(|(id, _)| id.clone())
        .collect();
    waiting.sort();
    assert_eq!(read, waiting);
}

/// An event that failed for now, was read again and then delivered is not read a third
/// time: its delivery is written over its exception, not only remembered.
async fn an_event_retried_then_delivered_is_not_read_again(world: World) {
    use outbox_host::store::{Mark, Outcome};

    let store = world.producer.clone();
    let now = now_ms();
    let audit = store.register_sink("audit", 0, false, now).await.unwrap();
    let consumer = store.clone().sink_store(&audit).await.unwrap();
    let events = room_events(&world, "room-1", now - 60_000, 3).await;
    let beat = held_for_ten_seconds("host-a", &[], now);
    let owned = consumer.keep_partitions(&beat).await.unwrap().owned;
    let read = || {
        let (consumer, owned) = (consumer.clone(), owned.clone());
        async move {
            let read = OwnedRead { owner: "host-a", total: TOTAL, owned: &owned, after: None, limit: 100 };
            consumer.read_owned(&read).await.unwrap().waiting
        }
    };
    let page = read().await;
    assert_eq!(page.len(), 3);
    let retry = Outcome::Retry { error: "503".into(), next_retry_at_ms: now - 1 };
    let marks = vec![
        Mark::of(&page[0].row, retry),
        Mark::of(&page[1].row, Outcome::Delivered),
        Mark::of(&page[2].row, Outcome::Delivered),
    ];
    assert_eq!(consumer.mark_owned("host-a", &marks, now).await.unwrap(), (3, vec![]));
    let again = read().await;
    assert_eq!(
        again.iter().map(|w| (w.row.event_id.clone(), w.status)).collect::<Vec<_>>(),
        vec![(events[0].event_id.clone(), Status::Retryable)]
    );
    assert_eq!(
        consumer.mark_owned("host-a", &[Mark::of(&again[0].row, Outcome::Delivered)], now).await.unwrap(),
        (1, vec![])
    );
    assert!(read().await.is_empty(), "delivered after its retry, it is not read again");
    assert_eq!(consumer.get(&events[0].event_id).await.unwrap().unwrap().status, Status::Delivered);
    assert!(read().await.is_empty());
}

/// Two hosts of the sink `audit`: host-a holds every partition and delivered the three
/// events of room-1 (created within the settle time, so held in its memory only); host-b
/// has not beaten yet.
struct Delivered {
    a: std::sync::Arc<dyn Store>,
    b: std::sync::Arc<dyn Store>,
    events: Vec<NewEvent>,
    /// The room's partition.
    room_part: u32,
    /// Every partition but the room's.
    others: Vec<u32>,
}

async fn host_a_delivered_room_1(world: &World, now: i64) -> Delivered {
    use outbox_host::store::{Mark, Outcome};

    let store = world.producer.clone();
    let audit = store.register_sink("audit", 0, false, now).await.unwrap();
    let (a, b) = (store.clone().sink_store(&audit).await.unwrap(), store.clone().sink_store(&audit).await.unwrap());
    let events = room_events(world, "room-1", now - 1_000, 3).await;
    let owned = a.keep_partitions(&held_for_ten_seconds("host-a", &[], now)).await.unwrap().owned;
    assert_eq!(owned.len(), TOTAL as usize, "alone, host-a holds every partition");
    let read = OwnedRead { owner: "host-a", total: TOTAL, owned: &owned, after: None, limit: 100 };
    let page = a.read_owned(&read).await.unwrap().waiting;
    assert_eq!(page.len(), 3);
    let marks: Vec<Mark> = page.iter().map(|w| Mark::of(&w.row, Outcome::Delivered)).collect();
    assert_eq!(a.mark_owned("host-a", &marks, now).await.unwrap(), (3, vec![]));
    let room_part = page[0].row.lease.fence.unwrap().partition;
    let others = owned.iter().map(|f| f.partition).filter(|p| *p != room_part).collect();
    Delivered { a, b, events, room_part, others }
}

/// host-b, having taken `taken`, reads none of room-1's delivered events again.
async fn host_b_delivers_none_again(b: &dyn Store, taken: &[Fence]) {
    let read = OwnedRead { owner: "host-b", total: TOTAL, owned: taken, after: None, limit: 100 };
    let again = b.read_owned(&read).await.unwrap().waiting;
    assert!(
        again.is_empty(),
        "host-b delivers none of them again: {:?}",
        again.iter().map(|w| &w.row.event_id).collect::<Vec<_>>()
    );
}

/// The engine lets a drained partition go before its heartbeat gives it up; when that
/// heartbeat fails (a settle MariaDB broke as a deadlock, a statement that timed out), the
/// next one no longer names it. The store still gives it up, and first writes what its
/// owner delivered there and holds only in memory (created within the settle time): the
/// partition's next owner reads none of it.
async fn a_partition_no_longer_renewed_is_given_up_with_what_its_owner_delivered(world: World) {
    let now = now_ms();
    let Delivered { a, b, events, room_part, others } = host_a_delivered_room_1(&world, now).await;
    assert!(
        exception_status(&world, &events[0].event_id).await.is_empty(),
        "delivered within the settle time: in memory only"
    );

    let joined = b.keep_partitions(&held_for_ten_seconds("host-b", &[], now + 50)).await.unwrap();
    assert!(joined.owned.is_empty(), "host-b joins; every partition is host-a's");
    let kept = a.keep_partitions(&held_for_ten_seconds("host-a", &others, now + 100)).await.unwrap().owned;
    assert!(!kept.iter().any(|f| f.partition == room_part), "host-a no longer holds partition {room_part}");
    for e in &events {
        assert_eq!(
            exception_status(&world, &e.event_id).await,
            ["delivered"],
            "{} written before it was given up",
            e.event_id
        );
    }
    let taken = b.keep_partitions(&held_for_ten_seconds("host-b", &[], now + 200)).await.unwrap().owned;
    assert!(taken.iter().any(|f| f.partition == room_part), "host-b takes the free partition at once: {taken:?}");
    host_b_delivers_none_again(b.as_ref(), &taken).await;
}

/// A heartbeat that gives a partition up settles first, writing what its owner delivered
/// there. When that settle fails (here its exceptions' table is away; on SQLite, a busy
/// database), the heartbeat fails, and every lease is renewed all the same, the one it was
/// giving up with them: past the old leases' end another host takes none of them, and once
/// a settle succeeds the partition is given up with what was delivered there settled (by
/// now behind its position), so its next owner delivers none of it again. (Without the
/// renewal the leases ran out and host-b read the three events again.)
async fn a_heartbeat_whose_settle_fails_still_renews_every_lease(world: World) {
    let now = now_ms();
    let Delivered { a, b, events, room_part, others } = host_a_delivered_room_1(&world, now).await;

    world.db.execute("ALTER TABLE room_outbox_exceptions RENAME TO room_outbox_exceptions_away").await.unwrap();
    let failed = a.keep_partitions(&held_for_ten_seconds("host-a", &others, now + 5_000)).await;
    world.db.execute("ALTER TABLE room_outbox_exceptions_away RENAME TO room_outbox_exceptions").await.unwrap();
    assert!(failed.is_err(), "the settle could not write, and the heartbeat says so: {failed:?}");

    let past_first_leases = now + 10_500;
    let joined = b.keep_partitions(&held_for_ten_seconds("host-b", &[], past_first_leases)).await.unwrap();
    assert!(
        joined.owned.is_empty(),
        "the failed heartbeat renewed every lease, partition {room_part} too: host-b takes none ({:?})",
        joined.owned
    );
    for e in &events {
        assert!(exception_status(&world, &e.event_id).await.is_empty(), "the failed settle wrote nothing");
    }

    let kept = a.keep_partitions(&held_for_ten_seconds("host-a", &others, past_first_leases + 100)).await.unwrap();
    assert!(!kept.owned.iter().any(|f| f.partition == room_part), "host-a gives partition {room_part} up now");
    let taken = b.keep_partitions(&held_for_ten_seconds("host-b", &[], past_first_leases + 200)).await.unwrap().owned;
    assert!(taken.iter().any(|f| f.partition == room_part), "host-b takes the free partition: {taken:?}");
    host_b_delivers_none_again(b.as_ref(), &taken).await;
}

/// 30,000 events delivered, all older than the settle time: the outcome write's settle
/// walks 5,000 rows, and a heartbeat settles again, 20,000 rows at a time, while its walks
/// stop at their limit, so the positions pass every one of them at that heartbeat. (Before,
/// a heartbeat passed 5,000 rows, and the owner kept the rest in memory, its leases renewed,
/// for a heartbeat per 5,000.)
async fn a_heartbeat_passes_a_whole_backlog_delivered_past_the_horizon(world: World) {
    use outbox_host::store::{Mark, Outcome};

    let store = world.producer.clone();
    let now = now_ms();
    let audit = store.register_sink("audit", 0, false, now).await.unwrap();
    let first_ms = now - 60_000;
    let mut events = Vec::new();
    for room in 0..300 {
        events.extend(room_events(&world, &format!("room-{room}"), first_ms, 100).await);
    }
    let a = store.clone().sink_store(&audit).await.unwrap();
    let owned = a.keep_partitions(&held_for_ten_seconds("host-a", &[], now)).await.unwrap().owned;
    assert_eq!(owned.len(), TOTAL as usize, "alone, host-a holds every partition");
    let mut marks = Vec::new();
    let mut after = None;
    loop {
        let read = OwnedRead { owner: "host-a", total: TOTAL, owned: &owned, after, limit: 1_000 };
        let page = a.read_owned(&read).await.unwrap();
        marks.extend(page.waiting.iter().map(|w| Mark::of(&w.row, Outcome::Delivered)));
        if page.at_end {
            break;
        }
        after = page.last;
    }
    assert_eq!(marks.len(), events.len(), "every event read once");
    assert_eq!(a.mark_owned("host-a", &marks, now).await.unwrap(), (events.len() as u64, vec![]));

    let parts: Vec<u32> = owned.iter().map(|f| f.partition).collect();
    let behind = |positions: &[Position]| positions.iter().filter(|p| p.created_at_ms < first_ms + 99).count();
    assert!(
        behind(&store.positions(&audit, &parts).await.unwrap()) > 0,
        "the outcome write's settle walked 5,000 rows, not all"
    );
    a.keep_partitions(&held_for_ten_seconds("host-a", &parts, now + 100)).await.unwrap();
    let positions = store.positions(&audit, &parts).await.unwrap();
    assert_eq!(behind(&positions), 0, "every position at its partition's last row: {positions:?}");
    assert_eq!(query_strings(&world.db, "SELECT COUNT(*) FROM room_outbox_exceptions").await, ["0"]);
    assert!(waiting(store.as_ref(), &audit, &owned, &HashSet::new()).await.is_empty(), "nothing waits for the sink");
}

/// `partitions --set` with the sink's hosts stopped: the positions and exceptions kept in
/// four partitions, each partition's position somewhere else, are made those of two and of
/// seven. Each time a host of the new count finds waiting exactly what waited before (none
/// of what was delivered, all of what was not), and the retried event keeps its count.
async fn a_new_partition_count_keeps_what_a_consumer_has_waiting_no_more_no_less(world: World) {
    use outbox_host::store::{Mark, Outcome};

    let store = world.producer.clone();
    let now = now_ms();
    let audit = store.register_sink("audit", 0, false, now).await.unwrap();
    let mut events = Vec::new();
    for room in 0..24 {
        events.extend(room_events(&world, &format!("room-{room}"), now - 60_000 + room * 10, 4).await);
    }
    let all_of = |store: std::sync::Arc<dyn Store>, owner: &'static str, now: i64| async move {
        let holding = store.keep_partitions(&held_for_ten_seconds(owner, &[], now)).await.unwrap();
        let read = OwnedRead { owner, total: holding.total, owned: &holding.owned, after: None, limit: 1_000 };
        let page = store.read_owned(&read).await.unwrap();
        assert!(page.at_end);
        page.waiting
    };
    let a = store.clone().sink_store(&audit).await.unwrap();
    let waiting = all_of(a.clone(), "host-a", now).await;
    assert_eq!(waiting.len(), events.len());
    // Per partition, in order: the first few delivered (more in each next partition), the
    // next one failed for now, the rest not attempted.
    let mut marks = Vec::new();
    let mut waits = HashSet::new();
    for part in 0..TOTAL {
        let mine: Vec<_> = waiting.iter().filter(|w| w.row.lease.fence.unwrap().partition == part).collect();
        let delivered = mine.len() * (part as usize + 1) / (TOTAL as usize + 1);
        for (i, w) in mine.iter().enumerate() {
            match i.cmp(&delivered) {
                std::cmp::Ordering::Less => marks.push(Mark::of(&w.row, Outcome::Delivered)),
                std::cmp::Ordering::Equal => {
                    marks.push(Mark::of(&w.row, Outcome::Retry { error: "503".into(), next_retry_at_ms: now }));
                    waits.insert(w.row.event_id.clone());
                }
                std::cmp::Ordering::Greater => {
                    waits.insert(w.row.event_id.clone());
                }
            }
        }
    }
    assert_eq!(a.mark_owned("host-a", &marks, now).await.unwrap().0, marks.len() as u64);
    a.leave_partitions("host-a").await.unwrap();
    let retried = marks.iter().find(|m| matches!(m.outcome, Outcome::Retry { .. })).unwrap().event_id.clone();
    for (total, owner) in [(2, "host-b"), (7, "host-c")] {
        let consumer = store.clone().sink_store(&audit).await.unwrap();
        assert!(consumer.set_partitions(total, now).await.unwrap().is_ok(), "no host holds a partition");
        let found = all_of(consumer.clone(), owner, now).await;
        let ids: HashSet<String> = found.iter().map(|w| w.row.event_id.clone()).collect();
        assert_eq!(ids.len(), found.len(), "each waiting event once");
        assert_eq!(ids, waits, "in {total} partitions, what waited in four");
        let again = found.iter().find(|w| w.row.event_id == retried).unwrap();
        assert_eq!((again.status, again.row.retry_count), (Status::Retryable, 1), "the retried event keeps its state");
        consumer.leave_partitions(owner).await.unwrap();
    }
}
