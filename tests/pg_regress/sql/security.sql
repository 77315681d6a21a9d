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
-- Row-level security (issue 42, item 6): a role whose policy hides a row deletes nothing with
-- its own DELETE; a hand-made call of the DELETE fast path's function on that row's key would
-- plant a tombstone the owner's re-insert is then refused by. Refused (42501), as is every
-- stamping function called by hand where a policy applies; the owner's delete and re-insert work.
\set VERBOSITY default
CREATE TABLE rls_jobs (id int PRIMARY KEY, owner_name text);
SELECT fencing_protect('rls_jobs');
BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO rls_jobs VALUES (1, 'other'), (2, 'rls_role'); COMMIT;
CREATE ROLE rls_role;
GRANT SELECT, INSERT, UPDATE, DELETE ON rls_jobs TO rls_role;
ALTER TABLE rls_jobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_rows ON rls_jobs USING (owner_name = current_user);
SELECT id AS pid FROM _pg_fencing.protected_table WHERE relid = 'rls_jobs'::regclass \gset
SET ROLE rls_role;
BEGIN; SET LOCAL pg_fencing.token = '500'; DELETE FROM rls_jobs WHERE id = 1; COMMIT;
-- its own statements on its own row still take the fast paths
BEGIN; SET LOCAL pg_fencing.token = '12'; UPDATE rls_jobs SET owner_name = owner_name WHERE id = 2; DELETE FROM rls_jobs WHERE id = 2; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '500';
SELECT _pg_fencing.drop_row(NULL, 'rls_jobs'::regclass, :pid, 'fence_token', NULL, NULL, 1);
COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '500';
SELECT _pg_fencing.stamp_row(NULL, 'rls_jobs'::regclass, :pid, 'fence_token', 1);
COMMIT;
-- The same calls written into the role's own fast-path statement on the table: still made by
-- hand (only the stamping calls the planner adds act for the statement), refused the same way.
BEGIN; SET LOCAL pg_fencing.token = '500';
DELETE FROM rls_jobs WHERE id = (SELECT 99 WHERE _pg_fencing.drop_row(NULL, 'rls_jobs'::regclass, :pid, 'fence_token', NULL, NULL, 1) IS NOT NULL);
COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '500';
UPDATE rls_jobs SET owner_name = owner_name WHERE id = (SELECT 99 WHERE _pg_fencing.stamp_row(NULL, 'rls_jobs'::regclass, :pid, 'fence_token', 1) IS NOT NULL);
COMMIT;
-- A statement's own stamps act for it also after an error caught inside it (a function's
-- EXCEPTION block rolls back a subtransaction while the statement runs).
RESET ROLE;
CREATE FUNCTION rls_safe_div(a int, b int) RETURNS int LANGUAGE plpgsql AS
$$BEGIN RETURN a / b; EXCEPTION WHEN division_by_zero THEN RETURN NULL; END$$;
SET ROLE rls_role;
BEGIN; SET LOCAL pg_fencing.token = '13';
INSERT INTO rls_jobs VALUES (3 + coalesce(rls_safe_div(1, 0), 0), 'rls_role');
UPDATE rls_jobs SET owner_name = owner_name WHERE id = 3 AND rls_safe_div(1, 0) IS NULL;
DELETE FROM rls_jobs WHERE id = 3 AND rls_safe_div(1, 0) IS NULL;
COMMIT;
RESET ROLE;
DROP FUNCTION rls_safe_div(int, int);
SELECT count(*) AS tombstones_of_rls_jobs FROM _pg_fencing.row_tombstone t
JOIN _pg_fencing.protected_table p ON p.id = t.protection_id WHERE p.relid = 'rls_jobs'::regclass;
-- the owner (no policy applies) deletes and re-creates the row with its own token
BEGIN; SET LOCAL pg_fencing.token = '11'; DELETE FROM rls_jobs WHERE id = 1; INSERT INTO rls_jobs VALUES (1, 'other'); COMMIT;
SELECT id, owner_name, fence_token FROM rls_jobs ORDER BY id;
DROP TABLE rls_jobs;
DROP ROLE rls_role;
-- A SECURITY DEFINER function of the schema called by hand does only what the caller could do:
-- publish_feeds adds pg_fencing's tables to a publication only for its owner or a superuser
-- (the login role); for anyone else it warns and leaves the publication as it is. (In a
-- database of its own: a published feed is filled with every tombstone of the database.)
CREATE DATABASE fencing_pub;
\c fencing_pub
\set SHOW_CONTEXT never
CREATE EXTENSION pg_fencing;
CREATE TABLE pub_t (id int PRIMARY KEY);
SELECT fencing_protect('pub_t');
SET client_min_messages = error;  -- (15 and 18 word wal_level's warning differently)
CREATE PUBLICATION pub_other FOR TABLE pub_t;
SET session_replication_role = replica;
ALTER PUBLICATION pub_other DROP TABLE _pg_fencing.resource_high_water, _pg_fencing.tombstone_feed;
RESET session_replication_role;
RESET client_min_messages;
CREATE ROLE pub_stranger LOGIN;
SET SESSION AUTHORIZATION pub_stranger;
SELECT _pg_fencing.publish_feeds((SELECT oid FROM pg_publication WHERE pubname = 'pub_other'));
RESET SESSION AUTHORIZATION;
SELECT count(*) AS feeds_published FROM pg_publication_tables WHERE pubname = 'pub_other' AND schemaname = '_pg_fencing';
SELECT _pg_fencing.publish_feeds((SELECT oid FROM pg_publication WHERE pubname = 'pub_other'));
SELECT count(*) AS feeds_published FROM pg_publication_tables WHERE pubname = 'pub_other' AND schemaname = '_pg_fencing';
DROP PUBLICATION pub_other;
DROP TABLE pub_t;
\c pg_fencing_regress
DROP DATABASE fencing_pub;
DROP ROLE pub_stranger;
