-- Version 18: MySQL's ordered claim asks for runs only when one can exist; it picks the
-- same events as version 17's procedure, which it replaces. The host renames `room_outbox`
-- when `outbox.table` says so.
--
-- With p_limit heads, a run ends before the last head taken, and a run's event is a pending
-- event before that bound that is not a head. Over many rooms, every pending event up to
-- the bound is usually a head the claim took, and the runs' recursive query found nothing
-- for its cost: one read of the room order index and one of the row per head (about a
-- fifth of a claim of 100 in a drain of 100,000 events over 1,000 rooms, MariaDB 10.11).
-- The claim now counts the pending events up to the bound (a walk of the claim index as
-- long as the claim) against the pending heads it took, and asks for runs only when some
-- event is left over. With fewer heads than p_limit (few rooms, where runs pay) it asks as
-- before.

DROP PROCEDURE IF EXISTS room_outbox_claim;
CREATE PROCEDURE room_outbox_claim(IN p_worker_id VARCHAR(128), IN p_lock_until_ms BIGINT,
                                   IN p_now_ms BIGINT, IN p_limit INT,
                                   IN p_ordered BOOLEAN, IN p_failed_blocks BOOLEAN, IN p_run INT)
SQL SECURITY INVOKER
BEGIN
    DECLARE v_picked JSON;
    DECLARE v_heads JSON;
    DECLARE v_new JSON;
    DECLARE v_run JSON;
    DECLARE v_new_run JSON;
    DECLARE v_rooms JSON;
    DECLARE v_seen INT;
    DECLARE v_cut_c BIGINT;
    DECLARE v_edge INT;
    DECLARE v_few BOOLEAN;
    DECLARE v_bound_c BIGINT;
    DECLARE v_behind INT;
    DECLARE v_taken INT;
    DECLARE v_left INT;
    DECLARE v_asked BOOLEAN;
    DECLARE v_from INT;
    DECLARE v_turn INT;
    DECLARE v_turn_heads JSON;
    DECLARE v_switch VARCHAR(4096);
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN
        ROLLBACK;
        IF v_switch IS NOT NULL THEN
            SET SESSION optimizer_switch = v_switch;
        END IF;
        RESIGNAL;
    END;
    -- A room loop's read past the last room finds nothing: that ends the loop.
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
    -- MariaDB caches a correlated subquery's results by its outer values; each head check
    -- here asks about another event, so the cache only costs. (MySQL has no such cache.)
    IF VERSION() LIKE '%MariaDB%' THEN
        SET v_switch = @@SESSION.optimizer_switch;
        SET SESSION optimizer_switch = 'subquery_cache=off';
    END IF;
    START TRANSACTION;
    IF p_ordered THEN
        -- The cut: the earliest end of a per-status walk of 2 × p_limit claimable rows.
        SET v_edge = 2 * p_limit - 1;
        SELECT MAX(e.created_at_ms), MAX(e.id) INTO v_cut_c, @room_outbox_claim_cut_key FROM (
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
        -- No cut: every walk ended before 2 × p_limit rows. (The keys are user variables,
        -- which take the key column's type and collation, whatever the table's key is.)
        IF v_cut_c IS NULL THEN
            SET v_cut_c = 9223372036854775807;
        END IF;
        -- Each room's head up to the cut, found by a plain read (a locking read would lock
        -- every row of a hot room's backlog that it walks past). An event is a head when it
        -- is its room's first in its own status and the room's first event in each other
        -- unfinished status is not before it: one read of the room order index each.
        SELECT JSON_ARRAYAGG(id) INTO v_heads FROM (
            SELECT id FROM (
            (SELECT h.id, h.created_at_ms FROM room_outbox AS h
              WHERE h.status = 'pending'
                AND (h.created_at_ms < v_cut_c OR (h.created_at_ms = v_cut_c AND h.id <= @room_outbox_claim_cut_key))
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
                AND (h.created_at_ms < v_cut_c OR (h.created_at_ms = v_cut_c AND h.id <= @room_outbox_claim_cut_key))
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
                AND (h.created_at_ms < v_cut_c OR (h.created_at_ms = v_cut_c AND h.id <= @room_outbox_claim_cut_key))
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
        SET v_few = COALESCE(JSON_LENGTH(v_heads), 0) < p_limit;
        SET v_picked = JSON_ARRAY();
        SET v_run = JSON_ARRAY();
        SET v_left = p_limit;
        SET v_asked = FALSE;
        -- The heads in turns, oldest first: with fewer than p_limit, as many at a time as
        -- whole runs would fill the claim with, so that heads the claim cannot keep cost no
        -- runs; otherwise all at once.
        SET v_from = 0;
        SET v_turn = IF(v_few, CEIL(p_limit / GREATEST(p_run, 1)), p_limit);
        heads: LOOP
            IF v_from >= COALESCE(JSON_LENGTH(v_heads), 0) THEN
                SET v_turn_heads = NULL;
            ELSEIF v_from = 0 AND JSON_LENGTH(v_heads) <= v_turn THEN
                SET v_turn_heads = v_heads;
            ELSE
                SELECT JSON_ARRAYAGG(id) INTO v_turn_heads FROM (
                    SELECT o.id FROM JSON_TABLE(v_heads, '$[*]' COLUMNS (id BIGINT PATH '$')) AS hs
                      JOIN room_outbox AS o ON o.id = hs.id
                     ORDER BY o.created_at_ms, o.id LIMIT v_turn OFFSET v_from
                ) AS turn;
            END IF;
            SET v_from = v_from + v_turn;
            IF v_turn_heads IS NULL THEN
                IF v_asked OR NOT v_few OR v_cut_c = 9223372036854775807 THEN
                    LEAVE heads;
                END IF;
                SET v_asked = TRUE;
                -- The claim is not full and the backlog goes on past the cut: heads past it
                -- come from the rooms, each room's first event in each claimable status (one read
                -- of the room order index per room with such an event, in a loop: MariaDB has no
                -- LATERAL, and a recursive query cannot skip through an index; past 64 rooms with
                -- pending events, one scan), checked as a walked event is. Statuses with nothing
                -- claimable past the cut are not read.
                SET v_rooms = JSON_ARRAY();
                SET @room_outbox_claim_id = NULL;
                SELECT room_id, app_code, id INTO @room_outbox_claim_room, @room_outbox_claim_app, @room_outbox_claim_id
                  FROM room_outbox FORCE INDEX (room_outbox_room_order_idx)
                 WHERE status = 'pending'
                 ORDER BY status, room_id, app_code, created_at_ms, id LIMIT 1;
                SET v_seen = 1;
                WHILE @room_outbox_claim_id IS NOT NULL AND v_seen <= 64 DO
                    SET v_rooms = JSON_ARRAY_APPEND(v_rooms, '$', @room_outbox_claim_id);
                    SET v_seen = v_seen + 1;
                    SET @room_outbox_claim_id = NULL;
                    SELECT room_id, app_code, id INTO @room_outbox_claim_room, @room_outbox_claim_app, @room_outbox_claim_id
                      FROM room_outbox FORCE INDEX (room_outbox_room_order_idx)
                     WHERE status = 'pending' AND (room_id > @room_outbox_claim_room
                                              OR (room_id = @room_outbox_claim_room AND app_code > @room_outbox_claim_app))
                     ORDER BY status, room_id, app_code, created_at_ms, id LIMIT 1;
                END WHILE;
                IF @room_outbox_claim_id IS NOT NULL THEN
                    -- More rooms than a loop should read: one loose scan of the status's part of
                    -- the index instead, each room's first event by its first millisecond (on
                    -- statistics older than the backlog MariaDB reads the whole part, once).
                    SELECT JSON_ARRAYAGG(k) INTO v_rooms FROM (
                        SELECT MIN(f.id) AS k FROM (
                            SELECT status, room_id, app_code, MIN(created_at_ms) AS c
                              FROM room_outbox FORCE INDEX (room_outbox_room_order_idx)
                             WHERE status LIKE 'pending' GROUP BY status, room_id, app_code
                        ) AS r
                        JOIN room_outbox AS f FORCE INDEX (room_outbox_room_order_idx)
                          ON f.status = 'pending' AND f.room_id = r.room_id AND f.app_code = r.app_code
                         AND f.created_at_ms = r.c
                         GROUP BY r.room_id, r.app_code
                    ) AS firsts;
                    SET v_rooms = COALESCE(v_rooms, JSON_ARRAY());
                END IF;
                IF EXISTS (SELECT 1 FROM room_outbox WHERE status = 'retryable' AND created_at_ms >= v_cut_c
                                                            AND next_retry_at_ms <= p_now_ms) THEN
                    SET @room_outbox_claim_id = NULL;
                    SELECT room_id, app_code, id INTO @room_outbox_claim_room, @room_outbox_claim_app, @room_outbox_claim_id
                      FROM room_outbox FORCE INDEX (room_outbox_room_order_idx)
                     WHERE status = 'retryable'
                     ORDER BY status, room_id, app_code, created_at_ms, id LIMIT 1;
                    WHILE @room_outbox_claim_id IS NOT NULL DO
                        SET v_rooms = JSON_ARRAY_APPEND(v_rooms, '$', @room_outbox_claim_id);
                        SET @room_outbox_claim_id = NULL;
                        SELECT room_id, app_code, id INTO @room_outbox_claim_room, @room_outbox_claim_app, @room_outbox_claim_id
                          FROM room_outbox FORCE INDEX (room_outbox_room_order_idx)
                         WHERE status = 'retryable' AND (room_id > @room_outbox_claim_room
                                                  OR (room_id = @room_outbox_claim_room AND app_code > @room_outbox_claim_app))
                         ORDER BY status, room_id, app_code, created_at_ms, id LIMIT 1;
                    END WHILE;
                END IF;
                IF EXISTS (SELECT 1 FROM room_outbox WHERE status = 'delivering' AND created_at_ms >= v_cut_c
                                                            AND lock_until_ms < p_now_ms) THEN
                    SET @room_outbox_claim_id = NULL;
                    SELECT room_id, app_code, id INTO @room_outbox_claim_room, @room_outbox_claim_app, @room_outbox_claim_id
                      FROM room_outbox FORCE INDEX (room_outbox_room_order_idx)
                     WHERE status = 'delivering'
                     ORDER BY status, room_id, app_code, created_at_ms, id LIMIT 1;
                    WHILE @room_outbox_claim_id IS NOT NULL DO
                        SET v_rooms = JSON_ARRAY_APPEND(v_rooms, '$', @room_outbox_claim_id);
                        SET @room_outbox_claim_id = NULL;
                        SELECT room_id, app_code, id INTO @room_outbox_claim_room, @room_outbox_claim_app, @room_outbox_claim_id
                          FROM room_outbox FORCE INDEX (room_outbox_room_order_idx)
                         WHERE status = 'delivering' AND (room_id > @room_outbox_claim_room
                                                  OR (room_id = @room_outbox_claim_room AND app_code > @room_outbox_claim_app))
                         ORDER BY status, room_id, app_code, created_at_ms, id LIMIT 1;
                    END WHILE;
                END IF;
                SELECT JSON_ARRAYAGG(id) INTO v_heads FROM (
                    SELECT h.id FROM JSON_TABLE(v_rooms, '$[*]' COLUMNS (id BIGINT PATH '$')) AS rm
                      JOIN room_outbox AS h ON h.id = rm.id
                     WHERE (h.created_at_ms > v_cut_c OR (h.created_at_ms = v_cut_c AND h.id > @room_outbox_claim_cut_key))
                       AND (h.status = 'pending'
                            OR (h.status = 'retryable' AND h.next_retry_at_ms <= p_now_ms)
                            OR (h.status = 'delivering' AND h.lock_until_ms < p_now_ms))
                       AND (SELECT e.created_at_ms < h.created_at_ms OR (e.created_at_ms = h.created_at_ms AND e.id < h.id)
                               FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                              WHERE e.room_id = h.room_id AND e.app_code = h.app_code AND e.status = 'pending'
                              ORDER BY e.created_at_ms, e.id LIMIT 1) IS NOT TRUE
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
                     ORDER BY h.created_at_ms, h.id LIMIT v_left
                ) AS rest;
                SET v_from = 0;
                ITERATE heads;
            END IF;
            -- Then the heads that are still claimable, locked; one another claim holds is skipped.
            SELECT JSON_ARRAYAGG(JSON_ARRAY(id, status)) INTO v_new FROM (
                SELECT c.id, c.status FROM room_outbox AS c
                  JOIN JSON_TABLE(v_turn_heads, '$[*]' COLUMNS (id BIGINT PATH '$')) AS hd ON c.id = hd.id
                 WHERE c.status = 'pending'
                    OR (c.status = 'retryable' AND c.next_retry_at_ms <= p_now_ms)
                    OR (c.status = 'delivering' AND c.lock_until_ms < p_now_ms)
                 ORDER BY c.created_at_ms, c.id
                 FOR UPDATE SKIP LOCKED
            ) AS picked;
            SET v_new_run = NULL;
            IF p_run > 1 AND v_new IS NOT NULL THEN
                -- Runs end where the claim could not take them: with p_limit heads, at the last.
                SET v_bound_c = 9223372036854775807;
                SET @room_outbox_claim_bound_key = NULL;
                IF NOT v_few THEN
                    SELECT MAX(b.created_at_ms), MAX(b.id) INTO v_bound_c, @room_outbox_claim_bound_key FROM (
                        SELECT o.created_at_ms, o.id
                          FROM JSON_TABLE(v_new, '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS lp
                          JOIN room_outbox AS o ON o.id = lp.id
                         ORDER BY o.created_at_ms DESC, o.id DESC LIMIT 1
                    ) AS b;
                    -- A run's event is a pending one before that bound that is not a head. When
                    -- every pending event up to the bound is a head taken here, there is none,
                    -- and the runs' query is not asked. (A count that moved under a concurrent
                    -- claim or insert can only ask it needlessly, or leave a run for the next
                    -- claim; order holds either way.)
                    SELECT COUNT(*) INTO v_behind FROM room_outbox FORCE INDEX (room_outbox_claim_idx)
                     WHERE status = 'pending'
                       AND (created_at_ms < v_bound_c
                            OR (created_at_ms = v_bound_c AND id <= @room_outbox_claim_bound_key));
                    SELECT COUNT(*) INTO v_taken
                      FROM JSON_TABLE(v_new, '$[*]' COLUMNS (was VARCHAR(16) PATH '$[1]')) AS tk
                     WHERE tk.was = 'pending';
                END IF;
                IF v_few OR v_behind > v_taken THEN
                    SELECT JSON_ARRAYAGG(JSON_ARRAY(id, 'pending', head)) INTO v_new_run FROM (
                        WITH RECURSIVE run (head, room_id, app_code, c, id, n, next_id) AS (
                            SELECT o.id, o.room_id, o.app_code, o.created_at_ms, o.id, 1,
                                   (SELECT e.id FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                                         WHERE e.status = 'pending' AND e.room_id = o.room_id AND e.app_code = o.app_code
                                           AND (e.created_at_ms > o.created_at_ms OR (e.created_at_ms = o.created_at_ms AND e.id > o.id))
                                         ORDER BY e.created_at_ms, e.id LIMIT 1)
                              FROM JSON_TABLE(v_new, '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS hp
                              JOIN room_outbox AS o ON o.id = hp.id
                            UNION ALL
                            SELECT r.head, r.room_id, r.app_code, nx.created_at_ms, nx.id, r.n + 1,
                                   (SELECT e.id FROM room_outbox AS e FORCE INDEX (room_outbox_room_order_idx)
                                         WHERE e.status = 'pending' AND e.room_id = nx.room_id AND e.app_code = nx.app_code
                                           AND (e.created_at_ms > nx.created_at_ms OR (e.created_at_ms = nx.created_at_ms AND e.id > nx.id))
                                         ORDER BY e.created_at_ms, e.id LIMIT 1)
                              FROM run AS r
                              JOIN room_outbox AS nx ON nx.id = r.next_id
                             WHERE r.n < p_run
                               AND (nx.created_at_ms < v_bound_c OR (nx.created_at_ms = v_bound_c AND nx.id < @room_outbox_claim_bound_key))
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
                    ) AS r;
                END IF;
            END IF;
            SET v_picked = JSON_MERGE_PRESERVE(v_picked, COALESCE(v_new, JSON_ARRAY()));
            SET v_run = JSON_MERGE_PRESERVE(v_run, COALESCE(v_new_run, JSON_ARRAY()));
            SET v_left = p_limit - JSON_LENGTH(v_picked) - JSON_LENGTH(v_run);
            IF v_left <= 0 OR NOT v_few THEN
                LEAVE heads;
            END IF;
        END LOOP heads;
        IF JSON_LENGTH(v_run) > 0 THEN
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
            -- Then what was kept locked, waiting rather than skipping (only a producer's or an
            -- operator's short write can hold a run's event), still claimable.
            SELECT JSON_ARRAYAGG(JSON_ARRAY(id, was)) INTO v_picked FROM (
                SELECT c.id, k.was FROM room_outbox AS c
                  JOIN JSON_TABLE(v_picked, '$[*]' COLUMNS (id BIGINT PATH '$[0]', was VARCHAR(16) PATH '$[1]')) AS k
                    ON c.id = k.id
                 WHERE c.status = 'pending'
                    OR (c.status = 'retryable' AND c.next_retry_at_ms <= p_now_ms)
                    OR (c.status = 'delivering' AND c.lock_until_ms < p_now_ms)
                 ORDER BY c.created_at_ms, c.id
                 FOR UPDATE
            ) AS locked;
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
    IF v_switch IS NOT NULL THEN
        SET SESSION optimizer_switch = v_switch;
    END IF;
END;
