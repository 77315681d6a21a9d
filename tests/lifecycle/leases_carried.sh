#!/usr/bin/env bash
# PostgreSQL lease tokens never go back (docs/leases.md, "Tokens"), on every path that copies or
# moves the database: every new token is above every token any lease of the cluster had before,
# also tokens the copy never saw, and a token the copy never saw is refused (FT003) there.
#   1. crash (immediate stop) and restart, the grant committed with synchronous_commit = off;
#   2. promotion of a standby that missed the last grants (stopped before them, promoted alone);
#   3. point-in-time recovery to a restore point before the last grants;
#   4. pg_dump / pg_restore into a new cluster while the source goes on granting, and into
#      another database of the same cluster; CREATE DATABASE ... TEMPLATE;
#   5. pg_upgrade (copy mode, same major; 15 to 18 is tests/lifecycle/major_upgrade.sh).
# Throwaway servers on 127.0.0.1:${PGPORT_LEASE_LIFECYCLE:-54491} (+1 standby, +2 recovered, +3
# restored, +4/+5 during pg_upgrade).
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh

CHILD_PIDS=""
fresh_workdir
EXTRA_DIRS=()
cleanup() {
    for d in "${EXTRA_DIRS[@]}"; do
        if [ -f "$d/postmaster.pid" ]; then
            as_pg "$PGBIN/pg_ctl" -D "$d" -m immediate -w stop >/dev/null 2>&1 || true
        fi
    done
    cleanup_all
}
trap cleanup EXIT
trap 'exit 130' INT TERM
PGPORT_TEST=${PGPORT_LEASE_LIFECYCLE:-54491}
STANDBY_PORT=$((PGPORT_TEST + 1))
PITR_PORT=$((PGPORT_TEST + 2))
RESTORED_PORT=$((PGPORT_TEST + 3))
fail=0
mkdir -p "$WORK/archive"
[ "$(id -u)" -eq 0 ] && chown postgres:postgres "$WORK/archive"
PG_EXTRA_CONF="wal_level = replica
archive_mode = on
archive_command = 'cp %p $WORK/archive/%f'" pg_start
PSQL=(psql -X -q -v ON_ERROR_STOP=1 -At)

# The highest token any server of this test granted, and the primary's own. A copy's tokens must
# be above every token granted before it, on any server; the primary, which goes on granting
# after a copy branched off, is only held to its own (a copy's may be higher).
MAX=0
PRIMARY_MAX=0
TOK=0
grant() {  # grant <port> <name> <where>: TOK = a new lease's token, checked as above
    local above=$MAX
    [ "$3" = primary ] && above=$PRIMARY_MAX
    TOK=$("${PSQL[@]}" -p "$1" -c "SELECT fencing_lease_acquire('$2', '1 hour')")
    expect "$3: lease '$2' got a token above every earlier one ($above)" t "$([ "$TOK" -gt "$above" ] && echo t || echo f)"
    [ "$TOK" -gt "$MAX" ] && MAX=$TOK
    [ "$3" = primary ] && PRIMARY_MAX=$TOK
    return 0
}
write() {  # write <port> <token>: the SQLSTATE of a write carrying it
    sqlstate_of "${PSQL[@]}" -p "$1" -c "BEGIN; SET LOCAL pg_fencing.token = '$2'; UPDATE ledger SET v = v + 1 WHERE id = 1; COMMIT;"
}

"${PSQL[@]}" -o /dev/null <<'SQL'
CREATE EXTENSION pg_fencing;
CREATE TABLE ledger (id int PRIMARY KEY, v bigint);
SELECT fencing_protect('ledger');
SQL
grant "$PGPORT_TEST" first primary
"${PSQL[@]}" -c "BEGIN; SET LOCAL pg_fencing.token = '$TOK'; INSERT INTO ledger VALUES (1, 0); COMMIT;" >/dev/null

echo "== 1. crash and restart: a grant committed asynchronously, then kill -9 of the server"
C=$("${PSQL[@]}" -c "SET synchronous_commit = off; SELECT fencing_lease_acquire('async', '1 hour')" | tail -1)
MAX=$C
PRIMARY_MAX=$C
as_pg "$PGBIN/pg_ctl" -D "$PGDATA_TEST" -m immediate -w stop >/dev/null
pg_ctl_start "$PGDATA_TEST" "$WORK/postgres.log"
expect "restarted: the asynchronously committed grant is there (the grant forces its commit's flush)" t \
    "$("${PSQL[@]}" -c "SELECT live FROM fencing_leases WHERE token = $C")"
grant "$PGPORT_TEST" after_crash restarted
PRIMARY_MAX=$TOK

echo "== a standby and a base backup (for point-in-time recovery)"
STANDBY="$WORK/standby"
PITR="$WORK/pitr"
EXTRA_DIRS+=("$STANDBY" "$PITR")
mkdir -p "$STANDBY" && chown postgres:postgres "$STANDBY" && chmod 700 "$STANDBY"
as_pg "$PGBIN/pg_basebackup" -h 127.0.0.1 -p "$PGPORT_TEST" -U postgres -D "$STANDBY" -R -X stream >/dev/null
cp -a "$STANDBY" "$PITR"
rm -f "$PITR/standby.signal"
printf 'port = %s\narchive_mode = off\n' "$STANDBY_PORT" >>"$STANDBY/postgresql.conf"
pg_ctl_start "$STANDBY" "$WORK/standby.log" 60
grant "$PGPORT_TEST" seen_by_standby primary
S=$TOK
wait_for "the standby replayed lease 'seen_by_standby'" 1 "$STANDBY_PORT" postgres \
    "SELECT count(*) FROM fencing_leases WHERE name = 'seen_by_standby'"

echo "== 2. the standby stops; the primary grants more; the standby is promoted without them"
as_pg "$PGBIN/pg_ctl" -D "$STANDBY" -m fast -w stop >/dev/null
# The segment holding the restore point, which recovery needs (archived once pg_switch_wal below
# closed it, or an earlier one).
seg=$("${PSQL[@]}" -c "SELECT pg_walfile_name(pg_create_restore_point('before_last_grants'))")
# More grants than a sequence logs ahead of itself in WAL (32), so that no replayed sequence can
# be ahead of them by chance.
MISSED=$("${PSQL[@]}" -c "SELECT max(fencing_lease_acquire('missed_' || g, '1 hour')) FROM generate_series(1, 40) g")
grant "$PGPORT_TEST" missed_by_copies primary
MISSED=$TOK
"${PSQL[@]}" -o /dev/null -c "SELECT pg_switch_wal()"
# No more streaming: pg_basebackup -R put primary_conninfo into postgresql.auto.conf.
sed -i '/primary_conninfo/d' "$STANDBY/postgresql.auto.conf"
pg_ctl_start "$STANDBY" "$WORK/standby.log" 60
as_pg "$PGBIN/pg_ctl" -D "$STANDBY" -w promote >/dev/null
wait_for "promoted: out of recovery" f "$STANDBY_PORT" postgres "SELECT pg_is_in_recovery()"
expect "promoted: it never saw lease 'missed_by_copies'" 0 \
    "$("${PSQL[@]}" -p "$STANDBY_PORT" -c "SELECT count(*) FROM fencing_leases WHERE name = 'missed_by_copies'")"
grant "$STANDBY_PORT" on_promoted promoted
expect "promoted: a write with the primary's token it never saw" FT003 "$(write "$STANDBY_PORT" "$MISSED")"
expect "promoted: a write with a lease it replayed" ok "$(write "$STANDBY_PORT" "$S")"
as_pg "$PGBIN/pg_ctl" -D "$STANDBY" -m fast -w stop >/dev/null

echo "== 3. point-in-time recovery to the restore point before the last grants"
# Recovery needs the segment with the restore point in the archive: waited for (up to 60 s).
for _ in $(seq 1 600); do
    [ -f "$WORK/archive/$seg" ] && break
    sleep 0.1
done
expect "the segment with the restore point is archived" yes "$([ -f "$WORK/archive/$seg" ] && echo yes || echo no)"
cat >>"$PITR/postgresql.conf" <<CONF
port = $PITR_PORT
restore_command = 'cp $WORK/archive/%f %p'
archive_mode = off
recovery_target_name = 'before_last_grants'
recovery_target_action = 'promote'
CONF
touch "$PITR/recovery.signal"
chown postgres:postgres "$PITR/recovery.signal"
pg_ctl_start "$PITR" "$WORK/pitr.log" 120
wait_for "recovered: out of recovery" f "$PITR_PORT" postgres "SELECT pg_is_in_recovery()"
expect "recovered: lease 'seen_by_standby' is there, 'missed_by_copies' is not" "1|0" \
    "$("${PSQL[@]}" -p "$PITR_PORT" -c "SELECT count(*) FILTER (WHERE name = 'seen_by_standby'), count(*) FILTER (WHERE name = 'missed_by_copies') FROM fencing_leases")"
grant "$PITR_PORT" on_recovered recovered
expect "recovered: a write with the primary's token it never saw" FT003 "$(write "$PITR_PORT" "$MISSED")"
as_pg "$PGBIN/pg_ctl" -D "$PITR" -m fast -w stop >/dev/null

echo "== 4. pg_dump, the source grants more, pg_restore into a new cluster"
grant "$PGPORT_TEST" live_at_dump primary
LIVE=$TOK
"$PGBIN/pg_dump" -Fc -f "$WORK/dump" postgres
"${PSQL[@]}" -o /dev/null -c "SELECT fencing_lease_acquire('after_dump_' || g, '1 hour') FROM generate_series(1, 40) g"
grant "$PGPORT_TEST" after_dump primary
AFTER_DUMP=$TOK
# The same dump restored into another database of the same cluster, and a database made from
# the source as a template: the same server history, but another database.
"${PSQL[@]}" -c "CREATE DATABASE restored_here"
"$PGBIN/pg_restore" -d restored_here "$WORK/dump"
grant_in() {  # grant_in <database> <name>: as grant, in another database of the primary
    TOK=$("${PSQL[@]}" -d "$1" -c "SELECT fencing_lease_acquire('$2', '1 hour')")
    expect "$1: lease '$2' got a token above every earlier one ($MAX)" t "$([ "$TOK" -gt "$MAX" ] && echo t || echo f)"
    [ "$TOK" -gt "$MAX" ] && MAX=$TOK
    return 0
}
grant_in restored_here on_restored_here
expect "restored_here: a write with the source's token granted after the dump" FT003 \
    "$(sqlstate_of "${PSQL[@]}" -d restored_here -c "BEGIN; SET LOCAL pg_fencing.token = '$AFTER_DUMP'; UPDATE ledger SET v = v + 1 WHERE id = 1; COMMIT;")"
"${PSQL[@]}" -o /dev/null -c "SELECT fencing_lease_acquire('before_template_' || g, '1 hour') FROM generate_series(1, 40) g"
PRIMARY_MAX=$("${PSQL[@]}" -c "SELECT max(token) FROM fencing_leases")
[ "$PRIMARY_MAX" -gt "$MAX" ] && MAX=$PRIMARY_MAX
# A template must have no other connections: the backend of the last psql may still be on its
# way out (CREATE DATABASE waits 5 s for that itself); tried again for up to 60 s.
for _ in $(seq 1 12); do
    "${PSQL[@]}" -c "CREATE DATABASE copied TEMPLATE postgres" 2>/dev/null && break
    sleep 0.5
done
"${PSQL[@]}" -Atc "SELECT 1 FROM pg_database WHERE datname = 'copied'" | grep -q 1 \
    || "${PSQL[@]}" -c "CREATE DATABASE copied TEMPLATE postgres"
grant "$PGPORT_TEST" after_template primary
grant_in copied on_copied
RESTORED="$WORK/restored"
EXTRA_DIRS+=("$RESTORED")
mkdir -p "$RESTORED" && chown postgres:postgres "$RESTORED"
as_pg "$PGBIN/initdb" -D "$RESTORED" -U postgres -A trust --no-sync >"$WORK/initdb-restored.log" 2>&1
printf "port = %s\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nfsync = off\n" \
    "$RESTORED_PORT" "$WORK" >>"$RESTORED/postgresql.conf"
pg_ctl_start "$RESTORED" "$WORK/restored.log"
"$PGBIN/pg_restore" -p "$RESTORED_PORT" -d postgres "$WORK/dump"
expect "restored: the lease live at the dump is listed" t \
    "$("${PSQL[@]}" -p "$RESTORED_PORT" -c "SELECT live FROM fencing_leases WHERE token = $LIVE")"
grant "$RESTORED_PORT" on_restored restored
expect "restored: a write with the source's token granted after the dump" FT003 "$(write "$RESTORED_PORT" "$AFTER_DUMP")"
as_pg "$PGBIN/pg_ctl" -D "$RESTORED" -m fast -w stop >/dev/null

echo "== 5. pg_upgrade (copy mode) of the primary"
as_pg "$PGBIN/pg_ctl" -D "$PGDATA_TEST" -m fast -w stop >/dev/null
NEWDATA="$WORK/newdata"
EXTRA_DIRS+=("$NEWDATA")
mkdir -p "$NEWDATA" && chown postgres:postgres "$NEWDATA"
as_pg "$PGBIN/initdb" -D "$NEWDATA" -U postgres -A trust --no-sync >"$WORK/initdb2.log" 2>&1
printf "port = %s\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nfsync = off\n" \
    "$PGPORT_TEST" "$WORK" >>"$NEWDATA/postgresql.conf"
mkdir -p "$WORK/upgrade" && chown postgres:postgres "$WORK/upgrade"
if ! (cd "$WORK/upgrade" && as_pg "$PGBIN/pg_upgrade" -b "$PGBIN" -B "$PGBIN" -d "$PGDATA_TEST" -D "$NEWDATA" \
        -p $((PGPORT_TEST + 4)) -P $((PGPORT_TEST + 5)) -U postgres) >"$WORK/pg_upgrade.log" 2>&1; then
    echo "FAIL: pg_upgrade"; cat "$WORK/pg_upgrade.log"; exit 1
fi
pg_ctl_start "$NEWDATA" "$WORK/new.log" 60
expect "upgraded: the lease live before is still live" t \
    "$("${PSQL[@]}" -c "SELECT live FROM fencing_leases WHERE token = $LIVE")"
grant "$PGPORT_TEST" on_upgraded upgraded
expect "upgraded: the live lease's write" ok "$(write "$PGPORT_TEST" "$LIVE")"
exit $fail
