-- Version 3: sinks as consumers of the outbox (issue 48, decision 0203). For each sink other
-- than the first and each of its partitions, a position `(created_at_ms, row_key)`: every row
-- of the partition at or before it is finished for the sink, unless an exception says
-- otherwise. An exception is one event's state for one sink where the position does not
-- tell it: `delivered` past the position (finished out of order), `pending` (held behind
-- its room), `retryable` or `failed`. `row_key` is the table's key as text (`id` in decimal,
-- or the event id where the table has no `id`). An exception names its room and type, so
-- that a room's `failed` event holds the room for the sink (`failed_blocks_room`) and an
-- operator's retry of a type finds its events.

-- outbox-host: the outbox's own bookkeeping follows (a sink's own table has none of it).
CREATE TABLE IF NOT EXISTS room_outbox_positions (
    sink             TEXT    NOT NULL,
    part             INTEGER NOT NULL,
    created_at_ms    INTEGER NOT NULL,
    row_key          TEXT    NOT NULL,
    updated_at_ms    INTEGER NOT NULL,
    PRIMARY KEY (sink, part)
);

CREATE TABLE IF NOT EXISTS room_outbox_exceptions (
    sink             TEXT    NOT NULL,
    event_id         TEXT    NOT NULL,
    app_code         TEXT    NOT NULL,
    room_id          TEXT    NOT NULL,
    event_type       TEXT    NOT NULL,
    part             INTEGER NOT NULL,
    created_at_ms    INTEGER NOT NULL,
    status           TEXT    NOT NULL
                     CHECK (status IN ('pending', 'delivered', 'retryable', 'failed')),
    retry_count      INTEGER NOT NULL DEFAULT 0,
    next_retry_at_ms INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    updated_at_ms    INTEGER NOT NULL,
    plugin_digest    TEXT,
    PRIMARY KEY (sink, event_id)
);

-- A partition's exceptions in creation order: an owner's read and the settling of a position.
CREATE INDEX IF NOT EXISTS room_outbox_exceptions_part_idx
    ON room_outbox_exceptions (sink, part, created_at_ms);
