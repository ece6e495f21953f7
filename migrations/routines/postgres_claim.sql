-- The claim of `ordering: none`, one statement in one round trip: pick up to p_limit
-- claimable rows in creation order (skipping rows other claimers hold), lease them, return
-- them with the status each had. The function's own planner settings keep the pick on the
-- ordered walk of {table}_claim_idx that stops after p_limit rows, even when the statistics
-- are stale after a burst of inserts (then the planner would rather sort every claimable
-- row). Rendered for {table}, whose rows are named by {key}; the host installs it when its
-- stored checksum differs, after dropping every earlier claim routine of the table
-- (development versions had other signatures, and heads and rooms helpers).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.pronamespace = current_schema()::regnamespace
                AND p.proname IN (lower('{table}_claim'), lower('{table}_claim_heads'), lower('{table}_claim_rooms'))
    LOOP
        EXECUTE 'DROP FUNCTION ' || f;
    END LOOP;
END
$$;

CREATE FUNCTION {table}_claim(p_worker_id TEXT, p_lock_until_ms BIGINT, p_now_ms BIGINT, p_limit INTEGER)
RETURNS TABLE (id BIGINT, app_code VARCHAR, event_id VARCHAR, event_type VARCHAR, room_id VARCHAR,
               envelope BYTEA, created_at_ms BIGINT, retry_count INTEGER, trace_context VARCHAR, was VARCHAR)
LANGUAGE sql
SET enable_sort = off
SET enable_bitmapscan = off
AS $$
    WITH picked AS (
        SELECT c.{key} AS k, c.status AS was FROM {table} c
        WHERE c.status IN ('pending', 'retryable', 'delivering')
          AND (c.status = 'pending'
               OR (c.status = 'retryable' AND c.next_retry_at_ms <= p_now_ms)
               OR (c.status = 'delivering' AND c.lock_until_ms < p_now_ms))
        ORDER BY c.created_at_ms, c.{key}
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED)
    UPDATE {table} AS o
       SET status = 'delivering', worker_id = p_worker_id, lock_until_ms = p_lock_until_ms, updated_at_ms = p_now_ms
      FROM picked
     WHERE o.{key} = picked.k
    -- The casts let a table made elsewhere (TEXT strings, a BIGINT counter) return the
    -- declared result types; on the host's own table they change nothing.
    RETURNING {id}, o.app_code::VARCHAR, o.event_id::VARCHAR, o.event_type::VARCHAR, o.room_id::VARCHAR,
              o.envelope, o.created_at_ms, o.retry_count::INTEGER, o.trace_context::VARCHAR,
              picked.was::VARCHAR;
$$;
