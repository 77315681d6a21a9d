#!/usr/bin/env bash
# The Node package pg-fencing (clients/node of the checkout; issue 46): packed with `npm pack`,
# its tarball unpacked into tests/nodeclient/node_modules/pg-fencing (where npm would install it,
# beside node-postgres and Drizzle ORM as tests/nodeclient/package-lock.json pins them: npm ci by
# scripts/setup.sh --test), then tests/nodeclient/test_client.js against a throwaway PostgreSQL 15
# on 127.0.0.1:${PGPORT_CLIENTS_NODE:-54529} that preloads pg_fencing and pg_stat_statements and logs
# every statement.
#   tests/nodeclient/run.sh          (pg_fencing's current build installed)
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh
TESTDIR=tests/nodeclient
if ! command -v node >/dev/null || [ ! -f "$TESTDIR/node_modules/pg/package.json" ]; then
    echo "node or $TESTDIR/node_modules is missing: run scripts/setup.sh --test (npm ci in $TESTDIR)" >&2
    exit 1
fi
CHILD_PIDS=""
fresh_workdir
trap cleanup_all EXIT
trap 'exit 130' INT TERM
echo "-- the package, packed and installed from its tarball"
tarball=$(cd clients/node && npm pack --silent --pack-destination "$WORK")
rm -rf "$TESTDIR/node_modules/pg-fencing"
mkdir -p "$TESTDIR/node_modules/pg-fencing"
tar -xzf "$WORK/$tarball" -C "$TESTDIR/node_modules/pg-fencing" --strip-components=1
echo "   $tarball: $(tar -tzf "$WORK/$tarball" | tr '\n' ' ')"
PGPORT_TEST=${PGPORT_CLIENTS_NODE:-54529}
PG_EXTRA_CONF="shared_preload_libraries = 'pg_stat_statements,pg_fencing'
log_statement = 'all'
log_line_prefix = '[%a] '" pg_start
psql -X -q -c "CREATE EXTENSION pg_fencing" -c "CREATE EXTENSION pg_stat_statements"
echo "-- from an ES module: every export is a named export"
(cd "$TESTDIR" && node --input-type=module -e "
import { fenced, fromError, Lease, runWithLease, FencingError, StaleToken, NoToken, LeaseLost, ProtectionInactive,
         LockServiceUnavailable, NotCurrentHolder, RolledBack, checkToken } from 'pg-fencing';
import { fencedDb } from 'pg-fencing/drizzle';
for (const [n, v] of Object.entries({ fenced, fromError, Lease, runWithLease, FencingError, StaleToken, NoToken, LeaseLost,
    ProtectionInactive, LockServiceUnavailable, NotCurrentHolder, RolledBack, checkToken, fencedDb }))
  if (typeof v !== 'function') { console.error('FAIL: ' + n + ' is not a named export'); process.exit(1); }
console.log('  ok: import { … } from \'pg-fencing\' and \'pg-fencing/drizzle\' in an ES module');")
(cd "$TESTDIR" && node test_client.js --url "postgresql://postgres@127.0.0.1:$PGPORT_TEST/postgres" \
    --log "$WORK/postgres.log")
# The token as SET LOCAL: the same server restarted without pg_stat_statements (the package uses
# set_config only where PostgreSQL 15's pg_stat_statements would keep one entry per token).
echo "-- restarted without pg_stat_statements"
sed -i "s/^shared_preload_libraries = 'pg_stat_statements,pg_fencing'/shared_preload_libraries = 'pg_fencing'/" "$PGDATA_TEST/postgresql.conf"
as_pg "$PGBIN/pg_ctl" -D "$PGDATA_TEST" -m fast -w -t 60 stop >/dev/null
pg_ctl_start "$PGDATA_TEST" "$WORK/postgres.log"
(cd "$TESTDIR" && node test_client.js --set-local-only --url "postgresql://postgres@127.0.0.1:$PGPORT_TEST/postgres" \
    --log "$WORK/postgres.log")
