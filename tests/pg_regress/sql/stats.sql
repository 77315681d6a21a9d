-- Accepted/rejected counters and the last rejection (needs shared_preload_libraries = 'pg_fencing';
-- the test runner starts its cluster that way; without it the columns are NULL).
\set SHOW_CONTEXT never
SHOW shared_preload_libraries;
CREATE TABLE st (id int PRIMARY KEY, v int);
SELECT fencing_protect('st', 'stats-res');
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO st VALUES (1, 1), (2, 2); COMMIT;
-- a write that does not happen is not counted
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO st VALUES (1, 9) ON CONFLICT DO NOTHING; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '4'; UPDATE st SET v = 0 WHERE id = 2; ROLLBACK;
SELECT fencing_advance('stats-res', 3);
SELECT resource, high_water, accepted, rejected, last_rejected_token, last_rejection_high_water,
       last_rejection_pid = pg_backend_pid() AS by_me, last_rejection_at > now() - interval '1 hour' AS recent
FROM fencing_resources WHERE resource = 'stats-res';

CREATE TABLE st2 (id int PRIMARY KEY, v int);
SELECT fencing_protect('st2');
BEGIN; SET LOCAL pg_fencing.token = '3'; INSERT INTO st2 VALUES (1, 1), (2, 2); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '4'; UPDATE st2 SET v = 5 WHERE id = 1; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '2'; UPDATE st2 SET v = 0 WHERE id = 1; ROLLBACK;
SELECT relation, accepted, rejected, last_rejected_token, last_rejection_high_water
FROM fencing_protected_tables WHERE relation = 'st2'::regclass;
SELECT kind, accepted, rejected FROM fencing_stats() WHERE kind = 'resource' AND name = 'stats-res';
-- One domain by its full name: the same numbers as the views, with where the last rejection
-- came from (host:port over TCP, [local] over a Unix socket).
SELECT accepted, rejected, last_rejected_token, last_rejection_high_water,
       last_rejection_application_name = current_setting('application_name') AS my_app,
       last_rejection_client_addr ~ '^(127\.0\.0\.1:[0-9]+|\[local\])$' AS client_ok
FROM fencing_domain_stats('resource', 'stats-res');
SELECT count(*) FROM fencing_domain_stats('resource', 'never-counted');
SELECT * FROM fencing_domain_stats('row', 'stats-res');
\echo :LAST_ERROR_SQLSTATE
