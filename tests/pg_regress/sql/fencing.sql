-- pg_fencing: the rule on plain DML, both modes, marks, views, reset.
-- Every expected error is followed by its SQLSTATE.
\set SHOW_CONTEXT never
CREATE EXTENSION pg_fencing;

-- ===== resource mode =====
CREATE TABLE acct (id int PRIMARY KEY, balance int NOT NULL);
SELECT fencing_protect('acct', 'ledger');
SELECT fencing_protect('acct', 'ledger');  -- idempotent
\d acct
SELECT relation, mode, resource, token_column, active FROM fencing_protected_tables;

-- no token: FT002
INSERT INTO acct VALUES (1, 100);
\echo :LAST_ERROR_SQLSTATE

-- first holder, token 5
BEGIN;
SET LOCAL pg_fencing.token = '5';
INSERT INTO acct VALUES (1, 100), (2, 200);
COMMIT;
SELECT fencing_high_water('ledger');
-- SET LOCAL ended with the transaction
SHOW pg_fencing.token;

-- equal token accepted (one holder writes many times)
BEGIN;
SET LOCAL pg_fencing.token = '5';
UPDATE acct SET balance = balance + 1 WHERE id = 1;
COMMIT;
SELECT * FROM acct ORDER BY id;

-- newer holder (token 7) writes row 1 only
BEGIN;
SET LOCAL pg_fencing.token = '7';
UPDATE acct SET balance = 150 WHERE id = 1;
COMMIT;
SELECT fencing_high_water('ledger');

-- zombie (token 5) writes row 2, which the newer holder never touched: FT001
BEGIN;
SET LOCAL pg_fencing.token = '5';
UPDATE acct SET balance = 999 WHERE id = 2;
\echo :LAST_ERROR_SQLSTATE
-- the transaction is aborted
SELECT 1;
ROLLBACK;
-- row unchanged
SELECT * FROM acct ORDER BY id;
-- zombie inserts and deletes are refused too
BEGIN; SET LOCAL pg_fencing.token = '6'; INSERT INTO acct VALUES (3, 1); ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '6'; DELETE FROM acct WHERE id = 2; ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
-- a rejected statement inside a transaction loses the whole transaction's work
BEGIN;
SET LOCAL pg_fencing.token = '7';
UPDATE acct SET balance = 151 WHERE id = 1;
SET LOCAL pg_fencing.token = '6';
UPDATE acct SET balance = 0 WHERE id = 2;
COMMIT;
SELECT * FROM acct ORDER BY id;

-- fencing_advance fences before any write
SELECT fencing_advance('ledger', 10);
SELECT fencing_high_water('ledger');
BEGIN; SET LOCAL pg_fencing.token = '7'; UPDATE acct SET balance = 0 WHERE id = 1; ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_advance('ledger', 10);  -- equal: fine
SELECT fencing_advance('ledger', 9);   -- a stale holder learns it is stale
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_advance('ledger', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_advance('ledger', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_advance('ledger', -3);
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_advance('', 3);
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_advance('ledger', '9223372036854775808');
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_advance('ledger', '12abc');
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_high_water('nope') IS NULL AS never_seen;

-- TRUNCATE is fenced; the mark survives it
BEGIN; SET LOCAL pg_fencing.token = '9'; TRUNCATE acct; ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
TRUNCATE acct;
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '10'; TRUNCATE acct; COMMIT;
SELECT count(*) FROM acct;
SELECT fencing_high_water('ledger');

-- INSERT ... ON CONFLICT DO NOTHING that writes nothing does not move the mark
BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO acct VALUES (1, 1); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '11'; INSERT INTO acct VALUES (1, 2) ON CONFLICT (id) DO NOTHING; COMMIT;
SELECT fencing_high_water('ledger');
BEGIN; SET LOCAL pg_fencing.token = '11'; INSERT INTO acct VALUES (2, 2) ON CONFLICT (id) DO NOTHING; COMMIT;
SELECT fencing_high_water('ledger');
-- ... and DO UPDATE is fenced like an UPDATE
BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO acct VALUES (1, 3) ON CONFLICT (id) DO UPDATE SET balance = 3; ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- a rolled-back savepoint undoes its raise; the rest of the transaction stays fenced
BEGIN;
SET LOCAL pg_fencing.token = '12';
SAVEPOINT s;
UPDATE acct SET balance = 12 WHERE id = 1;
ROLLBACK TO SAVEPOINT s;
SET LOCAL pg_fencing.token = '11';
UPDATE acct SET balance = 11 WHERE id = 1;
COMMIT;
SELECT id, balance, fence_token FROM acct ORDER BY id;
SELECT fencing_high_water('ledger');

-- ===== per-row mode =====
CREATE TABLE job (id int PRIMARY KEY, state text);
SELECT fencing_protect('job');
BEGIN; SET LOCAL pg_fencing.token = '3'; INSERT INTO job VALUES (1, 'queued'), (2, 'queued'); COMMIT;
-- rows are independent domains: token 8 on row 1 does not fence row 2
BEGIN; SET LOCAL pg_fencing.token = '8'; UPDATE job SET state = 'running' WHERE id = 1; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '4'; UPDATE job SET state = 'running' WHERE id = 2; COMMIT;
-- but row 1 is
BEGIN; SET LOCAL pg_fencing.token = '7'; UPDATE job SET state = 'zombie' WHERE id = 1; ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM job ORDER BY id;
-- delete leaves a tombstone: a stale writer cannot re-create the key
BEGIN; SET LOCAL pg_fencing.token = '9'; DELETE FROM job WHERE id = 1; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '8'; INSERT INTO job VALUES (1, 'zombie'); ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
SELECT relation, tombstones FROM fencing_protected_tables WHERE relation = 'job'::regclass;
-- the holder of a token >= the tombstone may
BEGIN; SET LOCAL pg_fencing.token = '9'; INSERT INTO job VALUES (1, 'again'); COMMIT;
-- changing the key leaves a tombstone for the old key
BEGIN; SET LOCAL pg_fencing.token = '10'; UPDATE job SET id = 3 WHERE id = 2; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO job VALUES (2, 'zombie'); ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
-- TRUNCATE needs a token at least every row's, and leaves tombstones for all rows
BEGIN; SET LOCAL pg_fencing.token = '9'; TRUNCATE job; ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '10'; TRUNCATE job; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '9'; INSERT INTO job VALUES (1, 'zombie'); ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '9'; INSERT INTO job VALUES (3, 'zombie'); ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
BEGIN; SET LOCAL pg_fencing.token = '9'; INSERT INTO job VALUES (4, 'new key'); COMMIT;
SELECT * FROM job ORDER BY id;
-- keys that need quoting
CREATE TABLE "Odd Table" ("Key Part" text, n int, PRIMARY KEY ("Key Part", n));
SELECT fencing_protect('"Odd Table"', NULL, 'Token Col');
BEGIN; SET LOCAL pg_fencing.token = '4'; INSERT INTO "Odd Table" VALUES ('a "b", (c)', 1); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '4'; DELETE FROM "Odd Table"; COMMIT;
SELECT key, high_water FROM _pg_fencing.row_tombstone t JOIN _pg_fencing.protected_table p ON p.id = t.protection_id
WHERE p.relid = '"Odd Table"'::regclass;
SELECT ROW('a "b", (c)'::text, 1)::text AS same_as_row_text;
BEGIN; SET LOCAL pg_fencing.token = '3'; INSERT INTO "Odd Table" VALUES ('a "b", (c)', 1); ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- per-row mode needs a primary key; token column must be bigint
CREATE TABLE nopk (a int);
SELECT fencing_protect('nopk');
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_protect('nopk', 'nopk-resource');
CREATE TABLE badcol (id int PRIMARY KEY, fence_token text);
SELECT fencing_protect('badcol');
\echo :LAST_ERROR_SQLSTATE
SELECT fencing_protect('acct', '');
\echo :LAST_ERROR_SQLSTATE
CREATE VIEW v AS SELECT 1 AS x;
SELECT fencing_protect('v');
\echo :LAST_ERROR_SQLSTATE

-- ===== token GUC =====
SET pg_fencing.token = '12abc';
\echo :LAST_ERROR_SQLSTATE
SET pg_fencing.token = '9223372036854775808';
\echo :LAST_ERROR_SQLSTATE
SET pg_fencing.token = '0';
\echo :LAST_ERROR_SQLSTATE
-- A misspelt setting of ours is an error, not a silent placeholder (MarkGUCPrefixReserved).
SET pg_fencing.tokn = '5';
\echo :LAST_ERROR_SQLSTATE
SET pg_fencing.token = '-5';
\echo :LAST_ERROR_SQLSTATE
SET pg_fencing.token = '1e3';
\echo :LAST_ERROR_SQLSTATE
SET pg_fencing.token = '9223372036854775807';
SHOW pg_fencing.token;
RESET pg_fencing.token;
SHOW pg_fencing.token;

-- ===== switching protection off is refused, and visible where a restore left it =====
ALTER TABLE acct DISABLE TRIGGER zz_pg_fencing_guard;
ALTER TABLE acct ENABLE REPLICA TRIGGER zz_pg_fencing_guard;
SET check_function_bodies = off;  -- as in a restore, the only time a protection's trigger may be disabled
ALTER TABLE acct DISABLE TRIGGER zz_pg_fencing_guard;
RESET check_function_bodies;
SELECT relation, active, inactive_reason FROM fencing_protected_tables WHERE relation = 'acct'::regclass;
ALTER TABLE acct ENABLE TRIGGER zz_pg_fencing_guard;
SET session_replication_role = replica;
SELECT relation, active, inactive_reason FROM fencing_protected_tables WHERE relation = 'acct'::regclass;
RESET session_replication_role;
SELECT relation, active FROM fencing_protected_tables WHERE relation = 'acct'::regclass;

-- ===== partitioned table: partitions present and future =====
CREATE TABLE ev (tenant int, id int, v text, PRIMARY KEY (tenant, id)) PARTITION BY LIST (tenant);
CREATE TABLE ev1 PARTITION OF ev FOR VALUES IN (1);
SELECT fencing_protect('ev', 'events');
CREATE TABLE ev2 PARTITION OF ev FOR VALUES IN (2);
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO ev VALUES (1, 1, 'a'), (2, 1, 'b'); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '19'; INSERT INTO ev2 VALUES (2, 2, 'zombie'); ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM ev ORDER BY tenant, id;

-- ===== views =====
SELECT resource, high_water, tables FROM fencing_resources ORDER BY resource;
SELECT relation, mode, resource, token_column, active FROM fencing_protected_tables ORDER BY relation::text;

-- ===== unprotect keeps the marks =====
SELECT fencing_unprotect('nopk');
INSERT INTO nopk VALUES (1);
SELECT fencing_high_water('ledger');

-- ===== reset: superuser only, logged =====
CREATE ROLE fencing_app LOGIN;
GRANT ALL ON acct TO fencing_app;
SET ROLE fencing_app;
SELECT fencing_reset('ledger', 1);
\echo :LAST_ERROR_SQLSTATE
-- ordinary roles cannot write the marks directly either
UPDATE _pg_fencing.resource_high_water SET high_water = 1;
\echo :LAST_ERROR_SQLSTATE
-- nor unprotect a table they do not own
SELECT fencing_unprotect('acct');
\echo :LAST_ERROR_SQLSTATE
-- but they can write with a current token (the guard writes the marks on their behalf)
BEGIN; SET LOCAL pg_fencing.token = '13'; UPDATE acct SET balance = 13 WHERE id = 1; COMMIT;
RESET ROLE;
SELECT fencing_high_water('ledger');
SELECT fencing_reset('ledger', 2);
SELECT fencing_high_water('ledger');
SELECT reset_by, resource, old_high_water, new_high_water FROM _pg_fencing.reset_log;
SELECT fencing_reset('ledger', 0);
\echo :LAST_ERROR_SQLSTATE
REVOKE ALL ON acct FROM fencing_app;
DROP ROLE fencing_app;

-- ===== dropping a protected table drops its protection =====
SELECT count(*) AS protections, (SELECT count(*) FROM _pg_fencing.row_tombstone) AS tombstones FROM _pg_fencing.protected_table;
DROP TABLE job;
SELECT count(*) AS protections, (SELECT count(*) FROM _pg_fencing.row_tombstone) AS tombstones FROM _pg_fencing.protected_table;
SELECT count(*) AS orphans FROM _pg_fencing.protected_table p WHERE NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = p.relid);
