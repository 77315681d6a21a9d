-- Per-row mode: a deleted key's tombstone is met by every key the primary key treats as equal,
-- however it prints: numeric 1.0 / 1.00 / 1, float8 -0 / 0, interval '1 day' / '24:00:00',
-- citext, text under a nondeterministic (case-insensitive) collation, keys of several columns;
-- on INSERT, on an UPDATE that changes the key, after TRUNCATE, after ALTER TABLE changes the key's
-- type, and for tombstones without hashes (as a dump made before 0.2.0 restores them)
-- (src/pg/key_identity.rs; docs/design.md, "Tombstone keys").
\set SHOW_CONTEXT never
CREATE EXTENSION IF NOT EXISTS citext;
CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
CREATE FUNCTION tombs(t regclass) RETURNS TABLE (key text, high_water bigint, hashed boolean)
LANGUAGE sql AS $$
    SELECT key, high_water, key_hash IS NOT NULL FROM _pg_fencing.row_tombstone
    WHERE protection_id = (SELECT id FROM _pg_fencing.protected_table WHERE relid = t)
    ORDER BY key COLLATE "C"
$$;

-- numeric
CREATE TABLE jn (id numeric PRIMARY KEY, v int);
SELECT fencing_protect('jn');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jn VALUES (1.0, 0); DELETE FROM jn WHERE id = 1.0; COMMIT;
SELECT * FROM tombs('jn');
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jn VALUES (1.00, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jn VALUES (1, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jn SELECT 1.000, 1; ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15';
COPY jn (id, v) FROM stdin;
1.0000	1
\.
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jn VALUES (1.00, 1) ON CONFLICT (id) DO NOTHING; ROLLBACK;
-- another key is not fenced by it; the key itself is, under its own spelling too
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jn VALUES (1.5, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jn VALUES (1.0, 1); ROLLBACK;
-- the rightful holder (token 20 or more) may re-create it in any spelling
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jn VALUES (1.00, 1); COMMIT;
-- an UPDATE to an equal key is no new key: no tombstone is left for the old spelling
BEGIN; SET LOCAL pg_fencing.token = '20'; UPDATE jn SET id = 1.000 WHERE id = 1; COMMIT;
SELECT * FROM tombs('jn');
-- an UPDATE that moves a row onto a deleted key's equal spelling is refused
BEGIN; SET LOCAL pg_fencing.token = '30'; INSERT INTO jn VALUES (2.0, 0); DELETE FROM jn WHERE id = 2; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '25'; INSERT INTO jn VALUES (7, 0); UPDATE jn SET id = 2.00 WHERE id = 7; ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '30'; INSERT INTO jn VALUES (7, 0); UPDATE jn SET id = 2.00 WHERE id = 7; ROLLBACK;
-- deleted again under another spelling with a higher token: both spellings' tombstones count
BEGIN; SET LOCAL pg_fencing.token = '40'; DELETE FROM jn WHERE id = 1; COMMIT;
SELECT * FROM tombs('jn');
BEGIN; SET LOCAL pg_fencing.token = '35'; INSERT INTO jn VALUES (1.0, 1); ROLLBACK;

-- float8: 0 and -0 are equal
CREATE TABLE jf (id float8 PRIMARY KEY);
SELECT fencing_protect('jf');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jf VALUES ('-0'); DELETE FROM jf; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jf VALUES (0); ROLLBACK;

-- interval: '1 day' = '24:00:00'
CREATE TABLE ji (id interval PRIMARY KEY);
SELECT fencing_protect('ji');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO ji VALUES ('1 day'); DELETE FROM ji; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO ji VALUES ('24 hours'); ROLLBACK;

-- citext
CREATE TABLE jc (id citext PRIMARY KEY);
SELECT fencing_protect('jc');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jc VALUES ('Job-A'); DELETE FROM jc; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jc VALUES ('job-a'); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jc VALUES ('JOB-A'); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jc VALUES ('job-b'); ROLLBACK;

-- a case-insensitive collation
CREATE TABLE jt (id text COLLATE ci PRIMARY KEY);
SELECT fencing_protect('jt');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jt VALUES ('ABC'); DELETE FROM jt; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jt VALUES ('abc'); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jt VALUES ('abd'); ROLLBACK;

-- keys of several columns, one of them numeric; and a partitioned table
CREATE TABLE jm (a int, b numeric, PRIMARY KEY (a, b)) PARTITION BY RANGE (a);
CREATE TABLE jm_1 PARTITION OF jm FOR VALUES FROM (0) TO (100);
SELECT fencing_protect('jm');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jm VALUES (5, 2.50); DELETE FROM jm; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jm VALUES (5, 2.5); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jm_1 VALUES (5, 2.500); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jm VALUES (6, 2.5); ROLLBACK;

-- TRUNCATE leaves tombstones that equal keys meet
CREATE TABLE jr (id numeric PRIMARY KEY);
SELECT fencing_protect('jr');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jr VALUES (3.0); TRUNCATE jr; COMMIT;
SELECT * FROM tombs('jr');
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jr VALUES (3); ROLLBACK;

-- keys printed one way per value keep text identity (no hash)
CREATE TABLE jb (id bigint PRIMARY KEY);
SELECT fencing_protect('jb');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jb VALUES (9); DELETE FROM jb; COMMIT;
SELECT * FROM tombs('jb');

-- ALTER TABLE changes the key's type (the rekey trigger depends on the key columns, so the
-- protection is taken off and put back; the tombstones stay): they are hashed for the new type
CREATE TABLE ja (id int PRIMARY KEY);
SELECT fencing_protect('ja');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO ja VALUES (5); DELETE FROM ja; COMMIT;
SELECT * FROM tombs('ja');
SELECT fencing_unprotect('ja');
ALTER TABLE ja ALTER COLUMN id TYPE numeric;
SELECT * FROM tombs('ja');
SELECT fencing_protect('ja');
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO ja VALUES (5.0); ROLLBACK;

-- tombstones without hashes (a dump made before 0.2.0 restores them so; its primary keys are
-- created after the data): they are still met by their own text, and hashed again by the next DDL
UPDATE _pg_fencing.row_tombstone SET key_hash = NULL
WHERE protection_id = (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'jc'::regclass);
UPDATE _pg_fencing.protected_table SET tombstone_key_signature = NULL WHERE relid = 'jc'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jc VALUES ('Job-A'); ROLLBACK;
ALTER TABLE jc ADD COLUMN note text;
SELECT * FROM tombs('jc');
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jc VALUES ('job-a'); ROLLBACK;

DROP TABLE jn, jf, ji, jc, jt, jm, jr, jb, ja;
DROP FUNCTION tombs(regclass);
DROP COLLATION ci;
