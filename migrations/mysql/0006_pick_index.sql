-- Version 6 is SQLite's index of claimable rows in creation order; MySQL's claim walks its
-- claim index per status.
SELECT 1;
