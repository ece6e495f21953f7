-- The claim procedure, able to keep each room's events in order (outbox_worker.ordering:
-- per_room). With p_ordered, a row is claimed only when no earlier row of its room
-- (app_code, room_id; by created_at_ms, then id) is still unfinished, so a claim takes at
-- most each room's head and no two hosts hold events of one room at once. A `failed` row
-- holds its room back only with p_failed_blocks. The heads are found by a plain read over
-- <table>_room_order_idx (which the host adds online beside this version), then locked.
-- Without p_ordered, as version 3, which this replaces. The host renames `room_outbox`
-- when `outbox.table` says so.
DROP PROCEDURE IF EXISTS room_outbox_claim;
CREATE PROCEDURE room_outbox_claim(IN p_worker_id VARCHAR(128), IN p_lock_until_ms BIGINT,
                                   IN p_now_ms BIGINT, IN p_limit INT,
                                   IN p_ordered BOOLEAN, IN p_failed_blocks BOOLEAN)
SQL SECURITY INVOKER
BEGIN
    DECLARE v_picked JSON;
    DECLARE v_heads JSON;
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
