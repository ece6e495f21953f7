-- The claim procedure's work no longer grows with a room's backlog or history. Replaces
-- version 5's procedure. The host renames `room_outbox` when `outbox.table` says so.
--
-- Runs. Version 5 numbered every later unfinished event of each picked head's room to keep
-- the first p_run - 1: with a deep backlog per room that was thousands of rows per claim
-- (about 60 ms a claim with 70 waiting events in each of 100 rooms). The runs now come from
-- a walk of the claim index in creation order, from the first picked head: at most p_limit
-- rows of each unfinished status, cut where the first of those walks that filled up ends,
-- so that every unfinished row before the cut was seen. A room's run is its picked head's
-- next events within that cut, while each is claimable. Only rows before the claim's own
-- cut at p_limit can be taken, so a run is cut where it could not have been taken anyway,
-- or where the walk of p_limit rows of one status ends.
--
-- Heads. Version 5 asked, for each waiting event, whether any unfinished event of its room
-- came before it, and MariaDB answered through the room index by room alone: every event of
-- the room, delivered ones included, for every waiting event walked (half a second a claim
-- with 5,000 waiting events in 50 rooms and 100 delivered in each). Now each unfinished
-- status is asked separately for the room's first event in that status, one index read
-- each, pinned to the room order index (on statistics taken before a burst MariaDB chose the
-- room index or the claim index and read a room's whole history again).
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
    DECLARE v_first_c BIGINT;
    DECLARE v_first_id BIGINT;
    DECLARE v_cut_c BIGINT;
    DECLARE v_cut_id BIGINT;
    DECLARE v_edge INT;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    IF p_ordered THEN
        -- Each room's head, found by a plain read: a locking read would lock every row of a
        -- hot room's backlog that it walks past. An event is a head when it is its room's
        -- first in its own status (asked once per room: MariaDB caches the answer by room)
        -- and the room's first event in each other unfinished status is not before it: one
        -- read of the room index each, where a check over every status at once reads the
        -- room's whole history, and one per event walked reads it once per event.
        SELECT JSON_ARRAYAGG(id) INTO v_heads FROM (
            SELECT id FROM (
            (SELECT h.id, h.created_at_ms FROM room_outbox AS h
              WHERE h.status = 'pending'
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
            -- Where the walk starts: the first picked head.
            SELECT MAX(f.created_at_ms), MAX(f.id) INTO v_first_c, v_first_id FROM (
                SELECT o.created_at_ms, o.id
                  FROM JSON_TABLE(v_picked, '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS fp
                  JOIN room_outbox AS o ON o.id = fp.id
                 ORDER BY o.created_at_ms, o.id LIMIT 1
            ) AS f;
            -- Where it is cut: the earliest end of a walk that filled its p_limit rows.
            SET v_edge = p_limit - 1;
            SELECT MAX(e.created_at_ms), MAX(e.id) INTO v_cut_c, v_cut_id FROM (
                SELECT created_at_ms, id FROM (
                (SELECT created_at_ms, id FROM room_outbox
                  WHERE status = 'pending' AND created_at_ms >= v_first_c
                    AND (created_at_ms > v_first_c OR id >= v_first_id)
                  ORDER BY created_at_ms, id LIMIT 1 OFFSET v_edge)
                UNION ALL
                (SELECT created_at_ms, id FROM room_outbox
                  WHERE status = 'retryable' AND created_at_ms >= v_first_c
                    AND (created_at_ms > v_first_c OR id >= v_first_id)
                  ORDER BY created_at_ms, id LIMIT 1 OFFSET v_edge)
                UNION ALL
                (SELECT created_at_ms, id FROM room_outbox
                  WHERE status = 'delivering' AND created_at_ms >= v_first_c
                    AND (created_at_ms > v_first_c OR id >= v_first_id)
                  ORDER BY created_at_ms, id LIMIT 1 OFFSET v_edge)
                UNION ALL
                (SELECT created_at_ms, id FROM room_outbox
                  WHERE status = 'failed' AND p_failed_blocks AND created_at_ms >= v_first_c
                    AND (created_at_ms > v_first_c OR id >= v_first_id)
                  ORDER BY created_at_ms, id LIMIT 1 OFFSET v_edge)
                ) AS edges
                ORDER BY created_at_ms, id LIMIT 1
            ) AS e;
            IF v_cut_c IS NULL THEN
                SET v_cut_c = 9223372036854775807;
                SET v_cut_id = 9223372036854775807;
            END IF;
            -- The runs after the locked heads: in each walked room whose first walked row is a
            -- picked head, the next rows in order while each is claimable, found by a plain read.
            SELECT JSON_ARRAYAGG(id) INTO v_next FROM (
                SELECT r.id FROM (
                    SELECT c.id,
                           ROW_NUMBER() OVER w AS n,
                           FIRST_VALUE(c.id) OVER w AS head,
                           MIN(c.status = 'pending'
                               OR (c.status = 'retryable' AND c.next_retry_at_ms <= p_now_ms)
                               OR (c.status = 'delivering' AND c.lock_until_ms < p_now_ms)) OVER w AS unbroken
                      FROM (
                (SELECT id FROM room_outbox
                  WHERE status = 'pending' AND created_at_ms >= v_first_c
                    AND (created_at_ms > v_first_c OR id >= v_first_id)
                  ORDER BY created_at_ms, id LIMIT p_limit)
                UNION ALL
                (SELECT id FROM room_outbox
                  WHERE status = 'retryable' AND created_at_ms >= v_first_c
                    AND (created_at_ms > v_first_c OR id >= v_first_id)
                  ORDER BY created_at_ms, id LIMIT p_limit)
                UNION ALL
                (SELECT id FROM room_outbox
                  WHERE status = 'delivering' AND created_at_ms >= v_first_c
                    AND (created_at_ms > v_first_c OR id >= v_first_id)
                  ORDER BY created_at_ms, id LIMIT p_limit)
                UNION ALL
                (SELECT id FROM room_outbox
                  WHERE status = 'failed' AND p_failed_blocks AND created_at_ms >= v_first_c
                    AND (created_at_ms > v_first_c OR id >= v_first_id)
                  ORDER BY created_at_ms, id LIMIT p_limit)
                      ) AS walk
                      JOIN room_outbox AS c ON c.id = walk.id
                     WHERE c.created_at_ms < v_cut_c OR (c.created_at_ms = v_cut_c AND c.id <= v_cut_id)
                    WINDOW w AS (PARTITION BY c.app_code, c.room_id ORDER BY c.created_at_ms, c.id)
                ) AS r
                JOIN JSON_TABLE(v_picked, '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS hp ON hp.id = r.head
                WHERE r.n BETWEEN 2 AND p_run AND r.unbroken = 1
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
