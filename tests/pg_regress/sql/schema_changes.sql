-- Schema changes keep the fence or are refused (issue 30, case 6): no DDL lowers an effective
-- mark or forgets a tombstone.
\set VERBOSITY terse
\set SHOW_CONTEXT never
CREATE TABLE sc_res (id int PRIMARY KEY, v int);
SELECT fencing_protect('sc_res', 'sc-res');
CREATE TABLE sc_rows (id int PRIMARY KEY, v int);
SELECT fencing_protect('sc_rows');
BEGIN; SET LOCAL pg_fencing.token = '100'; INSERT INTO sc_res VALUES (1, 0); INSERT INTO sc_rows VALUES (1, 0), (2, 0); DELETE FROM sc_rows WHERE id = 2; COMMIT;
-- (a) DROP EXTENSION would delete every mark and tombstone: refused while tables are protected,
-- also with CASCADE and IF EXISTS.
DROP EXTENSION pg_fencing;
\echo :LAST_ERROR_SQLSTATE
DROP EXTENSION IF EXISTS pg_fencing CASCADE;
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_high_water('sc-res');
-- ... and not by another spelling of the command either (read from its parse tree).
DROP/**/EXTENSION pg_fencing CASCADE;
\echo :LAST_ERROR_SQLSTATE
DO $$BEGIN EXECUTE 'DROP EXTENSION pg_' || 'fencing CASCADE'; END$$;
\echo :LAST_ERROR_SQLSTATE
DROP EXTENSION IF EXISTS plpgsql, pg_fencing;
\echo :LAST_ERROR_SQLSTATE
-- ... nor with its schema, nor with the objects of its owner.
SELECT extnamespace::regnamespace AS ext_schema FROM pg_extension WHERE extname = 'pg_fencing' \gset
DROP SCHEMA :ext_schema CASCADE;
\echo :LAST_ERROR_SQLSTATE
DROP OWNED BY CURRENT_USER CASCADE;
\echo :LAST_ERROR_SQLSTATE
-- ... nor by a cascade from another object (the library's object access hook sees its tables go).
SET client_min_messages = warning;  -- (the NOTICE counts every object the cascade reaches)
DROP EXTENSION plpgsql CASCADE;
\echo :LAST_ERROR_SQLSTATE
RESET client_min_messages;
SELECT fencing_high_water('sc-res');
-- (b) The token column (the per-row marks) cannot be dropped, renamed, retyped or made generated.
ALTER TABLE sc_rows DROP COLUMN fence_token;
\echo :LAST_ERROR_SQLSTATE
ALTER TABLE sc_rows RENAME COLUMN fence_token TO ft;
\echo :LAST_ERROR_SQLSTATE
ALTER TABLE sc_rows ALTER COLUMN fence_token TYPE numeric;
\echo :LAST_ERROR_SQLSTATE
-- Also to the same type, whose USING clause would rewrite every mark.
ALTER TABLE sc_rows ALTER COLUMN fence_token TYPE bigint USING 0;
\echo :LAST_ERROR_SQLSTATE
ALTER TABLE sc_rows ALTER COLUMN v TYPE bigint, ALTER COLUMN fence_token TYPE bigint USING fence_token - 99;
\echo :LAST_ERROR_SQLSTATE
ALTER TABLE sc_res DROP COLUMN fence_token;
\echo :LAST_ERROR_SQLSTATE
SELECT id, fence_token FROM sc_rows ORDER BY id;
-- Other columns change as usual.
ALTER TABLE sc_rows ADD COLUMN note text;
ALTER TABLE sc_rows RENAME COLUMN note TO remark;
ALTER TABLE sc_rows DROP COLUMN remark;
-- (d) A per-row table cannot be UNLOGGED (a crash would empty it with its row tokens); a
-- resource-mode one can (its mark is a logged row of pg_fencing's own).
ALTER TABLE sc_rows SET UNLOGGED;
\echo :LAST_ERROR_SQLSTATE
ALTER TABLE sc_res SET UNLOGGED;
ALTER TABLE sc_res SET LOGGED;
-- (e) Inheritance children of a protected table are refused, both ways.
CREATE TABLE sc_child () INHERITS (sc_rows);
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE sc_child2 (id int NOT NULL, v int, fence_token bigint);
ALTER TABLE sc_child2 INHERIT sc_res;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS children FROM pg_inherits WHERE inhparent IN ('sc_rows'::regclass, 'sc_res'::regclass);
-- The fence is intact, and the protections active.
BEGIN; SET LOCAL pg_fencing.token = '50'; INSERT INTO sc_rows VALUES (2, 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '50'; UPDATE sc_res SET v = 1;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT relation, active FROM fencing_protected_tables WHERE relation::text LIKE 'sc_%' ORDER BY 1;
-- The protection's triggers can only be made by fencing_protect, also for a role that has the
-- TRIGGER privilege: another function, other events, a column list or a WHEN clause under one of
-- their names is refused; and no BEFORE row trigger may fire after the guard (it could change the
-- row's token or key after the check).
CREATE ROLE sc_w;
GRANT SELECT, INSERT, UPDATE, DELETE, TRIGGER ON sc_res, sc_rows TO sc_w;
GRANT CREATE ON SCHEMA public TO sc_w;
SET ROLE sc_w;
CREATE FUNCTION sc_noop() RETURNS trigger LANGUAGE plpgsql AS
    $$BEGIN IF TG_OP = 'DELETE' THEN RETURN OLD; END IF; RETURN NEW; END$$;
CREATE FUNCTION sc_lower() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN NEW.fence_token := 1; RETURN NEW; END$$;
CREATE OR REPLACE TRIGGER zz_pg_fencing_guard BEFORE INSERT OR UPDATE OR DELETE ON sc_res FOR EACH ROW EXECUTE FUNCTION sc_noop();
\echo :LAST_ERROR_SQLSTATE
CREATE OR REPLACE TRIGGER zz_pg_fencing_stmt BEFORE INSERT OR UPDATE OR DELETE ON sc_res FOR EACH STATEMENT EXECUTE FUNCTION sc_noop();
\echo :LAST_ERROR_SQLSTATE
-- fencing_guard with the protection's own arguments, but for DELETE only
DO $$BEGIN EXECUTE format('CREATE OR REPLACE TRIGGER zz_pg_fencing_guard BEFORE DELETE ON sc_rows FOR EACH ROW EXECUTE FUNCTION fencing_guard(%L, %L, %L)',
              (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'sc_rows'::regclass), '', 'fence_token'); END$$;
\echo :LAST_ERROR_SQLSTATE
-- ... or WHEN (false)
DO $$BEGIN EXECUTE format('CREATE OR REPLACE TRIGGER zz_pg_fencing_guard BEFORE INSERT OR UPDATE OR DELETE ON sc_rows FOR EACH ROW WHEN (false) EXECUTE FUNCTION fencing_guard(%L, %L, %L)',
              (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'sc_rows'::regclass), '', 'fence_token'); END$$;
\echo :LAST_ERROR_SQLSTATE
CREATE TRIGGER zzz_lower BEFORE UPDATE ON sc_rows FOR EACH ROW EXECUTE FUNCTION sc_lower();
\echo :LAST_ERROR_SQLSTATE
SET check_function_bodies = off;  -- the restore exception is the owner's only
CREATE TRIGGER zzz_lower BEFORE UPDATE ON sc_rows FOR EACH ROW EXECUTE FUNCTION sc_lower();
\echo :LAST_ERROR_SQLSTATE
RESET check_function_bodies;
-- a trigger that fires before the guard is the grantee's to make
CREATE TRIGGER aa_audit BEFORE UPDATE ON sc_rows FOR EACH ROW EXECUTE FUNCTION sc_noop();
RESET ROLE;
DROP TRIGGER aa_audit ON sc_rows;
SELECT tgname, tgfoid::regprocedure FROM pg_trigger WHERE tgrelid IN ('sc_res'::regclass, 'sc_rows'::regclass) AND tgname = 'zz_pg_fencing_guard' ORDER BY tgrelid::regclass::text;
DROP FUNCTION sc_noop(), sc_lower();
REVOKE ALL ON sc_res, sc_rows FROM sc_w;
REVOKE CREATE ON SCHEMA public FROM sc_w;
DROP ROLE sc_w;
-- A partition of a per-row table cannot be made UNLOGGED either.
CREATE TABLE sc_ul (id int PRIMARY KEY, v text) PARTITION BY LIST (id);
CREATE TABLE sc_ul1 PARTITION OF sc_ul FOR VALUES IN (1, 2, 3);
SELECT fencing_protect('sc_ul');
ALTER TABLE sc_ul1 SET UNLOGGED;
\echo :LAST_ERROR_SQLSTATE
-- ATTACH PARTITION of a per-row table: rows below the protection's highest tombstone would
-- bring deleted keys back below their tombstones; refused. An empty table attaches.
BEGIN; SET LOCAL pg_fencing.token = '100'; INSERT INTO sc_ul VALUES (2, 'a'); DELETE FROM sc_ul WHERE id = 2; COMMIT;
CREATE TABLE sc_ul3 (id int PRIMARY KEY, v text, fence_token bigint);
INSERT INTO sc_ul3 VALUES (5, 'x', 1);
ALTER TABLE sc_ul ATTACH PARTITION sc_ul3 FOR VALUES IN (5, 6);
\echo :LAST_ERROR_SQLSTATE
DELETE FROM sc_ul3;
ALTER TABLE sc_ul ATTACH PARTITION sc_ul3 FOR VALUES IN (5, 6);
BEGIN; SET LOCAL pg_fencing.token = '100'; INSERT INTO sc_ul VALUES (5, 'new'); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '50'; INSERT INTO sc_ul VALUES (2, 'zombie');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
DROP TABLE sc_ul;

-- (c) fencing_protect switching a table to another resource, the other mode or another token
-- column carries the fence: the new domain starts at the old one's highest mark, row token and
-- tombstone (before, 90 was accepted on rows stamped 100).
CREATE TABLE sc_sw (id int PRIMARY KEY, v int);
SELECT fencing_protect('sc_sw', 'sc-a');
BEGIN; SET LOCAL pg_fencing.token = '100'; INSERT INTO sc_sw VALUES (1, 0), (2, 0); COMMIT;
SELECT fencing_protect('sc_sw', 'sc-b');
SELECT fencing_high_water('sc-b');
BEGIN; SET LOCAL pg_fencing.token = '90'; UPDATE sc_sw SET v = 1 WHERE id = 1;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- to per-row mode: every row keeps its token, a new key and a row never stamped need the old
-- mark (the tombstone floor)
BEGIN; SET LOCAL session_replication_role = replica; INSERT INTO sc_sw (id, v) VALUES (4, 0); COMMIT;
SELECT fencing_protect('sc_sw');
BEGIN; SET LOCAL pg_fencing.token = '90'; UPDATE sc_sw SET v = 1 WHERE id = 4;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- a per-row table keeps its token column (its values are the rows' marks)
SELECT fencing_protect('sc_sw', NULL, 'other_token');
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '90'; INSERT INTO sc_sw VALUES (3, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '90'; DELETE FROM sc_sw WHERE id = 2;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '120'; DELETE FROM sc_sw WHERE id = 2; DELETE FROM sc_sw WHERE id = 4; COMMIT;
-- back to resource mode: the tombstone at 120 is the new resource's floor
SELECT fencing_protect('sc_sw', 'sc-c');
SELECT fencing_high_water('sc-c');
BEGIN; SET LOCAL pg_fencing.token = '110'; INSERT INTO sc_sw VALUES (2, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- resource mode, another token column: the old column's tokens carry over too
SELECT fencing_protect('sc_sw', 'sc-c', 'other_token');
BEGIN; SET LOCAL pg_fencing.token = '120'; INSERT INTO sc_sw VALUES (2, 0); COMMIT;
SELECT id, other_token FROM sc_sw ORDER BY id;
-- re-protecting the same way carries nothing (idempotent) and says nothing
SELECT fencing_protect('sc_sw', 'sc-c', 'other_token');
DROP TABLE sc_sw;

-- DETACH PARTITION: the detached partition stays protected on its own (same resource, or per-row
-- mode with the parent protection's highest tombstone and row token as its floor).
CREATE TABLE sc_pr (k int, id int, v int, PRIMARY KEY (k, id)) PARTITION BY LIST (k);
CREATE TABLE sc_pr1 PARTITION OF sc_pr FOR VALUES IN (1);
CREATE TABLE sc_pr2 PARTITION OF sc_pr FOR VALUES IN (2);
SELECT fencing_protect('sc_pr');
BEGIN; SET LOCAL pg_fencing.token = '70'; INSERT INTO sc_pr VALUES (1, 1, 0), (2, 1, 0), (2, 2, 0); DELETE FROM sc_pr WHERE k = 2 AND id = 2; COMMIT;
ALTER TABLE sc_pr DETACH PARTITION sc_pr2;
SELECT relation, mode, active, tombstone_floor FROM fencing_protected_tables WHERE relation::text LIKE 'sc_pr%' ORDER BY 1;
BEGIN; SET LOCAL pg_fencing.token = '60'; INSERT INTO sc_pr2 VALUES (2, 2, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '60'; UPDATE sc_pr2 SET v = 1;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '70'; UPDATE sc_pr2 SET v = 1; COMMIT;
CREATE TABLE sc_rr (k int, id int, v int, PRIMARY KEY (k, id)) PARTITION BY LIST (k);
CREATE TABLE sc_rr1 PARTITION OF sc_rr FOR VALUES IN (1);
CREATE TABLE sc_rr2 PARTITION OF sc_rr FOR VALUES IN (2);
SELECT fencing_protect('sc_rr', 'sc-rr');
BEGIN; SET LOCAL pg_fencing.token = '80'; INSERT INTO sc_rr VALUES (2, 1, 0); COMMIT;
ALTER TABLE sc_rr DETACH PARTITION sc_rr2;
BEGIN; SET LOCAL pg_fencing.token = '75'; UPDATE sc_rr2 SET v = 1;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT relation, mode, resource, active FROM fencing_protected_tables WHERE relation::text LIKE 'sc_rr%' ORDER BY 1;
DROP TABLE sc_pr, sc_pr2, sc_rr, sc_rr2;

-- A temporary table cannot be protected (dropped at session end without the event triggers, it
-- would leave its protection behind); nor an unlogged one in per-row mode.
CREATE TEMPORARY TABLE sc_temp (id int PRIMARY KEY);
SELECT fencing_protect('sc_temp');
\echo :LAST_ERROR_SQLSTATE
CREATE UNLOGGED TABLE sc_unlogged (id int PRIMARY KEY);
SELECT fencing_protect('sc_unlogged');
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_protect('sc_unlogged', 'sc-unlogged');
DROP TABLE sc_temp, sc_unlogged;

-- A trigger of the user's renamed into pg_fencing's names (ALTER TRIGGER is not checked at DDL
-- time) to fire after the guard: the protection is inactive, writes are refused.
CREATE TABLE sc_rn (id int PRIMARY KEY, v text);
SELECT fencing_protect('sc_rn');
CREATE FUNCTION sc_rn_low() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN NEW.fence_token := 1; RETURN NEW; END$$;
CREATE TRIGGER a_low BEFORE INSERT OR UPDATE ON sc_rn FOR EACH ROW EXECUTE FUNCTION sc_rn_low();
ALTER TRIGGER a_low ON sc_rn RENAME TO zz_pg_fencing_zzz;
BEGIN; SET LOCAL pg_fencing.token = '100'; INSERT INTO sc_rn VALUES (1, 'x');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
DROP TABLE sc_rn;
DROP FUNCTION sc_rn_low();

-- (f) A partition of a per-row protected table dropped or detached takes its keys' marks (their
-- rows' tokens) out of the table: the protection's tombstone floor rises to the highest of them,
-- so that a later partition for the same keys does not admit them again below those marks.
CREATE TABLE sc_pt (id int PRIMARY KEY, v int) PARTITION BY RANGE (id);
CREATE TABLE sc_pt1 PARTITION OF sc_pt FOR VALUES FROM (1) TO (100);
CREATE TABLE sc_pt2 PARTITION OF sc_pt FOR VALUES FROM (100) TO (200);
CREATE SCHEMA sc_other;
CREATE TABLE sc_other.sc_pt3 PARTITION OF sc_pt FOR VALUES FROM (200) TO (300);
SELECT fencing_protect('sc_pt');
BEGIN; SET LOCAL pg_fencing.token = '50'; INSERT INTO sc_pt VALUES (5, 0); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO sc_pt VALUES (6, 0), (150, 0); COMMIT;
DROP TABLE sc_pt1;
SELECT tombstone_floor FROM fencing_protected_tables WHERE relation = 'sc_pt'::regclass;
CREATE TABLE sc_pt1 PARTITION OF sc_pt FOR VALUES FROM (1) TO (100);
BEGIN; SET LOCAL pg_fencing.token = '40'; INSERT INTO sc_pt VALUES (5, 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '50'; INSERT INTO sc_pt VALUES (5, 1); COMMIT;
-- Detached: the same (the detached table stays protected on its own).
BEGIN; SET LOCAL pg_fencing.token = '70'; UPDATE sc_pt SET v = 2 WHERE id = 150; COMMIT;
ALTER TABLE sc_pt DETACH PARTITION sc_pt2;
SELECT relation, tombstone_floor FROM fencing_protected_tables WHERE relation IN ('sc_pt'::regclass, 'sc_pt2'::regclass) ORDER BY 1;
CREATE TABLE sc_pt2b PARTITION OF sc_pt FOR VALUES FROM (100) TO (200);
BEGIN; SET LOCAL pg_fencing.token = '65'; INSERT INTO sc_pt VALUES (150, 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- Dropped with its schema.
BEGIN; SET LOCAL pg_fencing.token = '90'; INSERT INTO sc_pt VALUES (250, 0); COMMIT;
DROP SCHEMA sc_other CASCADE;
SELECT tombstone_floor FROM fencing_protected_tables WHERE relation = 'sc_pt'::regclass;
-- Dropping the protected table itself drops its protection (nothing to carry).
DROP TABLE sc_pt, sc_pt2;
SELECT count(*) FROM _pg_fencing.protected_table WHERE relid::text LIKE 'sc_pt%';

-- A partition dropped by a cascade from another object (here its table access method) is refused:
-- only DROP TABLE, DROP SCHEMA, DROP OWNED and DETACH PARTITION carry its marks into the floor.
CREATE ACCESS METHOD sc_heap2 TYPE TABLE HANDLER heap_tableam_handler;
CREATE TABLE sc_am (id int PRIMARY KEY, v int) PARTITION BY LIST (id);
CREATE TABLE sc_am1 PARTITION OF sc_am FOR VALUES IN (1) USING sc_heap2;
SELECT fencing_protect('sc_am');
BEGIN; SET LOCAL pg_fencing.token = '100'; INSERT INTO sc_am VALUES (1, 0); COMMIT;
DROP ACCESS METHOD sc_heap2 CASCADE;
\echo :LAST_ERROR_SQLSTATE
-- A DROP TABLE rolled back to a savepoint takes back its floor, and what it accounted for.
BEGIN;
SAVEPOINT s;
DROP TABLE sc_am1;
ROLLBACK TO SAVEPOINT s;
DROP ACCESS METHOD sc_heap2 CASCADE;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
DROP TABLE sc_am1;
DROP ACCESS METHOD sc_heap2;
SELECT tombstone_floor FROM fencing_protected_tables WHERE relation = 'sc_am'::regclass;
DROP TABLE sc_am;
-- A sub-partitioned partition detached: it stays protected on its own, its partitions with it.
CREATE TABLE sc_sp (id int PRIMARY KEY, v int) PARTITION BY RANGE (id);
CREATE TABLE sc_sp_mid PARTITION OF sc_sp FOR VALUES FROM (1) TO (100) PARTITION BY RANGE (id);
CREATE TABLE sc_sp_leaf PARTITION OF sc_sp_mid FOR VALUES FROM (1) TO (50);
CREATE TABLE sc_sp_leafb PARTITION OF sc_sp_mid FOR VALUES FROM (50) TO (100);
SELECT fencing_protect('sc_sp');
BEGIN; SET LOCAL pg_fencing.token = '100'; INSERT INTO sc_sp VALUES (1, 0), (60, 0); COMMIT;
ALTER TABLE sc_sp DETACH PARTITION sc_sp_mid;
SELECT relation, tombstone_floor, active FROM fencing_protected_tables WHERE relation::text LIKE 'sc_sp%' ORDER BY 1;
BEGIN; SET LOCAL pg_fencing.token = '50'; UPDATE sc_sp_mid SET v = 1 WHERE id = 60;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
DROP TABLE sc_sp, sc_sp_mid;

-- The tombstone feed of logical replication, once published, holds every tombstone by table
-- name, and a renamed table's (or schema's) rows move to the new name.
CREATE TABLE sc_fd (id int PRIMARY KEY, v int);
SELECT fencing_protect('sc_fd');
BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO sc_fd VALUES (1, 0), (2, 0); DELETE FROM sc_fd WHERE id = 1; COMMIT;
SELECT count(*) FROM _pg_fencing.tombstone_feed;
SET client_min_messages = error;  -- (the cluster's wal_level is below logical)
CREATE PUBLICATION sc_pub FOR TABLE sc_fd;
RESET client_min_messages;
SELECT relation, key, high_water FROM _pg_fencing.tombstone_feed WHERE relation LIKE '%sc_fd%' ORDER BY 1, 2;
BEGIN; SET LOCAL pg_fencing.token = '11'; DELETE FROM sc_fd WHERE id = 2; COMMIT;
ALTER TABLE sc_fd RENAME TO sc_fd2;
CREATE SCHEMA sc_fds;
ALTER TABLE sc_fd2 SET SCHEMA sc_fds;
ALTER SCHEMA sc_fds RENAME TO sc_fds2;
ALTER INDEX sc_fds2.sc_fd2 RENAME TO sc_fd3;  -- (PostgreSQL renames a table by ALTER INDEX too)
SELECT relation, key, high_water FROM _pg_fencing.tombstone_feed WHERE relation LIKE '%sc_fd%' ORDER BY 1, 2;
-- Filling it needs a snapshot taken after the tables' locks: not in REPEATABLE READ.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SET LOCAL client_min_messages = error;
CREATE PUBLICATION sc_pub2 FOR TABLE sc_res;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- Nor moving the feed rows of a renamed table.
BEGIN ISOLATION LEVEL REPEATABLE READ;
ALTER TABLE sc_fds2.sc_fd3 RENAME TO sc_fd4;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
DROP PUBLICATION sc_pub;
-- A dropped table's rows leave the feed with its tombstones.
DROP SCHEMA sc_fds2 CASCADE;
SELECT count(*) FROM _pg_fencing.tombstone_feed WHERE relation LIKE '%sc_fd%';

-- After fencing_unprotect, the table is the owner's to change.
SELECT fencing_unprotect('sc_rows');
ALTER TABLE sc_rows DROP COLUMN fence_token;
DROP TABLE sc_res, sc_rows, sc_child2;

-- A protected table attached as a partition of a table that is not protected: its protection
-- cannot hold there (its triggers name a protection of a table that is now a partition), so
-- fencing_protected_tables says why and every write is refused with FT004. fencing_protect of
-- the root then carries the partition's fence: its tombstones (same key) and resource mark, so
-- a stale writer cannot re-create a key the partition's protection had deleted.
CREATE TABLE sc_jobs (id int PRIMARY KEY, v int);
SELECT fencing_protect('sc_jobs');
BEGIN; SET LOCAL pg_fencing.token = '200';
INSERT INTO sc_jobs VALUES (1, 1), (2, 2), (3, 3);
DELETE FROM sc_jobs WHERE id = 1;
COMMIT;
CREATE TABLE sc_rjobs (id int PRIMARY KEY, v int);
SELECT fencing_protect('sc_rjobs', 'sc_rjobs_res');
BEGIN; SET LOCAL pg_fencing.token = '300'; INSERT INTO sc_rjobs VALUES (500, 0); COMMIT;
CREATE TABLE sc_jroot (id int PRIMARY KEY, v int, fence_token bigint) PARTITION BY RANGE (id);
ALTER TABLE sc_jroot ATTACH PARTITION sc_jobs FOR VALUES FROM (0) TO (100);
ALTER TABLE sc_jroot ATTACH PARTITION sc_rjobs FOR VALUES FROM (100) TO (1000);
SELECT relation, active, inactive_reason FROM fencing_protected_tables
WHERE relation IN ('sc_jobs'::regclass, 'sc_rjobs'::regclass) ORDER BY 1;
BEGIN; SET LOCAL pg_fencing.token = '300';
INSERT INTO sc_jroot VALUES (4, 4);
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '300';
UPDATE sc_jobs SET v = 5 WHERE id = 2;
ROLLBACK;
SELECT fencing_protect('sc_jroot');
SELECT relation, mode, active FROM fencing_protected_tables
WHERE relation IN ('sc_jroot'::regclass, 'sc_jobs'::regclass, 'sc_rjobs'::regclass) ORDER BY 1;
-- the resource-mode partition's mark (300) is the floor of every key now: 150 and 250 are stale
BEGIN; SET LOCAL pg_fencing.token = '150';
INSERT INTO sc_jroot VALUES (1, 1);
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '250';
INSERT INTO sc_jroot VALUES (501, 1);
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '300';
INSERT INTO sc_jroot VALUES (501, 1);
UPDATE sc_jroot SET v = 9 WHERE id = 2;
COMMIT;
SELECT id, v, fence_token FROM sc_jroot ORDER BY id;
-- Only per-row partitions with the root's key form: their tombstones move to the root's
-- protection as they are (key 1 at 200: 150 is stale, 250 is not; no floor is raised).
CREATE TABLE sc_jobs2 (id int PRIMARY KEY, v int);
SELECT fencing_protect('sc_jobs2');
BEGIN; SET LOCAL pg_fencing.token = '200';
INSERT INTO sc_jobs2 VALUES (1, 1), (2, 2);
DELETE FROM sc_jobs2 WHERE id = 1;
COMMIT;
CREATE TABLE sc_jroot2 (id int PRIMARY KEY, v int, fence_token bigint) PARTITION BY RANGE (id);
ALTER TABLE sc_jroot2 ATTACH PARTITION sc_jobs2 FOR VALUES FROM (0) TO (100);
SELECT fencing_protect('sc_jroot2');
SELECT tombstones, tombstone_floor FROM fencing_protected_tables WHERE relation = 'sc_jroot2'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '150';
INSERT INTO sc_jroot2 VALUES (1, 1);
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '250';
INSERT INTO sc_jroot2 VALUES (1, 1), (3, 3);
COMMIT;
SELECT id, fence_token FROM sc_jroot2 ORDER BY id;
-- Attached to a table that is protected already: PostgreSQL refuses the ATTACH (the root's
-- triggers cannot be cloned onto the partition's own, 42710). fencing_unprotect of the table
-- keeps its tombstones, and the root's fencing_protect, run again once it is attached, carries
-- them.
CREATE TABLE sc_jobs3 (id int PRIMARY KEY, v int);
SELECT fencing_protect('sc_jobs3');
BEGIN; SET LOCAL pg_fencing.token = '400';
INSERT INTO sc_jobs3 VALUES (50, 1), (51, 1);
DELETE FROM sc_jobs3 WHERE id = 50;
COMMIT;
ALTER TABLE sc_jroot2 DETACH PARTITION sc_jobs2;
ALTER TABLE sc_jroot2 ATTACH PARTITION sc_jobs3 FOR VALUES FROM (0) TO (100);
SELECT fencing_unprotect('sc_jobs3');
ALTER TABLE sc_jroot2 ATTACH PARTITION sc_jobs3 FOR VALUES FROM (0) TO (100);
SELECT fencing_protect('sc_jroot2');
BEGIN; SET LOCAL pg_fencing.token = '350';
INSERT INTO sc_jroot2 VALUES (50, 1);
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '450';
INSERT INTO sc_jroot2 VALUES (50, 1);
COMMIT;
SELECT id, fence_token FROM sc_jroot2 ORDER BY id;
SELECT fencing_unprotect('sc_jroot2');
SELECT fencing_unprotect('sc_jobs2');
DROP TABLE sc_jroot2, sc_jobs2;
SELECT fencing_unprotect('sc_jroot');
DROP TABLE sc_jroot;
