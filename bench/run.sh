#!/usr/bin/env bash
# pg_fencing benchmarks: builds the extension in release mode, starts a throwaway PostgreSQL 15
# (127.0.0.1:54379, preloaded) and etcd (127.0.0.1:23990), runs bench/bench.py and prints a
# markdown report (also written to bench/latest.md).
#   bench/run.sh [--no-setup]          BENCH_ROUNDS=3 BENCH_SECONDS=10 BENCH_ROWS_BIG=1000000
#   bench/run.sh --instructions        instruction counts per transaction instead (valgrind's
#                                      callgrind; BENCH_TXNS=1000), and per row of multi-row
#                                      statements (BENCH_BULK_ROWS=20000), written to
#                                      bench/instructions.md
#   bench/run.sh --locks               lock acquisition latency of Redis, etcd (etcd-client and
#                                      etcdctl), ZooKeeper (kazoo's recipe) and fencing_acquire,
#                                      servers on loopback (BENCH_LOCK_N=500), written to
#                                      bench/locks.md
#   bench/run.sh --many-locks          1,000 locks held at once by 100 sessions: acquisition
#                                      latency, etcd requests/s at steady state, the worker's RSS,
#                                      shared memory, then 10,000 acquire/release cycles; its own
#                                      etcd and cluster (bench/many_locks.py), written to
#                                      bench/many_locks.md
#   bench/run.sh --tombstones          tombstone storage per deleted key before and after
#                                      fencing_prune_tombstones (BENCH_TOMBSTONES=1000000),
#                                      written to bench/tombstones.md
set -euo pipefail
# Setup runs with the caller's environment (registry settings); the benchmark is hermetic,
# its builds included.
if [ -z "${PGF_HERMETIC:-}" ] && [[ " $* " != *" --no-setup "* ]]; then
    "$(dirname "$0")/../scripts/setup.sh" --test
    set -- --no-setup "$@"
fi
source "$(dirname "$0")/../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/.."
source scripts/lib.sh
echo "building the release build of pg_fencing"
pkg_run cargo pgrx install --release --pg-config /usr/lib/postgresql/15/bin/pg_config >/dev/null

need_python
CHILD_PIDS=""
fresh_workdir
trap 'cleanup_all' EXIT
trap 'exit 130' INT TERM

if [[ " $* " == *" --instructions "* ]]; then
    # Instruction counts (callgrind, single-user backend): repeatable to well under 1 %, unlike
    # TPS on this machine. See bench/instructions.py.
    command -v valgrind >/dev/null || { echo "bench: valgrind is missing (scripts/setup.sh --test installs it)" >&2; exit 1; }
    [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$WORK"
    {
        echo "Machine: $(nproc) cores, $(. /etc/os-release; echo "$PRETTY_NAME"), PostgreSQL $($PGBIN/postgres --version | awk '{print $3}'), $(valgrind --version), pg_fencing release build at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), date $(date -u +%F)."
        echo "Command: bench/run.sh --instructions (BENCH_TXNS=${BENCH_TXNS:-1000})"
        echo
        PGPORT_BENCH=${PGPORT_BENCH:-54379} "$PY" bench/instructions.py --pgbin "$PGBIN" --work "$WORK" --n "${BENCH_TXNS:-1000}"
        echo
        "$PY" bench/bulk_instructions.py --pgbin "$PGBIN" --work "$WORK" --n "${BENCH_BULK_ROWS:-20000}" \
            --tombstones "${BENCH_LOOKUP_TOMBSTONES:-1000000}"
    } | tee bench/instructions.md
    exit 0
fi
PGPORT_TEST=${PGPORT_BENCH:-54379}
if [[ " $* " == *" --many-locks "* ]]; then
    # Starts its own etcd and cluster (with pg_fencing.max_locks and a 10 s lease TTL), checks
    # what it measures and writes bench/many_locks.md itself.
    PGBIN="$PGBIN" "$PY" bench/many_locks.py --pg-port "$PGPORT_TEST" --etcd-port "${ETCD_BENCH_PORT:-23990}"
    exit 0
fi
if [[ " $* " == *" --tombstones "* ]]; then
    # With etcd and the worker: the third workload takes its tokens with fencing_acquire and
    # leaves pruning to the pruner worker (fencing_tombstone_retention).
    ETCD_CLIENT_PORT=${ETCD_BENCH_PORT:-23990}
    ETCD_PEER_PORT=$((ETCD_CLIENT_PORT + 1))
    etcd_start
    PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'
pg_fencing.etcd_endpoints = '127.0.0.1:$ETCD_CLIENT_PORT'
pg_fencing.tombstone_prune_database = 'postgres'
pg_fencing.tombstone_prune_interval = 1
max_wal_size = '4GB'" pg_start
    {
        echo "Machine: $(nproc) cores, $(. /etc/os-release; echo "$PRETTY_NAME"), PostgreSQL $(psql -X -Atc 'SHOW server_version'), pg_fencing release build at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), date $(date -u +%F)."
        echo "Command: bench/run.sh --tombstones (BENCH_TOMBSTONES=${BENCH_TOMBSTONES:-1000000})"
        echo
        "$PY" bench/tombstones.py
    } | tee bench/tombstones.md
    exit 0
fi
(cd bench/etcd-lock-bench && cargo build --release -q)
if [[ " $* " == *" --locks "* ]]; then
    # Four lock services side by side: Redis, etcd, ZooKeeper and pg_fencing's worker (on that
    # etcd), each a real server on loopback.
    ETCD_CLIENT_PORT=${ETCD_BENCH_PORT:-23990}
    ETCD_PEER_PORT=$((ETCD_CLIENT_PORT + 1))
    ZK_PORT=${ZK_BENCH_PORT:-24183}
    REDIS_PORT=${REDIS_BENCH_PORT:-24193}
    etcd_start
    zk_start
    redis_start
    # fsync on: a PostgreSQL lease's grant is flushed to disk, as etcd and ZooKeeper flush theirs.
    PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'
fsync = on
pg_fencing.etcd_endpoints = '127.0.0.1:$ETCD_CLIENT_PORT'" pg_start
    psql -X -q -c "CREATE EXTENSION pg_fencing"
    {
        echo "Machine: $(nproc) cores, $(. /etc/os-release; echo "$PRETTY_NAME"); servers on loopback: Redis $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') (no persistence), etcd $(etcd --version | head -1 | awk '{print $3}') (its default fsync per write), ZooKeeper $(dpkg-query -W -f='${Version}' zookeeper) (standalone, its default fsync of the transaction log), PostgreSQL $(psql -X -Atc 'SHOW server_version') (fsync on) with the pg_fencing worker on that etcd; pg_fencing release build at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), date $(date -u +%F)."
        echo "Command: bench/run.sh --locks (BENCH_LOCK_N=${BENCH_LOCK_N:-500})"
        echo
        ETCD_ENDPOINT="127.0.0.1:$ETCD_CLIENT_PORT" ETCD_BENCH_BIN=bench/etcd-lock-bench/target/release/etcd-lock-bench \
            ZK_HOSTS="127.0.0.1:$ZK_PORT" REDIS_PORT=$REDIS_PORT PGPORT=$PGPORT_TEST "$PY" bench/locks.py
    } | tee bench/locks.md
    exit 0
fi
ETCD_CLIENT_PORT=${ETCD_BENCH_PORT:-23990}
ETCD_PEER_PORT=$((ETCD_CLIENT_PORT + 1))
etcd_start
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'
pg_fencing.etcd_endpoints = '127.0.0.1:$ETCD_CLIENT_PORT'
shared_buffers = '512MB'
max_wal_size = '4GB'" pg_start

{
    echo "Machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB RAM, $(. /etc/os-release; echo "$PRETTY_NAME"), PostgreSQL $(psql -X -Atc 'SHOW server_version'), etcd $(etcd --version | head -1 | awk '{print $3}'), pg_fencing release build, fsync off, date $(date -u +%F)."
    echo "Command: bench/run.sh (BENCH_ROUNDS=${BENCH_ROUNDS:-3} BENCH_SECONDS=${BENCH_SECONDS:-10} BENCH_ROWS_BIG=${BENCH_ROWS_BIG:-1000000})"
    echo
    ETCD_ENDPOINT="127.0.0.1:$ETCD_CLIENT_PORT" ETCD_BENCH_BIN=bench/etcd-lock-bench/target/release/etcd-lock-bench \
        "$PY" bench/bench.py
} | tee bench/latest.md
