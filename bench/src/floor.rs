//! PostgreSQL's own floors, measured with a plain client in the same run: `pgbench` claims
//! 1,000 rows with `FOR UPDATE SKIP LOCKED` and marks them delivered, each statement
//! committed, until the table is drained. The table is analyzed first, so the floor gets the
//! planner's best plan (a conservative floor: the host's drains run on fresh statistics).
//! [`pgbench`] runs on the host's own table; [`lean`] on a lean table with only a primary key,
//! a unique `event_id` and one claim index: what a claim and a mark cost with nothing else.

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
    let seconds = run(&db, SCRIPT, n)?;
    let stats = store.stats().await?;
    ensure!(stats.count(Status::Delivered) == n as i64, "pgbench left rows undelivered: {stats:?}");
    store.close().await;
    Ok(n as f64 / seconds)
}

/// The lean floor's table: a primary key, a unique event id, one partial claim index.
const LEAN_TABLE: &str = "\
CREATE TABLE lean_outbox (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL DEFAULT 'pending',
    envelope BYTEA NOT NULL,
    created_at_ms BIGINT NOT NULL,
    worker_id TEXT,
    lock_until_ms BIGINT NOT NULL DEFAULT 0,
    delivered_at_ms BIGINT
);
CREATE INDEX lean_outbox_claim_idx ON lean_outbox (created_at_ms, id) WHERE status = 'pending';";

const LEAN_SCRIPT: &str = "\
UPDATE lean_outbox AS o SET status = 'delivering', worker_id = 'floor', lock_until_ms = 1 \
  FROM (SELECT id FROM lean_outbox WHERE status = 'pending' ORDER BY created_at_ms, id LIMIT 1000 FOR UPDATE SKIP LOCKED) AS p \
  WHERE o.id = p.id;
UPDATE lean_outbox SET status = 'delivered', worker_id = NULL, lock_until_ms = 0, delivered_at_ms = 1 \
  WHERE status = 'delivering' AND worker_id = 'floor';
";

/// The lean floor's rate, and the WAL it wrote per row.
pub struct Lean {
    pub rate: f64,
    pub wal_bytes_per_row: f64,
}

/// Rows per second `pgbench` drains `n` pending rows of the lean table at (`n` a multiple of
/// 1,000), with envelopes the size of the benchmark's events.
pub async fn lean(n: usize) -> anyhow::Result<Lean> {
    let db = Db::fresh(Backend::Postgres).await?;
    let pool = sqlx::PgPool::connect(db.url()).await?;
    sqlx::raw_sql(LEAN_TABLE).execute(&pool).await?;
    let envelope_bytes = crate::events("lean", 1, 1)[0].envelope.len() as i64;
    sqlx::query(
        "INSERT INTO lean_outbox (event_id, envelope, created_at_ms) \
         SELECT 'lean-' || i, decode(repeat('ab', $2::INT), 'hex'), 1 FROM generate_series(1, $1::INT) i",
    )
    .bind(n as i64)
    .bind(envelope_bytes)
    .execute(&pool)
    .await?;
    sqlx::query("ANALYZE lean_outbox").execute(&pool).await?;
    let wal = || async {
        sqlx::query_scalar::<_, i64>("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::BIGINT")
            .fetch_one(&pool)
            .await
    };
    let wal_before = wal().await?;
    let seconds = run(&db, LEAN_SCRIPT, n)?;
    let wal_after = wal().await?;
    let delivered: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM lean_outbox WHERE status = 'delivered'").fetch_one(&pool).await?;
    ensure!(delivered == n as i64, "pgbench left lean rows undelivered: {delivered} of {n}");
    pool.close().await;
    Ok(Lean { rate: n as f64 / seconds, wal_bytes_per_row: (wal_after - wal_before) as f64 / n as f64 })
}

/// Runs `script` with `pgbench` on one connection, once per 1,000 of `n` rows; its seconds.
fn run(db: &Db, script: &str, n: usize) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("claim_and_mark.sql");
    std::fs::write(&path, script)?;
    let started = Instant::now();
    let out = std::process::Command::new("pgbench")
        .args(["-n", "-c", "1", "-t", &(n / 1_000).to_string(), "-f"])
        .arg(&path)
        .arg(db.url())
        .output()?;
    let seconds = started.elapsed().as_secs_f64();
    ensure!(out.status.success(), "pgbench failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(seconds)
}
