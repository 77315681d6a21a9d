-- fenced_update / fenced_insert / fenced_delete: jsonb in and out, and every kind of bad input.
\set SHOW_CONTEXT never
CREATE TABLE item (sku text PRIMARY KEY, qty int NOT NULL, price numeric(10,2), tags text[], seen timestamptz);
SELECT fencing_protect('item', 'warehouse');

SELECT fenced_insert('item', '{"sku": "A-1", "qty": 3, "price": "9.99", "tags": ["x", "y"]}', 100);
-- values are converted by each column's own type; the token was local to the call
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": "4", "seen": "2026-01-02 03:04:05+00"}', 100);
SHOW pg_fencing.token;
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": 5}', 101);
-- stale
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": 0}', 100);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('item', '{"sku": "B-2", "qty": 1}', 99);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_delete('item', '{"sku": "A-1"}', 100);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM item;

-- tokens: NULL, 0, negative, out of range, not an integer
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": 0}', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": 0}', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": 0}', -101);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": 0}', '9223372036854775808');
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": 0}', '12abc');
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('item', '{"sku": "C-3", "qty": 1}', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_delete('item', '{"sku": "A-1"}', 0);
\echo :LAST_ERROR_SQLSTATE

-- unknown columns, the token column, wrong keys, wrong shapes, wrong types
SELECT fenced_update('item', '{"sku": "A-1"}', '{"nope": 1}', 101);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('item', '{"sku": "C-3", "qty": 1, "nope": 2}', 101);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '{"sku": "A-1"}', '{"fence_token": 1}', 101);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '{"qty": 5}', '{"qty": 6}', 101);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '{"sku": "A-1", "qty": 5}', '{"qty": 6}', 101);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '{"sku": null}', '{"qty": 6}', 101);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '{"sku": "ZZZ"}', '{"qty": 6}', 101);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '["A-1"]', '{"qty": 6}', 101);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '{"sku": "A-1"}', '{}', 101);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '{"sku": "A-1"}', '"qty"', 101);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": "many"}', 101);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": null}', 101);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('item', '{"sku": "A-1", "qty": 1}', 101);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('no_such_table', '{"sku": "A-1"}', '{"qty": 6}', 101);
\echo :LAST_ERROR_SQLSTATE
-- nothing of the failed calls was written
SELECT * FROM item;

-- a table without a primary key (resource mode): update/delete need a key, insert does not
CREATE TABLE log (msg text);
SELECT fencing_protect('log', 'logger');
SELECT fenced_update('log', '{"msg": "a"}', '{"msg": "b"}', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_delete('log', '{"msg": "a"}', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('log', '{"msg": "hello"}', 1);

-- an unprotected table
CREATE TABLE plain (id int PRIMARY KEY, v int);
INSERT INTO plain VALUES (1, 1);
SELECT fenced_update('plain', '{"id": 1}', '{"v": 2}', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('plain', '{"id": 2}', 1);
\echo :LAST_ERROR_SQLSTATE

-- protection switched off: fenced writes refuse with FT004
SET check_function_bodies = off;  -- as in a restore, the only time a protection's trigger may be disabled
ALTER TABLE item DISABLE TRIGGER zz_pg_fencing_guard;
RESET check_function_bodies;
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": 7}', 101);
\echo :LAST_ERROR_SQLSTATE
ALTER TABLE item ENABLE TRIGGER zz_pg_fencing_guard;
SET session_replication_role = replica;
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": 7}', 101);
\echo :LAST_ERROR_SQLSTATE
RESET session_replication_role;

-- per-row mode, identifiers that need quoting, delete and tombstone
CREATE TABLE "Task List" ("Task Id" int, "Owner" text, note text, PRIMARY KEY ("Task Id", "Owner"));
SELECT fencing_protect('"Task List"', NULL, 'Fence');
SELECT fenced_insert('"Task List"', '{"Task Id": 1, "Owner": "o''brien", "note": "n"}', 5);
SELECT fenced_update('"Task List"', '{"Owner": "o''brien", "Task Id": 1}', '{"note": "m"}', 6);
SELECT fenced_delete('"Task List"', '{"Task Id": 1, "Owner": "o''brien"}', 6);
SELECT fenced_insert('"Task List"', '{"Task Id": 1, "Owner": "o''brien", "note": "zombie"}', 5);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_insert('"Task List"', '{"Task Id": 1, "Owner": "o''brien", "note": "back"}', 6);
SELECT fenced_delete('"Task List"', '{"Task Id": 2, "Owner": "x"}', 6);
\echo :LAST_ERROR_SQLSTATE

-- statements are prepared once per backend: DDL after a call is seen by the next call
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": 8}', 101) ->> 'qty' AS qty;
SET check_function_bodies = off;  -- as in a restore, the only time a protection's trigger may be disabled
ALTER TABLE item DISABLE TRIGGER zz_pg_fencing_guard;
RESET check_function_bodies;
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": 9}', 101);
\echo :LAST_ERROR_SQLSTATE
ALTER TABLE item ENABLE TRIGGER zz_pg_fencing_guard;
ALTER TABLE item RENAME COLUMN qty TO quantity;
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": 9}', 101);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '{"sku": "A-1"}', '{"quantity": 9}', 101) ->> 'quantity' AS quantity;
ALTER TABLE item RENAME COLUMN quantity TO qty;
-- a renamed table, and a new table under the old name: each call writes the table it names
ALTER TABLE item RENAME TO item_old;
CREATE TABLE item (sku text PRIMARY KEY, qty int NOT NULL);
SELECT fencing_protect('item', 'warehouse2');
SELECT fenced_insert('item', '{"sku": "A-1", "qty": 1}', 7) ->> 'qty' AS new_item_qty;
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": 2}', 7) ->> 'qty' AS new_item_qty;
SELECT fenced_update('item_old', '{"sku": "A-1"}', '{"qty": 10}', 101) ->> 'qty' AS old_item_qty;
SELECT (SELECT qty FROM item WHERE sku = 'A-1') AS item, (SELECT qty FROM item_old WHERE sku = 'A-1') AS item_old;

-- numbers no float can hold, and nested values, are converted by the column type (no crash)
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": 1e400}', 7);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": {"a": [1, 2]}}', 7);
\echo :LAST_ERROR_SQLSTATE
SELECT fenced_update('item', '{"sku": 123456789012345678901234567890}', '{"qty": 3}', 7);
\echo :LAST_ERROR_SQLSTATE

-- errors raised inside the statement keep their SQLSTATE: our FT001, and a user trigger's own
CREATE FUNCTION item_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.qty < 0 THEN RAISE EXCEPTION 'negative quantity' USING ERRCODE = 'P1234'; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER item_check BEFORE UPDATE ON item FOR EACH ROW EXECUTE FUNCTION item_check();
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": -1}', 7);
\echo :LAST_ERROR_SQLSTATE
-- caught inside a function: the token of the failed call does not stay behind
SET pg_fencing.token = '3';
DO $$
BEGIN
    PERFORM fenced_update('item', '{"sku": "A-1"}', '{"qty": 4}', 6);
EXCEPTION WHEN SQLSTATE 'FT001' THEN
    RAISE NOTICE 'caught %: %, token now %', SQLSTATE, SQLERRM, current_setting('pg_fencing.token');
END $$;
BEGIN;
SAVEPOINT s;
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": -1}', 8);
ROLLBACK TO SAVEPOINT s;
SHOW pg_fencing.token;
SELECT fenced_update('item', '{"sku": "A-1"}', '{"qty": 5}', 8) ->> 'qty' AS qty;
COMMIT;
RESET pg_fencing.token;
SELECT fencing_high_water('warehouse2');
-- A key of a type with its own equality (citext): the row is found by that type's `=`, as a
-- plain WHERE clause would find it.
CREATE EXTENSION IF NOT EXISTS citext;
CREATE TABLE ci (id citext PRIMARY KEY, v int);
SELECT fencing_protect('ci');
SELECT fenced_insert('ci', '{"id": "Abc", "v": 1}', 5) ->> 'id' AS inserted;
SELECT fenced_update('ci', '{"id": "abc"}', '{"v": 2}', 5) ->> 'v' AS v;
SELECT fenced_delete('ci', '{"id": "ABC"}', 6) ->> 'id' AS deleted;
DROP TABLE ci;
DROP EXTENSION citext;
