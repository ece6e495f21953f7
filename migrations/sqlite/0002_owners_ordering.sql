-- Version 2: each host of a sink says which room ordering it delivers with, so that a host
-- whose `outbox_worker.ordering` differs from the live hosts' refuses to start. Hosts of
-- both orderings keep a row here; only `per_room` ones share the partitions.

-- outbox-host: the outbox's own bookkeeping follows (a sink's own table has none of it).
ALTER TABLE room_outbox_owners ADD COLUMN ordering TEXT NOT NULL DEFAULT 'per_room';
