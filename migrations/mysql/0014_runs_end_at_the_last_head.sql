-- Version 14 changes PostgreSQL's claim function only (its runs now end at the last head in
-- claim order, created_at_ms then key). MySQL's claim has ended runs there since version 12.
SELECT 1;
