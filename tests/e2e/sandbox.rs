//! What the sandbox does with a misbehaving sink or a bad row: that one attempt fails (or the
//! row is failed), and the host goes on delivering the rest of the batch.

use outbox_host::store::Status;

use crate::support::{Running, World};

/// Runs one event whose room scripts `behaviour` beside a healthy event in another room,
/// in one batch; returns the faulty row's `last_error` once it is `expect`.
async fn fault(behaviour: &str, worker: &str, expect: Status) -> String {
    let world = World::new().await;
    let bad = world.produce("RoomGiftSent", "room-bad", Status::Pending).await;
    let good = world.produce("RoomGiftSent", "room-good", Status::Pending).await;
    let worker = format!("retry_interval: 1h\n{worker}");
    let mut host = Running::start(world.config(&worker, &format!("room.room-bad: \"{behaviour}\""))).await;
    host.wait_status(&world, &[&good], Status::Delivered).await;
    host.wait_status(&world, &[&bad], expect).await;
    host.stop().await;
    let row = world.row(&bad).await;
    assert_eq!(row.retry_count, 1, "one failed attempt counted");
    row.last_error.expect("last_error is set")
}

#[tokio::test]
async fn a_trapping_sink_fails_the_attempt_as_retryable() {
    let error = fault("trap", "", Status::Retryable).await;
    assert!(error.starts_with("sink trapped"), "{error}");
}

#[tokio::test]
async fn an_endless_loop_is_interrupted_at_publish_timeout() {
    let error = fault("loop", "publish_timeout: 500ms", Status::Retryable).await;
    assert_eq!(error, "sink did not finish within publish_timeout 500ms");
}

#[tokio::test]
async fn a_memory_bomb_hits_the_cap_and_fails_as_retryable() {
    let error = fault("oom", "", Status::Retryable).await;
    assert!(error.contains("memory limit of 16 MiB") || error.starts_with("sink trapped"), "{error}");
}

#[tokio::test]
async fn a_sink_sleeping_past_publish_timeout_fails_as_retryable() {
    let error = fault("sleep:5000", "publish_timeout: 300ms", Status::Retryable).await;
    assert_eq!(error, "sink did not finish within publish_timeout 300ms");
}

#[tokio::test]
async fn a_permanent_failure_is_failed_at_once() {
    let error = fault("permanent", "", Status::Failed).await;
    assert_eq!(error, "fake: scripted permanent failure");
}

#[tokio::test]
async fn attempts_exhausted_become_failed() {
    let error = fault("retryable", "max_attempts: 1", Status::Failed).await;
    assert_eq!(error, "gave up after 1 attempts: fake: scripted retryable failure");
}

/// A request outside `allowed_hosts` is refused; the attempt is a config mistake, not the
/// event's: deferred without spending an attempt, with the policy's reason, while the
/// healthy event in the same batch is delivered.
#[tokio::test]
async fn a_request_to_a_host_not_allowed_is_refused_and_the_row_deferred() {
    let world = World::new().await;
    let bad = world.produce("RoomGiftSent", "room-bad", Status::Pending).await;
    let good = world.produce("RoomGiftSent", "room-good", Status::Pending).await;
    let config = world.config("retry_interval: 1h", "room.room-bad: \"http:http://127.0.0.1:9/forbidden\"");
    let mut host = Running::start(config).await;
    host.wait_status(&world, &[&good], Status::Delivered).await;
    host.wait_status(&world, &[&bad], Status::Retryable).await;
    host.stop().await;
    let row = world.row(&bad).await;
    assert_eq!(row.retry_count, 0, "no attempt spent");
    assert_eq!(row.last_error.as_deref(), Some("misconfigured: 127.0.0.1:9 is not in this sink's allowed_hosts"));
}

#[tokio::test]
async fn a_request_to_an_allowed_host_goes_through() {
    let world = World::new().await;
    let id = world.produce("RoomGiftSent", "room-http", Status::Pending).await;
    let behaviour = format!("room.room-http: \"http:{}\"", world.collector.url("/ok"));
    let mut host = Running::start(world.config("", &behaviour)).await;
    host.wait_status(&world, &[&id], Status::Delivered).await;
    host.stop().await;
}

#[tokio::test]
async fn retry_after_pushes_the_next_attempt_out() {
    let world = World::new().await;
    let id = world.produce("RoomGiftSent", "room-wait", Status::Pending).await;
    let mut host = Running::start(world.config("retry_interval: 1s", "room.room-wait: retry-after:600000")).await;
    host.wait_status(&world, &[&id], Status::Retryable).await;
    host.stop().await;
    let row = world.row(&id).await;
    let wait = row.next_retry_at_ms - row.updated_at_ms;
    assert!((599_000..=600_000).contains(&wait), "next retry in {wait} ms, wanted the sink's 600000");
}

/// An envelope that does not decode can never be delivered: `failed` with the reason,
/// without calling the sink, and the rest of the batch goes on.
#[tokio::test]
async fn a_bad_envelope_is_failed_and_the_batch_goes_on() {
    let world = World::new().await;
    world.insert("evt-garbage", "RoomGiftSent", "room-1", Status::Pending, vec![0xff, 0xff, 0xff]).await;
    let mismatched = outbox_host::envelope::encode("app-1", "evt-other", "RoomGiftSent", "room-1", 1, 0, vec![]);
    world.insert("evt-mismatch", "RoomGiftSent", "room-1", Status::Pending, mismatched).await;
    let good = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let mut host = Running::start(world.config("", "")).await;
    host.wait_status(&world, &["evt-garbage", "evt-mismatch"], Status::Failed).await;
    host.wait_status(&world, &[&good], Status::Delivered).await;
    host.stop().await;

    let garbage = world.row("evt-garbage").await.last_error.unwrap();
    assert!(garbage.starts_with("bad envelope: not a protobuf EventEnvelope"), "{garbage}");
    let mismatch = world.row("evt-mismatch").await.last_error.unwrap();
    assert!(mismatch.contains("\"evt-other\" differs from the row's \"evt-mismatch\""), "{mismatch}");
    assert!(world.collector.attempts_of("evt-garbage").is_empty(), "the sink was called with a bad envelope");
}

/// Within a batch, one room's events reach the sink one after another in creation order,
/// while other rooms proceed in parallel.
#[tokio::test]
async fn events_of_one_room_are_delivered_in_creation_order() {
    let world = World::new().await;
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(world.produce("RoomGiftSent", "room-ordered", Status::Pending).await);
        world.produce("RoomUserJoined", &format!("room-other-{i}"), Status::Pending).await;
    }
    let mut host = Running::start(world.config("batch_size: 16", "")).await;
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    host.wait_status(&world, &refs, Status::Delivered).await;
    host.stop().await;
    let seen: Vec<String> =
        world.collector.reports().into_iter().map(|r| r.event_id).filter(|id| ids.contains(id)).collect();
    assert_eq!(seen, ids);
}

/// The compiled component is cached on disk; a restart loads it instead of compiling, and
/// a corrupt cache entry is recompiled rather than trusted.
#[tokio::test]
async fn the_compiled_sink_is_cached_and_a_corrupt_entry_is_replaced() {
    let world = World::new().await;
    let cache = world.dir.path().join("cache");
    let config = world.setup("", "").set(&["sink", "cache_dir"], &cache.display().to_string()).parse();
    let sink = config.sinks[0].clone();
    let cached = || cwasm_files(&cache);

    outbox_host::sandbox::SinkRuntime::load(&sink.sandbox, 4).unwrap();
    let files = cached();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(files[0].extension().unwrap(), "cwasm");
    let written = std::fs::metadata(&files[0]).unwrap().modified().unwrap();

    outbox_host::sandbox::SinkRuntime::load(&sink.sandbox, 4).unwrap();
    assert_eq!(std::fs::metadata(&files[0]).unwrap().modified().unwrap(), written, "recompiled despite the cache");

    std::fs::write(&files[0], b"not a compiled component").unwrap();
    let runtime = outbox_host::sandbox::SinkRuntime::load(&sink.sandbox, 4).unwrap();
    assert!(std::fs::metadata(&files[0]).unwrap().len() > 1_000, "the corrupt entry was not replaced");
    let event = sample_event();
    let delivered = runtime.deliver(&event, std::time::Duration::from_secs(2)).await;
    assert_eq!(delivered, Ok(outbox_host::sandbox::Delivered::Delivered));
}

fn cwasm_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "cwasm")).collect())
        .unwrap_or_default()
}

/// A compiled entry planted in the cache (here: another sink's valid native code, under
/// this sink's name) is never run: its tag does not verify, so the sink is compiled again,
/// and what delivers is the configured sink.
#[tokio::test]
async fn a_planted_cache_entry_is_not_run() {
    use outbox_host::sandbox::{Delivered, SinkRuntime};

    let world = World::new().await;
    let config = |plugin: &str, cache: &std::path::Path| {
        world
            .setup("", "default: skip")
            .set(&["sink", "plugin"], plugin)
            .set(&["sink", "cache_dir"], &cache.display().to_string())
    };
    let ours = world.dir.path().join("ours");
    let theirs = world.dir.path().join("theirs");
    let sink_of = |plugin: &str, cache: &std::path::Path| config(plugin, cache).parse().sinks.remove(0);
    SinkRuntime::load(&sink_of(outbox_test_support::FAKE_SINK, &ours).sandbox, 4).unwrap();
    SinkRuntime::load(&sink_of(outbox_test_support::TENCENT_IM_SINK, &theirs).sandbox, 4).unwrap();
    let (entry, planted) = (cwasm_files(&ours).remove(0), cwasm_files(&theirs).remove(0));
    std::fs::copy(&planted, &entry).unwrap();
    let planted_bytes = std::fs::read(&entry).unwrap();

    let runtime = SinkRuntime::load(&sink_of(outbox_test_support::FAKE_SINK, &ours).sandbox, 4).unwrap();
    assert_ne!(std::fs::read(&entry).unwrap(), planted_bytes, "the planted entry was kept");
    let event = sample_event();
    let outcome = runtime.deliver(&event, std::time::Duration::from_secs(2)).await;
    assert_eq!(
        outcome,
        Ok(Delivered::Skipped("fake sink does not carry RoomGiftSent".into())),
        "another sink's code ran"
    );
}

/// Every delivery starts from the sink's initial memory, whatever the pool reuses: a
/// counter in the guest's data segment and a list on its heap never see a previous
/// delivery, over more deliveries than the pool has slots.
#[tokio::test]
async fn no_state_crosses_deliveries() {
    use outbox_host::sandbox::{Delivered, SinkRuntime};

    let world = World::new().await;
    let sink = world.setup("", "default: remember").parse().sinks.remove(0);
    let runtime = SinkRuntime::load(&sink.sandbox, 1).unwrap();
    let event = sample_event();
    for _ in 0..50 {
        let outcome = runtime.deliver(&event, std::time::Duration::from_secs(2)).await;
        assert_eq!(outcome, Ok(Delivered::Skipped("seen 1, heap 1".into())), "state crossed deliveries");
    }
}

/// A cache directory other users can write is refused at start, naming the key.
#[tokio::test]
async fn a_cache_directory_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let world = World::new().await;
    let open = world.dir.path().join("open-cache");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let sink = world.setup("", "").set(&["sink", "cache_dir"], &open.display().to_string()).parse().sinks.remove(0);
    let err = outbox_host::sandbox::SinkRuntime::load(&sink.sandbox, 4)
        .err()
        .expect("an open cache directory is refused")
        .to_string();
    assert!(err.starts_with("sink.cache_dir:") && err.contains("writable by other users"), "{err}");
    assert!(cwasm_files(&open).is_empty(), "something was written into it");
}

/// A sink built for `outbox:sink@0.1.0` (before `flow` and `egress` existed) loads in this 0.1.3 host
/// and delivers; its failures are counted as before.
#[tokio::test]
async fn a_sink_built_for_0_1_0_still_loads_and_delivers() {
    let world = World::new().await;
    let ok = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let config = world.setup("retry_interval: 1h", "").set(&["sink", "plugin"], outbox_test_support::SINK_0_1_0);
    let mut host = Running::start(config.parse()).await;
    host.wait_status(&world, &[&ok], Status::Delivered).await;
    host.stop().await;

    let failing = world.produce("RoomGiftSent", "room-2", Status::Pending).await;
    let config = world
        .setup("retry_interval: 1h", "default: retryable")
        .set(&["sink", "plugin"], outbox_test_support::SINK_0_1_0);
    let mut host = Running::start(config.parse()).await;
    host.wait_status(&world, &[&failing], Status::Retryable).await;
    host.stop().await;
    let row = world.row(&failing).await;
    assert_eq!((row.retry_count, row.last_error.as_deref()), (1, Some("0.1.0 sink: retryable")));
}

/// A sink built for a contract version this host does not offer (0.2.0) is refused before
/// anything runs, by `check-config` and at load, naming its version and the host's.
#[tokio::test]
async fn a_sink_built_for_another_contract_is_refused_naming_both_versions() {
    let world = World::new().await;
    let config = world.setup("", "").set(&["sink", "plugin"], outbox_test_support::SINK_0_2_0);
    let expected = "was built for outbox:sink@0.2.0, a contract this host does not speak: build the sink against \
                    this host's wit/sink.wit; this host offers outbox:sink@0.1.0 to 0.1.3";
    let err =
        outbox_host::sandbox::SinkRuntime::load(&config.parse().sinks.remove(0).sandbox, 1).err().unwrap().to_string();
    assert!(err.starts_with("sink.plugin: ") && err.contains(expected), "{err}");

    crate::binary::write_config(&world, &config.yaml());
    let out = crate::binary::run_cli(&world, &["check-config"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "check-config passed a 0.2.0 sink");
    assert!(stderr.contains(expected), "{stderr}");
}

/// `flow.push-back` rides on a retryable failure as its pressure, and is ignored with any
/// other result.
#[tokio::test]
async fn a_push_back_marks_a_retryable_failure_and_nothing_else() {
    use outbox_host::sandbox::{Delivered, FailureClass, Pressure, SinkRuntime};

    let world = World::new().await;
    let runtime = |behaviour: &str| {
        let sink = world.setup("", &format!("default: \"{behaviour}\"")).parse().sinks.remove(0);
        SinkRuntime::load(&sink.sandbox, 1).unwrap()
    };
    let timeout = std::time::Duration::from_secs(2);
    for (name, pressure) in [
        ("room-throttled", Pressure::RoomThrottled),
        ("throttled", Pressure::Throttled),
        ("unavailable", Pressure::Unavailable),
    ] {
        let failure = runtime(&format!("push-back:{name}:1500")).deliver(&sample_event(), timeout).await.unwrap_err();
        assert_eq!(failure.class, FailureClass::Retryable);
        assert_eq!(failure.pressure, Some(pressure), "{name}");
        assert_eq!(failure.retry_after, Some(std::time::Duration::from_millis(1_500)));
    }
    let delivered = runtime("push-back-delivered:throttled").deliver(&sample_event(), timeout).await;
    assert_eq!(delivered, Ok(Delivered::Delivered), "a push-back with a success means nothing");
    let plain = runtime("retryable").deliver(&sample_event(), timeout).await.unwrap_err();
    assert_eq!(plain.pressure, None);
}

/// A room-throttled event is deferred: `retryable` with its attempt not counted, the
/// pressure named in `last_error`, due again after the sink's hint; other rooms go on.
#[tokio::test]
async fn a_room_throttled_event_is_deferred_without_counting_the_attempt() {
    let world = World::new().await;
    let hot = world.produce("RoomGiftSent", "room-hot", Status::Pending).await;
    let other = world.produce("RoomGiftSent", "room-other", Status::Pending).await;
    let config = world.setup("retry_interval: 1h", "room.room-hot: \"push-back:room-throttled:60000\"");
    let mut host = Running::start(config.parse()).await;
    host.wait_status(&world, &[&other], Status::Delivered).await;
    host.wait_status(&world, &[&hot], Status::Retryable).await;
    host.stop().await;
    let row = world.row(&hot).await;
    assert_eq!(row.retry_count, 0, "a deferral is not a failure of the event: {row:?}");
    assert_eq!(row.last_error.as_deref(), Some("room_throttled: fake: pushed back (room-throttled)"));
    let wait = row.next_retry_at_ms - row.updated_at_ms;
    assert!((59_000..=60_000).contains(&wait), "due again after the sink's hint, not retry_interval: {wait} ms");
}

/// An event as the sandbox receives it, for calling a runtime directly.
fn sample_event() -> outbox_host::sandbox::Event {
    outbox_host::sandbox::Event {
        app_code: "a".into(),
        event_id: "evt-1".into(),
        event_type: "RoomGiftSent".into(),
        room_id: "room-1".into(),
        room_version: 1,
        occurred_at_ms: 0,
        body: vec![],
        attempt: 1,
    }
}
