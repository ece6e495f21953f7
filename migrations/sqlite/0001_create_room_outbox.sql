-- The outbox table. A producer writes app_code, event_id, event_type, room_id, status,
-- envelope and created_at_ms in the same transaction as its state change; every other
-- column has a default. The host renames `room_outbox` when `outbox.table` says so.
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
    delivered_at_ms  INTEGER
);

-- The claim: by status, then due time, then age.
CREATE INDEX IF NOT EXISTS room_outbox_claim_idx
    ON room_outbox (status, next_retry_at_ms, created_at_ms, id);

-- Per-room lookups by operators and consumers.
CREATE INDEX IF NOT EXISTS room_outbox_room_idx
    ON room_outbox (room_id, created_at_ms);
