-- Version 12: MySQL's ordered claim no longer reads the backlog of busy rooms, and takes
-- whole runs when there are fewer rooms than the claim (what PostgreSQL's versions 10 and 11
-- do). Replaces version 9's procedure. The host renames `room_outbox` when `outbox.table`
-- says so.
--
-- Index. The room order index now leads with the status: (status, room_id, app_code,
-- created_at_ms, id). Every probe of version 9 names all three of status, room and app, so
-- it reads the same; and the rooms with a row in one status are now a loose scan of that
-- status's part of the index (one read per such room), where before it was every room the
-- table has ever held, delivered ones included. The index is rebuilt here in one online
-- ALTER (the old one serves until the new one is in place); on a table that does not have it
-- yet, the host adds it after the migrations, in the new order.
--
-- Heads. Version 9 walked each claimable status in creation order until it had p_limit
-- heads. When every room with a backlog has its head in flight, that walk reads the whole
-- backlog (1.5 µs an event: at 5,000 events/s over 50 rooms the claim slowed as the backlog
-- grew, and the backlog grew as the claim slowed). The walk now stops at a cut: where the
-- first of the per-status walks of 2 × p_limit claimable rows ends. If it found fewer than
-- p_limit heads and a walk was cut, the rest come from the rooms: each room's first row in
-- each claimable status, after the cut, checked as a walked row is.
--
-- Runs. Each picked head's run is its room's next pending events, one probe each, while no
-- event of another unfinished status comes between. With fewer heads than p_limit the claim
-- keeps whole runs, oldest head first; otherwise the p_limit oldest of heads and runs, as
-- before. A run here holds pending events only: an event waiting for its retry, or one
-- whose lease ran out, ends it (it is a head of a later claim).
SET @room_order = (
    SELECT IF(COUNT(*) = 0, 'DO 0',
              'ALTER TABLE room_outbox DROP INDEX room_outbox_room_order_idx, ADD INDEX room_outbox_room_order_idx (status, room_id, app_code, created_at_ms, id), ALGORITHM=INPLACE, LOCK=NONE')
      FROM information_schema.statistics
     WHERE table_schema = DATABASE() AND table_name = 'room_outbox'
       AND index_name = 'room_outbox_room_order_idx' AND seq_in_index = 1 AND column_name <> 'status');
PREPARE room_order FROM @room_order;
EXECUTE room_order;
DEALLOCATE PREPARE room_order;

DROP PROCEDURE IF EXISTS room_outbox_claim;
CREATE PROCEDURE room_outbox_claim(IN p_worker_id VARCHAR(128), IN p_lock_until_ms BIGINT,
                                   IN p_now_ms BIGINT, IN p_limit INT,
                                   IN p_ordered BOOLEAN, IN p_failed_blocks BOOLEAN, IN p_run INT)
SQL SECURITY INVOKER
BEGIN
    DECLARE v_picked JSON;
    DECLARE v_heads JSON;
    DECLARE v_rest JSON;
    DECLARE v_run JSON;
    DECLARE v_cut_c BIGINT;
    DECLARE v_cut_id BIGINT;
    DECLARE v_edge INT;
    DECLARE v_few BOOLEAN;
    DECLARE v_bound_c BIGINT;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    IF p_ordered THEN
        -- The cut: the earliest end of a per-status walk of 2 × p_limit claimable rows.
        SET v_edge = 2 * p_limit - 1;
        SELECT MAX(e.created_at_ms), MAX(e.id) INTO v_cut_c, v_cut_id FROM (
            SELECT created_at_ms, id FROM (
            (SELECT created_at_ms, id FROM room_outbox WHERE status = 'pending'
              ORDER BY created_at_ms, id LIMIT 1 OFFSET v_edge)
            UNION ALL
            (SELECT created_at_ms, id FROM room_outbox WHERE status = 'retryable' AND next_retry_at_ms <= p_now_ms
              ORDER BY created_at_ms, id LIMIT 1 OFFSET v_edge)
            UNION ALL
            (SELECT created_at_ms, id FROM room_outbox WHERE status = 'delivering' AND lock_until_ms < p_now_ms
              ORDER BY created_at_ms, id LIMIT 1 OFFSET v_edge)
            ) AS edges
            ORDER BY created_at_ms, id LIMIT 1
        ) AS e;
        IF v_cut_c IS NULL THEN
            SET v_cut_c = 9223372036854775807;
            SET v_cut_id = 9223372036854775807;
        END IF;
        -- Each room's head up to the cut, found by a plain read (a locking read would lock
        -- every row of a hot room's backlog that it walks past). An event is a head when it
        -- is its room's first in its own status and the room's first event in each other
        -- unfinished status is not before it: one read of the room order index each.
        SELECT JSON_ARRAYAGG(id) INTO v_heads FROM (
            SELECT id FROM (
            (SELECT h.id, h.created_at_ms FROM room_outbox AS h
              WHERE h.status = 'pending'
                AND (h.created_at_ms < v_cut_c OR (h.created_at_ms = v_cut_c AND h.id <= v_cut_id))
                AND h.id = (SELECT e.id FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                             WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'pending'
                             ORDER BY e.created_at_ms, e.id LIMIT 1)
                AND (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'delivering'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE
                AND (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'retryable'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE
                AND (NOT p_failed_blocks
                     OR (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'failed'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE)
              ORDER BY h.created_at_ms, h.id LIMIT p_limit)
            UNION ALL
            (SELECT h.id, h.created_at_ms FROM room_outbox AS h
              WHERE h.status = 'retryable' AND h.next_retry_at_ms <= p_now_ms
                AND (h.created_at_ms < v_cut_c OR (h.created_at_ms = v_cut_c AND h.id <= v_cut_id))
                AND h.id = (SELECT e.id FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                             WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'retryable'
                             ORDER BY e.created_at_ms, e.id LIMIT 1)
                AND (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'pending'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE
                AND (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'delivering'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE
                AND (NOT p_failed_blocks
                     OR (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'failed'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE)
              ORDER BY h.created_at_ms, h.id LIMIT p_limit)
            UNION ALL
            (SELECT h.id, h.created_at_ms FROM room_outbox AS h
              WHERE h.status = 'delivering' AND h.lock_until_ms < p_now_ms
                AND (h.created_at_ms < v_cut_c OR (h.created_at_ms = v_cut_c AND h.id <= v_cut_id))
                AND h.id = (SELECT e.id FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                             WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'delivering'
                             ORDER BY e.created_at_ms, e.id LIMIT 1)
                AND (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'pending'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE
                AND (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'retryable'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE
                AND (NOT p_failed_blocks
                     OR (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'failed'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE)
              ORDER BY h.created_at_ms, h.id LIMIT p_limit)
            ) AS claimable
            ORDER BY created_at_ms, id LIMIT p_limit
        ) AS heads;
        IF COALESCE(JSON_LENGTH(v_heads), 0) < p_limit AND v_cut_c < 9223372036854775807 THEN
            -- Fewer than p_limit, and the backlog goes on past the cut: the heads after it
            -- come from the rooms, each room's first row in each claimable status.
        SELECT JSON_ARRAYAGG(id) INTO v_rest FROM (
            SELECT id FROM (
            (SELECT h.id, h.created_at_ms FROM (
                SELECT status, room_id, app_code FROM room_outbox FORCE INDEX (room_outbox_room_order_idx)
                 WHERE status LIKE 'pending' GROUP BY status, room_id, app_code) AS r
              JOIN room_outbox AS h ON h.id = (SELECT e.id FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                             WHERE e.status = 'pending' AND e.room_id = r.room_id AND e.app_code = r.app_code
                             ORDER BY e.created_at_ms, e.id LIMIT 1)
              WHERE h.status = 'pending'
                AND (h.created_at_ms > v_cut_c OR (h.created_at_ms = v_cut_c AND h.id > v_cut_id))
                AND (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'delivering'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE
                AND (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'retryable'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE
                AND (NOT p_failed_blocks
                     OR (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'failed'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE)
              ORDER BY h.created_at_ms, h.id LIMIT p_limit)
            UNION ALL
            (SELECT h.id, h.created_at_ms FROM (
                SELECT status, room_id, app_code FROM room_outbox FORCE INDEX (room_outbox_room_order_idx)
                 WHERE status LIKE 'retryable' GROUP BY status, room_id, app_code) AS r
              JOIN room_outbox AS h ON h.id = (SELECT e.id FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                             WHERE e.status = 'retryable' AND e.room_id = r.room_id AND e.app_code = r.app_code
                             ORDER BY e.created_at_ms, e.id LIMIT 1)
              WHERE h.status = 'retryable' AND h.next_retry_at_ms <= p_now_ms
                AND (h.created_at_ms > v_cut_c OR (h.created_at_ms = v_cut_c AND h.id > v_cut_id))
                AND (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'pending'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE
                AND (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'delivering'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE
                AND (NOT p_failed_blocks
                     OR (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'failed'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE)
              ORDER BY h.created_at_ms, h.id LIMIT p_limit)
            UNION ALL
            (SELECT h.id, h.created_at_ms FROM (
                SELECT status, room_id, app_code FROM room_outbox FORCE INDEX (room_outbox_room_order_idx)
                 WHERE status LIKE 'delivering' GROUP BY status, room_id, app_code) AS r
              JOIN room_outbox AS h ON h.id = (SELECT e.id FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                             WHERE e.status = 'delivering' AND e.room_id = r.room_id AND e.app_code = r.app_code
                             ORDER BY e.created_at_ms, e.id LIMIT 1)
              WHERE h.status = 'delivering' AND h.lock_until_ms < p_now_ms
                AND (h.created_at_ms > v_cut_c OR (h.created_at_ms = v_cut_c AND h.id > v_cut_id))
                AND (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'pending'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE
                AND (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'retryable'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE
                AND (NOT p_failed_blocks
                     OR (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                       FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                      WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'failed'
                      ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE)
              ORDER BY h.created_at_ms, h.id LIMIT p_limit)
            ) AS claimable
            ORDER BY created_at_ms, id LIMIT p_limit
        ) AS rest;
            SET v_heads = JSON_MERGE_PRESERVE(COALESCE(v_heads, JSON_ARRAY()), COALESCE(v_rest, JSON_ARRAY()));
        END IF;
        SET v_few = COALESCE(JSON_LENGTH(v_heads), 0) < p_limit;
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
            -- Runs end where the claim could not take them: with p_limit heads, at the last.
            SET v_bound_c = 9223372036854775807;
            IF NOT v_few THEN
                SELECT MAX(o.created_at_ms) INTO v_bound_c
                  FROM JSON_TABLE(v_picked, '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS lp
                  JOIN room_outbox AS o ON o.id = lp.id;
            END IF;
            -- Each picked head's run: its room's next pending event, one probe each, while
            -- no event of another unfinished status comes between; then locked.
            SELECT JSON_ARRAYAGG(JSON_ARRAY(id, status, head)) INTO v_run FROM (
                SELECT c.id, c.status, r.head FROM (
                    WITH RECURSIVE run (head, room_id, app_code, c, id, n) AS (
                        SELECT o.id, o.room_id, o.app_code, o.created_at_ms, o.id, 1
                          FROM JSON_TABLE(v_picked, '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS hp
                          JOIN room_outbox AS o ON o.id = hp.id
                        UNION ALL
                        SELECT r.head, r.room_id, r.app_code, nx.created_at_ms, nx.id, r.n + 1
                          FROM run AS r
                          JOIN room_outbox AS nx ON nx.id = (
                              SELECT e.id FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                               WHERE e.status = 'pending' AND e.room_id = r.room_id AND e.app_code = r.app_code
                                 AND (e.created_at_ms > r.c OR (e.created_at_ms = r.c AND e.id > r.id))
                                 AND e.created_at_ms <= v_bound_c
                               ORDER BY e.created_at_ms, e.id LIMIT 1)
                         WHERE r.n < p_run
                           AND NOT EXISTS (
                               SELECT 1 FROM room_outbox AS b FORCE INDEX (room_outbox_room_order_idx)
                                WHERE b.status = 'delivering' AND b.room_id = r.room_id AND b.app_code = r.app_code
                                  AND (b.created_at_ms > r.c OR (b.created_at_ms = r.c AND b.id > r.id))
                                  AND (b.created_at_ms < nx.created_at_ms OR (b.created_at_ms = nx.created_at_ms AND b.id < nx.id)))
                           AND NOT EXISTS (
                               SELECT 1 FROM room_outbox AS b FORCE INDEX (room_outbox_room_order_idx)
                                WHERE b.status = 'retryable' AND b.room_id = r.room_id AND b.app_code = r.app_code
                                  AND (b.created_at_ms > r.c OR (b.created_at_ms = r.c AND b.id > r.id))
                                  AND (b.created_at_ms < nx.created_at_ms OR (b.created_at_ms = nx.created_at_ms AND b.id < nx.id)))
                           AND (NOT p_failed_blocks OR NOT EXISTS (
                               SELECT 1 FROM room_outbox AS b FORCE INDEX (room_outbox_room_order_idx)
                                WHERE b.status = 'failed' AND b.room_id = r.room_id AND b.app_code = r.app_code
                                  AND (b.created_at_ms > r.c OR (b.created_at_ms = r.c AND b.id > r.id))
                                  AND (b.created_at_ms < nx.created_at_ms OR (b.created_at_ms = nx.created_at_ms AND b.id < nx.id))))
                    )
                    SELECT head, id FROM run WHERE n > 1
                ) AS r
                JOIN room_outbox AS c ON c.id = r.id
                WHERE c.status = 'pending'
                ORDER BY c.created_at_ms, c.id
                FOR UPDATE
            ) AS locked;
            -- Heads and runs, cut to p_limit: with fewer heads than p_limit whole runs,
            -- oldest head first; otherwise in creation order.
            SELECT JSON_ARRAYAGG(JSON_ARRAY(id, was)) INTO v_picked FROM (
                SELECT o.id, p.was FROM JSON_TABLE(JSON_MERGE_PRESERVE(v_picked, COALESCE(v_run, JSON_ARRAY())), '$[*]'
                                                   COLUMNS (id BIGINT PATH '$[0]', was VARCHAR(16) PATH '$[1]',
                                                            head BIGINT PATH '$[2]')) AS p
                  JOIN room_outbox AS o ON o.id = p.id
                  JOIN room_outbox AS h ON h.id = COALESCE(p.head, p.id)
                 ORDER BY IF(v_few, h.created_at_ms, o.created_at_ms), IF(v_few, h.id, o.id),
                          o.created_at_ms, o.id
                 LIMIT p_limit
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
