#!/usr/bin/env bash
# The set-based shape never fails open (docs/design.md, "The set-based shape"): tables protected
# where the server preloads pg_fencing get no BEFORE INSERT row trigger; after a restart without
# the library in shared_preload_libraries every write to them is refused with FT004 on every path
# (INSERT, COPY, UPDATE, DELETE, MERGE, TRUNCATE, fenced_insert), the view says why, and
# fencing_protect there gives them the row-trigger shape, which works without preloading and
# stays after the library is preloaded again (until fencing_protect chooses again). A dump of a
# set-based table restored into a new database (with and without --disable-triggers) keeps the
# shape and its fence.
# A throwaway cluster on 127.0.0.1:${PGPORT_PRELOAD:-54497}.
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh

CHILD_PIDS=""
fresh_workdir
trap 'cleanup_all' EXIT
trap 'exit 130' INT TERM
PGPORT_TEST=${PGPORT_PRELOAD:-54497}
started=$SECONDS
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'" pg_start
PSQL=(psql -X -q -v ON_ERROR_STOP=1)
restart_with() {  # restart_with <shared_preload_libraries>
    as_pg "$PGBIN/pg_ctl" -D "$PGDATA_TEST" -m fast -w stop >/dev/null
    echo "shared_preload_libraries = '$1'" >>"$PGDATA_TEST/postgresql.conf"
    pg_ctl_start "$PGDATA_TEST" "$WORK/postgres.log"
}
"${PSQL[@]}" -o /dev/null <<'SQL'
CREATE EXTENSION pg_fencing;
CREATE TABLE ledger (id int PRIMARY KEY, v int);
SELECT fencing_protect('ledger', 'settle');
CREATE TABLE jobs (id int PRIMARY KEY, v int);
SELECT fencing_protect('jobs');
BEGIN; SET LOCAL pg_fencing.token = '10';
INSERT INTO ledger VALUES (1, 1); INSERT INTO jobs VALUES (1, 1);
COMMIT;
SQL
shapes() { "${PSQL[@]}" -Atc "SELECT string_agg(relation::text || ':' || shape || ':' || active, ' ' ORDER BY relation::text) FROM fencing_protected_tables" "$@"; }
expect "shapes where the library is preloaded" "jobs:set-based:true ledger:set-based:true" "$(shapes)"

# Every write path, each in its own transaction with a valid token; prints each one's SQLSTATE.
paths() {  # paths <table> <token>
    local t=$1 tok=$2 out=()
    for sql in "INSERT INTO $t VALUES (100, 1)" \
               "COPY $t (id, v) FROM PROGRAM 'echo 101,1' WITH (FORMAT csv)" \
               "UPDATE $t SET v = v + 1 WHERE id = 1" \
               "DELETE FROM $t WHERE id = 1" \
               "MERGE INTO $t d USING (VALUES (102)) s(id) ON d.id = s.id WHEN NOT MATCHED THEN INSERT VALUES (s.id, 1)" \
               "TRUNCATE $t" \
               "SELECT fenced_insert('$t', '{\"id\": 103, \"v\": 1}', $tok)"; do
        out+=("$(sqlstate_of "${PSQL[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '$tok'; $sql; ROLLBACK;")")
    done
    echo "${out[*]}"
}
expect "preloaded: every path of the resource-mode table admits token 11" "ok ok ok ok ok ok ok" "$(paths ledger 11)"
expect "preloaded: every path of the per-row table admits token 11" "ok ok ok ok ok ok ok" "$(paths jobs 11)"

restart_with ""
expect "the library is not preloaded now" f "$("${PSQL[@]}" -Atc "SELECT _pg_fencing.preloaded()")"
expect "not preloaded: every path of the resource-mode table is refused" "FT004 FT004 FT004 FT004 FT004 FT004 FT004" "$(paths ledger 11)"
expect "not preloaded: every path of the per-row table is refused" "FT004 FT004 FT004 FT004 FT004 FT004 FT004" "$(paths jobs 11)"
expect "the view says why" "f" "$("${PSQL[@]}" -Atc "SELECT active FROM fencing_protected_tables WHERE relation = 'jobs'::regclass")"
hint=$("${PSQL[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '11'; INSERT INTO jobs VALUES (200, 1); ROLLBACK;" 2>&1 | sed -n 's/^HINT:  //p' || true)
expect "the refusal's HINT: preload, or fencing_protect again" 1 "$(echo "$hint" | grep -c "shared_preload_libraries = 'pg_fencing'.*fencing_protect('public.jobs')")"
# The call in the HINT gives the table its protection again as it is: a resource-mode table's
# resource with it (without it, the call would switch the table to per-row mode).
hint=$("${PSQL[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '11'; INSERT INTO ledger VALUES (200, 1); ROLLBACK;" 2>&1 | sed -n 's/^HINT:  //p' || true)
expect "the resource-mode table's HINT repeats its resource" 1 "$(echo "$hint" | grep -c "fencing_protect('public.ledger', 'settle')")"
expect "its reason names preloading" 1 "$("${PSQL[@]}" -Atc "SELECT count(*) FROM fencing_protected_tables WHERE relation = 'jobs'::regclass AND inactive_reason LIKE '%shared_preload_libraries%'")"
expect "nothing was written by the refused writes" "1 1" "$("${PSQL[@]}" -Atc "SELECT (SELECT count(*) FROM ledger) || ' ' || (SELECT count(*) FROM jobs)")"

# fencing_protect in a backend without the library preloaded: the row-trigger shape.
"${PSQL[@]}" -o /dev/null -c "SELECT fencing_protect('ledger', 'settle'); SELECT fencing_protect('jobs');"
expect "fencing_protect without preloading chooses the row-trigger shape" "jobs:row-trigger:true ledger:row-trigger:true" "$(shapes)"
expect "row-trigger shape, not preloaded: every path admits token 11" "ok ok ok ok ok ok ok" "$(paths ledger 11)"
expect "row-trigger shape, not preloaded: every per-row path admits token 11" "ok ok ok ok ok ok ok" "$(paths jobs 11)"
expect "row-trigger shape, not preloaded: a stale COPY is refused" FT001 "$(sqlstate_of "${PSQL[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '10'; SELECT fencing_advance('settle', 12); COMMIT; BEGIN; SET LOCAL pg_fencing.token = '11'; COPY ledger (id, v) FROM PROGRAM 'echo 104,1' WITH (FORMAT csv); ROLLBACK;")"

restart_with "pg_fencing"
expect "preloaded again: the shape stays until fencing_protect" "jobs:row-trigger:true ledger:row-trigger:true" "$(shapes)"
"${PSQL[@]}" -o /dev/null -c "SELECT fencing_protect('ledger', 'settle'); SELECT fencing_protect('jobs');"
expect "fencing_protect where preloaded chooses the set-based shape again" "jobs:set-based:true ledger:set-based:true" "$(shapes)"

# A dump of set-based tables restored into a new database keeps the shape and the fence: a
# stale COPY is refused there, a current one admitted (also after a --disable-triggers load).
"${PSQL[@]}" -o /dev/null -c "BEGIN; SET LOCAL pg_fencing.token = '20'; DELETE FROM jobs WHERE id = 1; COMMIT;"
as_pg "$PGBIN/pg_dump" -h 127.0.0.1 -p "$PGPORT_TEST" -U postgres -Fc -f "$WORK/dump" postgres
for mode in plain disable-triggers; do
    "${PSQL[@]}" -c "CREATE DATABASE r_${mode//-/_}" >/dev/null
    opts=()
    [ "$mode" = disable-triggers ] && opts=(--disable-triggers)
    as_pg "$PGBIN/pg_restore" -h 127.0.0.1 -p "$PGPORT_TEST" -U postgres -d "r_${mode//-/_}" "${opts[@]}" "$WORK/dump" 2>"$WORK/restore_$mode.log" || { cat "$WORK/restore_$mode.log"; fail=1; }
    db="r_${mode//-/_}"
    expect "restored ($mode): the shapes" "jobs:set-based:true ledger:set-based:true" "$(shapes -d "$db")"
    expect "restored ($mode): a stale COPY of a deleted key is refused" FT001 "$(sqlstate_of "${PSQL[@]}" -d "$db" -c "BEGIN; SET LOCAL pg_fencing.token = '19'; COPY jobs (id, v) FROM PROGRAM 'echo 1,1' WITH (FORMAT csv); ROLLBACK;")"
    expect "restored ($mode): a stale resource COPY is refused" FT001 "$(sqlstate_of "${PSQL[@]}" -d "$db" -c "BEGIN; SET LOCAL pg_fencing.token = '11'; COPY ledger (id, v) FROM PROGRAM 'echo 105,1' WITH (FORMAT csv); ROLLBACK;")"
    expect "restored ($mode): a current COPY is admitted and stamped" 21 "$("${PSQL[@]}" -d "$db" -Atc "BEGIN; SET LOCAL pg_fencing.token = '21'; COPY jobs (id, v) FROM PROGRAM 'echo 1,1' WITH (FORMAT csv); SELECT fence_token FROM jobs WHERE id = 1; COMMIT;" | head -1)"
done
echo "preload_removed: $((SECONDS - started)) s"
exit $fail
