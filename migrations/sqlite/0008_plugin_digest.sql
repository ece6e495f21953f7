-- Which build of the sink produced a row's last outcome (issue 14: hot reload): the SHA-256
-- of the plugin's component, `sha256:<hex>`, written with every outcome. NULL before any.
-- The host renames `room_outbox` when `outbox.table` says so.
ALTER TABLE room_outbox ADD COLUMN plugin_digest TEXT;
