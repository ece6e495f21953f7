//! PostgreSQL's own floor, measured with a plain client in the same run: `pgbench` claims
//! 1,000 rows with `FOR UPDATE SKIP LOCKED` and marks them delivered, each statement
//! committed, until the table is drained. The table is analyzed first, so the floor gets the
//! planner's best plan (a conservative floor: the host's drains run on fresh statistics).

use std::time::Instant;

use anyhow::ensure;
use outbox_host::store::{Backend, Status};

use crate::db::Db;

const SCRIPT: &str = "\
UPDATE room_outbox AS o SET status = 'delivering', worker_id = 'floor', lock_until_ms = 1 \
  FROM (SELECT id FROM room_outbox WHERE status = 'pending' ORDER BY created_at_ms, id LIMIT 1000 FOR UPDATE SKIP LOCKED) AS p \
  WHERE o.id = p.id;
UPDATE room_outbox SET status = 'delivered', worker_id = NULL, lock_until_ms = 0, delivered_at_ms = 1 \
  WHERE status = 'delivering' AND worker_id = 'floor';
";

/// Rows per second `pgbench` drains `n` pending rows at (`n` a multiple of 1,000).
pub async fn pgbench(n: usize) -> anyhow::Result<f64> {
    let db = Db::fresh(Backend::Postgres).await?;
    let store = db.open().await?;
    crate::fill(store.as_ref(), n, 1_000).await?;
    let pool = sqlx::PgPool::connect(db.url()).await?;
    sqlx::query("ANALYZE room_outbox").execute(&pool).await?;
    pool.close().await;
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("claim_and_mark.sql");
    std::fs::write(&script, SCRIPT)?;
    let started = Instant::now();
    let out = std::process::Command::new("pgbench")
        .args(["-n", "-c", "1", "-t", &(n / 1_000).to_string(), "-f"])
        .arg(&script)
        .arg(db.url())
        .output()?;
    let seconds = started.elapsed().as_secs_f64();
    ensure!(out.status.success(), "pgbench failed: {}", String::from_utf8_lossy(&out.stderr));
    let stats = store.stats().await?;
    ensure!(stats.count(Status::Delivered) == n as i64, "pgbench left rows undelivered: {stats:?}");
    store.close().await;
    Ok(n as f64 / seconds)
}
