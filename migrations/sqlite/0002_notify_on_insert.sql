-- Version 2 is PostgreSQL's insert notification. SQLite has none: idle hosts probe for
-- pending rows instead (outbox_worker.wake_up: probe), over the claim index of version 1.
SELECT 1;
