#!/usr/bin/env bash
# The Python package pg-fencing (clients/ of the checkout; issue 46): its wheel built from the
# checkout and installed from that artifact into a directory of its own (tests/pyclient/build.py),
# then tests/pyclient/test_client.py with psycopg 3 (sync, async, psycopg_pool), psycopg2 and
# asyncpg against a throwaway PostgreSQL 15 on 127.0.0.1:${PGPORT_CLIENTS_PY:-54509} that
# preloads pg_fencing and pg_stat_statements and logs every statement (a fenced transaction must
# send as many as an unfenced one, and leave one pg_stat_statements entry whatever its token), then
# once more restarted without pg_stat_statements (the token as SET LOCAL).
#   tests/pyclient/run.sh          (pg_fencing's current build installed)
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh
need_python
CHILD_PIDS=""
fresh_workdir
trap cleanup_all EXIT
trap 'exit 130' INT TERM
echo "-- the wheel, built and installed from the artifact"
"$PY" tests/pyclient/build.py --out "$WORK"
PGPORT_TEST=${PGPORT_CLIENTS_PY:-54509}
PG_EXTRA_CONF="shared_preload_libraries = 'pg_stat_statements,pg_fencing'
log_statement = 'all'
log_line_prefix = '[%a] '" pg_start
psql -X -q -c "CREATE EXTENSION pg_fencing" -c "CREATE EXTENSION pg_stat_statements"
# The installed package, not the checkout's source.
(cd "$WORK" && PYTHONPATH="$WORK/site" "$PY" -c "import pg_fencing, sys; sys.exit(0 if pg_fencing.__file__.startswith('$WORK/site/') else 1)")
PYTHONPATH="$WORK/site" "$PY" tests/pyclient/test_client.py \
    --dsn "host=127.0.0.1 port=$PGPORT_TEST user=postgres dbname=postgres" \
    --url "postgresql://postgres@127.0.0.1:$PGPORT_TEST/postgres" --log "$WORK/postgres.log"
# The token as SET LOCAL: the same server restarted without pg_stat_statements (the packages use
# set_config only where PostgreSQL 15's pg_stat_statements would keep one entry per token).
echo "-- restarted without pg_stat_statements"
sed -i "s/^shared_preload_libraries = 'pg_stat_statements,pg_fencing'/shared_preload_libraries = 'pg_fencing'/" "$PGDATA_TEST/postgresql.conf"
as_pg "$PGBIN/pg_ctl" -D "$PGDATA_TEST" -m fast -w -t 60 stop >/dev/null
pg_ctl_start "$PGDATA_TEST" "$WORK/postgres.log"
PYTHONPATH="$WORK/site" "$PY" tests/pyclient/test_client.py --set-local-only \
    --dsn "host=127.0.0.1 port=$PGPORT_TEST user=postgres dbname=postgres" \
    --url "postgresql://postgres@127.0.0.1:$PGPORT_TEST/postgres" --log "$WORK/postgres.log"
