-- Version 17 changes MySQL's claim procedure only (MariaDB's subquery cache is off during
-- a claim).
SELECT 1;
