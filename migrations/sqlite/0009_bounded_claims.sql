-- Version 9 bounds MySQL's room runs by a walk of the claim index and gives MySQL and
-- PostgreSQL a cheaper head check; this backend's claim already takes each room's run with
-- a bounded walk of the room and reads each room's earlier events through its index.
SELECT 1;
