//! The real `tencent_im_sink.wasm` in the real host against a local server standing in for
//! Tencent Cloud IM: what the server received, and what the table holds afterwards.

use std::time::Duration;

use outbox_host::store::{Row, Status};
use outbox_test_support::TENCENT_IM_SINK;
use outbox_test_support::tencent::{IDENTIFIER, SDK_APP_ID, SECRET_KEY, Script, TencentIm};

use crate::binary::{run_cli, signal, spawn_with, wait_exit, wait_table, write_config};
use crate::support::{Running, SinkSpec, World};

const PREFIX: &str = "live_";

pub(crate) fn sink(im: &TencentIm, endpoint: &str) -> SinkSpec {
    SinkSpec {
        name: "tencent-im",
        plugin: TENCENT_IM_SINK,
        allowed_hosts: vec![im.host_port()],
        config: format!(
            "sdk_app_id: \"{SDK_APP_ID}\"\nidentifier: {IDENTIFIER}\nsecret_key: \"{SECRET_KEY}\"\nendpoint: \"{endpoint}\"\ngroup_id_prefix: {PREFIX}\n"
        ),
    }
}

/// Runs one event per (room, script) through the sink until each reaches `status`;
/// returns the rows in order.
async fn run(cases: &[(&str, Script, &str, Status)], worker: &str) -> (World, TencentIm, Vec<Row>) {
    let world = World::new().await;
    let im =
        TencentIm::start(cases.iter().map(|(room, script, _, _)| (format!("{PREFIX}{room}"), script.clone()))).await;
    let mut ids = Vec::new();
    for (room, _, event_type, _) in cases {
        ids.push(world.produce(event_type, room, Status::Pending).await);
    }
    let mut host =
        Running::start(world.config_with(&format!("retry_interval: 1h\n{worker}"), &sink(&im, &im.endpoint()))).await;
    for (id, (_, _, _, status)) in ids.iter().zip(cases) {
        host.wait_status(&world, &[id], *status).await;
    }
    host.stop().await;
    let mut rows = Vec::new();
    for id in &ids {
        rows.push(world.row(id).await);
    }
    for row in &rows {
        let error = row.last_error.clone().unwrap_or_default();
        assert!(!error.contains(SECRET_KEY) && !error.contains("usersig"), "a secret leaked into last_error: {error}");
    }
    (world, im, rows)
}

#[tokio::test]
async fn a_room_event_reaches_the_rooms_group_signed_and_intact() {
    let (_world, im, rows) = run(&[("room-1", Script::Ok, "RoomGiftSent", Status::Delivered)], "").await;
    let row = &rows[0];
    assert_eq!((row.retry_count, &row.last_error), (0, &None));
    let received = im.received_for(&row.event_id);
    assert_eq!(received.len(), 1);
    let request = &received[0];
    assert!(request.problems.is_empty(), "the server refused the request: {:?}", request.problems);
    assert_eq!(request.body["GroupId"], "live_room-1");
    assert_eq!(request.data["event_type"], "RoomGiftSent");
    assert_eq!(request.data["room_id"], "room-1");
    assert_eq!(request.data["room_version"], 1);
    assert_eq!(request.data["body"]["room_id"], "room-1", "the decoded body travels in Data");
    assert!(!request.body.to_string().contains(SECRET_KEY), "the key was sent in the body");
}

#[tokio::test]
async fn a_retry_reuses_the_same_random_so_tencent_drops_duplicates() {
    let script = Script::Sequence(vec![Script::Code(70500)]);
    let (_world, im, rows) =
        run(&[("room-1", script, "RoomGiftSent", Status::Delivered)], "retry_interval: 50ms").await;
    let received = im.received_for(&rows[0].event_id);
    assert_eq!(received.len(), 2, "one failure, one success");
    assert_eq!(received[0].body["Random"], received[1].body["Random"]);
    assert_eq!(rows[0].retry_count, 1);
    let (_world, im2, other) = run(&[("room-1", Script::Ok, "RoomGiftSent", Status::Delivered)], "").await;
    assert_ne!(im2.received_for(&other[0].event_id)[0].body["Random"], received[0].body["Random"]);
}

#[tokio::test]
async fn frequency_control_drops_are_retried_after_a_pause() {
    let (_world, _im, rows) =
        run(&[("room-1", Script::FreqCtrl, "RoomGiftSent", Status::Retryable)], "retry_interval: 50ms").await;
    let row = &rows[0];
    let error = row.last_error.as_deref().unwrap();
    assert!(error.starts_with("room_throttled: ") && error.contains("MsgFreqCtrl"), "{row:?}");
    assert!(row.next_retry_at_ms - row.updated_at_ms >= 900, "no pause after frequency control: {row:?}");
    assert_eq!(row.retry_count, 0, "the group's limit is not the event's fault: deferred, not counted");
}

#[tokio::test]
async fn rate_limits_internal_errors_and_server_errors_are_retryable() {
    let cases = [
        ("rate", Script::Code(10023), "RoomGiftSent", Status::Retryable),
        ("internal", Script::Code(70500), "RoomUserJoined", Status::Retryable),
        ("timeout", Script::Code(60008), "RoomMicChanged", Status::Retryable),
        ("http", Script::Http(503), "RoomUserLeft", Status::Retryable),
        ("unknown", Script::Code(12345), "RoomGiftSent", Status::Retryable),
    ];
    // All five in the first wave: the push-backs open the sink's breaker, which would hold
    // back an event not yet started.
    let (_world, _im, rows) = run(&cases, "retry_interval: 300ms\nconcurrency: 8").await;
    let errors: Vec<&str> = rows.iter().map(|r| r.last_error.as_deref().unwrap()).collect();
    // The app's rate limit and a server error concern every event: the sink pushes back,
    // and the row is deferred with the pressure named, its attempt not counted.
    assert_eq!(
        errors,
        [
            "throttled: Tencent IM error 10023: scripted error",
            "Tencent IM error 70500: scripted error",
            "Tencent IM error 60008: scripted error",
            "unavailable: HTTP 503 from Tencent IM",
            "Tencent IM error 12345: scripted error",
        ]
    );
    // The wait is computed when the attempt ends and `updated_at_ms` written a moment later.
    assert!(rows[0].next_retry_at_ms - rows[0].updated_at_ms >= 900, "a rate limit is retried without a pause");
    assert!(rows[1].next_retry_at_ms - rows[1].updated_at_ms <= 300, "an internal error waits like a rate limit");
    let counted: Vec<i32> = rows.iter().map(|r| r.retry_count).collect();
    assert_eq!(counted, [0, 1, 1, 0, 1]);
}

#[tokio::test]
async fn invalid_group_permission_parameter_signature_and_content_errors_fail() {
    let cases = [
        ("group", Script::Code(10010), "RoomGiftSent", Status::Failed),
        ("perm", Script::Code(10007), "RoomGiftSent", Status::Failed),
        ("param", Script::Code(10004), "RoomGiftSent", Status::Failed),
        ("sig", Script::Code(70003), "RoomGiftSent", Status::Failed),
        ("content", Script::Code(80001), "RoomGiftSent", Status::Failed),
    ];
    let (_world, _im, rows) = run(&cases, "").await;
    for (row, (_, script, _, _)) in rows.iter().zip(&cases) {
        let Script::Code(code) = script else { unreachable!() };
        assert_eq!(row.last_error.as_deref(), Some(format!("Tencent IM error {code}: scripted error").as_str()));
        assert_eq!(row.retry_count, 1);
    }
}

#[tokio::test]
async fn non_im_event_types_are_skipped_without_a_call() {
    let cases = [
        ("room-1", Script::Ok, "RoomCreated", Status::Delivered),
        ("room-1", Script::Ok, "RoomHeatChanged", Status::Delivered),
        ("room-1", Script::Ok, "RoomRankChanged", Status::Delivered),
        ("room-1", Script::Ok, "RoomUserJoined", Status::Delivered),
    ];
    let (_world, im, rows) = run(&cases, "").await;
    let received = im.received();
    assert_eq!(received.len(), 1, "only the IM event was sent");
    assert_eq!(received[0].data["event_id"], rows[3].event_id.as_str());
}

#[tokio::test]
async fn a_reply_slower_than_publish_timeout_is_retryable() {
    let cases = [("slow", Script::Slow(Duration::from_secs(5)), "RoomGiftSent", Status::Retryable)];
    let (_world, _im, rows) = run(&cases, "publish_timeout: 500ms").await;
    let error = rows[0].last_error.as_deref().unwrap();
    assert!(error.contains("publish_timeout"), "{error}");
}

/// The sink declares its endpoint: one outside `allowed_hosts` refuses the start, naming
/// the key, before any row is touched.
#[tokio::test]
async fn an_endpoint_not_in_allowed_hosts_is_refused_at_start() {
    let world = World::new().await;
    let im = TencentIm::start([]).await;
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let mut spec = sink(&im, "http://127.0.0.2:9");
    spec.allowed_hosts = vec![im.host_port()];
    let refused = outbox_host::app::Host::start(world.config_with("", &spec)).await.err().expect("refused");
    let refused = format!("{refused:#}");
    assert!(
        refused.contains(
            "endpoint: http://127.0.0.2:9 cannot be reached: 127.0.0.2:9 is not in this sink's allowed_hosts"
        ),
        "{refused}"
    );
    let row = world.row(&id).await;
    assert_eq!((row.status, row.retry_count), (Status::Pending, 0));
    assert!(im.received().is_empty());
}

#[tokio::test]
async fn an_unreachable_endpoint_is_retryable() {
    let world = World::new().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let im = TencentIm::start([]).await;
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let mut spec = sink(&im, &format!("http://{closed}"));
    spec.allowed_hosts = vec![closed.to_string()];
    let mut host = Running::start(world.config_with("retry_interval: 1h", &spec)).await;
    host.wait_status(&world, &[&id], Status::Retryable).await;
    host.stop().await;
    let row = world.row(&id).await;
    let error = row.last_error.unwrap();
    assert!(error.starts_with("unavailable: Tencent IM: transport: "), "{error}");
    assert_eq!(row.retry_count, 0, "an unreachable endpoint is the destination's trouble, not the event's");
    assert!(!error.contains("usersig") && !error.contains(SECRET_KEY), "{error}");
}

/// A missing key is named by `check-config` before anything is delivered, and the host
/// refuses to start.
#[tokio::test]
async fn missing_config_keys_are_named_before_anything_is_delivered() {
    let world = World::new().await;
    let im = TencentIm::start([]).await;
    let mut spec = sink(&im, &im.endpoint());
    spec.config = spec.config.lines().filter(|l| !l.starts_with("secret_key")).map(|l| format!("{l}\n")).collect();
    spec.config.push_str("msg_priority: Urgent\n");
    write_config(&world, &world.yaml_with("", &spec));
    let out = run_cli(&world, &["check-config"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("sink.config.secret_key: is required"), "{stderr}");
    assert!(stderr.contains("sink.config.msg_priority: \"Urgent\" is not one of High, Normal, Low, Lossy"), "{stderr}");
}

/// Run by the real binary with debug logs: neither the key nor a UserSig the server
/// received appears anywhere in the log, whatever went wrong.
#[tokio::test]
async fn the_log_never_shows_the_key_or_a_usersig() {
    let world = World::new().await;
    let im = TencentIm::start([
        (format!("{PREFIX}sig"), Script::Code(70003)),
        (format!("{PREFIX}unknown"), Script::Code(12345)),
        (format!("{PREFIX}http"), Script::Http(502)),
    ])
    .await;
    let mut ids = Vec::new();
    for room in ["ok", "sig", "unknown", "http"] {
        ids.push(world.produce("RoomGiftSent", room, Status::Pending).await);
    }
    let yaml = world.yaml_with("retry_interval: 1h", &sink(&im, &im.endpoint()));
    let child = spawn_with(&world, &yaml, &[("RUST_LOG", "debug")]);
    wait_table(&world, "every outcome", |s| {
        s.count(Status::Delivered) + s.count(Status::Retryable) + s.count(Status::Failed) == 4
    })
    .await;
    signal(&child, "TERM");
    let output = wait_exit(child).await;
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(log.contains("unknown Tencent IM error, retrying"), "the sink's own log line is missing:\n{log}");
    let usersigs: Vec<String> = im.received().iter().map(|r| r.query["usersig"].clone()).collect();
    assert_eq!(usersigs.len(), 4);
    assert!(!log.contains(SECRET_KEY), "the key is in the log");
    for usersig in &usersigs {
        assert!(!log.contains(usersig.as_str()), "a UserSig is in the log");
    }
    assert!(!log.contains("usersig="), "a request URL with its query is in the log");
}
