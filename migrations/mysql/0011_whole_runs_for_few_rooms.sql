-- Version 11 changes PostgreSQL's claim only: with fewer heads than the batch it takes
-- whole runs, oldest head first. MySQL's claim still cuts in creation order.
SELECT 1;
