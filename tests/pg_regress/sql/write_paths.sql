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

-- COPY FROM (psql does not set LAST_ERROR_SQLSTATE for COPY, so show the SQLSTATE inline)
\set VERBOSITY sqlstate
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

-- tombstone keys do not depend on the session's output settings
CREATE TABLE slot (at timestamptz PRIMARY KEY, v text);
SELECT fencing_protect('slot');
SET TimeZone = 'UTC';
SELECT fenced_insert('slot', '{"at": "2024-01-01 00:00:00+00"}', 10) IS NOT NULL AS inserted;
SELECT fenced_delete('slot', '{"at": "2024-01-01 00:00:00+00"}', 20) IS NOT NULL AS deleted;
SET TimeZone = 'America/New_York';
SELECT fenced_insert('slot', '{"at": "2024-01-01 00:00:00+00", "v": "zombie"}', 15);
\echo :LAST_ERROR_SQLSTATE
SET DateStyle = 'SQL, DMY';
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO slot VALUES ('2024-01-01 00:00:00+00', 'zombie'); ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
RESET DateStyle;
RESET TimeZone;

-- keys with characters record_out quotes (vertical tab), through TRUNCATE and back
CREATE TABLE vt (k text PRIMARY KEY);
SELECT fencing_protect('vt');
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO vt VALUES ('a' || chr(11) || 'b'); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '20'; TRUNCATE vt; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO vt VALUES ('a' || chr(11) || 'b'); ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- a generated column in the primary key cannot identify a row in BEFORE INSERT: refused
CREATE TABLE gen (a int, b int GENERATED ALWAYS AS (a * 2) STORED, PRIMARY KEY (a, b));
SELECT fencing_protect('gen');
\echo :LAST_ERROR_SQLSTATE

-- the mark stored after an INSERT is the token stamped into the row
CREATE TABLE stamp (id int PRIMARY KEY, v text);
SELECT fencing_protect('stamp', 'stamp-res');
BEGIN; SET LOCAL pg_fencing.token = '10';
WITH ins AS (INSERT INTO stamp VALUES (1, 'x') RETURNING 1) SELECT set_config('pg_fencing.token', '7', true) FROM ins;
COMMIT;
SELECT id, fence_token, fencing_high_water('stamp-res') FROM stamp;
BEGIN; SET LOCAL pg_fencing.token = '8'; UPDATE stamp SET v = 'stale'; ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- a partition created by CREATE SCHEMA ... CREATE TABLE gets the TRUNCATE guard too
CREATE TABLE part (k int, id int, PRIMARY KEY (k, id)) PARTITION BY LIST (k);
CREATE TABLE part1 PARTITION OF part FOR VALUES IN (1);
SELECT fencing_protect('part');
CREATE SCHEMA s2 CREATE TABLE p2 PARTITION OF public.part FOR VALUES IN (2);
SELECT relation, active FROM fencing_protected_tables WHERE relation = 'part'::regclass;
TRUNCATE s2.p2;
\echo :LAST_ERROR_SQLSTATE

-- a relation that does not exist
SELECT fencing_protect(999999::regclass, 'x');
\echo :LAST_ERROR_SQLSTATE

-- per-row mode takes no lock per key: a bulk write does not exhaust the lock table
CREATE TABLE bulk (id int PRIMARY KEY);
SELECT fencing_protect('bulk');
BEGIN;
SET LOCAL pg_fencing.token = '3';
INSERT INTO bulk SELECT g FROM generate_series(1, 20000) g;
DELETE FROM bulk;
COMMIT;
SELECT tombstones FROM fencing_protected_tables WHERE relation = 'bulk'::regclass;
SELECT count(*) AS locks_left FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid();

-- TRUNCATE ... CASCADE reaching a protected table is fenced
CREATE TABLE parent (id int PRIMARY KEY);
CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent);
SELECT fencing_protect('child', 'child-res');
INSERT INTO parent VALUES (1);
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO child VALUES (1, 1); COMMIT;
TRUNCATE parent CASCADE;
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '4'; TRUNCATE parent CASCADE; ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '5'; TRUNCATE parent CASCADE; COMMIT;
SELECT count(*) FROM child;

-- a partition attached after fencing_protect is guarded, TRUNCATE included
CREATE TABLE att (k int, id int, PRIMARY KEY (k, id)) PARTITION BY LIST (k);
SELECT fencing_protect('att', 'att-res');
CREATE TABLE att1 (k int, id int, PRIMARY KEY (k, id));
-- a table to attach needs the token column, like any partition needs the parent's columns
ALTER TABLE att ATTACH PARTITION att1 FOR VALUES IN (1);
\echo :LAST_ERROR_SQLSTATE
ALTER TABLE att1 ADD COLUMN fence_token bigint;
INSERT INTO att1 VALUES (1, 1);
ALTER TABLE att ATTACH PARTITION att1 FOR VALUES IN (1);
SELECT relation, active FROM fencing_protected_tables WHERE relation = 'att'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '9'; UPDATE att1 SET id = 2; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '8'; UPDATE att SET id = 3; ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
TRUNCATE att1;
\echo :LAST_ERROR_SQLSTATE
-- resource mode: a row moving between partitions is one fenced write
CREATE TABLE att2 PARTITION OF att FOR VALUES IN (2);
BEGIN; SET LOCAL pg_fencing.token = '8'; UPDATE att SET k = 2; ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '10'; UPDATE att SET k = 2; COMMIT;
SELECT tableoid::regclass, *, fencing_high_water('att-res') FROM att;

-- per-row mode needs a primary key that is checked when each row is written (not DEFERRABLE):
-- refused at protect time, and refused at write time if made DEFERRABLE later
CREATE TABLE dk (id int PRIMARY KEY DEFERRABLE, v text);
SELECT fencing_protect('dk');
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE dk2 (id int, v text, CONSTRAINT dk2_pkey PRIMARY KEY (id));
SELECT fencing_protect('dk2');
ALTER TABLE dk2 DROP CONSTRAINT dk2_pkey, ADD CONSTRAINT dk2_pkey PRIMARY KEY (id) DEFERRABLE;
SELECT relation, active, inactive_reason FROM fencing_protected_tables WHERE relation = 'dk2'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO dk2 VALUES (1, 'x'); ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('dk2', '{"id": 1}', 5);
\echo :LAST_ERROR_SQLSTATE

-- tables whose rows could escape the guard are refused or shown inactive
CREATE TABLE inh_parent (id int PRIMARY KEY, v text);
CREATE TABLE inh_child () INHERITS (inh_parent);
SELECT fencing_protect('inh_parent');
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE inh2 (id int PRIMARY KEY, v text);
SELECT fencing_protect('inh2', 'inh2-res');
CREATE TABLE inh2_child () INHERITS (inh2);  -- refused (55000)
SELECT relation, active, inactive_reason FROM fencing_protected_tables WHERE relation = 'inh2'::regclass;
CREATE TABLE gtok (id int PRIMARY KEY, fence_token bigint GENERATED ALWAYS AS (1) STORED);
SELECT fencing_protect('gtok');
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE ren (id int PRIMARY KEY);
SELECT fencing_protect('ren');
ALTER TABLE ren RENAME COLUMN fence_token TO old_token;  -- refused (55000)
SELECT relation, active, inactive_reason FROM fencing_protected_tables WHERE relation = 'ren'::regclass;

-- a foreign partition cannot carry a TRUNCATE trigger: shown inactive, and other DDL still works
CREATE EXTENSION postgres_fdw;
CREATE SERVER nowhere FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '127.0.0.1', port '1');
CREATE TABLE fp (k int, id int) PARTITION BY LIST (k);
CREATE TABLE fp1 PARTITION OF fp FOR VALUES IN (1);
SELECT fencing_protect('fp', 'fp-res');
CREATE FOREIGN TABLE fp2 PARTITION OF fp FOR VALUES IN (2) SERVER nowhere;
CREATE TABLE after_foreign (i int);
SELECT relation, active, inactive_reason FROM fencing_protected_tables WHERE relation = 'fp'::regclass;
SELECT tgname FROM pg_trigger WHERE tgrelid = 'fp2'::regclass ORDER BY 1;

-- per-row tombstones are written in batches (at commit, before any tombstone read, every 10,000):
-- none is lost, a rolled-back savepoint takes its own back, and the deleting transaction sees its own
CREATE TABLE tb (id int PRIMARY KEY, v int);
SELECT fencing_protect('tb');
BEGIN;
SET LOCAL pg_fencing.token = '5';
INSERT INTO tb SELECT g, g FROM generate_series(1, 25000) g;
DELETE FROM tb WHERE id <= 20001;
-- (tombstones are rows of row_tombstone or keys of runs: 10,000 pending ones became a run)
CREATE TEMP VIEW tb_tombstones AS
SELECT t.key, t.high_water FROM _pg_fencing.row_tombstone t
  JOIN _pg_fencing.protected_table p ON p.id = t.protection_id WHERE p.relid = 'tb'::regclass
UNION ALL
SELECT k.key, r.high_water FROM _pg_fencing.tombstone_run r
  JOIN _pg_fencing.tombstone_chunk c USING (protection_id, run) CROSS JOIN unnest(c.keys) AS k(key)
  JOIN _pg_fencing.protected_table p ON p.id = r.protection_id WHERE p.relid = 'tb'::regclass;
SELECT count(*) AS tombstones_before_commit, count(DISTINCT key) AS keys FROM tb_tombstones;
SELECT count(*) AS runs, sum(key_count) AS run_keys FROM _pg_fencing.tombstone_run r
  JOIN _pg_fencing.protected_table p ON p.id = r.protection_id WHERE p.relid = 'tb'::regclass;
-- a re-insert in the same transaction reads the tombstone (flushed first): equal token is fine
INSERT INTO tb VALUES (20001, 0);
SAVEPOINT s1;
SET LOCAL pg_fencing.token = '7';
DELETE FROM tb WHERE id IN (20001, 20002);
ROLLBACK TO SAVEPOINT s1;
SAVEPOINT s2;
SET LOCAL pg_fencing.token = '6';
DELETE FROM tb WHERE id = 20003;
RELEASE SAVEPOINT s2;
COMMIT;
SELECT count(*) AS tombstones, max(high_water) AS highest,
       count(*) FILTER (WHERE high_water = 6) AS at_6
FROM tb_tombstones;
SELECT tombstones FROM fencing_protected_tables WHERE relation = 'tb'::regclass;
-- the keys deleted at 5 refuse token 4; 20002 (its delete at 7 was rolled back) still exists
BEGIN; SET LOCAL pg_fencing.token = '4'; INSERT INTO tb VALUES (17, 0); ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO tb VALUES (20003, 0); ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
SELECT id, fence_token FROM tb WHERE id IN (20001, 20002) ORDER BY id;
-- a transaction that deletes and then fails leaves no tombstone
BEGIN; SET LOCAL pg_fencing.token = '8'; DELETE FROM tb WHERE id = 24000; SELECT 1/0; COMMIT;
SELECT count(*) AS tombstones_of_24000 FROM _pg_fencing.row_tombstone WHERE key = '(24000)';
-- a tombstone flushed by a read inside a savepoint that then fails is not lost with it
BEGIN;
SET LOCAL pg_fencing.token = '9';
DELETE FROM tb WHERE id = 24001;
SAVEPOINT s3;
SET LOCAL pg_fencing.token = '8';
INSERT INTO tb VALUES (24001, 0);
ROLLBACK TO SAVEPOINT s3;
SET LOCAL pg_fencing.token = '8';
INSERT INTO tb VALUES (24001, 0);
ROLLBACK;
BEGIN;
SET LOCAL pg_fencing.token = '9';
DELETE FROM tb WHERE id = 24001;
SAVEPOINT s4;
SET LOCAL pg_fencing.token = '8';
INSERT INTO tb VALUES (24001, 0);
ROLLBACK TO SAVEPOINT s4;
COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '8'; INSERT INTO tb VALUES (24001, 0); ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
SELECT high_water FROM _pg_fencing.row_tombstone WHERE key = '(24001)';
