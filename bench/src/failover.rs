//! How long a SIGKILLed owner's rooms wait before another host delivers them: until its
//! partition leases run out (per-room order, the default), then a heartbeat of the other.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use outbox_host::store::Backend;

use crate::db::Db;

/// The partition lease the run uses: the shortest its `publish_timeout` allows
/// (`2 × (1s + 1s)`).
pub const LEASE_MS: u64 = 4_000;

/// What one failover took.
pub struct Failover {
    /// Rows the killed host had not finished when it died.
    pub held: usize,
    /// From the kill to the first of them delivered by the other host, ms.
    pub first_ms: f64,
}

/// Host A (the release binary) delivers through a slow fake sink, owning every partition;
/// it is SIGKILLed and host B started at once; the time until B delivers A's rows.
pub async fn measure(backend: Backend) -> anyhow::Result<Failover> {
    let binary = std::env::current_exe()?.with_file_name("outbox-host");
    ensure!(binary.exists(), "{} is missing: build it with `cargo build --release -p outbox-host`", binary.display());
    let db = Db::fresh(backend).await?;
    let producer = db.open().await?;
    crate::fill(producer.as_ref(), 2_000, 100).await?;
    producer.close().await;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("outbox.yaml");
    std::fs::write(
        &config,
        format!(
            "database:\n  url: \"{}\"\noutbox_worker:\n  batch_size: 16\n  concurrency: 16\n  publish_timeout: 1s\n  \
             partition_lease: {}ms\n  poll_interval: 100ms\nsink:\n  name: fake\n  plugin: \"{}\"\n  config:\n    default: \"sleep:200\"\n\
             admin:\n  listen: \"\"\nlog:\n  level: warn\n",
            db.url(),
            LEASE_MS,
            outbox_test_support::FAKE_SINK
        ),
    )?;
    let host = || {
        std::process::Command::new(&binary)
            .args(["--config", config.to_str().unwrap(), "run"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
    };
    let mut a = host()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.event_ids_with_status("delivered").await?.len() < 32 {
        if Instant::now() > deadline {
            let _ = a.kill();
            bail!("host A never delivered");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.kill()?;
    let killed = Instant::now();
    a.wait()?;
    let held = db.event_ids_with_status("pending").await?;
    let mut b = host()?;
    let deadline = Instant::now() + Duration::from_millis(LEASE_MS) + Duration::from_secs(60);
    let first_ms = loop {
        let done = db.delivered_among(&held).await?;
        if done > 0 {
            break killed.elapsed().as_secs_f64() * 1_000.0;
        }
        if Instant::now() > deadline {
            let _ = b.kill();
            bail!("host B delivered none of the {} rows host A left", held.len());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    std::process::Command::new("kill").args(["-TERM", &b.id().to_string()]).status()?;
    b.wait()?;
    Ok(Failover { held: held.len(), first_ms })
}
