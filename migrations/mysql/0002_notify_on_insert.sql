-- Version 2 is PostgreSQL's insert notification. MySQL has none: idle hosts probe for
-- pending rows instead (outbox_worker.wake_up: probe), over the claim index of version 1.
DO 0;
