-- Version 4 is the claim routines' room order on PostgreSQL and MySQL. SQLite's claim keeps
-- room order in its own statement; the host builds <table>_room_order_idx beside this.
SELECT 1;
