-- Version 9 bounds MySQL's room runs by a walk of the claim index; this database's claim
-- already takes each room's run with a bounded walk of the room. Its head check asks for
-- the room's first unfinished event instead of whether any comes before the candidate. Version 5's NOT EXISTS, planned generically inside the function,
-- went through room_outbox_room_idx by room and creation time and read the room's delivered
-- events for every waiting event walked (7 ms of a 9 ms claim in a room of 500 events).
-- The room's first unfinished event, in creation order, is the first entry of
-- room_outbox_room_order_idx for the room; with sorting priced out no other index gives
-- that order, so the plan stays there. Replaces version 5's heads function; the claim
-- around it is unchanged. The host renames `room_outbox` when `outbox.table` says so.
CREATE OR REPLACE FUNCTION room_outbox_claim_heads(p_now_ms BIGINT, p_limit INTEGER, p_ordered BOOLEAN,
                                                   p_failed_blocks BOOLEAN)
RETURNS TABLE (id BIGINT, was TEXT, app_code TEXT, room_id TEXT, created_at_ms BIGINT)
LANGUAGE sql
ROWS 100
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_incremental_sort = off
SET jit = off
AS $$
    SELECT c.id::BIGINT AS id, c.status::TEXT, c.app_code::TEXT, c.room_id::TEXT, c.created_at_ms::BIGINT
      FROM room_outbox c
     WHERE c.status IN ('pending', 'retryable', 'delivering')
       AND (c.status = 'pending'
            OR (c.status = 'retryable' AND c.next_retry_at_ms <= p_now_ms)
            OR (c.status = 'delivering' AND c.lock_until_ms < p_now_ms))
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
$$;

