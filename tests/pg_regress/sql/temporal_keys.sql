-- Temporal primary keys (PostgreSQL 18's WITHOUT OVERLAPS): the key calls overlapping ranges the
-- same key without calling them equal, while a tombstone fences equal keys only, so per-row
-- protection of such a table is refused (42P16; docs/guarantees.md); a key made
-- temporal after fencing_protect makes the protection inactive (FT004). Resource mode holds.
-- On 15 there is no WITHOUT OVERLAPS: the statements fail to parse (temporal_keys_1.out).
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate
CREATE EXTENSION IF NOT EXISTS btree_gist;
CREATE TABLE tk (id int, valid_at int4range, v int, PRIMARY KEY (id, valid_at WITHOUT OVERLAPS));
SELECT fencing_protect('tk');
SELECT count(*) AS protected FROM fencing_protected_tables WHERE relation = 'tk'::regclass;
-- resource mode: the resource's mark fences every write, overlapping or not
SELECT fencing_protect('tk', 'tk-res');
BEGIN; SET LOCAL pg_fencing.token = '100'; INSERT INTO tk VALUES (1, '[1,10)', 1); DELETE FROM tk WHERE id = 1; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '99'; INSERT INTO tk VALUES (1, '[2,5)', 2); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '101'; INSERT INTO tk VALUES (1, '[1,10)', 3); COMMIT;
SELECT id, valid_at, v, fence_token FROM tk;
SELECT fencing_unprotect('tk');
-- a per-row table whose key is made temporal afterwards: writes refused until unprotected
CREATE TABLE tk2 (id int, valid_at int4range NOT NULL, v int, CONSTRAINT tk2_pkey PRIMARY KEY (id, valid_at));
SELECT fencing_protect('tk2');
ALTER TABLE tk2 DROP CONSTRAINT tk2_pkey, ADD CONSTRAINT tk2_pkey PRIMARY KEY (id, valid_at WITHOUT OVERLAPS);
SELECT active, inactive_reason IS NOT NULL AS has_reason FROM fencing_protected_tables WHERE relation = 'tk2'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO tk2 VALUES (1, '[1,10)', 1); ROLLBACK;
DROP TABLE tk, tk2;
