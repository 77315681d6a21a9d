-- A protection that cannot hold refuses every write with FT004 (docs/guarantees.md, "When a
-- protection is not active"): whatever reason fencing_protected_tables.inactive_reason gives, on
-- every write path, before the token is looked at. fencing_protect repairs the firing modes that
-- ALTER TABLE ... ENABLE/DISABLE TRIGGER changed.
\set VERBOSITY terse
\set SHOW_CONTEXT never
CREATE TABLE ia (id int PRIMARY KEY, v int);
SELECT fencing_protect('ia');
BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO ia VALUES (1, 0), (2, 0); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '20'; DELETE FROM ia WHERE id = 2; COMMIT;
-- The AFTER INSERT trigger, which checks a new key's tombstone, disabled: the guard still fires
-- but cannot hold (before, key 2 was re-created with 15, below its tombstone at 20).
ALTER TABLE ia DISABLE TRIGGER zz_pg_fencing_after;
SELECT active, inactive_reason FROM fencing_protected_tables WHERE relation = 'ia'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO ia VALUES (2, 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '30'; UPDATE ia SET v = 1;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '30'; DELETE FROM ia;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '30'; TRUNCATE ia;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- No token at all: the inactive protection answers first.
INSERT INTO ia VALUES (3, 0);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('ia', '{"id": 2, "v": 1}', 15);
\echo :LAST_ERROR_SQLSTATE
-- ENABLE TRIGGER ALL (pg_restore --disable-triggers ends with it) turns the REPLICA trigger into
-- an ordinary one: inactive and refused until fencing_protect repairs the firing modes.
ALTER TABLE ia ENABLE TRIGGER ALL;
SELECT active, inactive_reason FROM fencing_protected_tables WHERE relation = 'ia'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '30'; UPDATE ia SET v = 2;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT fencing_protect('ia');
SELECT active FROM fencing_protected_tables WHERE relation = 'ia'::regclass;
SELECT tgname, tgenabled FROM pg_trigger WHERE tgrelid = 'ia'::regclass ORDER BY tgname;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO ia VALUES (2, 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '30'; UPDATE ia SET v = 3; COMMIT;
-- DISABLE TRIGGER ALL, repaired the same way.
ALTER TABLE ia DISABLE TRIGGER USER;
SELECT active FROM fencing_protected_tables WHERE relation = 'ia'::regclass;
SELECT fencing_protect('ia');
SELECT active FROM fencing_protected_tables WHERE relation = 'ia'::regclass;

-- Partitioned, resource mode: one partition's statement trigger disabled refuses writes to
-- every partition, through the root and aimed at a partition.
CREATE TABLE ip (k int, id int, v int, PRIMARY KEY (k, id)) PARTITION BY LIST (k);
CREATE TABLE ip1 PARTITION OF ip FOR VALUES IN (1);
CREATE TABLE ip2 PARTITION OF ip FOR VALUES IN (2);
SELECT fencing_protect('ip', 'ip-res');
ALTER TABLE ip2 DISABLE TRIGGER zz_pg_fencing_truncate;
SELECT active, inactive_reason FROM fencing_protected_tables WHERE relation = 'ip'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO ip VALUES (1, 1, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO ip1 VALUES (1, 1, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
ALTER TABLE ip2 ENABLE TRIGGER zz_pg_fencing_truncate;
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO ip1 VALUES (1, 1, 0); COMMIT;
SELECT fencing_high_water('ip-res');

-- The token column dropped: FT004 with the reason (before: 39P01 or 42703).
CREATE TABLE ic (id int PRIMARY KEY, v int);
SELECT fencing_protect('ic', 'ic-res');
ALTER TABLE ic DROP COLUMN fence_token;
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO ic VALUES (1, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
DROP TABLE ia, ip, ic;
