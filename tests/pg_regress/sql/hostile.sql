-- Hostile input and the privilege model: every bad token form, who may advance a resource, and
-- how long a token set with SET lasts (pg_fencing.token_scope). Nothing of a refused write stays.
\set SHOW_CONTEXT never
CREATE TABLE h (id int PRIMARY KEY, v text);
SELECT fencing_protect('h', 'h-res');
CREATE TABLE hr (id int PRIMARY KEY, v text);
SELECT fencing_protect('hr');

-- ===== every token form, through the GUC (checked at SET time, never clamped) =====
CREATE FUNCTION try_token(t text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('pg_fencing.token', t, true);
    RETURN 'accepted: ' || coalesce(nullif(btrim(current_setting('pg_fencing.token'), E' \t\n'), ''), 'no token');
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
SELECT f AS form, try_token(f) AS outcome FROM (VALUES
    (''), ('   '), ('7'), (' 7 '), (E'\t7\n'), ('+7'), ('007'), ('-7'), ('0'), ('-0'), ('+0'),
    ('1e3'), ('1.0'), ('1.5'), ('.5'), ('0x10'), ('7 7'), ('7a'), ('++7'), ('+-7'), ('-'), ('+'),
    ('NULL'), ('١٢'), ('９'), ('9223372036854775807'), ('+9223372036854775807'),
    ('9223372036854775808'), ('18446744073709551616'), ('99999999999999999999999999999'),
    ('-9223372036854775808'), ('-9223372036854775809')) AS forms(f);
-- NULL through set_config resets the setting
BEGIN;
SELECT set_config('pg_fencing.token', '5', true);
SELECT quote_literal(set_config('pg_fencing.token', NULL, true)) AS value_after_null;
SHOW pg_fencing.token;
ROLLBACK;
-- the maximum bigint parses as a token, but it is in the lease range (from 2^48 up) and no lease
-- holds it: FT003 (docs/leases.md, "The time fence"); the highest token outside that range,
-- 2^48 - 1, is valid: writes with it are accepted and fence everything older
BEGIN; SET LOCAL pg_fencing.token = '9223372036854775807'; INSERT INTO hr VALUES (1, 'max'); COMMIT;
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '281474976710655'; INSERT INTO hr VALUES (1, 'max'); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '281474976710654'; UPDATE hr SET v = 'below max' WHERE id = 1; ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM hr;

-- ===== the same forms as bigint arguments =====
SELECT fencing_advance('h-res', '9223372036854775808');
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_advance('h-res', '1e3');
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_advance('h-res', ' 12 ');
SELECT fenced_insert('h', '{"id": 1, "v": "a"}', '-9223372036854775808');
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('h', '{"id": 1, "v": "a"}', 281474976710655);
SELECT fencing_high_water('h-res');

-- ===== jsonb that is not a flat object of known columns =====
SELECT fenced_insert('hr', '[{"id": 2}]', 281474976710655);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('hr', '42', 281474976710655);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('hr', 'null', 281474976710655);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('hr', NULL, 281474976710655);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('hr', '{"id": [2]}', 281474976710655);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('hr', '{"id": {"nested": 2}}', 281474976710655);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('hr', '{"id": 2, "id": 3}', 281474976710655) ->> 'id' AS last_duplicate_wins;
SELECT fenced_insert('hr', '{"id": 4, "ID": 5}', 281474976710655);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('hr', '{"id": 4, "v; DROP TABLE hr; --": 1}', 281474976710655);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('hr', '{"id": 4, "fence_token": 1}', 281474976710655);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('hr', '{"id": "four"}', 281474976710655);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('hr', '{"id": 99999999999}', 281474976710655);
\echo :LAST_ERROR_SQLSTATE
SELECT length(fenced_insert('hr', jsonb_build_object('id', 5, 'v', repeat('x', 1000000)), 281474976710655) ->> 'v') AS huge_value_length;
SELECT fenced_update('hr', '{}', '{"v": "x"}', 281474976710655);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('hr', '{"id": 5, "v": "x"}', '{"v": "y"}', 281474976710655);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('hr', '{"id": 5}', '{"id": 6, "v": "moved"}', 281474976710655) ->> 'id' AS key_changed;
SELECT fenced_delete('hr', '{"id": "5"}', 281474976710655);
\echo :LAST_ERROR_SQLSTATE
-- a dropped table and a renamed one
CREATE TABLE gone (id int PRIMARY KEY);
SELECT fencing_protect('gone');
SELECT 'gone'::regclass::oid AS gone_oid \gset
DROP TABLE gone;
CREATE FUNCTION sqlstate_of(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END $$;
SELECT sqlstate_of(format('SELECT fenced_insert(%s, %L, 1)', :gone_oid, '{"id": 1}')) AS dropped_by_oid;
SELECT fenced_insert('gone', '{"id": 1}', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT id, v IS NULL AS v_null, fence_token FROM hr ORDER BY id;

-- ===== who may advance a resource =====
CREATE ROLE h_reader LOGIN;
CREATE ROLE h_writer LOGIN;
GRANT SELECT ON h TO h_reader;
GRANT UPDATE ON h TO h_writer;
SET ROLE h_reader;
SELECT fencing_advance('h-res', 281474976710655);
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_advance('no-table-res', 5);
\echo :LAST_ERROR_SQLSTATE
-- internal state is read-only for ordinary roles
INSERT INTO _pg_fencing.resource_high_water VALUES ('h-res', 1);
\echo :LAST_ERROR_SQLSTATE
UPDATE _pg_fencing.resource_high_water SET high_water = 1;
\echo :LAST_ERROR_SQLSTATE
DELETE FROM _pg_fencing.row_tombstone;
\echo :LAST_ERROR_SQLSTATE
SELECT _pg_fencing.lock_resource('h-res');
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_reset('h-res', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_unprotect('h');
\echo :LAST_ERROR_SQLSTATE
SET pg_fencing.token_scope = session;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SET ROLE h_writer;
SELECT fencing_advance('h-res', 281474976710655);
SELECT fencing_advance('no-table-res', 5);
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT fencing_advance('no-table-res', 5);
SELECT fencing_high_water('h-res'), fencing_high_water('no-table-res');
DROP OWNED BY h_reader, h_writer;
DROP ROLE h_reader, h_writer;

-- ===== pg_fencing.token_scope: a plain SET counts in its own transaction only =====
SHOW pg_fencing.token_scope;
CREATE TABLE s (id int PRIMARY KEY, v int);
SELECT fencing_protect('s', 's-res');
SET pg_fencing.token = '5';
INSERT INTO s VALUES (1, 1);
\echo :LAST_ERROR_SQLSTATE
SHOW pg_fencing.token;
BEGIN; SET pg_fencing.token = '5'; INSERT INTO s VALUES (1, 1); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '6'; UPDATE s SET v = 2; COMMIT;
UPDATE s SET v = 3;
\echo :LAST_ERROR_SQLSTATE
SET pg_fencing.token_scope = session;
SET pg_fencing.token = '7';
UPDATE s SET v = 4;
UPDATE s SET v = 5;
RESET pg_fencing.token_scope;
UPDATE s SET v = 6;
\echo :LAST_ERROR_SQLSTATE
RESET pg_fencing.token;
SELECT * FROM s;

-- ===== nobody joins someone else's resource to raise its mark =====
CREATE ROLE h_gus LOGIN;
GRANT CREATE ON SCHEMA public TO h_gus;
SET ROLE h_gus;
CREATE TABLE mine (id int PRIMARY KEY);
SELECT fencing_protect('mine', 'h-res');
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_protect('mine', 'no-table-res');
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_advance('h-res', 281474976710655);
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_protect('mine', 'gus-own-res');
SELECT fencing_advance('gus-own-res', 3);
RESET ROLE;
-- column-level and partition-level write privileges count for fencing_advance
CREATE TABLE hp (k int, id int, v int, PRIMARY KEY (k, id)) PARTITION BY LIST (k);
CREATE TABLE hp1 PARTITION OF hp FOR VALUES IN (1);
SELECT fencing_protect('hp', 'hp-res');
GRANT UPDATE (v) ON h TO h_gus;
GRANT ALL ON hp1 TO h_gus;
SET ROLE h_gus;
SELECT fencing_advance('h-res', 281474976710655);
SELECT fencing_advance('hp-res', 4);
RESET ROLE;
-- a token in a role's configuration does not count (a fixed token would defeat fencing)
GRANT INSERT ON s TO h_gus;
ALTER ROLE h_gus SET pg_fencing.token = '8';
\c - h_gus
SHOW pg_fencing.token;
INSERT INTO s VALUES (2, 2);
\echo :LAST_ERROR_SQLSTATE
\c - postgres
DROP TABLE hp;
DROP OWNED BY h_gus;
DROP ROLE h_gus;

-- ===== fencing_watch: same rights as fencing_advance; bad names refused =====
CREATE ROLE h_watcher LOGIN;
SET ROLE h_watcher;
SELECT fencing_watch('h-res');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT fencing_watch(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_watch(E'bad\tname');
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_watch('h-res', 'h-lock', true);
SELECT resource, lock_key_prefix, verify FROM fencing_watches;
-- watches are per database: another database neither sees nor changes this one
SELECT current_database() AS regress_db \gset
CREATE DATABASE hostile_other;
\c hostile_other
CREATE EXTENSION pg_fencing;
SELECT count(*) AS watches_seen_from_other_db FROM fencing_watches;
SELECT fencing_unwatch('h-res') AS unwatched_from_other_db;
\c :regress_db
SELECT resource FROM fencing_watches;
DROP DATABASE hostile_other;
SELECT fencing_unwatch('h-res'), fencing_unwatch('h-res');
SELECT count(*) FROM fencing_watches;
DROP ROLE h_watcher;
