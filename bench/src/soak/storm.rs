//! The kill storm (`outbox-soak --storm`): the load under which room order once broke on
//! MariaDB. Four hosts and two sinks; 20,000 events written in ten chunks one second apart,
//! each chunk 2,000 events over its own 100 rooms as two 1,000-row inserts, created at the
//! chunk's start plus the event's index in ms (up to 2 s ahead of the database's clock, as a
//! producer whose clock runs ahead writes them); and meanwhile a random host SIGKILLed, and
//! started again at once as a supervisor would, every 1 to 1.6 s for 20 s.

use std::time::{Duration, Instant};

use outbox_host::store::now_ms;

use super::{Produced, SinkReport, Soak, event};

pub const CHUNKS: usize = 10;
pub const CHUNK_EVENTS: usize = 2_000;
pub const CHUNK_ROOMS: usize = 100;
/// Rows per insert statement (each its own transaction).
const PER_INSERT: usize = 1_000;
const STORM: Duration = Duration::from_secs(20);
/// The fewest kills a storm must have made for its figures to count.
pub const MIN_KILLS: usize = 12;

impl Soak {
    /// One storm with the kills drawn from `seed`.
    pub async fn storm(mut self, seed: u64) -> anyhow::Result<Vec<SinkReport>> {
        let two = self.config(2)?;
        println!("   migrate: {}", self.cli(&two, &["migrate"])?.replace('\n', "; "));
        let producer = outbox_host::store::open(&self.db.url, 4, "room_outbox").await?;
        for i in 0..self.args.hosts {
            self.start_host(i, &two)?;
        }
        let writing = tokio::spawn(produce_chunks(self.db.url.clone()));
        let started = Instant::now();
        let mut draw = Draw(seed | 1);
        loop {
            let pause = Duration::from_millis(1_000 + draw.below(600));
            if started.elapsed() + pause > STORM {
                break;
            }
            tokio::time::sleep(pause).await;
            let i = draw.below(self.args.hosts as u64) as usize;
            self.kill_host(i);
            self.start_host(i, &two)?;
        }
        println!(
            "   {:5.1}s {} SIGKILLs (each host started again at once)",
            started.elapsed().as_secs_f64(),
            self.kills
        );
        anyhow::ensure!(
            self.kills >= MIN_KILLS,
            "only {} kills in the storm (at least {MIN_KILLS} wanted)",
            self.kills
        );
        let produced = writing.await??;
        println!("   the producer wrote {} events", produced.len());
        let drained = self.drain(&producer, &produced).await;
        for i in 0..self.hosts.len() {
            self.stop_host(i).await;
        }
        drained?;
        let report = self.report(&producer, &produced, None).await?;
        self.keep_logs()?;
        producer.close().await;
        Ok(report)
    }
}

/// Writes the storm's chunks, one second apart, each as [`PER_INSERT`]-row `INSERT`
/// statements (each its own transaction) on a connection of its own.
async fn produce_chunks(url: String) -> anyhow::Result<Vec<Produced>> {
    let postgres = url.starts_with("postgres");
    let mut produced = Vec::with_capacity(CHUNKS * CHUNK_EVENTS);
    let mut rows = Vec::with_capacity(CHUNK_EVENTS);
    let (pg, my) = if postgres {
        (Some(sqlx::PgPool::connect(&url).await?), None)
    } else {
        (None, Some(sqlx::MySqlPool::connect(&url).await?))
    };
    let param = |n: usize| if postgres { format!("${n}") } else { "?".to_string() };
    let sql = outbox_producer::sql::insert("room_outbox", PER_INSERT, param);
    let started = Instant::now();
    for chunk in 0..CHUNKS {
        tokio::time::sleep(Duration::from_secs(chunk as u64).saturating_sub(started.elapsed())).await;
        let start = now_ms();
        rows.clear();
        for i in 0..CHUNK_EVENTS {
            let (row, p) = event(chunk * CHUNK_ROOMS + i % CHUNK_ROOMS, i / CHUNK_ROOMS, start + i as i64);
            rows.push(row);
            produced.push(p);
        }
        for statement in rows.chunks(PER_INSERT) {
            macro_rules! insert {
                ($pool:expr) => {{
                    let mut q = sqlx::query(&sql);
                    for e in statement {
                        q = q
                            .bind(e.app_code.clone())
                            .bind(e.event_id.clone())
                            .bind(e.event_type.clone())
                            .bind(e.room_id.clone())
                            .bind(e.status.as_str().to_string())
                            .bind(e.envelope.clone())
                            .bind(e.created_at_ms)
                            .bind(e.trace_context.clone());
                    }
                    q.execute($pool).await?;
                }};
            }
            match (&pg, &my) {
                (Some(pool), _) => insert!(pool),
                (_, Some(pool)) => insert!(pool),
                _ => unreachable!("one pool is open"),
            }
        }
    }
    Ok(produced)
}

/// A small seeded generator (xorshift): the same seed kills the same hosts at the same times.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}
