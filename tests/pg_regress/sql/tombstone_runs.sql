-- Per-row mode, tombstone runs (issue 44; src/state/tombstone_runs.rs, docs/design.md
-- "Tombstone runs"): a transaction that deletes at least 64 keys identified by their text with
-- one token leaves one run (a row of _pg_fencing.tombstone_run and its keys in chunks) instead of
-- one row_tombstone row per key. Every reader and lifecycle path honours the run's keys.
\set SHOW_CONTEXT never
\set VERBOSITY terse
CREATE TABLE q (id int PRIMARY KEY, v int);
SELECT fencing_protect('q');
CREATE TEMP VIEW q_runs AS
SELECT r.high_water, r.key_count, (SELECT count(*) FROM _pg_fencing.tombstone_chunk c
                                   WHERE c.protection_id = r.protection_id AND c.run = r.run) AS chunks,
       (SELECT sum(cardinality(c.keys)) FROM _pg_fencing.tombstone_chunk c
        WHERE c.protection_id = r.protection_id AND c.run = r.run) AS chunk_keys
FROM _pg_fencing.tombstone_run r JOIN _pg_fencing.protected_table p ON p.id = r.protection_id
WHERE p.relid = 'q'::regclass ORDER BY r.run;
CREATE TEMP VIEW q_rows AS
SELECT t.key, t.high_water FROM _pg_fencing.row_tombstone t
JOIN _pg_fencing.protected_table p ON p.id = t.protection_id WHERE p.relid = 'q'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '1'; INSERT INTO q SELECT g, 0 FROM generate_series(1, 1000) g; COMMIT;

-- 500 keys deleted with token 5: one run of 500 keys in chunks of at most 64, no rows
BEGIN; SET LOCAL pg_fencing.token = '5'; DELETE FROM q WHERE id <= 500; COMMIT;
SELECT * FROM q_runs;
SELECT count(*) AS rows FROM q_rows;
-- 10 keys (fewer than 64): rows, as before
BEGIN; SET LOCAL pg_fencing.token = '5'; DELETE FROM q WHERE id BETWEEN 501 AND 510; COMMIT;
SELECT count(*) AS rows FROM q_rows;
SELECT tombstones FROM fencing_protected_tables WHERE relation = 'q'::regclass;

-- a stale writer (token 4) re-creating a key of the run is refused on every write path
BEGIN; SET LOCAL pg_fencing.token = '4'; INSERT INTO q VALUES (17, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '4'; INSERT INTO q VALUES (1000 + 1, 1), (499, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '4'; INSERT INTO q SELECT g, 1 FROM generate_series(495, 497) g; ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '4'; INSERT INTO q VALUES (64, 1) ON CONFLICT (id) DO NOTHING; ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '4';
COPY q (id, v) FROM STDIN;
250	1
\.
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '4'; UPDATE q SET id = 300 WHERE id = 900; ROLLBACK;
SELECT fenced_insert('q', '{"id": 128, "v": 1}', 4);
-- ... and so is one re-creating a key of the rows, while keys never deleted pass
BEGIN; SET LOCAL pg_fencing.token = '4'; INSERT INTO q VALUES (505, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '4'; INSERT INTO q VALUES (2000, 1), (2001, 1); ROLLBACK;
-- the holder of token 5 (or a later one) may re-create them
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO q VALUES (17, 1); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '6'; INSERT INTO q SELECT g, 1 FROM generate_series(18, 20) g; COMMIT;

-- a key in two runs has the higher mark: 17..20 and 100 more keys deleted again with token 7
BEGIN; SET LOCAL pg_fencing.token = '7'; INSERT INTO q SELECT g, 0 FROM generate_series(3000, 3099) g;
DELETE FROM q WHERE id BETWEEN 17 AND 20 OR id >= 3000; COMMIT;
SELECT * FROM q_runs;
BEGIN; SET LOCAL pg_fencing.token = '6'; INSERT INTO q VALUES (18, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '6'; INSERT INTO q VALUES (3050, 1); ROLLBACK;
-- (a key only in the first run keeps its mark 5)
BEGIN; SET LOCAL pg_fencing.token = '6'; INSERT INTO q VALUES (21, 1); ROLLBACK;

-- within the deleting transaction: its pending tombstones are written (as a run) before a read
BEGIN; SET LOCAL pg_fencing.token = '8';
DELETE FROM q WHERE id BETWEEN 601 AND 700;
SET LOCAL pg_fencing.token = '7';
INSERT INTO q VALUES (650, 1);
ROLLBACK;
-- a run written inside a subtransaction that rolls back, for deletes made before it: written
-- again at commit (the deletes stand)
BEGIN; SET LOCAL pg_fencing.token = '8';
DELETE FROM q WHERE id BETWEEN 601 AND 700;
SAVEPOINT s;
INSERT INTO q VALUES (5000, 1);
SELECT count(*) AS runs_in_savepoint FROM q_runs;
ROLLBACK TO SAVEPOINT s;
SELECT count(*) AS runs_after_rollback_to FROM q_runs;
COMMIT;
SELECT * FROM q_runs;
BEGIN; SET LOCAL pg_fencing.token = '7'; INSERT INTO q VALUES (650, 1); ROLLBACK;
-- a subtransaction's own deletes and run roll back with it
BEGIN; SET LOCAL pg_fencing.token = '9';
SAVEPOINT s;
DELETE FROM q WHERE id BETWEEN 701 AND 800;
INSERT INTO q VALUES (5001, 1);
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT count(*) AS kept FROM q WHERE id BETWEEN 701 AND 800;
SELECT * FROM q_runs;

-- pruning takes whole runs at or below the floor (and no more than max_tombstones keys)
SELECT fencing_prune_tombstones('q', 5, 100);
SELECT * FROM q_runs;
SELECT fencing_prune_tombstones('q', 5);
SELECT * FROM q_runs;
SELECT count(*) AS rows FROM q_rows;
-- pruned keys stay fenced by the floor
BEGIN; SET LOCAL pg_fencing.token = '4'; INSERT INTO q VALUES (30, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '6'; INSERT INTO q VALUES (3050, 1); ROLLBACK;

-- a change of the key's type (unprotected, altered, protected again: the tombstones are kept)
-- turns runs into rows (their text as the old type printed it), and the keys stay fenced
SELECT fencing_unprotect('q');
ALTER TABLE q ALTER COLUMN id TYPE bigint;
SELECT fencing_protect('q');
SELECT count(*) AS runs FROM q_runs;
SELECT count(*) AS rows, max(high_water) AS highest FROM q_rows;
BEGIN; SET LOCAL pg_fencing.token = '7'; INSERT INTO q VALUES (3050, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '8'; INSERT INTO q VALUES (650, 1); ROLLBACK;
SELECT tombstones FROM fencing_protected_tables WHERE relation = 'q'::regclass;

-- fencing_reset_rows lowers the runs' marks too
BEGIN; SET LOCAL pg_fencing.token = '9'; DELETE FROM q WHERE id BETWEEN 801 AND 900; COMMIT;
SELECT * FROM q_runs;
SELECT fencing_reset_rows('q', 3) > 0 AS lowered;
SELECT count(*) AS runs FROM q_runs;
SELECT max(high_water) AS highest FROM q_rows;
BEGIN; SET LOCAL pg_fencing.token = '3'; INSERT INTO q VALUES (850, 1); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '2'; INSERT INTO q VALUES (851, 1); ROLLBACK;

-- _pg_fencing.expand_tombstone_runs: a run becomes rows, the keys stay fenced
BEGIN; SET LOCAL pg_fencing.token = '10'; DELETE FROM q WHERE id BETWEEN 901 AND 1000; COMMIT;
SELECT _pg_fencing.expand_tombstone_runs(id) FROM _pg_fencing.protected_table WHERE relid = 'q'::regclass;
SELECT count(*) AS runs FROM q_runs;
BEGIN; SET LOCAL pg_fencing.token = '9'; INSERT INTO q VALUES (950, 1); ROLLBACK;

-- negative and extreme integer keys print as int8out prints them (the run's text and a row's)
CREATE TABLE qi (id bigint PRIMARY KEY, v int);
SELECT fencing_protect('qi');
BEGIN; SET LOCAL pg_fencing.token = '1';
INSERT INTO qi SELECT g, 0 FROM generate_series(-40, 40) g;
INSERT INTO qi VALUES (-9223372036854775808, 0), (9223372036854775807, 0), (-1000, 0);
COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '5'; DELETE FROM qi WHERE id <> -1000; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '5'; DELETE FROM qi WHERE id = -1000; COMMIT;
SELECT t.key FROM _pg_fencing.row_tombstone t JOIN _pg_fencing.protected_table p ON p.id = t.protection_id
WHERE p.relid = 'qi'::regclass;
SELECT k FROM _pg_fencing.tombstone_chunk c JOIN _pg_fencing.protected_table p ON p.id = c.protection_id,
     unnest(c.keys) AS k WHERE p.relid = 'qi'::regclass AND k IN ('(-9223372036854775808)', '(9223372036854775807)', '(-7)', '(0)')
ORDER BY 1;
BEGIN; SET LOCAL pg_fencing.token = '4'; INSERT INTO qi VALUES (-9223372036854775808, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '4'; INSERT INTO qi VALUES (9223372036854775807, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '4'; INSERT INTO qi VALUES (-7, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '4'; INSERT INTO qi VALUES (-1000, 1); ROLLBACK;
DROP TABLE qi;

-- only the table's owner may turn its runs into rows (it waits for a merge in progress)
CREATE ROLE runs_stranger;
BEGIN; SET LOCAL pg_fencing.token = '11'; DELETE FROM q WHERE id BETWEEN 701 AND 800; COMMIT;
SET ROLE runs_stranger;
SELECT _pg_fencing.expand_tombstone_runs(id) FROM _pg_fencing.protected_table WHERE relid = 'q'::regclass;
RESET ROLE;
SELECT count(*) AS runs FROM q_runs;
SELECT _pg_fencing.expand_tombstone_runs(id) FROM _pg_fencing.protected_table WHERE relid = 'q'::regclass;
DROP ROLE runs_stranger;

-- keys identified by hash (numeric: 1.0 and 1.00 are one key) stay rows
CREATE TABLE qn (id numeric PRIMARY KEY, v int);
SELECT fencing_protect('qn');
BEGIN; SET LOCAL pg_fencing.token = '1'; INSERT INTO qn SELECT g, 0 FROM generate_series(1, 100) g; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '5'; DELETE FROM qn; COMMIT;
SELECT (SELECT count(*) FROM _pg_fencing.tombstone_run r JOIN _pg_fencing.protected_table p ON p.id = r.protection_id
        WHERE p.relid = 'qn'::regclass) AS runs,
       (SELECT count(*) FROM _pg_fencing.row_tombstone t JOIN _pg_fencing.protected_table p ON p.id = t.protection_id
        WHERE p.relid = 'qn'::regclass) AS rows;
BEGIN; SET LOCAL pg_fencing.token = '4'; INSERT INTO qn VALUES (7.00, 1); ROLLBACK;

-- a protected table attached as a partition: fencing_protect of the root carries its runs
CREATE TABLE part_a (id int PRIMARY KEY, v int);
SELECT fencing_protect('part_a');
BEGIN; SET LOCAL pg_fencing.token = '1'; INSERT INTO part_a SELECT g, 0 FROM generate_series(1, 200) g; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '5'; DELETE FROM part_a WHERE id <= 100; COMMIT;
CREATE TABLE root (id int PRIMARY KEY, v int, fence_token bigint) PARTITION BY RANGE (id);
ALTER TABLE root ATTACH PARTITION part_a FOR VALUES FROM (1) TO (1000);
SELECT fencing_protect('root');
SELECT (SELECT count(*) FROM _pg_fencing.tombstone_run r WHERE r.protection_id NOT IN
           (SELECT p.id FROM _pg_fencing.protected_table p WHERE p.relid::text NOT IN ('q', 'part_a'))) AS runs_left_of_part_a_and_q,
       (SELECT count(*) FROM _pg_fencing.row_tombstone t JOIN _pg_fencing.protected_table p ON p.id = t.protection_id
        WHERE p.relid = 'root'::regclass) AS root_rows;
BEGIN; SET LOCAL pg_fencing.token = '4'; INSERT INTO root VALUES (50, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO root VALUES (50, 1); COMMIT;
-- a root's own bulk delete leaves a run of the root's protection
BEGIN; SET LOCAL pg_fencing.token = '6'; DELETE FROM root WHERE id > 100; COMMIT;
SELECT r.key_count, r.high_water FROM _pg_fencing.tombstone_run r JOIN _pg_fencing.protected_table p ON p.id = r.protection_id
WHERE p.relid = 'root'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO root VALUES (150, 1); ROLLBACK;

-- 8 runs of one size are merged into one, each key keeping its own mark; keys at or below the
-- tombstone floor are left out of the merged run (the floor fences them)
CREATE TABLE m (id int PRIMARY KEY, v int);
SELECT fencing_protect('m');
BEGIN; SET LOCAL pg_fencing.token = '1'; INSERT INTO m SELECT g, 0 FROM generate_series(1, 1000) g; COMMIT;
SELECT fencing_prune_tombstones('m', 1);
DO $$
BEGIN
    FOR i IN 1..7 LOOP
        PERFORM set_config('pg_fencing.token', (i * 10)::text, true);
        DELETE FROM m WHERE id BETWEEN (i - 1) * 100 + 1 AND i * 100;
    END LOOP;
END
$$;
SELECT r.high_water, r.key_count FROM _pg_fencing.tombstone_run r JOIN _pg_fencing.protected_table p ON p.id = r.protection_id
WHERE p.relid = 'm'::regclass ORDER BY r.high_water;
SELECT fencing_prune_tombstones('m', 10, 0);
BEGIN; SET LOCAL pg_fencing.token = '80'; DELETE FROM m WHERE id BETWEEN 701 AND 800; COMMIT;
SELECT r.high_water, r.key_count,
       (SELECT count(*) FROM _pg_fencing.tombstone_chunk c WHERE c.protection_id = r.protection_id AND c.run = r.run AND c.marks IS NOT NULL) AS chunks_with_marks
FROM _pg_fencing.tombstone_run r JOIN _pg_fencing.protected_table p ON p.id = r.protection_id
WHERE p.relid = 'm'::regclass ORDER BY r.high_water;
SELECT tombstones FROM fencing_protected_tables WHERE relation = 'm'::regclass;
-- each key keeps its own mark: key 150 (deleted with 20) refuses 19 and takes 20; key 650
-- (deleted with 70) refuses 69; key 50 (deleted with 10, at the floor) refuses 9 and takes 10
BEGIN; SET LOCAL pg_fencing.token = '19'; INSERT INTO m VALUES (150, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO m VALUES (150, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '69'; INSERT INTO m VALUES (650, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '79'; INSERT INTO m VALUES (750, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '9'; INSERT INTO m VALUES (50, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO m VALUES (50, 1); ROLLBACK;
-- a merged run becomes rows with each key's own mark
SELECT _pg_fencing.expand_tombstone_runs(id) FROM _pg_fencing.protected_table WHERE relid = 'm'::regclass;
SELECT t.high_water, count(*) FROM _pg_fencing.row_tombstone t JOIN _pg_fencing.protected_table p ON p.id = t.protection_id
WHERE p.relid = 'm'::regclass GROUP BY 1 ORDER BY 1;
DROP TABLE m;

-- TRUNCATE leaves its keys as a DELETE does: 64 or more of one token are a run (keys that need
-- quoting in their text included), taken back with a rolled-back savepoint.
CREATE TABLE tr (a text, b int, PRIMARY KEY (a, b));
SELECT fencing_protect('tr');
BEGIN; SET LOCAL pg_fencing.token = '5';
INSERT INTO tr SELECT 'k' || g, g FROM generate_series(1, 150) g;
INSERT INTO tr VALUES ('x y', 1), ('q"uote', 2), ('com,ma', 3), ('(paren)', 4), ('back\slash', 5), ('', 6);
COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '6';
SAVEPOINT s; TRUNCATE tr; ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT count(*) AS rows_left FROM tr;
SELECT count(*) AS runs FROM _pg_fencing.tombstone_run r JOIN _pg_fencing.protected_table p ON p.id = r.protection_id
WHERE p.relid = 'tr'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '7'; TRUNCATE tr; COMMIT;
SELECT r.high_water, r.key_count FROM _pg_fencing.tombstone_run r JOIN _pg_fencing.protected_table p ON p.id = r.protection_id
WHERE p.relid = 'tr'::regclass;
SELECT tombstones FROM fencing_protected_tables WHERE relation = 'tr'::regclass;
-- every key refused below the TRUNCATE's token, accepted at it
CREATE FUNCTION tr_try(k text, n int, t bigint) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  PERFORM set_config('pg_fencing.token', t::text, true);
  INSERT INTO tr VALUES (k, n);
  RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = 'undo';
EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE;
END $$;
SELECT k, tr_try(k, n, 6) AS at_6, tr_try(k, n, 7) AS at_7
FROM (VALUES ('x y', 1), ('q"uote', 2), ('com,ma', 3), ('(paren)', 4), ('back\slash', 5), ('', 6), ('k77', 77)) v(k, n);
SELECT count(*) FILTER (WHERE tr_try('k' || g, g, 6) = 'FT001') AS refused_at_6,
       count(*) FILTER (WHERE tr_try('k' || g, g, 7) = 'P0001') AS accepted_at_7
FROM generate_series(1, 150) g;
DROP FUNCTION tr_try(text, int, bigint);
DROP TABLE tr;

-- a dropped table takes its runs with it
CREATE TEMP TABLE dropped AS SELECT id FROM _pg_fencing.protected_table WHERE relid::text IN ('q', 'root');
SELECT count(*) > 0 AS runs_before FROM _pg_fencing.tombstone_run WHERE protection_id IN (SELECT id FROM dropped);
DROP VIEW q_runs, q_rows;
DROP TABLE q;
DROP TABLE root;
SELECT count(*) AS runs, (SELECT count(*) FROM _pg_fencing.tombstone_chunk WHERE protection_id IN (SELECT id FROM dropped)) AS chunks
FROM _pg_fencing.tombstone_run WHERE protection_id IN (SELECT id FROM dropped);
DROP TABLE qn;
