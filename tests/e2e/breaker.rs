//! The sink's circuit breaker and the sink's push-back, with the real Tencent IM sink against
//! the stand-in: an outage costs a handful of attempts, not thousands; the rows waiting are
//! not attempted and their `retry_count` does not grow; the host stays ready and says what
//! is going on; and after recovery every event is delivered, each room in order.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use outbox_host::store::{NewEvent, Status};
use outbox_test_support::tencent::{Received, Script, TencentIm};

use crate::support::{Running, World, metric, per_backend};

per_backend!(an_app_rate_limit_costs_a_few_attempts_no_retry_count_and_keeps_room_order);

const ROOMS: usize = 20;
const PER_ROOM: usize = 10;
const CONCURRENCY: usize = 16;

pub(crate) async fn get(url: &str) -> (u16, String) {
    let response = reqwest::get(url).await.expect("admin listener answers");
    (response.status().as_u16(), response.text().await.unwrap())
}

/// `ROOMS` rooms of `PER_ROOM` events, inserted in each room's order.
async fn rooms(world: &World) -> Vec<NewEvent> {
    let mut events = Vec::new();
    for _ in 0..PER_ROOM {
        for room in 0..ROOMS {
            events.push(world.event("RoomGiftSent", &format!("room-{room}"), Status::Pending));
        }
    }
    world.producer.insert(&events).await.unwrap();
    events
}

/// Each room's events in the order the stand-in accepted them: every event once, in the
/// order of its room.
fn assert_accepted_once_in_room_order(events: &[NewEvent], received: &[Received]) {
    let mut accepted: HashMap<String, Vec<String>> = HashMap::new();
    for r in received.iter().filter(|r| r.answered == 0) {
        let room = r.data["room_id"].as_str().unwrap().to_string();
        accepted.entry(room).or_default().push(r.data["event_id"].as_str().unwrap().to_string());
    }
    let mut expected: HashMap<String, Vec<String>> = HashMap::new();
    for e in events {
        expected.entry(e.room_id.clone()).or_default().push(e.event_id.clone());
    }
    assert_eq!(accepted, expected, "each room's events accepted once each, in the room's order");
}

/// Tencent IM answers 10006 (the app's call frequency limit) to everything for 5 s. The sink
/// pushes back, so the breaker pauses the whole sink and probes once per `retry-after`
/// (the sink's 1 s): the first wave of deliveries (at most `concurrency`: one per room of
/// the first claim, whose rooms' runs are whole) plus about one probe per second reach the
/// stand-in. Pushed-back attempts are deferrals, not failures of the event:
/// `retry_count` never grows, and it only ever grows, so every row ends at 0.
async fn an_app_rate_limit_costs_a_few_attempts_no_retry_count_and_keeps_room_order(world: World) {
    let im = TencentIm::start([]).await;
    let events = rooms(&world).await;
    let config = world
        .setup_with(
            &format!("ordering: per_room\nconcurrency: {CONCURRENCY}\nbatch_size: 100\nretry_interval: 1s"),
            &crate::tencent::sink(&im, &im.endpoint()),
        )
        .with_admin()
        .parse();
    let outage = Duration::from_secs(5);
    im.outage(Script::Code(10006), outage);
    let recovered_at = Instant::now() + outage;
    let mut host = Running::start(config).await;
    let base = format!("http://{}", host.admin.unwrap());

    // While the destination refuses: the breaker is open (or probing), and the host is ready.
    let state = r#"room_outbox_sink_state{sink="tencent-im"}"#;
    host.wait_for("the breaker to open", || async { metric(&base, state).await == 2.0 }).await;
    assert_eq!(
        get(&format!("{base}/readyz")).await,
        (200, "ready\n".into()),
        "a paused sink is no reason to be unready"
    );
    let status: serde_json::Value = serde_json::from_str(&get(&format!("{base}/api/status")).await.1).unwrap();
    assert!(["open", "half_open"].contains(&status["breaker"]["state"].as_str().unwrap()), "{status}");
    assert!(status["breaker"]["reason"].as_str().unwrap().contains("throttled"), "{status}");
    let page = get(&format!("{base}/sinks/tencent-im")).await.1;
    assert!(
        page.contains("id=\"breaker\" data-state=\"open\"") || page.contains("data-state=\"half_open\""),
        "the sink's page shows the breaker: {page}"
    );
    let overview = get(&format!("{base}/")).await.1;
    assert!(
        overview.contains("<tr data-sink=\"tencent-im\" data-state=\"open\"")
            || overview.contains("data-state=\"half_open\""),
        "the overview shows the sink's state: {overview}"
    );

    let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    host.wait_status(&world, &ids, Status::Delivered).await;
    assert_eq!(metric(&base, state).await, 0.0, "closed again after recovery");
    let opened = metric(&base, r#"room_outbox_sink_state_transitions_total{sink="tencent-im",to="open"}"#).await;
    let closed = metric(&base, r#"room_outbox_sink_state_transitions_total{sink="tencent-im",to="closed"}"#).await;
    let throttles = metric(&base, r#"room_outbox_sink_push_backs_total{sink="tencent-im",pressure="throttled"}"#).await;
    host.stop().await;

    let received = im.received();
    let refused = received.iter().filter(|r| r.answered == 10006).count();
    let bound = CONCURRENCY + 2 * outage.as_secs() as usize;
    eprintln!("{refused} attempts reached the stand-in during the {outage:?} outage");
    assert!(refused <= bound, "{refused} attempts during a {outage:?} outage (bound {bound})");
    // Every opening after the first followed a refused probe, on top of the first wave.
    assert!(refused as f64 >= opened, "{refused} refusals for {opened} openings: the probes reached the stand-in");
    assert_eq!(throttles as usize, refused, "every refusal was a push-back");
    assert!(opened >= 2.0 && closed == 1.0, "opened {opened} times, closed {closed} times");
    assert!(Instant::now() >= recovered_at);
    for id in &ids {
        let row = world.row(id).await;
        assert_eq!(row.retry_count, 0, "a deferral counted against {id}: {row:?}");
    }
    assert_accepted_once_in_room_order(&events, &received);
}

/// Tencent IM answers 70500 (an internal error: retryable, but not a push-back) to everything
/// for 3 s. Five failures in a row open the breaker; while it is open nothing is attempted,
/// so the failures the rows were charged are exactly the requests the stand-in refused: the
/// first wave (the slots, and those refilled before the fifth failure) plus the probes,
/// whose cool-down doubles from 200 ms to 400 ms.
#[tokio::test]
async fn failures_in_a_row_open_the_breaker_and_only_probes_are_attempted_until_recovery() {
    let world = World::new().await;
    let im = TencentIm::start([]).await;
    let events: Vec<_> = (0..100).map(|i| world.event("RoomGiftSent", &format!("room-{i}"), Status::Pending)).collect();
    world.producer.insert(&events).await.unwrap();
    let config = world
        .setup_with(
            &format!("concurrency: {CONCURRENCY}\nbatch_size: 100\nretry_interval: 100ms"),
            &crate::tencent::sink(&im, &im.endpoint()),
        )
        .set(&["sink", "breaker", "cool_down"], "200ms")
        .set(&["sink", "breaker", "max_cool_down"], "400ms")
        .with_admin()
        .parse();
    let outage = Duration::from_secs(3);
    im.outage(Script::Code(70500), outage);
    let mut host = Running::start(config).await;
    let base = format!("http://{}", host.admin.unwrap());
    host.wait_for("the breaker to open", || async {
        metric(&base, r#"room_outbox_sink_state{sink="tencent-im"}"#).await == 2.0
    })
    .await;
    let status: serde_json::Value = serde_json::from_str(&get(&format!("{base}/api/status")).await.1).unwrap();
    assert!(status["breaker"]["reason"].as_str().unwrap().contains("5 retryable failures"), "{status}");
    assert_eq!(get(&format!("{base}/readyz")).await.0, 200);

    let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    host.wait_status(&world, &ids, Status::Delivered).await;
    host.stop().await;

    let refused = im.received().iter().filter(|r| r.answered == 70500).count();
    // The first wave: every slot, plus the slots the first four failures freed before the
    // fifth arrived. Then the probes: the first after 200 ms, the rest every 400 ms, over
    // 3 s. Measured: 27.
    let bound = CONCURRENCY + 4 + (1 + 2_800 / 400) + 5;
    eprintln!("{refused} attempts reached the stand-in during the {outage:?} outage");
    assert!(refused <= bound, "{refused} attempts during a {outage:?} outage (bound {bound})");
    let mut charged = 0;
    let mut untouched = 0;
    for id in &ids {
        let row = world.row(id).await;
        charged += row.retry_count as usize;
        untouched += usize::from(row.retry_count == 0);
    }
    assert_eq!(charged, refused, "every refused attempt is counted once, and nothing else");
    assert!(untouched >= 100 - bound, "only {untouched} rows were never attempted while the breaker was open");
}
