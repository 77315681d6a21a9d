-- The INSERT fast path (src/guard/fast_path.rs): an INSERT into a plain protected table gets
-- _pg_fencing.stamp_insert(...) as its token column's value instead of the guard's BEFORE INSERT
-- row trigger. Per-row mode checks each key's tombstone once the row is in the unique index: in
-- the hidden RETURNING list _pg_fencing.insert_row(...) and, for keys identified by text, when the
-- statement finished, in one look at the highest tombstone when every row's token is at least
-- that (an INSERT with RETURNING or ON CONFLICT keeps the AFTER INSERT trigger); resource mode
-- checks the mark when the executor starts and stores it when it finished, if a row was written.
-- Calls are counted by track_functions.
\set VERBOSITY terse
SET track_functions = 'all';
CREATE TABLE ip_row (id int PRIMARY KEY, v int NOT NULL);
CREATE TABLE ip_res (id int PRIMARY KEY, v int NOT NULL);
SELECT fencing_protect('ip_row');
SELECT fencing_protect('ip_res', 'ip-resource');
CREATE TEMP TABLE ip_seen (guard bigint, stamp bigint);
INSERT INTO ip_seen VALUES (0, 0);
CREATE FUNCTION ip_reset() RETURNS void LANGUAGE sql AS $$
  UPDATE ip_seen SET guard = g, stamp = r
  FROM (SELECT coalesce(sum(calls) FILTER (WHERE funcname = 'fencing_guard'), 0) AS g,
               coalesce(sum(calls) FILTER (WHERE funcname = 'stamp_insert'), 0) AS r
        FROM pg_stat_xact_user_functions) now
$$;
CREATE FUNCTION ip_calls() RETURNS TABLE (guard bigint, stamp_insert bigint)
LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY
  SELECT now.g - f.guard, now.r - f.stamp
  FROM ip_seen f,
       (SELECT coalesce(sum(calls) FILTER (WHERE funcname = 'fencing_guard'), 0)::bigint AS g,
               coalesce(sum(calls) FILTER (WHERE funcname = 'stamp_insert'), 0)::bigint AS r
        FROM pg_stat_xact_user_functions) now;
  PERFORM ip_reset();
END
$$;
CREATE FUNCTION ip_plan(q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE l text;
BEGIN
  FOR l IN EXECUTE 'EXPLAIN (VERBOSE, COSTS OFF) ' || q LOOP
    RETURN NEXT regexp_replace(l, '''\d+''::(oid|bigint)', '<\1>', 'g');
  END LOOP;
END
$$;
SELECT ip_plan('INSERT INTO ip_row (id, v) SELECT g, 0 FROM generate_series(1, 3) g');
SELECT ip_plan('INSERT INTO ip_res VALUES (1, 0, 99)');
-- One row whose key the statement gives by constants, parameters and PostgreSQL's own
-- immutable functions: the stamp notes the key (stamp_insert_key), no RETURNING list; a volatile
-- key expression keeps insert_row.
SELECT ip_plan('INSERT INTO ip_row VALUES (1, 0)');
SELECT ip_plan('INSERT INTO ip_row VALUES ((random() * 0)::int + 1, 0)');

-- Per-row mode: each row is stamped by the expression; the guard's triggers do not fire, but for
-- the AFTER INSERT trigger of the INSERT with RETURNING. A value the statement gives the token
-- column is overwritten, as the trigger did.
BEGIN; SET LOCAL pg_fencing.token = '10';
SELECT ip_reset();
INSERT INTO ip_row (id, v) SELECT g, 0 FROM generate_series(1, 5) g;
INSERT INTO ip_row VALUES (6, 0, 999), (7, 0, NULL);
INSERT INTO ip_row VALUES (8, 0) RETURNING id, fence_token;
SELECT * FROM ip_calls();
COMMIT;
SELECT id, fence_token FROM ip_row ORDER BY id;
-- No token: FT002; a key deleted with a higher token cannot come back with a lower one (the
-- AFTER INSERT trigger), also through ON CONFLICT DO NOTHING; with a token at least the
-- tombstone's it can.
INSERT INTO ip_row VALUES (9, 0);
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '20'; DELETE FROM ip_row WHERE id IN (1, 2); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '15';
INSERT INTO ip_row VALUES (1, 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15';
INSERT INTO ip_row VALUES (2, 1) ON CONFLICT DO NOTHING;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '20';
INSERT INTO ip_row VALUES (1, 1), (2, 1);
COMMIT;
-- The check when the statement finished: keys deleted in one bulk DELETE at token 30 (a
-- tombstone each, the highest of the table) and in this transaction at 40.
BEGIN; SET LOCAL pg_fencing.token = '30'; DELETE FROM ip_row WHERE id BETWEEN 3 AND 7; COMMIT;
-- A writer below the highest tombstone: keys without a tombstone pass, one with is refused,
-- wherever it is in the statement, with the key in the message.
BEGIN; SET LOCAL pg_fencing.token = '25';
INSERT INTO ip_row (id, v) SELECT g, 0 FROM generate_series(100, 104) g;
SAVEPOINT a;
INSERT INTO ip_row (id, v) SELECT g, 0 FROM generate_series(200, 210) g UNION ALL SELECT 5, 0;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO a;
INSERT INTO ip_row VALUES (6, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO a;
-- The same for one-row INSERTs whose stamp notes the key (prepared, with a volatile key
-- expression).
PREPARE ip_one(int) AS INSERT INTO ip_row VALUES ($1, 0);
EXECUTE ip_one(700);
SAVEPOINT b;
EXECUTE ip_one(5);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO b;
INSERT INTO ip_row VALUES ((random() * 0)::int + 6, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO b;
SELECT id, fence_token FROM ip_row WHERE id = 700;
DEALLOCATE ip_one;
ROLLBACK TO a;
-- A token that changes during the statement: the row with the lower one is checked as such.
INSERT INTO ip_row (id, v)
  SELECT g, CASE WHEN g = 7 THEN set_config('pg_fencing.token', '25', true)::int ELSE 0 END
  FROM (VALUES (300), (7)) AS t(g), LATERAL (SELECT set_config('pg_fencing.token', '35', true)) s
  ORDER BY g DESC;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- A tombstone left earlier in the same transaction (not yet written out) counts.
BEGIN; SET LOCAL pg_fencing.token = '40';
DELETE FROM ip_row WHERE id = 8;
SET LOCAL pg_fencing.token = '35';
INSERT INTO ip_row VALUES (3, 0), (8, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- A key expression that may give another value when evaluated again (a stable function whose
-- answer a set_config in the same row changes) keeps insert_row, which reads the row: the row
-- stored is key 5, refused.
BEGIN; SET LOCAL pg_fencing.token = '25';
SET LOCAL ip.k = '5';
INSERT INTO ip_row (id, v, fence_token)
  VALUES (current_setting('ip.k')::int, 0, set_config('ip.k', '1000000', true)::bigint);
\echo :ERROR :LAST_ERROR_SQLSTATE
ROLLBACK;
-- The same through a function declared IMMUTABLE that is not (it reads the setting): only
-- PostgreSQL's own functions are trusted to be what they are declared.
CREATE FUNCTION ip_k(int) RETURNS int IMMUTABLE LANGUAGE sql
  AS $$ SELECT $1 + current_setting('ip.k')::int $$;
SET plan_cache_mode = force_generic_plan;
PREPARE ip_mislabelled(int) AS INSERT INTO ip_row (id, v, fence_token)
  VALUES (ip_k($1), 0, set_config('ip.k', '1000000', true)::bigint);
BEGIN; SET LOCAL pg_fencing.token = '25';
SET LOCAL ip.k = '0';
EXECUTE ip_mislabelled(5);
\echo :ERROR :LAST_ERROR_SQLSTATE
ROLLBACK;
DEALLOCATE ip_mislabelled;
RESET plan_cache_mode;
DROP FUNCTION ip_k(int);
-- A call of stamp_insert_key written into a statement (here as another bigint column's value,
-- noting a decoy key) marks nothing: the AFTER INSERT trigger stays and refuses key 5.
CREATE TABLE ip_atk (id int PRIMARY KEY, b bigint);
SELECT fencing_protect('ip_atk');
SELECT id AS atk_prot FROM _pg_fencing.protected_table WHERE relid = 'ip_atk'::regclass \gset
BEGIN; SET LOCAL pg_fencing.token = '30'; INSERT INTO ip_atk VALUES (5, 0); DELETE FROM ip_atk; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '25';
INSERT INTO ip_atk (id, b)
  VALUES (5, _pg_fencing.stamp_insert_key(0, 'ip_atk'::regclass, :atk_prot, 'fence_token', 999))
  RETURNING id;
\echo :ERROR :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '25';
INSERT INTO ip_atk (id, b)
  VALUES (5, _pg_fencing.stamp_insert_key(0, 'ip_atk'::regclass, :atk_prot, 'fence_token', 999));
\echo :ERROR :LAST_ERROR_SQLSTATE
ROLLBACK;
DROP TABLE ip_atk;
-- At or above the highest tombstone every key passes in one look; the rows' tokens are stamped.
BEGIN; SET LOCAL pg_fencing.token = '30';
SELECT ip_reset();
INSERT INTO ip_row (id, v) SELECT g, 0 FROM generate_series(3, 7) g;
SELECT * FROM ip_calls();
SELECT count(*) FILTER (WHERE fence_token = 30) FROM ip_row WHERE id BETWEEN 3 AND 7;
ROLLBACK;
-- The highest tombstone is read from the high-water index alone, whatever its entries' rows'
-- visibility: an entry of a tombstone written and rolled back (at 90) counts there, which only
-- means each key is looked up: a writer at 35 passes for keys whose tombstone is lower or
-- missing, one at 25 is still refused for key 4 (tombstone 30).
BEGIN; SET LOCAL pg_fencing.token = '90';
DELETE FROM ip_row WHERE id = 1;
INSERT INTO ip_row VALUES (1, 0);
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '35';
INSERT INTO ip_row VALUES (5, 0), (600, 0);
SELECT id, fence_token FROM ip_row WHERE id IN (5, 600) ORDER BY id;
SET LOCAL pg_fencing.token = '25';
INSERT INTO ip_row VALUES (601, 0), (4, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- A high-water index that is not valid is not read: each key is looked up, with the same
-- answers.
BEGIN;
UPDATE pg_index SET indisvalid = false
 WHERE indexrelid = '_pg_fencing.row_tombstone_high_water'::regclass;
SET LOCAL pg_fencing.token = '30';
INSERT INTO ip_row VALUES (5, 0), (602, 0);
SELECT id, fence_token FROM ip_row WHERE id IN (5, 602) ORDER BY id;
SET LOCAL pg_fencing.token = '25';
INSERT INTO ip_row VALUES (603, 0), (6, 0);
ROLLBACK;
-- The tombstone floor (fencing_prune_tombstones) is a mark for every key: a writer below it is
-- refused, saying so.
BEGIN;
SELECT fencing_prune_tombstones('ip_row', 31, 0);
SET LOCAL pg_fencing.token = '30';
\set VERBOSITY default
INSERT INTO ip_row VALUES (500, 0);
\set VERBOSITY terse
ROLLBACK;
-- An INSERT a rule adds (it sets no row count) keeps the AFTER INSERT trigger, which refuses it.
CREATE TABLE ip_src (k int);
CREATE RULE ip_also AS ON INSERT TO ip_src DO ALSO INSERT INTO ip_row VALUES (NEW.k, 9);
BEGIN; SET LOCAL pg_fencing.token = '25';
INSERT INTO ip_src VALUES (5);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
DROP TABLE ip_src;
-- A key identified by hash (numeric: 5.0 and 5.00 are one key) is checked by the RETURNING list
-- at once, against the tombstone of any equal key.
CREATE TABLE ip_num (id numeric PRIMARY KEY, v int NOT NULL);
SELECT fencing_protect('ip_num');
BEGIN; SET LOCAL pg_fencing.token = '50'; INSERT INTO ip_num VALUES (5.0, 0); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '60'; DELETE FROM ip_num; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '55';
INSERT INTO ip_num VALUES (5.00, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '60';
INSERT INTO ip_num VALUES (5.00, 0);
COMMIT;
DROP TABLE ip_num;
-- ON CONFLICT DO UPDATE: the insert part is stamped, the update part goes through the guard's
-- UPDATE trigger (a stale update of a newer row is refused).
BEGIN; SET LOCAL pg_fencing.token = '15';
INSERT INTO ip_row VALUES (1, 5) ON CONFLICT (id) DO UPDATE SET v = excluded.v;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '21';
INSERT INTO ip_row VALUES (1, 5), (30, 5) ON CONFLICT (id) DO UPDATE SET v = excluded.v;
COMMIT;
SELECT id, v, fence_token FROM ip_row WHERE id IN (1, 30) ORDER BY id;
-- fenced_insert runs on the fast path and still sees every row checked.
SELECT fenced_insert('ip_row', '{"id": 40, "v": 1}', 22) ->> 'fence_token' AS fenced_token;
-- Another BEFORE INSERT row trigger (it could change the token column after the expression):
-- the guard trigger stays, and runs after it.
CREATE FUNCTION ip_meddle() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.fence_token := 1; RETURN NEW; END $$;
CREATE TRIGGER ip_meddle BEFORE INSERT ON ip_row FOR EACH ROW EXECUTE FUNCTION ip_meddle();
BEGIN; SET LOCAL pg_fencing.token = '23';
SELECT ip_reset();
INSERT INTO ip_row VALUES (41, 0);
SELECT * FROM ip_calls();
COMMIT;
SELECT id, fence_token FROM ip_row WHERE id = 41;
DROP TRIGGER ip_meddle ON ip_row;
-- Replica mode (logical replication's apply): the row's token is what the statement gave.
SET session_replication_role = replica;
INSERT INTO ip_row VALUES (42, 0, 7);
RESET session_replication_role;
SELECT id, fence_token FROM ip_row WHERE id = 42;
-- stamp_insert called by hand: only for the table's own protection and by a role that may
-- insert; a role that may insert through a view only may insert through it.
SELECT _pg_fencing.stamp_insert(1, 'ip_row'::regclass, 999, '', 'fence_token');
\echo :LAST_ERROR_SQLSTATE
CREATE ROLE ip_reader;
GRANT SELECT ON ip_row TO ip_reader;
SET ROLE ip_reader;
SELECT _pg_fencing.stamp_insert(1, 'ip_row'::regclass, (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'ip_row'::regclass), '', 'fence_token');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
CREATE VIEW ip_view AS SELECT id, v FROM ip_row;
GRANT SELECT, INSERT ON ip_view TO ip_reader;
SET ROLE ip_reader;
BEGIN; SET LOCAL pg_fencing.token = '24';
INSERT INTO ip_view VALUES (43, 0);
COMMIT;
RESET ROLE;
SELECT id, fence_token FROM ip_row WHERE id = 43;
DROP VIEW ip_view;
REVOKE ALL ON ip_row FROM ip_reader;
DROP ROLE ip_reader;

-- Resource mode: nothing fires per row; the mark is checked at the start (FT001 for a stale
-- token, even for an INSERT that writes nothing) and stored only if a row was written (not for
-- an INSERT that selects nothing, nor one whose rows all conflict).
BEGIN; SET LOCAL pg_fencing.token = '10';
SELECT ip_reset();
INSERT INTO ip_res SELECT g, 0 FROM generate_series(1, 5) g;
SELECT * FROM ip_calls();
COMMIT;
SELECT fencing_high_water('ip-resource');
BEGIN; SET LOCAL pg_fencing.token = '9';
INSERT INTO ip_res SELECT g, 0 FROM generate_series(10, 9) g;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '11';
INSERT INTO ip_res SELECT g, 0 FROM generate_series(10, 9) g;
INSERT INTO ip_res VALUES (1, 0) ON CONFLICT DO NOTHING;
COMMIT;
SELECT fencing_high_water('ip-resource');
INSERT INTO ip_res VALUES (20, 0);
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '12';
INSERT INTO ip_res VALUES (20, 0), (1, 0) ON CONFLICT DO NOTHING;
COMMIT;
SELECT fencing_high_water('ip-resource'), (SELECT fence_token FROM ip_res WHERE id = 20) AS row_token;
-- ON CONFLICT DO UPDATE keeps the triggers in the row-trigger shape (its updated rows are the
-- UPDATE trigger's); the set-based shape, which has no BEFORE INSERT row trigger, stamps it.
BEGIN; SET LOCAL pg_fencing.token = '13';
SELECT ip_reset();
INSERT INTO ip_res VALUES (1, 7) ON CONFLICT (id) DO UPDATE SET v = excluded.v;
SELECT guard > 0 AS guard_fired, stamp_insert FROM ip_calls();
COMMIT;
SELECT fencing_high_water('ip-resource');
SELECT fenced_insert('ip_res', '{"id": 50, "v": 1}', 14) ->> 'fence_token' AS fenced_token;
SELECT fencing_high_water('ip-resource');
-- The session's token changed while the statement runs: the mark stored is the highest token a
-- row was stamped with (an INSERT), or that the statement carried (a DELETE), as the row
-- triggers stored each row's.
BEGIN; SET LOCAL pg_fencing.token = '20';
INSERT INTO ip_res SELECT g, 0 FROM generate_series(60, 62) g
 WHERE set_config('pg_fencing.token', CASE WHEN g = 60 THEN '20' ELSE '15' END, true) IS NOT NULL;
COMMIT;
SELECT fencing_high_water('ip-resource'), array_agg(fence_token ORDER BY id) AS tokens FROM ip_res WHERE id >= 60;
BEGIN; SET LOCAL pg_fencing.token = '30';
DELETE FROM ip_res WHERE id >= 60 AND set_config('pg_fencing.token', '25', true) IS NOT NULL;
COMMIT;
SELECT fencing_high_water('ip-resource');
DROP TABLE ip_row, ip_res;
DROP FUNCTION ip_reset(), ip_calls(), ip_plan(text), ip_meddle();
