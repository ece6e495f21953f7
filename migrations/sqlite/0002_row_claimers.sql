-- Version 2: the hosts that deliver a sink with `ordering: none` (row claims). They hold
-- no partitions, so `<table>_owners` does not show them: a `per_room` host refuses to
-- start while one of these is live, and an `ordering: none` host while an owner is.

-- outbox-host: the outbox's own bookkeeping follows (a sink's own table has none of it).
CREATE TABLE IF NOT EXISTS room_outbox_claimers (
    sink_table     TEXT    NOT NULL,
    owner          TEXT    NOT NULL,
    lease_until_ms INTEGER NOT NULL,
    PRIMARY KEY (sink_table, owner)
);
