//! A hostile sink, a closed log pipe, a host panic: each costs at most one attempt, is
//! bounded, escaped and counted, and the host goes on delivering.

use std::io::Read as _;
use std::sync::Arc;
use std::time::Duration;

use outbox_host::engine::Worker;
use outbox_host::ops::metrics::Metrics;
use outbox_host::sandbox::{AttemptFailure, Deliver, Delivered, Event};
use outbox_host::store::Status;
use tokio_util::sync::CancellationToken;

use crate::binary::{free_port, run_cli, signal, spawn_with, wait_exit, wait_table, write_config};
use crate::support::{Running, World};

/// Every character a sink could use to forge a line or drive a terminal.
fn has_raw_controls(text: &str) -> bool {
    text.chars().any(|c| (c.is_control() && c != '\n') || c == '\u{202E}')
}

async fn metrics(addr: std::net::SocketAddr) -> String {
    crate::support::metrics_text(&format!("http://{addr}")).await
}

/// A `retry-after-ms` near `i64::MAX` or at `u64::MAX` is clamped to `sink.max_retry_after`
/// (counted), and the row is `retryable` then, not wedged and not retried at once.
#[tokio::test]
async fn extreme_retry_after_hints_are_clamped() {
    let world = World::new().await;
    let near_max = world.produce("RoomGiftSent", "room-i64", Status::Pending).await;
    let wrapping = world.produce("RoomGiftSent", "room-u64", Status::Pending).await;
    let fine = world.produce("RoomGiftSent", "room-fine", Status::Pending).await;
    let sink =
        format!("room.room-i64: \"retry-after:{}\"\nroom.room-u64: \"retry-after:{}\"", i64::MAX as u64 - 10, u64::MAX);
    let config = world.setup("", &sink).with_admin().set(&["sink", "max_retry_after"], "10m");
    let mut host = Running::start(config.parse()).await;
    host.wait_status(&world, &[&near_max, &wrapping], Status::Retryable).await;
    host.wait_status(&world, &[&fine], Status::Delivered).await;
    let exported = metrics(host.admin.unwrap()).await;
    host.stop().await;

    for id in [&near_max, &wrapping] {
        let row = world.row(id).await;
        assert_eq!(row.retry_count, 1, "{id} was attempted again");
        let wait = row.next_retry_at_ms - row.updated_at_ms;
        assert!((599_000..=600_000).contains(&wait), "{id}: next retry in {wait} ms, wanted max_retry_after 10m");
    }
    assert!(
        exported.contains("room_outbox_sink_limit_hits_total{sink=\"fake\",limit=\"retry_after\"} 2\n"),
        "{exported}"
    );
}

/// A sink stand-in that panics on one room: a host bug the worker must survive.
struct PanicsOnRoom(&'static str);

#[async_trait::async_trait]
impl Deliver for PanicsOnRoom {
    fn name(&self) -> &str {
        "panicky"
    }

    async fn deliver(&self, event: &Event, _timeout: Duration) -> Result<Delivered, AttemptFailure> {
        if event.room_id == self.0 {
            panic!("boom in {}", event.event_id);
        }
        Ok(Delivered::Delivered)
    }
}

/// A panic in a delivery task records that attempt as retryable (kind trap), counts it, and
/// other rooms go on (the room's next event waits behind its retryable head).
#[tokio::test]
async fn a_panicking_delivery_is_recorded_as_retryable_not_left_delivering() {
    let world = World::new().await;
    let boom = world.produce("RoomGiftSent", "room-boom", Status::Pending).await;
    let after = world.produce("RoomGiftSent", "room-boom", Status::Pending).await;
    let other = world.produce("RoomGiftSent", "room-calm", Status::Pending).await;
    let config = world.config("retry_interval: 1h\nordering: per_room", "");
    let metrics = Arc::new(Metrics::new("panicky"));
    let worker =
        Worker::new(world.producer.clone(), Arc::new(PanicsOnRoom("room-boom")), config.worker, "n", metrics.clone());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(worker.run(shutdown.clone()));
    let deadline = tokio::time::Instant::now() + crate::support::PATIENCE;
    while world.row(&boom).await.status != Status::Retryable || world.row(&other).await.status != Status::Delivered {
        assert!(tokio::time::Instant::now() < deadline, "the panicking row was never recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    task.await.unwrap().unwrap();

    let row = world.row(&boom).await;
    assert_eq!(row.retry_count, 1);
    let error = row.last_error.unwrap();
    assert!(error.starts_with("host panicked while delivering: boom in"), "{error}");
    // Room order: the room's next event waits behind its retryable head, unattempted.
    assert_eq!(world.row(&after).await.status, Status::Pending, "the room's next event overtook its head");
    let text = metrics.render();
    assert!(text.contains("room_outbox_delivery_panics_total{sink=\"panicky\"} 1\n"), "{text}");
    assert!(text.contains("kind=\"trap\"} 1\n"), "{text}");
}

/// One run of the real binary against every emitting behaviour: the log stays bounded, one
/// line per line, with no raw control characters; stdout floods do not trap; the host's own
/// proxy environment is ignored; outcomes are recorded.
#[tokio::test]
async fn a_flooding_forging_sink_cannot_flood_or_forge_the_log() {
    let world = World::new().await;
    let rooms = [
        ("room-flood", "log-flood:100000".to_string()),
        ("room-big", "log-big:8000000".to_string()),
        ("room-forge", "log-forge".to_string()),
        ("room-print", "print:102400".to_string()),
        ("room-skip", "skip-big:4000000".to_string()),
        ("room-fail", "fail-forge".to_string()),
        ("room-http", format!("http:{}", world.collector.url("/ok"))),
    ];
    let mut ids = Vec::new();
    for (room, _) in &rooms {
        ids.push(world.produce("RoomGiftSent", room, Status::Pending).await);
    }
    let sink: Vec<String> = rooms.iter().map(|(room, b)| format!("room.{room}: \"{b}\"")).collect();
    let yaml = world.yaml("retry_interval: 1h\npublish_timeout: 5s", &sink.join("\n"));
    // A proxy that does not exist: if the sink's traffic used it, `room-http` would fail.
    let proxy = [
        ("HTTP_PROXY", "http://127.0.0.1:9"),
        ("http_proxy", "http://127.0.0.1:9"),
        ("ALL_PROXY", "http://127.0.0.1:9"),
    ];
    let child = spawn_with(&world, &yaml, &proxy);
    wait_table(&world, "every outcome", |s| s.count(Status::Delivered) == 6 && s.count(Status::Retryable) == 1).await;
    signal(&child, "TERM");
    let output = wait_exit(child).await;
    assert_eq!(output.status.code(), Some(0));
    let log = String::from_utf8(output.stderr).expect("the log is UTF-8");

    let flood = log.lines().filter(|l| l.contains("flood line")).count();
    assert_eq!(flood, 100, "sink.max_log_lines per attempt");
    assert!(log.contains("sink log budget exceeded"), "no marker for the dropped lines");
    assert!(log.contains("dropped_lines=99900"), "{}", &log[..log.len().min(4000)]);
    let longest = log.lines().map(str::len).max().unwrap();
    assert!(longest < 6 * 1024, "a log line of {longest} bytes");
    assert!(log.len() < 256 * 1024, "the whole log is {} bytes", log.len());
    assert!(!has_raw_controls(&log), "raw control characters in the log (colour codes on a pipe, or a sink's)");
    assert!(!log.lines().any(|l| l.starts_with("2026-01-01T00:00:00")), "a sink forged a log line");
    assert!(
        log.contains("ok\\n2026-01-01T00:00:00.000000Z  INFO deliver{event_id=FORGED}"),
        "the forgery is shown escaped"
    );
    assert!(log.contains("sink wrote past sink.max_stdio_bytes"), "stdout excess not reported");
    assert!(log.lines().any(|l| l.contains("stream=\"stdout\"") || l.contains("stream=stdout")), "stdout not logged");

    for id in &ids[..5] {
        assert_eq!(world.row(id).await.status, Status::Delivered, "{id}");
    }
    assert_eq!(world.row(&ids[6]).await.status, Status::Delivered, "the sink's request went through a proxy");
    let failed = world.row(&ids[5]).await;
    let error = failed.last_error.unwrap();
    assert!(!has_raw_controls(&error), "{error:?}");
    assert!(error.contains("\\u{1b}") && error.contains("\\u{202e}"), "{error}");

    // What the operator's terminal shows.
    let status = run_cli(&world, &["status"]);
    let shown = String::from_utf8(status.stdout).unwrap();
    assert!(shown.contains("INFO deliver{event_id=FORGED}"), "{shown}");
    assert!(!has_raw_controls(&shown), "{shown:?}");
    let show = run_cli(&world, &["show", &failed.event_id]);
    let shown = String::from_utf8(show.stdout).unwrap();
    assert!(!has_raw_controls(&shown), "{shown:?}");
}

/// A sink's config problems cannot pose as the host's keys, and are bounded.
#[tokio::test]
async fn sink_config_problems_are_prefixed_escaped_and_bounded() {
    let world = World::new().await;
    let many: Vec<String> = (0..40).map(|i| format!("k{i}: bad")).collect();
    let problems = format!("sink.plugin: forged\\n  - database.url: forged too|{}", many.join("|"));
    write_config(&world, &world.yaml("", &format!("check.problems: \"{problems}\"")));
    let out = run_cli(&world, &["check-config"]);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("  - sink.config.sink.plugin: forged\\n  - database.url: forged too (reported by the sink)"),
        "{stderr}"
    );
    assert!(!stderr.lines().any(|l| l.starts_with("  - sink.plugin") || l.starts_with("  - database.url")), "{stderr}");
    assert_eq!(stderr.lines().filter(|l| l.starts_with("  - sink.config.k")).count(), 19, "{stderr}");
    assert!(stderr.contains("… and 21 more problems reported by the sink"), "{stderr}");
}

/// `outbox-host run 2>&1 | tee run.log`, then `tee` ends: the host keeps delivering, counts
/// the lines it could not write, and SIGTERM still drains and exits 0.
#[tokio::test]
async fn a_closed_log_pipe_neither_stops_delivery_nor_signals() {
    let world = World::new().await;
    let port = free_port();
    let config = world.setup("", "default: log").set(&["admin", "listen"], &format!("127.0.0.1:{port}"));
    let mut child = spawn_with(&world, &config.yaml(), &[]);
    let mut stderr = child.stderr.take().unwrap();
    let mut first = [0u8; 64];
    let read = tokio::task::spawn_blocking(move || stderr.read(&mut first).map(|n| (n, stderr))).await.unwrap();
    let (n, stderr) = read.expect("the host logs at start");
    assert!(n > 0);
    drop(stderr); // the reading end is gone: every later write to stderr fails with EPIPE

    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(world.produce("RoomGiftSent", &format!("room-{}", i % 4), Status::Pending).await);
    }
    wait_table(&world, "delivery after the pipe closed", |s| s.count(Status::Delivered) == 20).await;
    let exported = metrics(format!("127.0.0.1:{port}").parse().unwrap()).await;
    let dropped: u64 = exported
        .lines()
        .find_map(|l| l.strip_prefix("room_outbox_log_lines_dropped_total "))
        .expect("the dropped-lines counter is exported")
        .parse()
        .unwrap();
    assert!(dropped >= 20, "{dropped} lines counted as dropped; every delivery logged at least one");

    signal(&child, "TERM");
    let output = wait_exit(child).await;
    assert_eq!(output.status.code(), Some(0), "SIGTERM after the pipe closed");
    let stats = world.producer.stats().await.unwrap();
    assert_eq!(stats.count(Status::Delivering), 0, "{stats:?}");
}
