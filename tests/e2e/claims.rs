//! The row claim of `ordering: none` (per-room order is kept by partition ownership, not by
//! claims). PostgreSQL's claim function stays on the claim index when the table's
//! statistics are stale after a burst of inserts, as its plan shows, and leases a claim's
//! rows reading about as many index entries as it takes.

use outbox_host::store::Status;
use sqlx::Row as _;

use crate::support::{TestDb, World};

/// The claim function's statement with its parameters filled in, explained under the
/// planner settings the function carries.
async fn plan(pool: &sqlx::PgPool, body: &str, settings: &[String]) -> String {
    let statement = body
        .trim()
        .trim_end_matches(';')
        .replace("p_worker_id", "'w'")
        .replace("p_lock_until_ms", "0")
        .replace("p_now_ms", "0")
        .replace("p_limit", "100");
    explain(pool, settings, &statement).await
}

/// `EXPLAIN (COSTS OFF) statement` in a transaction with `settings` (`name=value`) set;
/// rolled back.
async fn explain(pool: &sqlx::PgPool, settings: &[String], statement: &str) -> String {
    let mut tx = pool.begin().await.unwrap();
    for setting in settings {
        let (name, value) = setting.split_once('=').unwrap();
        sqlx::query(&format!("SET LOCAL {name} = {value}")).execute(&mut *tx).await.unwrap();
    }
    let lines: Vec<String> = sqlx::raw_sql(&format!("EXPLAIN (COSTS OFF) {statement}"))
        .fetch_all(&mut *tx)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<String, _>(0))
        .collect();
    tx.rollback().await.unwrap();
    lines.join("\n")
}

/// `n` waiting events over `rooms` rooms taking turns, an hour old, a millisecond apart.
fn spread(world: &World, n: usize, rooms: usize) -> Vec<outbox_host::store::NewEvent> {
    let base = outbox_host::store::now_ms() - 3_600_000;
    (0..n)
        .map(|i| outbox_host::store::NewEvent {
            created_at_ms: base + i as i64,
            ..world.event("RoomGiftSent", &format!("room-{}", i % rooms), Status::Pending)
        })
        .collect()
}

#[tokio::test]
async fn postgres_claims_walk_the_claim_index_when_statistics_are_stale() {
    let Some(db) = TestDb::postgres().await else { return };
    let world = World::on(db).await;
    let pool = sqlx::PgPool::connect(&world.db_url()).await.unwrap();
    // Statistics taken while the table was empty, then a burst: what an outage's backlog
    // looks like to the planner.
    sqlx::query("ALTER TABLE room_outbox SET (autovacuum_enabled = false)").execute(&pool).await.unwrap();
    sqlx::query("ANALYZE room_outbox").execute(&pool).await.unwrap();
    let events = spread(&world, 20_000, 500);
    for chunk in events.chunks(2_000) {
        world.producer.insert(chunk).await.unwrap();
    }
    let (body, settings) = sqlx::query_as::<_, (String, Vec<String>)>(
        "SELECT prosrc, proconfig FROM pg_proc WHERE proname = 'room_outbox_claim' \
         AND pronamespace = current_schema()::regnamespace",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(settings, ["enable_sort=off", "enable_bitmapscan=off"].map(String::from));
    let pinned = plan(&pool, &body, &settings).await;
    assert!(pinned.contains("Index Scan using room_outbox_claim_idx"), "{pinned}");
    for reads_all in ["Sort", "Seq Scan", "Bitmap"] {
        assert!(!pinned.contains(reads_all), "the claim reads every claimable row ({reads_all}):\n{pinned}");
    }
    assert!(pinned.contains("Index Scan using room_outbox_pkey on room_outbox o"), "updated by key:\n{pinned}");

    // And the claim itself: one statement, in creation order.
    let now = outbox_host::store::now_ms();
    let claimed = world.producer.claim("w", now, now + 60_000, 100).await.unwrap();
    let ids: Vec<&str> = claimed.iter().map(|c| c.event_id.as_str()).collect();
    let expected: Vec<&str> = events[..100].iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids, expected);
}

/// A claim of 100 on 20,000 waiting rows with stale statistics leases the first 100 events
/// reading about as many of the primary key (never a scan of the key to find the rows).
#[tokio::test]
async fn postgres_a_claim_on_a_full_table_reads_about_what_it_takes() {
    let Some(db) = TestDb::postgres().await else { return };
    let world = World::on(db).await;
    let pool = sqlx::PgPool::connect(&world.db_url()).await.unwrap();
    sqlx::query("ALTER TABLE room_outbox SET (autovacuum_enabled = false)").execute(&pool).await.unwrap();
    sqlx::query("ANALYZE room_outbox").execute(&pool).await.unwrap();
    let now = outbox_host::store::now_ms();
    let claim = "SELECT event_id FROM room_outbox_claim('w', $1, $2, 100)";
    let mut conn = pool.acquire().await.unwrap();
    let none: Vec<String> = sqlx::query_scalar(claim).bind(now + 60_000).bind(now).fetch_all(&mut *conn).await.unwrap();
    assert!(none.is_empty());

    let events = spread(&world, 20_000, 500);
    for chunk in events.chunks(2_000) {
        world.producer.insert(chunk).await.unwrap();
    }
    let before = crate::support::entries_read(&mut conn, "room_outbox_pkey", None).await;
    let claimed: Vec<String> =
        sqlx::query_scalar(claim).bind(now + 60_000).bind(now).fetch_all(&mut *conn).await.unwrap();
    let after = crate::support::entries_read(&mut conn, "room_outbox_pkey", Some(before)).await;
    let first: Vec<&str> = events[..100].iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(claimed, first, "the first 100 events");
    assert!(after - before <= 300, "{} primary key entries read to lease 100 of 20,000 rows", after - before);
}
