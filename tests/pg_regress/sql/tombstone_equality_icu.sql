-- Per-row mode, tombstones met by keys equal under a nondeterministic (ICU) collation: text that
-- a case-insensitive collation calls equal, and citext under an accent-insensitive one (its
-- primary key compares lower-cased values under the collation, which citext's own = and hash
-- do not) (src/pg/key_identity.rs; docs/design.md, "Tombstone keys"). Skipped where PostgreSQL
-- is built without ICU (tombstone_equality_icu_1.out).
SELECT NOT EXISTS (SELECT 1 FROM pg_collation WHERE collprovider = 'i' AND collname <> 'unicode') AS skip_test \gset
\if :skip_test
\quit
\endif
\set SHOW_CONTEXT never
CREATE EXTENSION IF NOT EXISTS citext;
CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
CREATE COLLATION ai (provider = icu, locale = 'und-u-ks-level1', deterministic = false);

-- a case-insensitive collation
CREATE TABLE jt (id text COLLATE ci PRIMARY KEY);
SELECT fencing_protect('jt');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jt VALUES ('ABC'); DELETE FROM jt; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jt VALUES ('abc'); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jt VALUES ('abd'); ROLLBACK;

-- citext under a nondeterministic collation: the primary key compares lower-cased values under
-- the collation (citext_cmp), which citext's own = and hash do not
CREATE TABLE jca (id citext COLLATE ai PRIMARY KEY);
SELECT fencing_protect('jca');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jca VALUES ('é'); DELETE FROM jca; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jca VALUES ('E'); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jca VALUES ('f'); ROLLBACK;

-- arrays and composites under a nondeterministic collation: text[] hashes by it; citext[] and a
-- composite with a citext field do not (citext's hash ignores the collation), so those keys are
-- compared with every tombstone (and fencing_protect warns when no key column can be hashed)
CREATE TABLE jta (id text[] COLLATE ci PRIMARY KEY);
SELECT fencing_protect('jta');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jta VALUES ('{Job}'); DELETE FROM jta; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jta VALUES ('{JOB}'); ROLLBACK;
CREATE TABLE jcca (id citext[] COLLATE ci PRIMARY KEY);
SELECT fencing_protect('jcca');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jcca VALUES ('{Job}'); DELETE FROM jcca; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jcca VALUES ('{JOB}'); ROLLBACK;
CREATE TYPE jcomp AS (a citext COLLATE ci);
CREATE TABLE jco (id jcomp PRIMARY KEY);
SELECT fencing_protect('jco');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jco VALUES (ROW('ab')); DELETE FROM jco; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jco VALUES (ROW('AB')); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jco VALUES (ROW('ac')); ROLLBACK;

DROP TABLE jt, jca, jta, jcca, jco;
DROP TYPE jcomp;
DROP COLLATION ci;
DROP COLLATION ai;
