-- Version 2 is PostgreSQL's insert notification and claim function. SQLite has neither:
-- idle hosts probe for pending rows instead (outbox_worker.wake_up: probe), over the claim
-- index of version 1, and the claim is a short transaction.
SELECT 1;
