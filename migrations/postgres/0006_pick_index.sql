-- Version 6 is SQLite's index of claimable rows in creation order; PostgreSQL's claim index
-- (created_at_ms, id over the claimable rows) has been that since version 1.
SELECT 1;
