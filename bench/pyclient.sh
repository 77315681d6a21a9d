#!/usr/bin/env bash
# The Python package pg-fencing (issue 46): a fenced one-row transaction against the same
# transaction unfenced through the same driver (bench/pyclient.py; BENCH_ROUNDS=7
# BENCH_TXNS=2000), on a throwaway PostgreSQL 15 on 127.0.0.1:${PGPORT_PYCLIENT_BENCH:-54519}
# that preloads pg_fencing; the package installed from its wheel (tests/pyclient/build.py).
# Written to bench/pyclient.md. Needs pg_fencing's current build installed.
#   bench/pyclient.sh
set -euo pipefail
source "$(dirname "$0")/../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/.."
source scripts/lib.sh
need_python
CHILD_PIDS=""
fresh_workdir
trap cleanup_all EXIT
trap 'exit 130' INT TERM
"$PY" tests/pyclient/build.py --out "$WORK" >/dev/null
PGPORT_TEST=${PGPORT_PYCLIENT_BENCH:-54519}
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'
fsync = off" pg_start
psql -X -q -c "CREATE EXTENSION pg_fencing"
PYTHONPATH="$WORK/site" "$PY" bench/pyclient.py --dsn "host=127.0.0.1 port=$PGPORT_TEST user=postgres dbname=postgres" \
    --url "postgresql://postgres@127.0.0.1:$PGPORT_TEST/postgres" --out bench/pyclient.md
