#!/usr/bin/env bash
# A Citus worker partitioned away by the network (issue 45; docs/citus.md, "What holds"): a
# coordinator on 127.0.0.1:${PGPORT_CITUS_PARTITION:-54488} and a worker on the port two above it,
# both also on a bridge, and a second worker in a network namespace of its own behind a veth
# pair; blackhole routes on both sides cut it off without closing anything (no refused
# connection, no reset: packets vanish). tests/citus/partition.py then shows, with
# Citus's connections bounded by `citus.node_conninfo` (tcp_user_timeout) and
# `citus.node_connection_timeout` as docs/citus.md advises: writes that need the cut-off worker
# fail and never pass unchecked, writes on the reachable worker keep the fence, a distributed
# transaction whose COMMIT loses the worker half-way raises no mark and leaves no row, Citus's
# two-phase-commit recovery after the network is back keeps that, writes entering at the cut-off
# worker itself (which has Citus's metadata) are refused (FT004), and the stale holder is refused
# on the worker's shards (which the newer holder never wrote) once it is reachable again.
# Needs root (ip netns, ip route) and Citus installed into PostgreSQL 18 (tests/citus/build.sh).
#
#   tests/citus/partition.sh          (KEEP_WORK=1 keeps the nodes' directories and logs)
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh
PGBIN=$PG18_BIN
need_python
if [ "$(id -u)" -ne 0 ]; then
    echo "FAIL: tests/citus/partition.sh needs root: it makes a network namespace (ip netns) and cuts it off (ip route)" >&2
    exit 1
fi
tests/citus/build.sh

# A subnet and names of this run's own.
NET=10.79.$(( $$ % 250 ))
TAG=pgfc$$
BR="${TAG}br"
NS="${TAG}-w2"
PORT=${PGPORT_CITUS_PARTITION:-54488}
W1PORT=$((PORT + 2))
fresh_workdir
chown postgres:postgres "$WORK"
cleanup() {
    local n
    for n in coordinator worker1 worker2; do
        [ -f "$WORK/$n/postmaster.pid" ] && as_pg "$PGBIN/pg_ctl" -D "$WORK/$n" -m immediate -w -t 60 stop >/dev/null 2>&1 || true
    done
    ip netns del "$NS" 2>/dev/null || true
    ip link del "$BR" 2>/dev/null || true
    if [ -z "${KEEP_WORK:-}" ]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip link add "$BR" type bridge
ip addr add "$NET.254/24" dev "$BR"
ip link set "$BR" up
ip netns add "$NS"
ip link add "v$NS" type veth peer name eth0 netns "$NS"
ip link set "v$NS" master "$BR" up
ip netns exec "$NS" ip addr add "$NET.2/24" dev eth0
ip netns exec "$NS" ip link set eth0 up
ip netns exec "$NS" ip link set lo up

node() {  # node <name> <port> <listen_addresses>
    mkdir -p "$WORK/$1.sock" && chown postgres:postgres "$WORK/$1.sock"
    as_pg "$PGBIN/initdb" -D "$WORK/$1" -U postgres -A trust --no-sync >"$WORK/$1.initdb.log" 2>&1
    cat >>"$WORK/$1/postgresql.conf" <<CONF
port = $2
listen_addresses = '$3'
unix_socket_directories = '$WORK/$1.sock'
fsync = off
shared_preload_libraries = 'citus,pg_fencing'
max_prepared_transactions = 20
wal_level = logical
log_line_prefix = '%m [%p] %a: '
citus.node_connection_timeout = 3000
citus.node_conninfo = 'sslmode=disable tcp_user_timeout=3000'
CONF
    echo "host all all $NET.0/24 trust" >>"$WORK/$1/pg_hba.conf"
}
node coordinator "$PORT" "127.0.0.1,$NET.254"
node worker1 "$W1PORT" "127.0.0.1,$NET.254"
node worker2 5432 "$NET.2"
pg_ctl_start "$WORK/coordinator" "$WORK/coordinator.log"
pg_ctl_start "$WORK/worker1" "$WORK/worker1.log"
ip netns exec "$NS" sudo -u postgres "$PGBIN/pg_ctl" -D "$WORK/worker2" -l "$WORK/worker2.log" -w -t 60 start >/dev/null
for sock in coordinator:"$PORT" worker1:"$W1PORT" worker2:5432; do
    "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK/${sock%%:*}.sock" -p "${sock##*:}" -U postgres \
        -c "CREATE EXTENSION citus" -c "CREATE EXTENSION pg_fencing"
done
"$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres \
    -c "SELECT citus_set_coordinator_host('$NET.254', $PORT)" \
    -c "SELECT citus_add_node('$NET.254', $W1PORT)" \
    -c "SELECT citus_add_node('$NET.2', 5432)" >/dev/null
echo "  a coordinator ($NET.254:$PORT), worker1 ($NET.254:$W1PORT), worker2 ($NET.2:5432 in namespace $NS)"

"$PY" tests/citus/partition.py --coordinator "host=127.0.0.1 port=$PORT user=postgres dbname=postgres" \
    --worker2 "host=$WORK/worker2.sock port=5432 user=postgres dbname=postgres" \
    --worker2-port 5432 --namespace "$NS" --host-ip "$NET.254" --worker2-ip "$NET.2"
