-- Version 10 keeps PostgreSQL's claim plans for the connection's life and bounds its walk
-- of busy rooms' backlogs. This backend's claim statements are prepared once per store.
SELECT 1;
