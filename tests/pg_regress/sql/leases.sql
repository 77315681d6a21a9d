-- PostgreSQL leases (src/lock_service/leases.rs, docs/leases.md): the time fence on every write
-- path, renew, release, take-over, the lease range, arguments. Tokens depend on the clock, so
-- only comparisons and SQLSTATEs are shown.
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate
CREATE TABLE lease_res (id int PRIMARY KEY, v int);
SELECT fencing_protect('lease_res', 'lease-res');
CREATE TABLE lease_row (id int PRIMARY KEY, v int);
SELECT fencing_protect('lease_row');
CREATE TABLE lease_part (id int PRIMARY KEY, v int) PARTITION BY RANGE (id);
CREATE TABLE lease_part_1 PARTITION OF lease_part FOR VALUES FROM (0) TO (100);
SELECT fencing_protect('lease_part');

-- Every write path with token tok, each in a subtransaction rolled back after it (so each path
-- starts from the same rows): 'ok' or the SQLSTATE it raised.
CREATE FUNCTION lease_paths(tok bigint) RETURNS TABLE (path text, outcome text) LANGUAGE plpgsql AS $fn$
DECLARE
    stmt text;
BEGIN
    PERFORM set_config('pg_fencing.token', tok::text, true);
    FOR path, stmt IN VALUES
        ('resource INSERT', 'INSERT INTO lease_res VALUES (50, 1)'),
        ('resource INSERT ON CONFLICT', 'INSERT INTO lease_res VALUES (1, 2) ON CONFLICT (id) DO UPDATE SET v = 2'),
        ('resource UPDATE (fast path)', 'UPDATE lease_res SET v = 3 WHERE id = 1'),
        ('resource UPDATE of the key', 'UPDATE lease_res SET id = 60 WHERE id = 1'),
        ('resource DELETE', 'DELETE FROM lease_res WHERE id = 1'),
        ('resource MERGE', 'MERGE INTO lease_res r USING (VALUES (1, 4), (70, 4)) s(id, v) ON r.id = s.id WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.v)'),
        ('resource COPY FROM', 'COPY lease_res (id, v) FROM PROGRAM ''printf "80\t5\n"'''),
        ('resource TRUNCATE', 'TRUNCATE lease_res'),
        ('fenced_insert', format('SELECT fenced_insert(''lease_res'', ''{"id": 90, "v": 6}'', %s)', tok)),
        ('fenced_update', format('SELECT fenced_update(''lease_res'', ''{"id": 1}'', ''{"v": 7}'', %s)', tok)),
        ('fenced_delete', format('SELECT fenced_delete(''lease_res'', ''{"id": 1}'', %s)', tok)),
        ('fencing_advance', format('SELECT fencing_advance(''lease-res'', %s)', tok)),
        ('per-row INSERT', 'INSERT INTO lease_row VALUES (50, 1)'),
        ('per-row UPDATE (fast path)', 'UPDATE lease_row SET v = 3 WHERE id = 1'),
        ('per-row DELETE', 'DELETE FROM lease_row WHERE id = 1'),
        ('per-row COPY FROM', 'COPY lease_row (id, v) FROM PROGRAM ''printf "80\t5\n"'''),
        ('per-row TRUNCATE', 'TRUNCATE lease_row'),
        ('per-row fenced_update', format('SELECT fenced_update(''lease_row'', ''{"id": 1}'', ''{"v": 7}'', %s)', tok)),
        ('partition INSERT', 'INSERT INTO lease_part VALUES (5, 1)'),
        ('partition UPDATE', 'UPDATE lease_part SET v = 2 WHERE id = 1')
    LOOP
        BEGIN
            EXECUTE stmt;
            RAISE EXCEPTION USING ERRCODE = 'P0001';
        EXCEPTION WHEN OTHERS THEN
            outcome := CASE SQLSTATE WHEN 'P0001' THEN 'ok' ELSE SQLSTATE END;
        END;
        RETURN NEXT;
    END LOOP;
END
$fn$;

-- A lease: its token is a big number (microseconds since 2000 at the first grant after the
-- server started, then one more per grant), live, and listed.
SELECT fencing_lease_acquire('settle', '3s') AS t1 \gset
SELECT :t1 >= 2^48 AS at_least_2_48, :t1 >= (extract(epoch FROM now() - '2000-01-01 UTC') * 1e6)::bigint - 86400000000 AS near_the_clock;
SELECT name, token = :t1 AS token, live, acquired_by, holder_pid = pg_backend_pid() AS pid, ttl FROM fencing_leases;
SELECT fencing_lease_check(:t1);
-- The first rows, written with the live lease's token.
BEGIN;
SELECT set_config('pg_fencing.token', :'t1', true) IS NOT NULL AS set;
INSERT INTO lease_res VALUES (1, 0);
INSERT INTO lease_row VALUES (1, 0);
INSERT INTO lease_part VALUES (1, 0);
COMMIT;
-- While it is live every path admits it.
SELECT * FROM lease_paths(:t1);
-- Held: a second acquire fails at once (55P03), and after a short wait too.
SELECT fencing_lease_acquire('settle', '2s');
SELECT fencing_lease_acquire('settle', '2s', '200ms');
-- Renewed (from this session here; tests/isolation/specs/leases.spec renews from another), it
-- outlives its first ttl and its writes keep flowing.
SELECT fencing_lease_renew(:t1, '3s') > clock_timestamp() + '2s' AS renewed;
SELECT pg_sleep(2.2);
SELECT count(*) FILTER (WHERE outcome = 'ok') AS ok, count(*) AS paths FROM lease_paths(:t1);
-- Expired: every path refuses it with FT003, although no newer holder exists or wrote.
SELECT pg_sleep(1.0);
SELECT live FROM fencing_leases WHERE name = 'settle';
SELECT * FROM lease_paths(:t1);
SELECT fencing_lease_check(:t1);
SELECT fencing_lease_renew(:t1);
-- Also in plain statements of their own transactions.
BEGIN; SELECT set_config('pg_fencing.token', :'t1', true) IS NOT NULL AS set; UPDATE lease_res SET v = 9 WHERE id = 1; ROLLBACK;
BEGIN; SELECT set_config('pg_fencing.token', :'t1', true) IS NOT NULL AS set; INSERT INTO lease_row VALUES (2, 9); ROLLBACK;

-- Taken over: the next holder gets a higher token; the old token stays refused (FT003) on the
-- tables the new holder never wrote, and releasing it reports false.
SELECT fencing_lease_acquire('settle', '30s') AS t2 \gset
SELECT :t2 > :t1 AS higher;
SELECT count(*) FILTER (WHERE outcome = 'FT003') AS ft003, count(*) AS paths FROM lease_paths(:t1);
SELECT fencing_lease_release(:t1);
SELECT count(*) FILTER (WHERE outcome = 'ok') AS ok, count(*) AS paths FROM lease_paths(:t2);
-- A lease that expires inside a transaction refuses that transaction's next write.
SELECT fencing_lease_acquire('short', '1s') AS t3 \gset
BEGIN;
SELECT set_config('pg_fencing.token', :'t3', true) IS NOT NULL AS set;
INSERT INTO lease_row VALUES (3, 1);
SELECT pg_sleep(1.1);
INSERT INTO lease_row VALUES (4, 1);
ROLLBACK;

-- Released: true once, then false; its token is refused at once.
SELECT fencing_lease_release(:t2);
SELECT fencing_lease_release(:t2);
SELECT count(*) FILTER (WHERE outcome = 'FT003') AS ft003, count(*) AS paths FROM lease_paths(:t2);
SELECT count(*) AS rows_left FROM fencing_leases WHERE name = 'settle';
-- A released name is free again.
SELECT fencing_lease_acquire('settle', '30s') > :t2 AS free_again;

-- The lease range is every token from 2^48 up (docs/leases.md: unknown never means admitted): a token
-- above every lease token and the clock, never granted, is refused (FT003) like one below them;
-- etcd-style tokens below 2^48 are never looked up.
BEGIN; SET LOCAL pg_fencing.token = '9223372036854775000'; INSERT INTO lease_row VALUES (10, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '12'; INSERT INTO lease_row VALUES (11, 1); ROLLBACK;
-- A token in the range that no lease was granted (one below the current one) is refused.
SELECT token - 1 AS never FROM fencing_leases WHERE name = 'settle' \gset
BEGIN; SELECT set_config('pg_fencing.token', :'never', true) IS NOT NULL AS set; INSERT INTO lease_row VALUES (12, 1); ROLLBACK;
SELECT fencing_lease_check(12);
-- A database that never granted a lease (a copy that lost the history holding the database's
-- first grant: a promoted standby, a recovery to a restore point, a dump taken before the grant):
-- a lease-range token is refused there too, on every write path and by fencing_advance; 2^48 - 1
-- is below the range and counts. tests/lifecycle/lost_history.sh runs those copies for real.
CREATE DATABASE pg_fencing_never_granted;
\c pg_fencing_never_granted
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate
CREATE EXTENSION pg_fencing;
CREATE TABLE ng_res (id int PRIMARY KEY, v int);
SELECT fencing_protect('ng_res', 'ng-res');
CREATE TABLE ng_row (id int PRIMARY KEY, v int);
SELECT fencing_protect('ng_row');
SELECT count(*) AS leases_ever FROM fencing_leases;
BEGIN; SET LOCAL pg_fencing.token = '281474976710656'; INSERT INTO ng_res VALUES (1, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '281474976710656'; INSERT INTO ng_row VALUES (1, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '849632510721426'; COPY ng_row (id, v) FROM PROGRAM 'printf "2\t5\n"'; ROLLBACK;
SELECT fenced_insert('ng_row', '{"id": 3, "v": 1}', 849632510721426);
SELECT fencing_advance('ng-res', 849632510721426);
BEGIN; SET LOCAL pg_fencing.token = '281474976710655'; INSERT INTO ng_row VALUES (4, 1); ROLLBACK;
SELECT count(*) AS rows_written FROM ng_row;
\c pg_fencing_regress
DROP DATABASE pg_fencing_never_granted;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

-- Arguments.
SELECT fencing_lease_acquire(NULL, '1s');
SELECT fencing_lease_acquire('', '1s');
SELECT fencing_lease_acquire('x', NULL);
SELECT fencing_lease_acquire('x', '0');
SELECT fencing_lease_acquire('x', '-1s');
SELECT fencing_lease_acquire('x', '1 day -1 hour');
SELECT fencing_lease_acquire('x', '101 years');
SELECT fencing_lease_acquire('x', '1s', '-1s');
SELECT fencing_lease_acquire('x', '1s', NULL);
SELECT fencing_lease_acquire('x', '1s', '2 years');
SELECT fencing_lease_acquire('x', '100 years', '1 year') > 0 AS at_the_limits;
SELECT fencing_lease_renew(NULL);
SELECT fencing_lease_renew(0);
SELECT fencing_lease_renew(-5);
SELECT fencing_lease_renew(123, '0');
SELECT fencing_lease_release(NULL);
SELECT fencing_lease_release(0);
SELECT fencing_lease_check(NULL);
SELECT fencing_lease_check(-1);
SELECT fencing_lease_release(123);

-- Privileges: another role may acquire its own leases but neither renew nor release this one.
CREATE ROLE lease_other;
SELECT token AS t4 FROM fencing_leases WHERE name = 'settle' \gset
SET ROLE lease_other;
SELECT fencing_lease_renew(:t4);
SELECT fencing_lease_release(:t4);
SELECT fencing_lease_acquire('other', '1s') > 0 AS own_lease;
RESET ROLE;
SELECT name, acquired_by FROM fencing_leases ORDER BY name;
SELECT fencing_lease_release(:t4);
-- A lease whose acquiring role is gone: another role can neither renew nor release it, a superuser
-- can; its token is refused with FT003 once released.
CREATE ROLE lease_gone;
SET ROLE lease_gone;
SELECT fencing_lease_acquire('orphan', '1 hour') AS t5 \gset
RESET ROLE;
DROP ROLE lease_gone;
SET ROLE lease_other;
SELECT fencing_lease_release(:t5);
RESET ROLE;
SELECT fencing_lease_renew(:t5) > clock_timestamp() AS renewed_by_superuser;
SELECT fencing_lease_release(:t5);
BEGIN; SELECT set_config('pg_fencing.token', :'t5', true) IS NOT NULL AS set; INSERT INTO lease_row VALUES (20, 1); ROLLBACK;

-- A role renamed keeps no rights over its leases, and a role made again under a dropped one's
-- name gets none (rights follow the role's OID and name at the grant).
CREATE ROLE lease_alice;
SET ROLE lease_alice;
SELECT fencing_lease_acquire('alice', '1 hour') AS t6 \gset
RESET ROLE;
ALTER ROLE lease_alice RENAME TO lease_alice_old;
SET ROLE lease_alice_old;
SELECT fencing_lease_renew(:t6);
RESET ROLE;
DROP ROLE lease_alice_old;
CREATE ROLE lease_alice;
SET ROLE lease_alice;
SELECT fencing_lease_release(:t6);
RESET ROLE;
DROP ROLE lease_alice;
SELECT fencing_lease_release(:t6);

-- Savepoints: a grant or a renewal rolled back is not seen by the transaction's later writes
-- (the tokens a transaction found live are read again after any subtransaction abort).
BEGIN;
SAVEPOINT s;
SELECT fencing_lease_acquire('rolled_back', '1 hour') AS t7 \gset
SELECT set_config('pg_fencing.token', :'t7', true) IS NOT NULL AS set;
INSERT INTO lease_row VALUES (30, 1);
ROLLBACK TO SAVEPOINT s;
SELECT set_config('pg_fencing.token', :'t7', true) IS NOT NULL AS set;
INSERT INTO lease_row VALUES (31, 1);
ROLLBACK;
SELECT fencing_lease_acquire('renew_rolled_back', '1 second') AS t8 \gset
BEGIN;
SAVEPOINT s;
SELECT fencing_lease_renew(:t8, '1 hour') IS NOT NULL AS renewed;
ROLLBACK TO SAVEPOINT s;
SELECT pg_sleep(1.1);
SELECT set_config('pg_fencing.token', :'t8', true) IS NOT NULL AS set;
INSERT INTO lease_row VALUES (32, 1);
ROLLBACK;
-- A renewal never shortens a lease.
SELECT fencing_lease_acquire('no_shorter', '1 hour') AS t9 \gset
SELECT fencing_lease_renew(:t9, '1 second') > clock_timestamp() + '59 minutes' AS kept;
SELECT fencing_lease_release(:t9);
-- A name over 1024 bytes.
SELECT fencing_lease_acquire(repeat('n', 1025), '1s');
SELECT fencing_lease_release(fencing_lease_acquire(repeat('n', 1024), '1s'));

SELECT fencing_unprotect('lease_res'), fencing_unprotect('lease_row'), fencing_unprotect('lease_part');
DROP TABLE lease_res, lease_row, lease_part;
DROP FUNCTION lease_paths(bigint);
DELETE FROM _pg_fencing.lease;
DROP ROLE lease_other;
