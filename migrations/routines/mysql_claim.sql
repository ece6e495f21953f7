-- The claim of `ordering: none` in one round trip: `CALL {table}_claim(worker,
-- lock_until_ms, now_ms, limit)` picks up to p_limit claimable rows in creation order, one
-- index-ordered pick per claimable status with FOR UPDATE SKIP LOCKED (an OR across the
-- three would make InnoDB sort every claimable row), leases them, and returns them with the
-- status each had, in claim order. Rows picked but not kept stay locked only until the
-- procedure's transaction commits. SQL SECURITY INVOKER: the caller needs UPDATE on the
-- table as well as EXECUTE, so the procedure grants nothing its caller does not have.
-- Rendered for {table}, whose rows are named by {key}; the host installs it when its
-- stored checksum differs.
DROP PROCEDURE IF EXISTS {table}_claim;
CREATE PROCEDURE {table}_claim(IN p_worker_id VARCHAR(128), IN p_lock_until_ms BIGINT,
                               IN p_now_ms BIGINT, IN p_limit INT)
SQL SECURITY INVOKER
BEGIN
    DECLARE v_picked JSON;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    SELECT JSON_ARRAYAGG(JSON_ARRAY(k, status)) INTO v_picked FROM (
        SELECT k, status FROM (
            (SELECT {key_text} AS k, status, created_at_ms, {key} AS sk FROM {table}
              WHERE status = 'pending'
              ORDER BY created_at_ms, {key} LIMIT p_limit FOR UPDATE SKIP LOCKED)
            UNION ALL
            (SELECT {key_text} AS k, status, created_at_ms, {key} AS sk FROM {table}
              WHERE status = 'retryable' AND next_retry_at_ms <= p_now_ms
              ORDER BY created_at_ms, {key} LIMIT p_limit FOR UPDATE SKIP LOCKED)
            UNION ALL
            (SELECT {key_text} AS k, status, created_at_ms, {key} AS sk FROM {table}
              WHERE status = 'delivering' AND lock_until_ms < p_now_ms
              ORDER BY created_at_ms, {key} LIMIT p_limit FOR UPDATE SKIP LOCKED)
        ) AS claimable
        ORDER BY created_at_ms, sk LIMIT p_limit
    ) AS picked;
    IF v_picked IS NOT NULL THEN
        UPDATE {table} AS o
          JOIN JSON_TABLE(v_picked, '$[*]' COLUMNS (k {key_type} PATH '$[0]')) AS p ON o.{key} = p.k
           SET o.status = 'delivering', o.worker_id = p_worker_id, o.lock_until_ms = p_lock_until_ms,
               o.updated_at_ms = p_now_ms;
    END IF;
    SELECT {id}, o.app_code, o.event_id, o.event_type, o.room_id, o.envelope, o.created_at_ms,
           o.retry_count, o.trace_context, p.was
      FROM JSON_TABLE(COALESCE(v_picked, JSON_ARRAY()), '$[*]'
                      COLUMNS (k {key_type} PATH '$[0]', was VARCHAR(16) PATH '$[1]')) AS p
      JOIN {table} AS o ON o.{key} = p.k
     ORDER BY o.created_at_ms, o.{key};
    COMMIT;
END;
