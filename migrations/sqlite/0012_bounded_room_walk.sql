-- Version 12 changes MySQL's claim procedure and its room order index only. SQLite's claim
-- is built by the host.
SELECT 1;
