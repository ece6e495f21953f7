-- Version 18 changes MySQL's claim procedure only (it asks for runs only when one can
-- exist).
SELECT 1;
