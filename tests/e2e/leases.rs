//! A host that crashed left a row `delivering`; once its lease is over, a worker delivers
//! it. (The lease and fencing rules themselves are in the store conformance suite.)

use outbox_host::store::{Status, now_ms};

use crate::support::{Running, World, per_backend};

per_backend!(
    worker_delivers_a_row_whose_lease_expired;
    servers: a_host_whose_clock_runs_ahead_takes_no_live_lease,
    the_database_clock_is_read_without_the_wait_for_a_connection
);

async fn worker_delivers_a_row_whose_lease_expired(world: World) {
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let past = now_ms() - 120_000;
    world.producer.claim("crashed-host", past, past + 1_000, 10).await.unwrap();
    assert_eq!(world.row(&id).await.status, Status::Delivering);

    let mut host = Running::start(world.config("", "")).await;
    host.wait_status(&world, &[&id], Status::Delivered).await;
    host.stop().await;
    assert_eq!(world.collector.attempts_of(&id).len(), 1);
}

/// A second host whose own clock runs a minute ahead (under `faketime`) starts while the
/// first delivers and holds every partition's lease: it judges the leases by the database's
/// clock, so it takes no partition before the first gives it up, and each event is
/// attempted once.
async fn a_host_whose_clock_runs_ahead_takes_no_live_lease(world: World) {
    use std::time::Duration;
    let ids: Vec<String> = {
        let mut ids = Vec::new();
        for i in 0..8 {
            ids.push(world.produce("RoomGiftSent", &format!("room-{i}"), Status::Pending).await);
        }
        ids
    };
    let setup = world.setup("publish_timeout: 5s\nbatch_size: 10\nconcurrency: 4", "default: sleep:2500");
    let mut first = Running::start(setup.parse()).await;
    first
        .wait_for("the first host to have four deliveries in flight", || async { world.collector.reports().len() >= 4 })
        .await;
    let config = crate::binary::write_config(&world, &setup.yaml());
    // libfaketime preloaded into the host itself (the `faketime` wrapper would stand between
    // the test and the host's signals).
    let ahead = std::process::Command::new(crate::binary::BIN)
        .arg("--config")
        .arg(&config)
        .arg("run")
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME", "+60s")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map(crate::binary::HostProcess::new)
        .unwrap();
    first
        .wait_for_within("every event delivered", Duration::from_secs(60), || async {
            world.producer.stats().await.unwrap().count(Status::Delivered) == 8
        })
        .await;
    crate::binary::signal(&ahead, "TERM");
    let out = crate::binary::wait_exit(ahead).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("this host's clock and the database's differ by more than a second"), "{stderr}");
    first.stop().await;
    for id in &ids {
        assert_eq!(world.collector.attempts_of(id).len(), 1, "{id} was attempted twice: a live lease was taken");
    }
}

/// Debian's libfaketime (`make test` installs the faketime package).
fn libfaketime() -> String {
    let found =
        ["/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1", "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists());
    found.expect("libfaketime is missing: apt-get install faketime (make test does)").to_string()
}

/// A host reads the database's clock through its pool; behind a backlog every connection
/// may be busy. The wait for one is not a round trip: with the pool's only connection held
/// for 1.5 s (its statement blocked behind a lock another session holds), the offset read
/// stays near the true one (0: the database runs on this machine's clock), where counting
/// the wait would put it about 750 ms ahead, and a host that far ahead takes a lease early.
async fn the_database_clock_is_read_without_the_wait_for_a_connection(world: World) {
    use sqlx::Connection as _;
    use std::time::Duration;
    let store = outbox_host::store::open(&world.db_url(), 1, "room_outbox").await.unwrap();
    let url = world.db_url();
    let (locked, lock) = tokio::sync::oneshot::channel();
    // Another session takes the table for 1.5 s; the store's one connection waits on it.
    let hold = async {
        if url.starts_with("postgres") {
            let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
            let mut tx = c.begin().await.unwrap();
            sqlx::query("LOCK TABLE room_outbox IN ACCESS EXCLUSIVE MODE").execute(&mut *tx).await.unwrap();
            locked.send(()).unwrap();
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            tx.commit().await.unwrap();
        } else {
            let mut c = sqlx::MySqlConnection::connect(&url).await.unwrap();
            sqlx::raw_sql("LOCK TABLES room_outbox WRITE").execute(&mut c).await.unwrap();
            locked.send(()).unwrap();
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            sqlx::raw_sql("UNLOCK TABLES").execute(&mut c).await.unwrap();
        }
    };
    let measure = async {
        lock.await.unwrap();
        let blocked = tokio::spawn({
            let store = store.clone();
            async move { store.stats().await.map(drop) }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let clock = outbox_host::engine::dbclock::DbClock::default();
        let started = std::time::Instant::now();
        clock.sync(store.as_ref()).await;
        let waited = started.elapsed();
        let offset = clock.now_ms() - outbox_host::clock::now_ms();
        blocked.await.unwrap().unwrap();
        (waited, offset)
    };
    let ((), (waited, offset)) = tokio::join!(hold, measure);
    assert!(waited >= Duration::from_millis(1_000), "the read did not wait for the connection ({waited:?})");
    assert!(offset.abs() < 300, "the offset read is {offset} ms after waiting {waited:?} for the pool's connection");
}
