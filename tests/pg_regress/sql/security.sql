-- An ordinary role must not run its own operators with the extension owner's privileges through
-- pg_fencing's internal statements (search_path is pinned while they run).
\set SHOW_CONTEXT never
CREATE ROLE mallory LOGIN;
CREATE SCHEMA mal AUTHORIZATION mallory;
CREATE TABLE victim (id int PRIMARY KEY, v text);
SELECT fencing_protect('victim', 'victim-res');
GRANT ALL ON victim TO mallory;
CREATE TABLE victim_rows (id int PRIMARY KEY, v text);
SELECT fencing_protect('victim_rows');
GRANT ALL ON victim_rows TO mallory;
SET ROLE mallory;
CREATE FUNCTION mal.lt(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF current_user <> 'mallory' THEN EXECUTE 'ALTER ROLE mallory SUPERUSER'; END IF;
    RETURN $1 OPERATOR(pg_catalog.<) $2;
END $$;
CREATE OPERATOR mal.< (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = mal.lt);
CREATE FUNCTION mal.eq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF current_user <> 'mallory' THEN EXECUTE 'ALTER ROLE mallory SUPERUSER'; END IF;
    RETURN $1 OPERATOR(pg_catalog.=) $2;
END $$;
CREATE OPERATOR mal.= (LEFTARG = text, RIGHTARG = text, FUNCTION = mal.eq);
SET search_path = mal, pg_catalog, public;
SELECT public.fencing_advance('victim-res', 1);
SELECT public.fencing_advance('victim-res', 2);
BEGIN; SET LOCAL pg_fencing.token = '3'; INSERT INTO public.victim VALUES (1, 'x'); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '4'; UPDATE public.victim SET v = 'y'; COMMIT;
-- per-row mode: tombstone reads and writes, twice each so that cached plans are used too
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO public.victim_rows VALUES (1, 'x'), (2, 'x'); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '6'; DELETE FROM public.victim_rows WHERE id = 1; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '6'; DELETE FROM public.victim_rows WHERE id = 2; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '7'; INSERT INTO public.victim_rows VALUES (1, 'y'), (2, 'y'); COMMIT;
RESET search_path;
RESET ROLE;
SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory';
SELECT fencing_high_water('victim-res');
DROP TABLE victim, victim_rows;
DROP SCHEMA mal CASCADE;
DROP ROLE mallory;

-- fencing_guard() attached by hand, with made-up arguments, cannot write into a protection
CREATE TABLE guarded (id int PRIMARY KEY, v text);
SELECT fencing_protect('guarded');
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO guarded VALUES (1, 'x'); COMMIT;
CREATE ROLE eve LOGIN;
CREATE SCHEMA evil AUTHORIZATION eve;
SET ROLE eve;
CREATE TABLE evil.forged (id int PRIMARY KEY, fence_token bigint);
INSERT INTO evil.forged VALUES (1, NULL);
SELECT format('CREATE TRIGGER g BEFORE DELETE ON evil.forged FOR EACH ROW EXECUTE FUNCTION fencing_guard(%L, %L, %L)',
              (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'guarded'::regclass), '', 'fence_token') AS ddl \gset
:ddl;
BEGIN; SET LOCAL pg_fencing.token = '9223372036854775807'; DELETE FROM evil.forged; COMMIT;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DROP SCHEMA evil CASCADE;
DROP ROLE eve;
SELECT count(*) AS tombstones_of_guarded FROM _pg_fencing.row_tombstone t
JOIN _pg_fencing.protected_table p ON p.id = t.protection_id WHERE p.relid = 'guarded'::regclass;
SELECT fenced_update('guarded', '{"id": 1}', '{"v": "y"}', 6);

-- pg_fencing needs a UTF8 database (keys and names are handled as UTF-8)
CREATE DATABASE fencing_latin1 TEMPLATE template0 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C';
\c fencing_latin1
CREATE EXTENSION pg_fencing;
\echo :LAST_ERROR_SQLSTATE
\c pg_fencing_regress
DROP DATABASE fencing_latin1;
