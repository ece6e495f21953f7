-- Version 16 changes PostgreSQL's claim function only (its update no longer joins the taken
-- rows).
SELECT 1;
