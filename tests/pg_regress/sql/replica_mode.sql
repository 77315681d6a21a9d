-- Replica mode (session_replication_role = replica, as logical replication's apply worker runs):
-- the ordinary guard triggers do not fire, the REPLICA trigger zz_pg_fencing_replica does, and it
-- records what is written (marks, tombstones) instead of refusing it. Partitions get it too.
\set SHOW_CONTEXT never
CREATE TABLE rm_jobs (id int PRIMARY KEY, v int);
SELECT fencing_protect('rm_jobs', 'rm');
CREATE TABLE rm_items (id int PRIMARY KEY, v int);
SELECT fencing_protect('rm_items');
CREATE TABLE rm_parts (id int PRIMARY KEY, v int) PARTITION BY RANGE (id);
CREATE TABLE rm_parts_1 PARTITION OF rm_parts FOR VALUES FROM (0) TO (100);
SELECT fencing_protect('rm_parts', 'rm_p');
CREATE TABLE rm_parts_2 PARTITION OF rm_parts FOR VALUES FROM (100) TO (200);
-- the REPLICA trigger on every table and partition, enabled for replica mode only ('R')
SELECT tgrelid::regclass, tgenabled FROM pg_trigger WHERE tgname = 'zz_pg_fencing_replica' AND tgrelid::regclass::text LIKE 'rm\_%' ORDER BY tgrelid::regclass::text;
SELECT fencing_advance('rm', 10);

SET session_replication_role = replica;
-- resource mode: a row arriving with token 12 raises the mark; no token in the session is needed
INSERT INTO rm_jobs (id, v, fence_token) VALUES (1, 1, 12);
SELECT fencing_high_water('rm');
-- a row with a lower token is applied as it is (the publisher admitted it), the mark stays
UPDATE rm_jobs SET v = 2, fence_token = 11 WHERE id = 1;
SELECT fencing_high_water('rm');
-- per-row mode: a deleted key keeps a tombstone with the deleted row's token
INSERT INTO rm_items (id, v, fence_token) VALUES (5, 1, 20);
DELETE FROM rm_items WHERE id = 5;
-- an UPDATE that changes the key leaves a tombstone for the old key
INSERT INTO rm_items (id, v, fence_token) VALUES (6, 1, 30);
UPDATE rm_items SET id = 7 WHERE id = 6;
-- partitions, including one created after fencing_protect
INSERT INTO rm_parts (id, v, fence_token) VALUES (1, 1, 40), (150, 1, 41);
SELECT fencing_high_water('rm_p');
-- the view tells a replica-mode session that writes here are recorded, not refused
SELECT relation, active, inactive_reason FROM fencing_protected_tables WHERE relation = 'rm_jobs'::regclass;
RESET session_replication_role;
SELECT key, high_water FROM _pg_fencing.row_tombstone t JOIN _pg_fencing.protected_table p ON p.id = t.protection_id
WHERE p.relid = 'rm_items'::regclass ORDER BY key;

-- and what was recorded fences ordinary writes
BEGIN; SET LOCAL pg_fencing.token = '11'; UPDATE rm_jobs SET v = 3 WHERE id = 1; COMMIT;
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '19'; INSERT INTO rm_items VALUES (5, 1); COMMIT;
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '29'; INSERT INTO rm_items VALUES (6, 1); COMMIT;
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '40'; UPDATE rm_parts SET v = 2 WHERE id = 150; COMMIT;
\echo :LAST_ERROR_SQLSTATE

-- a REPLICA trigger switched to ordinary firing is put back at once (the DDL event trigger):
-- otherwise replicated changes would not be recorded
ALTER TABLE rm_jobs ENABLE TRIGGER zz_pg_fencing_replica;
SELECT active, inactive_reason FROM fencing_protected_tables WHERE relation = 'rm_jobs'::regclass;
SELECT fencing_protect('rm_jobs', 'rm');
SELECT active FROM fencing_protected_tables WHERE relation = 'rm_jobs'::regclass;

-- pg_fencing's own tables outside a subscription's workers: a superuser's replica-mode session
-- writes them as usual (the merge applies only to rows a subscription applies)
SET session_replication_role = replica;
SELECT fencing_advance('rm', 50);
RESET session_replication_role;
SELECT fencing_high_water('rm');
SELECT fencing_unprotect('rm_jobs');
SELECT count(*) FROM pg_trigger WHERE tgrelid = 'rm_jobs'::regclass AND tgname LIKE 'zz_pg_fencing%';

-- fencing_watch in replica mode still starts the watch at commit (the table's own trigger does
-- not fire there)
SET session_replication_role = replica;
SELECT fencing_watch('rm_w');
RESET session_replication_role;
SELECT resource FROM fencing_watches WHERE resource = 'rm_w';
SELECT fencing_unwatch('rm_w');
-- registrations fencing_watch would refuse are refused by the table too
\set VERBOSITY terse
INSERT INTO _pg_fencing.watch VALUES (repeat('q', 300), 'q/', false);
\echo :LAST_ERROR_SQLSTATE
INSERT INTO _pg_fencing.watch VALUES (E'a\tb', 'q/', false);
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
-- a commit that fails for want of watch slots changes no running watch (its unwatch included)
SELECT fencing_watch('rm_keep');
BEGIN;
SELECT fencing_unwatch('rm_keep');
SELECT count(fencing_watch('rm_many_' || g)) FROM generate_series(1, 64) g;
COMMIT;
\echo :LAST_ERROR_SQLSTATE
SELECT resource FROM fencing_watches WHERE resource LIKE 'rm\_%' ORDER BY 1;
SELECT fencing_unwatch('rm_keep');
-- A data-only restore with --disable-triggers ends each table's load with ENABLE TRIGGER ALL,
-- which makes the ALWAYS trigger of the marks table (pg_fencing_mark_changed, that keeps the
-- mark cache honest) an ordinary one: the DDL event trigger puts it back to ALWAYS, as it puts
-- the REPLICA triggers back (issue 42, item 4). Disabled by hand outside a restore: back too.
ALTER TABLE _pg_fencing.resource_high_water DISABLE TRIGGER ALL;
-- (disabled outside a restore: both put back, the REPLICA one to replica-only firing)
SELECT tgname, tgenabled FROM pg_trigger WHERE tgrelid = '_pg_fencing.resource_high_water'::regclass ORDER BY 1;
ALTER TABLE _pg_fencing.resource_high_water ENABLE TRIGGER ALL;
SELECT tgname, tgenabled FROM pg_trigger WHERE tgrelid = '_pg_fencing.resource_high_water'::regclass ORDER BY 1;
ALTER TABLE _pg_fencing.resource_high_water ENABLE REPLICA TRIGGER pg_fencing_mark_changed;
SELECT tgenabled FROM pg_trigger WHERE tgrelid = '_pg_fencing.resource_high_water'::regclass AND tgname = 'pg_fencing_mark_changed';
ALTER TABLE _pg_fencing.resource_high_water DISABLE TRIGGER pg_fencing_mark_changed;
SELECT tgenabled FROM pg_trigger WHERE tgrelid = '_pg_fencing.resource_high_water'::regclass AND tgname = 'pg_fencing_mark_changed';
