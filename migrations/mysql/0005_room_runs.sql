-- The claim procedure takes a room's run (outbox_worker.ordering: per_room): each room's
-- head as in version 4, and after each head up to p_run - 1 of the room's next unfinished
-- events, as long as every one of them is claimable too (none waits for its retry time or
-- is held under a live lease). Nobody else can take those: while their head is unfinished
-- they are not heads. They are found by a plain read, then locked (waiting, not skipping:
-- only a producer's or an operator's short write can hold one), and the claim is cut to
-- p_limit rows in creation order, which keeps each room's rows a prefix of its run.
-- Replaces version 4's procedure. The host renames `room_outbox` when `outbox.table` says so.
DROP PROCEDURE IF EXISTS room_outbox_claim;
CREATE PROCEDURE room_outbox_claim(IN p_worker_id VARCHAR(128), IN p_lock_until_ms BIGINT,
                                   IN p_now_ms BIGINT, IN p_limit INT,
                                   IN p_ordered BOOLEAN, IN p_failed_blocks BOOLEAN, IN p_run INT)
SQL SECURITY INVOKER
BEGIN
    DECLARE v_picked JSON;
    DECLARE v_heads JSON;
    DECLARE v_next JSON;
    DECLARE v_run JSON;
    DECLARE v_until BIGINT DEFAULT 9223372036854775807;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    IF p_ordered THEN
        -- Each room's head, found by a plain read: a locking read would lock every row of a
        -- hot room's backlog that it walks past.
        SELECT JSON_ARRAYAGG(id) INTO v_heads FROM (
            SELECT id FROM (
            (SELECT h.id, h.created_at_ms FROM room_outbox AS h
              WHERE h.status = 'pending'
                AND NOT EXISTS (
                    SELECT 1 FROM room_outbox AS e
                     WHERE e.room_id = h.room_id AND e.app_code = h.app_code
                       AND e.status IN ('pending', 'delivering', 'retryable', 'failed')
                       AND (e.status <> 'failed' OR p_failed_blocks)
                       AND (e.created_at_ms < h.created_at_ms
                            OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)))
              ORDER BY h.created_at_ms, h.id LIMIT p_limit)
            UNION ALL
            (SELECT h.id, h.created_at_ms FROM room_outbox AS h
              WHERE h.status = 'retryable' AND h.next_retry_at_ms <= p_now_ms
                AND NOT EXISTS (
                    SELECT 1 FROM room_outbox AS e
                     WHERE e.room_id = h.room_id AND e.app_code = h.app_code
                       AND e.status IN ('pending', 'delivering', 'retryable', 'failed')
                       AND (e.status <> 'failed' OR p_failed_blocks)
                       AND (e.created_at_ms < h.created_at_ms
                            OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)))
              ORDER BY h.created_at_ms, h.id LIMIT p_limit)
            UNION ALL
            (SELECT h.id, h.created_at_ms FROM room_outbox AS h
              WHERE h.status = 'delivering' AND h.lock_until_ms < p_now_ms
                AND NOT EXISTS (
                    SELECT 1 FROM room_outbox AS e
                     WHERE e.room_id = h.room_id AND e.app_code = h.app_code
                       AND e.status IN ('pending', 'delivering', 'retryable', 'failed')
                       AND (e.status <> 'failed' OR p_failed_blocks)
                       AND (e.created_at_ms < h.created_at_ms
                            OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)))
              ORDER BY h.created_at_ms, h.id LIMIT p_limit)
            ) AS claimable
            ORDER BY created_at_ms, id LIMIT p_limit
        ) AS heads;
        -- Then the heads that are still claimable, locked; one another claim holds is skipped.
        SELECT JSON_ARRAYAGG(JSON_ARRAY(id, status)) INTO v_picked FROM (
            SELECT c.id, c.status FROM room_outbox AS c
              JOIN JSON_TABLE(COALESCE(v_heads, JSON_ARRAY()), '$[*]' COLUMNS (id BIGINT PATH '$')) AS hd ON c.id = hd.id
             WHERE c.status = 'pending'
                OR (c.status = 'retryable' AND c.next_retry_at_ms <= p_now_ms)
                OR (c.status = 'delivering' AND c.lock_until_ms < p_now_ms)
             ORDER BY c.created_at_ms, c.id
             FOR UPDATE SKIP LOCKED
        ) AS picked;
        IF p_run > 1 AND v_picked IS NOT NULL THEN
            -- When the heads alone fill the claim, only events older than the last head can
            -- make the cut at the end.
            IF JSON_LENGTH(v_picked) >= p_limit THEN
                SELECT MAX(o.created_at_ms) INTO v_until
                  FROM JSON_TABLE(v_picked, '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS lp
                  JOIN room_outbox AS o ON o.id = lp.id;
            END IF;
            -- The runs after the locked heads: each room's next events in order, while each is
            -- claimable, found by a plain read.
            SELECT JSON_ARRAYAGG(id) INTO v_next FROM (
                SELECT r.id FROM (
                    SELECT x.id,
                           ROW_NUMBER() OVER w AS n,
                           MIN(x.status = 'pending'
                               OR (x.status = 'retryable' AND x.next_retry_at_ms <= p_now_ms)
                               OR (x.status = 'delivering' AND x.lock_until_ms < p_now_ms)) OVER w AS unbroken
                      FROM JSON_TABLE(v_picked, '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS hp
                      JOIN room_outbox AS h ON h.id = hp.id
                      JOIN room_outbox AS x ON x.room_id = h.room_id AND x.app_code = h.app_code
                     WHERE x.status IN ('pending', 'delivering', 'retryable', 'failed')
                       AND (x.status <> 'failed' OR p_failed_blocks)
                       AND (x.created_at_ms > h.created_at_ms
                            OR (x.created_at_ms = h.created_at_ms AND x.id > h.id))
                       AND x.created_at_ms <= v_until
                    WINDOW w AS (PARTITION BY x.app_code, x.room_id ORDER BY x.created_at_ms, x.id)
                ) AS r
                WHERE r.n < p_run AND r.unbroken = 1
            ) AS runs;
            -- Then locked, still claimable.
            SELECT JSON_ARRAYAGG(JSON_ARRAY(id, status)) INTO v_run FROM (
                SELECT c.id, c.status FROM room_outbox AS c
                  JOIN JSON_TABLE(COALESCE(v_next, JSON_ARRAY()), '$[*]' COLUMNS (id BIGINT PATH '$')) AS nx ON c.id = nx.id
                 WHERE c.status = 'pending'
                    OR (c.status = 'retryable' AND c.next_retry_at_ms <= p_now_ms)
                    OR (c.status = 'delivering' AND c.lock_until_ms < p_now_ms)
                 ORDER BY c.created_at_ms, c.id
                 FOR UPDATE
            ) AS locked;
            -- Heads and runs, cut to p_limit in creation order.
            SELECT JSON_ARRAYAGG(JSON_ARRAY(id, was)) INTO v_picked FROM (
                SELECT o.id, p.was FROM JSON_TABLE(JSON_MERGE_PRESERVE(v_picked, COALESCE(v_run, JSON_ARRAY())), '$[*]'
                                                   COLUMNS (id BIGINT PATH '$[0]', was VARCHAR(16) PATH '$[1]')) AS p
                  JOIN room_outbox AS o ON o.id = p.id
                 ORDER BY o.created_at_ms, o.id LIMIT p_limit
            ) AS cut;
        END IF;
    ELSE
        SELECT JSON_ARRAYAGG(JSON_ARRAY(id, status)) INTO v_picked FROM (
            SELECT id, status FROM (
                (SELECT id, status, created_at_ms FROM room_outbox
                  WHERE status = 'pending'
                  ORDER BY created_at_ms, id LIMIT p_limit FOR UPDATE SKIP LOCKED)
                UNION ALL
                (SELECT id, status, created_at_ms FROM room_outbox
                  WHERE status = 'retryable' AND next_retry_at_ms <= p_now_ms
                  ORDER BY created_at_ms, id LIMIT p_limit FOR UPDATE SKIP LOCKED)
                UNION ALL
                (SELECT id, status, created_at_ms FROM room_outbox
                  WHERE status = 'delivering' AND lock_until_ms < p_now_ms
                  ORDER BY created_at_ms, id LIMIT p_limit FOR UPDATE SKIP LOCKED)
            ) AS claimable
            ORDER BY created_at_ms, id LIMIT p_limit
        ) AS picked;
    END IF;
    IF v_picked IS NOT NULL THEN
        UPDATE room_outbox AS o
          JOIN JSON_TABLE(v_picked, '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS p ON o.id = p.id
           SET o.status = 'delivering', o.worker_id = p_worker_id, o.lock_until_ms = p_lock_until_ms,
               o.updated_at_ms = p_now_ms;
    END IF;
    SELECT o.id, o.app_code, o.event_id, o.event_type, o.room_id, o.envelope, o.created_at_ms,
           o.retry_count, p.was
      FROM JSON_TABLE(COALESCE(v_picked, JSON_ARRAY()), '$[*]'
                      COLUMNS (id BIGINT PATH '$[0]', was VARCHAR(16) PATH '$[1]')) AS p
      JOIN room_outbox AS o ON o.id = p.id
     ORDER BY o.created_at_ms, o.id;
    COMMIT;
END;
