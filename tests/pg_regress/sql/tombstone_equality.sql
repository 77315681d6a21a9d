-- Per-row mode: a deleted key's tombstone is met by every key the primary key treats as equal,
-- however it prints: numeric 1.0 / 1.00 / 1, float8 -0 / 0, interval '1 day' / '24:00:00',
-- citext, keys of several columns (nondeterministic collations: tombstone_equality_icu);
-- on INSERT, on an UPDATE that changes the key, after TRUNCATE, after ALTER TABLE changes the key's
-- type, and for tombstones without hashes (as a dump made before 0.2.0 restores them)
-- (src/pg/key_identity.rs; docs/design.md, "Tombstone keys").
\set SHOW_CONTEXT never
CREATE EXTENSION IF NOT EXISTS citext;
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

-- keys of several columns, one of them numeric; and a partitioned table
CREATE TABLE jm (a int, b numeric, PRIMARY KEY (a, b)) PARTITION BY RANGE (a);
CREATE TABLE jm_1 PARTITION OF jm FOR VALUES FROM (0) TO (100);
SELECT fencing_protect('jm');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jm VALUES (5, 2.50); DELETE FROM jm; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jm VALUES (5, 2.5); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jm_1 VALUES (5, 2.500); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jm VALUES (6, 2.5); ROLLBACK;

-- a key column without hash support (bit) beside a numeric one: the numeric column is still
-- matched by its equality, the bit column by its own comparison
CREATE TABLE jx (a numeric, b bit(1), PRIMARY KEY (a, b));
SELECT fencing_protect('jx');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jx VALUES (1.0, '1'); DELETE FROM jx; COMMIT;
SELECT * FROM tombs('jx');
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jx VALUES (1.00, '1'); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jx VALUES (1.00, '0'); ROLLBACK;

-- citext under a collation other than the default: citext_cmp lower-cases under the database's
-- default collation and compares under the column's
CREATE TABLE jcc (id citext COLLATE "C" PRIMARY KEY);
SELECT fencing_protect('jcc');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jcc VALUES ('JOB-É'); DELETE FROM jcc; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jcc VALUES ('job-é'); ROLLBACK;

-- the stored text may name another value later: an enum label renamed (and the old label
-- reused), a table renamed; the value's hash still finds the tombstone
CREATE TYPE jstate AS ENUM ('new', 'done');
CREATE TABLE je (id jstate PRIMARY KEY);
SELECT fencing_protect('je');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO je VALUES ('new'); DELETE FROM je; COMMIT;
ALTER TYPE jstate RENAME VALUE 'new' TO 'fresh';
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO je VALUES ('fresh'); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '25'; INSERT INTO je VALUES ('fresh'); ROLLBACK;
ALTER TYPE jstate ADD VALUE 'new';
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO je VALUES ('fresh'); ROLLBACK;
CREATE TABLE jfoo ();
CREATE TABLE jg (id regclass PRIMARY KEY);
SELECT fencing_protect('jg');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jg VALUES ('jfoo'); DELETE FROM jg; COMMIT;
ALTER TABLE jfoo RENAME TO jbar;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jg VALUES ('jbar'); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '25'; INSERT INTO jg VALUES ('jbar'); ROLLBACK;

-- a renamed label's tombstone keeps its hash when another key column's type changes
CREATE TABLE jen (e jstate, n int, PRIMARY KEY (e, n));
SELECT fencing_protect('jen');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jen VALUES ('done', 1); DELETE FROM jen; COMMIT;
ALTER TYPE jstate RENAME VALUE 'done' TO 'closed';
SELECT fencing_unprotect('jen');
ALTER TABLE jen ALTER COLUMN n TYPE bigint;
SELECT fencing_protect('jen');
SELECT * FROM tombs('jen');
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jen VALUES ('closed', 1); ROLLBACK;

-- stored text that no longer parses (a domain's new constraint): the matching hash counts,
-- the rightful holder is accepted and the stale one refused with FT001
CREATE DOMAIN jdn AS numeric;
CREATE TABLE jd (id jdn PRIMARY KEY);
SELECT fencing_protect('jd');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jd VALUES (50.0); DELETE FROM jd; COMMIT;
ALTER DOMAIN jdn ADD CONSTRAINT two_places CHECK (scale(VALUE) >= 2);
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jd VALUES (50.00); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '25'; INSERT INTO jd VALUES (50.00); ROLLBACK;

-- TRUNCATE leaves tombstones that equal keys meet
CREATE TABLE jr (id numeric PRIMARY KEY);
SELECT fencing_protect('jr');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jr VALUES (3.0); TRUNCATE jr; COMMIT;
SELECT * FROM tombs('jr');
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jr VALUES (3); ROLLBACK;

-- TRUNCATE takes the hashes from the rows' values, without parsing each key's text (about half
-- the time for 200,000 numeric keys); they are the hashes the text gives, also for a key of several
-- columns with a domain; values not of the key's types get none from it
CREATE TABLE jr2 (a numeric, b jdn, PRIMARY KEY (a, b));
SELECT fencing_protect('jr2');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jr2 SELECT g / 4.0, g + 0.50 FROM generate_series(1, 50) g; TRUNCATE jr2; COMMIT;
SELECT count(*) AS tombstones, count(*) FILTER (WHERE t.key_hash = _pg_fencing.tombstone_key_hash(t.protection_id, t.key)) AS same_hash
FROM _pg_fencing.row_tombstone t JOIN _pg_fencing.protected_table p ON p.id = t.protection_id WHERE p.relid = 'jr2'::regclass;
SELECT _pg_fencing.tombstone_key_hash_of(p.id, 0.25, 1.50::jdn) = _pg_fencing.tombstone_key_hash(p.id, '(0.25,1.50)') AS by_values,
       _pg_fencing.tombstone_key_hash_of(p.id, '0.25'::text, 1.50::jdn) IS NULL AS other_type,
       _pg_fencing.tombstone_key_hash_of(p.id, 0.25) IS NULL AS too_few
FROM _pg_fencing.protected_table p WHERE p.relid = 'jr2'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jr2 VALUES (0.250, 1.500); ROLLBACK;

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
-- a tombstone the new type's input cannot read (numeric 5.00 for int) keeps its old text, and
-- the change says so (a WARNING; docs/guarantees.md)
CREATE TABLE jw (id numeric PRIMARY KEY);
SELECT fencing_protect('jw');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jw VALUES (5.00), (6); DELETE FROM jw; COMMIT;
SELECT fencing_unprotect('jw');
ALTER TABLE jw ALTER COLUMN id TYPE int;
SELECT fencing_protect('jw');
SELECT * FROM tombs('jw');
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jw VALUES (6); ROLLBACK;
-- and back to a type identified by text: the tombstones get the new type's text
SELECT fencing_unprotect('ja');
ALTER TABLE ja ALTER COLUMN id TYPE bigint;
SELECT fencing_protect('ja');
SELECT * FROM tombs('ja');
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO ja VALUES (5); ROLLBACK;
CREATE TABLE jts (id timestamp PRIMARY KEY);
SELECT fencing_protect('jts');
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO jts VALUES ('2020-01-01'); DELETE FROM jts; COMMIT;
SELECT fencing_unprotect('jts');
SET TimeZone = 'UTC';
ALTER TABLE jts ALTER COLUMN id TYPE timestamptz;
RESET TimeZone;
SELECT fencing_protect('jts');
SELECT * FROM tombs('jts');
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jts VALUES ('2020-01-01 00:00:00+00'); ROLLBACK;

-- tombstones without hashes (a dump made before 0.2.0 restores them so; its primary keys are
-- created after the data): they are still met by their own text, and hashed again by the next DDL
UPDATE _pg_fencing.row_tombstone SET key_hash = NULL
WHERE protection_id = (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'jc'::regclass);
UPDATE _pg_fencing.protected_table SET tombstone_key_signature = NULL WHERE relid = 'jc'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jc VALUES ('Job-A'); ROLLBACK;
ALTER TABLE jc ADD COLUMN note text;
SELECT * FROM tombs('jc');
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO jc VALUES ('job-a'); ROLLBACK;

DROP TABLE jn, jf, ji, jc, jm, jr, jr2, jb, ja, jx, je, jg, jbar, jd, jts, jcc, jen, jw;
DROP TYPE jstate;
DROP DOMAIN jdn;
DROP FUNCTION tombs(regclass);
