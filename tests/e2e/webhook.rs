//! The real `webhook_sink.wasm` in the real host against a local receiver that verifies
//! Standard Webhooks signatures: what the receiver accepted, and what the table holds.

use std::time::Duration;

use outbox_host::store::{Row, Status};
use outbox_test_support::WEBHOOK_SINK;
use outbox_test_support::webhook::{Answer, Receiver, SECRET};

use crate::support::{Running, SinkSpec, World};

fn sink(receiver: &Receiver, secret: &str) -> SinkSpec {
    SinkSpec {
        name: "webhook",
        plugin: WEBHOOK_SINK,
        allowed_hosts: vec![receiver.host_port()],
        config: format!(
            "url: \"{}\"\nurl.RoomGiftSent: \"{}\"\nsecret: \"{secret}\"\nheaders: \"X-Tenant: acme\"\n",
            receiver.url("events"),
            receiver.url("gifts")
        ),
    }
}

/// One event per (room, answer, type) through the sink until each reaches its status;
/// the rows, in order.
async fn run(cases: &[(&'static str, Answer, &str, Status)], secret: &str, worker: &str) -> (Receiver, Vec<Row>) {
    let world = World::new().await;
    let receiver = Receiver::start(cases.iter().map(|(room, answer, _, _)| (*room, answer.clone()))).await;
    let mut ids = Vec::new();
    for (room, _, event_type, _) in cases {
        ids.push(world.produce(event_type, room, Status::Pending).await);
    }
    let config = world.config_with(&format!("retry_interval: 1h\n{worker}"), &sink(&receiver, secret));
    let mut host = Running::start(config).await;
    for (id, (_, _, _, status)) in ids.iter().zip(cases) {
        host.wait_status(&world, &[id], *status).await;
    }
    host.stop().await;
    let mut rows = Vec::new();
    for id in &ids {
        let row = world.row(id).await;
        let error = row.last_error.clone().unwrap_or_default();
        assert!(!error.contains("MfKQ9r8G"), "the secret leaked into last_error: {error}");
        rows.push(row);
    }
    (receiver, rows)
}

#[tokio::test]
async fn events_arrive_signed_at_their_types_url_and_verify() {
    let cases = [
        ("room-1", Answer::Ok, "RoomGiftSent", Status::Delivered),
        ("room-2", Answer::Ok, "RoomUserJoined", Status::Delivered),
    ];
    let (receiver, rows) = run(&cases, SECRET, "").await;
    for (row, path) in rows.iter().zip(["gifts", "events"]) {
        assert_eq!((row.retry_count, &row.last_error), (0, &None));
        let received = receiver.received_for(&row.event_id);
        assert_eq!(received.len(), 1, "{received:?}");
        let request = &received[0];
        assert!(request.problems.is_empty(), "the receiver refused it: {:?}", request.problems);
        assert_eq!(request.headers[":path"], path);
        assert_eq!(request.headers["x-tenant"], "acme");
        assert_eq!(request.body["type"], row.event_type);
        assert_eq!(request.body["data"]["event_id"], row.event_id);
        assert_eq!(request.body["data"]["room_id"], row.room_id);
        assert_eq!(request.body["data"]["body"]["room_id"], row.room_id, "the decoded body is carried");
    }
}

#[tokio::test]
async fn a_429_is_retried_after_its_retry_after_without_counting_the_attempt() {
    let cases = [("room-1", Answer::Sequence(vec![Answer::RetryAfter(429, 2)]), "RoomUserJoined", Status::Delivered)];
    let (receiver, rows) = run(&cases, SECRET, "retry_interval: 100ms").await;
    let received = receiver.received_for(&rows[0].event_id);
    assert_eq!(received.iter().map(|r| r.status).collect::<Vec<_>>(), [429, 204]);
    assert!(received.iter().all(|r| r.problems.is_empty()), "{received:?}");
    assert_eq!(rows[0].retry_count, 0, "a throttled attempt is not counted against the event");
    let first = received[0].headers["webhook-timestamp"].parse::<u64>().unwrap();
    let second = received[1].headers["webhook-timestamp"].parse::<u64>().unwrap();
    assert!(second >= first + 2, "the retry came before Retry-After: {first} then {second}");
    assert_eq!(received[0].id, received[1].id, "a retry keeps its webhook-id");
}

#[tokio::test]
async fn server_errors_are_retried_and_client_errors_fail_for_good() {
    let cases = [
        ("room-5xx", Answer::Status(503), "RoomUserJoined", Status::Retryable),
        ("room-4xx", Answer::Status(422), "RoomUserJoined", Status::Failed),
    ];
    let (receiver, rows) = run(&cases, SECRET, "").await;
    assert_eq!(rows[0].last_error.as_deref(), Some("unavailable: HTTP 503 from webhook"));
    assert_eq!(rows[1].last_error.as_deref(), Some("HTTP 422 from webhook"));
    assert_eq!(receiver.received_for(&rows[1].event_id).len(), 1, "a permanent failure is not retried");
}

#[tokio::test]
async fn a_wrong_secret_is_rejected_by_the_receiver_and_fails_the_event() {
    let wrong = "whsec_c2VjcmV0LXRoYXQtdGhlLXJlY2VpdmVyLWRvZXMtbm90LWtub3c=";
    let cases = [("room-1", Answer::Ok, "RoomUserJoined", Status::Failed)];
    let (receiver, rows) = run(&cases, wrong, "").await;
    let received = receiver.received_for(&rows[0].event_id);
    assert_eq!(received[0].problems, ["no v1 signature matches"]);
    assert_eq!(rows[0].last_error.as_deref(), Some("HTTP 401 from webhook"));
}

#[tokio::test]
async fn a_slow_receiver_times_the_attempt_out_and_the_retry_gets_through() {
    let slow = Answer::Sequence(vec![Answer::Slow(Duration::from_secs(4))]);
    let cases = [("room-1", slow, "RoomUserJoined", Status::Delivered)];
    let (receiver, rows) = run(&cases, SECRET, "publish_timeout: 1s\nretry_interval: 100ms").await;
    assert_eq!(rows[0].retry_count, 1, "the slow attempt counted as one failure");
    let received = receiver.received_for(&rows[0].event_id);
    assert_eq!(received.len(), 2);
    assert!(received.iter().all(|r| r.problems.is_empty()), "{received:?}");
}
