-- Mixing token sources on a per-row table, and the way back (issue 42, item 5): rows and deleted
-- keys written once with a PostgreSQL lease's token (about 8.5e14) lock every etcd-style holder
-- (revisions far below) out of them. fencing_reset with the table's name is refused (42704)
-- instead of silently creating an unrelated resource; fencing_reset_rows lowers the table's row
-- marks, tombstones and floor; after it the etcd holder writes, an older one is still refused.
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate
CREATE TABLE mix_job (id int PRIMARY KEY, state text);
SELECT fencing_protect('mix_job');
BEGIN; SET LOCAL pg_fencing.token = '100'; INSERT INTO mix_job VALUES (1, 'etcd'), (2, 'etcd'), (3, 'etcd'); COMMIT;
SELECT fencing_lease_acquire('mix-lease', '1 hour') AS lt \gset
BEGIN; SELECT set_config('pg_fencing.token', :'lt', true) IS NOT NULL AS set; UPDATE mix_job SET state = 'lease' WHERE id = 1; DELETE FROM mix_job WHERE id = 2; COMMIT;
SELECT fencing_lease_release(:lt);
-- the etcd holder (103) is locked out of row 1 and deleted key 2; row 3 is still its own
BEGIN; SET LOCAL pg_fencing.token = '103'; UPDATE mix_job SET state = 'etcd 103' WHERE id = 1; ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '103'; INSERT INTO mix_job VALUES (2, 'etcd 103'); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '103'; UPDATE mix_job SET state = 'etcd 103' WHERE id = 3; ROLLBACK;
-- a reset by the table's name is refused, naming the per-row way; so is any unused name
\set VERBOSITY default
SELECT fencing_reset('mix_job', 103);
SELECT fencing_reset('no-such-resource', 103);
\set VERBOSITY sqlstate
SELECT count(*) AS resources_created FROM _pg_fencing.resource_high_water WHERE resource IN ('mix_job', 'no-such-resource');
-- only a superuser lowers marks
CREATE ROLE mix_owner;
ALTER TABLE mix_job OWNER TO mix_owner;
SET ROLE mix_owner;
SELECT fencing_reset_rows('mix_job', 103);
RESET ROLE;
SELECT fencing_reset_rows('mix_job', 0);
SELECT fencing_reset_rows('mix_job', 103) AS lowered;
SELECT id, state, fence_token FROM mix_job ORDER BY id;
SELECT resource, new_high_water FROM _pg_fencing.reset_log WHERE resource LIKE 'table %mix_job';
SELECT active FROM fencing_protected_tables WHERE relation = 'mix_job'::regclass;
-- the etcd holder writes again; an older holder (102) stays refused on the row and the key
BEGIN; SET LOCAL pg_fencing.token = '102'; UPDATE mix_job SET state = 'etcd 102' WHERE id = 1; ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '102'; INSERT INTO mix_job VALUES (2, 'etcd 102'); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '103'; UPDATE mix_job SET state = 'etcd 103' WHERE id = 1; INSERT INTO mix_job VALUES (2, 'etcd 103'); COMMIT;
SELECT id, state, fence_token FROM mix_job ORDER BY id;
-- resource mode keeps its own reset
SELECT fencing_reset_rows('fencing_protected_tables', 1);
DROP TABLE mix_job;
DROP ROLE mix_owner;
-- Where a publication carries the tombstone feed (logical replication), the feed holds the
-- table's tombstones and floor too, and protecting the table again takes them up from it:
-- fencing_reset_rows lowers them there as well. (In a database of its own: the feed, once
-- published, is filled with every tombstone of the database.)
CREATE DATABASE fencing_mix_pub;
\c fencing_mix_pub
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate
CREATE EXTENSION pg_fencing;
CREATE TABLE mp (id int PRIMARY KEY, v text);
SELECT fencing_protect('mp');
SET client_min_messages = error;
CREATE PUBLICATION mp_pub FOR TABLE mp;
RESET client_min_messages;
BEGIN; SET LOCAL pg_fencing.token = '100'; INSERT INTO mp VALUES (1, 'a'), (2, 'b'); DELETE FROM mp WHERE id = 2; COMMIT;
SELECT fencing_prune_tombstones('mp', 50, 0);
SELECT fencing_reset_rows('mp', 10) AS lowered;
SELECT key, high_water FROM _pg_fencing.row_tombstone ORDER BY key;
SELECT relation, key, high_water FROM _pg_fencing.tombstone_feed ORDER BY 1, 2, 3;
SELECT tombstone_floor FROM fencing_protected_tables WHERE relation = 'mp'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO mp VALUES (2, 'back'); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '9'; INSERT INTO mp VALUES (3, 'below the floor'); ROLLBACK;
SELECT id, v, fence_token FROM mp ORDER BY id;
DROP PUBLICATION mp_pub;
\c pg_fencing_regress
DROP DATABASE fencing_mix_pub;
