//! Per-room order by partition ownership: hosts lease a sink's partitions, an owner's
//! outcomes land only while it still holds the partition under its epoch, a stopped or
//! killed owner's partitions are taken over once its leases run out (by the database's
//! clock), and a clean shutdown gives them up at once.

use std::time::Duration;

use outbox_host::store::{Fence, Heartbeat, Mark, Outcome, OwnedRead, Status, Store, now_ms};

use crate::binary::{signal, spawn_host, wait_exit};
use crate::support::{Running, World, per_backend, query_strings};

per_backend!(
    an_outcome_from_a_lost_partition_is_not_written,
    a_killed_owners_rooms_wait_for_its_partition_leases_then_go_on,
    a_clean_shutdown_gives_up_every_partition_and_claims_nothing,
    a_host_joining_one_just_started_gets_its_share_within_short_beats,
    the_partition_count_changes_only_by_command_with_the_hosts_stopped,
    a_go_workers_live_lease_holds_its_room_until_it_ends,
    a_host_with_another_ordering_than_the_live_hosts_refuses_to_start,
    a_lease_renewed_a_moment_ago_is_not_written_again_and_its_end_is_reported;
    servers: a_stopped_owner_is_taken_over_and_its_late_outcomes_are_fenced
);

/// One heartbeat of `owner` at `now` on a 4-partition sink, with a one-second lease.
async fn beat(store: &dyn Store, owner: &str, now: i64) -> Vec<Fence> {
    let beat = Heartbeat { owner, partitions: 4, in_flight: 0, now_ms: now, lease_ms: 1_000, renew: &[], release: &[] };
    store.keep_partitions(&beat).await.unwrap().owned
}

/// One heartbeat of `owner` at `now` renewing `renew`, with an eight-second lease.
async fn renewing(store: &dyn Store, owner: &str, renew: &[u32], now: i64) -> outbox_host::store::Holding {
    let beat = Heartbeat { owner, partitions: 4, in_flight: 0, now_ms: now, lease_ms: 8_000, renew, release: &[] };
    store.keep_partitions(&beat).await.unwrap()
}

/// The lease ends of the partition rows, as the table has them.
async fn lease_ends(world: &World) -> Vec<i64> {
    let ends = query_strings(&world.db, "SELECT lease_until_ms FROM room_outbox_partitions ORDER BY part").await;
    ends.iter().map(|e| e.parse().unwrap()).collect()
}

/// Every waiting row of the `owned` partitions, as `owner` reads them.
async fn read(store: &dyn Store, owner: &str, owned: &[Fence]) -> Vec<outbox_host::store::Waiting> {
    let read = OwnedRead { owner, total: 4, owned, after: None, limit: 10 };
    store.read_owned(&read).await.unwrap().waiting
}

/// A retryable outcome of `row`, as its reader holds it.
fn retry(row: &outbox_host::store::Claimed, now: i64) -> Mark {
    Mark::of(row, Outcome::Retry { error: "stale".into(), next_retry_at_ms: now })
}

/// The store's own fencing: owner `a` reads a row, its lease runs out and `b` takes every
/// partition (a new epoch); `a`'s outcome, written afterwards, changes nothing, in the same
/// transaction that checks the partition; `b`'s lands.
async fn an_outcome_from_a_lost_partition_is_not_written(world: World) {
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let store = world.producer.as_ref();
    let now = now_ms();
    let a = beat(store, "host-a", now).await;
    assert_eq!(a.len(), 4, "the only owner takes every partition");
    let seen_by_a = read(store, "host-a", &a).await;
    assert_eq!(seen_by_a.len(), 1);
    assert!(seen_by_a[0].due(now));
    assert_eq!(world.row(&id).await.status, Status::Pending, "reading writes nothing");

    // Two seconds on, a's one-second leases have run out: b takes every partition over.
    let later = now + 2_000;
    let b = beat(store, "host-b", later).await;
    assert_eq!(b.len(), 4);
    let (fence_a, fence_b) = (seen_by_a[0].row.lease.fence.unwrap(), b[0]);
    let fence_b = b.iter().find(|f| f.partition == fence_a.partition).copied().unwrap_or(fence_b);
    assert_eq!(fence_b.epoch, fence_a.epoch + 1, "a takeover increments the epoch");

    let (changed, fenced) = store.mark_owned("host-a", &[retry(&seen_by_a[0].row, later)], later).await.unwrap();
    assert_eq!((changed, fenced), (0, vec![0]), "the stale outcome was written");
    let mut delivered = retry(&seen_by_a[0].row, later);
    delivered.outcome = Outcome::Delivered;
    assert_eq!(store.mark_owned("host-a", &[delivered], later).await.unwrap(), (0, vec![0]), "even delivered");
    let row = world.row(&id).await;
    assert_eq!((row.status, row.retry_count, row.last_error), (Status::Pending, 0, None));

    let seen_by_b = read(store, "host-b", &b).await;
    let (changed, fenced) = store.mark_owned("host-b", &[retry(&seen_by_b[0].row, later)], later).await.unwrap();
    assert_eq!((changed, fenced), (1, vec![]));
    let row = world.row(&id).await;
    assert_eq!((row.status, row.retry_count, row.last_error.as_deref()), (Status::Retryable, 1, Some("stale")));
    // b's fence under a's name is no lease at all.
    assert_eq!(store.mark_owned("host-a", &[retry(&seen_by_b[0].row, later)], later).await.unwrap().1, vec![0]);
}

/// Waits until the sink has received `n` attempts in all.
async fn wait_attempts(world: &World, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while world.collector.reports().len() < n {
        assert!(tokio::time::Instant::now() < deadline, "the sink never received {n} attempts");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Real processes: the owner is SIGSTOPped with four deliveries in flight, past its
/// partition lease; a second host takes the partitions over and starts delivering; the first
/// is SIGCONTed while the second's deliveries are in flight, its four deliveries time out,
/// and their `retryable` outcomes are fenced off. Unfenced, they would land on the rows the
/// second host holds (still `pending`) and leave an attempt and an error on them.
async fn a_stopped_owner_is_taken_over_and_its_late_outcomes_are_fenced(world: World) {
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(world.produce("RoomGiftSent", &format!("room-{i}"), Status::Pending).await);
    }
    let worker = "publish_timeout: 1s\nconcurrency: 4\npartition_lease: 4s";
    let first = spawn_host(&world, &world.yaml(worker, "default: loop"));
    wait_attempts(&world, 4).await;
    signal(&first, "STOP");
    let mut second = Running::start(world.config(worker, "default: sleep:500")).await;
    wait_attempts(&world, 8).await;
    signal(&first, "CONT");
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    second.wait_status(&world, &refs, Status::Delivered).await;
    signal(&first, "TERM");
    let out = wait_exit(first).await;
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("lost partitions to another host"), "{log}");
    let fenced = log.matches("outcome not written: this host no longer owns the row's partition").count();
    assert!(fenced >= 4, "the four late outcomes were not all fenced ({fenced}):\n{log}");
    second.stop().await;
    for id in &ids {
        let row = world.row(id).await;
        assert_eq!((row.status, row.retry_count, row.last_error), (Status::Delivered, 0, None), "{id}");
    }
}

/// A SIGKILLed owner leaves its rooms to its partition leases: another host delivers them
/// once the leases have run out, not before, and every event is delivered.
async fn a_killed_owners_rooms_wait_for_its_partition_leases_then_go_on(world: World) {
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(world.produce("RoomGiftSent", &format!("room-{i}"), Status::Pending).await);
    }
    let worker = "publish_timeout: 1s\nconcurrency: 4\npartition_lease: 4s";
    let mut first = spawn_host(&world, &world.yaml(worker, "default: sleep:700"));
    wait_attempts(&world, 1).await;
    first.kill().unwrap();
    first.wait().unwrap();
    let owners = world.producer.partition_owners(now_ms()).await.unwrap();
    assert_eq!(owners.len(), 1, "the killed host's heartbeat is still live: {owners:?}");
    let lease_end = owners[0].lease_until_ms;

    let mut second = Running::start(world.config(worker, "default: ok")).await;
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    second.wait_status(&world, &refs, Status::Delivered).await;
    second.stop().await;
    for id in &ids {
        let delivered_at = world.row(id).await.delivered_at_ms.unwrap();
        assert!(delivered_at >= lease_end, "{id} was delivered before the dead owner's lease ran out");
    }
}

/// A host joins one that has just started and taken every partition: both hold their half
/// within a few short beats, well before the first's next normal heartbeat (a third of the
/// 60 s lease), because a starting host beats every eighth of a heartbeat and so sees the
/// newcomer, and gives up its surplus, early. (Hosts that start at the same instant mostly
/// split at their first heartbeat already.)
async fn a_host_joining_one_just_started_gets_its_share_within_short_beats(world: World) {
    for i in 0..400 {
        world.produce("RoomGiftSent", &format!("room-{i}"), Status::Pending).await;
    }
    let config = || world.config("concurrency: 4\npublish_timeout: 2s\npartition_lease: 60s", "default: sleep:50");
    let owning = || async {
        world.producer.partition_owners(now_ms()).await.unwrap().iter().map(|o| o.partitions.len()).collect::<Vec<_>>()
    };
    let mut first = Running::start(config()).await;
    first.wait_for("the first host to own every partition", || async { owning().await == [64] }).await;
    let second = Running::start(config()).await;
    first
        .wait_for_within("each host to own its half", Duration::from_secs(15), || async { owning().await == [32, 32] })
        .await;
    first.stop().await;
    second.stop().await;
}

/// A clean shutdown with a full buffer: the delivery in flight finishes, nothing was ever
/// claimed (no row is `delivering`), and every partition is given up at once, so the next
/// host goes on without waiting for a lease.
async fn a_clean_shutdown_gives_up_every_partition_and_claims_nothing(world: World) {
    let mut ids = Vec::new();
    for i in 0..100 {
        ids.push(world.produce("RoomGiftSent", &format!("room-{i}"), Status::Pending).await);
    }
    let config = world.config("batch_size: 50\nconcurrency: 1\npublish_timeout: 5s", "default: sleep:300");
    let mut host = Running::start(config).await;
    host.wait_for("a delivery in flight", || async { !world.collector.reports().is_empty() }).await;
    let owners = world.producer.partition_owners(now_ms()).await.unwrap();
    assert_eq!(owners.iter().map(|o| o.partitions.len()).collect::<Vec<_>>(), vec![64], "one owner of every partition");
    host.stop().await;
    world.assert_handed_back(&ids, 100, 90).await;
    assert!(world.producer.partition_owners(now_ms()).await.unwrap().is_empty(), "a partition is still leased");

    let mut next = Running::start(world.config("concurrency: 8", "")).await;
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    next.wait_status(&world, &refs, Status::Delivered).await;
    next.stop().await;
}

/// The partition count is the table's: a host configured otherwise uses it, and
/// `partitions --set` changes it only while no host holds a partition.
async fn the_partition_count_changes_only_by_command_with_the_hosts_stopped(world: World) {
    let setup = world.setup("", "");
    crate::binary::write_config(&world, &setup.yaml());
    let mut host = Running::start(setup.parse()).await;
    host.wait_for("the host to own every partition", || async {
        world.producer.partition_owners(now_ms()).await.unwrap().first().is_some_and(|o| o.partitions.len() == 64)
    })
    .await;
    let refused = crate::binary::run_cli_beside(&world, &["partitions", "--set", "16"]).await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(stderr.contains("hosts hold its partitions (test-node-") && stderr.contains("nothing changed"), "{stderr}");
    let shown = crate::binary::run_cli_beside(&world, &["partitions"]).await;
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("sink fake: partition owners") && shown.contains("64 partition(s) 0-63"), "{shown}");
    host.stop().await;

    let changed = crate::binary::run_cli_beside(&world, &["partitions", "--set", "16"]).await;
    assert!(changed.status.success(), "{}", String::from_utf8_lossy(&changed.stderr));
    assert_eq!(String::from_utf8_lossy(&changed.stdout), "sink fake: 64 partition(s) made 16\n");
    let mut host = Running::start(world.config("partitions: 32", "")).await;
    host.wait_for("the host to own the table's 16 partitions", || async {
        world.producer.partition_owners(now_ms()).await.unwrap().first().is_some_and(|o| o.partitions.len() == 16)
    })
    .await;
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    host.wait_status(&world, &[&id], Status::Delivered).await;
    host.stop().await;
}

/// During a cutover: a row room-service's Go worker holds (`delivering`, its lease live) is
/// not started, nor is anything after it in its room, while other rooms go on; once the
/// lease has ended the owner delivers the room in order.
async fn a_go_workers_live_lease_holds_its_room_until_it_ends(world: World) {
    let held = world.produce("RoomGiftSent", "room-x", Status::Pending).await;
    let behind = world.produce("RoomGiftSent", "room-x", Status::Pending).await;
    let other = world.produce("RoomGiftSent", "room-y", Status::Pending).await;
    let until = now_ms() + 3_000;
    world
        .db
        .execute(&format!(
            "UPDATE room_outbox SET status = 'delivering', worker_id = 'go-worker-1', lock_until_ms = {until} \
             WHERE event_id = '{held}'"
        ))
        .await
        .unwrap();
    let mut host = Running::start(world.config("", "")).await;
    host.wait_status(&world, &[&other], Status::Delivered).await;
    assert!(world.collector.attempts_of(&behind).is_empty(), "the room went on behind the Go worker's lease");
    assert!(world.collector.attempts_of(&held).is_empty(), "a live lease was taken");
    host.wait_status(&world, &[&held, &behind], Status::Delivered).await;
    host.stop().await;
    let order: Vec<String> = world.collector.reports().into_iter().map(|r| r.event_id).collect();
    assert_eq!(order, vec![other, held.clone(), behind], "room-x out of order");
    assert!(world.row(&held).await.delivered_at_ms.unwrap() >= until, "delivered before the lease ended");
}

/// Every page of at most `limit` rows `store` reads of `owned` (of 8 partitions), from the
/// oldest row to the end: each page's event ids.
async fn sweep(store: &dyn Store, owned: &[Fence], limit: u32) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let read = OwnedRead { owner: "host-a", total: 8, owned, after: after.clone(), limit };
        let page = store.read_owned(&read).await.unwrap();
        for w in &page.waiting {
            let partition = w.row.lease.fence.unwrap().partition;
            assert!(owned.iter().any(|f| f.partition == partition), "a row of partition {partition}");
        }
        pages.push(page.waiting.iter().map(|w| w.row.event_id.clone()).collect());
        if page.at_end {
            return pages;
        }
        after = page.last;
    }
}

/// PostgreSQL's partition index (an expression index of the partition): an owner of half
/// the partitions reads, page by page, the same rows in the same order as without it, and
/// the two halves make up every row once. By the server's own counters, a read of the
/// owner's rows goes through the partition index alone and reads its rows' entries, not the
/// table's.
#[tokio::test]
async fn postgres_an_owner_of_some_partitions_reads_only_their_rows() {
    use crate::support::entries_read;
    let Some(db) = crate::support::TestDb::postgres().await else { return };
    let world = World::on(db).await;
    let events: Vec<_> =
        (0..2_000).map(|i| world.event("RoomGiftSent", &format!("room-{}", i % 200), Status::Pending)).collect();
    for chunk in events.chunks(500) {
        world.producer.insert(chunk).await.unwrap();
    }
    let fences = |parts: std::ops::Range<u32>| parts.map(|partition| Fence { partition, epoch: 1 }).collect::<Vec<_>>();
    let (first, second) = (fences(0..4), fences(4..8));
    let url = world.db_url();
    let open = || outbox_host::store::open(&url, 1, "room_outbox");
    let indexed = open().await.unwrap();
    assert!(indexed.index_partitions(8).await.unwrap(), "PostgreSQL has a partition index");

    // Page by page, with and without the index (a store that has not looked for it reads
    // the claim index, filtered).
    let flat = |pages: &[Vec<String>]| pages.concat();
    let with = flat(&sweep(indexed.as_ref(), &first, 100).await);
    assert_eq!(with, flat(&sweep(world.producer.as_ref(), &first, 100).await), "the same rows in the same order");
    let owned_rows = with.len();
    assert!(owned_rows > 500 && owned_rows < 1_500, "half the partitions hold {owned_rows} of 2,000 rows");
    let mut every = with.clone();
    every.extend(flat(&sweep(indexed.as_ref(), &second, 100).await));
    every.sort();
    let mut all: Vec<String> = events.iter().map(|e| e.event_id.clone()).collect();
    all.sort();
    assert_eq!(every, all, "the two halves make up every row once");
    indexed.close().await;

    // One read of every owned row, by a store of its own whose connection then closes (a
    // closing backend flushes its counts). One page, so that whichever plan PostgreSQL
    // picks (a range of the index per partition, or a bitmap of each partition's entries,
    // which a page after the first would read again from the cursor on) reads each entry
    // once.
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&world.db_url()).await.unwrap();
    let claim_before = entries_read(&mut conn, "room_outbox_claim_idx", None).await;
    let part_before = entries_read(&mut conn, "room_outbox_p8_idx", None).await;
    let counted = open().await.unwrap();
    assert!(counted.index_partitions(8).await.unwrap(), "the index is found");
    assert_eq!(flat(&sweep(counted.as_ref(), &first, 2_000).await), with, "one page of the same rows");
    counted.close().await;
    let part_read = entries_read(&mut conn, "room_outbox_p8_idx", Some(part_before)).await - part_before;
    let claim_read = entries_read(&mut conn, "room_outbox_claim_idx", None).await - claim_before;
    assert_eq!(claim_read, 0, "the read went through the claim index");
    assert!(
        part_read >= owned_rows as i64 && part_read < owned_rows as i64 + 50,
        "{part_read} partition index entries read for {owned_rows} of 2,000 waiting rows"
    );
}

/// A backlog in a table PostgreSQL has no statistics for (a new table, not analyzed yet):
/// the planner, guessing that a handful of rows wait, would rather scan a bitmap of every
/// waiting row and sort them than take the first entries of the claim index. An owner's
/// read of a page reads about a page of the index, by the server's own counters.
#[tokio::test]
async fn postgres_a_page_of_a_backlog_reads_a_page_of_the_index_before_any_statistics() {
    use crate::support::entries_read;
    let Some(db) = crate::support::TestDb::postgres().await else { return };
    let world = World::on(db).await;
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&world.db_url()).await.unwrap();
    // Autovacuum must not analyze the table while the test runs.
    sqlx::query("ALTER TABLE room_outbox SET (autovacuum_enabled = false)").execute(&mut conn).await.unwrap();
    let events: Vec<_> =
        (0..20_000).map(|i| world.event("RoomGiftSent", &format!("room-{}", i % 1_000), Status::Pending)).collect();
    for chunk in events.chunks(1_000) {
        world.producer.insert(chunk).await.unwrap();
    }
    let unanalyzed: bool =
        sqlx::query_scalar("SELECT reltuples < 0 FROM pg_class WHERE oid = to_regclass('room_outbox')")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(unanalyzed, "the table has no statistics yet");

    let before = entries_read(&mut conn, "room_outbox_claim_idx", None).await;
    let reader = outbox_host::store::open(&world.db_url(), 1, "room_outbox").await.unwrap();
    let owned: Vec<Fence> = (0..8).map(|partition| Fence { partition, epoch: 1 }).collect();
    let read = OwnedRead { owner: "host-a", total: 8, owned: &owned, after: None, limit: 100 };
    let page = reader.read_owned(&read).await.unwrap();
    reader.close().await;
    let ids: Vec<&str> = page.waiting.iter().map(|w| w.row.event_id.as_str()).collect();
    let oldest: Vec<&str> = events[..100].iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids, oldest, "the page is the 100 oldest rows");
    let entries = entries_read(&mut conn, "room_outbox_claim_idx", Some(before)).await - before;
    assert!(entries < 1_000, "{entries} claim index entries read for a page of 100 of 20,000 waiting rows");
}

/// The hosts of a sink deliver with one ordering: a host whose `ordering` differs from the
/// live hosts' refuses to start, naming theirs, and leaves no trace that would hold back a
/// host started after it; once they have stopped, it starts. Both ways round.
async fn a_host_with_another_ordering_than_the_live_hosts_refuses_to_start(world: World) {
    let per_room = world.config("", "default: ok");
    let none = world.config("ordering: none", "default: ok");
    // The sink's hosts of each ordering, as (per_room, none).
    let hosts = || async {
        let per_room = query_strings(&world.db, "SELECT COUNT(*) FROM room_outbox_owners").await;
        let none = query_strings(&world.db, "SELECT COUNT(*) FROM room_outbox_claimers").await;
        (per_room[0].clone(), none[0].clone())
    };
    let count = |per_room: &str, none: &str| (per_room.to_string(), none.to_string());

    let first = Running::start(per_room.clone()).await;
    let refused =
        outbox_host::app::Host::start(none.clone()).await.err().expect("ordering: none refused beside per_room");
    let said = format!("{refused:#}");
    assert!(said.contains("deliver this sink with outbox_worker.ordering: per_room"), "{said}");
    assert!(said.contains("this host is configured with ordering: none"), "{said}");
    assert_eq!(hosts().await, count("1", "0"), "the refused host left its row");
    first.stop().await;
    assert_eq!(hosts().await, count("0", "0"), "a clean stop leaves");

    let first = Running::start(none.clone()).await;
    assert_eq!(hosts().await, count("0", "1"), "an ordering: none host is among the hosts");
    let refused = outbox_host::app::Host::start(per_room.clone()).await.err().expect("per_room refused beside none");
    let said = format!("{refused:#}");
    assert!(said.contains("deliver this sink with outbox_worker.ordering: none"), "{said}");
    assert!(said.contains("this host is configured with ordering: per_room"), "{said}");
    assert_eq!(hosts().await, count("0", "1"), "the refused host left its row");
    first.stop().await;
    assert_eq!(hosts().await, count("0", "0"), "a clean stop of an ordering: none host leaves");

    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let mut last = Running::start(per_room).await;
    last.wait_status(&world, &[&id], Status::Delivered).await;
    last.stop().await;
}

/// A host's quick heartbeats (its start's, eight to a normal beat) renew no lease renewed
/// within the last eighth of its length: the partition rows are not written again, and the
/// heartbeat reports their lease's end as the table has it (a delivery starts only with
/// enough of it left). A beat past that eighth renews every lease.
async fn a_lease_renewed_a_moment_ago_is_not_written_again_and_its_end_is_reported(world: World) {
    let store = world.producer.as_ref();
    let now = now_ms();
    let taken = renewing(store, "host-a", &[], now).await;
    assert_eq!(taken.owned.len(), 4);
    assert_eq!(lease_ends(&world).await, [now + 8_000; 4]);
    let all: Vec<u32> = taken.owned.iter().map(|f| f.partition).collect();

    let quick = renewing(store, "host-a", &all, now + 900).await;
    assert_eq!(quick.owned, taken.owned, "still held");
    assert_eq!(lease_ends(&world).await, [now + 8_000; 4], "renewed 900 ms ago of 8 s: not written");
    assert_eq!(quick.lease_until_ms, now + 8_000, "the end the table has, not now + the lease");

    let later = renewing(store, "host-a", &all, now + 1_100).await;
    assert_eq!(lease_ends(&world).await, [now + 9_100; 4], "renewed 1.1 s ago of 8 s (past an eighth): renewed");
    assert_eq!(later.lease_until_ms, now + 9_100);
}
