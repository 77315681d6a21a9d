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
-- Disabling a trigger of a protection is refused outside a restore (check_function_bodies = off),
-- and so is making one fire in replica mode only.
ALTER TABLE ia DISABLE TRIGGER zz_pg_fencing_after;
\echo :LAST_ERROR_SQLSTATE
ALTER TABLE ia DISABLE TRIGGER USER;
\echo :LAST_ERROR_SQLSTATE
ALTER TABLE ia ENABLE REPLICA TRIGGER zz_pg_fencing_guard;
\echo :LAST_ERROR_SQLSTATE
-- A restore that stopped half-way leaves the AFTER INSERT trigger, which checks a new key's
-- tombstone, disabled: the guard still fires but cannot hold (before, key 2 was re-created with
-- 15, below its tombstone at 20).
SET check_function_bodies = off;
ALTER TABLE ia DISABLE TRIGGER zz_pg_fencing_after;
RESET check_function_bodies;
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
-- ENABLE TRIGGER ALL (pg_restore --disable-triggers ends with it) would turn the REPLICA trigger
-- into an ordinary one; the DDL event trigger puts it back at once. With that event trigger
-- disabled (a superuser's doing), the protection is inactive and refused until fencing_protect
-- repairs the firing modes.
ALTER TABLE ia ENABLE TRIGGER ALL;
SELECT active FROM fencing_protected_tables WHERE relation = 'ia'::regclass;
ALTER EVENT TRIGGER pg_fencing_ddl_end DISABLE;
ALTER TABLE ia ENABLE TRIGGER ALL;
ALTER EVENT TRIGGER pg_fencing_ddl_end ENABLE;
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
-- DISABLE TRIGGER USER in a restore, repaired the same way.
SET check_function_bodies = off;
ALTER TABLE ia DISABLE TRIGGER USER;
RESET check_function_bodies;
SELECT active FROM fencing_protected_tables WHERE relation = 'ia'::regclass;
SELECT fencing_protect('ia');
SELECT active FROM fencing_protected_tables WHERE relation = 'ia'::regclass;

-- Partitioned, resource mode: one partition's statement trigger disabled refuses writes to
-- every partition, through the root and aimed at a partition.
CREATE TABLE ip (k int, id int, v int, PRIMARY KEY (k, id)) PARTITION BY LIST (k);
CREATE TABLE ip1 PARTITION OF ip FOR VALUES IN (1);
CREATE TABLE ip2 PARTITION OF ip FOR VALUES IN (2);
SELECT fencing_protect('ip', 'ip-res');
SET check_function_bodies = off;
ALTER TABLE ip2 DISABLE TRIGGER zz_pg_fencing_truncate;
RESET check_function_bodies;
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

-- The token column dropped (refused outside a restore, schema_changes.sql): FT004 with the
-- reason (before: 39P01 or 42703).
CREATE TABLE ic (id int PRIMARY KEY, v int);
SELECT fencing_protect('ic', 'ic-res');
SET check_function_bodies = off;
ALTER TABLE ic DROP COLUMN fence_token;
RESET check_function_bodies;
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO ic VALUES (1, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
DROP TABLE ia, ip, ic;
