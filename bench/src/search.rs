//! What the console's searches cost on a large outbox: `--search-rows` rows (1,000,000)
//! over 1,000 rooms and the seed's event types, created a second apart, 98 % delivered, 1 %
//! failed and 1 % pending (as a table with a purge of a few weeks holds them); then each
//! search `/api/events` and the search page make, through the store, five times, in the first
//! sink's state. The figure is the median and the slowest of the five, in milliseconds. On
//! PostgreSQL the table is analyzed after it is filled, as autovacuum would soon do.

use std::time::Instant;

use outbox_host::store::{Backend, Cursor, NewEvent, Search, Status, Store};
use serde_json::json;

use crate::db::{self, Db};
use crate::{Args, Report};

/// The seed's event types, which the rows take in turn.
const TYPES: [&str; 5] = ["RoomGiftSent", "RoomMicChanged", "RoomUserJoined", "RoomUserLeft", "RoomClosed"];

/// Fills the outbox with `n` rows; the newest is created at `newest_ms`.
async fn fill(store: &dyn Store, n: usize, newest_ms: i64) -> anyhow::Result<()> {
    let event = |i: usize| NewEvent {
        app_code: "app-1".into(),
        event_id: format!("evt-{i:08}"),
        event_type: TYPES[i % TYPES.len()].into(),
        room_id: format!("room-{}", i % 1_000),
        status: match i % 100 {
            0 => Status::Failed,
            1 => Status::Pending,
            _ => Status::Delivered,
        },
        envelope: vec![0x0a, 0x05, b'a', b'p', b'p', b'-', b'1'],
        created_at_ms: newest_ms - (n - i) as i64 * 1_000,
        trace_context: None,
    };
    let mut i = 0;
    while i < n {
        let chunk: Vec<NewEvent> = (i..(i + 5_000).min(n)).map(event).collect();
        store.insert(&chunk).await?;
        i += chunk.len();
    }
    Ok(())
}

/// The searches timed, by name.
fn searches(n: usize, newest_ms: i64) -> Vec<(&'static str, Search)> {
    let page = |search: Search| Search { limit: 50, ..search };
    let hour_ago = newest_ms - (n as i64 / 2) * 1_000;
    vec![
        ("event id", page(Search { event_id: Some(format!("evt-{:08}", n / 2)), ..Search::default() })),
        ("room", page(Search { room_id: Some("room-500".into()), ..Search::default() })),
        ("type", page(Search { event_type: Some("RoomUserLeft".into()), ..Search::default() })),
        ("status failed", page(Search { statuses: vec![Status::Failed], ..Search::default() })),
        (
            "status pending + retryable",
            page(Search { statuses: vec![Status::Pending, Status::Retryable], ..Search::default() }),
        ),
        ("status delivered", page(Search { statuses: vec![Status::Delivered], ..Search::default() })),
        (
            "an hour, mid-table",
            page(Search { from_ms: Some(hour_ago - 3_600_000), to_ms: Some(hour_ago), ..Search::default() }),
        ),
        (
            "room + failed",
            page(Search { room_id: Some("room-500".into()), statuses: vec![Status::Failed], ..Search::default() }),
        ),
        (
            "type + failed + a day",
            page(Search {
                event_type: Some("RoomGiftSent".into()),
                statuses: vec![Status::Failed],
                from_ms: Some(hour_ago - 86_400_000),
                to_ms: Some(hour_ago),
                ..Search::default()
            }),
        ),
        ("everything, newest first", page(Search::default())),
    ]
}

/// Times one search five times (and its next page, when it has one), in milliseconds.
async fn time(store: &dyn Store, search: &Search) -> anyhow::Result<(f64, f64, usize, Option<Cursor>)> {
    let mut took = Vec::new();
    let mut found = None;
    for _ in 0..5 {
        let start = Instant::now();
        let page = store.search(search).await?;
        took.push(start.elapsed().as_secs_f64() * 1_000.0);
        found = Some(page);
    }
    took.sort_by(f64::total_cmp);
    let page = found.unwrap_or_default();
    Ok((took[2], took[4], page.rows.len(), page.next))
}

/// The searches on a table of `args.search_rows` rows.
pub(crate) async fn search_timings(r: &mut Report, backend: Backend, args: &Args) -> anyhow::Result<()> {
    let name = db::name(backend);
    let n = args.search_rows;
    let db = Db::fresh(backend).await?;
    let store = db.open().await?;
    let newest_ms = outbox_host::store::now_ms();
    eprintln!("{name}: search, filling {n} rows …");
    let start = Instant::now();
    fill(store.as_ref(), n, newest_ms).await?;
    if backend == Backend::Postgres {
        // What autovacuum does to a table this size soon after: the planner's statistics.
        // Without them it guessed a second page's plan from an empty table's (300-880 ms).
        let pool = sqlx::PgPool::connect(db.url()).await?;
        sqlx::query("ANALYZE room_outbox").execute(&pool).await?;
        pool.close().await;
    }
    eprintln!("{name}: filled in {:.0} s; searching …", start.elapsed().as_secs_f64());
    let mut timings = Vec::new();
    for (what, search) in searches(n, newest_ms) {
        let (median, slowest, rows, next) = time(store.as_ref(), &search).await?;
        // The next page of the same search, as the page's link asks it.
        let next_ms = match next {
            Some(cursor) => Some(time(store.as_ref(), &Search { cursor: Some(cursor), ..search.clone() }).await?.0),
            None => None,
        };
        let next_text = next_ms.map_or("-".to_string(), |ms| format!("{ms:.1}"));
        r.table.push([
            name.into(),
            format!("search: {what}"),
            format!("{rows}"),
            format!("{:.3}", median / 1_000.0),
            format!("median {median:.1} ms, slowest {slowest:.1} ms, next page {next_text} ms (of {n} rows)"),
        ]);
        timings.push(json!({
            "search": what, "rows": rows, "median_ms": median, "slowest_ms": slowest, "next_page_ms": next_ms,
        }));
    }
    r.results.push(json!({ "backend": name, "search": { "table_rows": n, "timings": timings } }));
    Ok(())
}
