-- pg_fencing 0.1.0 -> 0.2.0
--
-- Released upgrade scripts are never edited (scripts/check-sql-releases.sh checks this); a later
-- change goes into a new script. What 0.2.0 adds to the SQL surface:
--   * fencing_rejection_origins(): application_name and client address of the last rejection
--     per fencing domain (shown to superusers and pg_read_all_stats members only);
--   * fencing_resources gains last_rejection_application_name, last_rejection_client_addr;
--   * fencing_protected_tables gains last_rejection_pid, last_rejection_application_name,
--     last_rejection_client_addr.
-- New columns go at the end so that CREATE OR REPLACE VIEW keeps views that users built on ours.
-- The library of 0.2.0 still serves every C symbol the 0.1.0 SQL names, so the server keeps
-- working between installing the new files and running ALTER EXTENSION pg_fencing UPDATE.

\echo Use "ALTER EXTENSION pg_fencing UPDATE TO '0.2.0'" to load this file. \quit

CREATE FUNCTION @extschema@.fencing_rejection_origins() RETURNS TABLE (
	"kind" TEXT,
	"name" TEXT,
	"last_rejection_application_name" TEXT,
	"last_rejection_client_addr" TEXT
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'fencing_rejection_origins_wrapper';

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
       o.last_rejection_application_name,
       o.last_rejection_client_addr
FROM _pg_fencing.resource_high_water h
FULL JOIN (SELECT pt.resource, array_agg(pt.relid ORDER BY pt.relid::text) AS tables
           FROM _pg_fencing.protected_table pt
           WHERE pt.protected AND pt.resource IS NOT NULL
           GROUP BY pt.resource) p ON p.resource = h.resource
LEFT JOIN @extschema@.fencing_stats() s ON s.kind = 'resource' AND s.name = coalesce(h.resource, p.resource)
LEFT JOIN @extschema@.fencing_rejection_origins() o ON o.kind = 'resource' AND o.name = coalesce(h.resource, p.resource);
COMMENT ON VIEW @extschema@.fencing_resources IS
'Every resource with a high-water mark or a protected table: its mark (NULL if never written), the tables it guards, and since server start (only with shared_preload_libraries = pg_fencing, else NULL) the accepted and rejected (FT001) writes and the last rejection (time, token, high-water mark, backend pid, application_name, client address); lock_service_problem says why the worker hands out no tokens (etcd''s revisions went backwards), else NULL.';

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
       o.last_rejection_application_name,
       o.last_rejection_client_addr
FROM _pg_fencing.protected_table p
LEFT JOIN @extschema@.fencing_stats() s ON s.kind = 'table' AND s.name = p.id::text
LEFT JOIN @extschema@.fencing_rejection_origins() o ON o.kind = 'table' AND o.name = p.id::text
WHERE p.protected;
COMMENT ON VIEW @extschema@.fencing_protected_tables IS
'Tables under fencing, their mode, whether the protection is actually active right now (inactive_reason says why not), and for per-row tables the accepted and rejected row writes and the last rejection (time, token, high-water mark, backend pid, application_name, client address) since server start (with shared_preload_libraries = pg_fencing; resource-mode counts are in fencing_resources).';
