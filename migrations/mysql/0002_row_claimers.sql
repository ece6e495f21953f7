-- Version 2: the hosts that deliver a sink with `ordering: none` (row claims). They hold
-- no partitions, so `<table>_owners` does not show them: a `per_room` host refuses to
-- start while one of these is live, and an `ordering: none` host while an owner is.

-- outbox-host: the outbox's own bookkeeping follows (a sink's own table has none of it).
CREATE TABLE IF NOT EXISTS room_outbox_claimers (
    sink_table     VARCHAR(128) NOT NULL,
    owner          VARCHAR(128) NOT NULL,
    lease_until_ms BIGINT NOT NULL,
    PRIMARY KEY (sink_table, owner)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
