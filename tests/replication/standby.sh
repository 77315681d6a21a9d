#!/usr/bin/env bash
# High-water marks reach a physical standby, and after promotion a stale write is still refused.
#   primary (127.0.0.1:54349) --streaming--> standby (127.0.0.1:54350), both throwaway clusters.
# The tables' shape as PGF_SHAPE says (scripts/lib.sh; unset: set-based); the standby has the
# primary's postgresql.conf from its base backup.
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh

CHILD_PIDS=""
fresh_workdir
STANDBY="$WORK/standby"
stop_standby() {
    [ -f "$STANDBY/postmaster.pid" ] && as_pg "$PGBIN/pg_ctl" -D "$STANDBY" -m immediate -w stop >/dev/null 2>&1 || true
}
trap 'stop_standby; cleanup_all' EXIT
trap 'exit 130' INT TERM

PGPORT_TEST=${PGPORT_PRIMARY:-54349}
SPORT=$((PGPORT_TEST + 1))
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'
wal_level = replica" pg_start
P=(psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PGPORT_TEST")
S=(psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$SPORT")

echo "== primary: protected tables and marks"
"${P[@]}" -o /dev/null <<'SQL'
CREATE EXTENSION pg_fencing;
CREATE TABLE ledger (id int PRIMARY KEY, v int);
SELECT fencing_protect('ledger', 'repl');
CREATE TABLE job (id int PRIMARY KEY, v int);
SELECT fencing_protect('job');
BEGIN; SET LOCAL pg_fencing.token = '10'; INSERT INTO ledger VALUES (1, 1), (2, 2); INSERT INTO job VALUES (1, 1), (2, 2); COMMIT;
SELECT fencing_advance('repl', 20);
BEGIN; SET LOCAL pg_fencing.token = '15'; DELETE FROM job WHERE id = 1; COMMIT;
SQL
expect_shape -h 127.0.0.1 -p "$PGPORT_TEST"

echo "== standby: pg_basebackup -R, streaming"
mkdir -p "$STANDBY"; chown postgres:postgres "$STANDBY"; chmod 700 "$STANDBY"
as_pg "$PGBIN/pg_basebackup" -h 127.0.0.1 -p "$PGPORT_TEST" -U postgres -D "$STANDBY" -R -X stream -c fast
cat >>"$STANDBY/postgresql.conf" <<CONF
port = $SPORT
unix_socket_directories = '$WORK'
hot_standby = on
CONF
pg_ctl_start "$STANDBY" "$WORK/standby.log" 60

# Written after the standby started: must arrive by streaming.
"${P[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '25'; UPDATE ledger SET v = 25 WHERE id = 1; COMMIT;"
# ... and a bulk delete, whose tombstones are one run (src/state/tombstone_runs.rs)
"${P[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '25'; INSERT INTO job SELECT g, 0 FROM generate_series(100, 299) g; DELETE FROM job WHERE id >= 100; COMMIT;"
target=$("${P[@]}" -Atc "SELECT pg_current_wal_lsn()")
for _ in $(seq 1 600); do   # up to 60 s
    caught=$("${S[@]}" -Atc "SELECT pg_last_wal_replay_lsn() >= '$target'::pg_lsn")
    [ "$caught" = t ] && break
    sleep 0.1
done
expect "standby caught up" t "$caught"
expect "standby: high-water mark of repl" 25 "$("${S[@]}" -Atc "SELECT fencing_high_water('repl')")"
expect "standby: tombstone of job key 1" 15 "$("${S[@]}" -Atc "SELECT high_water FROM _pg_fencing.row_tombstone WHERE key = '(1)'")"
expect "standby: the bulk delete's run" "1/200/25" "$("${S[@]}" -Atc "SELECT count(*) || '/' || sum(key_count) || '/' || max(high_water) FROM _pg_fencing.tombstone_run")"
expect "standby: writes refused (read-only)" 25006 "$(sqlstate_of "${S[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '30'; UPDATE ledger SET v = 0; COMMIT;")"

echo "== promote the standby; the old primary stops"
pg_stop
as_pg "$PGBIN/pg_ctl" -D "$STANDBY" -w promote >/dev/null
expect_shape -h 127.0.0.1 -p "$SPORT"
expect "promoted: stale write to a row the newer holder never touched" FT001 \
    "$(sqlstate_of "${S[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '24'; UPDATE ledger SET v = 0 WHERE id = 2; COMMIT;")"
expect "promoted: stale re-insert of a deleted key" FT001 \
    "$(sqlstate_of "${S[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '14'; INSERT INTO job VALUES (1, 0); COMMIT;")"
expect "promoted: stale re-insert of a bulk-deleted key" FT001 \
    "$(sqlstate_of "${S[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '24'; INSERT INTO job VALUES (150, 0); COMMIT;")"
expect "promoted: current holder writes" ok \
    "$(sqlstate_of "${S[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '26'; UPDATE ledger SET v = 26 WHERE id = 2; COMMIT;")"
expect "promoted: high-water mark" 26 "$("${S[@]}" -Atc "SELECT fencing_high_water('repl')")"
exit $fail
