-- pg_fencing 0.1.0 -> 0.2.0
--
-- Released upgrade scripts are never edited (scripts/check-sql-releases.sh checks this); a later
-- change goes into a new script. What 0.2.0 changes in the SQL surface:
--   * fencing_domain_stats(kind, name): one fencing domain's counters and last rejection, looked
--     up by its full name (the views used to join fencing_stats() on names cut to 63 bytes), with
--     the last rejection's application_name and client address;
--   * fencing_resources gains last_rejection_application_name, last_rejection_client_addr;
--   * fencing_protected_tables gains last_rejection_pid, last_rejection_application_name,
--     last_rejection_client_addr;
--   * the sequence of _pg_fencing.protected_table's ids is dumped by pg_dump (before, protecting
--     a table after a restore could reuse an id and fail);
--   * the DDL event trigger adds no statement triggers while check_function_bodies is off (as
--     pg_dump's scripts run), so a restore no longer meets statement triggers it is about to
--     create.
--   * watch registrations are rows of the WAL-logged table _pg_fencing.watch (pg_upgrade,
--     pg_dump/restore, promotion and PITR carry them), applied at commit;
--   * logical replication: every protected table gets the REPLICA trigger zz_pg_fencing_replica
--     (a subscription's changes raise the subscriber's marks and tombstones), pg_fencing's own
--     tables get zz_pg_fencing_replicated (publishing them merges instead of overwriting), and
--     _pg_fencing.tombstone_feed carries tombstones by table name; inactive_reason reports a
--     subscribed table whose marks cannot follow the publisher's.
--   * per-row mode's zz_pg_fencing_rekey is AFTER UPDATE OF the key columns (no WHEN clause to
--     read for every statement) unless another BEFORE UPDATE row trigger could change a key
--     unseen; the DDL event trigger keeps the form right (it also follows CREATE/DROP TRIGGER).
--   * _pg_fencing.resource_high_water gets the ALWAYS trigger pg_fencing_mark_changed: a change
--     of a stored mark takes the resource's exclusive lock and bumps the mark's version in shared
--     memory, so that resource-mode writes need not read an unchanged mark again.
--   * _pg_fencing.row_tombstone.key is COLLATE "C" (byte comparisons: deleting many keys is
--     several times cheaper);
--   * per-row mode's tombstones can be pruned below a floor (fencing_prune_tombstones; the floor is
--     _pg_fencing.protected_table.tombstone_floor, shown in fencing_protected_tables), and pruned
--     automatically for tables with a retention (fencing_tombstone_retention; the pruner worker
--     samples etcd revisions into _pg_fencing.revision_sample);
--   * tombstones are matched by the key's own equality, not only its text: keys whose equal
--     values may print differently get _pg_fencing.row_tombstone.key_hash (computed here for the
--     tombstones of 0.1.0; _pg_fencing.rehash_tombstones), and the DDL event trigger follows
--     ALTER COLLATION too.
-- New columns go at the end so that CREATE OR REPLACE VIEW keeps views that users built on ours.
-- The library of 0.2.0 still serves every C symbol the 0.1.0 SQL names, so the server keeps
-- working between installing the new files and running ALTER EXTENSION pg_fencing UPDATE.

\echo Use "ALTER EXTENSION pg_fencing UPDATE TO '0.2.0'" to load this file. \quit

SELECT pg_catalog.pg_extension_config_dump('_pg_fencing.protected_table_id_seq', '');

-- The new columns of pg_fencing's tables, and the functions the new DDL event trigger below
-- calls, come first: every ALTER TABLE of this script fires that trigger.
-- Tombstone keys are matched byte for byte: no collation in the index comparisons.
ALTER TABLE _pg_fencing.row_tombstone ALTER COLUMN key SET DATA TYPE text COLLATE "C";
ALTER TABLE _pg_fencing.protected_table ADD COLUMN tombstone_floor bigint CHECK (tombstone_floor > 0);
ALTER TABLE _pg_fencing.protected_table ADD COLUMN tombstone_retention interval CHECK (tombstone_retention > '0');
-- Tombstones are matched by the key's own equality: keys whose equal values may print
-- differently get a hash (filled in below, once the functions exist).
ALTER TABLE _pg_fencing.protected_table ADD COLUMN tombstone_key_signature text;
ALTER TABLE _pg_fencing.row_tombstone ADD COLUMN key_hash bigint;
CREATE INDEX row_tombstone_key_hash ON _pg_fencing.row_tombstone (protection_id, key_hash)
    WHERE key_hash IS NOT NULL;
-- The highest tombstone of a protection, read once per fast-path INSERT (sql/pg_fencing.sql).
CREATE INDEX row_tombstone_high_water ON _pg_fencing.row_tombstone (protection_id, high_water);

-- Tombstone runs (per-row mode): the tombstones of a transaction that deleted many keys of one
-- table with one token, written as one run instead of one row per key (src/state/tombstone_runs.rs;
-- docs/design.md, "Tombstone runs"). Only keys identified by their text (src/pg/key_identity.rs)
-- go into runs; a key's mark is the highest of its row_tombstone row and of every run that holds
-- its text. A run is one row of tombstone_run (high_water: the highest mark in it) and its keys
-- in tombstone_chunk by a 64-bit hash of the key's text (FNV-1a, the same on every platform): a
-- chunk holds the run's keys whose hashes have the same leading bits (its bucket; bucket_bits of
-- them, as many as gave the run 32 to 64 keys a chunk when it was written), sorted by hash. bloom: a Bloom filter of the run's key
-- hashes (10 bits a key, 5 hash functions; 64-bit words, least significant byte first), which a
-- backend keeps and reads before the one chunk a lookup reads per run (NULL: none, the chunk is
-- read). 8 runs of about the same size below 32,768 keys are merged into one (marks: each key's
-- own mark; NULL: every key has the run's). Paths that work on tombstones one by one
-- (fencing_protect carrying a partition's, a key form changed, the tombstone feed filled,
-- fencing_reset_rows) first turn a protection's runs into row_tombstone rows
-- (_pg_fencing.expand_tombstone_runs).
CREATE SEQUENCE _pg_fencing.tombstone_run_seq AS bigint MINVALUE 1 NO CYCLE;
CREATE TABLE _pg_fencing.tombstone_run (
    protection_id  bigint NOT NULL,
    run            bigint NOT NULL DEFAULT pg_catalog.nextval('_pg_fencing.tombstone_run_seq'),
    high_water     bigint NOT NULL CHECK (high_water > 0),
    key_count      bigint NOT NULL CHECK (key_count > 0),
    bucket_bits    bigint NOT NULL CHECK (bucket_bits BETWEEN 0 AND 48),
    bloom          bytea,
    PRIMARY KEY (protection_id, run)
);
-- (random bits: stored out of line uncompressed)
ALTER TABLE _pg_fencing.tombstone_run ALTER COLUMN bloom SET STORAGE EXTERNAL;
-- The highest run of a protection (as row_tombstone_high_water: src/state/tombstones.rs,
-- `new_key_threshold`).
CREATE INDEX tombstone_run_high_water ON _pg_fencing.tombstone_run (protection_id, high_water);
CREATE TABLE _pg_fencing.tombstone_chunk (
    protection_id  bigint   NOT NULL,
    run            bigint   NOT NULL,
    bucket         bigint   NOT NULL,
    key_hashes     bigint[] NOT NULL,
    keys           text[]   COLLATE "C" NOT NULL,
    marks          bigint[],
    PRIMARY KEY (protection_id, run, bucket)
);
GRANT SELECT ON _pg_fencing.tombstone_run, _pg_fencing.tombstone_chunk TO PUBLIC;
CREATE FUNCTION _pg_fencing.expand_tombstone_runs(protection bigint) RETURNS bigint
LANGUAGE c VOLATILE STRICT AS 'MODULE_PATHNAME', 'pg_fencing_expand_tombstone_runs';
COMMENT ON FUNCTION _pg_fencing.expand_tombstone_runs(bigint) IS
'Internal: this transaction''s pending tombstones written, then the tombstone runs of per-row protection `protection` turned into row_tombstone rows (the highest mark per key kept); returns how many keys the runs held.';
-- Tombstone keys (src/pg/key_identity.rs): the hash of a key from its text, and what the hashes
-- of a table's tombstones depend on.
CREATE FUNCTION _pg_fencing.tombstone_key_hash(protection_id bigint, key text) RETURNS bigint
LANGUAGE c VOLATILE STRICT AS 'MODULE_PATHNAME', 'pg_fencing_tombstone_key_hash';
COMMENT ON FUNCTION _pg_fencing.tombstone_key_hash(bigint, text) IS
'The key_hash of a tombstone of that per-row protection whose key prints as key (ROW(primary key)::text); NULL for keys identified by their text, an unknown protection, or text that is no key of the table''s key types.';
CREATE FUNCTION _pg_fencing.tombstone_key_hash_of(protection_id bigint, VARIADIC key "any") RETURNS bigint
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'pg_fencing_tombstone_key_hash_of';
COMMENT ON FUNCTION _pg_fencing.tombstone_key_hash_of(bigint, "any") IS
'The key_hash of a tombstone of that per-row protection for the key whose columns have these values (in key order); NULL for keys identified by their text, an unknown protection, a NULL, or values not of the key''s column types. For TRUNCATE, which has the values and need not parse the key''s text.';
CREATE FUNCTION _pg_fencing.tombstone_key_text(protection_id bigint, key text) RETURNS text
LANGUAGE c VOLATILE STRICT AS 'MODULE_PATHNAME', 'pg_fencing_tombstone_key_text';
COMMENT ON FUNCTION _pg_fencing.tombstone_key_text(bigint, text) IS
'A tombstone''s key text printed again as a key of the table''s current key types prints (after a change of the key''s types numeric 5.0 is int 5); NULL for an unknown protection or text that is no key of those types.';
-- (called by pg_fencing's own statements, as the extension owner: not by other roles, which
-- could read the key hashes of tables they may not read)
REVOKE ALL ON FUNCTION _pg_fencing.tombstone_key_hash(bigint, text), _pg_fencing.tombstone_key_hash_of(bigint, "any"),
    _pg_fencing.tombstone_key_text(bigint, text) FROM PUBLIC;
CREATE FUNCTION _pg_fencing.tombstone_key_signature(relation regclass) RETURNS text
LANGUAGE c VOLATILE STRICT AS 'MODULE_PATHNAME', 'pg_fencing_tombstone_key_signature';

-- Per-row mode: bring a table's tombstones up to date (their key text as the key's types print
-- it, their key hashes) when what they depend on changed: the key columns' types or collations (ALTER TABLE), a nondeterministic collation's
-- version (ALTER COLLATION ... REFRESH VERSION after an ICU upgrade), a restore of a dump made
-- before 0.2.0 (its primary keys are created after the data), the upgrade from 0.1.0. Does
-- nothing when the signature is unchanged, so anyone may call it.
CREATE FUNCTION _pg_fencing.rehash_tombstones(protection bigint, relation regclass) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    sig text := _pg_fencing.tombstone_key_signature(relation);
    old_sig text;
    unread bigint := 0;
    r record;
BEGIN
    IF sig IS NULL THEN
        RETURN;
    END IF;
    sig := sig || coalesce((SELECT ' ' || string_agg(c.collname || '=' || coalesce(pg_collation_actual_version(c.oid), ''), ' ' ORDER BY a.attnum)
                            FROM pg_index i
                            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                            JOIN pg_collation c ON c.oid = a.attcollation AND NOT c.collisdeterministic
                            WHERE i.indrelid = relation AND i.indisprimary), '');
    SELECT p.tombstone_key_signature INTO old_sig FROM _pg_fencing.protected_table p
    WHERE p.id = protection AND p.relid = relation AND p.resource IS NULL;
    IF NOT FOUND OR sig IS NOT DISTINCT FROM old_sig THEN
        RETURN;
    END IF;
    -- (runs hold keys by their text as the old key form printed them: rows, recomputed below)
    PERFORM _pg_fencing.expand_tombstone_runs(protection);
    -- After a change of the key's types (not when no signature was recorded: tombstones of
    -- 0.1.0 and of its dumps were printed by the types they have), keys the new types print
    -- otherwise (numeric 5.0 is int 5 now) get the new text; tombstones whose texts become one
    -- keep the highest mark.
    FOR r IN SELECT s.ctid AS c, s.key, s.high_water, _pg_fencing.tombstone_key_text(s.protection_id, s.key) AS new_key
             FROM _pg_fencing.row_tombstone s WHERE s.protection_id = protection AND old_sig IS NOT NULL LOOP
        IF r.new_key IS NULL THEN
            unread := unread + 1;
        END IF;
        CONTINUE WHEN r.new_key IS NULL OR r.new_key = r.key;
        DELETE FROM _pg_fencing.row_tombstone WHERE ctid = r.c;
        INSERT INTO _pg_fencing.row_tombstone AS h (protection_id, key, high_water)
        VALUES (protection, r.new_key, r.high_water)
        ON CONFLICT (protection_id, key) DO UPDATE SET high_water = GREATEST(h.high_water, excluded.high_water);
    END LOOP;
    IF unread > 0 THEN
        RAISE WARNING 'pg_fencing: % tombstones of % could not be read as keys of its new key types; they keep their old text and fence only that spelling', unread, relation
            USING HINT = 'A tombstone''s text is read with the new types'' input functions, not with the cast ALTER TABLE applied (numeric 5.00 is no int).';
    END IF;
    -- Keys identified by hash: a tombstone whose text no longer parses (a renamed enum label
    -- or object) keeps the hash it has, the only thing that still finds it.
    UPDATE _pg_fencing.row_tombstone t SET key_hash = x.h
    FROM (SELECT s.ctid AS c, _pg_fencing.tombstone_key_hash(s.protection_id, s.key) AS h
          FROM _pg_fencing.row_tombstone s WHERE s.protection_id = protection) x
    WHERE t.ctid = x.c AND t.key_hash IS DISTINCT FROM x.h AND (x.h IS NOT NULL OR sig LIKE 'text%');
    UPDATE _pg_fencing.protected_table SET tombstone_key_signature = sig WHERE id = protection;
END
$fn$;


-- Row triggers reach new partitions by themselves; statement triggers do not, so a partition
-- created or attached later gets them here. Not while check_function_bodies is off, as pg_dump's
-- scripts run: a restore brings the statement triggers itself, and adding them here first (an
-- ALTER TABLE of the restore fires this) would make the dump's own CREATE TRIGGER fail. A NOTICE
-- says so (restores run with client_min_messages = warning); fencing_protected_tables shows such
-- a partition as inactive, and fencing_protect on the root adds what is missing.
CREATE OR REPLACE FUNCTION _pg_fencing.on_ddl_end() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    p record;
    part regclass;
    trg record;
    chk record;
    det record;
    carried bigint;
    below boolean;
    restoring boolean := current_setting('check_function_bodies') = 'off';
BEGIN
    -- Firing modes (docs/guarantees.md, "When a protection is not active"). The REPLICA triggers
    -- of pg_fencing (zz_pg_fencing_replica on protected tables, zz_pg_fencing_replicated on its
    -- own tables) fire in replica mode only; ALTER TABLE ... ENABLE TRIGGER ALL (pg_dump
    -- --disable-triggers ends each table's load with it) makes them ordinary: put back at once.
    -- A protection's other triggers disabled or made replica-only would leave the statements only
    -- they guard (TRUNCATE; per-row UPDATE and DELETE) unfenced: refused, except in a restore
    -- (check_function_bodies = off), which disables them around its load and enables them after.
    FOR trg IN SELECT tg.tgrelid::regclass AS rel, tg.tgname, tg.tgenabled, c.relnamespace = '_pg_fencing'::regnamespace AS own
             FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid
             WHERE (tg.tgname IN ('zz_pg_fencing_replica', 'zz_pg_fencing_replicated') AND tg.tgenabled IN ('O', 'A'))
                OR (tg.tgname IN ('zz_pg_fencing_guard', 'zz_pg_fencing_after', 'zz_pg_fencing_rekey',
                                  'zz_pg_fencing_truncate', 'zz_pg_fencing_stmt', 'zz_pg_fencing_replica')
                    AND tg.tgenabled IN ('D', 'R') AND NOT (tg.tgname = 'zz_pg_fencing_replica' AND tg.tgenabled = 'R'))
                -- The marks table's trigger fires ALWAYS (the mark cache trusts it): put back
                -- from ordinary (ENABLE TRIGGER ALL ends a --disable-triggers load), replica-only
                -- or disabled, except while a restore has it disabled around its load.
                OR (tg.tgname = 'pg_fencing_mark_changed' AND c.relnamespace = '_pg_fencing'::regnamespace
                    AND tg.tgenabled <> 'A' AND NOT (restoring AND tg.tgenabled = 'D'))
                -- pg_fencing's own tables' REPLICA trigger disabled outside a restore (a subscriber
                -- would then apply the publisher's rows as they come instead of merging them):
                -- put back too.
                OR (tg.tgname = 'zz_pg_fencing_replicated' AND c.relnamespace = '_pg_fencing'::regnamespace
                    AND tg.tgenabled = 'D' AND NOT restoring)
    LOOP
        IF trg.tgname = 'pg_fencing_mark_changed' THEN
            EXECUTE 'ALTER TABLE _pg_fencing.resource_high_water ENABLE ALWAYS TRIGGER pg_fencing_mark_changed';
        ELSIF trg.tgenabled IN ('O', 'A') OR (trg.own AND trg.tgname = 'zz_pg_fencing_replicated') THEN
            EXECUTE format('ALTER TABLE %s ENABLE REPLICA TRIGGER %I', trg.rel, trg.tgname);
        ELSIF NOT restoring AND NOT trg.own AND trg.rel IN (
                  SELECT pt.relid FROM pg_event_trigger_ddl_commands() d,
                         LATERAL _pg_fencing.tree(d.objid::regclass) pt
                  WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objsubid = 0) THEN
            -- (only the tables this command changed: one a restore left so must not block
            -- every later DDL)
            RAISE EXCEPTION USING ERRCODE = '55000',
                MESSAGE = format('trigger %s of protected table %s cannot be %s', trg.tgname, trg.rel,
                                 CASE trg.tgenabled WHEN 'D' THEN 'disabled' ELSE 'made to fire in replica mode only' END),
                DETAIL = 'Writes that only this trigger fences would no longer be fenced.',
                HINT = format('To stop fencing the table, run SELECT fencing_unprotect(%L).', trg.rel);
        END IF;
    END LOOP;
    -- Schema changes that would lower the fence are refused (outside a restore, which builds the
    -- tables its own way): the token column dropped, renamed, retyped or made generated (its values
    -- are the per-row marks); a per-row table made UNLOGGED (a crash empties it, and its row
    -- tokens with it); inheritance children of a protected plain table (writes through the
    -- parent's name to a child's rows run no trigger of the parent's).
    IF NOT restoring THEN
        FOR chk IN SELECT pt.relid, pt.resource, pt.token_column, c.relpersistence, c.relkind
                   FROM _pg_fencing.protected_table pt JOIN pg_class c ON c.oid = pt.relid
                   WHERE pt.protected AND (
                         pt.relid IN (SELECT tr.relid FROM pg_event_trigger_ddl_commands() d,
                                             LATERAL _pg_fencing.tree(d.objid::regclass) tr
                                      WHERE d.classid = 'pg_catalog.pg_class'::regclass)
                      OR pt.relid IN (SELECT i.inhparent FROM pg_inherits i JOIN pg_event_trigger_ddl_commands() d
                                        ON d.classid = 'pg_catalog.pg_class'::regclass AND i.inhrelid = d.objid))
        LOOP
            IF NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = chk.relid AND a.attname = chk.token_column
                           AND a.attnum > 0 AND NOT a.attisdropped AND a.atttypid = 'int8'::regtype AND a.attgenerated = '') THEN
                RAISE EXCEPTION USING ERRCODE = '55000',
                    MESSAGE = format('the token column %I of protected table %s cannot be dropped, renamed, retyped or made generated', chk.token_column, chk.relid),
                    DETAIL = 'Its values are the fencing tokens of the rows'' last writes: the per-row high-water marks.',
                    HINT = format('To stop fencing the table, run SELECT fencing_unprotect(%L) first.', chk.relid);
            END IF;
            IF chk.resource IS NULL AND EXISTS (SELECT 1 FROM _pg_fencing.tree(chk.relid) tr
                                                JOIN pg_class pc ON pc.oid = tr.relid WHERE pc.relpersistence = 'u') THEN
                RAISE EXCEPTION USING ERRCODE = '55000',
                    MESSAGE = format('per-row protected table %s (or a partition of it) cannot be UNLOGGED', chk.relid),
                    DETAIL = 'A crash empties an unlogged table, and with it the row tokens that fence its keys.',
                    HINT = 'Keep it logged, or protect it in resource mode (its mark is a logged row).';
            END IF;
            IF chk.relkind = 'r' AND EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhparent = chk.relid) THEN
                RAISE EXCEPTION USING ERRCODE = '55000',
                    MESSAGE = format('protected table %s cannot have inheritance children', chk.relid),
                    DETAIL = 'Writes through the parent to rows of its children would not be fenced.',
                    HINT = 'Use declarative partitioning, or protect each table on its own.';
            END IF;
        END LOOP;
    END IF;
    -- Per-row mode: tombstone key hashes follow the key's types and collations (also in a
    -- restore, whose primary keys are created after the data).
    FOR p IN SELECT pt.id, pt.relid FROM _pg_fencing.protected_table pt
             WHERE pt.resource IS NULL AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = pt.relid) LOOP
        PERFORM _pg_fencing.rehash_tombstones(p.id, p.relid);
    END LOOP;
    FOR p IN SELECT pt.id, pt.relid, pt.resource, pt.token_column FROM _pg_fencing.protected_table pt
             JOIN pg_class c ON c.oid = pt.relid WHERE pt.protected AND c.relkind = 'p' LOOP
        FOR part IN SELECT t.relid FROM _pg_fencing.tree(p.relid) t
                    JOIN pg_class c ON c.oid = t.relid
                    WHERE NOT EXISTS (SELECT 1 FROM pg_trigger tg WHERE tg.tgrelid = t.relid
                                      AND tg.tgname = CASE WHEN c.relkind = 'f' AND p.resource IS NOT NULL
                                                           THEN 'zz_pg_fencing_stmt' ELSE 'zz_pg_fencing_truncate' END)
                      AND NOT (c.relkind = 'f' AND p.resource IS NULL) LOOP
            IF restoring THEN
                RAISE NOTICE 'pg_fencing: not adding statement triggers to % while check_function_bodies is off (as in a restore, which brings its own)', part
                    USING HINT = format('If this is not a restore, run SELECT fencing_protect(%L, %L, %L) again.',
                                        p.relid, p.resource, p.token_column);
                CONTINUE;
            END IF;
            -- A partition attached to a per-row protected table brings rows that no insert check
            -- saw: every one must carry a token at least the protection's highest tombstone and
            -- tombstone floor, or a deleted key would come back below its tombstone.
            IF p.resource IS NULL THEN
                carried := greatest((SELECT max(rt.high_water) FROM _pg_fencing.row_tombstone rt WHERE rt.protection_id = p.id),
                                    (SELECT max(tr.high_water) FROM _pg_fencing.tombstone_run tr WHERE tr.protection_id = p.id),
                                    (SELECT pt.tombstone_floor FROM _pg_fencing.protected_table pt WHERE pt.id = p.id));
                IF carried IS NOT NULL THEN
                    EXECUTE format('SELECT EXISTS (SELECT 1 FROM ONLY %s WHERE coalesce(%I, 0) < $1)', part, p.token_column)
                        INTO below USING carried;
                    IF below THEN
                        RAISE EXCEPTION USING ERRCODE = '55000',
                            MESSAGE = format('partition %s has rows with tokens below %s, the highest tombstone or tombstone floor of protected table %s', part, carried, p.relid),
                            DETAIL = 'Attached, they would bring back deleted keys below their tombstones.',
                            HINT = 'Attach it empty and insert its rows with a current token, or set their token column to at least that value before attaching.';
                    END IF;
                END IF;
            END IF;
            -- Never let this block the user's DDL: a partition we cannot guard shows up as
            -- inactive in fencing_protected_tables instead.
            BEGIN
                PERFORM _pg_fencing.add_statement_triggers(part, p.id, p.resource, p.token_column);
            EXCEPTION WHEN OTHERS THEN
                RAISE WARNING 'pg_fencing: could not add statement triggers to %: %', part, SQLERRM;
            END;
        END LOOP;
    END LOOP;
    -- A partition detached from a protected table (ALTER TABLE ... DETACH PARTITION) loses the
    -- row triggers it had as a clone of its parent's, but keeps its own statement triggers: it
    -- stays protected on its own, with the same resource (resource mode) or in per-row mode with
    -- a tombstone floor at the parent protection's highest tombstone, floor and row token, so that
    -- no DDL lowers the fence of its rows (fencing_unprotect it to stop fencing it).
    IF NOT restoring THEN
        FOR det IN SELECT DISTINCT tg.tgrelid::regclass AS rel, pt.id, pt.relid AS root, pt.resource, pt.token_column,
                          pt.tombstone_floor
                   FROM pg_trigger tg
                   JOIN _pg_fencing.protected_table pt
                     ON pt.id::text = split_part(encode(tg.tgargs, 'escape'), '\000', 1)
                   WHERE tg.tgname IN ('zz_pg_fencing_truncate', 'zz_pg_fencing_stmt') AND pt.protected
                     AND tg.tgrelid <> pt.relid
                     AND tg.tgrelid NOT IN (SELECT tr.relid FROM _pg_fencing.tree(pt.relid) tr)
                     AND NOT EXISTS (SELECT 1 FROM _pg_fencing.protected_table o WHERE o.relid = tg.tgrelid)
                     -- (the top of a detached subtree; its partitions go with its protection)
                     AND NOT (SELECT c.relispartition FROM pg_class c WHERE c.oid = tg.tgrelid)
        LOOP
            -- (fencing_protect replaces its statement triggers, whose arguments name the parent's
            -- protection, with its own)
            PERFORM @extschema@.fencing_protect(det.rel, det.resource, det.token_column);
            IF det.resource IS NULL THEN
                EXECUTE format('SELECT max(%I) FROM %s', det.token_column, det.rel) INTO carried;
                -- The parent no longer has these keys: its floor rises to their highest token, or
                -- a later partition for them would admit them again below their marks (as when a
                -- partition is dropped, _pg_fencing.before_drop).
                IF carried IS NOT NULL THEN
                    PERFORM @extschema@.fencing_prune_tombstones(det.root, carried, 0);
                END IF;
                carried := greatest(carried, det.tombstone_floor,
                                    (SELECT max(rt.high_water) FROM _pg_fencing.row_tombstone rt WHERE rt.protection_id = det.id),
                                    (SELECT max(tr.high_water) FROM _pg_fencing.tombstone_run tr WHERE tr.protection_id = det.id));
                IF carried IS NOT NULL THEN
                    PERFORM @extschema@.fencing_prune_tombstones(det.rel, carried, 0);
                END IF;
            END IF;
            RAISE NOTICE 'pg_fencing: % was detached from protected table %; it stays protected on its own', det.rel, det.root
                USING HINT = format('To stop fencing it, run SELECT fencing_unprotect(%L).', det.rel);
        END LOOP;
    END IF;
    -- Per-row mode: the form of zz_pg_fencing_rekey follows the other BEFORE UPDATE row triggers
    -- of the tree, and its columns the primary key (see set_rekey_trigger). A restore brings the
    -- triggers it dumped.
    IF restoring THEN
        RETURN;
    END IF;
    -- A table of the set-based shape that got another BEFORE INSERT row trigger (it would run
    -- after the stamp and could change the row), or in per-row mode a key identified by hash
    -- (which its COPY does not check), gets the row-trigger shape, whose guard runs after it (fencing_protect chooses it for such a table; docs/design.md, "The set-based
    -- shape"). Until then its writes are refused (FT004, _pg_fencing.set_based_problem).
    FOR det IN SELECT pt.relid AS rel, pt.resource, pt.token_column FROM _pg_fencing.protected_table pt
               WHERE pt.protected AND _pg_fencing.table_shape(pt.relid) = 'set-based'
                 AND (EXISTS (SELECT 1 FROM pg_trigger tg WHERE tg.tgrelid = pt.relid AND tg.tgtype::int & 71 = 7
                              AND NOT (tg.tgname LIKE 'zz\_pg\_fencing\_%' AND tg.tgfoid = '@extschema@.fencing_guard()'::regprocedure))
                      OR (pt.resource IS NULL AND _pg_fencing.tombstone_key_signature(pt.relid) ~ '^hash')) LOOP
        BEGIN
            PERFORM @extschema@.fencing_protect(det.rel, det.resource, det.token_column);
            RAISE NOTICE 'pg_fencing: % has another BEFORE INSERT row trigger or a key identified by hash now; it has the row-trigger shape', det.rel;
        EXCEPTION WHEN OTHERS THEN
            RAISE WARNING 'pg_fencing: could not give % the row-trigger shape: %', det.rel, SQLERRM
                USING HINT = format('Run SELECT fencing_protect(%L) again; until then its writes are refused (FT004).', det.rel);
        END;
    END LOOP;
    FOR p IN SELECT pt.id, pt.relid, pt.token_column, _pg_fencing.rekey_form(pt.relid) AS form
             FROM _pg_fencing.protected_table pt
             WHERE pt.protected AND pt.resource IS NULL AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = pt.relid) LOOP
        CONTINUE WHEN p.form IS NULL
            OR ((p.form = 'when') = _pg_fencing.other_before_update_triggers(p.relid)
                AND _pg_fencing.rekey_matches_key(p.relid));
        BEGIN
            PERFORM _pg_fencing.set_rekey_trigger(p.relid, p.id, p.token_column);
        EXCEPTION WHEN OTHERS THEN
            RAISE WARNING 'pg_fencing: could not change trigger zz_pg_fencing_rekey of %: %', p.relid, SQLERRM
                USING HINT = format('Run SELECT fencing_protect(%L) again; until then UPDATEs of it are refused (FT004).', p.relid);
        END;
    END LOOP;
END
$fn$;

CREATE FUNCTION @extschema@.fencing_domain_stats(
	"kind" TEXT,
	"name" TEXT
) RETURNS TABLE (
	"accepted" bigint,
	"rejected" bigint,
	"last_rejection_at" timestamp with time zone,
	"last_rejected_token" bigint,
	"last_rejection_high_water" bigint,
	"last_rejection_pid" INT,
	"last_rejection_application_name" TEXT,
	"last_rejection_client_addr" TEXT
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'fencing_domain_stats_wrapper';

CREATE OR REPLACE VIEW @extschema@.fencing_resources AS
SELECT coalesce(h.resource, p.resource) AS resource,
       h.high_water,
       h.updated_at AS high_water_updated_at,
       p.tables,
       s.accepted,
       s.rejected,
       s.last_rejection_at,
       s.last_rejected_token,
       s.last_rejection_high_water,
       s.last_rejection_pid,
       _pg_fencing.lock_service_problem() AS lock_service_problem,
       s.last_rejection_application_name,
       s.last_rejection_client_addr
FROM _pg_fencing.resource_high_water h
FULL JOIN (SELECT pt.resource, array_agg(pt.relid ORDER BY pt.relid::text) AS tables
           FROM _pg_fencing.protected_table pt
           WHERE pt.protected AND pt.resource IS NOT NULL
           GROUP BY pt.resource) p ON p.resource = h.resource
LEFT JOIN LATERAL @extschema@.fencing_domain_stats('resource', coalesce(h.resource, p.resource)) s ON true;
COMMENT ON VIEW @extschema@.fencing_resources IS
'Every resource with a high-water mark or a protected table: its mark (NULL if never written), the tables it guards, and since server start (only with shared_preload_libraries = pg_fencing, else NULL) the accepted and rejected (FT001) writes and the last rejection (time, token, high-water mark, backend pid, application_name, and client address: NULL unless superuser or member of pg_read_all_stats or of the rejected session''s user); lock_service_problem says why the worker hands out no tokens (etcd''s revisions went backwards), else NULL.';

-- The etcd revision the background worker had seen, sampled by the tombstone pruner
-- (pg_fencing.tombstone_prune_database) every pg_fencing.tombstone_prune_interval: the floor of
-- a table with retention R is the highest revision sampled at least R ago.
CREATE TABLE _pg_fencing.revision_sample (
    sampled_at  timestamptz PRIMARY KEY,
    revision    bigint      NOT NULL CHECK (revision > 0)
);
GRANT SELECT ON _pg_fencing.revision_sample TO PUBLIC;
CREATE FUNCTION @extschema@.fencing_tombstone_retention(relation regclass, retention interval)
RETURNS void
LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fencing_tombstone_retention';
COMMENT ON FUNCTION @extschema@.fencing_tombstone_retention(regclass, interval) IS
'Per-row mode, owner only: the automatic tombstone retention of a table whose tokens are revisions of the etcd cluster the background worker uses (fencing_acquire, etcd''s lock recipe). The pruner worker (pg_fencing.tombstone_prune_database) prunes its tombstones with a floor of the highest etcd revision the worker had seen retention ago, so a lock acquired since then always has a higher token. retention must exceed the longest time any holder keeps its lock (a holder still writing after it is refused for new keys, FT001). NULL: off. Errors: 42501 not the owner; FT004 not a protected table; 22023 resource mode, retention not positive or over 100 years; 22004 NULL relation; FT004 also for a table that no longer exists or is not protected.';
CREATE FUNCTION @extschema@.fencing_prune_tombstones(relation regclass, floor bigint, max_tombstones bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fencing_prune_tombstones';
COMMENT ON FUNCTION @extschema@.fencing_prune_tombstones(regclass, bigint, bigint) IS
'Per-row mode, owner only: raises the table''s tombstone floor to floor (a fencing token; never lowered) and deletes its tombstones whose high-water mark is at or below the floor, at most max_tombstones of them (NULL: all); returns how many were deleted. From then on a write that gives a row a key without a tombstone needs a token of at least the floor (FT001 otherwise), so a pruned key stays fenced. Safe only with a global token source whose holders that acquire later get higher tokens (etcd revisions, ZooKeeper zxids): a holder whose token is below the floor can no longer insert new keys (docs/operations.md, "Tombstone retention"). Waits for the table''s in-flight writes (SHARE lock on the table and its partitions until commit). Errors: 42501 not the owner; FT004 not a protected table; 22023 resource mode, floor <= 0 or max_tombstones < 0; 22004 NULL relation or floor.';

-- The set-based shape (docs/design.md, "The set-based shape"; src/guard/copy_from.rs).
CREATE FUNCTION _pg_fencing.stamp_default() RETURNS bigint
LANGUAGE c STABLE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'pg_fencing_stamp_default';
COMMENT ON FUNCTION _pg_fencing.stamp_default() IS
'Internal (the token column''s default on a table of the set-based shape; no arguments, so that every INSERT that fills in defaults reads a short expression): the fencing token of the COPY that pg_fencing admitted and is running; in replica mode NULL; else the session''s pg_fencing.token (NULL without one), for writes that no hook of pg_fencing stamps (a MERGE''s INSERT, an INSERT in a WITH clause or a rule), whose rows the table''s AFTER INSERT trigger checks (FT002 there for NULL without a token). STABLE, so that COPY keeps its multi-row inserts. Errors: FT003 the token''s lock or lease was lost.';
CREATE FUNCTION _pg_fencing.insert_check_due(protection bigint) RETURNS boolean
LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'pg_fencing_insert_check_due';
COMMENT ON FUNCTION _pg_fencing.insert_check_due(bigint) IS
'Internal (the WHEN clause of zz_pg_fencing_after on a table of the set-based shape): false only for the rows of the COPY that pg_fencing admitted into the table of protection, whose keys and mark it checks when the COPY finished; true for every other inserted row. Raises nothing.';
CREATE FUNCTION _pg_fencing.copy_key(VARIADIC key "any") RETURNS boolean
LANGUAGE c STABLE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'pg_fencing_copy_key';
COMMENT ON FUNCTION _pg_fencing.copy_key("any") IS
'Internal (added to the WHERE clause of a COPY into a per-row table of the set-based shape; key: the row''s primary key columns in key order): notes the key, which is checked against its tombstone when the COPY finished (FT001 then). Always true; a call outside such a COPY notes nothing.';
CREATE FUNCTION _pg_fencing.copy_token(value bigint) RETURNS boolean
LANGUAGE c STABLE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'pg_fencing_copy_token';
COMMENT ON FUNCTION _pg_fencing.copy_token(bigint) IS
'Internal (added to the WHERE clause of a COPY that gives the token column of a table of the set-based shape values itself): true if value is the writer''s fencing token; 22023 otherwise (pg_fencing cannot overwrite what COPY gives). True outside such a COPY.';
CREATE FUNCTION _pg_fencing.preloaded() RETURNS boolean
LANGUAGE c STABLE PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_fencing_preloaded';
COMMENT ON FUNCTION _pg_fencing.preloaded() IS
'Was the library preloaded into this backend (shared_preload_libraries = ''pg_fencing'')? The set-based shape needs it in every backend that writes its tables.';
-- The shape of a protected table, as its guard row trigger says: ''set-based'' without a BEFORE
-- INSERT row trigger, ''row-trigger'' with one; ''citus'' for a Citus table's marker constraint
-- (_pg_fencing.protect_citus); NULL without either.
CREATE FUNCTION _pg_fencing.table_shape(relation regclass) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT COALESCE(
        (SELECT CASE WHEN tg.tgtype::int & 4 = 0 THEN 'set-based' ELSE 'row-trigger' END
         FROM pg_catalog.pg_trigger tg
         WHERE tg.tgrelid OPERATOR(pg_catalog.=) relation AND tg.tgname OPERATOR(pg_catalog.=) 'zz_pg_fencing_guard'),
        (SELECT 'citus' FROM pg_catalog.pg_constraint c
         WHERE c.conrelid OPERATOR(pg_catalog.=) relation AND c.conname LIKE 'zz\_pg\_fencing\_citus\_%' LIMIT 1))
$fn$;
-- Why a table of the set-based shape cannot be fenced by it in this backend (NULL: it can).
CREATE FUNCTION _pg_fencing.set_based_problem(relation regclass, pid bigint, resource text, token_column name) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    trig text;
BEGIN
    IF NOT _pg_fencing.preloaded() THEN
        RETURN format('%s has the set-based shape, which needs pg_fencing in shared_preload_libraries, and this backend did not preload it; preload it, or run fencing_protect on the table again in such a backend to give it the row-trigger shape, which needs no preloading', relation);
    END IF;
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = relation) <> 'r' THEN
        RETURN format('%s has the set-based shape, which only plain tables can have; run fencing_protect again', relation);
    END IF;
    IF (SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
        WHERE d.adrelid = relation AND a.attname = token_column) IS DISTINCT FROM '_pg_fencing.stamp_default()' THEN
        RETURN format('the default of token column %I of %s is not pg_fencing''s stamp (_pg_fencing.stamp_default()), which the set-based shape needs; run fencing_protect again', token_column, relation);
    END IF;
    IF (SELECT substring(pg_get_triggerdef(tg.oid) FROM ' WHEN \((.*)\) EXECUTE ') FROM pg_trigger tg
        WHERE tg.tgrelid = relation AND tg.tgname = 'zz_pg_fencing_after') IS DISTINCT FROM format('_pg_fencing.insert_check_due(%L::bigint)', pid) THEN
        RETURN format('trigger zz_pg_fencing_after of %s does not have the WHEN clause of the set-based shape; run fencing_protect again', relation);
    END IF;
    SELECT tg.tgname INTO trig FROM pg_trigger tg
    WHERE tg.tgrelid = relation AND tg.tgtype::int & 71 = 7 AND tg.tgenabled <> 'D'
      AND NOT (tg.tgname LIKE 'zz\_pg\_fencing\_%' AND tg.tgfoid = '@extschema@.fencing_guard()'::regprocedure)
    ORDER BY tg.tgname LIMIT 1;
    IF FOUND THEN
        RETURN format('BEFORE INSERT row trigger %s on %s runs after the set-based shape stamps a row and could change it; run fencing_protect again (it gives such a table the row-trigger shape)', trig, relation);
    END IF;
    IF resource IS NULL AND _pg_fencing.tombstone_key_signature(relation) ~ '^hash' THEN
        RETURN format('the primary key of %s is identified by hash (its equal values may print differently), which the set-based shape''s COPY does not check; run fencing_protect again (it gives such a table the row-trigger shape)', relation);
    END IF;
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE VIEW @extschema@.fencing_protected_tables AS
SELECT p.relid AS relation,
       CASE WHEN p.resource IS NULL THEN 'per-row' ELSE 'resource' END AS mode,
       p.resource,
       p.token_column,
       _pg_fencing.inactive_reason(p.relid, p.resource) IS NULL AS active,
       _pg_fencing.inactive_reason(p.relid, p.resource) AS inactive_reason,
       (SELECT count(*) FROM _pg_fencing.row_tombstone t WHERE t.protection_id = p.id)
       + (SELECT coalesce(sum(tr.key_count), 0)::bigint FROM _pg_fencing.tombstone_run tr WHERE tr.protection_id = p.id) AS tombstones,
       s.accepted,
       s.rejected,
       s.last_rejection_at,
       s.last_rejected_token,
       s.last_rejection_high_water,
       p.protected_at,
       s.last_rejection_pid,
       s.last_rejection_application_name,
       s.last_rejection_client_addr,
       p.tombstone_floor,
       p.tombstone_retention,
       _pg_fencing.table_shape(p.relid) AS shape
FROM _pg_fencing.protected_table p
LEFT JOIN LATERAL @extschema@.fencing_domain_stats('table', p.id::text) s ON true
WHERE p.protected;
COMMENT ON VIEW @extschema@.fencing_protected_tables IS
'Tables under fencing, their mode, whether the protection is actually active right now (inactive_reason says why not), and for per-row tables the accepted and rejected row writes and the last rejection (time, token, high-water mark, backend pid, application_name, client address as in fencing_resources) since server start (with shared_preload_libraries = pg_fencing; resource-mode counts are in fencing_resources); tombstone_floor: per-row mode, the floor set by fencing_prune_tombstones (NULL: none); tombstone_retention: the retention of fencing_tombstone_retention (NULL: off); shape: ''set-based'' (no BEFORE INSERT row trigger: COPY keeps its multi-row inserts; needs shared_preload_libraries = pg_fencing, else writes are refused with FT004) or ''row-trigger'' (docs/design.md, "The set-based shape").';

COMMENT ON FUNCTION @extschema@.fencing_release(text) IS
'Releases a lock this session took with fencing_acquire and returns true; returns false if the session holds no such lock, or had lost it (lease expired or revoked; a WARNING says why, and the lock is forgotten either way). Locks are also released when the session ends. Error: 55000 worker not available.';

-- Watch registrations move from a file in the data directory into a WAL-logged table (issue 14:
-- pg_upgrade, pg_dump/restore, promotion and PITR did not carry them). Registrations made under
-- 0.1.0 (in the worker's shared memory, from that file) are copied into it below.
-- Watched resources (fencing_watch): one row per resource of this database whose etcd lock the
-- worker watches. WAL-logged and dumped, so streaming standbys, promotion, point-in-time recovery,
-- pg_upgrade and pg_dump/restore carry the registration; the hand-over revision the watch derives
-- from etcd is derived again on the new server before the resource admits a write.
CREATE TABLE _pg_fencing.watch (
    -- The limits fencing_watch checks (and shared memory holds): no tabs or line breaks,
    -- resource shorter than 256 bytes, key prefix shorter than 320.
    resource         text        PRIMARY KEY CHECK (resource <> '' AND octet_length(resource) < 256
                                                    AND resource !~ '[\t\n\r]'),
    lock_key_prefix  text        NOT NULL CHECK (lock_key_prefix <> '' AND octet_length(lock_key_prefix) < 320
                                                 AND lock_key_prefix !~ '[\t\n\r]'),
    verify           boolean     NOT NULL,
    watched_at       timestamptz NOT NULL DEFAULT pg_catalog.now()
);
GRANT SELECT ON _pg_fencing.watch TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('_pg_fencing.watch', '');
SELECT pg_catalog.pg_extension_config_dump('_pg_fencing.revision_sample', '');

CREATE FUNCTION _pg_fencing.watch_changed(resource text, lock_key_prefix text, verify boolean) RETURNS void
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'pg_fencing_watch_changed';
REVOKE ALL ON FUNCTION _pg_fencing.watch_changed(text, text, boolean) FROM PUBLIC;
COMMENT ON FUNCTION _pg_fencing.watch_changed(text, text, boolean) IS
'Called by the row trigger of _pg_fencing.watch: the worker starts (lock_key_prefix not NULL) or stops watching the resource when the transaction commits.';

CREATE FUNCTION _pg_fencing.on_watch_change() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND (TG_OP = 'DELETE' OR OLD.resource IS DISTINCT FROM NEW.resource) THEN
        PERFORM _pg_fencing.watch_changed(OLD.resource, NULL, NULL);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM _pg_fencing.watch_changed(NEW.resource, NEW.lock_key_prefix, NEW.verify);
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END
$fn$;
-- Also for rows that pg_restore loads: the restored watches start with the restore's commit.
-- BEFORE, so that it also fires for fencing_watch's own internal statement.
CREATE TRIGGER watch_changed BEFORE INSERT OR UPDATE OR DELETE ON _pg_fencing.watch
    FOR EACH ROW EXECUTE FUNCTION _pg_fencing.on_watch_change();
INSERT INTO _pg_fencing.watch (resource, lock_key_prefix, verify)
    SELECT w.resource, w.lock_key_prefix, w.verify FROM @extschema@.fencing_watches w;

COMMENT ON FUNCTION @extschema@.fencing_watch(text, text, boolean) IS
'The background worker watches etcd lock lock_name (default: the resource''s name, after pg_fencing.lock_prefix) and, whenever it changes hands, raises the resource''s mark to the hand-over revision (the later of the new holder key''s create revision and its predecessor''s deletion; never above the new holder''s token). Watches are per database. With verify, writes are also refused (FT006) unless their token is at most the latest revision etcd has reported, seen within pg_fencing.verify_max_lag. The registration is a row of _pg_fencing.watch (WAL-logged, so standbys, promotion, PITR, pg_upgrade and pg_dump/restore carry it) and takes effect when the transaction commits; after a (re)start the resource admits no write until the watch has read etcd (waiting at most pg_fencing.watch_sync_timeout, then FT005). Errors: 42501 not allowed to write the resource''s tables; 55000 no worker, or this database''s extension not yet updated to 0.2.0 (ALTER EXTENSION pg_fencing UPDATE); 22023 bad names; 53400 all 64 watch slots in use; 0A000 at PREPARE TRANSACTION.';
COMMENT ON FUNCTION @extschema@.fencing_unwatch(text) IS
'Stops watching a resource in this database (true if it was watched) when the transaction commits; the hand-over revision the watch reached is stored as the resource''s mark then, durably. Errors: 42501 as fencing_watch; 55000 this database''s extension not yet updated to 0.2.0; 0A000 at PREPARE TRANSACTION.';

-- Logical replication: the tombstones of per-row protected tables, by table name, for
-- subscribers (protection ids differ between servers). While the feed is in a publication it
-- holds every tombstone (filled by _pg_fencing.fill_feed when it joins one, then written with each
-- tombstone, src/state/tombstones.rs), so that a subscription's initial copy brings those that
-- existed before it, and its changes the later ones. Key '' is the table's tombstone floor.
-- Rows are only inserted and deleted, never updated: a higher mark for a key is a new row, and
-- the lower one is deleted (a subscriber applies each as it comes, whatever it has). A subscriber
-- turns each row into a tombstone (or floor) of its own protection of that table, and keeps the
-- row (_pg_fencing.on_replicated_change); fencing_protect there takes those already received.
CREATE TABLE _pg_fencing.tombstone_feed (
    relation    text   NOT NULL,
    key         text   NOT NULL,
    high_water  bigint NOT NULL CHECK (high_water > 0),
    PRIMARY KEY (relation, key, high_water)
);
-- The name each per-row protection's rows of tombstone_feed are stored under. A table renamed or
-- moved to another schema, or whose schema is renamed, by whatever command, gets them moved to
-- its new name at the end of the command (_pg_fencing.sync_feed_names, found by OID).
CREATE TABLE _pg_fencing.feed_name (
    protection_id  bigint PRIMARY KEY,
    relation       text   NOT NULL
);
GRANT SELECT ON _pg_fencing.tombstone_feed, _pg_fencing.feed_name TO PUBLIC;

-- Logical replication (issue 14: a subscriber's marks stayed behind what it applied, and
-- publishing pg_fencing's own tables overwrote the subscriber's). See sql/pg_fencing.sql.
--
-- A subscription applies changes with session_replication_role = replica, in which ordinary
-- triggers do not fire. What a subscriber applies must still raise its marks and tombstones:
--   * every protected table has the REPLICA row trigger zz_pg_fencing_replica (fencing_protect),
--     with which the guard records instead of refusing (src/guard/trigger.rs, record_replicated);
--   * pg_fencing's own tables have the REPLICA row trigger zz_pg_fencing_replicated below, so
--     that publishing them (FOR ALL TABLES does) merges instead of overwriting: a resource's mark
--     only goes up, a tombstone_feed row becomes a tombstone of the subscriber's own protection
--     of that table, and protections, tombstones by id, the reset log and watches stay the
--     subscriber's own.
CREATE FUNCTION _pg_fencing.replicated_row() RETURNS boolean
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'pg_fencing_replicated_row';
COMMENT ON FUNCTION _pg_fencing.replicated_row() IS
'True in a logical replication worker, except while pg_fencing''s own internal statements run there: the row being written was applied by a subscription.';

-- A tombstone_feed row (relation by name, key '' for the floor) taken by this server's per-row
-- protection of that table, if any: a tombstone that only goes up, or a floor raised
-- (fencing_prune_tombstones, which also tells the other backends).
CREATE FUNCTION _pg_fencing.take_feed(feed_relation text, feed_key text, feed_high_water bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    pid bigint;
    rel regclass;
BEGIN
    SELECT p.id, p.relid INTO pid, rel FROM _pg_fencing.protected_table p
    WHERE p.relid = to_regclass(feed_relation) AND p.resource IS NULL AND p.protected;
    IF NOT FOUND THEN
        RETURN;
    ELSIF feed_key = '' THEN
        PERFORM @extschema@.fencing_prune_tombstones(rel, feed_high_water, 0);
    ELSE
        INSERT INTO _pg_fencing.row_tombstone AS h (protection_id, key, high_water, key_hash)
        VALUES (pid, feed_key, feed_high_water, _pg_fencing.tombstone_key_hash(pid, feed_key))
        ON CONFLICT (protection_id, key) DO UPDATE
        SET high_water = GREATEST(h.high_water, excluded.high_water), key_hash = excluded.key_hash
        WHERE h.high_water < excluded.high_water OR h.key_hash IS DISTINCT FROM excluded.key_hash;
    END IF;
END
$fn$;
REVOKE ALL ON FUNCTION _pg_fencing.take_feed(text, text, bigint) FROM PUBLIC;

-- A dropped table takes its protection and tombstones with it (and its rows of the tombstone
-- feed).
CREATE OR REPLACE FUNCTION _pg_fencing.on_sql_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    WITH gone AS (
        DELETE FROM _pg_fencing.protected_table p
        USING pg_event_trigger_dropped_objects() d
        WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objsubid = 0 AND p.relid::oid = d.objid
        RETURNING p.id
    ), tombs AS (
        DELETE FROM _pg_fencing.row_tombstone t USING gone WHERE t.protection_id = gone.id
    ), runs AS (
        DELETE FROM _pg_fencing.tombstone_run tr USING gone WHERE tr.protection_id = gone.id
    ), chunks AS (
        DELETE FROM _pg_fencing.tombstone_chunk tc USING gone WHERE tc.protection_id = gone.id
    ), names AS (
        DELETE FROM _pg_fencing.feed_name fn USING gone WHERE fn.protection_id = gone.id
        RETURNING fn.relation
    )
    DELETE FROM _pg_fencing.tombstone_feed f USING names WHERE f.relation = names.relation;
END
$fn$;

-- A per-row protected table whose name differs from the one its rows of tombstone_feed are stored
-- under (feed_name): renamed, moved to another schema (ALTER TABLE, ALTER INDEX ... RENAME,
-- ALTER EXTENSION ... SET SCHEMA), or its schema renamed. Its rows move to the new name, by which
-- subscribers know the table. At the end of every command that can rename a table.
CREATE FUNCTION _pg_fencing.sync_feed_names() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT fn.protection_id, fn.relation AS old_name, format('%I.%I', n.nspname, c.relname) AS new_name
             FROM _pg_fencing.feed_name fn
             JOIN _pg_fencing.protected_table pt ON pt.id = fn.protection_id
             JOIN pg_class c ON c.oid = pt.relid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE fn.relation <> format('%I.%I', n.nspname, c.relname) LOOP
        -- (the feed rows of deletes that committed while the renaming command waited for the
        -- table's lock must be moved too: a snapshot older than the lock would leave them behind)
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION USING ERRCODE = '55000',
                MESSAGE = format('pg_fencing''s tombstone feed rows of %s can only be moved to its new name %s in a READ COMMITTED transaction', r.old_name, r.new_name),
                DETAIL = 'The table was renamed or moved to another schema; its rows of _pg_fencing.tombstone_feed must be read with a snapshot taken after the table''s lock.',
                HINT = 'Run the command in a READ COMMITTED transaction.';
        END IF;
        WITH moved AS (DELETE FROM _pg_fencing.tombstone_feed f WHERE f.relation = r.old_name
                       RETURNING f.key, f.high_water)
        INSERT INTO _pg_fencing.tombstone_feed (relation, key, high_water)
        SELECT r.new_name, m.key, m.high_water FROM moved m
        ON CONFLICT DO NOTHING;
        UPDATE _pg_fencing.feed_name SET relation = r.new_name WHERE protection_id = r.protection_id;
    END LOOP;
END
$fn$;
REVOKE ALL ON FUNCTION _pg_fencing.sync_feed_names() FROM PUBLIC;
CREATE FUNCTION _pg_fencing.on_rename_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM _pg_fencing.sync_feed_names();
END
$fn$;
CREATE EVENT TRIGGER pg_fencing_names ON ddl_command_end
    WHEN TAG IN ('ALTER TABLE', 'ALTER INDEX', 'ALTER SCHEMA', 'ALTER EXTENSION', 'ALTER VIEW',
                 'ALTER SEQUENCE', 'ALTER FOREIGN TABLE', 'ALTER MATERIALIZED VIEW')
    EXECUTE FUNCTION _pg_fencing.on_rename_ddl();

-- While tombstone_feed is in a publication, it holds every tombstone and floor of the per-row
-- protected tables (relation: only that one's; NULL: all): called when a publication changes and
-- by fencing_protect. Each table is locked in SHARE mode first, so that its in-flight deletes
-- commit before (their tombstones are read here) or wait until this transaction has added the
-- feed to the publication (they then write the feed themselves): no tombstone falls between.
CREATE FUNCTION _pg_fencing.fill_feed(relation regclass DEFAULT NULL) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    p record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication_tables pt
                   WHERE pt.schemaname = '_pg_fencing' AND pt.tablename = 'tombstone_feed') THEN
        RETURN;
    END IF;
    PERFORM _pg_fencing.sync_feed_names();
    FOR p IN SELECT pt.id, pt.relid, format('%I.%I', n.nspname, c.relname) AS name
             FROM _pg_fencing.protected_table pt JOIN pg_class c ON c.oid = pt.relid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE pt.protected AND pt.resource IS NULL AND (fill_feed.relation IS NULL OR pt.relid = fill_feed.relation)
             ORDER BY pt.relid LOOP
        -- (the tombstones of deletes that committed while this waited for the lock must be read:
        -- a snapshot older than the lock would miss them)
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION USING ERRCODE = '55000',
                MESSAGE = 'pg_fencing''s tombstone feed can only be filled in a READ COMMITTED transaction',
                DETAIL = format('This command publishes _pg_fencing.tombstone_feed (or changes a table it carries, %s); the tombstones written meanwhile must be read with a snapshot taken after the table''s lock.', p.relid),
                HINT = 'Run the command in a READ COMMITTED transaction.';
        END IF;
        EXECUTE format('LOCK TABLE %s IN SHARE MODE', p.relid);
        -- (the feed carries tombstones key by key)
        PERFORM _pg_fencing.expand_tombstone_runs(p.id);
        INSERT INTO _pg_fencing.tombstone_feed AS f (relation, key, high_water)
        SELECT p.name, rt.key, rt.high_water FROM _pg_fencing.row_tombstone rt WHERE rt.protection_id = p.id
        UNION ALL
        SELECT p.name, '', pt.tombstone_floor FROM _pg_fencing.protected_table pt
        WHERE pt.id = p.id AND pt.tombstone_floor IS NOT NULL
        ON CONFLICT DO NOTHING;
        INSERT INTO _pg_fencing.feed_name AS fn (protection_id, relation) VALUES (p.id, p.name)
        ON CONFLICT (protection_id) DO UPDATE SET relation = excluded.relation;
    END LOOP;
END
$fn$;
REVOKE ALL ON FUNCTION _pg_fencing.fill_feed(regclass) FROM PUBLIC;

-- fencing_protect in per-row mode (src/api/functions.rs, pg_fencing_register): the table's
-- tombstones and floor that a subscription brought in tombstone_feed are taken by the
-- protection, and where the feed is published, the protection's own are put in it.
CREATE FUNCTION _pg_fencing.feed_protection(relation regclass) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    feed_name text;
    pid bigint;
    feed_floor bigint;
BEGIN
    SELECT format('%I.%I', n.nspname, c.relname), pt.id INTO feed_name, pid
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN _pg_fencing.protected_table pt ON pt.relid = c.oid AND pt.resource IS NULL AND pt.protected
    WHERE c.oid = feed_protection.relation;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- (set-based, and only the keys whose tombstone is missing or lower: a protection taken up
    -- again on the publisher finds its own tombstones there)
    INSERT INTO _pg_fencing.row_tombstone AS h (protection_id, key, high_water, key_hash)
    SELECT pid, f.key, max(f.high_water), _pg_fencing.tombstone_key_hash(pid, f.key)
    FROM _pg_fencing.tombstone_feed f
    WHERE f.relation = feed_name AND f.key <> ''
      AND NOT EXISTS (SELECT 1 FROM _pg_fencing.row_tombstone t
                      WHERE t.protection_id = pid AND t.key = f.key AND t.high_water >= f.high_water)
    GROUP BY f.key
    ON CONFLICT (protection_id, key) DO UPDATE
    SET high_water = GREATEST(h.high_water, excluded.high_water), key_hash = excluded.key_hash
    WHERE h.high_water < excluded.high_water;
    SELECT max(f.high_water) INTO feed_floor FROM _pg_fencing.tombstone_feed f WHERE f.relation = feed_name AND f.key = '';
    IF feed_floor > coalesce((SELECT pt.tombstone_floor FROM _pg_fencing.protected_table pt WHERE pt.id = pid), 0) THEN
        PERFORM @extschema@.fencing_prune_tombstones(relation, feed_floor, 0);
    END IF;
    PERFORM _pg_fencing.fill_feed(relation);
END
$fn$;
REVOKE ALL ON FUNCTION _pg_fencing.feed_protection(regclass) FROM PUBLIC;

CREATE FUNCTION _pg_fencing.on_replicated_change() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    -- This function's own statements below, pg_fencing's bookkeeping, and sessions in replica
    -- mode that are not a subscription's workers pass through.
    IF pg_trigger_depth() > 1 OR NOT _pg_fencing.replicated_row() THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF TG_TABLE_NAME = 'resource_high_water' THEN
        -- A mark only goes up: the publisher's is merged in, never lowered, never deleted.
        IF TG_OP = 'INSERT' THEN
            INSERT INTO _pg_fencing.resource_high_water AS h (resource, high_water, updated_at)
            VALUES (NEW.resource, NEW.high_water, clock_timestamp())
            ON CONFLICT (resource) DO UPDATE SET high_water = excluded.high_water, updated_at = excluded.updated_at
            WHERE h.high_water < excluded.high_water;
        ELSIF TG_OP = 'UPDATE' AND NEW.resource = OLD.resource AND NEW.high_water > OLD.high_water THEN
            NEW.updated_at := clock_timestamp();
            RETURN NEW;
        END IF;
        RETURN NULL;
    ELSIF TG_TABLE_NAME = 'tombstone_feed' THEN
        -- Kept as the publisher has it (also what the initial copy brings), and taken as a
        -- tombstone or floor of this server's protection of the table, if there is one.
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        ELSIF TG_OP <> 'INSERT' THEN
            RETURN NULL;
        END IF;
        PERFORM _pg_fencing.take_feed(NEW.relation, NEW.key, NEW.high_water);
        IF EXISTS (SELECT 1 FROM _pg_fencing.tombstone_feed f
                   WHERE f.relation = NEW.relation AND f.key = NEW.key AND f.high_water = NEW.high_water) THEN
            RETURN NULL;
        END IF;
        RETURN NEW;
    END IF;
    -- protected_table, row_tombstone, tombstone_run, tombstone_chunk (keyed by the publisher's
    -- ids), reset_log, watch,
    -- feed_name: each server keeps its own.
    RETURN NULL;
END
$fn$;
COMMENT ON FUNCTION _pg_fencing.on_replicated_change() IS
'REPLICA row trigger of pg_fencing''s own tables: merges what a subscription applies (marks only go up; tombstone_feed rows are kept and become tombstones or floors of the subscriber''s own protections) and keeps the subscriber''s protections, tombstones by id, reset log and watches its own.';

DO $do$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['resource_high_water', 'protected_table', 'row_tombstone', 'reset_log',
                             'watch', 'tombstone_feed', 'feed_name', 'tombstone_run', 'tombstone_chunk'] LOOP
        EXECUTE format('CREATE TRIGGER zz_pg_fencing_replicated BEFORE INSERT OR UPDATE OR DELETE ON _pg_fencing.%I '
                       'FOR EACH ROW EXECUTE FUNCTION _pg_fencing.on_replicated_change()', t);
        EXECUTE format('ALTER TABLE _pg_fencing.%I ENABLE REPLICA TRIGGER zz_pg_fencing_replicated', t);
    END LOOP;
END
$do$;

-- Is relation's primary key a temporal one (PostgreSQL 18's WITHOUT OVERLAPS: an exclusion
-- check on a GiST index rather than a B-tree's equality)? Per-row mode is refused for such a key
-- (docs/guarantees.md, "Per-row mode"): overlapping keys are the same key to it without being
-- equal, and tombstones fence equal keys only. Read from pg_index, so the same on 15 and 18.
CREATE FUNCTION _pg_fencing.key_without_overlaps(relation regclass) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                   JOIN pg_catalog.pg_class ic ON ic.oid OPERATOR(pg_catalog.=) i.indexrelid
                   JOIN pg_catalog.pg_am am ON am.oid OPERATOR(pg_catalog.=) ic.relam
                   WHERE i.indrelid OPERATOR(pg_catalog.=) relation AND i.indisprimary
                     AND (i.indisexclusion OR am.amname OPERATOR(pg_catalog.<>) 'btree'))
$$;
CREATE OR REPLACE FUNCTION _pg_fencing.inactive_reason(relation regclass, resource text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    part regclass;
    trig text;
    state "char";
    role text := current_setting('session_replication_role');
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = relation) THEN
        RETURN 'table does not exist';
    END IF;
    -- A protected table attached as a partition of another table: its triggers now name a
    -- protection of a partition, which no write through the partitioned table checks; the root's
    -- own fencing_protect carries its fence (its tombstones, floor and mark) and replaces it.
    IF (SELECT c.relispartition FROM pg_class c WHERE c.oid = relation) THEN
        RETURN format('%s is now a partition of %s; run fencing_protect on %s, which carries this protection''s fence',
                      relation, pg_partition_root(relation), pg_partition_root(relation));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute a JOIN _pg_fencing.protected_table p ON p.relid = relation
                   WHERE a.attrelid = relation AND a.attname = p.token_column AND a.attnum > 0
                     AND NOT a.attisdropped AND a.atttypid = 'int8'::regtype AND a.attgenerated = '') THEN
        RETURN format('the token column of %s is missing, renamed, not bigint, or generated', relation);
    END IF;
    IF _pg_fencing.citus_kind(relation) IS NOT NULL THEN
        RETURN _pg_fencing.citus_problem(relation);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhparent
               WHERE i.inhparent = relation AND c.relkind = 'r') THEN
        RETURN format('%s has inheritance children, which are not fenced', relation);
    END IF;
    IF resource IS NULL AND EXISTS (SELECT 1 FROM pg_index i
                                    WHERE i.indrelid = relation AND i.indisprimary AND NOT i.indimmediate) THEN
        RETURN format('the primary key of %s is DEFERRABLE; per-row writes are refused', relation);
    END IF;
    IF resource IS NULL AND _pg_fencing.key_without_overlaps(relation) THEN
        RETURN format('the primary key of %s has WITHOUT OVERLAPS (changed after fencing_protect): a tombstone fences equal keys only, not overlapping ones; per-row writes are refused', relation);
    END IF;
    IF resource IS NULL AND _pg_fencing.rekey_form(relation) = 'column'
       AND _pg_fencing.other_before_update_triggers(relation) THEN
        RETURN format('another BEFORE UPDATE row trigger of %s may change the primary key, but zz_pg_fencing_rekey only fires for UPDATEs that set a key column (writes are refused; fencing_protect installs the form that checks every key change)', relation);
    END IF;
    IF resource IS NULL AND NOT _pg_fencing.rekey_matches_key(relation) THEN
        RETURN format('zz_pg_fencing_rekey of %s watches other columns than the primary key (changed after fencing_protect); run fencing_protect again', relation);
    END IF;
    FOR part IN SELECT t.relid FROM _pg_fencing.tree(relation) t LOOP
        IF (SELECT c.relkind FROM pg_class c WHERE c.oid = part) = 'f' THEN
            RETURN format('%s is a foreign partition: it cannot carry a TRUNCATE trigger, so TRUNCATE of it is not fenced', part);
        END IF;
        FOREACH trig IN ARRAY CASE WHEN resource IS NULL AND _pg_fencing.table_shape(part) IS DISTINCT FROM 'set-based'
                                   THEN ARRAY['zz_pg_fencing_guard', 'zz_pg_fencing_after', 'zz_pg_fencing_rekey',
                                              'zz_pg_fencing_truncate', 'zz_pg_fencing_replica']
                                   WHEN resource IS NULL
                                   THEN ARRAY['zz_pg_fencing_guard', 'zz_pg_fencing_after', 'zz_pg_fencing_rekey',
                                              'zz_pg_fencing_truncate', 'zz_pg_fencing_stmt', 'zz_pg_fencing_replica']
                                   ELSE ARRAY['zz_pg_fencing_guard', 'zz_pg_fencing_after', 'zz_pg_fencing_truncate',
                                              'zz_pg_fencing_stmt', 'zz_pg_fencing_replica'] END
        LOOP
            SELECT tg.tgenabled INTO state FROM pg_trigger tg WHERE tg.tgrelid = part AND tg.tgname = trig;
            IF NOT FOUND THEN
                RETURN format('trigger %s is missing on %s', trig, part);
            ELSIF state = 'D' THEN
                RETURN format('trigger %s is disabled on %s', trig, part);
            ELSIF trig = 'zz_pg_fencing_replica' THEN
                IF state = 'O' THEN
                    RETURN format('trigger %s on %s does not fire in replica mode, so changes that logical replication applies are not recorded', trig, part);
                END IF;
            ELSIF state = 'O' AND role = 'replica' THEN
                RETURN format('session_replication_role = replica skips trigger %s on %s (writes are recorded, not refused)', trig, part);
            ELSIF state = 'R' AND role <> 'replica' THEN
                RETURN format('trigger %s on %s fires only in replica mode', trig, part);
            END IF;
        END LOOP;
    END LOOP;
    FOR part IN SELECT t.relid FROM _pg_fencing.tree(relation) t LOOP
        SELECT tg.tgname INTO trig FROM pg_trigger tg
        WHERE tg.tgrelid = part AND tg.tgtype::int & 67 = 3 AND tg.tgtype::int & 20 <> 0 AND tg.tgenabled IN ('O', 'A')
          AND (tg.tgname COLLATE "C") > 'zz_pg_fencing_guard'
          AND NOT (tg.tgname LIKE 'zz\_pg\_fencing\_%' AND tg.tgfoid = '@extschema@.fencing_guard()'::regprocedure)
        ORDER BY tg.tgname LIMIT 1;
        IF FOUND THEN
            RETURN format('BEFORE row trigger %s on %s fires after zz_pg_fencing_guard and could change a row after its check', trig, part);
        END IF;
    END LOOP;
    IF _pg_fencing.table_shape(relation) = 'set-based' THEN
        trig := _pg_fencing.set_based_problem(relation, (SELECT p.id FROM _pg_fencing.protected_table p WHERE p.relid = relation),
                                              resource, (SELECT p.token_column FROM _pg_fencing.protected_table p WHERE p.relid = relation));
        IF trig IS NOT NULL THEN
            RETURN trig;
        END IF;
    END IF;
    -- A subscriber: rows of this table arrive by logical replication. Their tokens raise the
    -- marks (zz_pg_fencing_replica), but the publisher's marks and tombstones that no row carries
    -- (fencing_advance, the token of a DELETE or TRUNCATE) arrive only through pg_fencing's tables.
    IF EXISTS (SELECT 1 FROM pg_subscription_rel sr JOIN _pg_fencing.tree(relation) t ON t.relid = sr.srrelid) THEN
        IF resource IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_subscription_rel sr
                                                WHERE sr.srrelid = '_pg_fencing.resource_high_water'::regclass) THEN
            RETURN format('%s is written by a subscription, but _pg_fencing.resource_high_water is not subscribed: the mark follows replicated rows only, not the publisher''s advances and deletes', relation);
        ELSIF resource IS NULL AND NOT EXISTS (SELECT 1 FROM pg_subscription_rel sr
                                               WHERE sr.srrelid = '_pg_fencing.tombstone_feed'::regclass) THEN
            RETURN format('%s is written by a subscription, but _pg_fencing.tombstone_feed is not subscribed: replicated deletes leave tombstones with the deleted row''s token, not the deleting write''s', relation);
        END IF;
    END IF;
    RETURN NULL;
END
$fn$;

-- Does a member of relation's partition tree have a BEFORE UPDATE row trigger other than
-- pg_fencing's guard? Such a trigger may change a row's primary key where the guard cannot see it
-- (src/guard/trigger.rs).
CREATE FUNCTION _pg_fencing.other_before_update_triggers(relation regclass) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT EXISTS (SELECT 1 FROM _pg_fencing.tree(relation) t JOIN pg_trigger tg ON tg.tgrelid = t.relid
                   WHERE tg.tgtype::int & 83 = 19  -- ROW (1) | BEFORE (2) | UPDATE (16), not INSTEAD (64)
                     AND tg.tgfoid <> '@extschema@.fencing_guard()'::regprocedure)
$fn$;

-- The form zz_pg_fencing_rekey has on relation: 'column' (AFTER UPDATE OF the key columns),
-- 'when' (AFTER UPDATE ... WHEN the key changed), NULL (missing).
CREATE FUNCTION _pg_fencing.rekey_form(relation regclass) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT CASE WHEN tg.tgqual IS NULL AND cardinality(tg.tgattr::int2[]) > 0 THEN 'column' ELSE 'when' END
    FROM pg_trigger tg WHERE tg.tgrelid = relation AND tg.tgname = 'zz_pg_fencing_rekey'
$fn$;

-- Does zz_pg_fencing_rekey of relation watch exactly the primary key's columns (NULL: no such
-- trigger)? Its columns are the trigger's column list (cheap form) or the columns its WHEN clause
-- reads; a primary key changed after fencing_protect makes them stale.
CREATE FUNCTION _pg_fencing.rekey_matches_key(relation regclass) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT ARRAY(SELECT DISTINCT c FROM unnest(CASE WHEN tg.tgqual IS NULL THEN tg.tgattr::int2[]
                     ELSE ARRAY(SELECT m[1]::int2 FROM regexp_matches(tg.tgqual::text, ':varattno (\d+)', 'g') m) END) c
                 ORDER BY c)
         = ARRAY(SELECT DISTINCT c FROM pg_index i, unnest(i.indkey::int2[]) c
                 WHERE i.indrelid = relation AND i.indisprimary ORDER BY c)
    FROM pg_trigger tg WHERE tg.tgrelid = relation AND tg.tgname = 'zz_pg_fencing_rekey'
$fn$;

-- Per-row mode: the AFTER UPDATE row trigger that checks a row's new key against its tombstone
-- once the row is in the unique index (and tombstones the old key). Its cheap form fires only for
-- UPDATEs that set a key column (AFTER UPDATE OF the key columns: no WHEN clause to read and
-- evaluate for every statement); the general form, WHEN the key changed, is needed while another
-- BEFORE UPDATE row trigger could change the key without it being set. The DDL event trigger
-- keeps the form right as triggers come and go; the guard refuses writes (FT004) should the cheap
-- form meet such a trigger anyway.
CREATE FUNCTION _pg_fencing.set_rekey_trigger(relation regclass, pid bigint, token_column name)
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    pk name[];
    args text := format('%L, %L, %L', pid, '', token_column);
BEGIN
    SELECT array_agg(a.attname ORDER BY k.ord) INTO pk
    FROM pg_catalog.pg_index i
    CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
    JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
    WHERE i.indrelid = relation AND i.indisprimary;
    IF pk IS NULL THEN
        RETURN;
    END IF;
    IF _pg_fencing.other_before_update_triggers(relation) THEN
        EXECUTE format('CREATE OR REPLACE TRIGGER zz_pg_fencing_rekey AFTER UPDATE ON %s FOR EACH ROW '
                       'WHEN (ROW(%s) IS DISTINCT FROM ROW(%s)) EXECUTE FUNCTION @extschema@.fencing_guard(%s)',
                       relation,
                       (SELECT string_agg(format('OLD.%I', c), ', ') FROM unnest(pk) c),
                       (SELECT string_agg(format('NEW.%I', c), ', ') FROM unnest(pk) c),
                       args);
    ELSE
        EXECUTE format('CREATE OR REPLACE TRIGGER zz_pg_fencing_rekey AFTER UPDATE OF %s ON %s FOR EACH ROW '
                       'EXECUTE FUNCTION @extschema@.fencing_guard(%s)',
                       (SELECT string_agg(format('%I', c), ', ') FROM unnest(pk) c), relation, args);
    END IF;
END
$fn$;

-- Every trigger of a protection in the mode it needs on one member of the partition tree: the
-- REPLICA trigger zz_pg_fencing_replica fires in replica mode only, all others in ordinary
-- sessions. ALTER TABLE ... ENABLE TRIGGER ALL (pg_restore --disable-triggers ends with it) turns
-- the REPLICA trigger into an ordinary one, DISABLE TRIGGER disables any; fencing_protect repairs
-- them (inactive_reason reports them, and writes are refused until then).
CREATE FUNCTION _pg_fencing.repair_firing_modes(part regclass) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    fixes text;
BEGIN
    -- One ALTER TABLE for all of them: the DDL event trigger, which refuses a protection's
    -- trigger left disabled, runs once, after every mode is right.
    SELECT string_agg(CASE WHEN tg.tgname = 'zz_pg_fencing_replica' THEN 'ENABLE REPLICA TRIGGER '
                           ELSE 'ENABLE TRIGGER ' END || pg_catalog.quote_ident(tg.tgname), ', ')
    INTO fixes
    FROM pg_catalog.pg_trigger tg
    WHERE tg.tgrelid = part AND tg.tgname IN ('zz_pg_fencing_guard', 'zz_pg_fencing_after',
          'zz_pg_fencing_rekey', 'zz_pg_fencing_truncate', 'zz_pg_fencing_stmt', 'zz_pg_fencing_replica')
      AND tg.tgenabled <> CASE WHEN tg.tgname = 'zz_pg_fencing_replica' THEN 'R' ELSE 'O' END;
    IF fixes IS NOT NULL THEN
        EXECUTE format('ALTER TABLE %s %s', part, fixes);
    END IF;
END
$fn$;

-- Drop the set-based shape's default (_pg_fencing.stamp_default()) of relation's columns, except
-- of column keep.
CREATE FUNCTION _pg_fencing.drop_own_default(relation regclass, keep name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    col name;
BEGIN
    FOR col IN SELECT a.attname FROM pg_attrdef d JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
               WHERE d.adrelid = relation AND pg_get_expr(d.adbin, d.adrelid) = '_pg_fencing.stamp_default()'
                 AND a.attname IS DISTINCT FROM keep LOOP
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP DEFAULT', relation, col);
    END LOOP;
END
$fn$;

-- ---------------------------------------------------------------------------------------------
-- The Citus shape (docs/citus.md; src/guard/citus.rs): a hash-distributed or reference table in
-- resource mode, checked where Citus plans its writes.

-- What kind of Citus table relation is: 'distributed' (by hash), 'reference', 'other' (a Citus
-- local table, append or range distribution, a distributed partitioned table or one of its
-- partitions); NULL for a table Citus does not manage (or without Citus).
CREATE FUNCTION _pg_fencing.citus_kind(relation regclass) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    kind text;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN NULL;
    END IF;
    EXECUTE 'SELECT CASE WHEN c.relkind OPERATOR(pg_catalog.=) ''p'' OR c.relispartition THEN ''other'' '
            '            WHEN d.partmethod OPERATOR(pg_catalog.=) ''h'' THEN ''distributed'' '
            '            WHEN d.partmethod OPERATOR(pg_catalog.=) ''n'' AND d.repmodel OPERATOR(pg_catalog.=) ''t'' THEN ''reference'' '
            '            ELSE ''other'' END '
            'FROM pg_catalog.pg_dist_partition d JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.logicalrelid '
            'WHERE d.logicalrelid OPERATOR(pg_catalog.=) $1'
        INTO kind USING relation;
    RETURN kind;
END
$fn$;

CREATE FUNCTION _pg_fencing.citus_stamp(protection bigint) RETURNS bigint
LANGUAGE c STABLE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'pg_fencing_citus_stamp';
COMMENT ON FUNCTION _pg_fencing.citus_stamp(bigint) IS
'Internal (the Citus shape: the token column''s default and the value the planner gives it in an INSERT or UPDATE of a protected distributed or reference table; a DELETE''s added condition): on the coordinator, admits the session''s pg_fencing.token against the mark of protection''s resource (under its lock, raised when higher) and returns it. STABLE, so that Citus evaluates it on the coordinator, once per statement, and sends the shards its value. Errors: FT001 token below the mark; FT002 no token; FT003 the token''s lock or lease was lost; FT004 the protection is not active, or the call runs on a worker (writes enter through the coordinator); 42501 not allowed to write the table; 22023 no such protection.';

-- Every node of the Citus cluster must preload pg_fencing (55000 naming the nodes that do not, or
-- cannot be asked): a table of the Citus shape is fenced by pg_fencing's planner, executor and
-- utility hooks on the coordinator and on the nodes of its shards. From protect_citus, and at
-- the commit of a change of Citus's nodes (citus_nodes_changed). run_command_on_all_nodes asks the
-- active nodes: an inactive one is asked when it is activated.
CREATE FUNCTION _pg_fencing.citus_require_preloaded() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    missing text;
BEGIN
    EXECUTE 'SELECT pg_catalog.string_agg(r.nodeid::pg_catalog.text, '', '' ORDER BY r.nodeid) '
            'FROM pg_catalog.run_command_on_all_nodes(''SELECT _pg_fencing.preloaded()'') r '
            'WHERE NOT r.success OR r.result OPERATOR(pg_catalog.<>) ''t'''
        INTO missing;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('pg_fencing is not preloaded on every node of the Citus cluster (node ids %s)', missing),
            DETAIL = 'A protected distributed table is fenced by pg_fencing''s planner, executor and utility hooks on the coordinator and on the nodes of its shards; only a preloaded library has them in every backend.',
            HINT = 'Set shared_preload_libraries = ''citus,pg_fencing'' on every node, restart them, and create the extension on each; docs/citus.md.';
    END IF;
END
$fn$;

-- A transaction that changed Citus's node table pg_dist_node (citus_add_node, citus_activate_node,
-- citus_update_node, or any other way), at its commit (src/guard/citus.rs, at_commit; docs/citus.md,
-- "Adding a node"): on the coordinator, while a table is protected in the Citus shape (a marker
-- constraint exists), every active node must preload pg_fencing, or the commit fails (55000).
CREATE FUNCTION _pg_fencing.citus_nodes_changed() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    grp integer;
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_local_group') IS NULL THEN
        RETURN;
    END IF;
    EXECUTE 'SELECT g.groupid FROM pg_catalog.pg_dist_local_group g LIMIT 1' INTO grp;
    IF grp IS DISTINCT FROM 0 THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_constraint c WHERE c.conname LIKE 'zz\_pg\_fencing\_citus\_%') THEN
        PERFORM _pg_fencing.citus_require_preloaded();
    END IF;
END
$fn$;

-- Put hash-distributed or reference table relation under the Citus shape (from fencing_protect,
-- whose checks ran; kind from citus_kind). What fences it: the coordinator's planner hook makes
-- every INSERT, UPDATE and DELETE of it call _pg_fencing.citus_stamp(protection), and its
-- utility hook checks COPY and TRUNCATE; the marker constraint zz_pg_fencing_citus_<protection>
-- (CHECK (token_column IS NOT NULL) NOT VALID), which Citus copies to every shard, moved or
-- split, tells the hooks on every node which relations are such a table's shell or shards.
CREATE FUNCTION _pg_fencing.protect_citus(relation regclass, resource text, token_column name, kind text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    prev record;
    carried bigint;
    prev_max bigint;
    col record;
    pid bigint;
    marker name;
    con name;
BEGIN
    IF kind = 'other' THEN
        RAISE EXCEPTION USING ERRCODE = '0A000',
            MESSAGE = format('%s is a Citus table of a kind pg_fencing does not protect', relation),
            DETAIL = 'pg_fencing protects hash-distributed and reference tables; not Citus local tables, append or range distribution, or distributed partitioned tables and their partitions.',
            HINT = 'Distribute the table by hash or make it a reference table, or keep it on the coordinator (SELECT undistribute_table(...)) and protect it there; docs/citus.md.';
    END IF;
    IF resource IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '0A000',
            MESSAGE = format('per-row mode is not available for Citus table %s', relation),
            DETAIL = 'Per-row mode keeps each deleted key''s tombstone, which would have to live and move with the key''s shard.',
            HINT = 'Protect it in resource mode: fencing_protect(table, ''resource-name''); docs/citus.md.';
    END IF;
    IF NOT pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = relation), 'USAGE') THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format('must be owner of table %s', relation);
    END IF;
    -- The hooks that fence the table must be in every backend of every node.
    PERFORM _pg_fencing.citus_require_preloaded();
    SELECT a.atttypid, a.attgenerated INTO col FROM pg_attribute a
    WHERE a.attrelid = relation AND a.attname = token_column AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        EXECUTE format('ALTER TABLE %s ADD COLUMN %I bigint', relation, token_column);
    ELSIF col.atttypid <> 'int8'::regtype THEN
        RAISE EXCEPTION USING ERRCODE = '42804',
            MESSAGE = format('token column %I of %s has type %s, not bigint', token_column, relation, col.atttypid::regtype);
    ELSIF col.attgenerated <> '' THEN
        RAISE EXCEPTION USING ERRCODE = '42P16',
            MESSAGE = format('token column %I of %s is a generated column', token_column, relation),
            HINT = 'pg_fencing stamps the token column itself; use a plain bigint column.';
    END IF;
    -- Switching to another resource or token column carries the fence (as fencing_protect does).
    SELECT pt.id, pt.resource, pt.token_column INTO prev FROM _pg_fencing.protected_table pt WHERE pt.relid = relation;
    IF FOUND AND (prev.resource IS DISTINCT FROM resource OR prev.token_column <> token_column) THEN
        IF prev.resource IS NOT NULL THEN
            carried := @extschema@.fencing_high_water(prev.resource);
        END IF;
        IF EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = relation AND a.attname = prev.token_column
                   AND a.attnum > 0 AND NOT a.attisdropped AND a.atttypid = 'int8'::regtype) THEN
            EXECUTE format('SELECT max(%I) FROM %s', prev.token_column, relation) INTO prev_max;
            carried := greatest(carried, prev_max);
        END IF;
    END IF;
    -- A marker names its protection; one of an earlier protection is dropped once that is gone.
    PERFORM _pg_fencing.unregister(relation);
    FOR con IN SELECT c.conname FROM pg_constraint c
               WHERE c.conrelid = relation AND c.conname LIKE 'zz\_pg\_fencing\_citus\_%' LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', relation, con);
    END LOOP;
    pid := _pg_fencing.register(relation, resource, token_column::text);
    marker := format('zz_pg_fencing_citus_%s', pid);
    EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I CHECK (%I IS NOT NULL) NOT VALID', relation, marker, token_column);
    EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET DEFAULT _pg_fencing.citus_stamp(%s)', relation, token_column, pid);
    IF carried IS NOT NULL AND coalesce(@extschema@.fencing_high_water(resource), 0) < carried THEN
        PERFORM @extschema@.fencing_advance(resource, carried);
        RAISE NOTICE 'pg_fencing: the protection of % carries the old one''s fence: resource % accepts tokens from % on', relation, resource, carried;
    END IF;
END
$fn$;

-- Why the Citus shape of relation cannot hold (NULL: it can); from inactive_reason.
CREATE FUNCTION _pg_fencing.citus_problem(relation regclass) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    p record;
BEGIN
    SELECT pt.id, pt.token_column INTO p FROM _pg_fencing.protected_table pt WHERE pt.relid = relation;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conrelid = relation AND c.contype = 'c'
                   AND c.conname = format('zz_pg_fencing_citus_%s', p.id)) THEN
        RETURN format('the marker constraint zz_pg_fencing_citus_%s of Citus table %s is missing; run fencing_protect again', p.id, relation);
    END IF;
    IF (SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
        WHERE d.adrelid = relation AND a.attname = p.token_column) !~ format('^_pg_fencing\.citus_stamp\(\(?%s\)?(::bigint)?\)$', p.id)
       OR NOT EXISTS (SELECT 1 FROM pg_attrdef d JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
                      WHERE d.adrelid = relation AND a.attname = p.token_column) THEN
        RETURN format('the default of token column %I of Citus table %s is not pg_fencing''s stamp (_pg_fencing.citus_stamp(%s)), which stamps a COPY''s rows; run fencing_protect again', p.token_column, relation, p.id);
    END IF;
    IF NOT _pg_fencing.preloaded() THEN
        RETURN format('Citus table %s is fenced by pg_fencing''s hooks, and this backend did not preload the library', relation);
    END IF;
    RETURN NULL;
END
$fn$;

-- The Citus shape's objects on relation (marker constraints, the token column's default), once its
-- protection is removed (from fencing_unprotect, after _pg_fencing.unregister).
CREATE FUNCTION _pg_fencing.unprotect_citus(relation regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    con name;
    col name;
BEGIN
    FOR con IN SELECT c.conname FROM pg_constraint c
               WHERE c.conrelid = relation AND c.conname LIKE 'zz\_pg\_fencing\_citus\_%' LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', relation, con);
    END LOOP;
    FOR col IN SELECT a.attname FROM pg_attrdef d JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
               WHERE d.adrelid = relation AND pg_get_expr(d.adbin, d.adrelid) ~ '^_pg_fencing\.citus_stamp\(' LOOP
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP DEFAULT', relation, col);
    END LOOP;
END
$fn$;

CREATE OR REPLACE FUNCTION @extschema@.fencing_protect(relation regclass, resource text DEFAULT NULL,
                                            token_column name DEFAULT 'fence_token')
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    rel record;
    pk name[];
    col_type oid;
    pid bigint;
    part regclass;
    args text;
    prev record;
    carried bigint;
    prev_max bigint;
    shape text := 'row-trigger';
    own_default text;
    old record;
    moved bigint[];
    replaced regclass[];
    citus_kind text;
BEGIN
    IF relation IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'relation must not be NULL';
    END IF;
    IF resource = '' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'resource must be NULL (per-row mode) or a non-empty name',
            HINT = 'Pass the name of the lock that guards the table, e.g. ''settlement''.';
    END IF;
    IF token_column IS NULL OR token_column = '' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'token_column must be a column name';
    END IF;
    SELECT c.relkind, c.relowner, c.relpersistence INTO rel FROM pg_catalog.pg_class c WHERE c.oid = relation;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '42P01', MESSAGE = format('relation with OID %s does not exist', relation::oid);
    END IF;
    IF rel.relkind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION USING ERRCODE = '42809', MESSAGE = format('%s is not a table', relation),
            HINT = 'fencing_protect accepts plain and partitioned tables.';
    END IF;
    -- A table Citus manages: hash-distributed and reference tables get the Citus shape in resource
    -- mode (docs/citus.md; _pg_fencing.protect_citus); every other kind, and per-row mode, is
    -- refused rather than left half protected.
    citus_kind := _pg_fencing.citus_kind(relation);
    IF citus_kind IS NOT NULL THEN
        PERFORM _pg_fencing.protect_citus(relation, resource, token_column, citus_kind);
        RETURN;
    END IF;
    IF rel.relpersistence = 't' THEN
        -- A temporary table is dropped at session end without the DDL event triggers, which
        -- would leave its protection behind for a later table with the same OID.
        RAISE EXCEPTION USING ERRCODE = '42809', MESSAGE = format('%s is a temporary table', relation),
            HINT = 'Protect a permanent table; a temporary one lives for one session only.';
    END IF;
    IF resource IS NULL AND rel.relpersistence = 'u' THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = format('per-row protected table %s cannot be UNLOGGED', relation),
            DETAIL = 'A crash empties an unlogged table, and with it the row tokens that fence its keys.',
            HINT = 'Make it logged (ALTER TABLE ... SET LOGGED), or protect it in resource mode.';
    END IF;
    IF pg_catalog.pg_partition_root(relation) <> relation THEN
        RAISE EXCEPTION USING ERRCODE = '42809',
            MESSAGE = format('%s is a partition; protect its root table %s', relation, pg_catalog.pg_partition_root(relation));
    END IF;
    IF NOT pg_catalog.pg_has_role(current_user, rel.relowner, 'USAGE') THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format('must be owner of table %s', relation);
    END IF;
    -- The table's lock first (its partitions with it), before the protection's row: a
    -- fencing_prune_tombstones waiting for the table's writers then runs first, and this waits
    -- for it, instead of holding the row it updates (which ended in a deadlock, 40P01).
    EXECUTE format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE', relation);

    SELECT array_agg(a.attname ORDER BY k.ord) INTO pk
    FROM pg_catalog.pg_index i
    CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
    JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
    WHERE i.indrelid = relation AND i.indisprimary;
    IF resource IS NULL AND pk IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '42P16', MESSAGE = format('table %s has no primary key', relation),
            DETAIL = 'Per-row mode fences each row by its primary key.',
            HINT = 'Add a primary key, or protect the table in resource mode: fencing_protect(table, ''resource-name'').';
    END IF;
    IF resource IS NULL AND EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                                    WHERE i.indrelid = relation AND i.indisprimary AND NOT i.indimmediate) THEN
        RAISE EXCEPTION USING ERRCODE = '42P16',
            MESSAGE = format('the primary key of %s is DEFERRABLE', relation),
            DETAIL = 'Per-row mode relies on the primary key being checked when each row is written.',
            HINT = 'Make the primary key NOT DEFERRABLE, or protect the table in resource mode.';
    END IF;
    IF resource IS NULL AND _pg_fencing.key_without_overlaps(relation) THEN
        RAISE EXCEPTION USING ERRCODE = '42P16',
            MESSAGE = format('the primary key of %s has WITHOUT OVERLAPS', relation),
            DETAIL = 'Such a primary key treats overlapping ranges as the same key without calling them equal; a tombstone fences only the keys the primary key calls equal, so a stale writer could re-insert an overlapping key (docs/guarantees.md, "Per-row mode").',
            HINT = 'Protect the table in resource mode: fencing_protect(table, ''resource-name'').';
    END IF;
    IF resource IS NULL AND EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                                    WHERE a.attrelid = relation AND a.attname = ANY (pk) AND a.attgenerated <> '') THEN
        RAISE EXCEPTION USING ERRCODE = '42P16',
            MESSAGE = format('the primary key of %s contains a generated column', relation),
            DETAIL = 'Per-row mode identifies a row by its primary key before generated columns are computed.',
            HINT = 'Protect the table in resource mode, or use a primary key without generated columns.';
    END IF;
    IF token_column = ANY (pk) THEN
        RAISE EXCEPTION USING ERRCODE = '42P16',
            MESSAGE = format('token column %I is part of the primary key of %s', token_column, relation);
    END IF;

    IF rel.relkind = 'r' AND EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i WHERE i.inhparent = relation) THEN
        RAISE EXCEPTION USING ERRCODE = '42809',
            MESSAGE = format('%s has inheritance children', relation),
            DETAIL = 'Writes through the parent to rows of its children would not be fenced.',
            HINT = 'Use declarative partitioning, or protect each table on its own.';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a WHERE a.attrelid = relation AND a.attname = token_column
               AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated <> '') THEN
        RAISE EXCEPTION USING ERRCODE = '42P16',
            MESSAGE = format('token column %I of %s is a generated column', token_column, relation),
            HINT = 'pg_fencing stamps the token column itself; use a plain bigint column.';
    END IF;
    SELECT a.atttypid INTO col_type FROM pg_catalog.pg_attribute a
    WHERE a.attrelid = relation AND a.attname = token_column AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        EXECUTE format('ALTER TABLE %s ADD COLUMN %I bigint', relation, token_column);
    ELSIF col_type <> 'pg_catalog.int8'::pg_catalog.regtype THEN
        RAISE EXCEPTION USING ERRCODE = '42804',
            MESSAGE = format('token column %I of %s has type %s, not bigint', token_column, relation, col_type::pg_catalog.regtype);
    END IF;

    -- Switching a protection to another resource, the other mode or another token column carries
    -- the fence: everything the old protection fenced with (its resource's mark, the rows' tokens
    -- in its token column, its tombstones and tombstone floor) becomes the lowest token the new
    -- one accepts (the new resource's mark, or in per-row mode the tombstone floor, which keys
    -- without a tombstone must meet). Without this, 90 was accepted on rows stamped 100.
    SELECT pt.id, pt.resource, pt.token_column, pt.tombstone_floor INTO prev
    FROM _pg_fencing.protected_table pt WHERE pt.relid = relation;
    IF FOUND AND (prev.resource IS DISTINCT FROM resource OR prev.token_column <> token_column) THEN
        IF resource IS NULL AND prev.resource IS NULL AND prev.token_column <> token_column
           AND EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a WHERE a.attrelid = relation AND a.attname = prev.token_column
                       AND a.attnum > 0 AND NOT a.attisdropped) THEN
            -- The rows' marks are the old column's values; a new column would start empty.
            RAISE EXCEPTION USING ERRCODE = '55000',
                MESSAGE = format('per-row protected table %s keeps its token column %I', relation, prev.token_column),
                DETAIL = 'Its values are the rows'' high-water marks; another token column would start without them.',
                HINT = 'Keep the token column, or fencing_unprotect the table first (its rows'' marks are then given up).';
        END IF;
        carried := prev.tombstone_floor;
        IF prev.resource IS NOT NULL THEN
            carried := greatest(carried, @extschema@.fencing_high_water(prev.resource));
        END IF;
        carried := greatest(carried, (SELECT max(rt.high_water) FROM _pg_fencing.row_tombstone rt
                                      WHERE rt.protection_id = prev.id),
                            (SELECT max(tr.high_water) FROM _pg_fencing.tombstone_run tr
                             WHERE tr.protection_id = prev.id));
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a WHERE a.attrelid = relation AND a.attname = prev.token_column
                   AND a.attnum > 0 AND NOT a.attisdropped AND a.atttypid = 'pg_catalog.int8'::pg_catalog.regtype) THEN
            EXECUTE format('SELECT max(%I) FROM %s', prev.token_column, relation) INTO prev_max;
            carried := greatest(carried, prev_max);
        END IF;
    END IF;
    -- Tables protected on their own and then attached as partitions of this one (their
    -- protections are inactive, see inactive_reason): this protection carries their fences, and
    -- replaces them. Per-row keys of the same form keep their own tombstones (moved to this
    -- protection below); anything else (a resource's mark, a tombstone floor, tombstones of
    -- another key form, the rows' tokens in another token column) becomes the lowest token this
    -- one accepts, as for a switch of mode or resource above.
    FOR old IN SELECT pt.id, pt.relid, pt.resource, pt.token_column, pt.tombstone_floor
               FROM _pg_fencing.protected_table pt
               WHERE pt.relid <> relation AND pt.relid IN (SELECT t.relid FROM _pg_fencing.tree(relation) t)
               ORDER BY pt.id LOOP
        carried := greatest(carried, old.tombstone_floor);
        IF old.resource IS NOT NULL THEN
            carried := greatest(carried, @extschema@.fencing_high_water(old.resource));
        END IF;
        IF resource IS NOT NULL OR old.resource IS NOT NULL
           OR _pg_fencing.tombstone_key_signature(old.relid) IS DISTINCT FROM _pg_fencing.tombstone_key_signature(relation) THEN
            carried := greatest(carried, (SELECT max(rt.high_water) FROM _pg_fencing.row_tombstone rt
                                          WHERE rt.protection_id = old.id),
                                (SELECT max(tr.high_water) FROM _pg_fencing.tombstone_run tr
                                 WHERE tr.protection_id = old.id));
        ELSE
            moved := array_append(moved, old.id);
        END IF;
        IF old.token_column <> token_column
           AND EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a WHERE a.attrelid = old.relid AND a.attname = old.token_column
                       AND a.attnum > 0 AND NOT a.attisdropped AND a.atttypid = 'pg_catalog.int8'::pg_catalog.regtype) THEN
            EXECUTE format('SELECT max(%I) FROM %s', old.token_column, old.relid) INTO prev_max;
            carried := greatest(carried, prev_max);
        END IF;
        replaced := array_append(replaced, old.relid);
    END LOOP;
    pid := _pg_fencing.register(relation, resource, token_column::text);
    IF replaced IS NOT NULL THEN
        -- The moved tombstones keep their keys' text (the same key form); their hashes follow
        -- this table's key (rehash_tombstones below). Their runs become rows first.
        PERFORM _pg_fencing.expand_tombstone_runs(m) FROM unnest(moved) m;
        INSERT INTO _pg_fencing.row_tombstone AS h (protection_id, key, high_water)
        SELECT pid, rt.key, max(rt.high_water) FROM _pg_fencing.row_tombstone rt
        WHERE rt.protection_id = ANY (moved) GROUP BY rt.key
        ON CONFLICT (protection_id, key) DO UPDATE SET high_water = GREATEST(h.high_water, excluded.high_water);
        DELETE FROM _pg_fencing.row_tombstone rt
        WHERE rt.protection_id IN (SELECT pt.id FROM _pg_fencing.protected_table pt WHERE pt.relid = ANY (replaced));
        DELETE FROM _pg_fencing.tombstone_chunk tc
        WHERE tc.protection_id IN (SELECT pt.id FROM _pg_fencing.protected_table pt WHERE pt.relid = ANY (replaced));
        DELETE FROM _pg_fencing.tombstone_run tr
        WHERE tr.protection_id IN (SELECT pt.id FROM _pg_fencing.protected_table pt WHERE pt.relid = ANY (replaced));
        DELETE FROM _pg_fencing.protected_table pt WHERE pt.relid = ANY (replaced);
        RAISE NOTICE 'pg_fencing: the protection of % replaces that of %, now its partitions, and carries their fence', relation,
            array_to_string(replaced::text[], ', ');
    END IF;
    -- Firing modes first (partitions before their parents), so that no ALTER TABLE below meets
    -- a trigger of this protection that a restore left disabled.
    FOR part IN SELECT x.relid FROM (SELECT relation AS relid, 0 AS level
                                     UNION SELECT pt.relid, pt.level FROM pg_catalog.pg_partition_tree(relation) pt) x
                ORDER BY x.level DESC LOOP
        PERFORM _pg_fencing.repair_firing_modes(part);
    END LOOP;
    args := format('%L, %L, %L', pid, coalesce(resource, ''), token_column);

    -- The shape (docs/design.md, "The set-based shape"): set-based (no BEFORE INSERT row trigger,
    -- so that COPY keeps its multi-row inserts; COPY and INSERT are checked once per statement by
    -- the hooks of the preloaded library) where this backend preloaded the library and
    -- pg_fencing.set_based_shape is on, for a plain table whose token column has no default of
    -- its own and that has no other BEFORE INSERT row trigger (it would run after the stamp), in
    -- per-row mode with a key identified by its text; else the row-trigger shape.
    own_default := '_pg_fencing.stamp_default()';
    IF _pg_fencing.preloaded() AND current_setting('pg_fencing.set_based_shape', true) = 'on' AND rel.relkind = 'r'
       AND coalesce((SELECT pg_catalog.pg_get_expr(d.adbin, d.adrelid) FROM pg_catalog.pg_attrdef d
                     JOIN pg_catalog.pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
                     WHERE d.adrelid = relation AND a.attname = token_column), own_default) = own_default
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger tg WHERE tg.tgrelid = relation AND tg.tgtype::int & 71 = 7
                       AND NOT (tg.tgname LIKE 'zz\_pg\_fencing\_%' AND tg.tgfoid = '@extschema@.fencing_guard()'::regprocedure))
       AND (resource IS NOT NULL OR coalesce(_pg_fencing.tombstone_key_signature(relation), '') !~ '^hash') THEN
        shape := 'set-based';
    END IF;
    -- Row triggers on a partitioned table are cloned to its partitions, present and future.
    -- They are named to sort after triggers with ordinary names (BEFORE triggers fire in name order).
    EXECUTE format('CREATE OR REPLACE TRIGGER zz_pg_fencing_guard BEFORE %s ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION @extschema@.fencing_guard(%s)',
                   CASE shape WHEN 'set-based' THEN 'UPDATE OR DELETE' ELSE 'INSERT OR UPDATE OR DELETE' END, relation, args);
    -- AFTER INSERT: resource mode stores a raised mark once a row really was inserted (not for
    -- ON CONFLICT DO NOTHING); per-row mode checks the key's tombstone once the row is in the
    -- unique index. Per-row mode also re-checks a key that an UPDATE changed. The set-based
    -- shape's skips the rows of a COPY that pg_fencing admitted, which it checks itself.
    EXECUTE format('CREATE OR REPLACE TRIGGER zz_pg_fencing_after AFTER INSERT ON %s FOR EACH ROW %s'
                   'EXECUTE FUNCTION @extschema@.fencing_guard(%s)', relation,
                   CASE shape WHEN 'set-based' THEN format('WHEN (_pg_fencing.insert_check_due(%L::bigint)) ', pid) ELSE '' END, args);
    -- Logical replication applies changes in replica mode, where the triggers above do not
    -- fire: this one fires only there, and records what is applied instead of refusing it (in
    -- the set-based shape AFTER the row is written: a BEFORE INSERT row trigger, even one that
    -- fires in replica mode only, would cost COPY its multi-row inserts).
    EXECUTE format('CREATE OR REPLACE TRIGGER zz_pg_fencing_replica %s INSERT OR UPDATE OR DELETE ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION @extschema@.fencing_guard(%s)',
                   CASE shape WHEN 'set-based' THEN 'AFTER' ELSE 'BEFORE' END, relation, args);
    EXECUTE format('ALTER TABLE %s ENABLE REPLICA TRIGGER zz_pg_fencing_replica', relation);
    IF resource IS NULL THEN
        PERFORM _pg_fencing.set_rekey_trigger(relation, pid, token_column);
        PERFORM _pg_fencing.rehash_tombstones(pid, relation);
        IF _pg_fencing.tombstone_key_signature(relation) ~ '^hash' AND _pg_fencing.tombstone_key_signature(relation) !~ ':(32|64|citext)( |$)' THEN
            RAISE WARNING 'pg_fencing: no column of the primary key of % has hash support that agrees with its comparison', relation
                USING DETAIL = 'A new key is compared with every tombstone of the table: inserts slow down as tombstones accumulate.',
                      HINT = 'Prune its tombstones (fencing_prune_tombstones, fencing_tombstone_retention), or key it by a type with hash support.';
        END IF;
    ELSE
        PERFORM _pg_fencing.drop_trigger(relation, 'zz_pg_fencing_rekey');
    END IF;
    -- Statement triggers are not cloned: every member of the partition tree gets its own.
    FOR part IN SELECT t.relid FROM _pg_fencing.tree(relation) t LOOP
        PERFORM _pg_fencing.add_statement_triggers(part, pid, resource, token_column);
        PERFORM _pg_fencing.repair_firing_modes(part);
    END LOOP;
    -- The set-based shape: the token column's default stamps a COPY's rows, and (per-row mode;
    -- resource mode has it already) a statement trigger refuses an INSERT or COPY that no hook
    -- admitted. The row-trigger shape drops that default.
    IF shape = 'set-based' THEN
        IF resource IS NULL THEN
            EXECUTE format('CREATE OR REPLACE TRIGGER zz_pg_fencing_stmt BEFORE INSERT ON %s '
                           'FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.fencing_guard(%s)', relation, args);
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attrdef d JOIN pg_catalog.pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
                       WHERE d.adrelid = relation AND a.attname = token_column
                         AND pg_catalog.pg_get_expr(d.adbin, d.adrelid) = own_default) THEN
            EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET DEFAULT %s', relation, token_column, own_default);
        END IF;
    END IF;
    PERFORM _pg_fencing.drop_own_default(relation, CASE shape WHEN 'set-based' THEN token_column END);
    IF carried IS NOT NULL THEN
        IF resource IS NOT NULL THEN
            IF coalesce(@extschema@.fencing_high_water(resource), 0) < carried THEN
                PERFORM @extschema@.fencing_advance(resource, carried);
            END IF;
        ELSE
            PERFORM @extschema@.fencing_prune_tombstones(relation, carried, 0);
        END IF;
        RAISE NOTICE 'pg_fencing: the protection of % carries the old one''s fence: % accepts tokens from % on', relation,
            CASE WHEN resource IS NULL THEN 'every key without a newer tombstone' ELSE format('resource %L', resource) END, carried;
    END IF;
    -- Publications of this table carry pg_fencing's own tables along (publish_feeds).
    PERFORM _pg_fencing.publish_feeds(pr.prpubid) FROM pg_catalog.pg_publication_rel pr
    WHERE pr.prrelid IN (SELECT t.relid FROM _pg_fencing.tree(relation) t);
    PERFORM _pg_fencing.publish_feeds(pn.pnpubid) FROM pg_catalog.pg_publication_namespace pn
    WHERE pn.pnnspid IN (SELECT c.relnamespace FROM pg_catalog.pg_class c
                         WHERE c.oid IN (SELECT t.relid FROM _pg_fencing.tree(relation) t));
END
$fn$;

CREATE OR REPLACE FUNCTION @extschema@.fencing_unprotect(relation regclass) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    part regclass;
BEGIN
    IF NOT _pg_fencing.unregister(relation) THEN
        RAISE NOTICE 'table % was not protected', relation;
    END IF;
    PERFORM _pg_fencing.drop_trigger(relation, 'zz_pg_fencing_guard');
    PERFORM _pg_fencing.drop_trigger(relation, 'zz_pg_fencing_after');
    PERFORM _pg_fencing.drop_trigger(relation, 'zz_pg_fencing_rekey');
    PERFORM _pg_fencing.drop_trigger(relation, 'zz_pg_fencing_replica');
    PERFORM _pg_fencing.drop_own_default(relation, NULL);
    PERFORM _pg_fencing.unprotect_citus(relation);
    FOR part IN SELECT t.relid FROM _pg_fencing.tree(relation) t LOOP
        PERFORM _pg_fencing.drop_trigger(part, 'zz_pg_fencing_truncate');
        PERFORM _pg_fencing.drop_trigger(part, 'zz_pg_fencing_stmt');
    END LOOP;
END
$fn$;

-- Citus's functions that distribute a table or re-create it under its name
-- (create_distributed_table, create_reference_table, citus_add_local_table_to_metadata,
-- alter_distributed_table, alter_table_set_access_method, undistribute_table; docs/citus.md,
-- "Distributing a protected table"): Citus refuses a table with triggers, and re-creates a
-- table without knowing its protection. The executor hook (src/guard/citus.rs) calls this, as
-- the calling role, when such a call of fn on relation starts: relation's protection is removed
-- (fencing_unprotect: the resource's high-water mark stays) and its qualified name, resource and
-- token column returned, for citus_table_call_ends to protect the table again, in the shape of
-- what Citus made of it, in the same statement. The DDL's locks (AccessExclusive on relation)
-- hold to the end of the transaction, and an error anywhere in between rolls both back, so no
-- other transaction sees the table unprotected. NULL: relation is not protected.
-- Errors: 0A000 a table in per-row mode (Citus tables are protected in resource mode), or
-- create_distributed_table_concurrently (it commits in several transactions).
CREATE FUNCTION _pg_fencing.citus_table_call_begins(relation regclass, fn text) RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    p record;
BEGIN
    SELECT t.resource, t.token_column::text AS token_column,
           format('%I.%I', n.nspname, c.relname) AS name INTO p
    FROM _pg_fencing.protected_table t
    JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.relid
    JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
    WHERE t.relid OPERATOR(pg_catalog.=) relation;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF fn = 'create_distributed_table_concurrently' THEN
        RAISE EXCEPTION USING ERRCODE = '0A000',
            MESSAGE = format('%s cannot distribute protected table %s', fn, relation),
            DETAIL = 'It commits in several transactions, between which the table would not be protected.',
            HINT = 'Use create_distributed_table, which keeps the protection; docs/citus.md.';
    END IF;
    IF p.resource IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '0A000',
            MESSAGE = format('%s cannot take table %s, which is protected in per-row mode', fn, relation),
            DETAIL = 'pg_fencing protects Citus tables in resource mode only.',
            HINT = 'Protect it in resource mode first (fencing_protect(table, ''resource-name'')), or fencing_unprotect it; docs/citus.md.';
    END IF;
    PERFORM @extschema@.fencing_unprotect(relation);
    RETURN ARRAY[p.name, p.resource, p.token_column];
END
$fn$;

-- After such a call (citus_table_call_begins returned call): protect the table of that name again
-- with its resource and token column, in the shape of what Citus made of it (fencing_protect).
-- Errors: 55000 no table of that name is left; fencing_protect's own (0A000 for a kind of Citus
-- table pg_fencing does not protect), which roll the call back with the protection.
CREATE FUNCTION _pg_fencing.citus_table_call_ends(call text[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    relation regclass := pg_catalog.to_regclass(call[1]);
BEGIN
    IF relation IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('protected table %s is gone after a Citus function re-created it', call[1]),
            DETAIL = 'pg_fencing protects the table Citus leaves under the same name; there is none, so the call is rolled back.';
    END IF;
    PERFORM @extschema@.fencing_protect(relation, call[2], call[3]::name);
END
$fn$;

-- Tables protected before 0.2.0 get the REPLICA trigger (a partitioned table's clones with it).
DO $do$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT pt.id, pt.relid, pt.resource, pt.token_column FROM _pg_fencing.protected_table pt
             WHERE pt.protected AND EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = pt.relid) LOOP
        EXECUTE format('CREATE OR REPLACE TRIGGER zz_pg_fencing_replica BEFORE INSERT OR UPDATE OR DELETE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION @extschema@.fencing_guard(%L, %L, %L)',
                       p.relid, p.id, coalesce(p.resource, ''), p.token_column);
        EXECUTE format('ALTER TABLE %s ENABLE REPLICA TRIGGER zz_pg_fencing_replica', p.relid);
    END LOOP;
END
$do$;

-- The DDL event trigger also follows CREATE TRIGGER and DROP TRIGGER (the form of
-- zz_pg_fencing_rekey depends on the other BEFORE UPDATE row triggers).
DROP EVENT TRIGGER pg_fencing_ddl_end;
CREATE EVENT TRIGGER pg_fencing_ddl_end ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE', 'CREATE SCHEMA', 'CREATE TRIGGER', 'DROP TRIGGER',
                 'ALTER COLLATION')
    EXECUTE FUNCTION _pg_fencing.on_ddl_end();

-- Per-row protections made before 0.2.0 get the cheap form of zz_pg_fencing_rekey where no other
-- BEFORE UPDATE row trigger could change a key unseen.
DO $do$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT pt.id, pt.relid, pt.token_column FROM _pg_fencing.protected_table pt
             WHERE pt.protected AND pt.resource IS NULL
               AND EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = pt.relid) LOOP
        PERFORM _pg_fencing.set_rekey_trigger(p.relid, p.id, p.token_column);
    END LOOP;
END
$do$;

-- Tombstones of 0.1.0 were matched by text: hash the keys of the tables that need it.
SELECT _pg_fencing.rehash_tombstones(pt.id, pt.relid) FROM _pg_fencing.protected_table pt
WHERE pt.resource IS NULL AND EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = pt.relid);

-- Every change of a stored mark takes the resource's exclusive lock and bumps the mark's version
-- in shared memory first, so that a backend may keep a mark it read under the resource's lock for
-- as long as the version is unchanged (src/state/mark_versions.rs). It fires ALWAYS: also for
-- logical replication's apply and for writes by hand.
CREATE FUNCTION _pg_fencing.mark_changed() RETURNS trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'pg_fencing_mark_changed';
CREATE TRIGGER pg_fencing_mark_changed BEFORE INSERT OR UPDATE OR DELETE ON _pg_fencing.resource_high_water
    FOR EACH ROW EXECUTE FUNCTION _pg_fencing.mark_changed();
ALTER TABLE _pg_fencing.resource_high_water ENABLE ALWAYS TRIGGER pg_fencing_mark_changed;

-- The UPDATE fast path (src/guard/fast_path.rs): the planner puts one of these in the SET list of
-- a plain UPDATE of a protected table instead of firing the guard's row and statement triggers.
-- Anyone who may UPDATE the table may call them (a call checks that its constants name the
-- table's protection and that the caller may update it); they only check a token and return it.
CREATE FUNCTION _pg_fencing.stamp_row(old_token bigint, relation oid, protection bigint, token_column text, VARIADIC key "any")
RETURNS bigint LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'pg_fencing_stamp_row';
COMMENT ON FUNCTION _pg_fencing.stamp_row(bigint, oid, bigint, text, "any") IS
'Internal (UPDATE fast path, per-row mode): checks the session''s pg_fencing.token against a row''s token old_token (a bigint, NULL for a row never stamped) and returns the token to stamp. Arguments: the table''s OID, its protection id and token column as fencing_protect recorded them, then the row''s primary key columns (printed in messages). Errors: FT001 token below old_token; FT002 no token; FT003 the token''s lock was lost; 42501 the constants do not name the table''s protection, or the caller may not UPDATE the table.';
CREATE FUNCTION _pg_fencing.stamp_resource(old_token bigint, relation oid, protection bigint, resource text, token_column text)
RETURNS bigint LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'pg_fencing_stamp_resource';
COMMENT ON FUNCTION _pg_fencing.stamp_resource(bigint, oid, bigint, text, text) IS
'Internal (UPDATE fast path, resource mode): admits one written row with the session''s pg_fencing.token against the resource''s high-water mark (raising it in this transaction when the token is higher) and returns the token to stamp. Errors: FT001 token below the mark; FT002 no token; FT003 lock lost; FT006 refused by a watch in verify mode; 42501 as for stamp_row.';
CREATE FUNCTION _pg_fencing.drop_row(old_token bigint, relation oid, protection bigint, token_column text, row_table oid, row_id tid, VARIADIC key "any")
RETURNS bigint LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'pg_fencing_drop_row';
COMMENT ON FUNCTION _pg_fencing.drop_row(bigint, oid, bigint, text, oid, tid, "any") IS
'Internal (DELETE fast path, per-row mode; a junk column the planner gives a DELETE without RETURNING, evaluated on each row version handed to the DELETE before it deletes it): checks the session''s pg_fencing.token against the row''s token old_token (a bigint, NULL for a row never stamped); row_table and row_id are the version''s table (a partition''s own) and ctid: the key''s tombstone is left once the statement''s row count (or, when that cannot tell, the version itself) shows the DELETE deleted that version; called by hand, at once. Returns the token. Other arguments as for stamp_row. Errors: FT001 token below old_token; FT002 no token; FT003 the token''s lock was lost; FT004 the protection is not active; 42501 the constants do not name the table''s protection, or the caller may not DELETE from the table.';
CREATE FUNCTION _pg_fencing.insert_row(new_token bigint, relation oid, protection bigint, token_column text, VARIADIC key "any")
RETURNS bigint LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'pg_fencing_insert_row';
COMMENT ON FUNCTION _pg_fencing.insert_row(bigint, oid, bigint, text, "any") IS
'Internal (INSERT fast path, per-row mode; the RETURNING list the planner gives an INSERT without one, whose rows are not returned): evaluated for each row inserted, once it is in the unique index; new_token is the token stamped into it. Keys identified by text are noted and checked against their tombstones when the statement finished, all at once when every row''s token is at least the protection''s highest tombstone and its tombstone floor; other keys are checked at once. Arguments as for stamp_row. Errors: FT001 token below the key''s tombstone (or the tombstone floor); FT004 the protection is not active; 42501 the constants do not name the table''s protection, or the caller may not INSERT into the table.';
CREATE FUNCTION _pg_fencing.stamp_insert(value bigint, relation oid, protection bigint, resource text, token_column text)
RETURNS bigint LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'pg_fencing_stamp_insert';
COMMENT ON FUNCTION _pg_fencing.stamp_insert(bigint, oid, bigint, text, text) IS
'Internal (INSERT fast path; the value the planner gives an INSERT''s token column): returns the session''s pg_fencing.token to stamp into the new row, admitted against the resource''s high-water mark in resource mode (resource empty for per-row mode, where insert_row or the AFTER INSERT trigger checks the key''s tombstone); in replica mode returns value, what the statement gave the column. Errors: FT001 token below the mark; FT002 no token; FT003 the token''s lock was lost; FT004 the protection is not active; FT006 refused by a watch in verify mode; 42501 the constants do not name the table''s protection, or the caller may not INSERT into the table.';
CREATE FUNCTION _pg_fencing.stamp_insert_key(value bigint, relation oid, protection bigint, token_column text, VARIADIC key "any")
RETURNS bigint LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'pg_fencing_stamp_insert_key';
COMMENT ON FUNCTION _pg_fencing.stamp_insert_key(bigint, oid, bigint, text, "any") IS
'Internal (INSERT fast path, per-row mode, an INSERT of one row whose key the statement gives by constants, parameters and PostgreSQL''s own immutable functions: the value the planner gives its token column; key is those expressions again): returns the session''s pg_fencing.token to stamp into the new row and notes the key with it, checked against its tombstone when the statement finished (once the row is in the unique index); in replica mode returns value. Errors: FT001 (when the statement finished) the key has a tombstone above the token; FT002 no token; FT003 the token''s lock was lost; FT004 the protection is not active; FT006 refused by a watch in verify mode; 42501 the constants do not name the table''s protection, or the caller may not INSERT into the table; 39P01 the statement was planned for another key identity (run it again).';

-- A publication of a protected table carries pg_fencing's own tables along: the publisher's marks
-- and tombstones that no row carries (fencing_advance, the token of a DELETE or TRUNCATE) reach a
-- subscriber only through them, and without them the subscriber's protection is inactive and
-- refuses local writes (FT004). CREATE/ALTER PUBLICATION and fencing_protect add them, so the
-- natural setup (CREATE PUBLICATION p FOR TABLE t) needs no internal table named; dropping them
-- from a publication that still publishes a protected table adds them back.
CREATE FUNCTION _pg_fencing.publish_feeds(publication oid) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    pub_name name;
    missing text;
BEGIN
    SELECT p.pubname INTO pub_name FROM pg_publication p WHERE p.oid = publication AND NOT p.puballtables;
    IF NOT FOUND OR NOT EXISTS (
        SELECT 1 FROM pg_publication_tables pt
        JOIN _pg_fencing.protected_table p
          ON pg_catalog.format('%I.%I', pt.schemaname, pt.tablename)::regclass IN (SELECT t.relid FROM _pg_fencing.tree(p.relid) t)
        WHERE pt.pubname = pub_name AND p.protected) THEN
        RETURN;
    END IF;
    SELECT string_agg(format('_pg_fencing.%I', t), ', ') INTO missing
    FROM unnest(ARRAY['resource_high_water', 'tombstone_feed']) t
    WHERE NOT EXISTS (SELECT 1 FROM pg_publication_tables pt
                      WHERE pt.pubname = pub_name AND pt.schemaname = '_pg_fencing' AND pt.tablename = t);
    -- Only what the caller could do itself (docs/security.md): this function runs as the
    -- extension's owner, so the login role (session_user: SET ROLE cannot give it more) must own
    -- the publication or be a superuser. Otherwise the publication stays as it is, and its
    -- subscribers refuse writes to the protected tables it publishes (FT004) until its owner adds
    -- the tables (or runs any ALTER PUBLICATION, whose event trigger calls this again).
    IF missing IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM pg_roles r, pg_publication p
        WHERE r.rolname = session_user AND p.oid = publication
          AND (r.rolsuper OR pg_has_role(r.oid, p.pubowner, 'USAGE'))) THEN
        RAISE WARNING 'pg_fencing: publication % of another owner does not publish %', pub_name, missing
            USING DETAIL = 'Its subscribers refuse writes to the protected tables it publishes (FT004) until it does.',
                  HINT = format('Its owner runs ALTER PUBLICATION %I ADD TABLE %s.', pub_name, missing);
        RETURN;
    END IF;
    IF missing IS NOT NULL THEN
        EXECUTE format('ALTER PUBLICATION %I ADD TABLE %s', pub_name, missing);
        RAISE NOTICE 'pg_fencing: publication % now also publishes %', pub_name, missing
            USING DETAIL = 'A subscriber needs them to keep the publisher''s marks and tombstones (docs/guarantees.md, "Lifecycle paths": logical replication).';
    END IF;
END
$fn$;

CREATE FUNCTION _pg_fencing.on_publication_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    p oid;
BEGIN
    -- ALTER PUBLICATION ... DROP TABLE collects no command to look at: check every publication
    -- (they are few, and publish_feeds returns at once for those without a protected table).
    FOR p IN SELECT pb.oid FROM pg_publication pb WHERE NOT pb.puballtables LOOP
        PERFORM _pg_fencing.publish_feeds(p);
    END LOOP;
    -- The feed, if now published, gets the tombstones and floors written while it was not
    -- (a subscription's initial copy brings them).
    PERFORM _pg_fencing.fill_feed();
END
$fn$;
CREATE EVENT TRIGGER pg_fencing_publication ON ddl_command_end
    WHEN TAG IN ('CREATE PUBLICATION', 'ALTER PUBLICATION')
    EXECUTE FUNCTION _pg_fencing.on_publication_ddl();

-- Commands read before they run (ddl_command_start), from their parse trees (src/api/functions.rs,
-- pg_fencing_ddl_start; names resolved as the command resolves them):
--   * DROP EXTENSION pg_fencing (also CASCADE), DROP SCHEMA of its schema with CASCADE and DROP
--     OWNED BY its owner would delete every mark and tombstone: refused while any table is
--     protected (2BP01). fencing_unprotect each table first (its marks and tombstones are then
--     given up on purpose).
--   * DROP TABLE, DROP SCHEMA and DROP OWNED BY that drop partitions of a per-row protected table
--     raise its tombstone floor first (_pg_fencing.before_drop).
--   * ALTER TABLE ... ALTER COLUMN ... TYPE of a protection's token column is refused
--     (_pg_fencing.before_retype), also to the same type, whose USING clause rewrites the marks.
--   * Any other command that would drop the extension's tables, or a partition of a per-row
--     protected table (a cascade from another object: DROP EXTENSION plpgsql CASCADE, DROP ACCESS
--     METHOD ... CASCADE), is refused by the library's object access hook (2BP01, 55000).
CREATE FUNCTION _pg_fencing.on_ddl_start() RETURNS event_trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'pg_fencing_ddl_start';
-- It fires for every DDL command: calling it loads the library, whose object access hook then
-- sees every relation the command drops, also by a cascade from another object (src/api/hooks.rs).
CREATE EVENT TRIGGER pg_fencing_ddl_start ON ddl_command_start
    EXECUTE FUNCTION _pg_fencing.on_ddl_start();

-- A partition of a per-row protected table that is dropped takes its rows, and the tokens that
-- are their keys' marks, with it; a later partition for the same keys would admit them again
-- below those marks. Before such a DROP (kind 'table': these tables; 'schema': the tables in these
-- schemas; 'owner': the tables of these roles; a partition goes with each ancestor), the
-- protection's tombstone floor is raised to the highest token of the partitions' rows
-- (fencing_prune_tombstones), read after the tree's writes in flight have committed: one scan of
-- their token column. Protections whose table is dropped itself are left alone (they go with
-- it). Returns the partitions it accounted for (comma-separated OIDs): a partition that any other
-- command drops is refused (src/api/hooks.rs, object_access).
CREATE FUNCTION _pg_fencing.before_drop(kind text, objects oid[]) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    p record;
    leaf regclass;
    carried bigint;
    part_max bigint;
    leaves regclass[];
    accounted oid[] := '{}';
BEGIN
    FOR p IN SELECT pt.relid, pt.token_column,
                    CASE kind WHEN 'table' THEN c.oid = ANY (objects)
                              WHEN 'schema' THEN c.relnamespace = ANY (objects)
                              ELSE c.relowner = ANY (objects) END AS whole
             FROM _pg_fencing.protected_table pt
             JOIN pg_class c ON c.oid = pt.relid
             WHERE pt.protected AND pt.resource IS NULL AND c.relkind = 'p' LOOP
        IF p.whole THEN
            accounted := accounted || ARRAY(SELECT t.relid::oid FROM pg_partition_tree(p.relid) t);
            CONTINUE;
        END IF;
        leaves := ARRAY(SELECT t.relid FROM pg_partition_tree(p.relid) t JOIN pg_class c ON c.oid = t.relid
                        WHERE t.isleaf AND c.relkind = 'r'
                          AND EXISTS (SELECT 1 FROM pg_partition_ancestors(t.relid) a
                                      JOIN pg_class ac ON ac.oid = a.relid
                                      WHERE a.relid <> p.relid
                                        AND CASE kind WHEN 'table' THEN ac.oid = ANY (objects)
                                                      WHEN 'schema' THEN ac.relnamespace = ANY (objects)
                                                      ELSE ac.relowner = ANY (objects) END));
        CONTINUE WHEN cardinality(leaves) = 0;
        carried := NULL;
        -- The tree's writes in flight commit first, so that the scan sees their tokens (only a
        -- tree this command drops a partition of is locked).
        EXECUTE format('LOCK TABLE %s IN SHARE MODE', p.relid);
        FOREACH leaf IN ARRAY leaves LOOP
            EXECUTE format('SELECT max(%I) FROM ONLY %s', p.token_column, leaf) INTO part_max;
            carried := greatest(carried, part_max);
            accounted := accounted || leaf::oid;
        END LOOP;
        IF carried IS NOT NULL THEN
            PERFORM @extschema@.fencing_prune_tombstones(p.relid, carried, 0);
            RAISE NOTICE 'pg_fencing: the tombstone floor of % is now at least %, the highest token of the partitions being dropped', p.relid, carried
                USING DETAIL = 'Their keys stay fenced at that floor when they come back in another partition.';
        END IF;
    END LOOP;
    RETURN array_to_string(accounted, ',');
END
$fn$;
REVOKE ALL ON FUNCTION _pg_fencing.before_drop(text, oid[]) FROM PUBLIC;

-- ALTER COLUMN ... TYPE of a protection's token column (relation: the table altered, or one of its
-- partitions): refused (55000) as on_ddl_end refuses the other changes of that column.
CREATE FUNCTION _pg_fencing.before_retype(relation oid, col text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT pt.relid, pt.token_column FROM _pg_fencing.protected_table pt
             WHERE pt.protected AND pt.token_column = col
               AND relation IN (SELECT t.relid FROM _pg_fencing.tree(pt.relid) t) LOOP
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('the token column %I of protected table %s cannot be dropped, renamed, retyped or made generated', p.token_column, p.relid),
            DETAIL = 'Its values are the fencing tokens of the rows'' last writes: the per-row high-water marks. ALTER COLUMN ... TYPE rewrites them, also to the same type.',
            HINT = format('To stop fencing the table, run SELECT fencing_unprotect(%L) first.', p.relid);
    END LOOP;
END
$fn$;
REVOKE ALL ON FUNCTION _pg_fencing.before_retype(oid, text) FROM PUBLIC;

COMMENT ON FUNCTION @extschema@.fencing_protect(regclass, text, name) IS
'Puts a plain or partitioned table under fencing. resource NULL: per-row mode (each row is its own fencing domain, deleted keys keep a tombstone); resource given: resource mode (one high-water mark fences every row). Adds token_column (bigint) if missing. Idempotent. Switching a protected table to another resource, the other mode or (resource mode) another token column carries the fence: the new resource''s mark, or in per-row mode the tombstone floor, starts at the old protection''s highest mark, row token and tombstone. Repairs the firing modes of the protection''s triggers. A publication of the table gets pg_fencing''s own tables added. Errors: 42501 not the owner; 42809 not a table, a partition or a temporary table; 0A000 a Citus table of a kind it does not protect, or per-row mode for a Citus table (docs/citus.md); 55000 pg_fencing not preloaded on every node of a Citus cluster; 42P16 no primary key in per-row mode; 42804 token column not bigint; 22023 empty resource; 55000 another token column for a per-row table, or a per-row table that is UNLOGGED.';

-- Triggers created or replaced on a protected table (also by a role with the TRIGGER privilege
-- only): one named as a trigger of the protection must be the protection's (fencing_guard, with
-- the events and no column list or WHEN clause fencing_protect gives it; zz_pg_fencing_rekey's
-- columns are checked where it is used); another BEFORE row trigger for INSERT or UPDATE must sort
-- before zz_pg_fencing_guard, so that none can change a row after its check (the token it
-- stamped, or the key). Refused (55000), the latter except in a restore (check_function_bodies =
-- off) by the table's owner. Not SECURITY DEFINER: current_user is the role that made the trigger.
CREATE FUNCTION _pg_fencing.on_trigger_ddl() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    trg record;
    restoring boolean := current_setting('check_function_bodies') = 'off';
BEGIN
    FOR trg IN SELECT tg.oid, tg.tgargs, tg.tgrelid::regclass AS rel, tg.tgname, tg.tgfoid, tg.tgtype::int AS tgtype,
                      cardinality(tg.tgattr::int2[]) AS ncols, tg.tgqual IS NOT NULL AS has_when,
                      pg_has_role(current_user, c.relowner, 'USAGE') AS owner
               FROM pg_event_trigger_ddl_commands() d
               JOIN pg_trigger tg ON d.classid = 'pg_catalog.pg_trigger'::regclass AND tg.oid = d.objid
               JOIN pg_class c ON c.oid = tg.tgrelid
               WHERE EXISTS (SELECT 1 FROM _pg_fencing.protected_table pt
                             WHERE pt.protected AND tg.tgrelid IN (SELECT tr.relid FROM _pg_fencing.tree(pt.relid) tr))
    LOOP
        IF trg.tgname LIKE 'zz\_pg\_fencing\_%' THEN
            IF trg.tgfoid <> '@extschema@.fencing_guard()'::regprocedure
               OR trg.tgtype <> ALL (CASE trg.tgname WHEN 'zz_pg_fencing_guard' THEN ARRAY[31, 27] WHEN 'zz_pg_fencing_replica' THEN ARRAY[31, 29]
                                                     WHEN 'zz_pg_fencing_after' THEN ARRAY[5] WHEN 'zz_pg_fencing_truncate' THEN ARRAY[34]
                                                     WHEN 'zz_pg_fencing_stmt' THEN ARRAY[30, 6] WHEN 'zz_pg_fencing_rekey' THEN ARRAY[17] ELSE ARRAY[-1] END)
               OR (trg.tgname <> 'zz_pg_fencing_rekey' AND trg.ncols > 0)
               -- (the set-based shape's AFTER INSERT trigger has exactly this WHEN clause)
               OR (trg.tgname <> 'zz_pg_fencing_rekey' AND trg.has_when
                   AND (trg.tgname <> 'zz_pg_fencing_after'
                        OR substring(pg_get_triggerdef(trg.oid) FROM ' WHEN \((.*)\) EXECUTE ')
                           IS DISTINCT FROM format('_pg_fencing.insert_check_due(%L::bigint)', split_part(encode(trg.tgargs, 'escape'), '\000', 1)))) THEN
                RAISE EXCEPTION USING ERRCODE = '55000',
                    MESSAGE = format('trigger %s of protected table %s can only be made by fencing_protect', trg.tgname, trg.rel),
                    DETAIL = 'Another function, other events, a column list or a WHEN clause would leave writes unfenced.',
                    HINT = format('Run SELECT fencing_protect(%L) to re-create it; name your own triggers otherwise.', pg_partition_root(trg.rel));
            END IF;
        ELSIF trg.tgtype & 67 = 3 AND trg.tgtype & 20 <> 0 AND (trg.tgname COLLATE "C") > 'zz_pg_fencing_guard'
              AND NOT (restoring AND trg.owner) THEN
            RAISE EXCEPTION USING ERRCODE = '55000',
                MESSAGE = format('BEFORE row trigger %s of protected table %s would fire after zz_pg_fencing_guard', trg.tgname, trg.rel),
                DETAIL = 'It could change a row (its token or key) after pg_fencing checked and stamped it.',
                HINT = 'Give it a name that sorts before zz_pg_fencing_guard (BEFORE triggers fire in name order).';
        END IF;
    END LOOP;
END
$fn$;
CREATE EVENT TRIGGER pg_fencing_trigger_ddl ON ddl_command_end
    WHEN TAG IN ('CREATE TRIGGER')
    EXECUTE FUNCTION _pg_fencing.on_trigger_ddl();

-- ---------------------------------------------------------------------------------------------
-- PostgreSQL leases: the database as the lock service (src/lock_service/leases.rs,
-- docs/leases.md). No worker needed.

-- One row per lease name that is held or ended without a release; a lease is live while
-- expires_at > clock_timestamp(). Release deletes the row; a take-over replaces its token.
CREATE TABLE _pg_fencing.lease (
    name         text        PRIMARY KEY CHECK (name <> ''),
    token        bigint      NOT NULL UNIQUE CHECK (token > 0),
    ttl          interval    NOT NULL CHECK (ttl > '0'),
    acquired_at  timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    acquired_by  name        NOT NULL,
    acquirer     oid         NOT NULL,  -- acquired_by's OID at the grant: renew and release need both to match
    holder_pid   integer     NOT NULL
);
-- The tokens; moved to the database clock (microseconds since 2000) by the first grant under a
-- new server history, whose hash lease_history_seq keeps (see leases.rs, "Tokens never go back").
CREATE SEQUENCE _pg_fencing.lease_token_seq AS bigint MINVALUE 1 NO CYCLE;
CREATE SEQUENCE _pg_fencing.lease_history_seq AS bigint MINVALUE 0 START 0 NO CYCLE;
SELECT pg_catalog.pg_extension_config_dump('_pg_fencing.lease', '');
SELECT pg_catalog.pg_extension_config_dump('_pg_fencing.lease_token_seq', '');
SELECT pg_catalog.pg_extension_config_dump('_pg_fencing.lease_history_seq', '');

CREATE FUNCTION @extschema@.fencing_lease_acquire(name text, ttl interval, wait interval DEFAULT '0') RETURNS bigint
LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fencing_lease_acquire';
COMMENT ON FUNCTION @extschema@.fencing_lease_acquire(text, interval, interval) IS
'Grants PostgreSQL lease name for ttl by the database clock if it is free or its holder''s lease has expired, and returns its fencing token (a bigint, at least 2^48: microseconds since 2000 at the first grant after a server start, promotion or restore, then one more per grant); the token is greater than every token any earlier lease of this database had, across crash, restart, promotion, point-in-time recovery, dump/restore and pg_upgrade (docs/leases.md). Else waits up to wait (woken when the lease is released or expires; cancel, statement_timeout and postmaster death honoured). Writes carrying the token are refused with FT003 once the lease has expired, been released or been taken over. Errors: 55P03 still held after wait; 22004 NULL argument; 22023 empty name or one over 1024 bytes, ttl not positive or over 100 years, wait negative or over a year; 25006 in recovery.';

CREATE FUNCTION @extschema@.fencing_lease_renew(token bigint, ttl interval DEFAULT NULL) RETURNS timestamptz
LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fencing_lease_renew';
COMMENT ON FUNCTION @extschema@.fencing_lease_renew(bigint, interval) IS
'Extends the live lease holding token to clock_timestamp() + ttl (NULL: the ttl it was acquired or last renewed with; never shortened) and returns the new expiry. Any session of a member of the role that acquired it (the same role, by OID and name) may renew (a worker need not be the session that acquired). Errors: FT003 the lease expired, was released or was taken over; 42501 not a member of the acquiring role; 22004 NULL token; 22023 token not positive, ttl not positive or over 100 years; 25006 in recovery.';

CREATE FUNCTION @extschema@.fencing_lease_release(token bigint) RETURNS boolean
LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fencing_lease_release';
COMMENT ON FUNCTION @extschema@.fencing_lease_release(bigint) IS
'Ends the lease holding token: true if it was live, false if it had already ended (expired, released or taken over). Waiters are woken when the release commits. Errors: 42501 not a member of the acquiring role; 22004 NULL token; 22023 token not positive; 25006 in recovery.';

CREATE FUNCTION @extschema@.fencing_lease_check(token bigint) RETURNS void
LANGUAGE c VOLATILE PARALLEL UNSAFE AS 'MODULE_PATHNAME', 'fencing_lease_check';
COMMENT ON FUNCTION @extschema@.fencing_lease_check(bigint) IS
'Refuses with FT003 unless token is the token of a live PostgreSQL lease (Chubby''s CheckSequencer, for storage outside PostgreSQL). Errors: FT003; 22004 NULL token; 22023 token not positive.';

CREATE VIEW @extschema@.fencing_leases AS
SELECT l.name, l.token, l.acquired_at, l.expires_at, l.acquired_by, l.holder_pid, l.ttl,
       l.expires_at > pg_catalog.clock_timestamp() AS live
FROM _pg_fencing.lease l;
COMMENT ON VIEW @extschema@.fencing_leases IS
'PostgreSQL leases: name, token, acquired_at, expires_at (database clock), acquired_by (the role that acquired it; its members may renew and release), holder_pid (the backend that acquired or took it over), ttl (of the last grant or renewal), live (expires_at is still ahead). Expired leases stay until taken over or released.';
GRANT SELECT ON @extschema@.fencing_leases TO PUBLIC;

-- fencing_reset refuses a resource nothing uses (42704); per-row tables get fencing_reset_rows.
CREATE OR REPLACE FUNCTION @extschema@.fencing_reset(resource text, token bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    old bigint;
    tbl regclass;
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user) THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'permission denied for fencing_reset',
            DETAIL = 'Only a superuser may lower or reset a high-water mark.';
    END IF;
    IF resource IS NULL OR resource = '' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'resource must be a non-empty name';
    END IF;
    IF token IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'token must not be NULL';
    ELSIF token <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('fencing token %s is not positive', token);
    END IF;
    old := _pg_fencing.lock_resource(resource);
    -- A reset of a resource nothing uses (no mark, no table protected in resource mode with it,
    -- no watch) would only create an unrelated resource: refused, naming a per-row table of that
    -- name, whose marks fencing_reset_rows lowers.
    IF old IS NULL AND NOT EXISTS (SELECT 1 FROM _pg_fencing.protected_table pt WHERE pt.resource = fencing_reset.resource)
       AND NOT EXISTS (SELECT 1 FROM _pg_fencing.watch w WHERE w.resource = fencing_reset.resource) THEN
        SELECT pt.relid INTO tbl FROM _pg_fencing.protected_table pt
        JOIN pg_class c ON c.oid = pt.relid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE pt.resource IS NULL AND pt.protected
          AND fencing_reset.resource IN (c.relname::text, format('%I.%I', n.nspname, c.relname), format('%s.%s', n.nspname, c.relname))
        ORDER BY pt.relid LIMIT 1;
        IF tbl IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = '42704', MESSAGE = format('resource "%s" does not exist', resource),
                DETAIL = format('No table is protected in resource mode with it and it has no high-water mark; %s is a per-row protected table, whose rows and deleted keys carry their own marks.', tbl),
                HINT = format('To lower the marks of its rows and tombstones, run SELECT fencing_reset_rows(%L, %s).', tbl::text, token);
        END IF;
        RAISE EXCEPTION USING ERRCODE = '42704', MESSAGE = format('resource "%s" does not exist', resource),
            DETAIL = 'No table is protected in resource mode with it, it is not watched, and it has no high-water mark: a reset would only create it.',
            HINT = 'Check the name (fencing_resources lists the resources); to give a new resource a first mark, use fencing_advance.';
    END IF;
    -- Recovery after an etcd restore: the worker forgets etcd's old revisions and cluster id.
    PERFORM _pg_fencing.reset_lock_service();
    PERFORM _pg_fencing.reset_watch(resource, token);
    INSERT INTO _pg_fencing.resource_high_water AS h (resource, high_water, updated_at)
    VALUES (resource, token, clock_timestamp())
    ON CONFLICT ON CONSTRAINT resource_high_water_pkey
    DO UPDATE SET high_water = excluded.high_water, updated_at = excluded.updated_at;
    INSERT INTO _pg_fencing.reset_log (resource, old_high_water, new_high_water) VALUES (resource, old, token);
    RAISE LOG 'pg_fencing: fencing_reset of resource "%" from % to % by role % (session user %)',
        resource, coalesce(old::text, 'none'), token, current_user, session_user;
END
$fn$;
COMMENT ON FUNCTION @extschema@.fencing_reset(text, bigint) IS
'Superuser only (42501): sets a resource''s high-water mark to token, even lower, for recovery (e.g. an etcd restored from an old snapshot). Logged to the server log and _pg_fencing.reset_log. Errors: 42704 a resource nothing uses (no mark, no table protected with it, no watch; for a per-row table: fencing_reset_rows); 22023 empty name or token not positive; 22004 NULL token.';

-- Per-row mode's way back (docs/operations.md, "Lowering marks"): a per-row table written once
-- with tokens of another source (a PostgreSQL lease's, far above etcd revisions) locks the other
-- source's holders out of those rows and deleted keys. Superuser only; the whole table is locked
-- (ACCESS EXCLUSIVE) until the transaction ends, so no write sees a half-lowered table.
CREATE FUNCTION @extschema@.fencing_reset_rows(relation regclass, token bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    p record;
    rows_lowered bigint;
    tombs_lowered bigint;
    feed text;
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user) THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'permission denied for fencing_reset_rows',
            DETAIL = 'Only a superuser may lower high-water marks.';
    END IF;
    IF relation IS NULL OR token IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'relation and token must not be NULL';
    ELSIF token <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('fencing token %s is not positive', token);
    END IF;
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', relation);
    SELECT pt.id, pt.resource, pt.token_column, pt.tombstone_floor INTO p
    FROM _pg_fencing.protected_table pt WHERE pt.relid = relation AND pt.protected;
    IF NOT FOUND OR p.resource IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('table %s is not protected in per-row mode', relation),
            HINT = 'A resource-mode table''s mark is its resource''s: fencing_reset(resource, token).';
    END IF;
    -- The guard would refuse lowering a row's mark: the table's triggers are dropped and made
    -- again inside this transaction (nobody else can write it meanwhile: the lock above).
    PERFORM @extschema@.fencing_unprotect(relation);
    EXECUTE format('UPDATE %s SET %I = $1 WHERE %I > $1', relation, p.token_column, p.token_column) USING token;
    GET DIAGNOSTICS rows_lowered = ROW_COUNT;
    PERFORM _pg_fencing.expand_tombstone_runs(p.id);
    UPDATE _pg_fencing.row_tombstone t SET high_water = token WHERE t.protection_id = p.id AND t.high_water > token;
    GET DIAGNOSTICS tombs_lowered = ROW_COUNT;
    -- The tombstone feed of logical replication (filled once any publication carries it) holds
    -- the table's tombstones and floor too, and fencing_protect below takes them up again from
    -- it: lowered the same way.
    SELECT format('%I.%I', n.nspname, c.relname) INTO feed FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = relation;
    WITH gone AS (DELETE FROM _pg_fencing.tombstone_feed f
                  WHERE f.relation = feed AND f.high_water > token RETURNING f.key)
    INSERT INTO _pg_fencing.tombstone_feed (relation, key, high_water)
    SELECT DISTINCT feed, g.key, token FROM gone g
    ON CONFLICT DO NOTHING;
    UPDATE _pg_fencing.protected_table pt SET tombstone_floor = token WHERE pt.id = p.id AND pt.tombstone_floor > token;
    PERFORM @extschema@.fencing_protect(relation, NULL, p.token_column);
    INSERT INTO _pg_fencing.reset_log (resource, old_high_water, new_high_water)
    VALUES (format('table %s', relation), NULL, token);
    RAISE LOG 'pg_fencing: fencing_reset_rows of table % to % (% rows, % tombstones lowered) by role % (session user %)',
        relation, token, rows_lowered, tombs_lowered, current_user, session_user;
    RETURN rows_lowered + tombs_lowered;
END
$fn$;
COMMENT ON FUNCTION @extschema@.fencing_reset_rows(regclass, bigint) IS
'Superuser only (42501), per-row mode: lowers every row token, tombstone and the tombstone floor of the table that is above token to token, for recovery (a table written with tokens of two sources, docs/operations.md "Lowering marks"); returns how many rows and tombstones were lowered. Locks the table ACCESS EXCLUSIVE until the transaction ends; the UPDATE of the token column fires the table''s own triggers. Logged to the server log and _pg_fencing.reset_log (resource "table <name>"). A logical-replication subscriber keeps its own marks: run it there too. Errors: 22023 not a per-row protected table or token not positive; 22004 NULL argument.';
REVOKE ALL ON FUNCTION @extschema@.fencing_reset_rows(regclass, bigint) FROM PUBLIC;

-- Tombstone runs (see _pg_fencing.tombstone_run above).
SELECT pg_catalog.pg_extension_config_dump('_pg_fencing.tombstone_run', '');
SELECT pg_catalog.pg_extension_config_dump('_pg_fencing.tombstone_chunk', '');
SELECT pg_catalog.pg_extension_config_dump('_pg_fencing.tombstone_run_seq', '');
