-- The claim, able to keep each room's events in order (outbox_worker.ordering: per_room):
-- with p_ordered, a row is picked only when no earlier row of its room (app_code, room_id;
-- by created_at_ms, then id) is still unfinished, so a claim takes at most each room's
-- head and no two hosts hold events of one room at once. A `failed` row holds its room
-- back only with p_failed_blocks. The earlier-row probe walks <table>_room_order_idx,
-- which the host builds CONCURRENTLY beside this version. Replaces version 2's function.
-- The host renames `room_outbox` when `outbox.table` says so.
DROP FUNCTION IF EXISTS room_outbox_claim(TEXT, BIGINT, BIGINT, INTEGER);
CREATE OR REPLACE FUNCTION room_outbox_claim(p_worker_id TEXT, p_lock_until_ms BIGINT, p_now_ms BIGINT, p_limit INTEGER,
                                             p_ordered BOOLEAN, p_failed_blocks BOOLEAN)
RETURNS TABLE (id BIGINT, app_code VARCHAR, event_id VARCHAR, event_type VARCHAR, room_id VARCHAR,
               envelope BYTEA, created_at_ms BIGINT, retry_count INTEGER, was VARCHAR)
LANGUAGE sql
SET enable_sort = off
SET enable_bitmapscan = off
AS $$
    WITH picked AS (
        SELECT c.id, c.status AS was FROM room_outbox c
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
        FOR UPDATE SKIP LOCKED)
    UPDATE room_outbox AS o
       SET status = 'delivering', worker_id = p_worker_id, lock_until_ms = p_lock_until_ms, updated_at_ms = p_now_ms
      FROM picked
     WHERE o.id = picked.id
    RETURNING o.id, o.app_code::VARCHAR, o.event_id::VARCHAR, o.event_type::VARCHAR, o.room_id::VARCHAR, o.envelope,
              o.created_at_ms, o.retry_count::INTEGER, picked.was::VARCHAR;
$$;
