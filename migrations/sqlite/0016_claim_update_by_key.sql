-- Version 16 changes PostgreSQL's claim function only (its update no longer joins the taken
-- rows). SQLite's claim updates by a list of keys in the host's own statement.
SELECT 1;
