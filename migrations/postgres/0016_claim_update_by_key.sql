-- Version 16: the claim's update finds its rows by the taken keys alone, and reads each
-- row's status before the update from the row itself (a lookup by key in RETURNING, which
-- still sees the version the statement started from). Versions 10-14 joined the taken rows
-- (a CTE) for that status, and with hash and merge joins priced out PostgreSQL compared
-- every updated row with every taken row: a materialized list rescanned per row,
-- batch_size² comparisons. At the default 100 that is 10,000 (about 0.3 ms of a claim); at
-- batch_size 1,000 it was 31 ms of a 57 ms claim, and batch_size may be 10,000. Otherwise
-- the same function as version 14. The host renames `room_outbox` when `outbox.table`
-- says so.
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
     WHERE o.id = ANY (ARRAY(SELECT k.id FROM taken k))
       -- Still claimable when written (a follower is not locked before this), checked on the
       -- row found by its key: `IS TRUE` keeps the planner from reaching for the claim index.
       AND (o.status = 'pending'
            OR (o.status = 'retryable' AND o.next_retry_at_ms <= p_now_ms)
            OR (o.status = 'delivering' AND o.lock_until_ms < p_now_ms)) IS TRUE
    RETURNING o.id, o.app_code::VARCHAR, o.event_id::VARCHAR, o.event_type::VARCHAR, o.room_id::VARCHAR, o.envelope,
              o.created_at_ms, o.retry_count::INTEGER,
              -- The row's status before this update: the statement's own snapshot still
              -- sees the old version. One lookup by key per row (joining `taken` for it
              -- compared every row with every taken key).
              (SELECT w.status FROM room_outbox w WHERE w.id = o.id)::VARCHAR;
END;
$$;
