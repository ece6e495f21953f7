-- The host's schema on SQLite, as one baseline (version 1). The host renames `room_outbox`
-- when `outbox.table` says so. SQLite has no routines: a claim is a short `BEGIN IMMEDIATE`
-- transaction, and idle hosts probe for pending rows.

-- The outbox table. A producer writes app_code, event_id, event_type, room_id, status,
-- envelope and created_at_ms in the same transaction as its state change; every other
-- column has a default. `fanned_out_at_ms` says when the fan-out copied the row to the other
-- sinks' tables (0: not yet); `plugin_digest` names the build of the sink that wrote the
-- row's last outcome (`sha256:<hex>`).
CREATE TABLE IF NOT EXISTS room_outbox (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    app_code         TEXT    NOT NULL DEFAULT '',
    event_id         TEXT    NOT NULL UNIQUE,
    event_type       TEXT    NOT NULL,
    room_id          TEXT    NOT NULL,
    status           TEXT    NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'delivering', 'delivered', 'retryable', 'failed')),
    envelope         BLOB    NOT NULL,
    created_at_ms    INTEGER NOT NULL,
    retry_count      INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    worker_id        TEXT,
    lock_until_ms    INTEGER NOT NULL DEFAULT 0,
    next_retry_at_ms INTEGER NOT NULL DEFAULT 0,
    updated_at_ms    INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    delivered_at_ms  INTEGER,
    fanned_out_at_ms INTEGER NOT NULL DEFAULT 0,
    plugin_digest    TEXT
);

-- By status, then due time, then age: what an idle host's probe for due rows reads.
CREATE INDEX IF NOT EXISTS room_outbox_claim_idx
    ON room_outbox (status, next_retry_at_ms, created_at_ms, id);

-- Unfinished rows in creation order, so that a claim (`ordering: none`) and a partition
-- owner's read walk them and stop at their limit instead of sorting the backlog. The rowid
-- (`id`) is the index's last column by itself.
CREATE INDEX IF NOT EXISTS room_outbox_pick_idx
    ON room_outbox (created_at_ms) WHERE status IN ('pending', 'retryable', 'delivering');

-- Per-room lookups by operators and consumers, and a room's failed rows.
CREATE INDEX IF NOT EXISTS room_outbox_room_idx
    ON room_outbox (room_id, created_at_ms);

-- outbox-host: the outbox's own bookkeeping follows (a sink's own table has none of it).

-- The sinks of this outbox. The table's own status columns are the first sink's; every
-- other sink keeps its state in a table of its own, `room_outbox__<sink>`, filled by the
-- fan-out. `backfilled_at_ms` is NULL until a sink added later has copied what it needs.
CREATE TABLE IF NOT EXISTS room_outbox_sinks (
    name             TEXT    PRIMARY KEY,
    sink_table       TEXT    NOT NULL,
    start_from_ms    INTEGER NOT NULL,
    added_at_ms      INTEGER NOT NULL,
    backfilled_at_ms INTEGER
);

-- Per-room order by partition ownership. A room, (app_code, room_id), hashes to one of a
-- sink's partitions; the host holding a partition's lease is the only one that delivers its
-- rooms. A takeover increments the epoch, and every outcome write checks that the writer
-- still holds the partition under its epoch. Keyed by the sink's state table.
CREATE TABLE IF NOT EXISTS room_outbox_partitions (
    sink_table     TEXT NOT NULL,
    part           INTEGER NOT NULL,
    owner          TEXT,
    epoch          INTEGER NOT NULL DEFAULT 0,
    lease_until_ms INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sink_table, part)
);

-- The hosts taking part, each with its lease and what it has in flight: how a joining host's
-- share is made room for.
CREATE TABLE IF NOT EXISTS room_outbox_owners (
    sink_table     TEXT NOT NULL,
    owner          TEXT NOT NULL,
    lease_until_ms INTEGER NOT NULL,
    in_flight      INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sink_table, owner)
);
