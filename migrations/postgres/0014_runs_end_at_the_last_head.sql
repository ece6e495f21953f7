-- Version 14 ends a run at the last head in claim order, (created_at_ms, id), where
-- version 11 ended it at the last head's millisecond. With p_limit heads the cut keeps
-- rows in creation order, so nothing after the last head survives it; but every event of
-- a head's room in that millisecond was read, numbered and sorted first: when a backlog's
-- events share a millisecond (a batch inserted at once), seven per head, 700 rows per
-- claim of 100, all dropped. The bound is now an index condition on the room order index
-- (room_id, app_code, created_at_ms, id), so such a run ends with one read. MySQL's claim
-- has ended runs there since version 12. With fewer heads than p_limit, until_ms is still
-- the largest BIGINT, so the bound is always true. The host renames `room_outbox` when
-- `outbox.table` says so.
CREATE OR REPLACE FUNCTION room_outbox_claim(p_worker_id TEXT, p_lock_until_ms BIGINT, p_now_ms BIGINT, p_limit INTEGER,
                                             p_ordered BOOLEAN, p_failed_blocks BOOLEAN, p_run INTEGER)
RETURNS TABLE (id BIGINT, app_code VARCHAR, event_id VARCHAR, event_type VARCHAR, room_id VARCHAR,
               envelope BYTEA, created_at_ms BIGINT, retry_count INTEGER, was VARCHAR)
LANGUAGE plpgsql
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_incremental_sort = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT * FROM room_outbox_claim_heads(p_now_ms, p_limit, p_ordered, p_failed_blocks)),
    reach AS (
        SELECT CASE WHEN count(*) >= p_limit THEN max(picked.created_at_ms) ELSE 9223372036854775807 END AS until_ms,
               (SELECT l.id FROM picked l ORDER BY l.created_at_ms DESC, l.id DESC LIMIT 1) AS until_id,
               count(*) < p_limit AS few_rooms
          FROM picked),
    followers AS (
        SELECT f.id, f.was, f.created_at_ms, h.created_at_ms AS head_ms, h.id AS head_id FROM picked h CROSS JOIN reach
        CROSS JOIN LATERAL (
            SELECT n.id, n.was, n.created_at_ms,
                   bool_and(n.claimable) OVER (ORDER BY n.created_at_ms, n.id) AS unbroken
              FROM (SELECT x.id, x.status::TEXT AS was, x.created_at_ms,
                           (x.status = 'pending'
                            OR (x.status = 'retryable' AND x.next_retry_at_ms <= p_now_ms)
                            OR (x.status = 'delivering' AND x.lock_until_ms < p_now_ms)) AS claimable
                      FROM room_outbox x
                     WHERE x.room_id = h.room_id AND x.app_code = h.app_code
                       AND x.status IN ('pending', 'delivering', 'retryable', 'failed')
                       AND (x.status <> 'failed' OR p_failed_blocks)
                       AND (x.created_at_ms > h.created_at_ms
                            OR (x.created_at_ms = h.created_at_ms AND x.id > h.id))
                       -- Before the last head in claim order: the cut keeps nothing after it.
                       AND (x.created_at_ms, x.id) < (reach.until_ms, reach.until_id)
                     ORDER BY x.created_at_ms, x.id
                     LIMIT GREATEST(p_run - 1, 0)) AS n) AS f
        WHERE p_ordered AND p_run > 1 AND f.unbroken),
    taken AS (
        SELECT t.id, t.was FROM (SELECT p.id, p.was, p.created_at_ms, p.created_at_ms AS head_ms, p.id AS head_id
                                   FROM picked p
                                 UNION ALL
                                 SELECT f.id, f.was, f.created_at_ms, f.head_ms, f.head_id FROM followers f) AS t
        CROSS JOIN reach
        -- Fewer heads than the claim takes: whole runs, oldest head first. Otherwise
        -- creation order, heads and runs together.
        ORDER BY CASE WHEN reach.few_rooms THEN t.head_ms ELSE t.created_at_ms END,
                 CASE WHEN reach.few_rooms THEN t.head_id ELSE t.id END,
                 t.created_at_ms, t.id
        LIMIT p_limit)
    UPDATE room_outbox AS o
       SET status = 'delivering', worker_id = p_worker_id, lock_until_ms = p_lock_until_ms, updated_at_ms = p_now_ms
      FROM taken
     WHERE o.id = taken.id
       AND o.id = ANY (ARRAY(SELECT k.id FROM taken k))
       -- Still claimable when written (a follower is not locked before this), checked on the
       -- row found by its key: `IS TRUE` keeps the planner from reaching for the claim index.
       AND (o.status = 'pending'
            OR (o.status = 'retryable' AND o.next_retry_at_ms <= p_now_ms)
            OR (o.status = 'delivering' AND o.lock_until_ms < p_now_ms)) IS TRUE
    RETURNING o.id, o.app_code::VARCHAR, o.event_id::VARCHAR, o.event_type::VARCHAR, o.room_id::VARCHAR, o.envelope,
              o.created_at_ms, o.retry_count::INTEGER, taken.was::VARCHAR;
END;
$$;
