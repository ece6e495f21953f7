-- Version 15 changes SQLite's room order index only: it now leads with the status, as this
-- backend's has since version 12.
SELECT 1;
