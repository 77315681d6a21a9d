#!/usr/bin/env bash
# A protected distributed table against unprotected ones on the same Citus cluster (issue 45):
# Citus built into PostgreSQL 18 (tests/citus/build.sh), a coordinator and two workers on
# 127.0.0.1:${PGPORT_CITUS_BENCH:-54494} and the two ports above it, then bench/citus.py
# (single-row UPDATE through the coordinator, COPY of 100,000 rows; BENCH_ROUNDS=5
# BENCH_SECONDS=5 BENCH_COPY_ROWS=100000), written to bench/citus.md. Needs this checkout's
# build installed into PostgreSQL 18 (scripts/test.sh --only pg18).
#   bench/citus.sh
set -euo pipefail
source "$(dirname "$0")/../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/.."
source scripts/lib.sh
PGBIN=$PG18_BIN
tests/citus/build.sh
source tests/citus/cluster.sh
start_citus_cluster "${PGPORT_CITUS_BENCH:-54494}"
need_python
"$PY" bench/citus.py --port "$BASE" --pgbin "$PGBIN" --work "$WORK" --out bench/citus.md
