#!/usr/bin/env bash
# A watched resource stays fenced on every path that copies or moves the database (issue 14,
# path 2): pg_dump/restore, a promoted physical standby, point-in-time recovery, pg_upgrade. The watch registration lives
# in a WAL-logged table (_pg_fencing.watch), so all three carry it; what the watch derived from
# etcd (the hand-over revision) is derived again from etcd on the new server before any write to
# the resource is admitted.
#
# The story, as an operator would meet it: resource 'jobs' has stored mark 30; it is watched;
# holder Z takes etcd lock 'jobs' at revision H > 30 and never writes (so the stored mark stays
# 30); then the database is copied. On the copy a write with token H - 1 (an older holder's) must
# be refused with FT001, and the watch must be listed and keep working.
#
# Throwaway servers on 127.0.0.1:${PGPORT_LIFECYCLE2:-54419} (+1 for the standby) and etcd on
# ${ETCD_CLIENT_PORT:-23790}.
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh

CHILD_PIDS=""
fresh_workdir
STANDBY=""
cleanup() {
    # The etcdctl holders run in process groups of their own (setsid): end the whole group.
    for p in ${CHILD_PIDS:-}; do kill -KILL -- "-$p" 2>/dev/null || true; done
    if [ -n "$STANDBY" ] && [ -f "$STANDBY/postmaster.pid" ]; then
        as_pg "$PGBIN/pg_ctl" -D "$STANDBY" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    if [ -n "${PITR:-}" ] && [ -f "$PITR/postmaster.pid" ]; then
        as_pg "$PGBIN/pg_ctl" -D "$PITR" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    if [ -n "${NEWDATA:-}" ] && [ -f "$NEWDATA/postmaster.pid" ]; then
        as_pg "$PGBIN/pg_ctl" -D "$NEWDATA" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    cleanup_all
}
trap cleanup EXIT
trap 'exit 130' INT TERM
PGPORT_TEST=${PGPORT_LIFECYCLE2:-54419}
PORT2=$((PGPORT_TEST + 1))
etcd_start
CONF="shared_preload_libraries = 'pg_fencing'
pg_fencing.etcd_endpoints = '127.0.0.1:$ETCD_CLIENT_PORT'
wal_level = replica"
# The table's shape as PGF_SHAPE says (scripts/lib.sh; unset: set-based), on every copy.
CONF+=$'\n'$(shape_conf "$CONF")
mkdir -p "$WORK/archive"
[ "$(id -u)" -eq 0 ] && chown postgres:postgres "$WORK/archive"
PG_EXTRA_CONF="$CONF
archive_mode = on
archive_command = 'cp %p $WORK/archive/%f'" pg_start
PSQL=(psql -X -q -v ON_ERROR_STOP=1)

stale_write() {  # stale_write <port> <db> <token>: the SQLSTATE of a write with that token
    sqlstate_of "${PSQL[@]}" -p "$1" -d "$2" -c "BEGIN; SET LOCAL pg_fencing.token = '$3'; UPDATE jobs SET v = $3 WHERE id = 1; COMMIT;"
}

"${PSQL[@]}" -o /dev/null <<'SQL'
CREATE EXTENSION pg_fencing;
CREATE TABLE jobs (id int PRIMARY KEY, v bigint);
SELECT fencing_protect('jobs', 'jobs');
BEGIN; SET LOCAL pg_fencing.token = '30'; INSERT INTO jobs VALUES (1, 30); COMMIT;
SQL
expect_shape
# etcd's revision above the stored mark, so the hand-over revision is above it too.
for i in $(seq 1 40); do etcdctl put "pad/$i" x >/dev/null; done

echo "== a standby from a base backup taken before the watch existed"
STANDBY="$WORK/standby"
mkdir -p "$STANDBY" && chown postgres:postgres "$STANDBY" && chmod 700 "$STANDBY"
as_pg "$PGBIN/pg_basebackup" -h 127.0.0.1 -p "$PGPORT_TEST" -U postgres -D "$STANDBY" -R -X stream >/dev/null
# The same base backup, kept for a point-in-time recovery later.
PITR="$WORK/pitr"
cp -a "$STANDBY" "$PITR"
rm -f "$PITR/standby.signal"
cat >>"$STANDBY/postgresql.conf" <<CONF
port = $PORT2
archive_mode = off
CONF
pg_ctl_start "$STANDBY" "$WORK/standby.log" 60

echo "== watch 'jobs'; holder Z takes the lock and never writes"
"${PSQL[@]}" -o /dev/null -c "SELECT fencing_watch('jobs')"
setsid etcdctl lock jobs -- sleep 600 >"$WORK/z.out" 2>&1 &
Z_PID=$!
CHILD_PIDS="$Z_PID"
H=""
for _ in $(seq 1 300); do
    H=$(etcdctl get --prefix jobs/ -w fields 2>/dev/null | sed -n 's/^"CreateRevision" : //p' | sed -n 1p)
    [ -n "$H" ] && break
    sleep 0.1
done
[ -n "$H" ] || { echo "FAIL: holder Z never got the lock"; exit 1; }
echo "  holder Z's token (hand-over revision) H = $H"
wait_for "hand-over revision seen by the watch" "$H" "$PGPORT_TEST" postgres \
    "SELECT handover_revision FROM fencing_watches WHERE resource = 'jobs'"
expect "stored mark (Z never wrote)" 30 "$("${PSQL[@]}" -Atc "SELECT high_water FROM _pg_fencing.resource_high_water WHERE resource = 'jobs'")"
expect "on the original: a write with H - 1" FT001 "$(stale_write "$PGPORT_TEST" postgres $((H - 1)))"
# The standby has replayed the registration.
wait_for "the standby has the registration" 1 "$PORT2" postgres "SELECT count(*) FROM _pg_fencing.watch"

echo "== pg_dump / pg_restore into a new database"
"$PGBIN/pg_dump" -Fc -f "$WORK/dump" postgres
"${PSQL[@]}" -c "CREATE DATABASE restored"
"$PGBIN/pg_restore" -d restored "$WORK/dump"
expect "restored: watch listed" jobs "$("${PSQL[@]}" -d restored -Atc "SELECT resource FROM fencing_watches")"
expect_shape -d restored
expect "restored: a write with H - 1" FT001 "$(stale_write "$PGPORT_TEST" restored $((H - 1)))"
expect "restored: Z's own write with H" ok "$(stale_write "$PGPORT_TEST" restored "$H")"

echo "== the standby, promoted"
as_pg "$PGBIN/pg_ctl" -D "$STANDBY" -w promote >/dev/null
wait_for "promoted: out of recovery" f "$PORT2" postgres "SELECT pg_is_in_recovery()"
expect "promoted: a write with H - 1" FT001 "$(stale_write "$PORT2" postgres $((H - 1)))"
expect "promoted: watch listed" jobs "$("${PSQL[@]}" -p "$PORT2" -Atc "SELECT resource FROM fencing_watches")"
expect_shape -p "$PORT2"
as_pg "$PGBIN/pg_ctl" -D "$STANDBY" -m fast -w stop >/dev/null

echo "== point-in-time recovery from the base backup to a restore point after the hand-over"
seg=$("${PSQL[@]}" -Atc "SELECT pg_walfile_name(pg_create_restore_point('after_handover'))")
"${PSQL[@]}" -Atc "SELECT pg_switch_wal()" >/dev/null
"${PSQL[@]}" -Atc "CHECKPOINT" >/dev/null
# The segment holding the restore point was closed by pg_switch_wal; wait (up to 60 s) until it
# is archived (recovery needs it to reach the restore point).
for _ in $(seq 1 600); do
    [ -f "$WORK/archive/$seg" ] && break
    sleep 0.1
done
expect "the segment with the restore point is archived" yes "$([ -f "$WORK/archive/$seg" ] && echo yes || echo no)"
cat >>"$PITR/postgresql.conf" <<CONF
port = $PORT2
restore_command = 'cp $WORK/archive/%f %p'
archive_mode = off
recovery_target_timeline = '1'
recovery_target_name = 'after_handover'
recovery_target_action = 'promote'
CONF
touch "$PITR/recovery.signal"
chown postgres:postgres "$PITR/recovery.signal"
pg_ctl_start "$PITR" "$WORK/pitr.log" 120
wait_for "recovered: out of recovery" f "$PORT2" postgres "SELECT pg_is_in_recovery()"
expect "recovered: a write with H - 1" FT001 "$(stale_write "$PORT2" postgres $((H - 1)))"
expect "recovered: watch listed" jobs "$("${PSQL[@]}" -p "$PORT2" -Atc "SELECT resource FROM fencing_watches")"
expect_shape -p "$PORT2"
as_pg "$PGBIN/pg_ctl" -D "$PITR" -m fast -w stop >/dev/null

echo "== pg_upgrade (copy mode) to a new cluster"
as_pg "$PGBIN/pg_ctl" -D "$PGDATA_TEST" -m fast -w stop >/dev/null
NEWDATA="$WORK/newdata"
mkdir -p "$NEWDATA" && chown postgres:postgres "$NEWDATA"
as_pg "$PGBIN/initdb" -D "$NEWDATA" -U postgres -A trust --no-sync >"$WORK/initdb2.log" 2>&1
cat >>"$NEWDATA/postgresql.conf" <<CONF
port = $PGPORT_TEST
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORK'
fsync = off
$CONF
CONF
mkdir -p "$WORK/upgrade" && chown postgres:postgres "$WORK/upgrade"
if ! (cd "$WORK/upgrade" && as_pg "$PGBIN/pg_upgrade" -b "$PGBIN" -B "$PGBIN" -d "$PGDATA_TEST" -D "$NEWDATA" \
        -p $((PGPORT_TEST + 2)) -P $((PGPORT_TEST + 3)) -U postgres) >"$WORK/pg_upgrade.log" 2>&1; then
    echo "FAIL: pg_upgrade"; cat "$WORK/pg_upgrade.log"; exit 1
fi
pg_ctl_start "$NEWDATA" "$WORK/new.log" 60
expect "upgraded: watch listed" jobs "$("${PSQL[@]}" -Atc "SELECT resource FROM fencing_watches")"
expect_shape
expect "upgraded: a write with H - 1" FT001 "$(stale_write "$PGPORT_TEST" postgres $((H - 1)))"
expect "upgraded: Z's own write with H" ok "$(stale_write "$PGPORT_TEST" postgres "$H")"

echo "== the carried watch keeps working: Z hands the lock to A"
kill -TERM -- "-$Z_PID" 2>/dev/null || kill "$Z_PID"
wait "$Z_PID" 2>/dev/null || true
CHILD_PIDS=""
setsid etcdctl lock jobs -- sleep 600 >"$WORK/a.out" 2>&1 &
A_PID=$!
CHILD_PIDS="$A_PID"
A=""
for _ in $(seq 1 300); do
    A=$(etcdctl get --prefix jobs/ -w fields 2>/dev/null | sed -n 's/^"CreateRevision" : //p' | sed -n 1p)
    [ -n "$A" ] && [ "$A" != "$H" ] && break
    sleep 0.1
done
wait_for "upgraded: hand-over to A seen" "$A" "$PGPORT_TEST" postgres \
    "SELECT handover_revision FROM fencing_watches WHERE resource = 'jobs'"
expect "upgraded: Z's write after the hand-over" FT001 "$(stale_write "$PGPORT_TEST" postgres "$H")"
exit $fail
