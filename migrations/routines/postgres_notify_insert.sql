-- Wakes idle hosts when a producer inserts: one notification per INSERT statement (not per
-- row) on the channel `{table}_insert`, sent when the producer's transaction commits. A
-- producer in any language wakes the hosts with its plain INSERT; a busy host ignores it.
-- Rendered for {table}; the host installs it when its stored checksum differs.
CREATE OR REPLACE FUNCTION {table}_notify_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{table}_insert', '');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS {table}_notify_insert ON {table};
CREATE TRIGGER {table}_notify_insert AFTER INSERT ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {table}_notify_insert();
