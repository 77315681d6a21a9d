-- Per-row mode, an UPDATE that gives a row a new key: the new key is checked against its
-- tombstone once the row is in the unique index, by trigger zz_pg_fencing_rekey. Its cheap form
-- (AFTER UPDATE OF the key columns) fires only for UPDATEs that set a key column; while another
-- BEFORE UPDATE row trigger (one sorting before the guard: one after it is refused) could change
-- the key without setting it, the general form (WHEN the key changed) is installed instead, and the DDL event trigger keeps the form right as triggers
-- come and go (sql/pg_fencing.sql, set_rekey_trigger). Should the cheap form meet such a
-- trigger anyway, UPDATEs are refused (FT004).
\set SHOW_CONTEXT never
CREATE TABLE rk (id int PRIMARY KEY, v int);
SELECT fencing_protect('rk');
SELECT _pg_fencing.rekey_form('rk');
BEGIN; SET LOCAL pg_fencing.token = '10';
INSERT INTO rk VALUES (1, 0), (2, 0), (3, 0);
COMMIT;
-- key 50 keeps a tombstone at 20
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO rk VALUES (50, 0); DELETE FROM rk WHERE id = 50; COMMIT;
-- setting the key to a tombstoned key with a lower token: refused
BEGIN; SET LOCAL pg_fencing.token = '15'; UPDATE rk SET id = 50 WHERE id = 1; ROLLBACK;
-- setting a key column to its own value is no key change
BEGIN; SET LOCAL pg_fencing.token = '15'; UPDATE rk SET id = id, v = 1 WHERE id = 1; COMMIT;
-- and with the tombstone's token it is accepted; the old key keeps a tombstone
BEGIN; SET LOCAL pg_fencing.token = '20'; UPDATE rk SET id = 50 WHERE id = 1; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '19'; INSERT INTO rk VALUES (1, 9); ROLLBACK;

-- A BEFORE UPDATE trigger of the user's that moves keys without the UPDATE setting them: the
-- general form. It must fire before the guard (triggers fire in name order): one that would fire
-- after it could change the row's token or key after the check, and is refused (55000).
CREATE FUNCTION rk_move() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.v = 100 THEN NEW.id := NEW.id + 100; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER zzz_move BEFORE UPDATE ON rk FOR EACH ROW EXECUTE FUNCTION rk_move();
CREATE TRIGGER aa_move BEFORE UPDATE ON rk FOR EACH ROW EXECUTE FUNCTION rk_move();
SELECT _pg_fencing.rekey_form('rk');
-- key 102 keeps a tombstone at 30
BEGIN; SET LOCAL pg_fencing.token = '30'; INSERT INTO rk VALUES (102, 0); DELETE FROM rk WHERE id = 102; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '25'; UPDATE rk SET v = 100 WHERE id = 2; ROLLBACK;
-- with the tombstone's token the move is accepted, and the old key 2 keeps a tombstone
BEGIN; SET LOCAL pg_fencing.token = '30'; UPDATE rk SET v = 100 WHERE id = 2; COMMIT;
SELECT id, v, fence_token FROM rk ORDER BY id;
BEGIN; SET LOCAL pg_fencing.token = '29'; INSERT INTO rk VALUES (2, 0); ROLLBACK;
SELECT fencing_protected_tables.inactive_reason FROM fencing_protected_tables WHERE relation = 'rk'::regclass;
DROP TRIGGER aa_move ON rk;
SELECT _pg_fencing.rekey_form('rk');

-- Without the event trigger (disabled by a superuser), the cheap form meets such a trigger:
-- UPDATEs are refused, and the view says why, until fencing_protect installs the general form.
ALTER EVENT TRIGGER pg_fencing_ddl_end DISABLE;
CREATE TRIGGER ab_move BEFORE UPDATE ON rk FOR EACH ROW EXECUTE FUNCTION rk_move();
SELECT _pg_fencing.rekey_form('rk');
BEGIN; SET LOCAL pg_fencing.token = '40'; UPDATE rk SET v = 7 WHERE id = 3; ROLLBACK;
SELECT fencing_protected_tables.inactive_reason FROM fencing_protected_tables WHERE relation = 'rk'::regclass;
SELECT fencing_protect('rk');
SELECT _pg_fencing.rekey_form('rk');
BEGIN; SET LOCAL pg_fencing.token = '40'; UPDATE rk SET v = 7 WHERE id = 3; COMMIT;
-- A trigger that fires after the guard, created while the event triggers are off: the protection
-- is inactive and every write refused (FT004) while it exists.
ALTER EVENT TRIGGER pg_fencing_trigger_ddl DISABLE;
CREATE TRIGGER zzz_move BEFORE UPDATE ON rk FOR EACH ROW EXECUTE FUNCTION rk_move();
ALTER EVENT TRIGGER pg_fencing_trigger_ddl ENABLE;
BEGIN; SET LOCAL pg_fencing.token = '40'; UPDATE rk SET v = 8 WHERE id = 3; ROLLBACK;
SELECT fencing_protected_tables.inactive_reason FROM fencing_protected_tables WHERE relation = 'rk'::regclass;
DROP TRIGGER zzz_move ON rk;
ALTER EVENT TRIGGER pg_fencing_ddl_end ENABLE;
DROP TRIGGER ab_move ON rk;
SELECT _pg_fencing.rekey_form('rk');

-- Partitions: a partition's own BEFORE UPDATE trigger also calls for the general form, which the
-- partitions' clones of zz_pg_fencing_rekey get too; a partition created later gets the form the
-- tree has.
CREATE TABLE rkp (id int PRIMARY KEY, v int) PARTITION BY RANGE (id);
CREATE TABLE rkp_1 PARTITION OF rkp FOR VALUES FROM (0) TO (1000);
SELECT fencing_protect('rkp');
SELECT tgrelid::regclass, _pg_fencing.rekey_form(tgrelid) FROM pg_trigger
WHERE tgname = 'zz_pg_fencing_rekey' AND tgrelid IN ('rkp'::regclass, 'rkp_1'::regclass) ORDER BY 1;
CREATE TRIGGER aa_move BEFORE UPDATE ON rkp_1 FOR EACH ROW EXECUTE FUNCTION rk_move();
CREATE TABLE rkp_2 PARTITION OF rkp FOR VALUES FROM (1000) TO (2000);
SELECT tgrelid::regclass, _pg_fencing.rekey_form(tgrelid) FROM pg_trigger
WHERE tgname = 'zz_pg_fencing_rekey' AND tgrelid::regclass::text LIKE 'rkp%' ORDER BY 1;
BEGIN; SET LOCAL pg_fencing.token = '50'; INSERT INTO rkp VALUES (105, 0); DELETE FROM rkp WHERE id = 105; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO rkp VALUES (5, 0); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '45'; UPDATE rkp SET v = 100 WHERE id = 5; ROLLBACK;
DROP TRIGGER aa_move ON rkp_1;
SELECT tgrelid::regclass, _pg_fencing.rekey_form(tgrelid) FROM pg_trigger
WHERE tgname = 'zz_pg_fencing_rekey' AND tgrelid::regclass::text LIKE 'rkp%' ORDER BY 1;
BEGIN; SET LOCAL pg_fencing.token = '45'; UPDATE rkp SET id = 105 WHERE id = 5; ROLLBACK;

-- The primary key changed after fencing_protect: the DDL event trigger rebuilds
-- zz_pg_fencing_rekey on the new key's columns (in either form); without it, UPDATEs are refused.
CREATE TABLE rkc (id int PRIMARY KEY, k2 int NOT NULL UNIQUE, v int);
SELECT fencing_protect('rkc');
ALTER TABLE rkc DROP CONSTRAINT rkc_pkey, ADD PRIMARY KEY (k2);
SELECT _pg_fencing.rekey_form('rkc'), _pg_fencing.rekey_matches_key('rkc');
BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO rkc VALUES (1, 1, 0); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '20'; INSERT INTO rkc VALUES (2, 50, 0); DELETE FROM rkc WHERE k2 = 50; COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '15'; UPDATE rkc SET k2 = 50 WHERE k2 = 1; ROLLBACK;
CREATE FUNCTION rkc_move() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.v = 100 THEN NEW.k2 := 50; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER aa_move BEFORE UPDATE ON rkc FOR EACH ROW EXECUTE FUNCTION rkc_move();
ALTER TABLE rkc DROP CONSTRAINT rkc_pkey, ADD PRIMARY KEY (id);
ALTER TABLE rkc DROP CONSTRAINT rkc_pkey, ADD PRIMARY KEY (k2);
SELECT _pg_fencing.rekey_form('rkc'), _pg_fencing.rekey_matches_key('rkc');
BEGIN; SET LOCAL pg_fencing.token = '15'; UPDATE rkc SET v = 100 WHERE k2 = 1; ROLLBACK;
DROP TRIGGER aa_move ON rkc;
ALTER EVENT TRIGGER pg_fencing_ddl_end DISABLE;
ALTER TABLE rkc DROP CONSTRAINT rkc_pkey, ADD PRIMARY KEY (id);
SELECT _pg_fencing.rekey_form('rkc'), _pg_fencing.rekey_matches_key('rkc');
BEGIN; SET LOCAL pg_fencing.token = '15'; UPDATE rkc SET v = 1 WHERE id = 1; ROLLBACK;
SELECT fencing_protected_tables.inactive_reason FROM fencing_protected_tables WHERE relation = 'rkc'::regclass;
ALTER EVENT TRIGGER pg_fencing_ddl_end ENABLE;
SELECT fencing_protect('rkc');
SELECT _pg_fencing.rekey_form('rkc'), _pg_fencing.rekey_matches_key('rkc');
BEGIN; SET LOCAL pg_fencing.token = '15'; UPDATE rkc SET v = 1 WHERE id = 1; COMMIT;
DROP TABLE rk, rkp, rkc;
DROP FUNCTION rk_move();
DROP FUNCTION rkc_move();
