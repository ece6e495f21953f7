-- Version 15 changes SQLite's room order index only (status first, as MySQL's since version
-- 12). PostgreSQL's is partial, over unfinished rows, and its claim asks rooms already.
SELECT 1;
