-- The set-based shape (docs/design.md, "The set-based shape"): where the server preloads the
-- library, fencing_protect gives a plain table no BEFORE INSERT row trigger, so that COPY keeps
-- its multi-row inserts; INSERT and COPY are checked once per statement by the library's hooks.
-- Every way of writing around the shape is refused or checked.
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate
CREATE TABLE sb_res (id int PRIMARY KEY, v int);
SELECT fencing_protect('sb_res', 'sb');
CREATE TABLE sb_row (id int PRIMARY KEY, v int);
SELECT fencing_protect('sb_row');
SELECT relation, mode, shape, active FROM fencing_protected_tables WHERE relation::text LIKE 'sb\_%' ORDER BY 1;
SELECT _pg_fencing.preloaded();
-- no BEFORE INSERT row trigger: the guard and the replica trigger leave INSERT to the hooks
SELECT tgname, tgtype, tgenabled FROM pg_trigger WHERE tgrelid = 'sb_row'::regclass ORDER BY tgname;
SELECT pg_get_expr(adbin, adrelid) LIKE '_pg_fencing.stamp_default(%' AS stamped_by_default
FROM pg_attrdef WHERE adrelid = 'sb_row'::regclass;

-- Resource mode COPY: the token is admitted once and stamped into every row; the mark is stored
-- once a row was written.
BEGIN; SET LOCAL pg_fencing.token = '10';
COPY sb_res (id, v) FROM stdin;
1	1
2	2
\.
COMMIT;
SELECT id, v, fence_token FROM sb_res ORDER BY id;
SELECT fencing_high_water('sb');
-- stale (FT001), no token (FT002)
BEGIN; SET LOCAL pg_fencing.token = '9';
COPY sb_res (id, v) FROM stdin;
3	3
\.
ROLLBACK;
COPY sb_res (id, v) FROM stdin;
3	3
\.
-- a COPY that writes nothing (its WHERE clause filters every row) moves no mark
BEGIN; SET LOCAL pg_fencing.token = '15';
COPY sb_res (id, v) FROM stdin WHERE id > 100;
3	3
\.
COMMIT;
SELECT fencing_high_water('sb');

-- Per-row mode COPY: keys are noted and checked when the COPY finished.
BEGIN; SET LOCAL pg_fencing.token = '20';
COPY sb_row (id, v) FROM stdin;
1	1
2	2
3	3
\.
COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '30'; DELETE FROM sb_row WHERE id = 2; COMMIT;
-- a stale writer cannot bring back key 2 (its tombstone is 30), in a COPY of several rows
BEGIN; SET LOCAL pg_fencing.token = '25';
COPY sb_row (id, v) FROM stdin;
4	4
2	2
5	5
\.
ROLLBACK;
-- the same writer may write keys without a newer tombstone (each key looked up)
BEGIN; SET LOCAL pg_fencing.token = '25';
COPY sb_row (id, v) FROM stdin;
4	4
5	5
\.
COMMIT;
-- a newer one may write key 2 again (no key looked up: its token is at least every tombstone)
BEGIN; SET LOCAL pg_fencing.token = '31';
COPY sb_row (id, v) FROM stdin WHERE v > 0;
2	2
6	0
\.
COMMIT;
SELECT id, v, fence_token FROM sb_row ORDER BY id;

-- COPY that gives the token column itself: only the writer's token is accepted (22023).
BEGIN; SET LOCAL pg_fencing.token = '40';
COPY sb_row FROM stdin;
7	7	99
\.
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '40';
COPY sb_row (id, v, fence_token) FROM stdin;
7	7	\N
\.
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '40';
COPY sb_row FROM stdin;
7	7	40
\.
COMMIT;

-- INSERT: the planner's fast path stamps the token column, also when the statement names it.
BEGIN; SET LOCAL pg_fencing.token = '41';
INSERT INTO sb_row (id, v, fence_token) VALUES (8, 8, 99);
COMMIT;
SELECT fence_token FROM sb_row WHERE id = 8;
-- The writes the planner does not take (an INSERT in a WITH clause, MERGE): the column default
-- stamps them and the AFTER INSERT trigger checks them; a token the statement gives itself is
-- refused (22023), also a forged higher one, and a stale key is refused (FT001).
BEGIN; SET LOCAL pg_fencing.token = '41'; DELETE FROM sb_row WHERE id = 8; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '40';
WITH w AS (INSERT INTO sb_row VALUES (8, 8) RETURNING id) SELECT count(*) FROM w;
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '40';
WITH w AS (INSERT INTO sb_row VALUES (8, 8, 100) RETURNING id) SELECT count(*) FROM w;
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '40';
MERGE INTO sb_row t USING (VALUES (8, 8)) s(id, v) ON t.id = s.id
WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.v);
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '40';
MERGE INTO sb_row t USING (VALUES (8, 8)) s(id, v) ON t.id = s.id
WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.v, 1000);
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '42';
MERGE INTO sb_row t USING (VALUES (8, 8), (9, 9)) s(id, v) ON t.id = s.id
WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.v);
WITH w AS (INSERT INTO sb_row VALUES (10, 10) RETURNING fence_token) SELECT * FROM w;
COMMIT;
SELECT id, fence_token FROM sb_row WHERE id >= 8 ORDER BY id;
-- resource mode MERGE: stale refused, a newer one stores its mark
BEGIN; SET LOCAL pg_fencing.token = '9';
MERGE INTO sb_res t USING (VALUES (5, 5)) s(id, v) ON t.id = s.id WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.v);
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '16';
MERGE INTO sb_res t USING (VALUES (5, 5)) s(id, v) ON t.id = s.id WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.v);
COMMIT;
SELECT fencing_high_water('sb');

-- A row a COPY's own rows insert (here by a trigger of the user's) is not the COPY's: the AFTER
-- INSERT trigger checks it, so a stale key cannot ride in on an admitted COPY.
BEGIN; SET LOCAL pg_fencing.token = '50'; DELETE FROM sb_row WHERE id = 10; COMMIT;
CREATE TABLE sb_log (id int);
CREATE FUNCTION sb_echo() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO sb_row VALUES (NEW.id + 10, 0) ON CONFLICT DO NOTHING; RETURN NULL; END $$;
CREATE TRIGGER sb_echo AFTER INSERT ON sb_log FOR EACH ROW EXECUTE FUNCTION sb_echo();
BEGIN; SET LOCAL pg_fencing.token = '45';
COPY sb_log FROM stdin;
0
\.
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '50';
COPY sb_log FROM stdin;
0
\.
COMMIT;
SELECT id, fence_token FROM sb_row WHERE id = 10;

-- A cursor opened before a COPY and closed inside it ends an executor the COPY did not see
-- start: the rows of statements run inside the COPY are checked all the same (FT001 here, the
-- key's tombstone is above the token; found by an outside check).
BEGIN; SET LOCAL pg_fencing.token = '60'; INSERT INTO sb_row VALUES (61, 0); DELETE FROM sb_row WHERE id = 61; COMMIT;
CREATE FUNCTION sb_close_c() RETURNS int LANGUAGE plpgsql AS $$
DECLARE cur refcursor := 'c'; BEGIN CLOSE cur; RETURN 61; END $$;
CREATE FUNCTION sb_sneak() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN EXECUTE 'WITH x AS (INSERT INTO sb_row (id, v) SELECT sb_close_c(), 0 RETURNING 1) SELECT 1'; RETURN true; END $$;
BEGIN; SET LOCAL pg_fencing.token = '55';
DECLARE c CURSOR FOR SELECT 1;
COPY sb_row (id, v) FROM stdin WHERE sb_sneak();
62	0
\.
COMMIT;
SELECT id, fence_token FROM sb_row WHERE id IN (61, 62);
DROP FUNCTION sb_sneak(), sb_close_c();
-- A role with INSERT but not SELECT on the table: COPY is not admitted by the hook (its checks
-- read the key and token columns, which needs SELECT) and its rows are checked one by one by
-- the AFTER INSERT trigger instead: it works, and a stale key is refused all the same.
CREATE ROLE sb_writer;
GRANT INSERT ON sb_row TO sb_writer;
SET ROLE sb_writer;
BEGIN; SET LOCAL pg_fencing.token = '55';
COPY sb_row (id, v) FROM stdin;
63	0
\.
COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '55';
COPY sb_row (id, v) FROM stdin;
61	0
\.
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '55';
COPY sb_row FROM stdin;
64	0	99
\.
ROLLBACK;
RESET ROLE;
SELECT id, fence_token FROM sb_row WHERE id IN (61, 63, 64) ORDER BY id;
REVOKE ALL ON sb_row FROM sb_writer;
DROP ROLE sb_writer;

-- Hand-made calls of the shape's functions note, stamp or admit nothing outside an admitted COPY.
SELECT _pg_fencing.copy_key(1), _pg_fencing.copy_token(5), _pg_fencing.insert_check_due(1);
SELECT _pg_fencing.stamp_default();
BEGIN; SET LOCAL pg_fencing.token = '60'; SELECT _pg_fencing.stamp_default(); ROLLBACK;

-- Without a token the default stamps nothing and the write is refused (FT002); a table that
-- copied the default (LIKE … INCLUDING DEFAULTS) is not protected and needs no token.
MERGE INTO sb_row t USING (VALUES (70, 0)) s(id, v) ON t.id = s.id WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.v);
CREATE TABLE sb_copy (LIKE sb_row INCLUDING DEFAULTS);
INSERT INTO sb_copy VALUES (1, 1);
SELECT id, fence_token FROM sb_copy;
DROP TABLE sb_copy;

-- The shape's triggers are made by fencing_protect only: another WHEN clause is refused (55000).
CREATE OR REPLACE TRIGGER zz_pg_fencing_after AFTER INSERT ON sb_row FOR EACH ROW WHEN (false)
EXECUTE FUNCTION fencing_guard('2', '', 'fence_token');
-- A default of the user's on the token column leaves the shape without its stamp: inactive
-- (FT004) until fencing_protect, which then gives it the row-trigger shape.
ALTER TABLE sb_res ALTER COLUMN fence_token SET DEFAULT 999;
SELECT active, inactive_reason FROM fencing_protected_tables WHERE relation = 'sb_res'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '16';
INSERT INTO sb_res VALUES (6, 6);
ROLLBACK;
SELECT fencing_protect('sb_res', 'sb');
SELECT shape, active FROM fencing_protected_tables WHERE relation = 'sb_res'::regclass;
ALTER TABLE sb_res ALTER COLUMN fence_token DROP DEFAULT;
SELECT fencing_protect('sb_res', 'sb');
SELECT shape, active FROM fencing_protected_tables WHERE relation = 'sb_res'::regclass;
-- Another BEFORE INSERT row trigger (it runs after the stamp): the table gets the row-trigger
-- shape at once, whose guard runs after it; dropped, fencing_protect brings the set-based shape.
CREATE FUNCTION sb_meddle() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.fence_token := 1000; RETURN NEW; END $$;
\set VERBOSITY default
CREATE TRIGGER sb_meddle BEFORE INSERT ON sb_res FOR EACH ROW EXECUTE FUNCTION sb_meddle();
\set VERBOSITY sqlstate
SELECT shape, active FROM fencing_protected_tables WHERE relation = 'sb_res'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '16';
COPY sb_res (id, v) FROM stdin;
7	7
\.
COMMIT;
SELECT fence_token FROM sb_res WHERE id = 7;
DROP TRIGGER sb_meddle ON sb_res;
SELECT fencing_protect('sb_res', 'sb');
SELECT shape FROM fencing_protected_tables WHERE relation = 'sb_res'::regclass;
-- pg_fencing.set_based_shape = off chooses the row-trigger shape, and its default goes.
SET pg_fencing.set_based_shape = off;
SELECT fencing_protect('sb_res', 'sb');
RESET pg_fencing.set_based_shape;
SELECT shape, (SELECT count(*) FROM pg_attrdef WHERE adrelid = 'sb_res'::regclass) AS defaults
FROM fencing_protected_tables WHERE relation = 'sb_res'::regclass;
SELECT fencing_protect('sb_res', 'sb');

-- Replica mode (logical replication's apply): rows are recorded, never refused; their tokens
-- raise the resource's mark (the AFTER replica trigger).
SET session_replication_role = replica;
INSERT INTO sb_res (id, v, fence_token) VALUES (20, 0, 70);
COPY sb_res (id, v, fence_token) FROM stdin;
21	0	71
\.
RESET session_replication_role;
SELECT fencing_high_water('sb');

-- An INSERT that gives the token column no value gets its default, _pg_fencing.stamp_default(),
-- when the statement is analysed (not parsed again by the rewriter): every form of INSERT is
-- stamped with the writer's token as the rewriter's default would be; an explicit DEFAULT too.
BEGIN; SET LOCAL pg_fencing.token = '80';
INSERT INTO sb_row (id, v) VALUES (80, 0), (81, 0);
INSERT INTO sb_row (id, v, fence_token) VALUES (82, 0, DEFAULT);
INSERT INTO sb_row (v, id) SELECT 0, 83;
INSERT INTO sb_row VALUES (84);
COMMIT;
SELECT id, v, fence_token FROM sb_row WHERE id BETWEEN 80 AND 84 ORDER BY id;
-- A statement prepared while the default was the shape's is analysed again when the table
-- changes: once the table is unprotected and the column has a default of the user's, the
-- user's default fills it (7), not the shape's old one.
PREPARE sb_ins(int) AS INSERT INTO sb_row (id, v) VALUES ($1, 0);
BEGIN; SET LOCAL pg_fencing.token = '85'; EXECUTE sb_ins(85); COMMIT;

-- fencing_unprotect drops the shape's default with its triggers.
SELECT fencing_unprotect('sb_row');
SELECT count(*) AS defaults FROM pg_attrdef WHERE adrelid = 'sb_row'::regclass;
ALTER TABLE sb_row ALTER COLUMN fence_token SET DEFAULT 7;
EXECUTE sb_ins(86);
SELECT id, fence_token FROM sb_row WHERE id IN (85, 86) ORDER BY id;
DEALLOCATE sb_ins;
DROP TABLE sb_res, sb_row, sb_log;
DROP FUNCTION sb_echo(), sb_meddle();
