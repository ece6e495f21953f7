//! Operating the host: metric values after scripted deliveries, the admin HTTP API, and
//! the admin commands of the real binary.

use std::process::Command;
use std::time::Duration;

use outbox_host::store::{Status, now_ms};

use crate::support::{Running, TestConfig, World, scrape};

const BIN: &str = env!("CARGO_BIN_EXE_outbox-host");

async fn json(response: reqwest::Response) -> serde_json::Value {
    serde_json::from_str(&response.text().await.unwrap()).unwrap()
}

/// The admin token of these tests' hosts.
const TOKEN: &str = "operations-test-token-0123";

fn with_admin(config: TestConfig) -> outbox_host::config::Config {
    config.with_admin().set(&["admin", "stats_interval"], "50ms").set(&["admin", "token"], TOKEN).parse()
}

#[tokio::test]
async fn metrics_count_every_outcome_kind_skip_and_rescue() {
    let world = World::new().await;
    // Left `delivering` by a host that died: claimed first, so only it is rescued.
    let rescued = world.produce("RoomMicChanged", "room-rescue", Status::Pending).await;
    let past = now_ms() - 120_000;
    assert_eq!(world.producer.claim("dead-host", past, past + 1_000, 1).await.unwrap().len(), 1);
    let ok = world.produce("RoomGiftSent", "room-ok", Status::Pending).await;
    let skip = world.produce("RoomCreated", "room-ok", Status::Pending).await;
    let mut failing = Vec::new();
    for room in ["room-retry", "room-perm", "room-trap", "room-slow"] {
        failing.push(world.produce("RoomUserJoined", room, Status::Pending).await);
    }

    let sink = "type.RoomCreated: skip\nroom.room-retry: retryable\nroom.room-perm: permanent\nroom.room-trap: trap\nroom.room-slow: sleep:3000";
    let mut host = Running::start(with_admin(world.setup("retry_interval: 1h\npublish_timeout: 300ms", sink))).await;
    host.wait_status(&world, &[&ok, &skip, &rescued], Status::Delivered).await;
    host.wait_status(&world, &[&failing[1]], Status::Failed).await;
    host.wait_status(&world, &[&failing[0], &failing[2], &failing[3]], Status::Retryable).await;
    let base = format!("http://{}", host.admin.unwrap());
    let mut m = scrape(&base).await;
    for _ in 0..100 {
        if m.get("room_outbox_rows{sink=\"fake\",status=\"retryable\"}") == Some(&3.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        m = scrape(&base).await;
    }
    host.stop().await;

    let get = |key: &str| m.get(key).copied().unwrap_or_else(|| panic!("{key} missing from /metrics: {m:?}"));
    assert_eq!(get("room_outbox_publish_success_total{sink=\"fake\",event_type=\"RoomGiftSent\"}"), 1.0);
    assert_eq!(get("room_outbox_publish_success_total{sink=\"fake\",event_type=\"RoomCreated\"}"), 1.0);
    assert_eq!(get("room_outbox_publish_success_total{sink=\"fake\",event_type=\"RoomMicChanged\"}"), 1.0);
    assert_eq!(get("room_outbox_skipped_total{sink=\"fake\",event_type=\"RoomCreated\"}"), 1.0);
    for kind in ["retryable", "permanent", "trap", "timeout"] {
        let key =
            format!("room_outbox_publish_failure_total{{sink=\"fake\",event_type=\"RoomUserJoined\",kind=\"{kind}\"}}");
        assert_eq!(get(&key), 1.0, "{key}");
    }
    assert_eq!(get("room_outbox_publish_latency_ms_count{sink=\"fake\"}"), 7.0);
    assert!(get("room_outbox_publish_latency_ms_sum{sink=\"fake\"}") >= 300.0, "the timed-out call took 300ms");
    assert_eq!(get("room_outbox_lease_rescues_total{sink=\"fake\"}"), 1.0);
    assert!(get("room_outbox_claims_total{sink=\"fake\"}") >= 1.0);
    assert_eq!(get("room_outbox_handed_back_total{sink=\"fake\"}"), 0.0);
    assert_eq!(get("room_outbox_pending_total{sink=\"fake\",status=\"retryable\"}"), 3.0);
    assert_eq!(get("room_outbox_pending_total{sink=\"fake\",status=\"pending\"}"), 0.0);
    assert_eq!(get("room_outbox_rows{sink=\"fake\",status=\"failed\"}"), 1.0);
    assert_eq!(get("room_outbox_rows{sink=\"fake\",status=\"delivered\"}"), 3.0);
    assert!(get("room_outbox_oldest_pending_age_ms{sink=\"fake\"}") > 0.0, "retryable rows are waiting");
    assert_eq!(get("room_outbox_db_errors_total{op=\"claim\"}"), 0.0);
}

#[tokio::test]
async fn the_http_api_shows_retries_and_purges() {
    let world = World::new().await;
    let failed = world.produce("RoomGiftSent", "room-bad", Status::Pending).await;
    let done = world.produce("RoomGiftSent", "room-ok", Status::Pending).await;
    let mut host = Running::start(with_admin(world.setup("", "room.room-bad: permanent"))).await;
    host.wait_status(&world, &[&failed], Status::Failed).await;
    host.wait_status(&world, &[&done], Status::Delivered).await;
    let base = format!("http://{}", host.admin.unwrap());
    let client = reqwest::Client::new();

    let status = json(client.get(format!("{base}/api/status")).send().await.unwrap()).await;
    assert_eq!((status["counts"]["failed"].as_i64(), status["counts"]["delivered"].as_i64()), (Some(1), Some(1)));
    assert_eq!(status["top_errors"][0]["error"], "fake: scripted permanent failure");

    let shown = json(client.get(format!("{base}/api/events/{failed}")).send().await.unwrap()).await;
    assert_eq!(shown["status"], "failed");
    assert_eq!(shown["envelope"]["body"]["room_id"], "room-bad", "the body is decoded");
    let missing = client.get(format!("{base}/api/events/nope")).send().await.unwrap();
    assert_eq!(missing.status().as_u16(), 404);

    let unclear = client.post(format!("{base}/api/retry")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(unclear.status().as_u16(), 400, "a retry must say what to move");
    let moved =
        json(client.post(format!("{base}/api/retry?event_id={failed}")).bearer_auth(TOKEN).send().await.unwrap()).await;
    assert_eq!(moved["moved"], 1);
    let attempts = || world.collector.attempts_of(&failed).len();
    host.wait_for("the retried event's second attempt", || async { attempts() == 2 }).await;

    let purged =
        json(client.post(format!("{base}/api/purge?delivered_before=1h")).bearer_auth(TOKEN).send().await.unwrap())
            .await;
    assert_eq!(purged["deleted"], 0, "the delivered row is younger than an hour");
    tokio::time::sleep(Duration::from_millis(5)).await;
    let purged =
        json(client.post(format!("{base}/api/purge?delivered_before=1ms")).bearer_auth(TOKEN).send().await.unwrap())
            .await;
    assert_eq!(purged["deleted"], 1);
    assert!(world.producer.get(&done).await.unwrap().is_none());
    host.stop().await;
}

/// Runs the real binary against this world's database.
fn cli(world: &World, args: &[&str]) -> std::process::Output {
    let path = world.dir.path().join("outbox.yaml");
    std::fs::write(&path, world.yaml("", "")).unwrap();
    Command::new(BIN).arg("--config").arg(&path).args(args).stdin(std::process::Stdio::null()).output().unwrap()
}

#[tokio::test]
async fn admin_commands_show_retry_and_purge() {
    let world = World::new().await;
    let mut failed = Vec::new();
    for i in 0..14 {
        failed.push(
            world
                .produce(if i == 0 { "RoomUserLeft" } else { "RoomGiftSent" }, &format!("r{i}"), Status::Pending)
                .await,
        );
    }
    let done = world.produce("RoomGiftSent", "ok", Status::Delivered).await;
    let now = now_ms();
    let claimed = world.producer.claim("w", now, now + 60_000, 100).await.unwrap();
    let marks: Vec<_> = claimed
        .iter()
        .map(|c| {
            outbox_host::store::Mark::of(
                c,
                outbox_host::store::Outcome::Fail {
                    error: format!("Tencent IM error 10010: group {} gone", c.room_id),
                },
            )
        })
        .collect();
    world.producer.mark(&marks, now).await.unwrap();

    let out = cli(&world, &["show", &failed[0]]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (shown["status"].as_str(), shown["envelope"]["event_type"].as_str()),
        (Some("failed"), Some("RoomUserLeft"))
    );

    let out = cli(&world, &["retry", "--event-type", "RoomUserLeft"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "moved 1 failed event(s) back to pending");
    let out = cli(&world, &["retry", "--error", "group r1 gone"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "moved 1 failed event(s) back to pending");

    let out = cli(&world, &["retry", "--all"]);
    assert!(!out.status.success(), "moved more than a handful without asking");
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing moved (12 failed events match; pass --yes"));
    assert_eq!(world.producer.stats().await.unwrap().count(Status::Failed), 12);
    let out = cli(&world, &["retry", "--all", "--yes"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "moved 12 failed event(s) back to pending");
    assert_eq!(world.producer.stats().await.unwrap().count(Status::Pending), 14);

    let out = cli(&world, &["retry"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("say which failed events to retry"));

    let out = cli(&world, &["purge", "--delivered-before", "7d"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "deleted 0 delivered row(s) older than 7d from room_outbox"
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    let out = cli(&world, &["purge", "--delivered-before", "1ms", "--batch", "1"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "deleted 1 delivered row(s) older than 1ms from room_outbox"
    );
    assert!(world.producer.get(&done).await.unwrap().is_none());

    let out = cli(&world, &["status"]);
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(status.contains("delivered in the last minute: 0"), "{status}");
}

/// The Grafana dashboard and the alert rules only use metrics the host really exports.
#[tokio::test]
async fn the_dashboard_and_alerts_use_only_exported_metrics() {
    let world = World::new().await;
    // One of each outcome, so that every family has a series to show.
    let ok = world.produce("RoomGiftSent", "room-ok", Status::Pending).await;
    let skipped = world.produce("RoomGiftSent", "room-skip", Status::Pending).await;
    let failed = world.produce("RoomGiftSent", "room-bad", Status::Pending).await;
    let sink = "room.room-skip: skip\nroom.room-bad: retryable";
    let mut host = Running::start(with_admin(world.setup("retry_interval: 1h", sink))).await;
    host.wait_status(&world, &[&ok, &skipped], Status::Delivered).await;
    host.wait_status(&world, &[&failed], Status::Retryable).await;
    let base = format!("http://{}", host.admin.unwrap());
    let exported = crate::support::metrics_text(&base).await;
    host.stop().await;
    let families: Vec<&str> =
        exported.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dashboard = std::fs::read_to_string(root.join("deploy/grafana/outbox-host.json")).unwrap();
    let alerts = std::fs::read_to_string(root.join("deploy/prometheus/alerts.yml")).unwrap();
    let dashboard_json: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    assert!(dashboard_json["panels"].as_array().is_some_and(|p| p.len() >= 8));
    let rules: serde_yaml_ng::Value = serde_yaml_ng::from_str(&alerts).expect("the alert rules are YAML");
    assert!(rules["groups"][0]["rules"].as_sequence().is_some_and(|r| r.len() >= 3));

    let mut used = std::collections::BTreeSet::new();
    for text in [&dashboard, &alerts] {
        let mut rest = text.as_str();
        while let Some(at) = rest.find("room_outbox_") {
            let name: String = rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            rest = &rest[at + name.len()..];
            used.insert(name);
        }
    }
    assert!(used.len() >= 8, "{used:?}");
    for name in &used {
        // OpenMetrics names a counter's family without its `_total` samples' suffix.
        let family = ["_bucket", "_sum", "_count", "_total"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
        assert!(
            families.contains(&family) || families.contains(&name.as_str()),
            "{name} is used but {family} is not exported; exported: {families:?}"
        );
    }
}
