#!/usr/bin/env bash
# The Go module pgfencing (issue 46): a fenced one-row transaction against the same transaction
# unfenced through pgx v4 and through database/sql with lib/pq, and against its floor
# (bench/goclient/main.go; BENCH_ROUNDS=7 BENCH_TXNS=2000), on a throwaway PostgreSQL 15 on
# 127.0.0.1:${PGPORT_GOCLIENT_BENCH:-54579} that preloads pg_fencing; the module copied into a
# GOPATH beside Debian's Go packages as tests/goclient/run.sh does. Written to bench/goclient.md.
# Needs pg_fencing's current build installed.
#   bench/goclient.sh
set -euo pipefail
source "$(dirname "$0")/../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/.."
source scripts/lib.sh
CHILD_PIDS=""
fresh_workdir
trap cleanup_all EXIT
trap 'exit 130' INT TERM
IMPORT=github.com/pg-fencing/pg_fencing/clients/go
GOPATH_OWN="$WORK/gopath"
mkdir -p "$GOPATH_OWN/src/$(dirname "$IMPORT")" "$GOPATH_OWN/src/pgfencing-bench"
cp -r clients/go "$GOPATH_OWN/src/$IMPORT"
cp bench/goclient/main.go "$GOPATH_OWN/src/pgfencing-bench/"
export GO111MODULE=off GOPATH="$GOPATH_OWN:/usr/share/gocode" GOCACHE="$WORK/go-build" GOFLAGS=
(cd "$GOPATH_OWN/src/pgfencing-bench" && go build -o "$WORK/goclient-bench" .)
PGPORT_TEST=${PGPORT_GOCLIENT_BENCH:-54579}
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'
fsync = off" pg_start
psql -X -q -c "CREATE EXTENSION pg_fencing"
"$WORK/goclient-bench" -url "postgresql://postgres@127.0.0.1:$PGPORT_TEST/postgres" -out bench/goclient.md
