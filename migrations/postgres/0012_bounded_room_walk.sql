-- Version 12 changes MySQL's claim procedure and its room order index only. PostgreSQL's
-- claim has read each room instead of a busy room's backlog since version 10, and taken
-- whole runs behind few rooms since version 11.
SELECT 1;
