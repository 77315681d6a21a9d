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

DROP TABLE jt, jca;
DROP COLLATION ci;
DROP COLLATION ai;
