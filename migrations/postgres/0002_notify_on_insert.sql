-- Wakes idle hosts when a producer inserts: one notification per INSERT statement (not per
-- row) on the channel `room_outbox_insert`, sent when the producer's transaction commits.
-- A producer in any language wakes the hosts with its plain INSERT; a host that is busy
-- ignores it. The host renames `room_outbox` when `outbox.table` says so.
CREATE OR REPLACE FUNCTION room_outbox_notify_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('room_outbox_insert', '');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS room_outbox_notify_insert ON room_outbox;
CREATE TRIGGER room_outbox_notify_insert AFTER INSERT ON room_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION room_outbox_notify_insert();
