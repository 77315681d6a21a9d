#!/usr/bin/env bash
# The bypass hunter (tests/bypass/hunt.py) against a throwaway cluster: random sequences of
# writes through every token source and write path, on tables in every protection state, each
# outcome compared with a model of the documented contract; between them, the server restarted
# without and with the library preloaded (hunt.py restarts it with pg_ctl).
#
#   tests/bypass/run.sh [--seed S] [--sequences N] [--steps N] [--tables r,p,pp,r_sub,p_sub] [--no-states] [--no-preload]
#   (defaults: seed 1, 30 sequences of 40 steps, every table, DDL and restarts between writes)
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh
need_python

ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seed|--sequences|--steps|--tables) ARGS+=("$1" "$2"); shift 2 ;;
        --no-states|--no-preload) ARGS+=("$1"); shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done

CHILD_PIDS=""
fresh_workdir
trap 'cleanup_all' EXIT
trap 'exit 130' INT TERM
PGPORT_TEST=${PGPORT_BYPASS:-54459}
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'
wal_level = logical" pg_start
psql -X -q -c "CREATE DATABASE hunt" -c "CREATE DATABASE hunt_pub"
psql -X -q -d hunt -c "CREATE EXTENSION pg_fencing"
$PY tests/bypass/hunt.py --dsn "host=127.0.0.1 port=$PGPORT_TEST dbname=hunt" \
    --pub-dsn "host=127.0.0.1 port=$PGPORT_TEST dbname=hunt_pub" \
    --pg-ctl "$PGBIN/pg_ctl" --pgdata "$PGDATA_TEST" --pg-log "$WORK/postgres.log" "${ARGS[@]}"
