#!/usr/bin/env bash
# pg_fencing on a Citus cluster (issue 45; docs/citus.md): Citus 14.0.1 built and installed into
# PostgreSQL 18 (tests/citus/build.sh, which fails without a source of Citus), then a coordinator
# and two workers on 127.0.0.1:${PGPORT_CITUS:-54484} and the two ports above it, each preloading
# citus and pg_fencing, with both extensions in their database. What holds today:
#   - fencing_protect of a table Citus manages (hash-distributed, reference, Citus local, a
#     partition of a distributed table) is refused with 0A000, nothing half made: the table keeps
#     no trigger of ours and no protection row, on the coordinator and on the workers;
#   - Citus refuses to distribute a protected table (it has triggers), which stays a protected
#     table of the coordinator: its fence holds there (a stale write refused with FT001, the
#     current holder admitted);
#   - a table taken back from Citus (undistribute_table) can be protected and fences its writes;
#   - and what docs/citus.md reports of Citus for the design: a stable SET expression reaches the
#     shard as its value, volatile UPDATE functions and non-immutable RETURNING are refused.
#
#   tests/citus/run.sh          (KEEP_WORK=1 keeps the clusters' directories and logs)
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh
PGBIN=$PG18_BIN

tests/citus/build.sh

CHILD_PIDS=""
fresh_workdir
[ "$(id -u)" -eq 0 ] && chown postgres:postgres "$WORK"
BASE=${PGPORT_CITUS:-54484}
NODES="coordinator worker1 worker2"
stop_nodes() {
    for n in $NODES; do
        [ -f "$WORK/$n/postmaster.pid" ] && as_pg "$PGBIN/pg_ctl" -D "$WORK/$n" -m immediate -w -t 60 stop >/dev/null 2>&1 || true
    done
    if [ -n "${WORK:-}" ] && [ -z "${KEEP_WORK:-}" ]; then rm -rf "$WORK"; fi
}
trap stop_nodes EXIT
trap 'exit 130' INT TERM
i=0
for n in $NODES; do
    port=$((BASE + i)); i=$((i + 1))
    as_pg "$PGBIN/initdb" -D "$WORK/$n" -U postgres -A trust --no-sync >"$WORK/$n.initdb.log" 2>&1
    cat >>"$WORK/$n/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORK'
fsync = off
shared_preload_libraries = 'citus,pg_fencing'
max_prepared_transactions = 20
wal_level = logical
CONF
    pg_ctl_start "$WORK/$n" "$WORK/$n.log"
    "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres \
        -c "CREATE EXTENSION citus" -c "CREATE EXTENSION pg_fencing"
done
C=(-h 127.0.0.1 -p "$BASE" -U postgres)
PSQL=("$PGBIN/psql" -X -q -v ON_ERROR_STOP=1)
q() { "${PSQL[@]}" "${C[@]}" -Atc "$1"; }
qon() { "${PSQL[@]}" -h 127.0.0.1 -p "$1" -U postgres -Atc "$2"; }
state() { sqlstate_of "${PSQL[@]}" "${C[@]}" -c "$1"; }
write() { state "BEGIN; SET LOCAL pg_fencing.token = '$1'; $2; COMMIT;"; }
q "SELECT citus_set_coordinator_host('127.0.0.1', $BASE)" >/dev/null
q "SELECT citus_add_node('127.0.0.1', $((BASE + 1)))" >/dev/null
q "SELECT citus_add_node('127.0.0.1', $((BASE + 2)))" >/dev/null
expect "the cluster: Citus $(q "SELECT extversion FROM pg_extension WHERE extname = 'citus'") with two active workers" \
    2 "$(q "SELECT count(*) FROM pg_dist_node WHERE isactive AND noderole = 'primary' AND nodeport <> $BASE")"

# Nothing of a refused fencing_protect is left on any node: no trigger of ours, no protection.
nothing_left() {  # nothing_left <table>
    local n port
    for n in 0 1 2; do
        port=$((BASE + n))
        expect "node :$port: no trigger of pg_fencing on $1 or its shards" 0 \
            "$(qon "$port" "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'zz_pg_fencing%' AND tgrelid::regclass::text LIKE '$1%'")"
        expect "node :$port: no protection of $1 or its shards" 0 \
            "$(qon "$port" "SELECT count(*) FROM _pg_fencing.protected_table WHERE relid::regclass::text LIKE '$1%'")"
    done
}

q "CREATE TABLE ledger (account int PRIMARY KEY, v int)"
q "SELECT create_distributed_table('ledger', 'account')" >/dev/null
expect "fencing_protect of a hash-distributed table (resource mode)" 0A000 "$(state "SELECT fencing_protect('ledger', 'settlement')")"
expect "fencing_protect of a hash-distributed table (per-row mode)" 0A000 "$(state "SELECT fencing_protect('ledger')")"
nothing_left ledger
q "CREATE TABLE codes (id int PRIMARY KEY, v int)"
q "SELECT create_reference_table('codes')" >/dev/null
expect "fencing_protect of a reference table" 0A000 "$(state "SELECT fencing_protect('codes', 'codes')")"
nothing_left codes
q "CREATE TABLE local_meta (id int PRIMARY KEY, v int)"
q "SELECT citus_add_local_table_to_metadata('local_meta')" >/dev/null
expect "fencing_protect of a Citus local table" 0A000 "$(state "SELECT fencing_protect('local_meta')")"
nothing_left local_meta
q "CREATE TABLE events (id int, at date, v int, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)"
q "CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')"
q "SELECT create_distributed_table('events', 'id')" >/dev/null
expect "fencing_protect of a distributed partitioned table" 0A000 "$(state "SELECT fencing_protect('events')")"
expect "fencing_protect of a partition of a distributed table" 0A000 "$(state "SELECT fencing_protect('events_2026')")"
nothing_left events

# A protected table: Citus refuses to distribute it (its own error: the table has triggers), and
# it stays a protected table of the coordinator.
q "CREATE TABLE jobs (id int PRIMARY KEY, v int)"
q "SELECT fencing_protect('jobs', 'jobs')" >/dev/null
expect "a current holder's write to the protected table" ok "$(write 10 "INSERT INTO jobs VALUES (1, 1)")"
# (Citus's own SQLSTATEs, as docs/citus.md gives them.)
expect "create_distributed_table of a protected table is refused by Citus (it has triggers)" XX000 \
    "$(state "SELECT create_distributed_table('jobs', 'id')")"
expect "create_reference_table of a protected table is refused by Citus" XX000 \
    "$(state "SELECT create_reference_table('jobs')")"
expect "citus_add_local_table_to_metadata of a protected table is refused (the triggers' names)" 42710 \
    "$(state "SELECT citus_add_local_table_to_metadata('jobs')")"
q "ALTER TABLE jobs ADD COLUMN code int"
expect "a foreign key from a protected table to a reference table (Citus would make it a Citus local table) is refused" 42710 \
    "$(state "ALTER TABLE jobs ADD FOREIGN KEY (code) REFERENCES codes (id)")"
expect "the table stayed out of Citus's metadata" 0 "$(q "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = 'jobs'::regclass")"
expect "the protection is active" t "$(q "SELECT active FROM fencing_protected_tables WHERE relation = 'jobs'::regclass")"
expect "a stale write to it is refused" FT001 "$(write 9 "UPDATE jobs SET v = 2 WHERE id = 1")"
expect "the current holder's write" ok "$(write 10 "UPDATE jobs SET v = 3 WHERE id = 1")"

# A table taken back from Citus can be protected; its fence holds.
q "SELECT undistribute_table('ledger')" >/dev/null 2>&1
expect "fencing_protect of a table taken back from Citus (undistribute_table)" ok "$(state "SELECT fencing_protect('ledger', 'settlement')")"
expect "a write with 20" ok "$(write 20 "INSERT INTO ledger VALUES (1, 1)")"
expect "a stale write with 19" FT001 "$(write 19 "UPDATE ledger SET v = 2 WHERE account = 1")"
# What docs/citus.md, "What is left", reports of Citus, on an unprotected distributed table: a
# stable SET expression reaches the shard as a value; volatile functions in an UPDATE and
# non-immutable ones in RETURNING are refused.
q "CREATE TABLE probe (account int PRIMARY KEY, v int, fence_token bigint)"
q "SELECT create_distributed_table('probe', 'account')" >/dev/null
shard_query=$("${PSQL[@]}" "${C[@]}" -At -c "SET pg_fencing.token = '7'" \
    -c "EXPLAIN (VERBOSE, COSTS OFF) UPDATE probe SET v = 1, fence_token = current_setting('pg_fencing.token')::bigint WHERE account = 1" \
    | grep -c "fence_token = '7'::bigint" || true)
expect "a stable SET expression reaches the shard as its value" 1 "$shard_query"
expect "a volatile function in a distributed UPDATE is refused by Citus" 0A000 \
    "$(state "UPDATE probe SET v = random()::int WHERE account = 1")"
expect "a non-immutable function in a distributed RETURNING list is refused by Citus" 0A000 \
    "$(state "UPDATE probe SET v = 1 WHERE account = 1 RETURNING current_setting('pg_fencing.token', true)")"
[ "${fail:-0}" -eq 0 ] || { echo "citus: FAILED"; exit 1; }
echo "citus: all checks passed"
