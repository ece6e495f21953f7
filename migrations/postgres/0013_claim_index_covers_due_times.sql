-- Version 13 changes MySQL's claim index only (it now holds the due times a claim checks).
SELECT 1;
