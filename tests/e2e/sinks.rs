//! Several sinks on one outbox, each with its own delivery state: every sink gets every
//! event once, whatever the others do; a sink added later starts where it is told; a
//! single-sink table upgrades in place with every state kept.

use std::collections::HashMap;
use std::sync::Arc;

use outbox_host::store::{NewEvent, RegisteredSink, Status, Store};
use outbox_test_support::Collector;
use outbox_test_support::tencent::TencentIm;

use crate::support::{Running, World, counts, fake_sink_to, per_backend, sink_entry};

per_backend!(
    two_sinks_on_one_table_each_get_every_event_once_from_four_hosts,
    a_sink_failing_every_event_does_not_hold_back_the_other,
    a_sink_added_later_starts_from_the_beginning_or_from_now,
    a_single_sink_table_upgrades_in_place_keeping_every_state,
    a_replayed_range_reaches_that_sink_only,
    a_removed_sink_continues_where_it_left_off_and_purge_keeps_what_it_needs,
);

/// `n` pending gift events over 50 rooms, inserted by the producer in chunks.
async fn produce(world: &World, n: usize) -> Vec<NewEvent> {
    world.produce_many(n, Status::Pending).await
}

/// The store of the sink `name`'s state.
async fn state_of(world: &World, name: &str) -> (RegisteredSink, Arc<dyn Store>) {
    let sinks = world.producer.sinks().await.unwrap();
    let sink = sinks.into_iter().find(|s| s.name == name).unwrap_or_else(|| panic!("sink {name} not registered"));
    let store = world.producer.clone().sink_store(&sink).await.unwrap();
    (sink, store)
}

async fn count(store: &dyn Store, status: Status) -> i64 {
    store.stats().await.unwrap().count(status)
}

/// The fake sink (first) and the Tencent IM sink against its stand-in (second), four hosts
/// on one table, 10,000 events: each sink receives every event exactly once, and each
/// sink's own state says delivered for all of them.
///
/// A clean run: partitions change hands only as hosts join and leave, never by a lease
/// running out. The four hosts share this test's one thread, and with the machine loaded
/// SQLite's writers queue for seconds (statements of 5 s, seen with three CPU hogs beside
/// it): a heartbeat held that long lets the default lease (10 s) run out, and the
/// partition's next owner delivers again what the last delivered and had not yet written
/// (at least once, as after a kill; faults.rs counts those). So the leases here outlast
/// such a wait.
async fn two_sinks_on_one_table_each_get_every_event_once_from_four_hosts(world: World) {
    const EVENTS: usize = 10_000;
    let im = TencentIm::start([]).await;
    let config = world
        .setup("concurrency: 16\nbatch_size: 100\npartition_lease: 30s", "")
        .with_sinks(vec![sink_entry(&crate::tencent::sink(&im, &im.endpoint()), "start_from: beginning")])
        .parse();
    let mut hosts = Vec::new();
    for _ in 0..4 {
        hosts.push(Running::start(config.clone()).await);
    }
    let events = produce(&world, EVENTS).await;
    let (im_sink, im_state) = state_of(&world, "tencent-im").await;
    assert_eq!(im_sink.table, "room_outbox__tencent_im");
    hosts[0]
        .wait_for_within("both sinks to deliver every event", std::time::Duration::from_secs(240), || async {
            count(world.producer.as_ref(), Status::Delivered).await == EVENTS as i64
                && count(im_state.as_ref(), Status::Delivered).await == EVENTS as i64
        })
        .await;
    for host in hosts {
        host.stop().await;
    }
    let fake = counts(&world.collector);
    let mut tencent: HashMap<String, usize> = HashMap::new();
    for r in im.received() {
        *tencent.entry(r.data["event_id"].as_str().unwrap().to_string()).or_insert(0) += 1;
    }
    for e in &events {
        assert_eq!(fake.get(&e.event_id), Some(&1), "the fake sink got {} once", e.event_id);
        assert_eq!(tencent.get(&e.event_id), Some(&1), "Tencent IM got {} once", e.event_id);
    }
    assert_eq!((fake.len(), tencent.len()), (EVENTS, EVENTS), "and nothing else");
    // The first sink's state is the outbox's own columns; the second's its positions and
    // exceptions, over the same row.
    let row = world.row(&events[0].event_id).await;
    let seen = im_state.get(&events[0].event_id).await.unwrap().expect("the sink's view of the row");
    assert_eq!((row.status, seen.status), (Status::Delivered, Status::Delivered));
    assert_eq!(
        (seen.event_id.as_str(), seen.envelope.as_slice()),
        (row.event_id.as_str(), events[0].envelope.as_slice())
    );
    // Its deliveries settled into positions: nothing waits, and the only exceptions left are
    // `delivered` ones written as partitions changed hands among the four hosts, far fewer
    // than the events.
    let db = &world.db;
    let exceptions = |status: &str| {
        let sql = format!("SELECT COUNT(*) FROM room_outbox_exceptions WHERE status {status}");
        async move { crate::support::query_strings(db, &sql).await[0].parse::<usize>().unwrap() }
    };
    assert_eq!(exceptions("<> 'delivered'").await, 0, "nothing left waiting");
    assert!(exceptions("= 'delivered'").await < EVENTS / 100, "no row of its own per delivery");
}

/// The first sink fails every event permanently; the second (Tencent IM) still gets every
/// event once, and each sink's table says what happened to it: all `failed` in one, all
/// `delivered` in the other.
async fn a_sink_failing_every_event_does_not_hold_back_the_other(world: World) {
    const EVENTS: usize = 500;
    let im = TencentIm::start([]).await;
    let config = world
        .setup("concurrency: 8\nbatch_size: 50", "default: permanent")
        .with_sinks(vec![sink_entry(&crate::tencent::sink(&im, &im.endpoint()), "start_from: beginning")])
        .parse();
    let mut host = Running::start(config).await;
    let events = produce(&world, EVENTS).await;
    let (_, im_state) = state_of(&world, "tencent-im").await;
    host.wait_for("each sink to finish every event", || async {
        count(world.producer.as_ref(), Status::Failed).await == EVENTS as i64
            && count(im_state.as_ref(), Status::Delivered).await == EVENTS as i64
    })
    .await;
    host.stop().await;
    let received: Vec<String> =
        im.received().iter().map(|r| r.data["event_id"].as_str().unwrap().to_string()).collect();
    assert_eq!(received.len(), EVENTS, "Tencent IM got each event once");
    let failed = world.row(&events[0].event_id).await;
    assert_eq!(failed.last_error.as_deref(), Some("fake: scripted permanent failure"));
    assert_eq!(im_state.get(&events[0].event_id).await.unwrap().unwrap().last_error, None);
}

/// 5,000 events delivered to the first sink; then a host with three more sinks: `audit`
/// (`start_from: beginning`) gets those 5,000 once and then the new ones; `activity`
/// (`start_from: now`) only the new ones; `window` (an RFC 3339 time) those created from
/// then on. The first sink gets nothing twice.
async fn a_sink_added_later_starts_from_the_beginning_or_from_now(world: World) {
    const BEFORE: usize = 5_000;
    const AFTER: usize = 300;
    let config = world.setup("concurrency: 16\nbatch_size: 100", "").parse();
    let mut host = Running::start(config).await;
    let before = produce(&world, BEFORE).await;
    host.wait_for_within("the first sink to deliver the first events", std::time::Duration::from_secs(120), || async {
        count(world.producer.as_ref(), Status::Delivered).await == BEFORE as i64
    })
    .await;
    host.stop().await;

    let (audit, activity, window) = (Collector::start().await, Collector::start().await, Collector::start().await);
    // A third starts from a time in the middle of the earlier events.
    let cut = before[BEFORE / 2].created_at_ms;
    let config = world
        .setup("concurrency: 16\nbatch_size: 100", "")
        .with_sinks(vec![
            sink_entry(&fake_sink_to("audit", &audit, ""), "start_from: beginning"),
            sink_entry(&fake_sink_to("activity", &activity, ""), "start_from: now"),
            sink_entry(
                &fake_sink_to("window", &window, ""),
                &format!("start_from: \"{}\"", outbox_host::units::format_rfc3339_ms(cut)),
            ),
        ])
        .parse();
    let mut host = Running::start(config).await;
    let (audit_sink, audit_state) = state_of(&world, "audit").await;
    let (activity_sink, activity_state) = state_of(&world, "activity").await;
    let (window_sink, window_state) = state_of(&world, "window").await;
    assert_eq!(window_sink.start_from_ms, cut);
    let from_cut = before.iter().filter(|e| e.created_at_ms >= cut).count();
    assert_eq!(audit_sink.start_from_ms, 0);
    assert!(activity_sink.start_from_ms > before.last().unwrap().created_at_ms);
    let after = produce(&world, AFTER).await;
    host.wait_for_within("the new sinks to deliver", std::time::Duration::from_secs(120), || async {
        count(audit_state.as_ref(), Status::Delivered).await == (BEFORE + AFTER) as i64
            && count(activity_state.as_ref(), Status::Delivered).await == AFTER as i64
            && count(window_state.as_ref(), Status::Delivered).await == (from_cut + AFTER) as i64
            && count(world.producer.as_ref(), Status::Delivered).await == (BEFORE + AFTER) as i64
    })
    .await;
    host.stop().await;
    let (first, audit, activity, window) =
        (counts(&world.collector), counts(&audit), counts(&activity), counts(&window));
    for e in &before {
        assert_eq!(first.get(&e.event_id), Some(&1), "the first sink got {} once", e.event_id);
        assert_eq!(audit.get(&e.event_id), Some(&1), "audit got the earlier {} once", e.event_id);
        assert_eq!(activity.get(&e.event_id), None, "activity started from now: not {}", e.event_id);
        let expected = (e.created_at_ms >= cut).then_some(&1);
        assert_eq!(window.get(&e.event_id), expected, "window started at its time: {}", e.event_id);
    }
    for e in &after {
        for (name, seen) in
            [("the first sink", &first), ("audit", &audit), ("activity", &activity), ("window", &window)]
        {
            assert_eq!(seen.get(&e.event_id), Some(&1), "{name} got the later {} once", e.event_id);
        }
    }
    assert_eq!(
        crate::support::query_strings(
            &world.db,
            "SELECT COUNT(*) FROM room_outbox_exceptions WHERE status <> 'delivered'"
        )
        .await,
        ["0"],
        "nothing left waiting for any sink"
    );
}

/// A table as the host left it before several sinks (migration 6), with `delivered`,
/// `retryable` and `failed` rows: `migrate` keeps every state, and a host with a second sink
/// delivers nothing twice to the first.
async fn a_single_sink_table_upgrades_in_place_keeping_every_state(world: World) {
    let url = world.db_url();
    world.as_before_several_sinks().await;
    let delivered = world.produce("RoomGiftSent", "room-1", Status::Delivered).await;
    let retryable = world.produce("RoomGiftSent", "room-2", Status::Pending).await;
    let failed = world.produce("RoomGiftSent", "room-3", Status::Pending).await;
    let pending = world.produce("RoomGiftSent", "room-4", Status::Pending).await;
    for (id, status, error) in
        [(&retryable, "retryable", "was failing"), (&failed, "failed", "gave up after 3 attempts: nope")]
    {
        world
            .db
            .execute(&format!(
                "UPDATE room_outbox SET status = '{status}', retry_count = 3, last_error = '{error}', \
                 next_retry_at_ms = 0 WHERE event_id = '{id}'"
            ))
            .await
            .unwrap();
    }
    let before: Vec<_> =
        futures_util::future::join_all([&delivered, &retryable, &failed, &pending].map(|id| world.row(id))).await;

    let upgraded = outbox_host::store::open(&url, 2, "room_outbox").await.unwrap();
    upgraded.migrate().await.unwrap();
    let after: Vec<_> =
        futures_util::future::join_all([&delivered, &retryable, &failed, &pending].map(|id| world.row(id))).await;
    assert_eq!(after, before, "migrate keeps every row as it was");

    let audit = Collector::start().await;
    let config = world
        .setup("", "")
        .with_sinks(vec![sink_entry(&fake_sink_to("audit", &audit, ""), "start_from: beginning")])
        .parse();
    let mut host = Running::start(config).await;
    let (_, audit_state) = state_of(&world, "audit").await;
    host.wait_for("both sinks to settle", || async {
        count(audit_state.as_ref(), Status::Delivered).await == 4
            && world.row(&retryable).await.status == Status::Delivered
            && world.row(&pending).await.status == Status::Delivered
    })
    .await;
    host.stop().await;
    let first = counts(&world.collector);
    assert_eq!(first.get(&delivered), None, "the producer's delivered row is not delivered again to the first sink");
    assert_eq!(first.get(&failed), None, "a failed row waits for an operator");
    assert_eq!((first.get(&retryable), first.get(&pending)), (Some(&1), Some(&1)));
    let failed_row = world.row(&failed).await;
    assert_eq!((failed_row.status, failed_row.retry_count), (Status::Failed, 3));
    // The new sink gets all four: the producer's `delivered` was for the first sink only.
    let audit = counts(&audit);
    for id in [&delivered, &retryable, &failed, &pending] {
        assert_eq!(audit.get(id), Some(&1), "audit got {id} once");
    }
    upgraded.close().await;
}

/// A time range replayed to one sink, from the command line and then over the API, is
/// received again by that sink only; `show` gives each sink's state of an event, `status`
/// and `/api/status` list every sink, and the page offers the replay.
async fn a_replayed_range_reaches_that_sink_only(world: World) {
    const TOKEN: &str = "replay-test-token-0123456789";
    let audit = Collector::start().await;
    let setup = world
        .setup("", "")
        .with_sinks(vec![sink_entry(&fake_sink_to("audit", &audit, ""), "start_from: beginning")])
        .set(&["admin", "token"], TOKEN)
        .with_admin();
    crate::binary::write_config(&world, &setup.yaml());
    let mut host = Running::start(setup.parse()).await;
    let base = format!("http://{}", host.admin.unwrap());
    let early = produce(&world, 40).await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let boundary = outbox_host::store::now_ms();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let late = produce(&world, 40).await;
    let (_, audit_state) = state_of(&world, "audit").await;
    host.wait_for("both sinks to deliver", || async {
        count(world.producer.as_ref(), Status::Delivered).await == 80
            && count(audit_state.as_ref(), Status::Delivered).await == 80
    })
    .await;

    let (from, to) = (
        outbox_host::units::format_rfc3339_ms(early[0].created_at_ms),
        outbox_host::units::format_rfc3339_ms(boundary),
    );
    let out = crate::binary::run_cli_beside(&world, &["replay", "--sink", "audit", "--from", &from, "--to", &to]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "replaying 40 event(s) to sink audit\n");
    host.wait_for("audit to receive the early events again", || async {
        let seen = counts(&audit);
        early.iter().all(|e| seen.get(&e.event_id) == Some(&2))
    })
    .await;
    // Received is not yet recorded: the outcomes land in the next batch.
    host.wait_for("the replayed rows delivered again", || async {
        count(audit_state.as_ref(), Status::Delivered).await == 80
    })
    .await;

    // Over the API: one room of the same range; refused without the token or for a sink
    // the table does not know.
    let client = reqwest::Client::new();
    let url = format!("{base}/api/sinks/audit/replay?from={from}&to={to}&room=room-1");
    assert!(!client.post(&url).send().await.unwrap().status().is_success(), "no token, no replay");
    // A replay over HTTP says how far it may go: without a limit, or past it, the answer is
    // the count, and nothing moves.
    let without = client.post(&url).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(without.status(), 400);
    let answer: serde_json::Value = serde_json::from_str(&without.text().await.unwrap()).unwrap();
    assert_eq!((answer["matching"].as_u64(), answer["sink"].as_str()), (Some(1), Some("audit")));
    let over = client.post(format!("{url}&limit=0")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(over.status(), 409);
    assert!(over.text().await.unwrap().contains("1 events match, more than the limit of 0: nothing replayed"));
    assert_eq!(count(audit_state.as_ref(), Status::Delivered).await, 80, "nothing moved");
    let url = format!("{url}&limit=1");
    let answer: serde_json::Value =
        serde_json::from_str(&client.post(&url).bearer_auth(TOKEN).send().await.unwrap().text().await.unwrap())
            .unwrap();
    assert_eq!(answer, serde_json::json!({ "sink": "audit", "replayed": 1 }));
    let unknown =
        client.post(format!("{base}/api/sinks/nope/replay?from={from}")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(unknown.status(), 404);
    assert!(unknown.text().await.unwrap().contains("its sinks: fake, audit"));
    host.wait_for("audit to receive room-1's early event a third time", || async {
        counts(&audit).get(&early[1].event_id) == Some(&3)
    })
    .await;
    host.wait_for("every row delivered again", || async { count(audit_state.as_ref(), Status::Delivered).await == 80 })
        .await;

    // The other sink received nothing again, and the later events went nowhere twice.
    let (first, seen) = (counts(&world.collector), counts(&audit));
    for e in early.iter().chain(&late) {
        assert_eq!(first.get(&e.event_id), Some(&1), "the first sink got {} once", e.event_id);
    }
    for e in &late {
        assert_eq!(seen.get(&e.event_id), Some(&1), "audit got the later {} once", e.event_id);
    }
    let expected = |e: &NewEvent| if e.event_id == early[1].event_id { 3 } else { 2 };
    for e in &early {
        assert_eq!(seen.get(&e.event_id), Some(&expected(e)), "audit replays of {}", e.event_id);
    }

    // Each sink's state of one event; every sink in `status`, `/api/status` and on the page.
    let out = crate::binary::run_cli_beside(&world, &["show", &early[1].event_id]).await;
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["sinks"]["fake"]["status"], "delivered");
    assert_eq!(shown["sinks"]["fake"]["table"], "room_outbox");
    assert_eq!(shown["sinks"]["audit"]["status"], "delivered");
    assert_eq!(shown["sinks"]["audit"]["table"], "room_outbox__audit");
    assert_eq!(shown["sinks"]["audit"]["retry_count"], 0);
    let status = String::from_utf8(crate::binary::run_cli_beside(&world, &["status"]).await.stdout).unwrap();
    assert!(status.starts_with("room_outbox (sink fake): 80 rows\n"), "{status}");
    assert!(status.contains("\nroom_outbox (sink audit, reading it as a consumer): 80 rows\n"), "{status}");
    // Each sink's partitions are leased on their own: both sinks list this host's worker as
    // the owner of all 64, and what it has in flight (the table shows those rows pending).
    let owners = status
        .matches("partition owners (per-room order; rows in flight stay pending in the table):\n  test-node-")
        .count();
    assert_eq!(owners, 2, "{status}");
    assert_eq!(status.matches(" 64 partition(s) 0-63  ").count(), 2, "{status}");
    let api: serde_json::Value =
        serde_json::from_str(&reqwest::get(format!("{base}/api/status")).await.unwrap().text().await.unwrap()).unwrap();
    let names: Vec<&str> = api["sinks"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["fake", "audit"]);
    assert_eq!(api["sinks"][1]["counts"]["delivered"], 80);
    let owner = &api["sinks"][1]["owners"][0];
    assert_eq!(owner["partitions"].as_array().map(Vec::len), Some(64), "{api}");
    assert!(owner["in_flight"].as_i64().is_some_and(|n| n >= 0), "{api}");
    assert!(owner["owner"].as_str().unwrap().starts_with("test-node-"), "{api}");
    let page = reqwest::get(format!("{base}/")).await.unwrap().text().await.unwrap();
    assert!(page.contains("<tr data-sink=\"audit\" data-state=\"delivering\">"), "{page}");
    assert_eq!(page.matches(": 64 (0-63), ").count(), 2, "{page}");
    let audit = reqwest::get(format!("{base}/sinks/audit")).await.unwrap().text().await.unwrap();
    assert!(audit.contains("id=\"replay\"") && audit.contains(": 64 (0-63), "), "{audit}");
    host.stop().await;
}

/// A sink removed from the config stops delivering, but its positions stay and the outbox
/// keeps the new events for it, so that adding it again continues where it left off, each
/// event once. `retry --sink` acts on that sink's state only, and `purge` keeps what that
/// sink still needs.
async fn a_removed_sink_continues_where_it_left_off_and_purge_keeps_what_it_needs(world: World) {
    let audit = Collector::start().await;
    let both = world.setup("", "").with_sinks(vec![sink_entry(
        &fake_sink_to("audit", &audit, "room.room-7: permanent"),
        "start_from: beginning",
    )]);
    crate::binary::write_config(&world, &both.yaml());
    let mut host = Running::start(both.parse()).await;
    let first = produce(&world, 50).await;
    let (_, audit_state) = state_of(&world, "audit").await;
    host.wait_for("both sinks to finish the first events", || async {
        count(world.producer.as_ref(), Status::Delivered).await == 50
            && count(audit_state.as_ref(), Status::Delivered).await == 49
            && count(audit_state.as_ref(), Status::Failed).await == 1
    })
    .await;
    host.stop().await;

    // Removed: the first sink goes on; the audit table keeps filling, undelivered.
    let mut host = Running::start(world.setup("", "").parse()).await;
    let second = produce(&world, 30).await;
    host.wait_for("the first sink to deliver, and the new events to wait for audit", || async {
        count(world.producer.as_ref(), Status::Delivered).await == 80
            && count(audit_state.as_ref(), Status::Pending).await == 30
    })
    .await;
    host.stop().await;
    assert_eq!(audit.reports().len(), 50, "a removed sink delivers nothing");

    // Added again: it continues with what it missed.
    let mut host = Running::start(both.parse()).await;
    host.wait_for("audit to catch up", || async {
        count(audit_state.as_ref(), Status::Delivered).await == 78
            && count(audit_state.as_ref(), Status::Failed).await == 2
    })
    .await;
    host.stop().await;
    let (first_sink, seen) = (counts(&world.collector), counts(&audit));
    for e in first.iter().chain(&second) {
        assert_eq!(first_sink.get(&e.event_id), Some(&1), "the first sink got {} once", e.event_id);
        assert_eq!(seen.get(&e.event_id), Some(&1), "audit got {} once", e.event_id);
    }

    // Retry on audit's state only; purge keeps audit's two undelivered events.
    let out = crate::binary::run_cli_beside(&world, &["retry", "--sink", "audit", "--all"]).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "moved 2 failed event(s) back to pending\n");
    assert_eq!(count(audit_state.as_ref(), Status::Pending).await, 2);
    assert_eq!(count(world.producer.as_ref(), Status::Delivered).await, 80, "the first sink's rows untouched");
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    let out = crate::binary::run_cli_beside(&world, &["purge", "--delivered-before", "1ms"]).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "deleted 78 delivered row(s) older than 1ms from room_outbox\n");
    let left = audit_state.stats().await.unwrap();
    assert_eq!((left.count(Status::Pending), left.count(Status::Delivered)), (2, 0), "audit keeps what it still needs");
}
