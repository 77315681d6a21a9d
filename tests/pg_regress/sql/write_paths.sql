-- Every path that changes rows is fenced: MERGE, COPY FROM, partition moves, direct partition writes.
\set SHOW_CONTEXT never
CREATE TABLE stock (sku int PRIMARY KEY, qty int);
SELECT fencing_protect('stock', 'depot');
BEGIN; SET LOCAL pg_fencing.token = '50'; INSERT INTO stock VALUES (1, 10), (2, 20); COMMIT;

-- MERGE
BEGIN; SET LOCAL pg_fencing.token = '49';
MERGE INTO stock s USING (VALUES (1, 11), (3, 30)) v(sku, qty) ON s.sku = v.sku
WHEN MATCHED THEN UPDATE SET qty = v.qty WHEN NOT MATCHED THEN INSERT VALUES (v.sku, v.qty);
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '51';
MERGE INTO stock s USING (VALUES (1, 11), (3, 30)) v(sku, qty) ON s.sku = v.sku
WHEN MATCHED THEN UPDATE SET qty = v.qty WHEN NOT MATCHED THEN INSERT VALUES (v.sku, v.qty);
COMMIT;
SELECT * FROM stock ORDER BY sku;

-- COPY FROM (psql does not set LAST_ERROR_SQLSTATE for COPY, so show the SQLSTATE inline;
-- for pg_fencing's own errors the LOCATION line is stable)
\set VERBOSITY verbose
BEGIN; SET LOCAL pg_fencing.token = '50';
COPY stock (sku, qty) FROM stdin;
4	40
\.
ROLLBACK;
COPY stock (sku, qty) FROM stdin;
4	40
\.
\set VERBOSITY default
BEGIN; SET LOCAL pg_fencing.token = '52';
COPY stock (sku, qty) FROM stdin;
4	40
\.
COMMIT;
SELECT * FROM stock ORDER BY sku;
SELECT fencing_high_water('depot');

-- per-row mode on a partitioned table: a row moving between partitions keeps its fence
CREATE TABLE task (region text, id int, state text, PRIMARY KEY (region, id)) PARTITION BY LIST (region);
CREATE TABLE task_eu PARTITION OF task FOR VALUES IN ('eu');
CREATE TABLE task_us PARTITION OF task FOR VALUES IN ('us');
SELECT fencing_protect('task');
BEGIN; SET LOCAL pg_fencing.token = '7'; INSERT INTO task VALUES ('eu', 1, 'new'); COMMIT;
-- stale move refused
BEGIN; SET LOCAL pg_fencing.token = '6'; UPDATE task SET region = 'us' WHERE id = 1; ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
-- current move accepted; the old key keeps a tombstone
BEGIN; SET LOCAL pg_fencing.token = '8'; UPDATE task SET region = 'us' WHERE id = 1; COMMIT;
SELECT tableoid::regclass, * FROM task;
BEGIN; SET LOCAL pg_fencing.token = '7'; INSERT INTO task_eu VALUES ('eu', 1, 'zombie'); ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
-- direct writes to a partition are fenced like writes through the parent
BEGIN; SET LOCAL pg_fencing.token = '7'; UPDATE task_us SET state = 'zombie' WHERE id = 1; ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '7'; TRUNCATE task_us; ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '9'; UPDATE task_us SET state = 'done' WHERE id = 1; COMMIT;
SELECT * FROM task;

-- a write through a data-modifying CTE is fenced too
WITH w AS (UPDATE stock SET qty = 0 WHERE sku = 1 RETURNING sku) SELECT count(*) FROM w;
\echo :LAST_ERROR_SQLSTATE
