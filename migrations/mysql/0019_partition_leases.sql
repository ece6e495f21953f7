-- Per-room order by partition ownership (engine v3). A room, (app_code, room_id), hashes to
-- one of a sink's partitions; the host that holds a partition's lease is the only one that
-- delivers its rooms, so rows need no claim. A takeover increments the epoch, and every
-- outcome write checks the writer still holds the partition under its epoch. Hosts also say
-- they are there (and how much they have in flight) in the owners table, which is how a
-- joining host's share is made room for. Keyed by the sink's state table (the outbox for the
-- first sink, room_outbox__<sink> for the others). The host renames room_outbox.
CREATE TABLE IF NOT EXISTS room_outbox_partitions (
    sink_table     VARCHAR(128) NOT NULL,
    part           INT NOT NULL,
    owner          VARCHAR(128),
    epoch          BIGINT NOT NULL DEFAULT 0,
    lease_until_ms BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (sink_table, part)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS room_outbox_owners (
    sink_table     VARCHAR(128) NOT NULL,
    owner          VARCHAR(128) NOT NULL,
    lease_until_ms BIGINT NOT NULL,
    in_flight      BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (sink_table, owner)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
