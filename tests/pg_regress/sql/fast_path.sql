-- The UPDATE fast path (src/guard/fast_path.rs): a plain UPDATE of a protected table is fenced by
-- _pg_fencing.stamp_row/stamp_resource in its SET list, and the guard's UPDATE triggers do not
-- fire; anything the fast path does not cover keeps the triggers. Calls of the guard trigger and
-- of the stamping functions are counted by track_functions.
\set VERBOSITY terse
SET track_functions = 'all';
CREATE TABLE fp_row (id int PRIMARY KEY, v int NOT NULL);
CREATE TABLE fp_res (id int PRIMARY KEY, v int NOT NULL);
SELECT fencing_protect('fp_row');
SELECT fencing_protect('fp_res', 'fp-resource');
BEGIN; SET LOCAL pg_fencing.token = '10';
INSERT INTO fp_row SELECT g, 0 FROM generate_series(1, 5) g;
INSERT INTO fp_res SELECT g, 0 FROM generate_series(1, 5) g;
COMMIT;
-- Calls since the last fp_calls() (pg_stat_xact_user_functions also holds counts not yet
-- flushed from earlier transactions, so only differences are printed).
CREATE TEMP TABLE fp_seen (guard bigint, stamp_row bigint, stamp_resource bigint);
INSERT INTO fp_seen VALUES (0, 0, 0);
CREATE FUNCTION fp_reset() RETURNS void LANGUAGE sql AS $$
  UPDATE fp_seen SET guard = g, stamp_row = r, stamp_resource = s
  FROM (SELECT coalesce(sum(calls) FILTER (WHERE funcname = 'fencing_guard'), 0) AS g,
               coalesce(sum(calls) FILTER (WHERE funcname = 'stamp_row'), 0) AS r,
               coalesce(sum(calls) FILTER (WHERE funcname = 'stamp_resource'), 0) AS s
        FROM pg_stat_xact_user_functions) now
$$;
CREATE FUNCTION fp_calls() RETURNS TABLE (guard bigint, stamp_row bigint, stamp_resource bigint)
LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY
  SELECT now.g - f.guard, now.r - f.stamp_row, now.s - f.stamp_resource
  FROM fp_seen f,
       (SELECT coalesce(sum(calls) FILTER (WHERE funcname = 'fencing_guard'), 0)::bigint AS g,
               coalesce(sum(calls) FILTER (WHERE funcname = 'stamp_row'), 0)::bigint AS r,
               coalesce(sum(calls) FILTER (WHERE funcname = 'stamp_resource'), 0)::bigint AS s
        FROM pg_stat_xact_user_functions) now;
  PERFORM fp_reset();
END
$$;
-- The plan carries the stamping expression (OIDs and protection ids masked).
CREATE FUNCTION fp_plan(q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE l text;
BEGIN
  FOR l IN EXECUTE 'EXPLAIN (VERBOSE, COSTS OFF) ' || q LOOP
    RETURN NEXT regexp_replace(l, '''\d+''::(oid|bigint)', '<\1>', 'g');
  END LOOP;
END
$$;
SELECT fp_plan('UPDATE fp_row SET v = v + 1 WHERE id = 1');
SELECT fp_plan('UPDATE fp_res SET v = v + 1 WHERE id = 1');

-- Per-row mode: each written row is checked and stamped once, without the guard trigger.
BEGIN; SET LOCAL pg_fencing.token = '11';
SELECT fp_reset();
UPDATE fp_row SET v = v + 1 WHERE id <= 3;
SELECT * FROM fp_calls();
SELECT id, v, fence_token FROM fp_row ORDER BY id;
COMMIT;
-- A stale token is refused (FT001), naming the row's key; no token is FT002.
BEGIN; SET LOCAL pg_fencing.token = '10';
UPDATE fp_row SET v = v + 1 WHERE id = 2;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
UPDATE fp_row SET v = v + 1 WHERE id = 2;
\echo :LAST_ERROR_SQLSTATE
-- An UPDATE that writes no row needs no token (as with the trigger).
UPDATE fp_row SET v = v + 1 WHERE id = 99;
-- Equal token, rows never stamped (NULL token column) and a multi-row UPDATE in one go.
BEGIN; SET LOCAL pg_fencing.token = '11';
SELECT fp_reset();
UPDATE fp_row SET fence_token = NULL WHERE false;
UPDATE fp_row SET v = 0;
SELECT * FROM fp_calls();
COMMIT;

-- Resource mode: the statement's resource lock is taken when the executor starts, each row is
-- admitted by stamp_resource.
BEGIN; SET LOCAL pg_fencing.token = '12';
SELECT fp_reset();
UPDATE fp_res SET v = v + 1 WHERE id <= 2;
SELECT * FROM fp_calls();
SELECT locktype, mode FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory';
COMMIT;
SELECT fencing_high_water('fp-resource');
-- A stale token is refused even when the UPDATE writes no row (the statement-level check).
BEGIN; SET LOCAL pg_fencing.token = '11';
UPDATE fp_res SET v = v + 1 WHERE id = 99;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- Not on the fast path (the guard trigger fires): an UPDATE that sets a key column, one that
-- sets the token column, a table with another BEFORE UPDATE row trigger, a table with a stored
-- generated column.
BEGIN; SET LOCAL pg_fencing.token = '13';
SELECT fp_reset();
UPDATE fp_row SET id = 6 WHERE id = 5;
UPDATE fp_row SET fence_token = 1 WHERE id = 4;
SELECT * FROM fp_calls();
SELECT id, fence_token FROM fp_row WHERE id IN (4, 6) ORDER BY id;
COMMIT;
CREATE TABLE fp_other (id int PRIMARY KEY, v int);
CREATE FUNCTION fp_touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.v := NEW.v + 100; RETURN NEW; END $$;
CREATE TRIGGER a_touch BEFORE UPDATE ON fp_other FOR EACH ROW EXECUTE FUNCTION fp_touch();
SELECT fencing_protect('fp_other');
CREATE TABLE fp_gen (id int PRIMARY KEY, v int, w int GENERATED ALWAYS AS (v * 2) STORED);
SELECT fencing_protect('fp_gen');
BEGIN; SET LOCAL pg_fencing.token = '13';
INSERT INTO fp_other VALUES (1, 1);
INSERT INTO fp_gen VALUES (1, 1);
COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '13';
SELECT fp_reset();
UPDATE fp_other SET v = 2 WHERE id = 1;
UPDATE fp_gen SET v = 2 WHERE id = 1;
SELECT * FROM fp_calls();
SELECT * FROM fp_other;
SELECT * FROM fp_gen;
COMMIT;
-- A disabled guard trigger: the protection is off, the triggers decide (as before).
SET check_function_bodies = off;  -- as in a restore, the only time a protection's trigger may be disabled
ALTER TABLE fp_row DISABLE TRIGGER zz_pg_fencing_guard;
RESET check_function_bodies;
SELECT fp_plan('UPDATE fp_row SET v = v + 1 WHERE id = 1');
ALTER TABLE fp_row ENABLE TRIGGER zz_pg_fencing_guard;

-- Through an updatable view, and from a prepared statement planned before a protection changed.
CREATE VIEW fp_view AS SELECT id, v FROM fp_row;
BEGIN; SET LOCAL pg_fencing.token = '10';
UPDATE fp_view SET v = 7 WHERE id = 1;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
PREPARE fp_upd(int) AS UPDATE fp_res SET v = v + 1 WHERE id = $1;
BEGIN; SET LOCAL pg_fencing.token = '12'; EXECUTE fp_upd(1); COMMIT;
SELECT fencing_unprotect('fp_res');
EXECUTE fp_upd(1);
SELECT fencing_protect('fp_res', 'fp-resource');
EXECUTE fp_upd(1);
\echo :LAST_ERROR_SQLSTATE
DEALLOCATE fp_upd;

-- Partitions. Per-row mode: a partition with a BEFORE UPDATE row trigger of its own turns the
-- table's rekey trigger into its WHEN form, which takes the table off the fast path. Resource
-- mode: such a partition keeps its triggers and is checked twice, the others are on the fast
-- path. A partition whose guard is disabled is still fenced by the expression, and fenced_update
-- refuses it (FT004) as it refuses any write that bypassed a guard trigger.
CREATE TABLE fp_part (k int, id int, v int, PRIMARY KEY (k, id)) PARTITION BY LIST (k);
CREATE TABLE fp_part1 PARTITION OF fp_part FOR VALUES IN (1);
CREATE TABLE fp_part2 PARTITION OF fp_part FOR VALUES IN (2);
SELECT fencing_protect('fp_part');
CREATE TABLE fp_rpart (k int, id int, v int, PRIMARY KEY (k, id)) PARTITION BY LIST (k);
CREATE TABLE fp_rpart1 PARTITION OF fp_rpart FOR VALUES IN (1);
CREATE TABLE fp_rpart2 PARTITION OF fp_rpart FOR VALUES IN (2);
SELECT fencing_protect('fp_rpart', 'fp-parts');
BEGIN; SET LOCAL pg_fencing.token = '20';
INSERT INTO fp_part VALUES (1, 1, 0), (2, 1, 0);
INSERT INTO fp_rpart VALUES (1, 1, 0), (2, 1, 0);
COMMIT;
CREATE TRIGGER a_touch BEFORE UPDATE ON fp_part2 FOR EACH ROW EXECUTE FUNCTION fp_touch();
CREATE TRIGGER a_touch BEFORE UPDATE ON fp_rpart2 FOR EACH ROW EXECUTE FUNCTION fp_touch();
BEGIN; SET LOCAL pg_fencing.token = '21';
SELECT fp_reset();
UPDATE fp_part SET v = 1;
SELECT * FROM fp_calls();
UPDATE fp_rpart SET v = 1;
SELECT * FROM fp_calls();
SELECT * FROM fp_part ORDER BY k;
SELECT * FROM fp_rpart ORDER BY k;
COMMIT;
DROP TRIGGER a_touch ON fp_part2;
DROP TRIGGER a_touch ON fp_rpart2;
BEGIN; SET LOCAL pg_fencing.token = '21';
SELECT fp_reset();
UPDATE fp_part SET v = 2;
SELECT * FROM fp_calls();
ROLLBACK;
SET check_function_bodies = off;  -- as in a restore, the only time a protection's trigger may be disabled
ALTER TABLE fp_part2 DISABLE TRIGGER zz_pg_fencing_guard;
RESET check_function_bodies;
BEGIN; SET LOCAL pg_fencing.token = '20';
UPDATE fp_part SET v = 2 WHERE k = 2;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT fenced_update('fp_part', '{"k": 2, "id": 1}', '{"v": 3}', 22);
\echo :LAST_ERROR_SQLSTATE
ALTER TABLE fp_part2 ENABLE TRIGGER zz_pg_fencing_guard;
SELECT fenced_update('fp_part', '{"k": 2, "id": 1}', '{"v": 3}', 22) ->> 'v' AS v;

-- Replica mode (logical replication's apply): nothing is refused, the row's token is kept.
SET session_replication_role = replica;
UPDATE fp_row SET v = 42 WHERE id = 1;
RESET session_replication_role;
SELECT id, v, fence_token FROM fp_row WHERE id = 1;

-- The stamping functions called by hand: only for the table's own protection and by a role
-- that may update the table.
SELECT _pg_fencing.stamp_row(1, 'fp_row'::regclass, 999, 'fence_token', 1);
\echo :LAST_ERROR_SQLSTATE
CREATE ROLE fp_reader;
GRANT SELECT ON fp_row TO fp_reader;
SET ROLE fp_reader;
SELECT _pg_fencing.stamp_row(1, 'fp_row'::regclass, (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'fp_row'::regclass), 'fence_token', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT _pg_fencing.stamp_resource(1, 'fp_row'::regclass, (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'fp_row'::regclass), '', 'fence_token');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- A role with UPDATE on one column only, directly and through an updatable view it may update
-- (the view's owner's privileges on the table count, as for the UPDATE itself).
GRANT UPDATE (v) ON fp_row TO fp_reader;
CREATE VIEW fp_rview AS SELECT id, v FROM fp_row;
GRANT SELECT, UPDATE ON fp_rview TO fp_reader;
REVOKE UPDATE (v) ON fp_row FROM fp_reader;
SET ROLE fp_reader;
BEGIN; SET LOCAL pg_fencing.token = '11';
UPDATE fp_rview SET v = 3 WHERE id = 1;
ROLLBACK;
RESET ROLE;
GRANT UPDATE (v) ON fp_row TO fp_reader;
SET ROLE fp_reader;
BEGIN; SET LOCAL pg_fencing.token = '11';
UPDATE fp_row SET v = 3 WHERE id = 1;
ROLLBACK;
RESET ROLE;
-- A role that may only update a view that shows it no rows: its UPDATE through the view (0 rows)
-- gives it no right to call stamp_resource by hand, in that transaction or later.
CREATE TABLE fp_acct (id int PRIMARY KEY, v int, owner name);
SELECT fencing_protect('fp_acct', 'fp-settle');
BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO fp_acct VALUES (1, 0, 'nobody'); COMMIT;
CREATE VIEW fp_mine AS SELECT * FROM fp_acct WHERE owner = current_user;
GRANT SELECT, UPDATE ON fp_mine TO fp_reader;
SET ROLE fp_reader;
BEGIN; SET LOCAL pg_fencing.token = '1000';
UPDATE fp_mine SET v = v;
SELECT _pg_fencing.stamp_resource(NULL, 'fp_acct'::regclass, (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'fp_acct'::regclass), 'fp-settle', 'fence_token');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
RESET ROLE;
-- A right that is gone is gone for hand-made calls too (a role membership revoked).
CREATE ROLE fp_writers;
GRANT UPDATE ON fp_acct TO fp_writers;
GRANT fp_writers TO fp_reader;
SET ROLE fp_reader;
BEGIN; SET LOCAL pg_fencing.token = '11';
SELECT _pg_fencing.stamp_resource(NULL, 'fp_acct'::regclass, (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'fp_acct'::regclass), 'fp-settle', 'fence_token');
COMMIT;
RESET ROLE;
REVOKE fp_writers FROM fp_reader;
SET ROLE fp_reader;
BEGIN; SET LOCAL pg_fencing.token = '12';
SELECT _pg_fencing.stamp_resource(NULL, 'fp_acct'::regclass, (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'fp_acct'::regclass), 'fp-settle', 'fence_token');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
RESET ROLE;
SELECT fencing_high_water('fp-settle');
DROP VIEW fp_mine;
REVOKE ALL ON fp_acct FROM fp_writers;
DROP ROLE fp_writers;
DROP TABLE fp_acct;
DROP VIEW fp_rview;
REVOKE ALL ON fp_row FROM fp_reader;
DROP ROLE fp_reader;
-- A stamping function in a part of an UPDATE that the executor never runs (a partition pruned
-- at start-up) does not make the UPDATE a fast-path one: this UPDATE sets the token column, so
-- the guard trigger checks it (FT002 without a token).
CREATE TABLE fp_pt (k int) PARTITION BY LIST (k);
CREATE TABLE fp_pt1 PARTITION OF fp_pt FOR VALUES IN (1);
CREATE TABLE fp_pt2 PARTITION OF fp_pt FOR VALUES IN (2);
SET fp.k = '99';
UPDATE fp_row SET v = 44, fence_token = 1
  FROM (SELECT 1) a LEFT JOIN (SELECT k FROM fp_pt
        WHERE k = current_setting('fp.k')::int
          AND _pg_fencing.stamp_row(1, 'fp_row'::regclass, 1, 'fence_token', 1)::text = '') p ON true
 WHERE fp_row.id = 1;
\echo :LAST_ERROR_SQLSTATE
RESET fp.k;
DROP TABLE fp_pt;

-- An inheritance child protected on its own (here in resource mode) under a protected parent:
-- an UPDATE through the parent checks the child's protection too.
CREATE TABLE fp_parent (id int PRIMARY KEY, v int);
SELECT fencing_protect('fp_parent');
CREATE TABLE fp_child (id int PRIMARY KEY, v int, fence_token bigint);
SELECT fencing_protect('fp_child', 'fp-child');
SET check_function_bodies = off;  -- refused outside a restore (schema_changes.sql)
ALTER TABLE fp_child INHERIT fp_parent;
RESET check_function_bodies;
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO fp_child VALUES (1, 0); COMMIT;
SELECT fencing_advance('fp-child', 100);
BEGIN; SET LOCAL pg_fencing.token = '6';
UPDATE fp_parent SET v = 1;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
DROP TABLE fp_child, fp_parent;

-- A SET expression that sets pg_fencing.token counts for its row, as with the trigger (which ran
-- after the new row was computed), also when the token column comes first in the table.
CREATE FUNCTION fp_settok(t text) RETURNS int LANGUAGE sql AS $$ SELECT set_config('pg_fencing.token', t, true)::int $$;
CREATE TABLE fp_first (fence_token bigint, id int PRIMARY KEY, v int);
SELECT fencing_protect('fp_first');
BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO fp_first VALUES (NULL, 1, 0); COMMIT;
BEGIN;
UPDATE fp_first SET v = fp_settok('20') RETURNING fence_token;
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '20';
UPDATE fp_first SET v = fp_settok('5');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
DROP TABLE fp_first;
DROP FUNCTION fp_settok(text);

-- A trigger fired by a fenced_* call that sets pg_fencing.token for its own writes: those carry
-- its token (here stale: FT001), not the call's.
CREATE TABLE fp_na (id int PRIMARY KEY, v int);
CREATE TABLE fp_nb (id int PRIMARY KEY, v int);
SELECT fencing_protect('fp_na');
SELECT fencing_protect('fp_nb', 'fp-nb');
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO fp_na VALUES (1, 0); INSERT INTO fp_nb VALUES (1, 0); COMMIT;
CREATE FUNCTION fp_na_after() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM set_config('pg_fencing.token', '3', true);
  UPDATE fp_nb SET v = v + 1;
  RETURN NULL;
END $$;
CREATE TRIGGER fp_na_after AFTER UPDATE ON fp_na FOR EACH ROW EXECUTE FUNCTION fp_na_after();
SELECT fenced_update('fp_na', '{"id": 1}', '{"v": 1}', 10);
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_high_water('fp-nb');
DROP TABLE fp_na, fp_nb;
DROP FUNCTION fp_na_after();
-- Hand-made calls in an ordinary statement are refused like the UPDATE they imitate.
BEGIN; SET LOCAL pg_fencing.token = '5';
SELECT _pg_fencing.stamp_row(11, 'fp_row'::regclass, (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'fp_row'::regclass), 'fence_token', 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- A fenced_* call's token counts only for its own statement: not after a failed call caught in
-- a savepoint or an EXCEPTION block, and never in pg_fencing.token.
BEGIN;
SAVEPOINT a;
SELECT fenced_update('fp_row', '{"id": 1}', '{"v": 1}', 3);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT a;
UPDATE fp_row SET v = 1 WHERE id = 1;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
DO $$
BEGIN
  BEGIN
    PERFORM fenced_update('fp_row', '{"id": 1}', '{"v": 1}', 3);
  EXCEPTION WHEN SQLSTATE 'FT001' THEN
    RAISE NOTICE 'caught %', SQLSTATE;
  END;
  UPDATE fp_row SET v = 1 WHERE id = 1;
END
$$;
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('fp_row', '{"id": 1}', '{"v": 5}', 11) ->> 'v' AS v, current_setting('pg_fencing.token') AS session_token;
UPDATE fp_row SET v = 1 WHERE id = 1;
\echo :LAST_ERROR_SQLSTATE

DROP VIEW fp_view;
DROP TABLE fp_row, fp_res, fp_other, fp_gen, fp_part, fp_rpart;
DROP FUNCTION fp_touch(), fp_calls(), fp_reset(), fp_plan(text);
