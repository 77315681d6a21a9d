-- Per-row mode, bounded tombstones: fencing_prune_tombstones(table, floor) deletes the tombstones
-- at or below floor and records the floor; a key without a tombstone then has the floor as its
-- high-water mark, so a pruned key's stale re-insert is still refused (src/state/tombstones.rs,
-- prune; docs/operations.md, "Tombstone retention").
\set SHOW_CONTEXT never
CREATE TABLE q (id int PRIMARY KEY, v int);
SELECT fencing_protect('q');
-- keys 1..5 deleted with tokens 10..50: tombstones 10, 20, 30, 40, 50
DO $$
BEGIN
    FOR i IN 1..5 LOOP
        PERFORM set_config('pg_fencing.token', (i * 10)::text, true);
        INSERT INTO q VALUES (i, 0);
        DELETE FROM q WHERE id = i;
    END LOOP;
END
$$;
-- row 11 was written with token 10 and is kept
BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO q VALUES (11, 0); COMMIT;
SELECT key, high_water FROM _pg_fencing.row_tombstone
WHERE protection_id = (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'q'::regclass)
ORDER BY high_water;
SELECT tombstones, tombstone_floor FROM fencing_protected_tables WHERE relation = 'q'::regclass;

-- prune at 30: tombstones 10, 20, 30 go, 40 and 50 stay
SELECT fencing_prune_tombstones('q', 30);
SELECT key, high_water FROM _pg_fencing.row_tombstone
WHERE protection_id = (SELECT id FROM _pg_fencing.protected_table WHERE relid = 'q'::regclass)
ORDER BY high_water;
SELECT tombstones, tombstone_floor FROM fencing_protected_tables WHERE relation = 'q'::regclass;

-- a pruned key's stale re-insert is refused (its tombstone said 20, the floor says 30) ...
BEGIN; SET LOCAL pg_fencing.token = '15'; INSERT INTO q VALUES (2, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '29'; INSERT INTO q VALUES (2, 1); ROLLBACK;
-- ... as is a key never seen with a token below the floor, through every insert path
BEGIN; SET LOCAL pg_fencing.token = '29'; INSERT INTO q VALUES (99, 1); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '29'; INSERT INTO q SELECT 98, 1; ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '29';
COPY q (id, v) FROM stdin;
97	1
\.
ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '29'; INSERT INTO q VALUES (96, 1) ON CONFLICT (id) DO NOTHING; ROLLBACK;
SELECT fenced_insert('q', '{"id": 95, "v": 1}', 29);
-- an UPDATE that moves an existing row to a key without a tombstone is an insert of that key:
-- row 11 (token 10) may be updated with 20, but not moved to key 94 with it
BEGIN; SET LOCAL pg_fencing.token = '20'; UPDATE q SET v = 1 WHERE id = 11; ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '20'; UPDATE q SET id = 94 WHERE id = 11; ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '30'; INSERT INTO q VALUES (10, 0); COMMIT;
-- a kept tombstone above the floor still decides for its key
BEGIN; SET LOCAL pg_fencing.token = '45'; INSERT INTO q VALUES (5, 1); ROLLBACK;
-- tokens at or above the floor are accepted (equal tokens, as for any high-water mark)
BEGIN; SET LOCAL pg_fencing.token = '30'; INSERT INTO q VALUES (2, 1), (99, 1); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '50'; INSERT INTO q VALUES (5, 1); COMMIT;
-- rows that exist are fenced by their own token, not by the floor: an UPDATE of row 10 (token
-- 30) with 30 is accepted
BEGIN; SET LOCAL pg_fencing.token = '30'; UPDATE q SET v = 2 WHERE id = 10; COMMIT;
SELECT id, v, fence_token FROM q ORDER BY id;

-- the floor is never lowered: a lower floor prunes nothing more and keeps 30
SELECT fencing_prune_tombstones('q', 5);
SELECT tombstone_floor FROM fencing_protected_tables WHERE relation = 'q'::regclass;
-- max_tombstones bounds one call (a large backlog is pruned in steps, each its own transaction)
DO $$
BEGIN
    FOR i IN 200..209 LOOP
        PERFORM set_config('pg_fencing.token', '60', true);
        INSERT INTO q VALUES (i, 0);
        DELETE FROM q WHERE id = i;
    END LOOP;
END
$$;
SELECT fencing_prune_tombstones('q', 60, 4);
SELECT fencing_prune_tombstones('q', 60, 4);
SELECT fencing_prune_tombstones('q', 60, 4);
SELECT fencing_prune_tombstones('q', 60, 4);
SELECT tombstones, tombstone_floor FROM fencing_protected_tables WHERE relation = 'q'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '59'; INSERT INTO q VALUES (203, 1); ROLLBACK;
-- the transaction's own deletes are pruned like the others, and its own prune counts for its
-- own later writes
BEGIN;
SET LOCAL pg_fencing.token = '70';
DELETE FROM q WHERE id = 99;
SELECT fencing_prune_tombstones('q', 70);
SET LOCAL pg_fencing.token = '69';
INSERT INTO q VALUES (99, 1);
ROLLBACK;
-- the rolled-back prune is gone with its transaction: floor 60 again, key 99's row is back
SELECT tombstone_floor FROM fencing_protected_tables WHERE relation = 'q'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '60'; INSERT INTO q VALUES (300, 1); COMMIT;

-- bad input: documented SQLSTATEs, never XX000
\set VERBOSITY sqlstate
SELECT fencing_prune_tombstones(NULL, 10);
SELECT fencing_prune_tombstones('q', NULL);
SELECT fencing_prune_tombstones('q', 0);
SELECT fencing_prune_tombstones('q', -5);
SELECT fencing_prune_tombstones('q', 10, -1);
CREATE TABLE unprotected (id int PRIMARY KEY);
SELECT fencing_prune_tombstones('unprotected', 10);
CREATE TABLE qres (id int PRIMARY KEY);
SELECT fencing_protect('qres', 'q-resource');
SELECT fencing_prune_tombstones('qres', 10);
-- a partition is not the protected table
CREATE TABLE qp (id int PRIMARY KEY, v int) PARTITION BY RANGE (id);
CREATE TABLE qp1 PARTITION OF qp FOR VALUES FROM (0) TO (100);
SELECT fencing_protect('qp');
SELECT fencing_prune_tombstones('qp1', 10);
-- owner only
CREATE ROLE floor_stranger;
GRANT INSERT, SELECT, DELETE ON q TO floor_stranger;
SET ROLE floor_stranger;
SELECT fencing_prune_tombstones('q', 100);
RESET ROLE;
-- fencing_tombstone_retention (the pruner worker applies it; tests/worker): bad input
SELECT fencing_tombstone_retention(NULL, '1 day');
SELECT fencing_tombstone_retention('q', '0 s');
SELECT fencing_tombstone_retention('q', '-1 day');
SELECT fencing_tombstone_retention('q', '1 month -40 days');
SELECT fencing_tombstone_retention('unprotected', '1 day');
SELECT fencing_tombstone_retention('qres', '1 day');
SELECT fencing_tombstone_retention('qp1', '1 day');
SET ROLE floor_stranger;
SELECT fencing_tombstone_retention('q', '1 day');
RESET ROLE;
-- a retention the pruner could not subtract from the current time
SELECT fencing_tombstone_retention('q', '101 years');
SELECT fencing_tombstone_retention('q', '2562047788 hours');
-- a table that does not exist (any more): a regclass can still name its OID
SELECT fencing_prune_tombstones(4000000000::oid::regclass, 10);
SELECT fencing_tombstone_retention(4000000000::oid::regclass, '1 day');
-- an unprotected table keeps its tombstones and floor, but takes no new floor or retention
CREATE TABLE q2 (id int PRIMARY KEY);
SELECT fencing_protect('q2');
SELECT fencing_unprotect('q2');
SELECT fencing_prune_tombstones('q2', 10);
SELECT fencing_tombstone_retention('q2', '1 day');
DROP TABLE q2;
\set VERBOSITY default
-- set, shown, and turned off
SELECT fencing_tombstone_retention('q', '1 day');
SELECT tombstone_retention FROM fencing_protected_tables WHERE relation = 'q'::regclass;
SELECT fencing_tombstone_retention('q', NULL);
SELECT tombstone_retention FROM fencing_protected_tables WHERE relation = 'q'::regclass;

-- partitioned: the floor holds for keys of every partition, inserted through the root or not
BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO qp VALUES (1, 0); DELETE FROM qp WHERE id = 1; COMMIT;
SELECT fencing_prune_tombstones('qp', 40);
BEGIN; SET LOCAL pg_fencing.token = '39'; INSERT INTO qp VALUES (1, 0); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '39'; INSERT INTO qp1 VALUES (2, 0); ROLLBACK;
BEGIN; SET LOCAL pg_fencing.token = '40'; INSERT INTO qp1 VALUES (1, 0), (2, 0); COMMIT;

-- the floor is kept by fencing_unprotect and a later fencing_protect (like the tombstones)
SELECT fencing_unprotect('q');
SELECT fencing_protect('q');
SELECT tombstone_floor FROM fencing_protected_tables WHERE relation = 'q'::regclass;
BEGIN; SET LOCAL pg_fencing.token = '59'; INSERT INTO q VALUES (400, 1); ROLLBACK;

DROP TABLE q, qres, qp, unprotected;
DROP ROLE floor_stranger;
