-- Version 5 is the claim routines' room runs on PostgreSQL and MySQL. SQLite takes a room's
-- run in its own claim transaction, in process.
SELECT 1;
