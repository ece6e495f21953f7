//! Several hosts on one database cooperate through row locks and leases alone; a killed
//! host loses nothing; a host whose connections are killed recovers by itself.

use std::collections::HashSet;
use std::time::Duration;

use outbox_host::store::{Backend, Status};

use crate::binary::{spawn_host, wait_table};
use crate::support::{Running, TestDb, World, per_backend};

per_backend!(four_hosts_deliver_every_event_exactly_once, a_killed_hosts_rows_are_delivered_after_its_leases_expire);

const EVENTS: usize = 10_000;

async fn four_hosts_deliver_every_event_exactly_once(world: World) {
    let events: Vec<_> =
        (0..EVENTS).map(|i| world.event("RoomGiftSent", &format!("room-{}", i % 500), Status::Pending)).collect();
    for chunk in events.chunks(2_000) {
        world.producer.insert(chunk).await.unwrap();
    }
    // Leases that outlast a loaded machine's waits: a clean run (see sinks.rs).
    let worker = "batch_size: 100\nconcurrency: 16\npartition_lease: 30s";
    let mut hosts = Vec::new();
    for _ in 0..4 {
        hosts.push(Running::start(world.config(worker, "")).await);
    }
    let producer = world.producer.clone();
    hosts[0]
        .wait_for_within("every event delivered", Duration::from_secs(300), || {
            let producer = producer.clone();
            async move { producer.stats().await.unwrap().count(Status::Delivered) == EVENTS as i64 }
        })
        .await;
    for host in hosts {
        host.stop().await;
    }

    let reports = world.collector.reports();
    let unique: HashSet<&str> = reports.iter().map(|r| r.event_id.as_str()).collect();
    assert_eq!(unique.len(), EVENTS, "some events never reached the sink");
    assert_eq!(reports.len(), EVENTS, "{} deliveries for {EVENTS} events: some were delivered twice", reports.len());
    let stats = world.producer.stats().await.unwrap();
    assert_eq!((stats.count(Status::Delivered), stats.count(Status::Delivering)), (EVENTS as i64, 0));
}

/// SIGKILL a real `outbox-host` while it holds leases: a second host delivers those rows
/// once the leases have expired, and nothing is lost.
async fn a_killed_hosts_rows_are_delivered_after_its_leases_expire(world: World) {
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(world.produce("RoomGiftSent", &format!("room-{i}"), Status::Pending).await);
    }
    // Row leases: the claims of `ordering: none` (per-room order leases partitions instead;
    // see partitions.rs).
    let worker = "ordering: none\npublish_timeout: 1s\nbatch_size: 4\nconcurrency: 4\nlease_duration: 6s";
    let sink = "default: sleep:700";
    let mut child = spawn_host(&world, &world.yaml(worker, sink));
    wait_table(&world, "the first host's claim", |s| s.count(Status::Delivering) > 0).await;
    child.kill().unwrap();
    child.wait().unwrap();

    let mut held = Vec::new();
    for id in &ids {
        let row = world.row(id).await;
        if row.status == Status::Delivering {
            held.push((id.clone(), row.lock_until_ms));
        }
    }
    assert!(!held.is_empty(), "the killed host held no lease");

    let mut host = Running::start(world.config(worker, sink)).await;
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    host.wait_status(&world, &refs, Status::Delivered).await;
    host.stop().await;
    for (id, lock_until_ms) in held {
        let delivered_at = world.row(&id).await.delivered_at_ms.unwrap();
        assert!(delivered_at >= lock_until_ms, "{id} was taken over before the dead host's lease ended");
    }
}

#[tokio::test]
async fn postgres_host_survives_its_connections_being_killed() {
    let Some(db) = TestDb::postgres().await else { return };
    survive_connection_kills(World::on(db).await).await;
}

#[tokio::test]
async fn mysql_host_survives_its_connections_being_killed() {
    let Some(db) = TestDb::mysql().await else { return };
    survive_connection_kills(World::on(db).await).await;
}

/// Kills the host's connections from the server side while it delivers.
async fn survive_connection_kills(world: World) {
    const N: usize = 300;
    let events: Vec<_> =
        (0..N).map(|i| world.event("RoomGiftSent", &format!("room-{}", i % 50), Status::Pending)).collect();
    world.producer.insert(&events).await.unwrap();
    let mut host = Running::start(world.config("batch_size: 20", "default: sleep:20")).await;
    let mut killed = 0;
    for round in 1..=3 {
        let producer = world.producer.clone();
        let target = (round * N / 4) as i64;
        host.wait_for("some deliveries", || {
            let producer = producer.clone();
            async move { producer.stats().await.map(|s| s.count(Status::Delivered) >= target).unwrap_or(false) }
        })
        .await;
        killed += kill_connections(&world.db).await;
    }
    assert!(killed > 0, "no connection was killed");
    let producer = world.producer.clone();
    host.wait_for("every event delivered after the kills", || {
        let producer = producer.clone();
        async move { producer.stats().await.map(|s| s.count(Status::Delivered) == N as i64).unwrap_or(false) }
    })
    .await;
    host.stop().await;
    let stats = world.producer.stats().await.unwrap();
    assert_eq!((stats.count(Status::Delivered), stats.count(Status::Delivering)), (N as i64, 0));
    let unique: HashSet<String> = world.collector.reports().into_iter().map(|r| r.event_id).collect();
    assert_eq!(unique.len(), N, "an event never reached the sink");
}

/// Terminates every connection to the test's schema or database; returns how many.
pub(crate) async fn kill_connections(db: &TestDb) -> usize {
    match Backend::from_url(&db.url).unwrap() {
        Backend::Postgres => {
            let admin = sqlx::PgPool::connect(db.server_url()).await.unwrap();
            let killed: Vec<bool> = sqlx::query_scalar(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()",
            )
            .bind(db.name())
            .fetch_all(&admin)
            .await
            .unwrap();
            admin.close().await;
            killed.into_iter().filter(|k| *k).count()
        }
        Backend::Mysql => {
            let admin = sqlx::MySqlPool::connect(db.server_url()).await.unwrap();
            let ids: Vec<i64> = sqlx::query_scalar(
                "SELECT id FROM information_schema.processlist WHERE db = ? AND id <> CONNECTION_ID()",
            )
            .bind(db.name())
            .fetch_all(&admin)
            .await
            .unwrap();
            let mut killed = 0;
            for id in ids {
                if sqlx::query(&format!("KILL CONNECTION {id}")).execute(&admin).await.is_ok() {
                    killed += 1;
                }
            }
            admin.close().await;
            killed
        }
        Backend::Sqlite => 0,
    }
}
