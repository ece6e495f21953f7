-- The claim takes a room's run (outbox_worker.ordering: per_room): each room's head as in
-- version 4, and after each head up to p_run - 1 of the room's next unfinished events, as
-- long as every one of them is claimable too (none waits for its retry time or is held
-- under a live lease). Nobody else can take those: while their head is unfinished they are
-- not heads. The whole claim is cut to p_limit rows in creation order, which keeps each
-- room's rows a prefix of its run; when the heads alone fill p_limit, only events older
-- than the last head can make the cut, so the follower walks stop there.
--
-- The heads are picked in a function of their own, whose planner settings keep the pick on
-- the ordered walk of room_outbox_claim_idx (see version 2); the claim itself sorts at most
-- p_limit × p_run rows, which those settings would price out of reach (and JIT would then
-- compile a plan that runs in a millisecond). Its own settings keep the rest on what a
-- claim of p_limit rows needs when the statistics are stale after a burst: the runs walk
-- room_outbox_room_order_idx, and the update finds each row by its key (nested loops; a
-- hash join would read every claimable row). Replaces version 4's function. The host
-- renames `room_outbox` when `outbox.table` says so.
DROP FUNCTION IF EXISTS room_outbox_claim(TEXT, BIGINT, BIGINT, INTEGER, BOOLEAN, BOOLEAN);
DROP FUNCTION IF EXISTS room_outbox_claim_heads(BIGINT, INTEGER, BOOLEAN, BOOLEAN);
CREATE OR REPLACE FUNCTION room_outbox_claim_heads(p_now_ms BIGINT, p_limit INTEGER, p_ordered BOOLEAN,
                                                   p_failed_blocks BOOLEAN)
RETURNS TABLE (id BIGINT, was TEXT, app_code TEXT, room_id TEXT, created_at_ms BIGINT)
LANGUAGE sql
ROWS 100
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
AS $$
    SELECT c.id::BIGINT AS id, c.status::TEXT, c.app_code::TEXT, c.room_id::TEXT, c.created_at_ms::BIGINT
      FROM room_outbox c
     WHERE c.status IN ('pending', 'retryable', 'delivering')
       AND (c.status = 'pending'
            OR (c.status = 'retryable' AND c.next_retry_at_ms <= p_now_ms)
            OR (c.status = 'delivering' AND c.lock_until_ms < p_now_ms))
       AND (NOT p_ordered OR NOT EXISTS (
             SELECT 1 FROM room_outbox e
              WHERE e.room_id = c.room_id AND e.app_code = c.app_code
                AND e.status IN ('pending', 'delivering', 'retryable', 'failed')
                AND (e.status <> 'failed' OR p_failed_blocks)
                AND (e.created_at_ms < c.created_at_ms
                     OR (e.created_at_ms = c.created_at_ms AND e.id < c.id))))
     ORDER BY c.created_at_ms, c.id
     LIMIT p_limit
       FOR UPDATE SKIP LOCKED;
$$;

CREATE OR REPLACE FUNCTION room_outbox_claim(p_worker_id TEXT, p_lock_until_ms BIGINT, p_now_ms BIGINT, p_limit INTEGER,
                                             p_ordered BOOLEAN, p_failed_blocks BOOLEAN, p_run INTEGER)
RETURNS TABLE (id BIGINT, app_code VARCHAR, event_id VARCHAR, event_type VARCHAR, room_id VARCHAR,
               envelope BYTEA, created_at_ms BIGINT, retry_count INTEGER, was VARCHAR)
LANGUAGE sql
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
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
       -- Still claimable when written (a follower is not locked before this), checked on the
       -- row found by its key: `IS TRUE` keeps the planner from reaching for the claim index.
       AND (o.status = 'pending'
            OR (o.status = 'retryable' AND o.next_retry_at_ms <= p_now_ms)
            OR (o.status = 'delivering' AND o.lock_until_ms < p_now_ms)) IS TRUE
    RETURNING o.id, o.app_code::VARCHAR, o.event_id::VARCHAR, o.event_type::VARCHAR, o.room_id::VARCHAR, o.envelope,
              o.created_at_ms, o.retry_count::INTEGER, taken.was::VARCHAR;
$$;
