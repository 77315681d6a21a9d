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
-- New columns go at the end so that CREATE OR REPLACE VIEW keeps views that users built on ours.
-- The library of 0.2.0 still serves every C symbol the 0.1.0 SQL names, so the server keeps
-- working between installing the new files and running ALTER EXTENSION pg_fencing UPDATE.

\echo Use "ALTER EXTENSION pg_fencing UPDATE TO '0.2.0'" to load this file. \quit

SELECT pg_catalog.pg_extension_config_dump('_pg_fencing.protected_table_id_seq', '');

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
    restoring boolean := current_setting('check_function_bodies') = 'off';
BEGIN
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
            -- Never let this block the user's DDL: a partition we cannot guard shows up as
            -- inactive in fencing_protected_tables instead.
            BEGIN
                PERFORM _pg_fencing.add_statement_triggers(part, p.id, p.resource, p.token_column);
            EXCEPTION WHEN OTHERS THEN
                RAISE WARNING 'pg_fencing: could not add statement triggers to %: %', part, SQLERRM;
            END;
        END LOOP;
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

CREATE OR REPLACE VIEW @extschema@.fencing_protected_tables AS
SELECT p.relid AS relation,
       CASE WHEN p.resource IS NULL THEN 'per-row' ELSE 'resource' END AS mode,
       p.resource,
       p.token_column,
       _pg_fencing.inactive_reason(p.relid, p.resource) IS NULL AS active,
       _pg_fencing.inactive_reason(p.relid, p.resource) AS inactive_reason,
       (SELECT count(*) FROM _pg_fencing.row_tombstone t WHERE t.protection_id = p.id) AS tombstones,
       s.accepted,
       s.rejected,
       s.last_rejection_at,
       s.last_rejected_token,
       s.last_rejection_high_water,
       p.protected_at,
       s.last_rejection_pid,
       s.last_rejection_application_name,
       s.last_rejection_client_addr
FROM _pg_fencing.protected_table p
LEFT JOIN LATERAL @extschema@.fencing_domain_stats('table', p.id::text) s ON true
WHERE p.protected;
COMMENT ON VIEW @extschema@.fencing_protected_tables IS
'Tables under fencing, their mode, whether the protection is actually active right now (inactive_reason says why not), and for per-row tables the accepted and rejected row writes and the last rejection (time, token, high-water mark, backend pid, application_name, client address as in fencing_resources) since server start (with shared_preload_libraries = pg_fencing; resource-mode counts are in fencing_resources).';

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
    resource         text        PRIMARY KEY CHECK (resource <> ''),
    lock_key_prefix  text        NOT NULL CHECK (lock_key_prefix <> ''),
    verify           boolean     NOT NULL,
    watched_at       timestamptz NOT NULL DEFAULT pg_catalog.now()
);
GRANT SELECT ON _pg_fencing.watch TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('_pg_fencing.watch', '');

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
'The background worker watches etcd lock lock_name (default: the resource''s name, after pg_fencing.lock_prefix) and, whenever it changes hands, raises the resource''s mark to the hand-over revision (the later of the new holder key''s create revision and its predecessor''s deletion; never above the new holder''s token). Watches are per database. With verify, writes are also refused (FT006) unless their token is at most the latest revision etcd has reported, seen within pg_fencing.verify_max_lag. The registration is a row of _pg_fencing.watch (WAL-logged, so standbys, promotion, PITR, pg_upgrade and pg_dump/restore carry it) and takes effect when the transaction commits; after a (re)start the resource admits no write until the watch has read etcd (waiting at most pg_fencing.watch_sync_timeout, then FT005). Errors: 42501 not allowed to write the resource''s tables; 55000 no worker; 22023 bad names; 53400 all 64 watch slots in use; 0A000 at PREPARE TRANSACTION.';
COMMENT ON FUNCTION @extschema@.fencing_unwatch(text) IS
'Stops watching a resource in this database (true if it was watched) when the transaction commits; the hand-over revision the watch reached is stored as the resource''s mark then, durably. Errors: 42501 as fencing_watch; 0A000 at PREPARE TRANSACTION.';
