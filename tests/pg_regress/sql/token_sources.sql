-- Whether a token counts is decided by where it came from, never by its value (docs/security.md,
-- "Token sources"; src/rule/session_token.rs). Issue 30, cases 2 and 5: a configured token
-- (ALTER ROLE/DATABASE ... SET, ALTER SYSTEM) never counts, whatever brings it back (RESET,
-- SET ... TO DEFAULT, set_config with NULL, RESET ALL, DISCARD ALL), also with
-- pg_fencing.token_scope = session; a function's SET clause never counts.
\set VERBOSITY terse
\set SHOW_CONTEXT never
CREATE ROLE ts_app LOGIN;
CREATE TABLE ts (id int PRIMARY KEY, v int);
SELECT fencing_protect('ts', 'ts-res');
CREATE TABLE ts_rows (id int PRIMARY KEY, v int);
SELECT fencing_protect('ts_rows');
GRANT ALL ON ts, ts_rows TO ts_app;
BEGIN; SET LOCAL pg_fencing.token = '30'; INSERT INTO ts VALUES (1, 0); INSERT INTO ts_rows VALUES (1, 0); COMMIT;
ALTER ROLE ts_app SET pg_fencing.token = '999';
\c - ts_app
SHOW pg_fencing.token;
-- A plain write: the configured token does not count.
UPDATE ts SET v = 1;
\echo :LAST_ERROR_SQLSTATE
-- Brought back inside a transaction: still the configured token, still not counted.
BEGIN; SET LOCAL pg_fencing.token = '31'; RESET pg_fencing.token; SHOW pg_fencing.token; UPDATE ts SET v = 2;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '31'; SET LOCAL pg_fencing.token TO DEFAULT; UPDATE ts SET v = 3;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET pg_fencing.token TO DEFAULT; INSERT INTO ts_rows VALUES (2, 0);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SELECT set_config('pg_fencing.token', NULL, true) IS NOT NULL AS reset; DELETE FROM ts_rows;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '31'; RESET ALL; UPDATE ts SET v = 4;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
DISCARD ALL;
BEGIN; UPDATE ts_rows SET v = 5;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- The UPDATE fast path and the trigger path agree (a key column in SET keeps the triggers).
BEGIN; RESET pg_fencing.token; UPDATE ts_rows SET id = id;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- fencing_advance takes its token as an argument; the configured one plays no part.
-- The token the client sets itself counts, as always.
BEGIN; SET LOCAL pg_fencing.token = '31'; UPDATE ts SET v = 6; UPDATE ts_rows SET v = 6; COMMIT;
\c - postgres
SELECT fencing_high_water('ts-res') AS mark, (SELECT fence_token FROM ts_rows) AS row_token;
-- With pg_fencing.token_scope = session (a superuser's ALTER ROLE), a configured token still
-- never counts; a plain SET by the client does, for the session.
ALTER ROLE ts_app SET pg_fencing.token_scope = 'session';
\c - ts_app
SHOW pg_fencing.token_scope;
UPDATE ts SET v = 7;
\echo :LAST_ERROR_SQLSTATE
SET pg_fencing.token = '32';
UPDATE ts SET v = 8;
UPDATE ts SET v = 9;
RESET pg_fencing.token;
UPDATE ts SET v = 10;
\echo :LAST_ERROR_SQLSTATE
\c - postgres
ALTER ROLE ts_app RESET ALL;
SELECT fencing_high_water('ts-res') AS mark;
-- The same for a database's configuration.
SELECT format('ALTER DATABASE %I SET pg_fencing.token = %L', current_database(), '999') \gexec
\c - ts_app
BEGIN; RESET pg_fencing.token; SHOW pg_fencing.token; UPDATE ts SET v = 11;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
\c - postgres
SELECT format('ALTER DATABASE %I RESET pg_fencing.token', current_database()) \gexec

-- Case 5: a function's SET clause freezes a token into its definition; it never counts, not
-- even as a superuser's SECURITY DEFINER function called by a role with no rights on the table.
CREATE FUNCTION ts_frozen() RETURNS void LANGUAGE sql SET pg_fencing.token = '999'
    AS 'UPDATE public.ts SET v = 20';
CREATE FUNCTION ts_frozen_rows() RETURNS void LANGUAGE sql SET pg_fencing.token = '999'
    AS 'UPDATE public.ts_rows SET v = 20';
BEGIN; SET LOCAL pg_fencing.token = '999'; CREATE FUNCTION ts_from_current() RETURNS void LANGUAGE sql
    SET pg_fencing.token FROM CURRENT AS 'INSERT INTO public.ts_rows VALUES (3, 0)'; COMMIT;
CREATE FUNCTION ts_definer() RETURNS void LANGUAGE sql SECURITY DEFINER SET pg_fencing.token = '999'
    AS 'UPDATE public.ts SET v = 21';
CREATE FUNCTION ts_advance() RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
    SET pg_fencing.token = '999' AS $$ BEGIN UPDATE public.ts SET v = 22; RETURN 0; END $$;
REVOKE ALL ON ts, ts_rows FROM ts_app;
GRANT EXECUTE ON FUNCTION ts_definer(), ts_advance() TO ts_app;
SELECT ts_frozen();
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '31'; SELECT ts_frozen_rows();
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT ts_from_current();
\echo :LAST_ERROR_SQLSTATE
SET ROLE ts_app;
SELECT ts_definer();
\echo :LAST_ERROR_SQLSTATE
SELECT ts_advance();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- A function without a SET clause for the token sees the caller's token, which counts; a
-- function's SET clause for another setting changes nothing.
CREATE FUNCTION ts_plain() RETURNS void LANGUAGE sql SET search_path = pg_catalog
    AS 'UPDATE public.ts SET v = 23';
BEGIN; SET LOCAL pg_fencing.token = '32'; SELECT ts_plain(); COMMIT;
-- Nothing above moved a mark but the session-scoped SET (32) and ts_plain.
SELECT fencing_high_water('ts-res') AS mark, (SELECT max(fence_token) FROM ts_rows) AS row_token,
       (SELECT v FROM ts) AS v;
DROP FUNCTION ts_frozen(), ts_frozen_rows(), ts_from_current(), ts_definer(), ts_advance(), ts_plain();
DROP TABLE ts, ts_rows;
DROP ROLE ts_app;
