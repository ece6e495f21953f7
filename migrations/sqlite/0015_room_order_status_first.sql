-- Version 15: SQLite's room order index leads with the status, (status, room_id, app_code,
-- created_at_ms), as MySQL's has since version 12. The claim asks each status's first event
-- in a room (one read each, never the room's backlog or its delivered history) and, when
-- busy rooms hold the claim's walk up, finds the other rooms with a pending event one read
-- per room. The old index (room first) is dropped here; the host builds the new one right
-- after the migrations, in the same transaction. The host renames `room_outbox` when
-- `outbox.table` says so.
DROP INDEX IF EXISTS room_outbox_room_order_idx;
