-- Several sinks on one outbox (issue 14). The table's own status columns stay the first
-- sink's (the one the producer's synchronous publish stands for). Every other sink has a
-- table of its own, `room_outbox__<sink>`, with the same columns; the host copies each event
-- into it once (the fan-out), so the producer still writes one row, whatever the number of
-- sinks. `fanned_out_at_ms` says when a row was copied (0: not yet). The registry names the
-- sinks, the table each one's state lives in, and where each one started.
-- The host renames `room_outbox` when `outbox.table` says so.
ALTER TABLE room_outbox ADD COLUMN IF NOT EXISTS fanned_out_at_ms BIGINT NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS room_outbox_sinks (
    name             VARCHAR(64)  PRIMARY KEY,
    sink_table       VARCHAR(128) NOT NULL,
    start_from_ms    BIGINT       NOT NULL,
    added_at_ms      BIGINT       NOT NULL,
    backfilled_at_ms BIGINT
);
