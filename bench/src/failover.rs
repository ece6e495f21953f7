//! How long a SIGKILLed host's events wait before another host delivers them. With row
//! leases that is until the leases expire: the figure engine v3 (partition ownership) is to
//! be measured against.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use outbox_host::store::Backend;

use crate::db::Db;

/// The lease the run uses: the shortest its `batch_size`, `concurrency` and
/// `publish_timeout` allow (`ceil(16 / 16) × 1s + 5s`).
pub const LEASE_MS: u64 = 6_000;

/// What one failover took.
pub struct Failover {
    /// Rows the killed host held leased when it died.
    pub held: usize,
    /// From the kill to the first of them delivered by the other host, ms.
    pub first_ms: f64,
    /// From the kill to the last of them delivered, ms.
    pub all_ms: f64,
}

/// Host A (the release binary) delivers through a slow fake sink until it holds leases; it
/// is SIGKILLed and host B started at once; the time until B delivers A's rows.
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
             lease_duration: {}ms\n  poll_interval: 100ms\nsink:\n  name: fake\n  plugin: \"{}\"\n  config:\n    default: \"sleep:200\"\n\
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
    while db.event_ids_with_status("delivering").await?.len() < 16 {
        if Instant::now() > deadline {
            let _ = a.kill();
            bail!("host A never held 16 leases");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.kill()?;
    let killed = Instant::now();
    a.wait()?;
    let held = db.event_ids_with_status("delivering").await?;
    let mut b = host()?;
    let mut first_ms = None;
    let deadline = Instant::now() + Duration::from_millis(LEASE_MS) + Duration::from_secs(60);
    let all_ms = loop {
        let done = db.delivered_among(&held).await?;
        if done > 0 && first_ms.is_none() {
            first_ms = Some(killed.elapsed().as_secs_f64() * 1_000.0);
        }
        if done == held.len() {
            break killed.elapsed().as_secs_f64() * 1_000.0;
        }
        if Instant::now() > deadline {
            let _ = b.kill();
            bail!("host B delivered {done} of the {} rows host A held", held.len());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    std::process::Command::new("kill").args(["-TERM", &b.id().to_string()]).status()?;
    b.wait()?;
    Ok(Failover { held: held.len(), first_ms: first_ms.unwrap_or(all_ms), all_ms })
}
