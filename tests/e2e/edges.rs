//! Nothing lost at the edges of several sinks: a sink configured before the first event, a
//! purge while a new sink catches up, two sink names that would share their partitions, an
//! adopted table with wider columns than the host's, and SQLite's reused row ids.

use std::sync::Arc;
use std::time::Duration;

use outbox_host::store::{NewEvent, RegisteredSink, Status, Store, now_ms};
use outbox_test_support::{Collector, FAKE_SINK};

use crate::support::{Running, SinkSpec, World, counts, fake_sink_to, per_backend, sink_entry};

per_backend!(
    sinks_configured_at_migrate_get_every_event_in_the_deployment_order,
    a_sink_configured_when_the_table_is_created_starts_from_its_beginning,
    two_sink_names_that_would_share_a_table_are_refused,
    a_replay_counts_first_and_asks_before_a_large_one,
    a_purge_keeps_what_a_new_sink_is_to_deliver,
    migrate_turns_an_earlier_versions_copy_into_positions_once_its_hosts_are_gone;
    servers: a_purge_racing_a_backfill_keeps_what_the_new_sink_needs,
    a_schema_change_waits_without_holding_up_inserts,
);

/// The registered sink `name` and the store of its state, on `outbox`.
async fn state_of(outbox: &Arc<dyn Store>, name: &str) -> (RegisteredSink, Arc<dyn Store>) {
    let sink = outbox.sinks().await.unwrap().into_iter().find(|s| s.name == name).expect("registered");
    let store = outbox.clone().sink_store(&sink).await.unwrap();
    (sink, store)
}

async fn delivered(store: &dyn Store) -> i64 {
    store.stats().await.unwrap().count(Status::Delivered)
}

/// Every event of `events` seen exactly once by `collector`.
fn assert_each_once(collector: &Collector, events: &[NewEvent], name: &str) {
    let seen = counts(collector);
    let missed = events.iter().filter(|e| !seen.contains_key(&e.event_id)).count();
    assert_eq!(missed, 0, "{name} missed {missed} of {} events", events.len());
    for e in events {
        assert_eq!(seen.get(&e.event_id), Some(&1), "{name} got {} once", e.event_id);
    }
}

/// The deployment order: `migrate` (a migration job), then the producer writes 2,000
/// events, then two hosts `run`. The second sink, `start_from: now` by default, was
/// registered by `migrate`, so it gets every event; before, its first `run` registered it
/// after the events and it missed them.
async fn sinks_configured_at_migrate_get_every_event_in_the_deployment_order(world: World) {
    const EVENTS: usize = 2_000;
    let b = Collector::start().await;
    // Leases that outlast a loaded machine's waits: a clean run (see sinks.rs).
    let setup = world
        .setup("concurrency: 16\nbatch_size: 100\npartition_lease: 30s", "")
        .with_sinks(vec![sink_entry(&fake_sink_to("b", &b, ""), "")]);
    crate::binary::write_config(&world, &setup.yaml());
    let out = crate::binary::run_cli_beside(&world, &["migrate"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "room_outbox is up to date\nsink fake is registered (room_outbox)\nsink b is registered (a consumer of room_outbox)\n"
    );
    let events = world.produce_many(EVENTS, Status::Pending).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut hosts = vec![Running::start(setup.parse()).await, Running::start(setup.parse()).await];
    let (_, b_state) = state_of(&world.producer, "b").await;
    hosts[0]
        .wait_for_within("both sinks to deliver every event", Duration::from_secs(120), || async {
            delivered(world.producer.as_ref()).await == EVENTS as i64
                && delivered(b_state.as_ref()).await == EVENTS as i64
        })
        .await;
    for host in hosts {
        host.stop().await;
    }
    assert_each_once(&world.collector, &events, "the first sink");
    assert_each_once(&b, &events, "sink b");
}

/// On a database without the table, `enqueue` (as `make run` does first) creates it and
/// registers the configured sinks from its beginning, whatever their `start_from`: the
/// events it enqueues reach the second sink once a host runs.
async fn a_sink_configured_when_the_table_is_created_starts_from_its_beginning(world: World) {
    for table in ["room_outbox_sinks", "room_outbox_migrations", "room_outbox"] {
        world.db.execute(&format!("DROP TABLE {table}")).await.unwrap();
    }
    let b = Collector::start().await;
    let setup = world.setup("", "").with_sinks(vec![sink_entry(&fake_sink_to("b", &b, ""), "start_from: now")]);
    crate::binary::write_config(&world, &setup.yaml());
    let out =
        crate::binary::run_cli_beside(&world, &["enqueue", "-t", "RoomHeatChanged", "-r", "room-1", "-n", "5"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let outbox = outbox_host::store::open(&world.db_url(), 2, "room_outbox").await.unwrap();
    let (b_sink, b_state) = state_of(&outbox, "b").await;
    assert_eq!(b_sink.start_from_ms, 0, "registered from the table's beginning");
    let mut host = Running::start(setup.parse()).await;
    host.wait_for("both sinks to receive the enqueued events", || async {
        world.collector.reports().len() >= 5 && b.reports().len() >= 5
    })
    .await;
    // A clean stop writes what the second sink delivered (its state says so only a settle
    // time later otherwise).
    host.stop().await;
    assert_eq!((delivered(outbox.as_ref()).await, delivered(b_state.as_ref()).await), (5, 5));
    assert_eq!((world.collector.reports().len(), b.reports().len()), (5, 5), "each sink got each event once");
    outbox.close().await;
}

/// `b-x` and `b_x` would both key their partitions as `room_outbox__b_x`, each then getting
/// only some of the events. The second registration is refused, naming both, from another
/// config file (another host) as from the same one.
async fn two_sink_names_that_would_share_a_table_are_refused(world: World) {
    let spec = |name: &'static str| SinkSpec { name, plugin: FAKE_SINK, allowed_hosts: vec![], config: String::new() };
    let first = world.setup("", "").with_sinks(vec![sink_entry(&spec("b-x"), "")]);
    crate::binary::write_config(&world, &first.yaml());
    let out = crate::binary::run_cli_beside(&world, &["migrate"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let second = world.setup("", "").with_sinks(vec![sink_entry(&spec("b_x"), "")]);
    crate::binary::write_config(&world, &second.yaml());
    for command in ["migrate", "run"] {
        let out = crate::binary::run_cli_beside(&world, &[command]).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command}: {stderr}");
        assert!(
            stderr.contains(
                "sink \"b_x\" would key its partitions as room_outbox__b_x, which sink \"b-x\" already uses: rename one of them"
            ),
            "{command}: {stderr}"
        );
    }
    let names: Vec<String> = world.producer.sinks().await.unwrap().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["fake", "b-x"], "nothing registered for b_x");
}

/// An earlier version's deployment: sink `b` kept in its copy of the outbox, one of its
/// events failed there, and a host of that version still holding a lease on the copy.
/// `migrate` refuses, naming that host, and changes nothing; once the host's lease has run
/// out, `migrate` turns the copy into `b`'s positions and exceptions and drops it: the failed
/// event is failed for `b`, the delivered ones are not delivered again, and a host of this
/// version delivers `b` only what was waiting.
async fn migrate_turns_an_earlier_versions_copy_into_positions_once_its_hosts_are_gone(world: World) {
    let b = Collector::start().await;
    let setup = world.setup("", "").with_sinks(vec![sink_entry(&fake_sink_to("b", &b, ""), "start_from: beginning")]);
    crate::binary::write_config(&world, &setup.yaml());
    let migrate = || crate::binary::run_cli_beside(&world, &["migrate"]);
    assert!(migrate().await.status.success());
    // The earlier version's state: four events, all delivered by the first sink; in b's
    // copy the first failed, the next two delivered, the last waiting.
    let events = world.produce_many(4, Status::Delivered).await;
    let old = now_ms() - 60_000;
    for sql in [
        "CREATE TABLE room_outbox__b AS SELECT * FROM room_outbox WHERE 1 = 0".to_string(),
        format!("UPDATE room_outbox SET created_at_ms = {old} + id, fanned_out_at_ms = {old}"),
        "INSERT INTO room_outbox__b SELECT * FROM room_outbox".to_string(),
        "UPDATE room_outbox__b SET status = 'pending'".to_string(),
        format!(
            "UPDATE room_outbox__b SET status = 'failed', retry_count = 3, last_error = '400 bad request' \
             WHERE event_id = '{}'",
            events[0].event_id
        ),
        format!(
            "UPDATE room_outbox__b SET status = 'delivered' WHERE event_id IN ('{}', '{}')",
            events[1].event_id, events[2].event_id
        ),
        format!(
            "INSERT INTO room_outbox_owners (sink_table, owner, lease_until_ms, in_flight) \
             VALUES ('room_outbox__b', 'old-host-1234-abcd', {}, 0)",
            now_ms() + 3_600_000
        ),
    ] {
        world.db.execute(&sql).await.unwrap();
    }
    let refused = migrate().await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("old-host-1234-abcd") && stderr.contains("room_outbox__b"), "{stderr}");
    assert_eq!(crate::support::query_strings(&world.db, "SELECT COUNT(*) FROM room_outbox__b").await, ["4"]);

    // The old host is gone: its lease ran out.
    world
        .db
        .execute("UPDATE room_outbox_owners SET lease_until_ms = 0 WHERE owner = 'old-host-1234-abcd'")
        .await
        .unwrap();
    let out = migrate().await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "room_outbox is up to date\nsink fake is registered (room_outbox)\nsink b is registered (a consumer of room_outbox)\n"
    );
    let (_, state) = state_of(&world.producer, "b").await;
    let status = |i: usize| {
        let (state, id) = (state.clone(), events[i].event_id.clone());
        async move { state.get(&id).await.unwrap().unwrap() }
    };
    let failed = status(0).await;
    assert_eq!(
        (failed.status, failed.retry_count, failed.last_error.as_deref()),
        (Status::Failed, 3, Some("400 bad request"))
    );
    assert_eq!(
        (status(1).await.status, status(2).await.status, status(3).await.status),
        (Status::Delivered, Status::Delivered, Status::Pending)
    );

    let mut host = Running::start(setup.parse()).await;
    host.wait_for("b to receive what waited", || async { counts(&b).contains_key(&events[3].event_id) }).await;
    host.stop().await;
    let seen = counts(&b);
    assert_eq!(seen.len(), 1, "b got only the waiting event: {seen:?}");
    assert_eq!(status(3).await.status, Status::Delivered);
}

/// Sinks `fake` and `b` delivered 50,000 events; then `c` is added with `start_from:
/// beginning`, and purges run over and over while it reads them from its start. `c` gets
/// every event; the purges delete nothing `c` still needs (past its positions), and once it
/// has delivered them (and its host stopped cleanly, writing what it remembered) they empty
/// the outbox.
async fn a_purge_racing_a_backfill_keeps_what_the_new_sink_needs(world: World) {
    const EVENTS: usize = 50_000;
    let quiet = |name: &'static str| SinkSpec { name, plugin: FAKE_SINK, allowed_hosts: vec![], config: String::new() };
    let worker = "concurrency: 32\nbatch_size: 500";
    let two = world.setup(worker, "").with_sinks(vec![sink_entry(&quiet("b"), "start_from: beginning")]);
    let mut host = Running::start(two.parse()).await;
    // The first sink's synchronous publish succeeded for every event: only `b` delivers.
    let events = world.produce_many(EVENTS, Status::Delivered).await;
    let (_, b_state) = state_of(&world.producer, "b").await;
    host.wait_for_within("b to deliver every event", Duration::from_secs(240), || async {
        delivered(b_state.as_ref()).await == EVENTS as i64
    })
    .await;
    host.stop().await;

    let c = Collector::start().await;
    let three = world.setup(worker, "").with_sinks(vec![
        sink_entry(&quiet("b"), "start_from: beginning"),
        sink_entry(&fake_sink_to("c", &c, ""), "start_from: beginning"),
    ]);
    let host = Running::start(three.parse()).await;
    let mut purged = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    // Counted at the destination.
    while counts(&c).len() < EVENTS {
        assert!(tokio::time::Instant::now() < deadline, "c received {} of {EVENTS} events", counts(&c).len());
        purged += outbox_host::ops::purge(world.producer.as_ref(), now_ms(), 1_000).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    host.stop().await;
    assert_each_once(&c, &events, "sink c");
    // Once c has delivered them, nothing holds the outbox's rows any more.
    purged += outbox_host::ops::purge(world.producer.as_ref(), now_ms(), 1_000).await.unwrap();
    assert_eq!(purged, EVENTS as u64, "the purges emptied the outbox in the end");
    assert_eq!(world.producer.stats().await.unwrap().counts.iter().map(|(_, n)| n).sum::<i64>(), 0);
}

/// Another host registers a new sink `c` from the beginning; its partitions are not made
/// yet (its host has not started delivering): a purge keeps every event `c` is to deliver,
/// though the first sink delivered them all, and deletes them once `c` has.
async fn a_purge_keeps_what_a_new_sink_is_to_deliver(world: World) {
    world.producer.register_sink("fake", 0, true, now_ms()).await.unwrap();
    let events = world.produce_many(20, Status::Delivered).await;
    let c = world.producer.register_sink("c", 0, false, now_ms()).await.unwrap();
    let purge = || async { outbox_host::ops::purge(world.producer.as_ref(), now_ms() + 1, 1_000).await.unwrap() };
    assert_eq!(purge().await, 0);
    for e in &events {
        assert!(world.producer.get(&e.event_id).await.unwrap().is_some(), "{} kept for c", e.event_id);
    }
    // `c` delivers them (a host's clean stop writes its deliveries): then they go.
    let received = Collector::start().await;
    let config = world
        .setup("", "")
        .with_sinks(vec![sink_entry(&fake_sink_to("c", &received, ""), "start_from: beginning")])
        .parse();
    let mut host = Running::start(config).await;
    host.wait_for("c to receive every event", || async { counts(&received).len() == events.len() }).await;
    host.stop().await;
    assert_each_once(&received, &events, "sink c");
    assert_eq!(purge().await, 20);
    let (_, state) = state_of(&world.producer, &c.name).await;
    assert_eq!(state.stats().await.unwrap().counts.iter().map(|(_, n)| n).sum::<i64>(), 0, "nothing left for c");
}

/// An adopted MySQL table whose `room_id` and `event_id` take 255 characters, and a second
/// sink: events with 200-character room and event ids reach the second sink whole, and its
/// state names them whole (an earlier version's copy cut them to 128 characters).
#[tokio::test]
async fn mysql_a_wide_adopted_table_is_copied_to_another_sink_without_shortening() {
    let Some(db) = crate::support::TestDb::mysql().await else { return };
    let world = World::on(db).await;
    world
        .db
        .execute("ALTER TABLE room_outbox MODIFY room_id VARCHAR(255) NOT NULL, MODIFY event_id VARCHAR(255) NOT NULL")
        .await
        .unwrap();
    let events: Vec<NewEvent> = (0..10)
        .map(|i| {
            let room = format!("{}-{i}", "r".repeat(198));
            world.event_with_id(&format!("{}-{i}", "e".repeat(198)), "RoomGiftSent", &room, Status::Pending)
        })
        .collect();
    let (outbox, b_state) = through_a_second_sink(&world, &events).await;
    for e in &events {
        let state = b_state.get(&e.event_id).await.unwrap().expect("b's state under the whole event id");
        assert_eq!((state.room_id.len(), state.event_id.len(), state.status), (200, 200, Status::Delivered));
        assert_eq!((state.room_id.as_str(), state.envelope.as_slice()), (e.room_id.as_str(), e.envelope.as_slice()));
    }
    outbox.close().await;
}

/// An adopted SQLite table keyed by `rowid`: after a purge, SQLite gives the next event a row
/// id a purged one had, while the second sink still has an earlier event failed. The second
/// sink still gets the new event (its positions and exceptions name events by their
/// creation time and id, and a reused row id is newer).
#[tokio::test]
async fn sqlite_a_reused_rowid_after_a_purge_loses_no_event_for_another_sink() {
    const TABLE: &str = "rowid_outbox";
    let world = World::new().await;
    world
        .db
        .execute(&format!(
            "CREATE TABLE {TABLE} (app_code TEXT NOT NULL DEFAULT '', event_id TEXT PRIMARY KEY, event_type TEXT NOT NULL, \
             room_id TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending', envelope BLOB NOT NULL, \
             created_at_ms INTEGER NOT NULL, retry_count INTEGER NOT NULL DEFAULT 0, last_error TEXT NOT NULL DEFAULT '', \
             worker_id TEXT NOT NULL DEFAULT '', lock_until_ms INTEGER NOT NULL DEFAULT 0, \
             next_retry_at_ms INTEGER NOT NULL DEFAULT 0)"
        ))
        .await
        .unwrap();
    let outbox = outbox_host::store::open(&world.db_url(), 2, TABLE).await.unwrap();
    outbox.migrate().await.unwrap();
    let outbox = outbox_host::store::open(&world.db_url(), 2, TABLE).await.unwrap();
    let b = Collector::start().await;
    let config = world
        .setup("", "")
        .set(&["outbox", "table"], TABLE)
        .with_sinks(vec![sink_entry(&fake_sink_to("b", &b, "room.room-held: permanent"), "start_from: beginning")])
        .parse();
    let mut host = Running::start(config.clone()).await;
    let (_, b_state) = state_of(&outbox, "b").await;
    // The first event (row id 1) fails at b.
    let mut first = vec![world.event("RoomGiftSent", "room-held", Status::Pending)];
    first.extend((0..4).map(|_| world.event("RoomGiftSent", "room-x", Status::Pending)));
    outbox.insert(&first).await.unwrap();
    host.wait_for("the first sink to deliver, and b to receive four and fail one", || async {
        delivered(outbox.as_ref()).await == 5
            && counts(&b).len() == 5
            && b_state.stats().await.unwrap().count(Status::Failed) == 1
    })
    .await;
    // A clean stop writes b's deliveries; the purge then takes the four b delivered.
    host.stop().await;
    let ids: Vec<i64> = {
        let mut ids = Vec::new();
        for e in &first {
            ids.push(outbox.get(&e.event_id).await.unwrap().unwrap().id);
        }
        ids
    };
    assert_eq!(outbox_host::ops::purge(outbox.as_ref(), now_ms() + 1, 1_000).await.unwrap(), 4);
    assert!(outbox.get(&first[0].event_id).await.unwrap().is_some(), "kept: b failed it");
    // The next event takes a row id a purged one had.
    let later = world.event("RoomGiftSent", "room-y", Status::Pending);
    outbox.insert(std::slice::from_ref(&later)).await.unwrap();
    let reused = outbox.get(&later.event_id).await.unwrap().unwrap().id;
    assert!(ids[1..].contains(&reused), "SQLite reused a row id: {reused} of {ids:?}");
    let mut host = Running::start(config).await;
    host.wait_for("both sinks to deliver the later event", || async {
        outbox.get(&later.event_id).await.unwrap().map(|r| r.status) == Some(Status::Delivered)
            && counts(&b).contains_key(&later.event_id)
    })
    .await;
    host.stop().await;
    assert_eq!(counts(&b).get(&later.event_id), Some(&1), "b got the later event");
    outbox.close().await;
}

/// Tencent IM on a plain `http://` endpoint without `sink.allow_http`: the sink declares
/// its endpoint, so `check-config` and `run` refuse the config, naming the sink's key and
/// the host's key to change, before any row is touched.
#[tokio::test]
async fn a_declared_endpoint_the_policy_denies_refuses_the_start() {
    let world = World::new().await;
    let ids: Vec<String> = {
        let mut ids = Vec::new();
        for i in 0..35 {
            ids.push(world.produce("RoomGiftSent", &format!("room-{i}"), Status::Pending).await);
        }
        ids
    };
    let im = outbox_test_support::tencent::TencentIm::start([]).await;
    let mistaken =
        world.setup_with("", &crate::tencent::sink(&im, &im.endpoint())).set(&["sink", "allow_http"], "false");
    crate::binary::write_config(&world, &mistaken.yaml());
    let expected = format!(
        "endpoint: {} cannot be reached: plain http is off for this sink (sink.allow_http)",
        im.endpoint().trim_end_matches('/')
    );
    for command in ["check-config", "run"] {
        let out = crate::binary::run_cli_beside(&world, &[command]).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        assert!(stderr.contains(&expected), "{command}: {stderr}");
    }
    // An address outside `allowed_hosts` is named the same way.
    let webhook = SinkSpec {
        name: "webhook",
        plugin: outbox_test_support::WEBHOOK_SINK,
        allowed_hosts: vec!["hooks.example.com".into()],
        config: "url: \"https://hooks.example.com/in\"\nurl.RoomGiftSent: \"https://gifts.example.com/in\"\nsecret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n".into(),
    };
    crate::binary::write_config(&world, &world.setup_with("", &webhook).yaml());
    let out = crate::binary::run_cli_beside(&world, &["check-config"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("url.RoomGiftSent: https://gifts.example.com/in cannot be reached: gifts.example.com:443 is not in this sink's allowed_hosts"),
        "{stderr}"
    );
    assert!(!stderr.contains("url: https://hooks.example.com/in"), "an allowed URL named: {stderr}");
    for id in &ids {
        let row = world.row(id).await;
        assert_eq!((row.status, row.retry_count), (Status::Pending, 0), "{id} was touched");
    }
    assert!(im.received().is_empty());
}

/// A sink that sends where its policy denies at run time (the fake sink, which declares
/// nothing, reporting over plain `http://` without `sink.allow_http`), 35 events: the sink
/// pauses as misconfigured (readiness says which and why, and so do the page and the
/// metrics), every row stays waiting with no attempt spent, and nothing is `failed`; with
/// the config fixed, a restart delivers them all.
#[tokio::test]
async fn a_config_mistake_at_run_time_pauses_the_sink_and_fails_no_row() {
    use crate::breaker::get;
    use crate::support::metric;
    const EVENTS: usize = 35;
    let world = World::new().await;
    let mistaken = world
        .setup("retry_interval: 50ms", "")
        .set(&["sink", "allow_http"], "false")
        .set(&["sink", "breaker", "cool_down"], "50ms")
        .set(&["sink", "breaker", "max_cool_down"], "100ms")
        .with_admin();
    let events = world.produce_many(EVENTS, Status::Pending).await;
    let mut host = Running::start(mistaken.parse()).await;
    let base = format!("http://{}", host.admin.unwrap());
    let series = "room_outbox_sink_push_backs_total{sink=\"fake\",pressure=\"misconfigured\"}";
    host.wait_for("several attempts to meet the policy", || async { metric(&base, series).await >= 5.0 }).await;
    let (status, body) = get(&format!("{base}/readyz")).await;
    assert_eq!(
        (status, body.as_str()),
        (503, "sink fake is misconfigured: plain http is off for this sink (sink.allow_http)\n")
    );
    let page = get(&format!("{base}/")).await.1;
    assert!(page.contains("Sink fake is misconfigured: plain http is off for this sink (sink.allow_http)"), "{page}");
    host.wait_for("the breaker to show the pause", || async {
        metric(&base, "room_outbox_sink_state{sink=\"fake\"}").await == 3.0
    })
    .await;
    host.stop().await;
    let stats = world.producer.stats().await.unwrap();
    assert_eq!(stats.count(Status::Failed), 0, "{stats:?}");
    assert_eq!(stats.count(Status::Pending) + stats.count(Status::Retryable), EVENTS as i64, "{stats:?}");
    for e in &events {
        let row = world.row(&e.event_id).await;
        assert_eq!(row.retry_count, 0, "{} spent an attempt", e.event_id);
        if row.status == Status::Retryable {
            assert_eq!(
                row.last_error.as_deref(),
                Some("misconfigured: plain http is off for this sink (sink.allow_http)")
            );
        }
    }
    assert!(world.collector.reports().is_empty(), "nothing went out");

    let mut host = Running::start(world.setup("retry_interval: 50ms", "").parse()).await;
    host.wait_for("every event delivered once the config is fixed", || async {
        delivered(world.producer.as_ref()).await == EVENTS as i64
    })
    .await;
    host.stop().await;
    assert_each_once(&world.collector, &events, "the fixed sink");
}

/// A producer's transaction left open on the table while `migrate` must add a column: the
/// `ALTER` waits a second at a time, saying so, instead of queueing every other insert
/// behind it; once the transaction ends, the column is added.
async fn a_schema_change_waits_without_holding_up_inserts(world: World) {
    use sqlx::Connection as _;
    world.as_before_several_sinks().await;
    let url = world.db_url();
    let postgres = url.starts_with("postgres");
    let long_insert = format!(
        "INSERT INTO room_outbox (event_id, event_type, room_id, envelope, created_at_ms) VALUES ('evt-long', 'RoomGiftSent', 'room-1', {}, 1)",
        if postgres { "'\\x00'::bytea" } else { "X'00'" }
    );
    // The long transaction, on a connection of its own.
    let mut pg = None;
    let mut my = None;
    if postgres {
        let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
        sqlx::raw_sql(&format!("BEGIN; {long_insert}")).execute(&mut c).await.unwrap();
        pg = Some(c);
    } else {
        let mut c = sqlx::MySqlConnection::connect(&url).await.unwrap();
        sqlx::raw_sql("BEGIN").execute(&mut c).await.unwrap();
        sqlx::raw_sql(&long_insert).execute(&mut c).await.unwrap();
        my = Some(c);
    }
    let config = crate::binary::write_config(&world, &world.setup("", "").yaml());
    let migrating = tokio::task::spawn_blocking(move || {
        std::process::Command::new(crate::binary::BIN)
            .arg("--config")
            .arg(config)
            .arg("migrate")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    });
    // Let the ALTER start waiting, then insert as another producer would.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let other = world.event("RoomGiftSent", "room-2", Status::Pending);
    tokio::time::timeout(Duration::from_secs(15), world.producer.insert(std::slice::from_ref(&other)))
        .await
        .expect("an insert waited for the whole open transaction: the ALTER queued it")
        .unwrap();
    assert!(!migrating.is_finished(), "migrate finished while the transaction was open");
    if let Some(mut c) = pg {
        sqlx::raw_sql("COMMIT").execute(&mut c).await.unwrap();
    }
    if let Some(mut c) = my {
        sqlx::raw_sql("COMMIT").execute(&mut c).await.unwrap();
    }
    let out = tokio::time::timeout(Duration::from_secs(60), migrating).await.expect("migrate ends").unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("waiting for a lock to change the table's schema"), "{stderr}");
    let columns = world.producer.describe().await.unwrap().unwrap().columns;
    assert!(columns.iter().any(|c| c.name == "fanned_out_at_ms"), "the column was added");
}

/// `replay --dry-run` counts and changes nothing; a replay of more than a thousand events
/// needs `--yes` (no terminal to ask on here); with it, the events go back to `pending` in
/// steps of a thousand.
async fn a_replay_counts_first_and_asks_before_a_large_one(world: World) {
    const EVENTS: usize = 1_001;
    crate::binary::write_config(&world, &world.setup("", "").yaml());
    let out = crate::binary::run_cli_beside(&world, &["migrate"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    world.produce_many(EVENTS, Status::Delivered).await;
    let replay = |extra: &'static [&'static str]| {
        let mut args = vec!["replay", "--sink", "fake", "--from", "1970-01-01"];
        args.extend_from_slice(extra);
        let world = &world;
        async move { crate::binary::run_cli_beside(world, &args).await }
    };
    let out = replay(&["--dry-run"]).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "would replay 1001 event(s) to sink fake (dry run: nothing changed)\n"
    );
    assert_eq!(delivered(world.producer.as_ref()).await, EVENTS as i64);
    let out = replay(&[]).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("nothing replayed (1001 events match; pass --yes to replay them without asking)"),
        "{stderr}"
    );
    assert_eq!(delivered(world.producer.as_ref()).await, EVENTS as i64, "nothing moved");
    let out = replay(&["--yes"]).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "replaying 1001 event(s) to sink fake\n");
    let stats = world.producer.stats().await.unwrap();
    assert_eq!((stats.count(Status::Pending), stats.count(Status::Delivered)), (EVENTS as i64, 0));
}

/// The consumers' index, left invalid by a `CONCURRENTLY` build cut short, is dropped and
/// built again (under the migration lock) by the next `migrate` that registers the sinks.
#[tokio::test]
async fn postgres_an_invalid_consumer_index_is_built_again() {
    let Some(db) = crate::support::TestDb::postgres().await else { return };
    let world = World::on(db).await;
    let spec = SinkSpec { name: "b", plugin: FAKE_SINK, allowed_hosts: vec![], config: String::new() };
    crate::binary::write_config(&world, &world.setup("", "").with_sinks(vec![sink_entry(&spec, "")]).yaml());
    let migrate = || async {
        let out = crate::binary::run_cli_beside(&world, &["migrate"]).await;
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    migrate().await;
    let valid = || crate::support::postgres_index_valid(&world.db.url, "room_outbox_consumer_idx");
    assert!(valid().await, "the second sink's registration built the index");
    world
        .db
        .execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'room_outbox_consumer_idx'::regclass")
        .await
        .unwrap();
    assert!(!valid().await, "the index was not made invalid");
    migrate().await;
    assert!(valid().await, "migrate kept the invalid index");
}

/// A replay to a second sink while a host runs, after a purge that the first sink's failures
/// left nothing to delete: each event comes back to the second sink exactly once more
/// (the events the replay finds settled behind its positions and those its host still
/// remembers alike).
#[tokio::test]
async fn a_replay_after_a_purge_delivers_each_event_once_more() {
    const EVENTS: usize = 5_000;
    let world = World::new().await;
    let b = Collector::start().await;
    // The first sink fails every event: the outbox keeps them all.
    let setup = world
        .setup("concurrency: 16\nbatch_size: 100\nretry_interval: 1h", "default: permanent")
        .with_sinks(vec![sink_entry(&fake_sink_to("b", &b, ""), "start_from: beginning")]);
    crate::binary::write_config(&world, &setup.yaml());
    let mut host = Running::start(setup.parse()).await;
    let events = world.produce_many(EVENTS, Status::Pending).await;
    let (_, b_state) = state_of(&world.producer, "b").await;
    host.wait_for_within("b to deliver every event", Duration::from_secs(120), || async {
        delivered(b_state.as_ref()).await == EVENTS as i64
    })
    .await;
    assert_eq!(outbox_host::ops::purge(world.producer.as_ref(), now_ms() + 1, 1_000).await.unwrap(), 0);
    let out = crate::binary::run_cli_beside(&world, &["replay", "--sink", "b", "--from", "1970-01-01", "--yes"]).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("replaying {EVENTS} event(s) to sink b\n"));
    host.wait_for_within("b to deliver every event again", Duration::from_secs(120), || async {
        delivered(b_state.as_ref()).await == EVENTS as i64
    })
    .await;
    host.stop().await;
    let seen = counts(&b);
    for e in &events {
        assert_eq!(seen.get(&e.event_id), Some(&2), "b got {} twice", e.event_id);
    }
}

/// An adopted MariaDB table whose `event_id` is case-sensitive (`utf8mb4_bin`, as room-service's
/// Go table has it): two events whose ids differ only by case are two events for a second
/// sink too (its table takes the collation; with the host's own, the second was a duplicate
/// of the first there).
#[tokio::test]
async fn mysql_ids_that_differ_by_case_stay_two_events_in_another_sinks_table() {
    let Some(db) = crate::support::TestDb::mysql().await else { return };
    let world = World::on(db).await;
    world
        .db
        .execute(
            "ALTER TABLE room_outbox MODIFY event_id VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL",
        )
        .await
        .unwrap();
    let events: Vec<NewEvent> = ["evt-Case-1", "evt-case-1"]
        .into_iter()
        .map(|id| world.event_with_id(id, "RoomGiftSent", "room-1", Status::Pending))
        .collect();
    let (outbox, _) = through_a_second_sink(&world, &events).await;
    outbox.close().await;
}

/// A host with the world's fake sink and a second one, `b`, from the beginning; `events`
/// inserted through a store of their own, and each delivered by both sinks, `b` once each.
/// Returns that store and `b`'s state.
async fn through_a_second_sink(world: &World, events: &[NewEvent]) -> (Arc<dyn Store>, Arc<dyn Store>) {
    let b = Collector::start().await;
    let config =
        world.setup("", "").with_sinks(vec![sink_entry(&fake_sink_to("b", &b, ""), "start_from: beginning")]).parse();
    let outbox = outbox_host::store::open(&world.db_url(), 2, "room_outbox").await.unwrap();
    let mut host = Running::start(config).await;
    outbox.insert(events).await.unwrap();
    let (_, b_state) = state_of(&outbox, "b").await;
    let n = events.len() as i64;
    host.wait_for("both sinks to deliver every event", || async {
        delivered(outbox.as_ref()).await == n && counts(&b).len() == events.len()
    })
    .await;
    // A clean stop writes what b's host delivered and has not settled yet.
    host.stop().await;
    assert_each_once(&b, events, "sink b");
    assert_eq!(delivered(b_state.as_ref()).await, n);
    (outbox, b_state)
}

/// A `enqueue` on a database without the table, while a transaction elsewhere in the same
/// database holds a snapshot (a busy database, or CI's other tests): the table's indexes,
/// built online after it is made, wait for that transaction past the lock timeout, and the
/// migration is tried again, now finding the table there. The call made the table all the
/// same, so the second sink is registered from its beginning, as when the first try goes
/// through (CI saw it registered from "now" twice before this was kept across tries).
#[tokio::test]
async fn postgres_a_table_made_by_a_migration_tried_again_still_counts_as_made() {
    use sqlx::Connection as _;
    let Some(db) = crate::support::TestDb::postgres().await else { return };
    let world = World::on(db).await;
    for table in ["room_outbox_sinks", "room_outbox_migrations", "room_outbox"] {
        world.db.execute(&format!("DROP TABLE {table}")).await.unwrap();
    }
    let b = Collector::start().await;
    let setup = world.setup("", "").with_sinks(vec![sink_entry(&fake_sink_to("b", &b, ""), "start_from: now")]);
    crate::binary::write_config(&world, &setup.yaml());
    let elsewhere = crate::support::TestDb::postgres().await.expect("the same server");
    let mut open = sqlx::PgConnection::connect(&elsewhere.url).await.unwrap();
    sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").execute(&mut open).await.unwrap();
    let enqueue =
        crate::binary::run_cli_beside(&world, &["enqueue", "-t", "RoomHeatChanged", "-r", "room-1", "-n", "5"]);
    let end_it_later = async {
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        sqlx::raw_sql("COMMIT").execute(&mut open).await.unwrap();
    };
    let (out, ()) = tokio::join!(enqueue, end_it_later);
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{log}");
    assert!(log.contains("waiting for a lock to change the table's schema"), "the migration was tried again: {log}");
    let outbox = outbox_host::store::open(&world.db_url(), 2, "room_outbox").await.unwrap();
    let (b_sink, _) = state_of(&outbox, "b").await;
    assert_eq!(b_sink.start_from_ms, 0, "registered from the table's beginning");
    outbox.close().await;
}
