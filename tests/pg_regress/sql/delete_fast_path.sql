-- The DELETE fast path (src/guard/fast_path.rs): a DELETE without RETURNING of a protected table
-- does not fire the guard's triggers. Per-row mode: _pg_fencing.drop_row, a junk column of the
-- plan under the DELETE, checks each row version handed to the DELETE and leaves its key's
-- tombstone once the DELETE deleted it (told by the row count, else by the version); resource mode: the mark
-- is checked when the executor starts and stored when it finished, if a row was deleted. Calls are
-- counted by track_functions.
\set VERBOSITY terse
SET track_functions = 'all';
CREATE TABLE dp_row (id int PRIMARY KEY, v int NOT NULL);
CREATE TABLE dp_res (id int PRIMARY KEY, v int NOT NULL);
SELECT fencing_protect('dp_row');
SELECT fencing_protect('dp_res', 'dp-resource');
BEGIN; SET LOCAL pg_fencing.token = '10';
INSERT INTO dp_row SELECT g, 0 FROM generate_series(1, 20) g;
INSERT INTO dp_res SELECT g, 0 FROM generate_series(1, 20) g;
COMMIT;
CREATE TEMP TABLE dp_seen (guard bigint, drop_row bigint);
INSERT INTO dp_seen VALUES (0, 0);
CREATE FUNCTION dp_reset() RETURNS void LANGUAGE sql AS $$
  UPDATE dp_seen SET guard = g, drop_row = r
  FROM (SELECT coalesce(sum(calls) FILTER (WHERE funcname = 'fencing_guard'), 0) AS g,
               coalesce(sum(calls) FILTER (WHERE funcname = 'drop_row'), 0) AS r
        FROM pg_stat_xact_user_functions) now
$$;
CREATE FUNCTION dp_calls() RETURNS TABLE (guard bigint, drop_row bigint)
LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY
  SELECT now.g - f.guard, now.r - f.drop_row
  FROM dp_seen f,
       (SELECT coalesce(sum(calls) FILTER (WHERE funcname = 'fencing_guard'), 0)::bigint AS g,
               coalesce(sum(calls) FILTER (WHERE funcname = 'drop_row'), 0)::bigint AS r
        FROM pg_stat_xact_user_functions) now;
  PERFORM dp_reset();
END
$$;
CREATE FUNCTION dp_plan(q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE l text;
BEGIN
  FOR l IN EXECUTE 'EXPLAIN (VERBOSE, COSTS OFF) ' || q LOOP
    RETURN NEXT regexp_replace(l, '''\d+''::(oid|bigint)', '<\1>', 'g');
  END LOOP;
END
$$;
CREATE FUNCTION dp_tombs() RETURNS TABLE (key text, high_water bigint) LANGUAGE sql AS $$
  SELECT t.key, t.high_water FROM _pg_fencing.row_tombstone t
  JOIN _pg_fencing.protected_table p ON p.id = t.protection_id
  WHERE p.relid = 'dp_row'::regclass ORDER BY t.key
$$;
-- The per-row plan checks each row in the scan under the DELETE (and the statement returns no
-- rows); the resource-mode plan has nothing per row.
SELECT dp_plan('DELETE FROM dp_row WHERE id = 1');
SELECT dp_plan('DELETE FROM dp_res WHERE id = 1');

-- Per-row mode: each deleted row is checked once, without the guard trigger, and leaves its
-- tombstone; the statement returns no rows and reports its count.
BEGIN; SET LOCAL pg_fencing.token = '11';
SELECT dp_reset();
DELETE FROM dp_row WHERE id <= 3;
SELECT * FROM dp_calls();
COMMIT;
SELECT * FROM dp_tombs();
-- A stale token is refused (FT001), naming the row; so is the stale re-insert of a deleted key.
BEGIN; SET LOCAL pg_fencing.token = '9';
DELETE FROM dp_row WHERE id = 4;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '10';
INSERT INTO dp_row VALUES (2, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- No token: FT002 once a row is deleted; a DELETE that deletes nothing needs none.
DELETE FROM dp_row WHERE id = 4;
\echo :LAST_ERROR_SQLSTATE
DELETE FROM dp_row WHERE id = 1000;
-- Rows written after a higher token: a later, lower one is refused for exactly those rows.
BEGIN; SET LOCAL pg_fencing.token = '30';
UPDATE dp_row SET v = 1 WHERE id = 5;
COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '20';
DELETE FROM dp_row WHERE id BETWEEN 4 AND 6;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '20';
DELETE FROM dp_row WHERE id IN (4, 6);
COMMIT;
-- A savepoint rolled back takes its tombstones back.
BEGIN; SET LOCAL pg_fencing.token = '21';
SAVEPOINT a;
DELETE FROM dp_row WHERE id = 7;
ROLLBACK TO a;
DELETE FROM dp_row WHERE id = 8;
COMMIT;
SELECT * FROM dp_tombs();
SELECT id FROM dp_row WHERE id IN (7, 8);
-- DELETE ... RETURNING keeps the guard trigger and returns the rows.
BEGIN; SET LOCAL pg_fencing.token = '21';
SELECT dp_reset();
DELETE FROM dp_row WHERE id = 9 RETURNING id, fence_token;
SELECT * FROM dp_calls();
COMMIT;
-- Through a CTE, a view, a prepared statement and PL/pgSQL (whose row count counts).
BEGIN; SET LOCAL pg_fencing.token = '22';
WITH d AS (SELECT 10 AS id) DELETE FROM dp_row USING d WHERE dp_row.id = d.id;
CREATE VIEW dp_view AS SELECT id, v FROM dp_row;
DELETE FROM dp_view WHERE id = 11;
PREPARE dp_del(int) AS DELETE FROM dp_row WHERE id = $1;
EXECUTE dp_del(12);
DO $$
DECLARE n bigint;
BEGIN
  DELETE FROM dp_row WHERE id IN (13, 14);
  GET DIAGNOSTICS n = ROW_COUNT;
  RAISE NOTICE 'deleted % rows', n;
END
$$;
COMMIT;
SELECT key, high_water FROM dp_tombs() WHERE key IN ('(10)', '(11)', '(12)', '(13)', '(14)');
-- The prepared statement's plan follows the protection: unprotected, the DELETE needs no token.
SELECT fencing_unprotect('dp_row');
EXECUTE dp_del(15);
SELECT fencing_protect('dp_row');
EXECUTE dp_del(16);
\echo :LAST_ERROR_SQLSTATE
DEALLOCATE dp_del;
-- One row deleted in a transaction: its tombstone is written straight into the table and its
-- indexes; deleted again after a re-insert, the key's tombstone is raised (by INSERT ... ON
-- CONFLICT). Read through the primary key's index and the index of marks, the same.
BEGIN; SET LOCAL pg_fencing.token = '40'; INSERT INTO dp_row VALUES (900, 0); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '41'; DELETE FROM dp_row WHERE id = 900; COMMIT;
SELECT * FROM dp_tombs() WHERE key = '(900)';
BEGIN; SET LOCAL pg_fencing.token = '42'; INSERT INTO dp_row VALUES (900, 0); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '43'; DELETE FROM dp_row WHERE id = 900; COMMIT;
SET enable_seqscan = off; SET enable_bitmapscan = off;
SELECT t.key, t.high_water FROM _pg_fencing.row_tombstone t
WHERE t.protection_id = (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'dp_row'::regclass)
  AND t.key = '(900)';
SELECT max(t.high_water) FROM _pg_fencing.row_tombstone t
WHERE t.protection_id = (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'dp_row'::regclass);
RESET enable_seqscan; RESET enable_bitmapscan;
BEGIN; SET LOCAL pg_fencing.token = '42';
INSERT INTO dp_row VALUES (900, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- Replica mode (logical replication's apply): nothing is refused, the row's own token is the
-- tombstone's.
SET session_replication_role = replica;
DELETE FROM dp_row WHERE id = 17;
RESET session_replication_role;
SELECT key, high_water FROM dp_tombs() WHERE key = '(17)';
-- A protection that cannot hold (a restore that stopped half-way left a trigger disabled)
-- refuses the DELETE (FT004), and so does the resource-mode one; fencing_protect repairs it.
SET check_function_bodies = off;
ALTER TABLE dp_row DISABLE TRIGGER zz_pg_fencing_after;
ALTER TABLE dp_res DISABLE TRIGGER zz_pg_fencing_after;
RESET check_function_bodies;
BEGIN; SET LOCAL pg_fencing.token = '40';
DELETE FROM dp_row WHERE id = 18;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '40';
DELETE FROM dp_res WHERE id = 18;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT fencing_protect('dp_row'), fencing_protect('dp_res', 'dp-resource');

-- drop_row called by hand: only for the table's own protection and by a role that may delete.
SELECT _pg_fencing.drop_row(1, 'dp_row'::regclass, 999, 'fence_token', NULL, NULL, 1);
\echo :LAST_ERROR_SQLSTATE
CREATE ROLE dp_reader;
GRANT SELECT ON dp_row TO dp_reader;
SET ROLE dp_reader;
SELECT _pg_fencing.drop_row(1, 'dp_row'::regclass, (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'dp_row'::regclass), 'fence_token', NULL, NULL, 1);
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- ... and only with a key of the table (as many values as key columns, each of its type, none
-- NULL): 22023 otherwise.
\set dp_pid `echo "SELECT id FROM _pg_fencing.protected_table WHERE relid = 'dp_row'::regclass"`
BEGIN; SET LOCAL pg_fencing.token = '50';
SELECT _pg_fencing.drop_row(NULL, 'dp_row'::regclass, (:dp_pid), 'fence_token', NULL, NULL, 'abc'::text);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '50';
SELECT _pg_fencing.drop_row(NULL, 'dp_row'::regclass, (:dp_pid), 'fence_token', NULL, NULL, 1, 2);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '50';
SELECT _pg_fencing.drop_row(NULL, 'dp_row'::regclass, (:dp_pid), 'fence_token', NULL, NULL, NULL::int);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '50';
SELECT _pg_fencing.drop_row(NULL, 'dp_row'::regclass, (:dp_pid), 'fence_token', NULL, NULL, 4242);
SET LOCAL pg_fencing.token = '49';
INSERT INTO dp_row VALUES (4242, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- A role that may delete only through a view (the view owner's privileges count, as for the
-- DELETE itself).
GRANT SELECT, DELETE ON dp_view TO dp_reader;
SET ROLE dp_reader;
BEGIN; SET LOCAL pg_fencing.token = '40';
DELETE FROM dp_view WHERE id = 19;
COMMIT;
RESET ROLE;
SELECT key, high_water FROM dp_tombs() WHERE key = '(19)';
-- A role that may UPDATE but not DELETE cannot have drop_row leave tombstones from inside its own
-- UPDATE (a statement authorizes only its own kind of call).
GRANT UPDATE ON dp_row TO dp_reader;
SET ROLE dp_reader;
BEGIN; SET LOCAL pg_fencing.token = '1000';
UPDATE dp_row SET v = v WHERE id = 20
  AND _pg_fencing.drop_row(NULL, 'dp_row'::regclass, (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'dp_row'::regclass), 'fence_token', NULL, NULL, 777) IS NOT NULL;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
RESET ROLE;
DROP VIEW dp_view;
REVOKE ALL ON dp_row FROM dp_reader;
DROP ROLE dp_reader;

-- A partitioned per-row table: rows deleted in every partition leave their tombstones, and a
-- key whose equal values print differently (numeric) is fenced in every spelling.
CREATE TABLE dp_part (k int, id numeric, PRIMARY KEY (k, id)) PARTITION BY LIST (k);
CREATE TABLE dp_part1 PARTITION OF dp_part FOR VALUES IN (1);
CREATE TABLE dp_part2 PARTITION OF dp_part FOR VALUES IN (2);
SELECT fencing_protect('dp_part');
BEGIN; SET LOCAL pg_fencing.token = '50';
INSERT INTO dp_part VALUES (1, 1.0), (2, 2.50), (2, 3);
COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '51';
SELECT dp_reset();
DELETE FROM dp_part;
SELECT * FROM dp_calls();
COMMIT;
SELECT t.key, t.high_water, t.key_hash IS NOT NULL AS hashed FROM _pg_fencing.row_tombstone t
JOIN _pg_fencing.protected_table p ON p.id = t.protection_id
WHERE p.relid = 'dp_part'::regclass ORDER BY t.key;
BEGIN; SET LOCAL pg_fencing.token = '50';
INSERT INTO dp_part VALUES (2, 2.5000);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '51';
INSERT INTO dp_part VALUES (2, 2.5000);
COMMIT;
DROP TABLE dp_part;

-- Resource mode: the mark is checked before any row is locked and stored only if a row was
-- deleted; the guard does not fire.
BEGIN; SET LOCAL pg_fencing.token = '9';
DELETE FROM dp_res WHERE id = 1;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '12';
SELECT dp_reset();
DELETE FROM dp_res WHERE id = 1000;
SELECT * FROM dp_calls();
COMMIT;
SELECT fencing_high_water('dp-resource');
BEGIN; SET LOCAL pg_fencing.token = '12';
DELETE FROM dp_res WHERE id <= 2;
SELECT * FROM dp_calls();
COMMIT;
SELECT fencing_high_water('dp-resource');
DELETE FROM dp_res WHERE id = 3;
\echo :LAST_ERROR_SQLSTATE
DELETE FROM dp_res WHERE id = 1000;
-- The token lowered while the DELETE runs is checked too (the row trigger checked each row's);
-- one an AFTER trigger takes away leaves the token the statement started with.
BEGIN; SET LOCAL pg_fencing.token = '12';
DELETE FROM dp_res WHERE id = 6 AND set_config('pg_fencing.token', '11', true) IS NOT NULL;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
CREATE FUNCTION dp_clear_token() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN PERFORM set_config('pg_fencing.token', '', true); RETURN NULL; END$$;
CREATE TRIGGER dp_clear AFTER DELETE ON dp_res FOR EACH STATEMENT EXECUTE FUNCTION dp_clear_token();
BEGIN; SET LOCAL pg_fencing.token = '12';
DELETE FROM dp_res WHERE id = 6;
COMMIT;
DROP TRIGGER dp_clear ON dp_res;
DROP FUNCTION dp_clear_token();
-- A rule's added DELETE (which does not set the command's row count) keeps the triggers: the
-- mark rises with the rows it deleted.
CREATE TABLE dp_log (id int);
CREATE RULE dp_also AS ON INSERT TO dp_log DO ALSO DELETE FROM dp_res WHERE id = NEW.id;
BEGIN; SET LOCAL pg_fencing.token = '13';
INSERT INTO dp_log VALUES (4);
COMMIT;
SELECT fencing_high_water('dp-resource'), (SELECT count(*) FROM dp_res WHERE id = 4) AS left;
DROP TABLE dp_log;
-- With a higher token the mark rises, and an older holder is refused from then on.
BEGIN; SET LOCAL pg_fencing.token = '14';
DELETE FROM dp_res WHERE id = 5;
COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '13';
DELETE FROM dp_res WHERE id = 1000;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT fencing_high_water('dp-resource');
-- Rows handed to the DELETE but not deleted leave no tombstone: a BEFORE DELETE trigger that
-- skips the even keys (each skip is seen by the row count at the next row or at the end).
BEGIN; SET LOCAL pg_fencing.token = '10';
INSERT INTO dp_row SELECT g, 0 FROM generate_series(501, 510) g;
COMMIT;
CREATE FUNCTION dp_skip_even() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN IF OLD.id % 2 = 0 THEN RETURN NULL; END IF; RETURN OLD; END$$;
CREATE TRIGGER dp_skip BEFORE DELETE ON dp_row FOR EACH ROW EXECUTE FUNCTION dp_skip_even();
BEGIN; SET LOCAL pg_fencing.token = '30';
SELECT dp_reset();
DELETE FROM dp_row WHERE id BETWEEN 501 AND 505;
SELECT * FROM dp_calls();
COMMIT;
SELECT array_agg(id ORDER BY id) AS left FROM dp_row WHERE id BETWEEN 501 AND 505;
SELECT * FROM dp_tombs() WHERE high_water = 30;
DROP TRIGGER dp_skip ON dp_row;
-- The skipped keys take a lower token; the deleted ones refuse it.
BEGIN; SET LOCAL pg_fencing.token = '29';
UPDATE dp_row SET v = 1 WHERE id = 502;
INSERT INTO dp_row VALUES (503, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- A row met twice by a join is deleted once and keeps its tombstone (the row count tells less
-- than the versions checked: each version is looked at).
CREATE TEMP TABLE dp_twice (id int);
INSERT INTO dp_twice VALUES (506), (506), (507);
BEGIN; SET LOCAL pg_fencing.token = '31';
DELETE FROM dp_row USING dp_twice WHERE dp_row.id = dp_twice.id;
COMMIT;
SELECT * FROM dp_tombs() WHERE high_water = 31;
-- A rule's added DELETE does not set the row count: each version is looked at.
CREATE TABLE dp_log (id int);
CREATE RULE dp_also AS ON INSERT TO dp_log DO ALSO DELETE FROM dp_row WHERE id = NEW.id;
BEGIN; SET LOCAL pg_fencing.token = '32';
SELECT dp_reset();
INSERT INTO dp_log VALUES (508), (1000);
SELECT * FROM dp_calls();
COMMIT;
SELECT * FROM dp_tombs() WHERE high_water = 32;
DROP TABLE dp_log;
-- A partitioned table: each row version is looked for in its own partition (tableoid).
CREATE TABLE dp_part (id int PRIMARY KEY, v int NOT NULL) PARTITION BY RANGE (id);
CREATE TABLE dp_part_a PARTITION OF dp_part FOR VALUES FROM (0) TO (100);
CREATE TABLE dp_part_b PARTITION OF dp_part FOR VALUES FROM (100) TO (200);
SELECT fencing_protect('dp_part');
BEGIN; SET LOCAL pg_fencing.token = '5';
INSERT INTO dp_part SELECT g, 0 FROM generate_series(90, 110) g;
COMMIT;
CREATE FUNCTION dp_skip_odd() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN IF OLD.id % 2 = 1 THEN RETURN NULL; END IF; RETURN OLD; END$$;
CREATE TRIGGER dp_skip BEFORE DELETE ON dp_part FOR EACH ROW EXECUTE FUNCTION dp_skip_odd();
BEGIN; SET LOCAL pg_fencing.token = '6';
DELETE FROM dp_part WHERE id BETWEEN 98 AND 102;
COMMIT;
SELECT t.key, t.high_water FROM _pg_fencing.row_tombstone t
JOIN _pg_fencing.protected_table p ON p.id = t.protection_id
WHERE p.relid = 'dp_part'::regclass ORDER BY t.key;
BEGIN; SET LOCAL pg_fencing.token = '5';
INSERT INTO dp_part VALUES (100, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
DROP TABLE dp_part;
DROP FUNCTION dp_skip_even(), dp_skip_odd();
-- A key the DELETE deleted has its tombstone before anything else in the statement can write it
-- again with a lower token: a data-modifying WITH query nobody reads (run after the DELETE), an
-- AFTER DELETE trigger, a function in the WHERE clause evaluated for the next row. Each is
-- refused (FT001), as on the trigger path.
CREATE TABLE dp_again (id int PRIMARY KEY, v text);
SELECT fencing_protect('dp_again');
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO dp_again VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd'); COMMIT;
\set LAST_ERROR_SQLSTATE 00000
BEGIN; SET LOCAL pg_fencing.token = '10';
WITH ins AS (INSERT INTO dp_again (id, v) VALUES (1, set_config('pg_fencing.token', '3', true)) RETURNING id)
DELETE FROM dp_again WHERE id = 1;
COMMIT;
\echo :LAST_ERROR_SQLSTATE
CREATE FUNCTION dp_reinsert() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN PERFORM set_config('pg_fencing.token', '3', true); INSERT INTO dp_again VALUES (OLD.id, 'zombie'); RETURN NULL; END$$;
CREATE TRIGGER dp_reinsert AFTER DELETE ON dp_again FOR EACH ROW EXECUTE FUNCTION dp_reinsert();
\set LAST_ERROR_SQLSTATE 00000
BEGIN; SET LOCAL pg_fencing.token = '10';
DELETE FROM dp_again WHERE id = 2;
COMMIT;
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER dp_reinsert ON dp_again;
CREATE FUNCTION dp_reinsert_first(id int) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN
  IF id = 4 THEN
    PERFORM set_config('pg_fencing.token', '3', true);
    INSERT INTO dp_again VALUES (3, 'zombie');
    PERFORM set_config('pg_fencing.token', '10', true);
  END IF;
  RETURN true;
END$$;
\set LAST_ERROR_SQLSTATE 00000
BEGIN; SET LOCAL pg_fencing.token = '10';
DELETE FROM dp_again WHERE id IN (3, 4) AND dp_reinsert_first(id);
COMMIT;
\echo :LAST_ERROR_SQLSTATE
-- The same with the refused attempt caught by an EXCEPTION block: the block's rollback does not
-- take back the deleted key's tombstone (it belongs to the DELETE's subtransaction), so the next
-- attempt, in the same statement and after it, is refused too.
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO dp_again VALUES (11, 'a'), (12, 'b'), (15, 'e'), (16, 'f'); COMMIT;
CREATE FUNCTION dp_reinsert_caught(id int) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN
  IF id = 12 THEN
    PERFORM set_config('pg_fencing.token', '3', true);
    BEGIN
      INSERT INTO dp_again VALUES (11, 'zombie');
    EXCEPTION WHEN others THEN RAISE NOTICE 'caught %', SQLSTATE;
    END;
    INSERT INTO dp_again VALUES (11, 'zombie again');
    PERFORM set_config('pg_fencing.token', '10', true);
  END IF;
  RETURN true;
END$$;
\set LAST_ERROR_SQLSTATE 00000
BEGIN; SET LOCAL pg_fencing.token = '10';
DELETE FROM dp_again WHERE id IN (11, 12) AND dp_reinsert_caught(id);
COMMIT;
\echo :LAST_ERROR_SQLSTATE
CREATE OR REPLACE FUNCTION dp_reinsert_caught(id int) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN
  IF id = 16 THEN
    PERFORM set_config('pg_fencing.token', '3', true);
    BEGIN
      INSERT INTO dp_again VALUES (15, 'zombie');
    EXCEPTION WHEN others THEN RAISE NOTICE 'caught %', SQLSTATE;
    END;
    PERFORM set_config('pg_fencing.token', '10', true);
  END IF;
  RETURN true;
END$$;
BEGIN; SET LOCAL pg_fencing.token = '10';
DELETE FROM dp_again WHERE id IN (15, 16) AND dp_reinsert_caught(id);
COMMIT;
\set LAST_ERROR_SQLSTATE 00000
BEGIN; SET LOCAL pg_fencing.token = '3';
INSERT INTO dp_again VALUES (15, 'stale');
COMMIT;
\echo :LAST_ERROR_SQLSTATE
SELECT id, v, fence_token FROM dp_again ORDER BY id;
-- A version deleted by another command of the transaction (a BEFORE DELETE trigger's own
-- DELETE of the row, with token 6) is not this DELETE's: the tombstone is the trigger's 6, as on
-- the trigger path, not the outer DELETE's 10.
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO dp_again VALUES (7, 'g'), (8, 'h'); COMMIT;
CREATE FUNCTION dp_delete_itself() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN
  IF current_setting('pg_fencing.token') = '10' THEN
    PERFORM set_config('pg_fencing.token', '6', true);
    DELETE FROM dp_again WHERE id = OLD.id;
    PERFORM set_config('pg_fencing.token', '10', true);
    RETURN NULL;
  END IF;
  RETURN OLD;
END$$;
CREATE TRIGGER dp_delete_itself BEFORE DELETE ON dp_again FOR EACH ROW EXECUTE FUNCTION dp_delete_itself();
BEGIN; SET LOCAL pg_fencing.token = '10';
DELETE FROM dp_again WHERE id = 7;
COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '10';
DELETE FROM dp_again WHERE id = 8 RETURNING id;
COMMIT;
SELECT t.key, t.high_water FROM _pg_fencing.row_tombstone t JOIN _pg_fencing.protected_table p ON p.id = t.protection_id
WHERE p.relid = 'dp_again'::regclass AND t.key IN ('(7)', '(8)') ORDER BY t.key;
DROP TABLE dp_again;
DROP FUNCTION dp_reinsert(), dp_reinsert_first(int), dp_reinsert_caught(int), dp_delete_itself();
DROP TABLE dp_row, dp_res;
DROP FUNCTION dp_reset(), dp_calls(), dp_plan(text), dp_tombs();
