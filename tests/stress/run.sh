#!/usr/bin/env bash
# Randomized stress test of the fencing invariant against a throwaway cluster, checked by the
# independent checker in stress.py.
#
#   tests/stress/run.sh [--clients N] [--writes N] [--seconds S] [--seed S] [--crash] [--unfenced] [--prune]
#                       [--shape set-based|row-trigger]
#
# --crash: kill -9 the postmaster in the middle of the load, restart it, and check that no
#          committed write was lost and no high-water mark went down (the checker asks the
#          server which transactions committed).
# --unfenced: negative control: the same load with the guard triggers skipped
#          (session_replication_role = replica); the checker must then find violations.
# --prune: a pruner thread runs fencing_prune_tombstones on the per-row table during the load
#          (floors close behind the newest token; see stress.py).
# --shape: the shape fencing_protect gives the tables (docs/design.md, "The set-based shape"):
#          set-based (the default where the library is preloaded, as here) or row-trigger.
# Defaults: 16 clients, 20000 write attempts, at most 300 s. The long run in docs/testing.md:
#   tests/stress/run.sh --writes 100000 --seconds 1800
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh
need_python

CLIENTS=16 WRITES=20000 SECONDS_MAX=300 SEED=$RANDOM CRASH="" UNFENCED="" PRUNE="" SHAPE=set-based
while [ $# -gt 0 ]; do
    case "$1" in
        --clients) CLIENTS=$2; shift 2 ;;
        --writes) WRITES=$2; shift 2 ;;
        --seconds) SECONDS_MAX=$2; shift 2 ;;
        --seed) SEED=$2; shift 2 ;;
        --crash) CRASH=1; shift ;;
        --unfenced) UNFENCED=--unfenced; shift ;;
        --prune) PRUNE=--prune; shift ;;
        --shape) SHAPE=$2; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done

CHILD_PIDS=""
fresh_workdir
trap 'cleanup_all' EXIT
trap 'exit 130' INT TERM
PGPORT_TEST=${PGPORT_STRESS:-54339}
case "$SHAPE" in
    set-based) SHAPE_CONF="" ;;
    row-trigger) SHAPE_CONF="pg_fencing.set_based_shape = off" ;;
    *) echo "unknown shape $SHAPE" >&2; exit 2 ;;
esac
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'
$SHAPE_CONF
track_commit_timestamp = on
max_connections = 100
fsync = on
deadlock_timeout = 100ms" pg_start
DSN="host=127.0.0.1 port=$PGPORT_TEST user=postgres dbname=postgres"
LOG="$WORK/stress.log"

echo "stress: $CLIENTS clients, $WRITES write attempts, seed $SEED, $SHAPE shape${CRASH:+, with a crash}${PRUNE:+, tombstones pruned during the load}"
$PY tests/stress/stress.py setup --dsn "$DSN"
shapes=$(psql -X -Atc "SELECT string_agg(shape, ' ' ORDER BY relation::text) FROM fencing_protected_tables")
echo "  table shapes: $shapes"
case " $shapes " in *" $SHAPE "*) ;; *) echo "FAIL: no table in the $SHAPE shape" >&2; exit 1 ;; esac
if [ -z "$CRASH" ]; then
    $PY tests/stress/stress.py run --dsn "$DSN" --log "$LOG" --clients "$CLIENTS" --writes "$WRITES" \
        --seconds "$SECONDS_MAX" --seed "$SEED" $UNFENCED $PRUNE
    $PY tests/stress/stress.py check --dsn "$DSN" --log "$LOG"
    exit $?
fi

# Crash run: marks before, load, kill -9 the postmaster mid-load, restart, marks after, check.
$PY tests/stress/stress.py run --dsn "$DSN" --log "$LOG" --clients "$CLIENTS" --writes "$WRITES" \
    --seconds "$SECONDS_MAX" --seed "$SEED" $PRUNE &
RUN_PID=$!
CHILD_PIDS="$CHILD_PIDS $RUN_PID"
# The crash comes once the load is under way (500 committed transactions in the clients' log,
# however long a slow machine takes to get there, up to 120 s) and while it still runs.
for _ in $(seq 1 1200); do
    n=$(grep -c '"ev": "commit".*"outcome": "ok"' "$LOG" 2>/dev/null || true)
    [ "${n:-0}" -ge 500 ] && break
    kill -0 "$RUN_PID" 2>/dev/null || break
    sleep 0.1
done
if ! kill -0 "$RUN_PID" 2>/dev/null; then
    echo "stress: the load ended before the crash (nothing to crash under); its log: $(wc -l <"$LOG") lines" >&2
    exit 1
fi
echo "stress: $(grep -c '"ev": "commit".*"outcome": "ok"' "$LOG" || true) transactions committed before the crash"
psql -X -Atc "SELECT resource || '=' || high_water FROM fencing_resources WHERE resource LIKE 'stress-%' ORDER BY 1" \
    > "$WORK/marks.before" || true
PM_PID=$(head -1 "$PGDATA_TEST/postmaster.pid")
echo "stress: kill -9 postmaster $PM_PID under load"
kill -9 "$PM_PID"
# Its backends notice the postmaster's death and exit; a restart must wait for every one of them:
# one still running would go on writing WAL and data files under the new server's recovery (and
# the pid file, which would let the new server see it, is removed below). A list of the
# postmaster's children taken before the kill misses one it forked just before dying (a backend
# for a reconnecting client, an autovacuum worker), so find them by what every PostgreSQL process
# has: its working directory is the data directory. Exited processes may linger as zombies here
# (no init reaps them).
DATA_REAL=$(readlink -f "$PGDATA_TEST")
alive() { local d p st
          for d in /proc/[0-9]*; do
              [ "$(readlink "$d/cwd" 2>/dev/null)" = "$DATA_REAL" ] || continue
              p=${d#/proc/}
              st=$(ps -o stat= -p "$p" 2>/dev/null || true)
              [ -n "$st" ] && [ "${st#Z}" = "$st" ] && echo "$p"
          done; true; }
for _ in $(seq 1 600); do [ -z "$(alive)" ] && break; sleep 0.1; done
left=$(alive)
if [ -n "$left" ]; then echo "stress: backends still running 60 s after the crash: $left" >&2; exit 1; fi
# The dead postmaster lingers as a zombie here, so its lock files would look live: remove them.
rm -f "$PGDATA_TEST/postmaster.pid" "$WORK/.s.PGSQL.$PGPORT_TEST.lock"
pg_ctl_start "$PGDATA_TEST" "$WORK/postgres.log" 120
echo "stress: restarted after crash recovery"
wait "$RUN_PID" || true
psql -X -Atc "SELECT resource || '=' || high_water FROM fencing_resources WHERE resource LIKE 'stress-%' ORDER BY 1" \
    > "$WORK/marks.after"
status=0
while IFS== read -r res before; do
    after=$(grep "^$res=" "$WORK/marks.after" | cut -d= -f2)
    if [ -z "$after" ] || [ "$after" -lt "$before" ]; then
        echo "PROBLEM: high-water mark of $res went down across the crash: $before -> ${after:-none}"
        status=1
    else
        echo "  mark $res: $before before the crash, $after after restart and more load"
    fi
done < "$WORK/marks.before"
$PY tests/stress/stress.py check --dsn "$DSN" --log "$LOG" --after-crash || status=1
exit $status
