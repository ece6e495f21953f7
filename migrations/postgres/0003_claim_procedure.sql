-- Version 3 is MySQL's claim procedure. PostgreSQL's claim function came with version 2.
SELECT 1;
