//! Flow control: the operator's rate limit on a sink, and the retry backoff.

use std::time::Duration;

use outbox_host::store::Status;

use crate::support::{Running, World};

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
