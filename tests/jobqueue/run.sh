#!/usr/bin/env bash
# Zombie job workers, for real: four job-queue libraries nobody here wrote, used as their users
# use them, with their own claim, heartbeat, expiry and retry logic: pgqueuer (PyPI, the worker
# examples/job-queues/python/worker.py run by its own `pgq run` command), procrastinate (PyPI,
# examples/job-queues/python/procrastinate_worker.py run by its own `procrastinate worker`
# command), pg-boss (npm, examples/job-queues/node/worker.js) and graphile-worker (npm,
# examples/job-queues/node/graphile-worker.js). Each job handler takes a PostgreSQL lease named
# after the job (fencing_lease_acquire('job:<id>', ttl)) and writes its effect to table `results`
# with the lease's token (examples/job-queues/README.md).
#
# A throwaway cluster on 127.0.0.1:${PGPORT_JOBQUEUE:-54461} with two databases: `fenced`, where
# `results` is protected (fencing_protect('results'), per-row mode), and `unfenced`, where it is
# not. For each library, in each database:
#   1. a job is sent; worker A picks it, takes the job's lease and is frozen with SIGSTOP before it
#      writes (it printed "leased");
#   2. worker B, another process, gets the job through the library's own stalled-job retry
#      (pgqueuer: A's heartbeats stop and B re-picks the job after --heartbeat-timeout 8 s;
#      pg-boss: the job's expireInSeconds 8 s passes, B's maintenance fails it and retries it,
#      retryLimit 2; procrastinate: A's heartbeats stop and the app's periodic retry_stalled_jobs,
#      run by B every second, puts the job back after 4 s; graphile-worker, whose own expiry is 4
#      hours: the operator unlocks A's jobs with force_unlock_workers), takes the lease once A's
#      ran out (a higher token) and writes;
#   3. A is resumed with SIGCONT and writes its result with its old token: for pgqueuer and pg-boss
#      once the library recorded B's success, for procrastinate and graphile-worker while B is
#      still running the job (it works 3 s more after its write), and then A's handler must leave
#      B's attempt alone: the job ends as B ends it (procrastinate: succeeded, no `failed` from A;
#      graphile-worker: still locked by B with no error after A's failure, then completed).
# procrastinate and graphile-worker renew a 4 s lease every third of its TTL (the queue's own
# expiry does not bound how long a job runs: graphile-worker's is 4 hours).
# The handler works 3 s between its lease and its write (the time the test has to freeze A), and
# the lease lasts 8 s (the heartbeat timeout, the job's expiry): B writes 3 s into its 8 s lease,
# so a slow machine does not make B's own lease run out before its write.
# In `fenced` A's write must be refused with FT003 or FT001 and the row must hold B's result;
# in `unfenced` (the negative control) A's write must land and the row hold A's result: the
# zombie is real, so the checks of the fenced run can fail.
# Prints a timeline and ok/FAIL per check; exits 1 if any check failed.
#
#   tests/jobqueue/run.sh                  # all four libraries, fenced and negative control
#   tests/jobqueue/run.sh --only node      # some: python (pgqueuer), node (pg-boss),
#                                          # procrastinate, graphile (comma-separated)
#   tests/jobqueue/run.sh --unfenced       # the fenced run's checks on the unprotected table:
#                                          # the zombie writes land and the run must FAIL
#
# Needs the project's virtualenv with pgqueuer and procrastinate (tests/requirements.txt), Node 20
# and `npm ci` in examples/job-queues/node (scripts/setup.sh --test does both).
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."

usage() { echo "usage: $0 [--only python,node,procrastinate,graphile] [--unfenced]" >&2; exit 2; }  # other python: the option's value
LIBS="python procrastinate node graphile"  # other python: the names of the scenarios
UNFENCED=""
while [ $# -gt 0 ]; do
    case "$1" in
        --only) LIBS=${2:-}; LIBS=${LIBS//,/ }; shift ;;
        --unfenced) UNFENCED=1 ;;
        *) usage ;;
    esac
    shift
done
[ -n "$LIBS" ] || usage
for lib in $LIBS; do
    case "$lib" in python | node | procrastinate | graphile) ;; *) usage ;; esac  # other python: the option's value
done
has() { [[ " $LIBS " == *" $1 "* ]]; }

PGPORT_TEST=${PGPORT_JOBQUEUE:-54461}
source scripts/lib.sh
need_python

PYDIR=examples/job-queues/python  # other python: a directory of the examples
NODEDIR=examples/job-queues/node
WORK_SECONDS=3   # the handler's work between its lease and its write
JOB_TTL=8        # the lease's TTL = pgqueuer's heartbeat timeout = pg-boss's job expiry
RENEWED_TTL=4    # procrastinate and graphile-worker: the lease's TTL (renewed every third of it)
                 # = procrastinate's stalled_worker_timeout
FINISH_SECONDS=3 # procrastinate and graphile-worker: the handler's work after its write
if ! "$PY" -c 'import pgqueuer, asyncpg, procrastinate, psycopg' 2>/dev/null; then
    echo "pgqueuer or procrastinate is missing from $PY: run scripts/setup.sh --test (tests/requirements.txt)" >&2
    exit 1
fi
if { has node || has graphile; } && { ! command -v node >/dev/null || ! [ -f "$NODEDIR/node_modules/pg-boss/package.json" ] \
        || ! [ -f "$NODEDIR/node_modules/graphile-worker/package.json" ]; }; then
    echo "node or $NODEDIR/node_modules is missing: run scripts/setup.sh --test (npm ci in $NODEDIR)" >&2
    exit 1
fi

CHILD_PIDS=""
fresh_workdir
trap cleanup_all EXIT
trap 'exit 130' INT TERM

# The Python examples import the package pg-fencing (clients/python): its wheel, built and
# installed from the artifact as tests/pyclient does. (The Node examples depend on clients/node
# through their package.json.)
if has python || has procrastinate; then  # other python: the scenarios' names
    "$PY" tests/pyclient/build.py --out "$WORK/pgfencing" >"$WORK/pgfencing-build.log" 2>&1 \
        || { cat "$WORK/pgfencing-build.log" >&2; exit 1; }
    export PYTHONPATH="$WORK/pgfencing/site"
fi

pg_start
PSQL=(psql -X -q -v ON_ERROR_STOP=1)
for db in fenced unfenced; do
    "${PSQL[@]}" -c "CREATE DATABASE $db"
    "${PSQL[@]}" -d "$db" -o /dev/null <<'SQL'
CREATE EXTENSION pg_fencing;
-- The jobs' effect, one row per job; worker = who wrote it last.
CREATE TABLE results (job_id text PRIMARY KEY, order_id int, amount int, worker text);
SQL
    # The queues' tables, each by its own CLI (pg-boss makes its schema itself at its first start).
    if has python && ! PGDATABASE=$db "$PY" -m pgqueuer install >"$WORK/pgq-install-$db.log" 2>&1; then  # other python: the scenario's name
        echo "FAIL: pgqueuer install in database $db:" >&2
        cat "$WORK/pgq-install-$db.log" >&2
        exit 1
    fi
    if has procrastinate && ! (cd "$PYDIR" && PGDATABASE=$db exec "$PY" -m procrastinate --app=procrastinate_worker.app \
            schema --apply) >"$WORK/procrastinate-schema-$db.log" 2>&1; then
        echo "FAIL: procrastinate schema --apply in database $db:" >&2
        cat "$WORK/procrastinate-schema-$db.log" >&2
        exit 1
    fi
    if has graphile && ! node "$NODEDIR/node_modules/graphile-worker/dist/cli.js" --schema-only \
            -c "postgres://postgres@127.0.0.1:$PGPORT_TEST/$db" >"$WORK/graphile-schema-$db.log" 2>&1; then
        echo "FAIL: graphile-worker --schema-only in database $db:" >&2
        cat "$WORK/graphile-schema-$db.log" >&2
        exit 1
    fi
    # The four queues share one results table keyed by job id (an application has its own): the
    # ids of procrastinate and graphile-worker start at 1001 and 2001, pgqueuer's at 1.
    if has procrastinate; then
        "${PSQL[@]}" -d "$db" -o /dev/null -c "SELECT setval(pg_get_serial_sequence('procrastinate_jobs', 'id'), 1000)"
    fi
    if has graphile; then
        "${PSQL[@]}" -d "$db" -o /dev/null -c "SELECT setval(pg_get_serial_sequence('graphile_worker._private_jobs', 'id'), 2000)"
    fi
done
"${PSQL[@]}" -d fenced -o /dev/null -c "SELECT fencing_protect('results')"
PGQ_VERSION=$("$PY" -c 'import importlib.metadata as m; print(m.version("pgqueuer"))')
PROC_VERSION=$("$PY" -c 'import importlib.metadata as m; print(m.version("procrastinate"), "psycopg", m.version("psycopg"))')
node_version() { sed -n 's/^  "version": "\(.*\)",$/\1/p' "$NODEDIR/node_modules/$1/package.json" 2>/dev/null || true; }
BOSS_VERSION=$(node_version pg-boss)
GRAPHILE_VERSION=$(node_version graphile-worker)
echo "== pgqueuer $PGQ_VERSION, procrastinate $PROC_VERSION ($("$PY" -c 'import sys; print(sys.version.split()[0])')), pg-boss ${BOSS_VERSION:-missing}, graphile-worker ${GRAPHILE_VERSION:-missing} (node $(node --version 2>/dev/null || echo missing)), PostgreSQL $(psql -X -Atc 'SHOW server_version') on 127.0.0.1:$PGPORT_TEST"

t0=$(date +%s.%N)
say() { printf '  [%6.2fs] %s\n' "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { print a - b }')" "$*"; }
# wait_line <file> <extended regexp> [seconds, 30]: until a line of the file matches; prints it.
wait_line() {
    local line=""
    for _ in $(seq 1 $((${3:-30} * 10))); do
        line=$(grep -m1 -E "$2" "$1" 2>/dev/null || true)
        [ -n "$line" ] && { echo "$line"; return 0; }
        sleep 0.1
    done
    echo "  (no line matching '$2' in $1 within ${3:-30} s; its end:)" >&2
    tail -15 "$1" >&2 || true
    return 1
}
# The value of field NAME= in a line.
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2" | head -1; }

# start_worker <lib> <db> <name>: the worker in the background, its pid in WORKER_PID, its output
# in $WORK/<lib>-<db>-<name>.out.
start_worker() {
    local out="$WORK/$1-$2-$3.out"
    case "$1" in
        node)
            WORKER_NAME=$3 DATABASE_URL="postgres://postgres@127.0.0.1:$PGPORT_TEST/$2" JOB_EXPIRE_SECONDS=$JOB_TTL \
                node "$NODEDIR/worker.js" >"$out" 2>&1 & ;;
        graphile)
            WORKER_NAME=$3 DATABASE_URL="postgres://postgres@127.0.0.1:$PGPORT_TEST/$2" JOB_LEASE_TTL=$RENEWED_TTL \
                node "$NODEDIR/graphile-worker.js" >"$out" 2>&1 & ;;
        procrastinate)
            # procrastinate's own command, `procrastinate --app=MODULE.app worker` (run where the
            # module is); its periodic stalled-job recovery every second instead of every 10 minutes.
            (cd "$PYDIR" && WORKER_NAME=$3 PGDATABASE=$2 JOB_LEASE_TTL=$RENEWED_TTL RECOVERY_CRON='* * * * * *' \
                exec "$PY" -m procrastinate --app=procrastinate_worker.app worker --name "$3") >"$out" 2>&1 & ;;
        *)
            # pgqueuer's own command, `pgq run MODULE:FACTORY` (run where the module is);
            # JOB_LEASE_TTL = the heartbeat timeout: the lease runs out when pgqueuer gives up on A.
            (cd "$PYDIR" && WORKER_NAME=$3 PGDATABASE=$2 JOB_LEASE_TTL=$JOB_TTL \
                exec "$PY" -m pgqueuer run worker:main --heartbeat-timeout "$JOB_TTL" --dequeue-timeout 0.5) >"$out" 2>&1 & ;;
    esac
    WORKER_PID=$!
    CHILD_PIDS="$CHILD_PIDS $WORKER_PID"
}
# stop_worker <pid>...: SIGTERM (the libraries stop gracefully on it), SIGKILL after 10 s.
stop_worker() {
    local p alive
    for p in "$@"; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
    for _ in $(seq 1 100); do
        alive=""
        for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ -z "$alive" ] && break
        sleep 0.1
    done
    for p in "$@"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}

# scenario <lib> <db> <expect: fenced|zombie>
scenario() {
    local lib=$1 db=$2 expect=$3 job a b la lb ta tb wa wb state row name retry
    local payload="{\"order\": 7, \"amount\": 100, \"work_seconds\": $WORK_SECONDS}"
    local url="postgres://postgres@127.0.0.1:$PGPORT_TEST/$db"
    case "$lib" in
        python) name=pgqueuer; retry="pgqueuer's stale-heartbeat re-pick (--heartbeat-timeout $JOB_TTL)" ;;  # other python: the scenario's name
        node) name=pg-boss; retry="pg-boss's expiry (expireInSeconds $JOB_TTL) and retry (retryLimit 2)" ;;
        procrastinate)
            name=procrastinate; retry="procrastinate's stalled-job recovery (A silent for $RENEWED_TTL s, retry_stalled_jobs)"
            payload="{\"order\": 7, \"amount\": 100, \"work_seconds\": $WORK_SECONDS, \"finish_seconds\": $FINISH_SECONDS}" ;;
        graphile)
            name=graphile-worker; retry="force_unlock_workers (graphile-worker's own expiry is 4 hours)"
            payload="{\"order\": 7, \"amount\": 100, \"work_seconds\": $WORK_SECONDS, \"finish_seconds\": $FINISH_SECONDS}" ;;
    esac
    echo "== $name: zombie worker on database '$db' ($([ "$db" = fenced ] && echo "results protected by pg_fencing" || echo "results NOT protected"))"
    if [ "$expect" = fenced ] && [ "$db" = unfenced ]; then
        echo "   (--unfenced: the fenced run's checks on the unprotected table; they must FAIL)"
    fi
    t0=$(date +%s.%N)
    case "$lib" in
        node)
            job=$(DATABASE_URL="$url" JOB_EXPIRE_SECONDS=$JOB_TTL node "$NODEDIR/enqueue.js" "$payload") ;;
        procrastinate)
            # `procrastinate defer` prints no id: the job is the database's newest charge_order.
            (cd "$PYDIR" && PGDATABASE=$db exec "$PY" -m procrastinate --app=procrastinate_worker.app \
                defer charge_order "$payload") >"$WORK/$lib-$db-defer.log" 2>&1 || cat "$WORK/$lib-$db-defer.log"
            job=$("${PSQL[@]}" -d "$db" -Atc "SELECT max(id) FROM procrastinate_jobs WHERE task_name = 'charge_order'") ;;
        graphile)
            job=$("${PSQL[@]}" -d "$db" -Atc "SELECT id FROM graphile_worker.add_job('charge_order', '$payload')") ;;
        *)
            job=$(PGDATABASE=$db "$PY" -m pgqueuer queue charge_order "$payload" | sed -n 's/^Enqueued job \([0-9]*\)\.$/\1/p') ;;
    esac
    [ -n "$job" ] || { echo "  FAIL: no job id from the enqueue"; fail=1; return; }
    say "job $job sent: charge order 7, amount 100 (the handler works $WORK_SECONDS s before it writes)"

    start_worker "$lib" "$db" A; a=$WORKER_PID
    la=$(wait_line "$WORK/$lib-$db-A.out" "^worker=A job=$job leased ") || { fail=1; stop_worker "$a"; return; }
    kill -STOP "$a"
    ta=$(field token "$la")
    say "worker A (pid $a) picked job $job and took lease 'job:$job': token $ta; frozen with SIGSTOP before writing"
    # A works $WORK_SECONDS s between its lease and its write: the freeze must have come first.
    expect "$lib/$db: A was frozen before it wrote (rows of the job)" 0 \
        "$("${PSQL[@]}" -d "$db" -Atc "SELECT count(*) FROM results WHERE job_id = '$job'")"

    start_worker "$lib" "$db" B; b=$WORKER_PID
    say "worker B (pid $b) started; the job comes back only through $retry"
    if [ "$lib" = graphile ]; then
        # The operator, sure that A is dead, gives its jobs back (what WorkerUtils.forceUnlockWorkers
        # runs); A's lease runs out by itself, its renewals having stopped.
        "${PSQL[@]}" -d "$db" -Atc "SELECT graphile_worker.force_unlock_workers(ARRAY[locked_by]) FROM graphile_worker._private_jobs WHERE id = $job" >/dev/null
        say "operator: force_unlock_workers('$(field locked_by "$la")'), A's worker id"
    fi
    lb=$(wait_line "$WORK/$lib-$db-B.out" "^worker=B job=$job leased ") || { fail=1; stop_worker "$a" "$b"; return; }
    tb=$(field token "$lb")
    say "worker B got job $job from the library's retry and took lease 'job:$job' (A's had run out): token $tb"
    wb=$(wait_line "$WORK/$lib-$db-B.out" "^worker=B job=$job write ") || { fail=1; stop_worker "$a" "$b"; return; }
    say "worker B's write: ${wb#*job=$job }"
    # pgqueuer and pg-boss: the library must have recorded the retry and B's success before A
    # wakes up. procrastinate and graphile-worker: A wakes up while B still runs the job.
    case "$lib" in
        node)
            wait_for "$lib/$db: pg-boss completed job $job on its first retry" "state=completed retry_count=1" \
                "$PGPORT_TEST" "$db" "SELECT format('state=%s retry_count=%s', state, retry_count) FROM pgboss.job WHERE id = '$job'" ;;
        python)  # other python: the scenario's name
            wait_for "$lib/$db: pgqueuer picked job $job twice (A, then B's re-pick) and B finished it" "picked=2 successful=1 left_in_queue=0" \
                "$PGPORT_TEST" "$db" "SELECT format('picked=%s successful=%s left_in_queue=%s', count(*) FILTER (WHERE status = 'picked'), count(*) FILTER (WHERE status = 'successful'), (SELECT count(*) FROM pgqueuer WHERE id = $job)) FROM pgqueuer_log WHERE job_id = $job" ;;
    esac
    state=$("${PSQL[@]}" -d "$db" -Atc "SELECT worker FROM results WHERE job_id = '$job'")
    say "row of job $job now: written by worker $state"

    kill -CONT "$a"
    say "worker A resumed with SIGCONT; it still believes it owns job $job and writes with token $ta"
    wa=$(wait_line "$WORK/$lib-$db-A.out" "^worker=A job=$job write ") || { fail=1; stop_worker "$a" "$b"; return; }
    say "worker A's write: ${wa#*job=$job }"
    if [ "$expect" = fenced ] && [ "$lib" = procrastinate ]; then
        # A's handler sees that the job is B's attempt now and exits without ending it.
        wait_line "$WORK/$lib-$db-A.out" "^worker=A job=$job superseded" 10 >/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$a" 2>/dev/null || break; sleep 0.1; done
        say "worker A: $(grep -m1 "^worker=A job=$job superseded" "$WORK/$lib-$db-A.out" | sed "s/.*job=$job //") ($(kill -0 "$a" 2>/dev/null && echo "still running" || echo "exited"))"
        expect "$lib/$db: B was still running job $job when A's refused attempt ended" no \
            "$(grep -q "^worker=B job=$job done" "$WORK/$lib-$db-B.out" && echo yes || echo no)"
        expect "$lib/$db: A's refused attempt left B's attempt alone (job still B's)" "status=doing attempts=1" \
            "$("${PSQL[@]}" -d "$db" -Atc "SELECT format('status=%s attempts=%s', status, attempts) FROM procrastinate_jobs WHERE id = $job")"
    elif [ "$expect" = fenced ] && [ "$lib" = graphile ]; then
        # A's task threw; graphile-worker records the failure only for a job A still has locked.
        wait_line "$WORK/$lib-$db-A.out" "Failed task $job " 10 >/dev/null || true
        sleep 1  # its failJob UPDATE is sent right after that log line (not awaited by the log)
        say "worker A: graphile-worker logged: $(grep -m1 -o "Failed task $job ([^)]*)" "$WORK/$lib-$db-A.out")"
        expect "$lib/$db: B was still running job $job when A's refused attempt ended" no \
            "$(grep -q "^worker=B job=$job done" "$WORK/$lib-$db-B.out" && echo yes || echo no)"
        expect "$lib/$db: A's failure left B's attempt alone (job still locked by B, no error)" \
            "locked_by=$(field locked_by "$lb") last_error= attempts=2" \
            "$("${PSQL[@]}" -d "$db" -Atc "SELECT format('locked_by=%s last_error=%s attempts=%s', locked_by, last_error, attempts) FROM graphile_worker._private_jobs WHERE id = $job")"
    fi
    case "$lib" in
        procrastinate | graphile)
            wait_line "$WORK/$lib-$db-B.out" "^worker=B job=$job done" 30 >/dev/null || fail=1
            say "worker B finished job $job" ;;
    esac
    if [ "$expect" = fenced ] && [ "$lib" = procrastinate ]; then
        wait_for "$lib/$db: procrastinate recorded B's end of job $job: succeeded, no failure from A" \
            "status=succeeded attempts=2 failed_events=0" "$PGPORT_TEST" "$db" \
            "SELECT format('status=%s attempts=%s failed_events=%s', status, attempts, (SELECT count(*) FROM procrastinate_events e WHERE e.job_id = j.id AND e.type = 'failed')) FROM procrastinate_jobs j WHERE id = $job"
    elif [ "$expect" = fenced ] && [ "$lib" = graphile ]; then
        wait_for "$lib/$db: graphile-worker completed job $job (B's end: the job is gone)" 0 "$PGPORT_TEST" "$db" \
            "SELECT count(*) FROM graphile_worker._private_jobs WHERE id = $job"
    fi
    row=$("${PSQL[@]}" -d "$db" -Atc "SELECT worker || ' ' || amount FROM results WHERE job_id = '$job'")
    say "row of job $job after: written by worker ${row% *}, amount ${row#* }"
    stop_worker "$a" "$b"

    expect "$lib/$db: B's token is above A's" yes "$([ -n "$ta" ] && [ -n "$tb" ] && [ "$tb" -gt "$ta" ] && echo yes || echo "no ($ta, $tb)")"
    expect "$lib/$db: B's write" "write ok" "$(awk '{print $3, $4}' <<<"$wb")"
    if [ "$expect" = fenced ]; then
        local code; code=$(awk '$3 == "write" && $4 == "refused" {print $5}' <<<"$wa")
        expect "$lib/$db: A's write (a zombie's) is refused with FT003 or FT001" yes \
            "$(case "$code" in FT003|FT001) echo yes ;; *) echo "no: ${wa#*job=$job }" ;; esac)"
        expect "$lib/$db: the row holds the retry's result (worker B)" B "${row% *}"
    else
        expect "negative control, $lib/$db: A's write (a zombie's) lands" "write ok" "$(awk '{print $3, $4}' <<<"$wa")"
        expect "negative control, $lib/$db: the row ends with the zombie's result (worker A)" A "${row% *}"
    fi
}

T_START=$(date +%s)
for lib in $LIBS; do
    if [ -n "$UNFENCED" ]; then
        scenario "$lib" unfenced fenced
    else
        scenario "$lib" fenced fenced
        scenario "$lib" unfenced zombie
    fi
done
echo "== $(( $(date +%s) - T_START )) s of scenarios; $([ "$fail" -eq 0 ] && echo "all checks passed" || echo "FAILED")"
exit $fail
