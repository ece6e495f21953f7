//! Taking over room-service's own outbox table: made by its Go code, full of live rows in
//! every status, with the column types a Go developer picks. `migrate` adopts it, `run`
//! delivers exactly the claimable rows, and a column that cannot work is refused with the
//! statement that would fix it, before anything changes.

use outbox_host::store::{Held, NewEvent, Status, now_ms};

use crate::support::{Running, World, per_backend};

per_backend!(
    a_go_made_table_is_adopted_and_only_its_claimable_rows_are_delivered,
    a_column_that_cannot_work_is_refused_and_the_table_left_untouched,
    the_producer_crate_works_on_an_adopted_table,
    readiness_tells_the_truth_on_an_adopted_table,
    run_lists_every_problem_of_a_table_changed_after_migrate,
    an_adopted_table_is_claimed_and_delivered_in_each_rooms_order,
    a_second_sink_on_an_adopted_table_gets_every_event_once_in_each_rooms_order,
    a_table_of_the_development_versions_is_adopted_in_place,
    an_applied_migration_that_changed_is_refused_by_name
);

const TABLE: &str = "go_outbox";

/// The table as room-service's Go code would create it from its `Record` (the assumption
/// these tests make): no `id` (the event id is the key), none of the host's own
/// `updated_at_ms` / `delivered_at_ms`, unsigned milliseconds and counters on MySQL, a binary
/// collation and a `VARBINARY` room id, `NOT NULL DEFAULT ''` strings, a `last_error`
/// shorter than the host's, a `LONGBLOB` envelope, and its own index on `(status,
/// created_at_ms)`. `status` is declared `status_type`.
fn go_ddl(url: &str, status_type: &str) -> String {
    if url.starts_with("mysql") {
        format!(
            "CREATE TABLE {TABLE} (
                app_code         VARCHAR(32)  NOT NULL DEFAULT '',
                event_id         VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
                event_type       VARCHAR(64)  NOT NULL,
                room_id          VARBINARY(64) NOT NULL,
                status           {status_type} NOT NULL DEFAULT 'pending',
                envelope         LONGBLOB     NOT NULL,
                created_at_ms    BIGINT UNSIGNED NOT NULL,
                retry_count      INT UNSIGNED NOT NULL DEFAULT 0,
                last_error       VARCHAR(255) NOT NULL DEFAULT '',
                worker_id        VARCHAR(128) NOT NULL DEFAULT '',
                lock_until_ms    BIGINT UNSIGNED NOT NULL DEFAULT 0,
                next_retry_at_ms BIGINT UNSIGNED NOT NULL DEFAULT 0,
                PRIMARY KEY (event_id),
                KEY idx_{TABLE}_status_created (status, created_at_ms)
            ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci"
        )
    } else if url.starts_with("postgres") {
        format!(
            "CREATE TABLE {TABLE} (
                app_code TEXT NOT NULL DEFAULT '', event_id TEXT PRIMARY KEY, event_type TEXT NOT NULL,
                room_id TEXT NOT NULL, status {status_type} NOT NULL DEFAULT 'pending', envelope BYTEA NOT NULL,
                created_at_ms BIGINT NOT NULL, retry_count BIGINT NOT NULL DEFAULT 0,
                last_error TEXT NOT NULL DEFAULT '', worker_id TEXT NOT NULL DEFAULT '',
                lock_until_ms BIGINT NOT NULL DEFAULT 0, next_retry_at_ms BIGINT NOT NULL DEFAULT 0);
             CREATE INDEX idx_{TABLE}_status_created ON {TABLE} (status, created_at_ms)"
        )
    } else {
        format!(
            "CREATE TABLE {TABLE} (
                app_code TEXT NOT NULL DEFAULT '', event_id TEXT PRIMARY KEY, event_type TEXT NOT NULL,
                room_id TEXT NOT NULL, status {status_type} NOT NULL DEFAULT 'pending', envelope BLOB NOT NULL,
                created_at_ms INTEGER NOT NULL, retry_count INTEGER NOT NULL DEFAULT 0,
                last_error TEXT NOT NULL DEFAULT '', worker_id TEXT NOT NULL DEFAULT '',
                lock_until_ms INTEGER NOT NULL DEFAULT 0, next_retry_at_ms INTEGER NOT NULL DEFAULT 0);
             CREATE INDEX idx_{TABLE}_status_created ON {TABLE} (status, created_at_ms)"
        )
    }
}

/// One live row as room-service left it.
struct GoRow {
    event_id: &'static str,
    room: &'static str,
    status: &'static str,
    age_ms: i64,
    retry_count: i64,
    last_error: &'static str,
    worker_id: &'static str,
    lock_until_in_ms: i64,
    next_retry_in_ms: i64,
}

const HOUR: i64 = 3_600_000;

/// A row in `status`, created `age_ms` ago, never failed, held by nobody.
fn go_row(event_id: &'static str, room: &'static str, status: &'static str, age_ms: i64) -> GoRow {
    GoRow {
        event_id,
        room,
        status,
        age_ms,
        retry_count: 0,
        last_error: "",
        worker_id: "",
        lock_until_in_ms: 0,
        next_retry_in_ms: 0,
    }
}

/// Rows in every status, with leases the Go worker left behind, expired and not.
fn go_rows() -> Vec<GoRow> {
    let row = go_row;
    vec![
        row("evt-pending-1", "room-a", "pending", 10_000),
        row("evt-pending-2", "room-a", "pending", 9_000),
        GoRow {
            retry_count: 2,
            last_error: "im: 10006",
            next_retry_in_ms: -1_000,
            ..row("evt-retry-due", "room-b", "retryable", 8_000)
        },
        GoRow {
            retry_count: 1,
            last_error: "im: 10006",
            next_retry_in_ms: HOUR,
            ..row("evt-retry-later", "room-b", "retryable", 7_000)
        },
        GoRow {
            worker_id: "go-worker-1",
            lock_until_in_ms: -1_000,
            ..row("evt-lease-expired", "room-c", "delivering", 6_000)
        },
        GoRow {
            worker_id: "go-worker-2",
            lock_until_in_ms: HOUR,
            ..row("evt-lease-live", "room-d", "delivering", 5_000)
        },
        row("evt-delivered", "room-e", "delivered", 4_000),
        GoRow { retry_count: 3, last_error: "group not found", ..row("evt-failed", "room-f", "failed", 3_000) },
        row("evt-published", "room-g", "published", 2_000),
    ]
}

/// The rows a host may claim: pending, retryable and due, delivering with an expired lease.
const CLAIMABLE: [&str; 4] = ["evt-pending-1", "evt-pending-2", "evt-retry-due", "evt-lease-expired"];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An `INSERT` of `row` as room-service's repository would write it.
fn insert_sql(url: &str, row: &GoRow, now: i64) -> String {
    let envelope = outbox_host::envelope::encode("default", row.event_id, "RoomGiftSent", row.room, 1, now, vec![]);
    let envelope = if url.starts_with("postgres") {
        format!("decode('{}', 'hex')", hex(&envelope))
    } else {
        format!("X'{}'", hex(&envelope))
    };
    format!(
        "INSERT INTO {TABLE} (app_code, event_id, event_type, room_id, status, envelope, created_at_ms, retry_count, \
         last_error, worker_id, lock_until_ms, next_retry_at_ms) VALUES ('default', '{}', 'RoomGiftSent', '{}', '{}', \
         {envelope}, {}, {}, '{}', '{}', {}, {})",
        row.event_id,
        row.room,
        row.status,
        now - row.age_ms,
        row.retry_count,
        row.last_error,
        row.worker_id,
        if row.lock_until_in_ms == 0 { 0 } else { now + row.lock_until_in_ms },
        if row.next_retry_in_ms == 0 { 0 } else { now + row.next_retry_in_ms },
    )
}

/// A host's config on the Go table, with the fake sink.
fn config(world: &World, sink_config: &str) -> outbox_host::config::Config {
    world.setup("poll_interval: 100ms", sink_config).set(&["outbox", "table"], TABLE).parse()
}

async fn a_go_made_table_is_adopted_and_only_its_claimable_rows_are_delivered(world: World) {
    let url = world.db_url();
    world.db.execute(&go_ddl(&url, "VARCHAR(16)")).await.unwrap();
    let now = now_ms();
    for row in go_rows() {
        world.db.execute(&insert_sql(&url, &row, now)).await.unwrap();
    }

    // migrate: the host's columns and claim index are added; no row changes.
    let store = outbox_host::store::open(&url, 2, TABLE).await.unwrap();
    store.migrate().await.unwrap();
    let info = store.describe().await.unwrap().expect("the table is still there");
    for added in ["updated_at_ms", "delivered_at_ms"] {
        assert!(info.columns.iter().any(|c| c.name == added), "{added} was not added: {info:?}");
    }
    assert!(info.indexes.iter().any(|i| i.name == format!("{TABLE}_claim_idx")), "no claim index: {info:?}");
    store.migrate().await.expect("migrating again changes nothing and succeeds");
    let store = outbox_host::store::open(&url, 2, TABLE).await.unwrap();
    for row in go_rows() {
        let seen = store.get(row.event_id).await;
        if row.status == "published" {
            assert!(seen.is_err(), "a row in an unknown status reads as an error, not as a status it is not");
            continue;
        }
        let seen = seen.unwrap().unwrap_or_else(|| panic!("{} is gone", row.event_id));
        assert_eq!(seen.status.as_str(), row.status, "{} changed state in migrate", row.event_id);
        assert_eq!(i64::from(seen.retry_count), row.retry_count);
        assert_eq!(seen.last_error.as_deref().unwrap_or(""), row.last_error, "'' reads as no error");
    }
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.unknown_statuses, vec![("published".to_string(), 1)], "status reports the unknown status");
    let report = outbox_host::ops::report::status(TABLE, &stats, now);
    assert!(report.contains("published") && report.contains("never claimed"), "{report}");

    // run: exactly the claimable rows are delivered, a room's in order; a failure is
    // written to the NOT NULL columns; a new event from a producer is delivered too.
    let mut host = Running::start(config(&world, "room.room-r: retryable")).await;
    host.wait_status_in(store.as_ref(), &CLAIMABLE, Status::Delivered).await;
    let fresh = NewEvent {
        app_code: "default".into(),
        event_id: "evt-after-adoption".into(),
        event_type: "RoomGiftSent".into(),
        room_id: "room-r".into(),
        status: Status::Pending,
        envelope: outbox_host::envelope::encode(
            "default",
            "evt-after-adoption",
            "RoomGiftSent",
            "room-r",
            1,
            now,
            vec![],
        ),
        created_at_ms: now_ms(),
        trace_context: None,
    };
    store.insert(&[fresh]).await.unwrap();
    host.wait_status_in(store.as_ref(), &["evt-after-adoption"], Status::Retryable).await;
    host.stop().await;

    for id in CLAIMABLE {
        assert_eq!(world.collector.attempts_of(id).len(), 1, "{id} delivered once");
        let row = store.get(id).await.unwrap().unwrap();
        assert_eq!((row.last_error, row.worker_id.as_deref()), (None, None), "{id}: lease and error cleared");
        assert!(row.delivered_at_ms.is_some());
    }
    let order: Vec<String> = world.collector.reports().into_iter().map(|r| r.event_id).collect();
    let position = |id: &str| order.iter().position(|e| e == id).unwrap();
    assert!(position("evt-pending-1") < position("evt-pending-2"), "room-a's events out of order: {order:?}");
    let failed = store.get("evt-after-adoption").await.unwrap().unwrap();
    assert_eq!((failed.retry_count, failed.worker_id), (1, None), "a failure on the adopted table");
    assert!(failed.last_error.is_some_and(|e| e.contains("scripted retryable")));
    for row in go_rows().iter().filter(|r| !CLAIMABLE.contains(&r.event_id)) {
        assert!(world.collector.attempts_of(row.event_id).is_empty(), "{} was delivered", row.event_id);
        if row.status == "published" {
            continue;
        }
        let seen = store.get(row.event_id).await.unwrap().unwrap();
        assert_eq!(seen.status.as_str(), row.status, "{} changed state", row.event_id);
        assert_eq!(seen.worker_id.as_deref().unwrap_or(""), row.worker_id, "{}: lease untouched", row.event_id);
        assert_eq!(i64::from(seen.retry_count), row.retry_count);
    }
    assert_eq!(store.stats().await.unwrap().unknown_statuses, vec![("published".to_string(), 1)]);
}

async fn a_column_that_cannot_work_is_refused_and_the_table_left_untouched(world: World) {
    let url = world.db_url();
    // SQLite does not enforce lengths: there, the unworkable column is a TEXT timestamp.
    let (ddl, column) = if url.starts_with("sqlite") {
        (go_ddl(&url, "TEXT").replace("created_at_ms INTEGER", "created_at_ms TEXT"), "created_at_ms")
    } else {
        (go_ddl(&url, "VARCHAR(8)"), "status")
    };
    world.db.execute(&ddl).await.unwrap();
    let now = now_ms();
    let rows = go_rows();
    world.db.execute(&insert_sql(&url, &rows[0], now)).await.unwrap();
    let store = outbox_host::store::open(&url, 2, TABLE).await.unwrap();
    let before = store.describe().await.unwrap().unwrap();

    let refused = store.migrate().await.expect_err("an unworkable column is refused").to_string();
    assert!(refused.contains(&format!("column {column} is ")), "names the column: {refused}");
    assert!(refused.contains("nothing was changed"), "{refused}");
    if url.starts_with("mysql") {
        assert!(refused.contains("ALTER TABLE go_outbox MODIFY COLUMN status VARCHAR(16) NOT NULL;"), "{refused}");
    } else if url.starts_with("postgres") {
        assert!(refused.contains("ALTER TABLE go_outbox ALTER COLUMN status TYPE VARCHAR(16);"), "{refused}");
    } else {
        assert!(refused.contains("rebuild go_outbox with created_at_ms INTEGER"), "{refused}");
    }
    assert_eq!(store.describe().await.unwrap().unwrap(), before, "the table was changed");

    // run refuses too, with every problem in one message, and claims nothing.
    let started = outbox_host::app::Host::start(config(&world, "")).await;
    let message = format!("{:#}", started.err().expect("run refuses an unworkable table"));
    assert!(message.contains(&format!("column {column} is ")), "{message}");
    assert_eq!(store.describe().await.unwrap().unwrap(), before, "the table was changed");
    assert!(world.collector.reports().is_empty());
}

/// The Go-made table, empty, adopted by `migrate`.
async fn adopted(world: &World) {
    world.db.execute(&go_ddl(&world.db_url(), "VARCHAR(16)")).await.unwrap();
    outbox_host::store::open(&world.db_url(), 2, TABLE).await.unwrap().migrate().await.unwrap();
}

async fn the_producer_crate_works_on_an_adopted_table(world: World) {
    adopted(&world).await;
    crate::producer::inserts_in_transactions_on(&world, TABLE).await;
    crate::producer::marking_delivered_while_held_on(&world, TABLE).await;
}

async fn readiness_tells_the_truth_on_an_adopted_table(world: World) {
    adopted(&world).await;
    crate::admin::readiness_on(&world, TABLE).await;
}

/// An operator renames two columns after `migrate`: `run` refuses to start, naming both in
/// one message, before it claims anything.
async fn run_lists_every_problem_of_a_table_changed_after_migrate(world: World) {
    adopted(&world).await;
    for (from, to) in [("room_id", "room"), ("event_type", "kind")] {
        world.db.execute(&format!("ALTER TABLE {TABLE} RENAME COLUMN {from} TO {to}")).await.unwrap();
    }
    let started = outbox_host::app::Host::start(config(&world, "")).await;
    let message = format!("{:#}", started.err().expect("run refuses the changed table"));
    assert!(
        message.contains("column event_type is missing") && message.contains("column room_id is missing"),
        "{message}"
    );
    assert!(world.collector.reports().is_empty());
}

/// A `CREATE INDEX CONCURRENTLY` that fails half-way leaves an invalid index behind, which
/// `IF NOT EXISTS` would keep: `migrate` sees it as missing, drops it and builds it again.
#[tokio::test]
async fn postgres_migrate_rebuilds_an_index_left_invalid() {
    let Some(db) = crate::support::TestDb::postgres().await else { return };
    let world = World::on(db).await;
    world
        .db
        .execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'room_outbox_claim_idx'::regclass")
        .await
        .unwrap();
    let valid = || crate::support::postgres_index_valid(&world.db.url, "room_outbox_claim_idx");
    assert!(!valid().await, "the index was not made invalid");
    outbox_host::store::open(&world.db_url(), 2, "room_outbox").await.unwrap().migrate().await.unwrap();
    assert!(valid().await, "migrate kept the invalid index");
}

/// A table keyed by `event_id`: the claim routine rendered for it takes rows in
/// `(created_at_ms, event_id)` order (two events of one millisecond included) and skips an
/// event that waits for its retry time; under per-room order the host delivers each room in
/// that order and holds a room back behind its waiting retry.
async fn an_adopted_table_is_claimed_and_delivered_in_each_rooms_order(world: World) {
    let url = world.db_url();
    world.db.execute(&go_ddl(&url, "VARCHAR(16)")).await.unwrap();
    let now = now_ms();
    let row = |event_id, room, age_ms| go_row(event_id, room, "pending", age_ms);
    // room-a in order: z-first, the two of one millisecond (by event id), a-last.
    let rows = [
        row("evt-z-first", "room-a", 9_000),
        row("evt-b-same", "room-a", 8_000),
        row("evt-c-same", "room-a", 8_000),
        row("evt-a-last", "room-a", 7_000),
        row("evt-b0", "room-b", 6_500),
        GoRow { status: "retryable", retry_count: 1, next_retry_in_ms: HOUR, ..row("evt-b1-later", "room-b", 6_000) },
        row("evt-b2", "room-b", 5_500),
    ];
    for row in &rows {
        world.db.execute(&insert_sql(&url, row, now)).await.unwrap();
    }
    let store = outbox_host::store::open(&url, 2, TABLE).await.unwrap();
    store.migrate().await.unwrap();
    let store = outbox_host::store::open(&url, 2, TABLE).await.unwrap();

    let claimed = store.claim("w", now, now + 60_000, 10).await.unwrap();
    let ids: Vec<&str> = claimed.iter().map(|c| c.event_id.as_str()).collect();
    assert_eq!(ids, ["evt-z-first", "evt-b-same", "evt-c-same", "evt-a-last", "evt-b0", "evt-b2"], "claim order");
    let held: Vec<Held> = claimed.iter().map(Held::from).collect();
    store.release(&held, now).await.unwrap();

    let config = world.setup("poll_interval: 100ms\nordering: per_room", "").set(&["outbox", "table"], TABLE).parse();
    let mut host = Running::start(config).await;
    let done = ["evt-z-first", "evt-b-same", "evt-c-same", "evt-a-last", "evt-b0"];
    host.wait_status_in(store.as_ref(), &done, Status::Delivered).await;
    host.stop().await;
    let got: Vec<String> = world.collector.reports().into_iter().map(|r| r.event_id).collect();
    let room_a: Vec<&str> = got.iter().map(String::as_str).filter(|id| done[..4].contains(id)).collect();
    assert_eq!(room_a, done[..4], "room-a out of order");
    for held_back in ["evt-b1-later", "evt-b2"] {
        assert!(world.collector.attempts_of(held_back).is_empty(), "{held_back} was attempted");
    }
}

/// A second sink on a table without `id` (keyed by `event_id`, or SQLite's rowid): its
/// copies (ids of their own) are claimed in the outbox's order, so each sink receives every
/// event once, each room in the order the outbox's claim keeps.
async fn a_second_sink_on_an_adopted_table_gets_every_event_once_in_each_rooms_order(world: World) {
    adopted(&world).await;
    let outbox = outbox_host::store::open(&world.db_url(), 2, TABLE).await.unwrap();
    let audit = outbox_test_support::Collector::start().await;
    let audit_spec = crate::support::fake_sink_to("audit", &audit, "");
    let config = world
        .setup("poll_interval: 100ms\nordering: per_room", "")
        .set(&["outbox", "table"], TABLE)
        .with_sinks(vec![crate::support::sink_entry(&audit_spec, "start_from: beginning")])
        .parse();
    // In one transaction before the host starts: rows of one millisecond that committed
    // later would rightly come after those already delivered.
    let events: Vec<_> =
        (0..200).map(|i| world.event("RoomGiftSent", &format!("room-{}", i % 20), Status::Pending)).collect();
    outbox.insert(&events).await.unwrap();
    let mut host = Running::start(config).await;
    let sinks = outbox.sinks().await.unwrap();
    assert_eq!(sinks[1].table, format!("{TABLE}__audit"));
    let audit_state = outbox.clone().sink_store(&sinks[1]).await.unwrap();
    host.wait_for("both sinks to deliver every event", || async {
        outbox.stats().await.unwrap().count(Status::Delivered) == 200
            && audit_state.stats().await.unwrap().count(Status::Delivered) == 200
    })
    .await;
    host.stop().await;
    // The outbox's claim order: creation time, then its key (SQLite's rowid, which keeps
    // insert order, where the table has no id; `event_id` elsewhere).
    let by_rowid = world.db_url().starts_with("sqlite");
    let mut expected: std::collections::HashMap<&str, Vec<(i64, &str)>> = Default::default();
    for e in &events {
        expected.entry(e.room_id.as_str()).or_default().push((e.created_at_ms, e.event_id.as_str()));
    }
    for order in expected.values_mut() {
        if !by_rowid {
            order.sort();
        }
    }
    for (name, collector) in [("the first sink", &world.collector), ("audit", &audit)] {
        let mut got: std::collections::HashMap<&str, Vec<(i64, &str)>> = Default::default();
        let reports = collector.reports();
        for r in &reports {
            let e = events.iter().find(|e| e.event_id == r.event_id).expect("one of ours");
            got.entry(e.room_id.as_str()).or_default().push((e.created_at_ms, e.event_id.as_str()));
        }
        assert_eq!(reports.len(), 200, "{name} got each event once");
        assert_eq!(got, expected, "{name}: each room in the outbox's order");
    }
}

/// The table and bookkeeping a development version of the host (migrations 1 to 19, kept
/// under `tests/fixtures/dev-migrations/`) left behind, with the room order index its schema
/// review added, for `table`.
async fn build_with_development_versions(world: &World, table: &str) {
    let url = world.db_url();
    let dialect = match () {
        () if url.starts_with("postgres") => "postgres",
        () if url.starts_with("mysql") => "mysql",
        () => "sqlite",
    };
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dir = repo.join("tests/fixtures/dev-migrations").join(dialect);
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|f| f.unwrap().path()).collect();
    files.sort();
    assert_eq!(files.len(), 19, "{dir:?}");
    world
        .db
        .execute(&format!(
            "CREATE TABLE {table}_migrations \
             (version BIGINT PRIMARY KEY, description VARCHAR(255) NOT NULL, applied_at_ms BIGINT NOT NULL)"
        ))
        .await
        .unwrap();
    for (i, file) in files.iter().enumerate() {
        let sql = std::fs::read_to_string(file).unwrap().replace("room_outbox", table);
        world.db.execute(&sql).await.unwrap_or_else(|e| panic!("{file:?}: {e}"));
        let version = i + 1;
        world
            .db
            .execute(&format!("INSERT INTO {table}_migrations VALUES ({version}, 'development version {version}', 0)"))
            .await
            .unwrap();
    }
    let room_order = match dialect {
        "postgres" => format!(
            "CREATE INDEX {table}_room_order_idx ON {table} (room_id, app_code, created_at_ms, id) \
             WHERE status IN ('pending', 'delivering', 'retryable', 'failed')"
        ),
        _ => format!("CREATE INDEX {table}_room_order_idx ON {table} (status, room_id, app_code, created_at_ms, id)"),
    };
    world.db.execute(&room_order).await.unwrap();
}

/// A database made by the development versions (0.1.0 never shipped; they had 19
/// migrations and ordered claim routines): `migrate` adopts it in place. Every row keeps its
/// state; the bookkeeping becomes one baseline with its checksum; the old claim routines and
/// the room order index are gone and the current routines installed; the host then delivers
/// each room in order; and a second `migrate` changes nothing.
async fn a_table_of_the_development_versions_is_adopted_in_place(world: World) {
    const DEV: &str = "dev_outbox";
    build_with_development_versions(&world, DEV).await;
    let url = world.db_url();
    let old = outbox_host::store::open(&url, 2, DEV).await.unwrap();
    let events: Vec<NewEvent> =
        (0..30).map(|i| world.event("RoomGiftSent", &format!("room-{}", i % 3), Status::Pending)).collect();
    old.insert(&events).await.unwrap();
    let delivered = world.event("RoomGiftSent", "room-9", Status::Delivered);
    old.insert(std::slice::from_ref(&delivered)).await.unwrap();

    old.migrate().await.unwrap();
    let store = outbox_host::store::open(&url, 2, DEV).await.unwrap();
    let scalar = |sql: String| {
        let db = &world.db;
        async move {
            let rows = crate::support::query_strings(db, &sql).await;
            rows.join(",")
        }
    };
    let recorded = scalar(format!("SELECT description FROM {DEV}_migrations ORDER BY version")).await;
    assert_eq!(recorded, "baseline, adopting a table of development versions 1-19,row claimers,sink positions");
    let checksum = scalar(format!("SELECT checksum FROM {DEV}_migrations WHERE version = 1")).await;
    assert_eq!(checksum.len(), 96, "a SHA-384 in hex: {checksum}");
    let routines = scalar(format!("SELECT name FROM {DEV}_routines ORDER BY name")).await;
    let dialect = store.backend();
    let leftovers = match dialect {
        outbox_host::store::Backend::Postgres => {
            assert_eq!(routines, "claim,notify_insert");
            scalar(format!(
                "SELECT p.oid::regprocedure::TEXT FROM pg_proc p WHERE p.proname LIKE '{DEV}_claim%' \
                 AND p.pronamespace = current_schema()::regnamespace ORDER BY 1"
            ))
            .await
        }
        outbox_host::store::Backend::Mysql => {
            assert_eq!(routines, "claim");
            scalar(format!(
                "SELECT CONCAT(routine_name, '/', (SELECT COUNT(*) FROM information_schema.parameters p \
                   WHERE p.specific_schema = r.routine_schema AND p.specific_name = r.routine_name)) \
                 FROM information_schema.routines r WHERE r.routine_schema = DATABASE() AND r.routine_name LIKE '{DEV}%'"
            ))
            .await
        }
        outbox_host::store::Backend::Sqlite => {
            assert_eq!(routines, "");
            String::new()
        }
    };
    let expected_routines = match dialect {
        outbox_host::store::Backend::Postgres => {
            format!("{DEV}_claim(text,bigint,bigint,integer)")
        }
        outbox_host::store::Backend::Mysql => format!("{DEV}_claim/4"),
        outbox_host::store::Backend::Sqlite => String::new(),
    };
    assert_eq!(leftovers, expected_routines, "only the current claim routine is left");
    let indexes: Vec<String> = store.describe().await.unwrap().unwrap().indexes.into_iter().map(|i| i.name).collect();
    assert!(!indexes.iter().any(|i| i.contains("room_order")), "{indexes:?}");
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.count(Status::Pending), stats.count(Status::Delivered)), (30, 1), "every row kept its state");

    // The current claim routine works on it (one row, handed back).
    let now = now_ms();
    let claimed = store.claim("w", now, now + 60_000, 1).await.unwrap();
    assert_eq!(claimed.iter().map(|c| c.event_id.as_str()).collect::<Vec<_>>(), [events[0].event_id.as_str()]);
    store.release(&claimed.iter().map(Held::from).collect::<Vec<_>>(), now).await.unwrap();

    let config = world.setup("poll_interval: 100ms", "").set(&["outbox", "table"], DEV).parse();
    let mut host = Running::start(config).await;
    let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    host.wait_status_in(store.as_ref(), &ids, Status::Delivered).await;
    host.stop().await;
    let got: Vec<String> = world.collector.reports().into_iter().map(|r| r.event_id).collect();
    for room in 0..3 {
        let want: Vec<&str> = events.iter().skip(room).step_by(3).map(|e| e.event_id.as_str()).collect();
        let seen: Vec<&str> = got.iter().map(String::as_str).filter(|id| want.contains(id)).collect();
        assert_eq!(seen, want, "room-{room} in order, each once");
    }

    let applied_at = scalar(format!("SELECT applied_at_ms FROM {DEV}_migrations")).await;
    assert!(!store.migrate().await.unwrap().created);
    assert_eq!(
        scalar(format!("SELECT applied_at_ms FROM {DEV}_migrations")).await,
        applied_at,
        "nothing applied again"
    );
}

/// A migration file changed after it was applied is refused by name, and nothing changes:
/// here the recorded checksum of the baseline no longer matches the file's.
async fn an_applied_migration_that_changed_is_refused_by_name(world: World) {
    world.db.execute("UPDATE room_outbox_migrations SET checksum = 'edited' WHERE version = 1").await.unwrap();
    let store = outbox_host::store::open(&world.db_url(), 2, "room_outbox").await.unwrap();
    let refused = store.migrate().await.expect_err("an edited migration was accepted").to_string();
    let dialect = match store.backend() {
        outbox_host::store::Backend::Postgres => "postgres",
        outbox_host::store::Backend::Mysql => "mysql",
        outbox_host::store::Backend::Sqlite => "sqlite",
    };
    assert!(
        refused.contains(&format!(
            "migrations/{dialect}/0001_baseline.sql was applied to room_outbox with checksum edited"
        )),
        "{refused}"
    );
    let still =
        crate::support::query_strings(&world.db, "SELECT checksum FROM room_outbox_migrations WHERE version = 1").await;
    assert_eq!(still, ["edited"], "nothing was changed");
}
