#!/usr/bin/env bash
# Pooler safety through a real pgbouncer in transaction mode (see pooler_test.py): a throwaway
# cluster on 127.0.0.1:${PGPORT_POOLER:-54389} and pgbouncer on 127.0.0.1:${BOUNCER_PORT:-54399}
# with a single server connection.
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh
need_python
PGPORT_TEST=${PGPORT_POOLER:-54389}
BOUNCER_PORT=${BOUNCER_PORT:-54399}
CHILD_PIDS=""
fresh_workdir
trap 'cleanup_all' EXIT
trap 'exit 130' INT TERM

PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'" pg_start
psql -X -q -v ON_ERROR_STOP=1 <<'SQL' >/dev/null
CREATE EXTENSION pg_fencing;
CREATE TABLE acct (id int PRIMARY KEY, v int);
SELECT fencing_protect('acct', 'pool-res');
BEGIN; SET LOCAL pg_fencing.token = '1'; INSERT INTO acct VALUES (1, 0); COMMIT;
CREATE TABLE job (id int PRIMARY KEY, state text);
SELECT fencing_protect('job');
SQL

cat >"$WORK/pgbouncer.ini" <<INI
[databases]
postgres = host=127.0.0.1 port=$PGPORT_TEST dbname=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $BOUNCER_PORT
unix_socket_dir =
auth_type = trust
auth_file = $WORK/userlist.txt
pool_mode = transaction
default_pool_size = 1
min_pool_size = 0
max_client_conn = 20
server_reset_query =
logfile = $WORK/pgbouncer.log
pidfile = $WORK/pgbouncer.pid
admin_users = postgres
INI
printf '"postgres" ""\n"pool_user" ""\n' >"$WORK/userlist.txt"
[ "$(id -u)" -eq 0 ] && chown postgres:postgres "$WORK/pgbouncer.ini" "$WORK/userlist.txt"
as_pg pgbouncer "$WORK/pgbouncer.ini" >/dev/null 2>&1 &
CHILD_PIDS="$!"
for _ in $(seq 1 300); do   # up to 30 s
    psql -X -q -h 127.0.0.1 -p "$BOUNCER_PORT" -c 'SELECT 1' >/dev/null 2>&1 && break
    sleep 0.1
done
BOUNCER_PORT=$BOUNCER_PORT "$PY" tests/pooler/pooler_test.py
# pgbouncer runs as postgres (under sudo): stop it by its pid file.
[ -f "$WORK/pgbouncer.pid" ] && kill "$(cat "$WORK/pgbouncer.pid")" 2>/dev/null || true
