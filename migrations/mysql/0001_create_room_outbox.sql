-- The outbox table (MySQL 8 / MariaDB 10.6+). A producer writes app_code, event_id,
-- event_type, room_id, status, envelope and created_at_ms in the same transaction as its
-- state change; every other column has a default. The surrogate AUTO_INCREMENT key keeps
-- InnoDB inserts append-only. The host renames `room_outbox` when `outbox.table` says so.
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
    PRIMARY KEY (id),
    UNIQUE KEY room_outbox_event_id_uq (event_id),
    -- The claim walks each claimable status in creation order.
    KEY room_outbox_claim_idx (status, created_at_ms, id),
    KEY room_outbox_room_idx (room_id, created_at_ms),
    CONSTRAINT room_outbox_status_ck
        CHECK (status IN ('pending', 'delivering', 'delivered', 'retryable', 'failed'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;
