-- Version 10 makes the claim's cost independent of the backlog of busy rooms, and stops
-- planning it on every call. The host renames `room_outbox` when `outbox.table` says so.
--
-- Plans. A SQL function is planned again each time a statement calls it: the claim and its
-- heads were planned on every claim (0.6 ms of a 0.7 ms empty claim, measured). Both are
-- now PL/pgSQL, whose plans live as long as the connection; `force_generic_plan` keeps the
-- plan that version 9's tests show (one plan for any parameters), and the settings each
-- function carries are in force when it is planned. A kept plan may have been made while
-- the table was empty, so nothing may depend on the statistics: every routine prices
-- sorting out (only the index's own order is cheap), and the update names the taken keys
-- (`id = ANY`), where a plan made on an empty table scanned the whole key for them.
--
-- Heads. Version 9 walked the claim index in creation order and asked each claimable event
-- whether it is its room's first. When every room with a backlog has its head in flight
-- (fewer rooms than the claim could take, or a large batch) that walk reads the whole
-- backlog on every claim, about 3 µs an event: the claim grows with the backlog and the
-- backlog with the claim (at 5,000 events/s over 50 rooms, p99 went to 10 s). The walk now
-- stops after 2 × p_limit claimable events. If it found fewer than p_limit heads and the
-- backlog goes on, the rest come from a walk of the rooms instead: one read of the room
-- order index per room with an unfinished event, taking each room's first, oldest first.
-- That costs one read per room, where the walk costs one per waiting event, so it is only
-- the fallback.
CREATE OR REPLACE FUNCTION room_outbox_claim_rooms(p_now_ms BIGINT, p_limit INTEGER, p_failed_blocks BOOLEAN,
                                                   p_after_ms BIGINT, p_after_id BIGINT)
RETURNS TABLE (id BIGINT, was TEXT, app_code TEXT, room_id TEXT, created_at_ms BIGINT)
LANGUAGE plpgsql
ROWS 100
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
    -- Each room with an unfinished event, one index read each (a loose scan of the room
    -- order index); its first unfinished event; the claimable ones after the walk's reach,
    -- oldest first, each locked as it is taken so that only the taken ones are locked.
    RETURN QUERY
    WITH RECURSIVE rooms AS (
        (SELECT r.room_id, r.app_code FROM room_outbox r
          WHERE r.status IN ('pending', 'delivering', 'retryable', 'failed')
          ORDER BY r.room_id, r.app_code
          LIMIT 1)
        UNION ALL
        SELECT n.room_id, n.app_code FROM rooms p CROSS JOIN LATERAL (
            SELECT r.room_id, r.app_code FROM room_outbox r
             WHERE r.status IN ('pending', 'delivering', 'retryable', 'failed')
               AND (r.room_id, r.app_code) > (p.room_id, p.app_code)
             ORDER BY r.room_id, r.app_code
             LIMIT 1) AS n),
    heads AS MATERIALIZED (
        SELECT h.id, h.created_at_ms FROM rooms CROSS JOIN LATERAL (
            SELECT e.id, e.status, e.created_at_ms, e.next_retry_at_ms, e.lock_until_ms FROM room_outbox e
             WHERE e.room_id = rooms.room_id AND e.app_code = rooms.app_code
               AND e.status IN ('pending', 'delivering', 'retryable', 'failed')
               AND (e.status <> 'failed' OR p_failed_blocks)
             ORDER BY e.created_at_ms, e.id
             LIMIT 1) AS h
         WHERE (h.created_at_ms, h.id) > (p_after_ms, p_after_id)
           AND (h.status = 'pending'
                OR (h.status = 'retryable' AND h.next_retry_at_ms <= p_now_ms)
                OR (h.status = 'delivering' AND h.lock_until_ms < p_now_ms))
         ORDER BY h.created_at_ms, h.id)
    SELECT t.id, t.was, t.app_code, t.room_id, t.created_at_ms FROM heads CROSS JOIN LATERAL (
        SELECT c.id::BIGINT AS id, c.status::TEXT AS was, c.app_code::TEXT, c.room_id::TEXT, c.created_at_ms::BIGINT
          FROM room_outbox c
         WHERE c.id = heads.id
           AND (c.status = 'pending'
                OR (c.status = 'retryable' AND c.next_retry_at_ms <= p_now_ms)
                OR (c.status = 'delivering' AND c.lock_until_ms < p_now_ms))
           FOR UPDATE SKIP LOCKED) AS t
     LIMIT p_limit;
END;
$$;

CREATE OR REPLACE FUNCTION room_outbox_claim_heads(p_now_ms BIGINT, p_limit INTEGER, p_ordered BOOLEAN,
                                                   p_failed_blocks BOOLEAN)
RETURNS TABLE (id BIGINT, was TEXT, app_code TEXT, room_id TEXT, created_at_ms BIGINT)
LANGUAGE plpgsql
ROWS 100
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_incremental_sort = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    reach_ms BIGINT;
    reach_id BIGINT;
    walked BIGINT;
BEGIN
    IF p_ordered THEN
        -- Where a walk of 2 × p_limit claimable events ends (none: the backlog ends first).
        SELECT c.created_at_ms, c.id INTO reach_ms, reach_id FROM room_outbox c
         WHERE c.status IN ('pending', 'retryable', 'delivering')
           AND (c.status = 'pending'
                OR (c.status = 'retryable' AND c.next_retry_at_ms <= p_now_ms)
                OR (c.status = 'delivering' AND c.lock_until_ms < p_now_ms))
         ORDER BY c.created_at_ms, c.id
        OFFSET 2 * p_limit - 1
         LIMIT 1;
    END IF;
    RETURN QUERY
    SELECT c.id::BIGINT AS id, c.status::TEXT, c.app_code::TEXT, c.room_id::TEXT, c.created_at_ms::BIGINT
      FROM room_outbox c
     WHERE c.status IN ('pending', 'retryable', 'delivering')
       AND (c.status = 'pending'
            OR (c.status = 'retryable' AND c.next_retry_at_ms <= p_now_ms)
            OR (c.status = 'delivering' AND c.lock_until_ms < p_now_ms))
       -- The walk's end: the first line bounds the index scan, the second the key within
       -- the last millisecond (no end: every row).
       AND c.created_at_ms <= COALESCE(reach_ms, 9223372036854775807)
       AND (reach_ms IS NULL OR c.created_at_ms < reach_ms OR c.id <= reach_id)
       AND (NOT p_ordered OR c.id = (
             SELECT e.id FROM room_outbox e
              WHERE e.room_id = c.room_id AND e.app_code = c.app_code
                AND e.status IN ('pending', 'delivering', 'retryable', 'failed')
                AND (e.status <> 'failed' OR p_failed_blocks)
              ORDER BY e.created_at_ms, e.id
              LIMIT 1))
     ORDER BY c.created_at_ms, c.id
     LIMIT p_limit
       FOR UPDATE SKIP LOCKED;
    GET DIAGNOSTICS walked = ROW_COUNT;
    IF reach_ms IS NOT NULL AND walked < p_limit THEN
        RETURN QUERY SELECT * FROM room_outbox_claim_rooms(p_now_ms, p_limit - walked::INTEGER, p_failed_blocks,
                                                         reach_ms, reach_id);
    END IF;
END;
$$;

-- The claim of version 5, its plan kept too; sorting priced out (the cut still sorts the
-- few rows taken: nothing else can) and the update by the taken keys.
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
        SELECT CASE WHEN count(*) >= p_limit THEN max(picked.created_at_ms) ELSE 9223372036854775807 END AS until_ms
          FROM picked),
    followers AS (
        SELECT f.id, f.was, f.created_at_ms FROM picked h CROSS JOIN reach
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
                       AND x.created_at_ms <= reach.until_ms
                     ORDER BY x.created_at_ms, x.id
                     LIMIT GREATEST(p_run - 1, 0)) AS n) AS f
        WHERE p_ordered AND p_run > 1 AND f.unbroken),
    taken AS (
        SELECT t.id, t.was FROM (SELECT p.id, p.was, p.created_at_ms FROM picked p
                                 UNION ALL
                                 SELECT f.id, f.was, f.created_at_ms FROM followers f) AS t
        ORDER BY t.created_at_ms, t.id
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
