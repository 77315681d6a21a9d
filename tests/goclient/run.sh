#!/usr/bin/env bash
# The Go package pgfencing (clients/go of the checkout; issue 46): its source copied, as `go get`
# would fetch it, into a GOPATH of its own beside Debian 12's Go packages (pgx v4, lib/pq, etcd
# 3.4's client in /usr/share/gocode; the module proxy is not reachable), vetted, then its tests
# (`go test ./...`: pgfencing, pgxfence, sqlfence, etcdfence) against a throwaway PostgreSQL 15 on
# 127.0.0.1:${PGPORT_CLIENTS_GO:-54549} that preloads pg_fencing and logs every statement, and an
# etcd on 127.0.0.1:${ETCD_CLIENTS_GO_PORT:-24151} (peer port +1).
#   tests/goclient/run.sh          (pg_fencing's current build installed)
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh
CHILD_PIDS=""
fresh_workdir
trap 'etcd_stop; cleanup_all' EXIT
trap 'exit 130' INT TERM
IMPORT=github.com/pg-fencing/pg_fencing/clients/go
GOPATH_OWN="$WORK/gopath"
mkdir -p "$GOPATH_OWN/src/$(dirname "$IMPORT")"
cp -r clients/go "$GOPATH_OWN/src/$IMPORT"
export GO111MODULE=off GOPATH="$GOPATH_OWN:/usr/share/gocode" GOCACHE="$WORK/go-build" GOFLAGS=
echo "-- $IMPORT ($(go version | awk '{print $3}'), GOPATH mode): go vet"
(cd "$GOPATH_OWN/src/$IMPORT" && go vet ./...)
PGPORT_TEST=${PGPORT_CLIENTS_GO:-54549}
ETCD_CLIENT_PORT=${ETCD_CLIENTS_GO_PORT:-24151}
ETCD_PEER_PORT=$((ETCD_CLIENT_PORT + 1))
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'
log_statement = 'all'
log_line_prefix = '[%a] '" pg_start
psql -X -q -c "CREATE EXTENSION pg_fencing"
etcd_start
echo "-- go test ./... (one package at a time: they share the server)"
status=0
(cd "$GOPATH_OWN/src/$IMPORT" && \
    PGFENCING_TEST_DSN="postgresql://postgres@127.0.0.1:$PGPORT_TEST/postgres" \
    PGFENCING_TEST_LOG="$WORK/postgres.log" PGFENCING_TEST_ETCD="127.0.0.1:$ETCD_CLIENT_PORT" \
    go test -p 1 -count=1 -v ./... >"$WORK/go-test.log" 2>&1) || status=$?
grep -E "^(--- |ok|FAIL|panic)|^    " "$WORK/go-test.log" || true
if [ "$status" -ne 0 ]; then
    tail -40 "$WORK/go-test.log"
    echo "FAIL: go test of clients/go (exit status $status)" >&2
    exit 1
fi
