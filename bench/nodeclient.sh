#!/usr/bin/env bash
# The Node package pg-fencing (issue 46): a fenced one-row transaction against the same
# transaction unfenced through node-postgres, and against its floor (bench/nodeclient.js;
# BENCH_ROUNDS=7 BENCH_TXNS=2000), on a throwaway PostgreSQL 15 on
# 127.0.0.1:${PGPORT_NODECLIENT_BENCH:-54539} that preloads pg_fencing; the package packed and
# installed from its tarball as tests/nodeclient/run.sh does. Written to bench/nodeclient.md.
# Needs pg_fencing's current build installed and tests/nodeclient/node_modules (scripts/setup.sh --test).
#   bench/nodeclient.sh
set -euo pipefail
source "$(dirname "$0")/../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/.."
source scripts/lib.sh
CHILD_PIDS=""
fresh_workdir
trap cleanup_all EXIT
trap 'exit 130' INT TERM
TESTDIR=tests/nodeclient
tarball=$(cd clients/node && npm pack --silent --pack-destination "$WORK")
rm -rf "$TESTDIR/node_modules/pg-fencing"
mkdir -p "$TESTDIR/node_modules/pg-fencing"
tar -xzf "$WORK/$tarball" -C "$TESTDIR/node_modules/pg-fencing" --strip-components=1
PGPORT_TEST=${PGPORT_NODECLIENT_BENCH:-54539}
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'
fsync = off" pg_start
psql -X -q -c "CREATE EXTENSION pg_fencing"
NODE_PATH="$PWD/$TESTDIR/node_modules" node bench/nodeclient.js \
    --url "postgresql://postgres@127.0.0.1:$PGPORT_TEST/postgres" --out bench/nodeclient.md
