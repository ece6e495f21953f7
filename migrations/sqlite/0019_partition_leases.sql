-- Per-room order by partition ownership (engine v3). A room, (app_code, room_id), hashes to
-- one of a sink's partitions; the host that holds a partition's lease is the only one that
-- delivers its rooms, so rows need no claim. A takeover increments the epoch, and every
-- outcome write checks the writer still holds the partition under its epoch. Hosts also say
-- they are there (and how much they have in flight) in the owners table, which is how a
-- joining host's share is made room for. Keyed by the sink's state table (the outbox for the
-- first sink, room_outbox__<sink> for the others). The host renames room_outbox.
CREATE TABLE IF NOT EXISTS room_outbox_partitions (
    sink_table     TEXT NOT NULL,
    part           INTEGER NOT NULL,
    owner          TEXT,
    epoch          INTEGER NOT NULL DEFAULT 0,
    lease_until_ms INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sink_table, part)
);

CREATE TABLE IF NOT EXISTS room_outbox_owners (
    sink_table     TEXT NOT NULL,
    owner          TEXT NOT NULL,
    lease_until_ms INTEGER NOT NULL,
    in_flight      INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sink_table, owner)
);
