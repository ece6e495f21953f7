-- Version 3 is MySQL's claim procedure. SQLite claims in one short transaction in process.
SELECT 1;
