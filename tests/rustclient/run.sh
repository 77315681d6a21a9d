#!/usr/bin/env bash
# The Rust crate pg-fencing (clients/rust; issue 46), tested the way a user gets it: `cargo
# package` makes the .crate a registry would serve, it is unpacked into a directory of its own and
# its tests run there (`cargo test --all-features --locked`: the unit tests and tests/live.rs)
# against a throwaway PostgreSQL 15 on 127.0.0.1:${PGPORT_CLIENTS_RUST:-54569} that preloads
# pg_fencing and logs every statement, and an etcd on 127.0.0.1:${ETCD_CLIENTS_RUST_PORT:-24161}
# (peer port +1). The build shares clients/rust/target with examples/rust-client (dev
# profile), so the dependencies are built once for both.
#   tests/rustclient/run.sh          (pg_fencing's current build installed)
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
ROOT=$PWD
source scripts/lib.sh
CHILD_PIDS=""
fresh_workdir
trap 'etcd_stop; cleanup_all' EXIT
trap 'exit 130' INT TERM
export CARGO_TARGET_DIR="$ROOT/clients/rust/target"
T0=$(date +%s)
echo "-- cargo package (clients/rust) and the .crate unpacked"
(cd clients/rust && cargo package -q --allow-dirty --no-verify --locked)
CRATE=$(ls -t "$CARGO_TARGET_DIR"/package/pg-fencing-*.crate | head -1)
# -m: the files get the time of unpacking (a .crate stores fixed times, and cargo would take a
# build of an earlier unpacking in the same place as up to date).
tar -m -xzf "$CRATE" -C "$WORK"
SRC="$WORK/$(basename "$CRATE" .crate)"
[ -f "$SRC/Cargo.lock" ] && [ -f "$SRC/tests/live.rs" ] || { echo "FAIL: $CRATE lacks Cargo.lock or tests/live.rs" >&2; exit 1; }
echo "-- building its tests (dev profile, all features)"
(cd "$SRC" && cargo test -q --all-features --locked --no-run)
echo "   built in $(( $(date +%s) - T0 ))s"
PGPORT_TEST=${PGPORT_CLIENTS_RUST:-54569}
ETCD_CLIENT_PORT=${ETCD_CLIENTS_RUST_PORT:-24161}
ETCD_PEER_PORT=$((ETCD_CLIENT_PORT + 1))
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'
log_statement = 'all'
log_line_prefix = '[%a] '" pg_start
psql -X -q -c "CREATE EXTENSION pg_fencing"
etcd_start
echo "-- cargo test (the tests one at a time: they share the server)"
status=0
(cd "$SRC" && PGFENCING_TEST_DSN="host=127.0.0.1 port=$PGPORT_TEST user=postgres dbname=postgres" \
    PGFENCING_TEST_LOG="$WORK/postgres.log" PGFENCING_TEST_ETCD="127.0.0.1:$ETCD_CLIENT_PORT" \
    PGFENCING_TEST_URL="postgresql://postgres@127.0.0.1:$PGPORT_TEST/postgres" \
    cargo test --all-features --locked -- --test-threads=1 --nocapture \
    >"$WORK/cargo-test.log" 2>&1) || status=$?
grep -E "^test |^test result|^statements|^a lock" "$WORK/cargo-test.log" || true
if [ "$status" -ne 0 ]; then
    tail -60 "$WORK/cargo-test.log"
    echo "FAIL: cargo test of clients/rust (exit status $status)" >&2
    exit 1
fi
echo "PASS: the Rust crate's tests against PostgreSQL and etcd ($(( $(date +%s) - T0 ))s in all)"
