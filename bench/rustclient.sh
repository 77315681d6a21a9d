#!/usr/bin/env bash
# The Rust crate pg-fencing (issue 46): a fenced one-row transaction against the same transaction
# unfenced through tokio-postgres and through sqlx, and against its floor
# (clients/rust/examples/bench.rs; BENCH_ROUNDS=7 BENCH_TXNS=2000), on a throwaway PostgreSQL 15 on
# 127.0.0.1:${PGPORT_RUSTCLIENT_BENCH:-54589} that preloads pg_fencing. Written to
# bench/rustclient.md. Needs pg_fencing's current build installed.
#   bench/rustclient.sh
set -euo pipefail
source "$(dirname "$0")/../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/.."
source scripts/lib.sh
CHILD_PIDS=""
fresh_workdir
trap cleanup_all EXIT
trap 'exit 130' INT TERM
export CARGO_TARGET_DIR="$PWD/clients/rust/target"
(cd clients/rust && cargo build -q --release --locked --all-features --example bench)
PGPORT_TEST=${PGPORT_RUSTCLIENT_BENCH:-54589}
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'
fsync = off" pg_start
psql -X -q -c "CREATE EXTENSION pg_fencing"
"$CARGO_TARGET_DIR/release/examples/bench" "host=127.0.0.1 port=$PGPORT_TEST user=postgres dbname=postgres" bench/rustclient.md
