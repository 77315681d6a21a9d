#!/usr/bin/env bash
# A watch registered under 0.1.0 survives the extension update and every later path (issue 14,
# path 2). 0.1.0 kept watch registrations only in $PGDATA/pg_fencing_watches.state (one line per
# watch: database oid, resource, etcd key prefix, verify, hand-over revision); 0.2.0 keeps them in
# the WAL-logged table _pg_fencing.watch, which ALTER EXTENSION pg_fencing UPDATE fills from
# what is running. The story, as an operator would meet it:
#   1. a database on 0.1.0's SQL with resource 'jobs' (stored mark 30) watched under 0.1.0: the
#      state file 0.1.0 wrote; the new library is installed and the server restarted;
#   2. holder Z took etcd lock 'jobs' at revision H > 30 and never writes: before the update a
#      write with H - 1 is already refused (the new library reads 0.1.0's state file, also in the
#      first session, before the worker has: a write with 31 is refused at once), and
#      fencing_watch / fencing_unwatch refuse with 55000 and say to update (0.1.0's SQL has no
#      table to write the registration into);
#   3. ALTER EXTENSION pg_fencing UPDATE: the registration is a row of _pg_fencing.watch;
#   4. the state file is lost (pg_upgrade, a restore of the data directory without it): after a
#      restart the watch is still there, the write with H - 1 is refused, and a hand-over to A
#      fences Z (FT001 for Z's own token H).
# Throwaway server on 127.0.0.1:${PGPORT_LIFECYCLE3:-54429} and etcd on ${ETCD_CLIENT_PORT:-23790}.
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh

CHILD_PIDS=""
ADDED=""
fresh_workdir
cleanup() {
    # The etcdctl holders run in process groups of their own (setsid): end the whole group.
    for p in ${CHILD_PIDS:-}; do kill -KILL -- "-$p" 2>/dev/null || true; done
    for f in $ADDED; do rm -f "$f"; done
    cleanup_all
}
trap cleanup EXIT
trap 'exit 130' INT TERM
PGPORT_TEST=${PGPORT_LIFECYCLE3:-54429}
EXTDIR="$($PGBIN/pg_config --sharedir)/extension"
OLD=pg_fencing--0.1.0.sql
if [ ! -f "$EXTDIR/$OLD" ]; then
    cp "sql/$OLD" "$EXTDIR/$OLD"
    ADDED="$EXTDIR/$OLD"
fi
etcd_start
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'
pg_fencing.etcd_endpoints = '127.0.0.1:$ETCD_CLIENT_PORT'" pg_start
PSQL=(psql -X -q -v ON_ERROR_STOP=1)
stale_write() {  # stale_write <token>: the SQLSTATE of a write to 'jobs' with that token
    sqlstate_of "${PSQL[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '$1'; UPDATE jobs SET v = $1 WHERE id = 1; COMMIT;"
}

echo "== 0.1.0's SQL, resource 'jobs' at mark 30, watched under 0.1.0 (its state file)"
"${PSQL[@]}" -o /dev/null <<'SQL'
CREATE EXTENSION pg_fencing VERSION '0.1.0';
CREATE TABLE jobs (id int PRIMARY KEY, v bigint);
SELECT fencing_protect('jobs', 'jobs');
BEGIN; SET LOCAL pg_fencing.token = '30'; INSERT INTO jobs VALUES (1, 30); COMMIT;
SQL
DBOID=$("${PSQL[@]}" -Atc "SELECT oid FROM pg_database WHERE datname = current_database()")
as_pg "$PGBIN/pg_ctl" -D "$PGDATA_TEST" -m fast -w stop >/dev/null
# etcd's revision above the stored mark, so the hand-over revision is above it too; holder Z
# takes the lock (and never writes) while PostgreSQL is down.
for i in $(seq 1 40); do etcdctl put "pad/$i" x >/dev/null; done
etcd_holder z jobs
H=$(wait_lock_owner jobs)
[ -n "$H" ] || { echo "FAIL: holder Z never got the lock"; exit 1; }
echo "  holder Z's token (hand-over revision) H = $H"
# The line 0.1.0's library wrote for fencing_watch('jobs') once it had seen Z's grant
# (src/watch.rs of 0.1.0, state_text: database oid, resource, prefix, verify, hand-over).
printf '%s\tjobs\tjobs/\t0\t%s\n' "$DBOID" "$H" >"$PGDATA_TEST/pg_fencing_watches.state"
chown postgres:postgres "$PGDATA_TEST/pg_fencing_watches.state" 2>/dev/null || true
# The worker is slow to read the state file this time (its lock is held, by a process of ours,
# from before the start until the first session's write waits for it): that write must not be
# admitted on the stored mark alone meanwhile.
LOCKFILE="$PGDATA_TEST/pg_fencing_watches.lock"
as_pg touch "$LOCKFILE"
setsid flock -x "$LOCKFILE" sleep 600 &
FLOCK_PID=$!
disown "$FLOCK_PID"   # killed on purpose below: no job-control message
CHILD_PIDS="$CHILD_PIDS $FLOCK_PID"
for _ in $(seq 1 300); do flock -n "$LOCKFILE" true || break; sleep 0.1; done
expect "the state file's lock is held before the start" held "$(flock -n "$LOCKFILE" true && echo free || echo held)"
pg_ctl_start "$PGDATA_TEST" "$WORK/postgres.log" 60
stale_write 31 >"$WORK/first-write.out" &
WRITE_PID=$!
# Let go once the write waits (or, what must not happen, has ended), up to 30 s.
for _ in $(seq 1 300); do
    kill -0 "$WRITE_PID" 2>/dev/null || break
    [ "$(psql -X -Atc "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active'
                       AND wait_event_type IS NOT NULL AND query LIKE '%UPDATE jobs%'" 2>/dev/null)" = 1 ] && break
    sleep 0.1
done
expect "the first session's write waits while the state file's lock is held" waiting \
    "$(kill -0 "$WRITE_PID" 2>/dev/null && echo waiting || echo "ended: $(cat "$WORK/first-write.out")")"
kill -KILL -- "-$FLOCK_PID" 2>/dev/null || true
wait "$WRITE_PID" || true
expect "0.1.0's SQL, right after the start, before the worker read the state file: a write with 31 (stored mark 30)" \
    FT001 "$(cat "$WORK/first-write.out")"
wait_for "0.1.0's SQL: the state file's watch sees the hand-over to Z" "$H" "$PGPORT_TEST" postgres \
    "SELECT handover_revision FROM fencing_watches WHERE resource = 'jobs'"
expect "0.1.0's SQL: a write with H - 1" FT001 "$(stale_write $((H - 1)))"
expect "0.1.0's SQL: fencing_watch asks for the update" 55000 \
    "$(sqlstate_of "${PSQL[@]}" -c "SELECT fencing_watch('other')")"
expect "0.1.0's SQL: fencing_unwatch asks for the update" 55000 \
    "$(sqlstate_of "${PSQL[@]}" -c "SELECT fencing_unwatch('jobs')")"
expect "0.1.0's SQL: the watch still runs after the refused unwatch" 1 \
    "$("${PSQL[@]}" -Atc "SELECT count(*) FROM fencing_watches WHERE resource = 'jobs'")"

echo "== ALTER EXTENSION pg_fencing UPDATE"
"${PSQL[@]}" -c "ALTER EXTENSION pg_fencing UPDATE"
expect "the registration is a row of _pg_fencing.watch" "jobs|jobs/|f" \
    "$("${PSQL[@]}" -Atc "SELECT resource, lock_key_prefix, verify FROM _pg_fencing.watch")"
expect "after the update: a write with H - 1" FT001 "$(stale_write $((H - 1)))"

echo "== the state file is lost (as pg_upgrade or a restore without it would); restart"
as_pg "$PGBIN/pg_ctl" -D "$PGDATA_TEST" -m fast -w stop >/dev/null
rm -f "$PGDATA_TEST/pg_fencing_watches.state"
pg_ctl_start "$PGDATA_TEST" "$WORK/postgres.log" 60
expect "without the state file: a write with H - 1" FT001 "$(stale_write $((H - 1)))"
expect "without the state file: watch listed" jobs "$("${PSQL[@]}" -Atc "SELECT resource FROM fencing_watches")"
expect "Z's own write with H" ok "$(stale_write "$H")"

echo "== Z hands the lock to A: Z is fenced off"
z=$(cat "$WORK/z.pid")
kill -TERM -- "-$z" 2>/dev/null || kill "$z"
wait "$z" 2>/dev/null || true
etcd_holder a jobs
A=$(wait_lock_owner jobs "$H")
wait_for "hand-over to A seen" "$A" "$PGPORT_TEST" postgres \
    "SELECT handover_revision FROM fencing_watches WHERE resource = 'jobs'"
expect "Z's write after the hand-over" FT001 "$(stale_write "$H")"
"${PSQL[@]}" -o /dev/null -c "SELECT fencing_unwatch('jobs')"
expect "fencing_unwatch after the update removes the row" 0 "$("${PSQL[@]}" -Atc "SELECT count(*) FROM _pg_fencing.watch")"
exit $fail
