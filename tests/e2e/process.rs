//! The real `outbox-host` binary: signals, exit codes and what the operator reads.

use std::time::Duration;

use outbox_host::store::Status;

use crate::binary::{run_cli, signal, spawn, spawn_host, wait_exit, wait_table, write_config};
use crate::support::World;

/// SIGTERM: stop claiming, finish and record the in-flight delivery, hand back the rest,
/// exit 0 with nothing left `delivering`.
#[tokio::test]
async fn sigterm_drains_and_exits_zero_with_nothing_delivering() {
    let world = World::new().await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(world.produce("RoomGiftSent", "room-slow", Status::Pending).await);
    }
    // Without room order, all six are claimed at once and five wait in the buffer behind
    // the slow first one: what shutdown must hand back.
    let child = spawn_host(&world, &world.yaml("ordering: none", "room.room-slow: sleep:400"));
    wait_table(&world, "the first delivery", |s| s.count(Status::Delivered) >= 1).await;
    signal(&child, "TERM");
    let output = wait_exit(child).await;
    let log = String::from_utf8_lossy(&output.stderr);

    assert_eq!(output.status.code(), Some(0), "log:\n{log}");
    world.assert_handed_back(&ids, 6, 1).await;
    assert!(log.contains("handed back claimed rows that were not started"), "log:\n{log}");
    assert!(log.contains("worker stopped"), "log:\n{log}");
}

/// A second signal exits at once; the in-flight row's room stays with the host's partition
/// lease, to expire later (the row itself was never claimed: still `pending`, unattempted).
#[tokio::test]
async fn a_second_signal_exits_at_once() {
    let world = World::new().await;
    let id = world.produce("RoomGiftSent", "room-stuck", Status::Pending).await;
    let child = spawn_host(&world, &world.yaml("publish_timeout: 20s", "room.room-stuck: sleep:15000"));
    wait_attempt(&world, &id).await;
    signal(&child, "TERM");
    tokio::time::sleep(Duration::from_millis(200)).await;
    signal(&child, "INT");
    let output = wait_exit(child).await;
    assert_eq!(output.status.code(), Some(130));
    let row = world.row(&id).await;
    assert_eq!((row.status, row.retry_count), (Status::Pending, 0));
    let now = outbox_host::store::now_ms();
    let owners = world.producer.partition_owners(now).await.unwrap();
    assert_eq!(owners.len(), 1, "the host's partition leases are still held: {owners:?}");
    assert_eq!(owners[0].partitions.len(), 64);
}

/// Waits until the sink has received `id`.
async fn wait_attempt(world: &World, id: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while world.collector.attempts_of(id).is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the delivery never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn check_config_names_every_bad_key() {
    let world = World::new().await;
    write_config(&world, "outbox_worker:\n  retry_strategy: fibonacci\n  batch_sise: 5\nsink:\n  name: x\n");
    let output = run_cli(&world, &["check-config"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for key in ["outbox_worker.retry_strategy:", "outbox_worker.batch_sise: unknown key", "sink.plugin: is required"] {
        assert!(stderr.contains(key), "{key} missing from:\n{stderr}");
    }
}

#[tokio::test]
async fn check_config_loads_the_plugin_and_explains_a_wrong_one() {
    let world = World::new().await;
    write_config(&world, &world.yaml("", ""));
    let ok = run_cli(&world, &["check-config"]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("config OK: sink fake loads"));
    write_config(&world, &world.yaml("claim_growth: 3", ""));
    let grown = run_cli(&world, &["check-config"]);
    let stdout = String::from_utf8_lossy(&grown.stdout);
    assert!(stdout.contains("batch_size 10 (up to 30 behind a backlog)"), "{stdout}");

    let core_module = world.dir.path().join("core.wasm");
    std::fs::write(&core_module, b"\0asm\x01\0\0\0").unwrap();
    write_config(&world, &world.setup("", "").set(&["sink", "plugin"], core_module.to_str().unwrap()).yaml());
    let bad = run_cli(&world, &["check-config"]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(stderr.contains("not a component: build the sink for wasm32-wasip2"), "{stderr}");
}

/// `enqueue` writes what a producer writes; `status` reads it back.
#[tokio::test]
async fn enqueue_and_status_round_trip() {
    let world = World::new().await;
    write_config(&world, &world.yaml("", ""));
    let run = |args: &[&str]| run_cli(&world, args);
    let out = run(&[
        "enqueue",
        "-t",
        "RoomGiftSent",
        "-r",
        "room-9",
        "-b",
        r#"{"gift_id":"rose","gift_count":3}"#,
        "-n",
        "3",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&["enqueue", "-t", "RoomGiftSent", "-r", "room-9", "-b", r#"{"gift":"rose"}"#]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--body does not fit RoomGiftSent"));

    let stats = world.producer.stats().await.unwrap();
    assert_eq!(stats.count(Status::Pending), 3);
    let status = String::from_utf8_lossy(&run(&["status"]).stdout).into_owned();
    // `enqueue` registered the configured sink, as `migrate` would.
    assert!(status.contains("room_outbox (sink fake): 3 rows"), "{status}");
    assert!(status.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["pending", "3"]), "{status}");
}

/// A database that cannot be reached at start-up is a clear error naming the host, never
/// the password.
#[tokio::test]
async fn an_unreachable_database_is_named_without_its_password() {
    let world = World::new().await;
    let unreachable = "postgres://app:hunter2@127.0.0.1:1/outbox";
    write_config(&world, &world.setup("", "").set(&["database", "url"], unreachable).yaml());
    let out = run_cli(&world, &["migrate"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("cannot connect to postgres://app:***@127.0.0.1:1/outbox"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

/// `--json-logs`: one JSON object per line, each outcome with the seed's fields.
#[tokio::test]
async fn json_logs_carry_the_seed_fields() {
    let world = World::new().await;
    let ok = world.produce("RoomGiftSent", "room-ok", Status::Pending).await;
    let bad = world.produce("RoomGiftSent", "room-bad", Status::Pending).await;
    let yaml = world.yaml("retry_interval: 1h", "room.room-bad: retryable\nroom.room-ok: log");
    let child = spawn(&world, &yaml, &["--json-logs"], &[]);
    wait_table(&world, "both outcomes", |s| s.count(Status::Delivered) == 1 && s.count(Status::Retryable) == 1).await;
    signal(&child, "TERM");
    let output = wait_exit(child).await;
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stderr)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let outcome = |id: &str| {
        lines
            .iter()
            .find(|l| l["event_id"] == id && l.get("status").is_some())
            .cloned()
            .unwrap_or_else(|| panic!("no outcome line for {id}"))
    };
    let delivered = outcome(&ok);
    for (field, value) in [
        ("worker", "room_outbox"),
        ("node_id", "test-node"),
        ("event_type", "RoomGiftSent"),
        ("room_id", "room-ok"),
        ("status", "delivered"),
    ] {
        assert_eq!(delivered[field], value, "{field} in {delivered}");
    }
    assert_eq!(delivered["retry_count"], 0);
    let failed = outcome(&bad);
    assert_eq!((failed["status"].as_str(), failed["retry_count"].as_i64()), (Some("retryable"), Some(0)), "{failed}");
    assert_eq!(failed["attempt"], 1, "{failed}");
    assert_eq!(failed["error"], "fake: scripted retryable failure");
    assert_eq!(failed["kind"], "retryable");

    // The sink's own line carries the delivery's fields too.
    let said = lines
        .iter()
        .find(|l| l["message"].as_str().is_some_and(|m| m.starts_with("fake sink got")))
        .expect("the sink's log line");
    assert_eq!((said["event_id"].as_str(), said["room_id"].as_str()), (Some(ok.as_str()), Some("room-ok")), "{said}");
    assert_eq!((said["sink"].as_str(), said["node_id"].as_str()), (Some("fake"), Some("test-node")), "{said}");
}

/// Text logs: each field once per line (the delivery's fields come from its span), and no
/// colour codes when stderr is not a terminal.
#[tokio::test]
async fn text_logs_name_each_field_once_and_have_no_colour_on_a_pipe() {
    let world = World::new().await;
    let ok = world.produce("RoomGiftSent", "room-ok", Status::Pending).await;
    let child = spawn_host(&world, &world.yaml("", "room.room-ok: log"));
    wait_table(&world, "the delivery", |s| s.count(Status::Delivered) == 1).await;
    signal(&child, "TERM");
    let log = String::from_utf8(wait_exit(child).await.stderr).unwrap();
    assert!(!log.contains('\u{1b}'), "colour codes on a pipe:\n{log}");
    for message in ["event delivered", "fake sink got RoomGiftSent"] {
        let line = log.lines().find(|l| l.contains(message)).unwrap_or_else(|| panic!("no {message:?} line:\n{log}"));
        assert_eq!(line.matches("event_id=").count(), 1, "{line}");
        assert!(line.contains(&format!("event_id={ok}")) && line.contains("room_id=room-ok"), "{line}");
        assert!(line.contains("retry_count=0") && line.contains("node_id=test-node"), "{line}");
    }
}

/// The sink checks its own config map; problems it reports refuse `check-config` and `run`.
#[tokio::test]
async fn sink_config_problems_refuse_to_start() {
    let world = World::new().await;
    write_config(&world, &world.yaml("", "default: bogus"));
    for command in ["check-config", "run"] {
        let out = run_cli(&world, &[command]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        assert!(stderr.contains("sink.config.default: unknown behaviour \"bogus\""), "{command}: {stderr}");
    }
}

/// SIGTERM while the database is unreachable: the in-flight delivery finishes, its outcome
/// cannot be written, and after `shutdown_grace` the host names the event, leaves the row to
/// its lease and exits non-zero, instead of waiting for the database forever.
async fn sigterm_during_a_database_outage_is_bounded(db: crate::support::TestDb) {
    let proxy = outbox_test_support::proxy::TcpProxy::in_front_of(&db.url, false).await;
    let world = World::on(db).await;
    let id = world.produce("RoomGiftSent", "room-slow", Status::Pending).await;
    let proxied = proxy.url_through(&world.db_url());
    let config = world
        .setup("publish_timeout: 5s\nshutdown_grace: 1s", "room.room-slow: sleep:1500")
        .set(&["database", "url"], &proxied);
    let child = spawn_host(&world, &config.yaml());
    // Cut only once the sink has the event, so the delivery is really in flight.
    wait_attempt(&world, &id).await;
    proxy.cut();
    signal(&child, "TERM");
    let output = crate::binary::wait_exit_within(child, Duration::from_secs(20)).await;
    let log = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "log:\n{log}");
    assert!(log.contains("shutdown grace ran out with outcomes unwritten"), "log:\n{log}");
    assert!(log.contains(&id), "the unwritten event is not named:\n{log}");
    let row = world.row(&id).await;
    assert_eq!((row.status, row.retry_count), (Status::Pending, 0), "left to the partition's next owner");
    assert_eq!(world.collector.attempts_of(&id).len(), 1, "the delivery itself ran");
}

#[tokio::test]
async fn sigterm_during_a_postgres_outage_is_bounded() {
    let Some(db) = crate::support::TestDb::postgres().await else { return };
    sigterm_during_a_database_outage_is_bounded(db).await;
}

#[tokio::test]
async fn sigterm_during_a_mysql_outage_is_bounded() {
    let Some(db) = crate::support::TestDb::mysql().await else { return };
    sigterm_during_a_database_outage_is_bounded(db).await;
}

/// `run` on a database out of reach (starting, or away) waits for it instead of exiting,
/// saying so at each miss, and delivers once it answers; a SIGTERM while it waits exits 0 at
/// once with nothing touched.
async fn a_host_started_during_a_database_outage_waits_for_it(db: crate::support::TestDb) {
    let proxy = outbox_test_support::proxy::TcpProxy::in_front_of(&db.url, true).await;
    let world = World::on(db).await;
    let id = world.produce("RoomGiftSent", "room-late", Status::Pending).await;
    let proxied = proxy.url_through(&world.db_url());
    let yaml = world.setup("", "").set(&["database", "url"], &proxied).yaml();

    // Stopped while it waits.
    let (child, log) = spawn_logging(&world, &yaml, "waiting.log");
    wait_log(&log, "the database cannot be reached at start-up; waiting for it").await;
    signal(&child, "TERM");
    let output = crate::binary::wait_exit_within(child, Duration::from_secs(10)).await;
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(output.status.code(), Some(0), "log:\n{said}");
    assert!(proxy.turned_away() >= 1);
    assert_eq!(world.row(&id).await.status, Status::Pending);

    // Left waiting until the database is back.
    let (mut child, log) = spawn_logging(&world, &yaml, "resumed.log");
    wait_log(&log, "waiting for it").await;
    assert!(child.try_wait().unwrap().is_none(), "the host exited instead of waiting");
    proxy.restore();
    wait_table(&world, "the event delivered", |s| s.count(Status::Delivered) == 1).await;
    signal(&child, "TERM");
    let output = wait_exit(child).await;
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(output.status.code(), Some(0), "log:\n{said}");
    let miss = said.lines().find(|l| l.contains("waiting for it")).unwrap();
    assert!(miss.contains("cannot connect to") && miss.contains(&proxy.addr().to_string()), "{miss}");
    assert_eq!(world.collector.attempts_of(&id).len(), 1);
}

#[tokio::test]
async fn a_host_started_during_a_postgres_outage_waits_for_it() {
    let Some(db) = crate::support::TestDb::postgres().await else { return };
    a_host_started_during_a_database_outage_waits_for_it(db).await;
}

#[tokio::test]
async fn a_host_started_during_a_mysql_outage_waits_for_it() {
    let Some(db) = crate::support::TestDb::mysql().await else { return };
    a_host_started_during_a_database_outage_waits_for_it(db).await;
}

/// `outbox-host --config <yaml> run` with its log written to `name` in the world's folder,
/// so that a test reads it while the host runs.
fn spawn_logging(world: &World, yaml: &str, name: &str) -> (crate::binary::HostProcess, std::path::PathBuf) {
    let config = write_config(world, yaml);
    let log = world.dir.path().join(name);
    let child = std::process::Command::new(crate::binary::BIN)
        .args(["--config", config.to_str().unwrap(), "run"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("starting outbox-host");
    (crate::binary::HostProcess::new(child), log)
}

/// Waits until the log at `path` says `line`.
async fn wait_log(path: &std::path::Path, line: &str) {
    let deadline = tokio::time::Instant::now() + crate::support::PATIENCE;
    while !std::fs::read_to_string(path).unwrap_or_default().contains(line) {
        assert!(tokio::time::Instant::now() < deadline, "the log never said {line:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A database server that answers and refuses (here: no such database) is a mistake to
/// fix, not an outage to wait out: `run` exits at once, naming it.
#[tokio::test]
async fn a_database_that_refuses_the_connection_fails_run_at_once() {
    let Some(db) = crate::support::TestDb::postgres().await else { return };
    let world = World::on(db).await;
    let url = reqwest::Url::parse(&world.db_url()).unwrap();
    let missing =
        format!("postgres://postgres@{}:{}/outbox_no_such_database", url.host_str().unwrap(), url.port().unwrap());
    let child = spawn_host(&world, &world.setup("", "").set(&["database", "url"], &missing).yaml());
    let output = crate::binary::wait_exit_within(child, Duration::from_secs(20)).await;
    let log = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "log:\n{log}");
    assert!(log.contains("outbox_no_such_database") && log.contains("does not exist"), "log:\n{log}");
    assert!(!log.contains("waiting for it"), "log:\n{log}");
}
