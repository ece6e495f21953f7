//! No credential in any output (decision 0197), through the real binary: a sink's secret
//! config value it logs or fails with, in text and JSON logs and in `last_error`; a broker
//! token in the user info of its URL, in `check-config`'s error; a database password that
//! holds a raw `?`, in `run`'s and `status`'s errors.

use std::time::Duration;

use outbox_host::store::Status;

use crate::binary::{free_port, run_cli_beside, signal, spawn_host, wait_exit, write_config};
use crate::support::World;

/// A value the sink's config holds under `secret_key`.
const SINK_SECRET: &str = "Sk-9f3a/very?secret";

/// A careless sink logs its `secret_key` and fails with it in its message: the log line
/// (text and JSON) and `last_error` show `***` instead.
#[tokio::test]
async fn a_sinks_secret_config_value_is_scrubbed_from_its_log_lines_and_last_error() {
    for format in ["text", "json"] {
        let world = World::new().await;
        let sink = format!("default: \"leak-fail:secret_key\"\nsecret_key: \"{SINK_SECRET}\"");
        let yaml = format!("{}log:\n  format: {format}\n", world.yaml("", &sink));
        let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
        let child = spawn_host(&world, &yaml);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while world.row(&id).await.retry_count < 1 {
            assert!(tokio::time::Instant::now() < deadline, "no attempt was recorded");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        signal(&child, "TERM");
        let output = wait_exit(child).await;
        let log = String::from_utf8_lossy(&output.stderr);
        let row = world.row(&id).await;
        let error = row.last_error.unwrap_or_default();
        assert!(error.contains("rejected with secret_key=***"), "{format}: last_error {error:?}");
        assert!(log.contains("config secret_key is ***"), "{format}: the sink's line is not there:\n{log}");
        for shown in [&error, &log.to_string()] {
            assert!(!shown.contains(SINK_SECRET), "{format}: the secret was printed:\n{shown}");
            assert!(!shown.contains("very?secret"), "{format}: part of the secret was printed:\n{shown}");
        }
    }
}

/// A NATS token written as the URL's user info: `check-config` cannot reach the broker and
/// says so, showing the URL as `nats://***@…`.
#[tokio::test]
async fn a_broker_token_in_its_url_never_reaches_check_configs_output() {
    let world = World::new().await;
    let token = "Tk8c1eSecretToken";
    let url = format!("nats://{token}@127.0.0.1:{}", free_port());
    let yaml = world
        .setup_with(
            "",
            &crate::support::SinkSpec {
                name: "nats",
                plugin: outbox_test_support::RELAY,
                allowed_hosts: Vec::new(),
                config: "destination: \"rooms.{room_id}\"".to_string(),
            },
        )
        .set(&["sink", "broker"], "js")
        .set(&["brokers", "js", "kind"], "nats")
        .set(&["brokers", "js", "url"], &url)
        .set(&["brokers", "js", "stream"], "ROOMS")
        .yaml();
    write_config(&world, &yaml);
    let out = run_cli_beside(&world, &["check-config"]).await;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "check-config passed with the broker away:\n{text}");
    assert!(text.contains("nats://***@127.0.0.1"), "{text}");
    assert!(!text.contains(token), "the token was printed:\n{text}");
}

/// A database password holding a raw `?` (and `@`, `/`): neither `status` nor `run` prints
/// any of it, whatever the driver makes of the URL.
#[tokio::test]
async fn a_database_password_with_a_question_mark_never_reaches_run_or_status() {
    let world = World::new().await;
    let password = "Pq?7/hunter@22x";
    for url in [
        format!("postgres://outbox:{password}@127.0.0.1:{}/test", free_port()),
        format!("mysql://root:{password}@127.0.0.1:{}/test", free_port()),
    ] {
        let yaml = world.yaml("", "default: ok").replace(&world.db_url(), &url);
        assert!(yaml.contains(&url), "the test's config names {url}");
        write_config(&world, &yaml);
        let status = run_cli_beside(&world, &["status"]).await;
        let said = format!("{}{}", String::from_utf8_lossy(&status.stdout), String::from_utf8_lossy(&status.stderr));
        assert!(!status.status.success(), "status passed against nothing:\n{said}");
        let run = spawn_host(&world, &yaml);
        tokio::time::sleep(Duration::from_secs(2)).await;
        signal(&run, "TERM");
        let output = wait_exit(run).await;
        let log = String::from_utf8_lossy(&output.stderr);
        for shown in [&said, &log.to_string()] {
            assert!(!shown.is_empty(), "nothing was said about the database");
            for part in [password, "hunter", "Pq?7", "Pq%3F7"] {
                assert!(!shown.contains(part), "{url}: {part:?} was printed:\n{shown}");
            }
        }
    }
}
