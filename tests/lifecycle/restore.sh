#!/usr/bin/env bash
# Backup and restore (issue 30, case 4; docs/operations.md, "Backup and restore"): each procedure
# of the documentation, from a database with a resource-mode table (mark 50 raised by
# fencing_advance above its rows' 40) and a per-row table (key 2 deleted with 60, a tombstone no
# row carries), into a fresh database:
#   1. full dump (pg_dump | psql): rows, marks and tombstones; stale writes refused.
#   2. schema-only, then data-only loaded with session_replication_role = replica (the documented
#      data-only procedure): the same; the extension's triggers keep their firing modes.
#   3. schema-only, then a plain data-only load (what a user reaches first): every row COPY is
#      refused (FT002) and the message's hint names procedure 2; nothing is half-fenced.
#   4. schema-only, then data-only with --disable-triggers: the same; the load's closing ENABLE
#      TRIGGER ALL would make the REPLICA triggers ordinary, and the DDL event trigger puts them
#      back at once (before issue 30 both protections stayed inactive, fenced_* got FT004, and
#      fencing_protect did not repair them).
# Every database in the shape PGF_SHAPE says (scripts/lib.sh; unset: no preloading, row-trigger;
# a dump keeps the shape). A throwaway cluster on 127.0.0.1:${PGPORT_RESTORE:-54479}.
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh

CHILD_PIDS=""
fresh_workdir
trap 'cleanup_all' EXIT
trap 'exit 130' INT TERM
PGPORT_TEST=${PGPORT_RESTORE:-54479}
pg_start
PSQL=(psql -X -q -v ON_ERROR_STOP=1)
write() {  # write <db> <token> <sql>: the SQLSTATE of <sql> run with that token
    sqlstate_of "${PSQL[@]}" -d "$1" -c "BEGIN; SET LOCAL pg_fencing.token = '$2'; $3; COMMIT;"
}
q() { "${PSQL[@]}" -d "$1" -Atc "$2"; }

"${PSQL[@]}" -c "CREATE DATABASE src" 
"${PSQL[@]}" -d src -o /dev/null <<'SQL'
CREATE EXTENSION pg_fencing;
CREATE TABLE ledger (id int PRIMARY KEY, v int);
SELECT fencing_protect('ledger', 'settlement');
CREATE TABLE job (id int PRIMARY KEY, state text);
SELECT fencing_protect('job');
BEGIN; SET LOCAL pg_fencing.token = '40'; INSERT INTO ledger VALUES (1, 1), (2, 2); INSERT INTO job VALUES (1, 'a'), (2, 'b'); COMMIT;
SELECT fencing_advance('settlement', 50);
BEGIN; SET LOCAL pg_fencing.token = '60'; DELETE FROM job WHERE id = 2; COMMIT;
-- a bulk delete: its 200 tombstones are one run (src/state/tombstone_runs.rs)
CREATE TABLE bulk (id int PRIMARY KEY);
SELECT fencing_protect('bulk');
BEGIN; SET LOCAL pg_fencing.token = '40'; INSERT INTO bulk SELECT generate_series(1, 300); COMMIT;
BEGIN; SET LOCAL pg_fencing.token = '60'; DELETE FROM bulk WHERE id <= 200; COMMIT;
SQL
expect "source: the bulk delete left one run of 200 keys" "1/200" "$(q src "SELECT count(*) || '/' || sum(key_count) FROM _pg_fencing.tombstone_run")"
STATE="SELECT (SELECT count(*) FROM ledger) || '/' || (SELECT count(*) FROM job) || '/' || coalesce(fencing_high_water('settlement'), 0) || '/' || (SELECT string_agg(active::text, ',' ORDER BY relation::text) FROM fencing_protected_tables)"
TRIGGERS="SELECT string_agg(tgname || '=' || tgenabled::text, ',' ORDER BY tgrelid::regclass::text, tgname) FROM pg_trigger WHERE tgname LIKE 'zz_pg_fencing%' OR tgname = 'pg_fencing_mark_changed'"
expect "source: rows, mark, active" "2/1/50/true,true,true" "$(q src "$STATE")"
triggers_src=$(q src "$TRIGGERS")
expect_shape -d src

check_fenced() {  # check_fenced <db> <what>: the source's fence holds in <db>
    expect "$2: ledger write with 45 (below the advanced mark 50)" FT001 "$(write "$1" 45 "UPDATE ledger SET v = 0 WHERE id = 1")"
    expect "$2: re-insert of deleted key 2 with 55 (below its tombstone 60)" FT001 "$(write "$1" 55 "INSERT INTO job VALUES (2, 'zombie')")"
    expect "$2: re-insert of bulk-deleted key 150 with 55 (below its run's 60)" FT001 "$(write "$1" 55 "INSERT INTO bulk VALUES (150)")"
    expect "$2: a new bulk delete after the restore (the run ids' sequence came along)" ok "$(write "$1" 61 "DELETE FROM bulk WHERE id > 200")"
    expect "$2: a current holder writes with 60" ok "$(write "$1" 60 "UPDATE ledger SET v = 3 WHERE id = 1; INSERT INTO job VALUES (3, 'c')")"
}
pg_dump -d src -f "$WORK/full.sql"
pg_dump -d src --schema-only -f "$WORK/schema.sql"
pg_dump -d src --data-only -f "$WORK/data.sql"
pg_dump -d src --data-only --disable-triggers -f "$WORK/data-disable-triggers.sql"

echo "== 1. full dump"
"${PSQL[@]}" -c "CREATE DATABASE full_restore"
"${PSQL[@]}" -d full_restore -o /dev/null -f "$WORK/full.sql"
expect "full: rows, mark, active" "2/1/50/true,true,true" "$(q full_restore "$STATE")"
expect "full: the extension's triggers as in the source" "$triggers_src" "$(q full_restore "$TRIGGERS")"
expect_shape -d full_restore
check_fenced full_restore full

echo "== 2. schema-only, then data-only with session_replication_role = replica"
"${PSQL[@]}" -c "CREATE DATABASE replica_restore"
"${PSQL[@]}" -d replica_restore -o /dev/null -f "$WORK/schema.sql"
PGOPTIONS="-c session_replication_role=replica" "${PSQL[@]}" -d replica_restore -o /dev/null -f "$WORK/data.sql"
expect "replica: rows, mark, active" "2/1/50/true,true,true" "$(q replica_restore "$STATE")"
expect "replica: the extension's triggers as in the source" "$triggers_src" "$(q replica_restore "$TRIGGERS")"
expect_shape -d replica_restore
check_fenced replica_restore replica

echo "== 3. schema-only, then a plain data-only load"
"${PSQL[@]}" -c "CREATE DATABASE plain_restore"
"${PSQL[@]}" -d plain_restore -o /dev/null -f "$WORK/schema.sql"
psql -X -q -v VERBOSITY=verbose -d plain_restore -o /dev/null -f "$WORK/data.sql" >"$WORK/plain.log" 2>&1 || true
# The wording names a write (row-trigger shape) or a COPY (set-based: the COPY hook refuses it).
expect "plain: the protected tables' COPY refused (FT002 three times)" 3 "$(grep -c 'ERROR:  FT002: no fencing token for a' "$WORK/plain.log" || true)"
expect "plain: the hint names the restore procedure" 3 "$(grep -c "session_replication_role = replica" "$WORK/plain.log" || true)"
expect "plain: no row loaded, marks and tombstones did" "0/0/50/true,true,true" "$(q plain_restore "$STATE")"
expect "plain: the extension's triggers as in the source" "$triggers_src" "$(q plain_restore "$TRIGGERS")"
expect_shape -d plain_restore

echo "== 4. schema-only, then data-only with --disable-triggers"
"${PSQL[@]}" -c "CREATE DATABASE disabled_restore"
"${PSQL[@]}" -d disabled_restore -o /dev/null -f "$WORK/schema.sql"
"${PSQL[@]}" -d disabled_restore -o /dev/null -f "$WORK/data-disable-triggers.sql"
expect "disable-triggers: rows, mark, active" "2/1/50/true,true,true" "$(q disabled_restore "$STATE")"
expect "disable-triggers: the extension's triggers as in the source" "$triggers_src" "$(q disabled_restore "$TRIGGERS")"
expect_shape -d disabled_restore
check_fenced disabled_restore disable-triggers
exit $fail
