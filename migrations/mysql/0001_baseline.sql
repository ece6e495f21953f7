-- The host's schema on MySQL 8 / MariaDB 10.6+, as one baseline (version 1). The host
-- renames `room_outbox` when `outbox.table` says so; its claim procedure is rendered from
-- migrations/routines/mysql_claim.sql and installed apart, when its stored checksum differs.

-- The outbox table. A producer writes app_code, event_id, event_type, room_id, status,
-- envelope and created_at_ms in the same transaction as its state change; every other
-- column has a default. The surrogate AUTO_INCREMENT key keeps InnoDB inserts append-only.
-- `fanned_out_at_ms` says when the fan-out copied the row to the other sinks' tables (0: not
-- yet); `plugin_digest` names the build of the sink that wrote the row's last outcome.
CREATE TABLE IF NOT EXISTS room_outbox (
    id               BIGINT       NOT NULL AUTO_INCREMENT,
    app_code         VARCHAR(64)  NOT NULL DEFAULT '',
    event_id         VARCHAR(128) NOT NULL,
    event_type       VARCHAR(128) NOT NULL,
    room_id          VARCHAR(128) NOT NULL,
    status           VARCHAR(16)  NOT NULL DEFAULT 'pending',
    envelope         MEDIUMBLOB   NOT NULL,
    created_at_ms    BIGINT       NOT NULL,
    retry_count      INT          NOT NULL DEFAULT 0,
    last_error       VARCHAR(512) NULL,
    worker_id        VARCHAR(128) NULL,
    lock_until_ms    BIGINT       NOT NULL DEFAULT 0,
    next_retry_at_ms BIGINT       NOT NULL DEFAULT 0,
    updated_at_ms    BIGINT       NOT NULL DEFAULT (ROUND(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000)),
    delivered_at_ms  BIGINT       NULL,
    fanned_out_at_ms BIGINT       NOT NULL DEFAULT 0,
    plugin_digest    VARCHAR(80)  NULL,
    PRIMARY KEY (id),
    UNIQUE KEY room_outbox_event_id_uq (event_id),
    -- Each unfinished status in creation order, with the due times a claim checks, so a
    -- claim's or an owner's walk past retries not due yet reads the index alone.
    KEY room_outbox_claim_idx (status, created_at_ms, id, next_retry_at_ms, lock_until_ms),
    -- Per-room lookups by operators and consumers, and a room's failed rows.
    KEY room_outbox_room_idx (room_id, created_at_ms),
    CONSTRAINT room_outbox_status_ck
        CHECK (status IN ('pending', 'delivering', 'delivered', 'retryable', 'failed'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- outbox-host: the outbox's own bookkeeping follows (a sink's own table has none of it).

-- The sinks of this outbox. The table's own status columns are the first sink's; every
-- other sink keeps its state in a table of its own, `room_outbox__<sink>`, filled by the
-- fan-out. `backfilled_at_ms` is NULL until a sink added later has copied what it needs.
CREATE TABLE IF NOT EXISTS room_outbox_sinks (
    name             VARCHAR(64)  NOT NULL PRIMARY KEY,
    sink_table       VARCHAR(128) NOT NULL,
    start_from_ms    BIGINT       NOT NULL,
    added_at_ms      BIGINT       NOT NULL,
    backfilled_at_ms BIGINT
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- Per-room order by partition ownership. A room, (app_code, room_id), hashes to one of a
-- sink's partitions; the host holding a partition's lease is the only one that delivers its
-- rooms. A takeover increments the epoch, and every outcome write checks that the writer
-- still holds the partition under its epoch. Keyed by the sink's state table.
CREATE TABLE IF NOT EXISTS room_outbox_partitions (
    sink_table     VARCHAR(128) NOT NULL,
    part           INT NOT NULL,
    owner          VARCHAR(128),
    epoch          BIGINT NOT NULL DEFAULT 0,
    lease_until_ms BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (sink_table, part)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The hosts taking part, each with its lease and what it has in flight: how a joining host's
-- share is made room for.
CREATE TABLE IF NOT EXISTS room_outbox_owners (
    sink_table     VARCHAR(128) NOT NULL,
    owner          VARCHAR(128) NOT NULL,
    lease_until_ms BIGINT NOT NULL,
    in_flight      BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (sink_table, owner)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
