-- Version 10 keeps PostgreSQL's claim plans for the connection's life and bounds its walk
-- of busy rooms' backlogs. This database's head check asks each room once per claim
-- (version 9: the subquery cache), so a busy room's backlog costs a cache lookup per event.
SELECT 1;
