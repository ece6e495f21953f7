//! Exactly once through every clean handover: hosts of the real binary started together on
//! a fresh table with a backlog and two sinks, hosts joining and leaving, then all stopped
//! by SIGTERM. Without a fault, each sink receives each event exactly once: a host that
//! gives a partition up has finished and recorded what it read of it before another host
//! reads it.

use std::collections::HashMap;
use std::time::Duration;

use outbox_host::store::Status;
use outbox_test_support::Collector;

use crate::binary::{signal, spawn_on, wait_exit, write_config};
use crate::support::{World, counts, fake_sink_to, per_backend, sink_entry};

per_backend!(
    two_hosts_started_together_and_stopped_deliver_each_event_once_to_each_sink,
    four_hosts_started_together_and_stopped_deliver_each_event_once_to_each_sink
);

const EVENTS: usize = 2_000;

async fn two_hosts_started_together_and_stopped_deliver_each_event_once_to_each_sink(world: World) {
    hosts_together(world, 2).await;
}

async fn four_hosts_started_together_and_stopped_deliver_each_event_once_to_each_sink(world: World) {
    hosts_together(world, 4).await;
}

/// `hosts` processes started at once on a table with two sinks, the events written while
/// they split the partitions among themselves (a backlog first, then more in chunks); once
/// a third of them are delivered, one host is stopped by SIGTERM mid-drain (its partitions
/// go to the others), and once both sinks have every event, the rest. Each sink's collector
/// counts every attempt: each event exactly once.
async fn hosts_together(world: World, hosts: usize) {
    let second = Collector::start().await;
    let yaml = world
        .setup("concurrency: 16\nbatch_size: 100", "")
        .with_sinks(vec![sink_entry(&fake_sink_to("b", &second, ""), "start_from: beginning")])
        .yaml();
    let mut events = world.produce_many(EVENTS / 4, Status::Pending).await;
    let config = write_config(&world, &yaml);
    let mut children: Vec<_> = (0..hosts).map(|_| spawn_on(&config, &[], &[])).collect();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        events.extend(world.produce_many(EVENTS / 4, Status::Pending).await);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    let mut logs = Vec::new();
    let mut left_early = false;
    loop {
        let (a, b) = (counts(&world.collector), counts(&second));
        if !left_early && a.len() >= EVENTS / 3 {
            left_early = true;
            let leaving = children.remove(0);
            signal(&leaving, "TERM");
            let output = wait_exit(leaving).await;
            let log = String::from_utf8_lossy(&output.stderr).into_owned();
            assert_eq!(output.status.code(), Some(0), "log:\n{log}");
            logs.push(log);
        }
        let delivered = world.producer.stats().await.unwrap().count(Status::Delivered);
        if a.len() == EVENTS && b.len() == EVENTS && delivered == EVENTS as i64 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "sink a has {} of {EVENTS}, sink b {}", a.len(), b.len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for child in &children {
        signal(child, "TERM");
    }
    for child in children {
        let output = wait_exit(child).await;
        let log = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(0), "log:\n{log}");
        logs.push(log);
    }
    for (sink, seen) in [("a", counts(&world.collector)), ("b", counts(&second))] {
        let twice: HashMap<&String, &usize> = seen.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "{hosts} hosts: sink {sink} received {} event(s) more than once: {twice:?}\nlogs:\n{}",
            twice.len(),
            logs.join("\n---\n")
        );
        for e in &events {
            assert_eq!(seen.get(&e.event_id), Some(&1), "sink {sink}: {}", e.event_id);
        }
    }
}
