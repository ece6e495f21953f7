-- Version 11 changes PostgreSQL's claim routine: with fewer heads than the batch it takes
-- whole runs, oldest head first. SQLite's claim is built by the host, which makes the same
-- cut; there is nothing to change in the database.
SELECT 1;
