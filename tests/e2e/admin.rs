//! The admin listener: liveness, and readiness that flips to 503 while draining.

use std::time::Duration;

use outbox_host::store::Status;
use outbox_host::worker::Signal;

use crate::support::{Running, World};

async fn get(url: &str) -> (u16, String) {
    let response = reqwest::get(url).await.expect("admin listener answers");
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test]
async fn healthz_and_readyz_answer_and_readiness_flips_while_draining() {
    let world = World::new().await;
    let slow = world.produce("RoomGiftSent", "room-slow", Status::Pending).await;
    let yaml = world
        .yaml("publish_timeout: 5s", "room.room-slow: sleep:1500")
        .replace("listen: \"\"", "listen: \"127.0.0.1:0\"");
    let config = outbox_host::config::Config::from_yaml(&yaml, std::iter::empty(), &|_| None).unwrap();
    let mut host = Running::start(config).await;
    let base = format!("http://{}", host.admin.expect("admin listener on"));

    assert_eq!(get(&format!("{base}/healthz")).await, (200, "ok\n".into()));
    assert_eq!(get(&format!("{base}/readyz")).await, (200, "ready\n".into()));

    host.wait_signal("the slow claim", |s| *s == Signal::Claimed(1)).await;
    host.shutdown.cancel();
    // The slow delivery keeps the host draining for a while; readiness must say so.
    let mut draining = (0, String::new());
    for _ in 0..50 {
        draining = get(&format!("{base}/readyz")).await;
        if draining.0 == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(draining, (503, "draining\n".into()));
    assert_eq!(get(&format!("{base}/healthz")).await.0, 200, "alive while draining");

    tokio::time::timeout(Duration::from_secs(10), host.task).await.unwrap().unwrap().unwrap();
    assert_eq!(world.row(&slow).await.status, Status::Delivered);
    assert!(reqwest::get(format!("{base}/healthz")).await.is_err(), "the listener is closed after shutdown");
}

/// A failing sink never makes the host unready: IM trouble must not take the service down.
#[tokio::test]
async fn a_failing_sink_keeps_the_host_ready() {
    let world = World::new().await;
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let yaml =
        world.yaml("retry_interval: 1h", "default: retryable").replace("listen: \"\"", "listen: \"127.0.0.1:0\"");
    let config = outbox_host::config::Config::from_yaml(&yaml, std::iter::empty(), &|_| None).unwrap();
    let mut host = Running::start(config).await;
    host.wait_status(&world, &[&id], Status::Retryable).await;
    let base = format!("http://{}", host.admin.unwrap());
    assert_eq!(get(&format!("{base}/readyz")).await, (200, "ready\n".into()));
    host.stop().await;
}
