#!/usr/bin/env bash
# A lease token that a copy of the database cannot place is refused there with FT003, also when
# the copy lost the database's FIRST grant, so that the copy's database has never granted a lease
# (docs/leases.md, "The time fence" and "Tokens"): unknown never means admitted. In each case a
# database grants its first lease and writes with the token (the source admits it), a copy loses
# that history, and the copy refuses the token on every write path (INSERT into a resource-mode
# and a per-row-mode table, fenced_insert, fencing_advance) before it grants anything itself;
# tokens below 2^48 still work there, and the copy's own first grant is above the lost token.
#   1. promotion of an asynchronous standby stopped before the first grant (the primary dies);
#   2. point-in-time recovery to a restore point taken before the first grant;
#   3. split brain then pg_rewind: the old primary grants after the standby's promotion, is
#      rewound to the new primary and follows it; refused on the new primary, and on the rewound
#      node once it is promoted (step 1 promotes it);
#   4. pg_dump before the first grant, restored into a new database while the source grants on.
# One primary/standby pair serves 3 then 1 (the rewound old primary is step 1's standby); each
# step uses a database of its own, so each grant is its database's first.
# Throwaway servers on 127.0.0.1:${PGPORT_LIFECYCLE4:-54481} (primary, +1 standby, +2 recovered).
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
PGPORT_TEST=${PGPORT_LIFECYCLE4:-54481}
PRIMARY_PORT=$PGPORT_TEST
STANDBY_PORT=$((PGPORT_TEST + 1))
PITR_PORT=$((PGPORT_TEST + 2))
LEASE_MIN=281474976710656  # 2^48: lease tokens are at or above it
fail=0
started=$SECONDS
mkdir -p "$WORK/archive"
[ "$(id -u)" -eq 0 ] && chown postgres:postgres "$WORK/archive"
# pg_rewind (step 3) needs wal_log_hints (or data checksums), and the old primary's WAL back to
# the last checkpoint before the split: its shutdown checkpoint would recycle it.
PG_EXTRA_CONF="wal_level = replica
wal_log_hints = on
wal_keep_size = '512MB'
archive_mode = on
archive_command = 'cp %p $WORK/archive/%f'" pg_start
PRIMARY="$PGDATA_TEST"
PSQL=(psql -X -q -v ON_ERROR_STOP=1 -At)
q() {  # q <port> <database> <sql>: its result
    "${PSQL[@]}" -p "$1" -d "$2" -c "$3"
}

# The write paths, each in a transaction of its own and with its own key (per-row mode), so that
# no write meets another's row; one session for the four, so that a short lease (step 1) is
# still live for all of them on the source. Each prints its SQLSTATE (00000: ok).
write_paths() {  # write_paths <what> <port> <database> <token> <key> <expected SQLSTATE or ok>
    local what=$1 want=$6 out path got
    out=$(psql -X -q -At -p "$2" -d "$3" -v tok="$4" -v key="$5" -v key2="$(($5 + 100))" \
        2>>"$WORK/writes.err" <<'SQL'
\o /dev/null
\set LAST_ERROR_SQLSTATE 00000
BEGIN; SET LOCAL pg_fencing.token = :'tok'; INSERT INTO res VALUES (:key, 'w'); COMMIT;
\echo INSERT, resource mode=:LAST_ERROR_SQLSTATE
\set LAST_ERROR_SQLSTATE 00000
BEGIN; SET LOCAL pg_fencing.token = :'tok'; INSERT INTO per_row VALUES (:key, 'w'); COMMIT;
\echo INSERT, per-row mode=:LAST_ERROR_SQLSTATE
\set LAST_ERROR_SQLSTATE 00000
SELECT fenced_insert('per_row', jsonb_build_object('id', :key2, 'v', 'f'), :tok);
\echo fenced_insert=:LAST_ERROR_SQLSTATE
\set LAST_ERROR_SQLSTATE 00000
SELECT fencing_advance('adv', :tok);
\echo fencing_advance=:LAST_ERROR_SQLSTATE
SQL
    ) || true
    for path in "INSERT, resource mode" "INSERT, per-row mode" fenced_insert fencing_advance; do
        got=$(printf '%s\n' "$out" | sed -n "s/^$path=//p")
        [ "$got" = 00000 ] && got=ok
        expect "$what: $path" "$want" "$got"
    done
}
# first_grant <what> <port> <database> <ttl>: LOST = the database's first lease token, and the
# source admits it on every write path (key 1).
first_grant() {
    expect "$1: no lease granted in '$3' before" 0 "$(q "$2" "$3" "SELECT count(*) FROM fencing_leases")"
    LOST=$(q "$2" "$3" "SELECT fencing_lease_acquire('job:1', '$4')")
    write_paths "$1: its own token $LOST" "$2" "$3" "$LOST" 1 ok
}
# copy_refuses <what> <port> <database>: the copy never saw lease token LOST; it refuses it
# before it grants anything itself, admits tokens below 2^48, and its own first grant is above.
copy_refuses() {
    local what=$1 port=$2 db=$3 own
    expect "$what: '$db' lists no lease (it lost the database's first grant)" 0 \
        "$(q "$port" "$db" "SELECT count(*) FROM fencing_leases")"
    # What the rule before this one went by: a database whose token sequence was never called
    # had "granted no lease", so it took every token as a foreign one and admitted it.
    expect "$what: its token sequence was never called" f \
        "$(q "$port" "$db" "SELECT is_called FROM _pg_fencing.lease_token_seq")"
    expect "$what: the lost token is a lease token (>= 2^48)" t "$([ "$LOST" -ge "$LEASE_MIN" ] && echo t || echo f)"
    write_paths "$what: the lost token $LOST" "$port" "$db" "$LOST" 2 FT003
    write_paths "$what: token 7 (below 2^48)" "$port" "$db" 7 3 ok
    own=$(q "$port" "$db" "SELECT fencing_lease_acquire('job:1', '1 hour')")
    expect "$what: its own first grant $own is above the lost token" t "$([ "$own" -gt "$LOST" ] && echo t || echo f)"
    expect "$what: INSERT with its own token" ok "$(sqlstate_of "${PSQL[@]}" -p "$port" -d "$db" \
        -c "BEGIN; SET LOCAL pg_fencing.token = '$own'; INSERT INTO res VALUES (4, 'w'); COMMIT;")"
}

for db in promoted recovered split dumped; do
    "${PSQL[@]}" -c "CREATE DATABASE $db"
    "${PSQL[@]}" -d "$db" -o /dev/null <<'SQL'
CREATE EXTENSION pg_fencing;
CREATE TABLE res (id int PRIMARY KEY, v text);
SELECT fencing_protect('res', 'res');
CREATE TABLE per_row (id int PRIMARY KEY, v text);
SELECT fencing_protect('per_row');
SQL
done

echo "== a streaming standby and a base backup (for point-in-time recovery) [at $((SECONDS - started)) s]"
STANDBY="$WORK/standby"
PITR="$WORK/pitr"
EXTRA_DIRS+=("$STANDBY" "$PITR")
mkdir -p "$STANDBY" && chown postgres:postgres "$STANDBY" && chmod 700 "$STANDBY"
as_pg "$PGBIN/pg_basebackup" -h 127.0.0.1 -p "$PRIMARY_PORT" -U postgres -D "$STANDBY" -R -X stream -c fast >/dev/null
cp -a "$STANDBY" "$PITR"
rm -f "$PITR/standby.signal"
printf 'port = %s\narchive_mode = off\n' "$STANDBY_PORT" >>"$STANDBY/postgresql.conf"
pg_ctl_start "$STANDBY" "$WORK/standby.log" 60

echo "== 2. point-in-time recovery to a restore point before the database's first grant [at $((SECONDS - started)) s]"
# The segment holding the restore point, which recovery needs (archived once pg_switch_wal below
# closed it).
seg=$("${PSQL[@]}" -c "SELECT pg_walfile_name(pg_create_restore_point('before'))")
first_grant "primary, database 'recovered'" "$PRIMARY_PORT" recovered '1 hour'
"${PSQL[@]}" -o /dev/null -c "SELECT pg_switch_wal()"
for _ in $(seq 1 600); do
    [ -f "$WORK/archive/$seg" ] && break
    sleep 0.1
done
expect "the segment with the restore point is archived" yes "$([ -f "$WORK/archive/$seg" ] && echo yes || echo no)"
cat >>"$PITR/postgresql.conf" <<CONF
port = $PITR_PORT
restore_command = 'cp $WORK/archive/%f %p'
archive_mode = off
recovery_target_name = 'before'
recovery_target_action = 'promote'
CONF
touch "$PITR/recovery.signal"
chown postgres:postgres "$PITR/recovery.signal"
pg_ctl_start "$PITR" "$WORK/pitr.log" 120
wait_for "recovered: out of recovery" f "$PITR_PORT" postgres "SELECT pg_is_in_recovery()"
copy_refuses recovered "$PITR_PORT" recovered
as_pg "$PGBIN/pg_ctl" -D "$PITR" -m fast -w stop >/dev/null

echo "== 4. pg_dump before the database's first grant, restored into a new database [at $((SECONDS - started)) s]"
"$PGBIN/pg_dump" -Fc -f "$WORK/dump" dumped
first_grant "source database 'dumped'" "$PRIMARY_PORT" dumped '1 hour'
"${PSQL[@]}" -c "CREATE DATABASE restored"
"$PGBIN/pg_restore" -d restored "$WORK/dump"
copy_refuses "restored database" "$PRIMARY_PORT" restored

echo "== 3. split brain: the standby is promoted while the old primary runs on and grants [at $((SECONDS - started)) s]"
wait_for "the standby streams from the primary" 1 "$PRIMARY_PORT" postgres "SELECT count(*) FROM pg_stat_replication"
as_pg "$PGBIN/pg_ctl" -D "$STANDBY" -w promote >/dev/null
wait_for "new primary: out of recovery" f "$STANDBY_PORT" postgres "SELECT pg_is_in_recovery()"
# pg_rewind reads the source's timeline from its control file, which a promotion updates only at
# its next checkpoint: without one, pg_rewind finds both on timeline 1 and rewinds nothing.
"${PSQL[@]}" -p "$STANDBY_PORT" -c CHECKPOINT
first_grant "old primary after the split, database 'split'" "$PRIMARY_PORT" split '1 hour'
SPLIT_LOST=$LOST
as_pg "$PGBIN/pg_ctl" -D "$PRIMARY" -m fast -w stop >/dev/null
if ! as_pg "$PGBIN/pg_rewind" -D "$PRIMARY" -R \
        --source-server="host=127.0.0.1 port=$STANDBY_PORT user=postgres dbname=postgres" >"$WORK/pg_rewind.log" 2>&1; then
    echo "  FAIL: pg_rewind"; cat "$WORK/pg_rewind.log"; exit 1
fi
if grep -q 'no rewind required' "$WORK/pg_rewind.log"; then
    echo "  FAIL: pg_rewind found nothing to rewind"; cat "$WORK/pg_rewind.log"; exit 1
fi
echo "  ok: pg_rewind of the old primary against the new one"
# pg_rewind copied the new primary's configuration (its port) and wrote standby.signal and a
# primary_conninfo to it (-R).
printf 'port = %s\n' "$PRIMARY_PORT" >>"$PRIMARY/postgresql.conf"
pg_ctl_start "$PRIMARY" "$WORK/postgres.log" 60
wait_for "the rewound old primary streams from the new primary" 1 "$STANDBY_PORT" postgres \
    "SELECT count(*) FROM pg_stat_replication"
wait_for "rewound: the old primary's write after the split is gone" 0 "$PRIMARY_PORT" split \
    "SELECT count(*) FROM res"
copy_refuses "new primary" "$STANDBY_PORT" split

echo "== 1. an asynchronous standby stopped; the primary's first grant; the primary dies; the standby is promoted [at $((SECONDS - started)) s]"
# The standby is the rewound old primary; the primary is the promoted one of step 3.
wait_for "the standby replayed the new primary's lease in 'split'" 1 "$PRIMARY_PORT" split \
    "SELECT count(*) FROM fencing_leases"
as_pg "$PGBIN/pg_ctl" -D "$PRIMARY" -m fast -w stop >/dev/null
first_grant "primary, database 'promoted'" "$STANDBY_PORT" promoted '1 hour'
as_pg "$PGBIN/pg_ctl" -D "$STANDBY" -m immediate -w stop >/dev/null
sed -i '/primary_conninfo/d' "$PRIMARY/postgresql.auto.conf"
pg_ctl_start "$PRIMARY" "$WORK/postgres.log" 60
as_pg "$PGBIN/pg_ctl" -D "$PRIMARY" -w promote >/dev/null
wait_for "promoted: out of recovery" f "$PRIMARY_PORT" postgres "SELECT pg_is_in_recovery()"
copy_refuses promoted "$PRIMARY_PORT" promoted
# The rewound node, promoted: its own token of step 3 it lost in the rewind. Its 'split' has the
# new primary's grant of step 3, so this is refused with the database having granted.
write_paths "promoted rewound node: its own lost token $SPLIT_LOST" "$PRIMARY_PORT" split "$SPLIT_LOST" 5 FT003

echo "== $(basename "$0"): $((SECONDS - started)) s on PostgreSQL $PG_MAJOR"
if [ "$fail" -eq 0 ]; then echo "PASS: $(basename "$0")"; else echo "FAIL: $(basename "$0")"; fi
exit $fail
