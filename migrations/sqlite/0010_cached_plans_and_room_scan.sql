-- Version 10 changes PostgreSQL's claim routines only: plans kept for the connection's
-- life, and a walk of busy rooms' backlogs that stops and asks the rooms instead.
SELECT 1;
