-- Version 14 changes PostgreSQL's claim function only (its runs now end at the last head in
-- claim order, created_at_ms then key). SQLite's claim ends them there in the host's own
-- statement.
SELECT 1;
