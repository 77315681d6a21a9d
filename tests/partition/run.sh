#!/usr/bin/env bash
# Network partitions, Jepsen-style (issue 14): PostgreSQL with pg_fencing's worker and a
# three-member etcd cluster, each in its own network namespace on its own address (a bridge in
# the root namespace joins them), clients taking etcd locks (fencing_acquire and etcdctl lock)
# and writing with their tokens while tests/partition/partition.py cuts, isolates and slows the
# links on a randomized schedule; then tests/stress/stress.py's independent checker reads the
# history (check --lock-service) and fails on any stale write that committed.
# Only addresses inside the namespaces made here (a /24 in 10.78.0.0/16) and loopback are used.
# --unfenced is the negative control: the clients write in replica mode, where the guard refuses
# nothing, and the run passes only if the checker finds violations.
# Needs root (ip netns). Usage: tests/partition/run.sh [--seconds 150] [--seed N] [--unfenced]
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh
need_python

SECONDS_MAX=150 SEED=$RANDOM UNFENCED=""
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) SECONDS_MAX=$2; shift 2 ;;
        --seed) SEED=$2; shift 2 ;;
        --unfenced) UNFENCED="--unfenced --pause-rate 0.5"; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
if [ "$(id -u)" -ne 0 ]; then
    echo "tests/partition/run.sh needs root: it makes network namespaces (ip netns)" >&2
    exit 1
fi

# A subnet and names of this run's own (two runs at once do not meet).
NET=10.78.$(( $$ % 250 ))
TAG=pgf$$
BR="${TAG}br"
PGNS="${TAG}-pg"
MEMBERS="1 2 3"
ETCD_PIDS=""
fresh_workdir
cleanup() {
    for p in $ETCD_PIDS; do kill "$p" 2>/dev/null || true; done
    if [ -n "${PGDATA_TEST:-}" ] && [ -f "$PGDATA_TEST/postmaster.pid" ]; then
        as_pg "$PGBIN/pg_ctl" -D "$PGDATA_TEST" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    for p in $ETCD_PIDS; do wait "$p" 2>/dev/null || true; done
    for ns in "$PGNS" $(for m in $MEMBERS; do echo "$TAG-e$m"; done); do ip netns del "$ns" 2>/dev/null || true; done
    ip link del "$BR" 2>/dev/null || true
    if [ -z "${KEEP_WORK:-}" ]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# host <namespace> <last octet>: a namespace on the bridge with address $NET.<octet>
host() {
    ip netns add "$1"
    ip link add "v$1" type veth peer name eth0 netns "$1"
    ip link set "v$1" master "$BR" up
    ip netns exec "$1" ip addr add "$NET.$2/24" dev eth0
    ip netns exec "$1" ip link set eth0 up
    ip netns exec "$1" ip link set lo up
}
ip link add "$BR" type bridge
ip addr add "$NET.254/24" dev "$BR"
ip link set "$BR" up
CLUSTER="" ENDPOINTS="" HOSTS="$PGNS=$NET.10"
for m in $MEMBERS; do
    host "$TAG-e$m" "$m"
    CLUSTER="${CLUSTER:+$CLUSTER,}e$m=http://$NET.$m:2380"
    ENDPOINTS="${ENDPOINTS:+$ENDPOINTS,}$NET.$m:2379"
    HOSTS="$HOSTS,$TAG-e$m=$NET.$m"
done
host "$PGNS" 10

for m in $MEMBERS; do
    ip netns exec "$TAG-e$m" etcd --name "e$m" --data-dir "$WORK/e$m" \
        --listen-client-urls "http://$NET.$m:2379" --advertise-client-urls "http://$NET.$m:2379" \
        --listen-peer-urls "http://$NET.$m:2380" --initial-advertise-peer-urls "http://$NET.$m:2380" \
        --initial-cluster "$CLUSTER" --initial-cluster-state new \
        --heartbeat-interval 100 --election-timeout 1000 >"$WORK/etcd-e$m.log" 2>&1 &
    ETCD_PIDS="$ETCD_PIDS $!"
done
for _ in $(seq 1 300); do   # up to 60 s
    etcdctl --endpoints "$ENDPOINTS" endpoint health >/dev/null 2>&1 && break
    sleep 0.2
done
etcdctl --endpoints "$ENDPOINTS" endpoint health >/dev/null 2>&1

PGDATA_TEST="$WORK/pgdata"
mkdir -p "$PGDATA_TEST" && chown postgres:postgres "$PGDATA_TEST" "$WORK"
as_pg "$PGBIN/initdb" -D "$PGDATA_TEST" -U postgres -A trust --no-sync >"$WORK/initdb.log" 2>&1
cat >>"$PGDATA_TEST/postgresql.conf" <<CONF
listen_addresses = '$NET.10'
port = 5432
unix_socket_directories = '$WORK'
shared_preload_libraries = 'pg_fencing'
pg_fencing.etcd_endpoints = '$ENDPOINTS'
pg_fencing.lease_ttl = 2
track_commit_timestamp = on
fsync = off
CONF
ip netns exec "$PGNS" sudo -u postgres "$PGBIN/pg_ctl" -D "$PGDATA_TEST" -l "$WORK/postgres.log" -w -t 60 start >/dev/null
DSN="host=$WORK port=5432 user=postgres dbname=postgres"
LOG="$WORK/history.log"

echo "partition: etcd members $ENDPOINTS, PostgreSQL $NET.10 (namespace $PGNS), ${SECONDS_MAX}s, seed $SEED"
"$PY" tests/stress/stress.py setup --dsn "$DSN"
"$PY" tests/partition/partition.py run --dsn "$DSN" --log "$LOG" --endpoints "$ENDPOINTS" --hosts "$HOSTS" \
    --pg-ns "$PGNS" --seconds "$SECONDS_MAX" --seed "$SEED" --etcd-history "$WORK/etcd-history.jsonl" $UNFENCED
if [ -z "$UNFENCED" ]; then
    "$PY" tests/stress/stress.py check --dsn "$DSN" --log "$LOG" --lock-service \
        --etcd-history "$WORK/etcd-history.jsonl"
    exit $?
fi
if "$PY" tests/stress/stress.py check --dsn "$DSN" --log "$LOG" --lock-service \
        --etcd-history "$WORK/etcd-history.jsonl" >"$WORK/check.out"; then
    cat "$WORK/check.out"
    echo "FAIL: negative control: stale writes committed without fencing, and the checker found nothing" >&2
    exit 1
fi
grep -E 'violations|accepted' "$WORK/check.out"
if ! grep -Eq 'violations +[1-9]' "$WORK/check.out"; then
    echo "FAIL: negative control: the checker failed, but not with violations" >&2
    exit 1
fi
echo "negative control: the checker catches the stale writes that commit without fencing"
