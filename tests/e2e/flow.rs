//! Flow control: the operator's rate limit on a sink, and the retry backoff.

use std::time::Duration;

use outbox_host::store::Status;

use crate::support::{Running, World, per_backend};

per_backend!(a_room_past_its_rate_limit_is_held_in_order_and_the_other_rooms_go_on);

/// With `rate_limit: 100/s` and a burst of 10, no second of a drain of 600 events (each room
/// its own, so that 16 could run at once) sees more than 110 deliveries start, give or take
/// the jitter of their reports' arrival at the sink's server.
#[tokio::test]
async fn a_rate_limit_bounds_the_deliveries_in_every_second() {
    let world = World::new().await;
    let events: Vec<_> = (0..600).map(|i| world.event("RoomGiftSent", &format!("room-{i}"), Status::Pending)).collect();
    world.producer.insert(&events).await.unwrap();
    let config = world
        .setup("concurrency: 16\nbatch_size: 100", "")
        .set(&["sink", "rate_limit"], "100/s")
        .set(&["sink", "rate_burst"], "10")
        .parse();
    let mut host = Running::start(config).await;
    host.wait_for_within("600 deliveries", Duration::from_secs(60), || async {
        world.producer.stats().await.unwrap().count(Status::Delivered) == 600
    })
    .await;
    host.stop().await;

    let mut starts: Vec<_> = world.collector.reports().into_iter().map(|r| r.at).collect();
    assert_eq!(starts.len(), 600, "every event delivered once");
    starts.sort();
    let mut busiest = 0;
    for (i, first) in starts.iter().enumerate() {
        let in_a_second = starts[i..].iter().take_while(|t| **t < *first + Duration::from_secs(1)).count();
        busiest = busiest.max(in_a_second);
    }
    // The host starts at most 110 in any second; the collector sees each start when its
    // report arrives, a few milliseconds later and not always equally later, so a window of
    // its clock can hold the starts of a little more than a second: 5 more is 50 ms of that.
    assert!(busiest <= 115, "{busiest} deliveries reached the sink within one second (limit 100/s, burst 10)");
    assert!(busiest >= 50, "the limit held the drain far below its rate: {busiest} in the busiest second");
}

/// `rate_limit.per_room: 10/s` (burst 1): one room produces at ten times that (100 events
/// in a second) while 50 other rooms produce 10 events each. The hot room reaches the sink
/// in order, at most 10 a second and its burst (a little over for the jitter of the reports' arrival),
/// so its 100 events take at least 9.9 s; the other rooms are not held behind it: all 500
/// are delivered while the hot room still has a third of its events to go. Meanwhile the
/// sink's page lists the hot room as held, and the gauge counts it.
async fn a_room_past_its_rate_limit_is_held_in_order_and_the_other_rooms_go_on(world: World) {
    const HOT: usize = 100;
    let config = world
        .setup("concurrency: 16\nbatch_size: 100", "")
        .set(&["sink", "rate_limit", "per_room"], "10/s")
        .set(&["sink", "rate_limit", "per_room_burst"], "1")
        .with_admin()
        .parse();
    let mut host = Running::start(config).await;
    let base = format!("http://{}", host.admin.expect("admin listener"));
    let others: Vec<_> =
        (0..500).map(|i| world.event("RoomGiftSent", &format!("room-{}", i % 50), Status::Pending)).collect();
    let hot: Vec<_> = (0..HOT).map(|_| world.event("RoomGiftSent", "hot", Status::Pending)).collect();
    let producer = world.producer.clone();
    let hot_events = hot.clone();
    let hot_producer = tokio::spawn(async move {
        for event in hot_events {
            producer.insert(std::slice::from_ref(&event)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    world.producer.insert(&others).await.unwrap();
    // The page names the hot room while its limit holds it.
    let mut seen_held = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !seen_held && tokio::time::Instant::now() < deadline {
        let page = reqwest::get(format!("{base}/sinks/fake")).await.unwrap().text().await.unwrap();
        let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
        seen_held = page.contains("id=\"held-rooms\"")
            && page.contains("&amp;room=hot\">hot</a>")
            && metrics.contains("room_outbox_rooms_held{sink=\"fake\"} 1");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen_held, "the sink's page and its gauge showed the hot room held");
    hot_producer.await.unwrap();
    host.wait_for_within("every event delivered", Duration::from_secs(120), || async {
        world.producer.stats().await.unwrap().count(Status::Delivered) == (HOT + 500) as i64
    })
    .await;
    host.stop().await;

    let reports = world.collector.reports();
    assert_eq!(reports.len(), HOT + 500, "every event delivered once");
    let hot_ids: Vec<&str> = hot.iter().map(|e| e.event_id.as_str()).collect();
    let mut hot_reports: Vec<_> = reports.iter().filter(|r| hot_ids.contains(&r.event_id.as_str())).collect();
    hot_reports.sort_by_key(|r| r.at);
    let order: Vec<&str> = hot_reports.iter().map(|r| r.event_id.as_str()).collect();
    assert_eq!(order, hot_ids, "the hot room's events reached the sink in order");
    let starts: Vec<_> = hot_reports.iter().map(|r| r.at).collect();
    for (i, first) in starts.iter().enumerate() {
        let in_a_second = starts[i..].iter().take_while(|t| **t < *first + Duration::from_secs(1)).count();
        // 10 a second and the burst, and 2 for reports that arrive late and close together.
        assert!(in_a_second <= 13, "{in_a_second} of the hot room's events within a second (limit 10/s, burst 1)");
    }
    let took = starts[HOT - 1] - starts[0];
    assert!(took >= Duration::from_millis(9_500), "the hot room's {HOT} events took {took:?} at 10/s");
    let last_other = reports.iter().filter(|r| !hot_ids.contains(&r.event_id.as_str())).map(|r| r.at).max().unwrap();
    let hot_done_by_then = starts.iter().filter(|t| **t <= last_other).count();
    assert!(
        hot_done_by_then <= HOT * 2 / 3,
        "the other rooms finished only after {hot_done_by_then} of the hot room's {HOT} events: they waited for it"
    );
}
