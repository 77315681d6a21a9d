#!/usr/bin/env bash
# The background worker against real etcd 3.4 (see worker_test.py for the scenarios): throwaway
# clusters on 127.0.0.1:${PGPORT_WORKER:-54369}-54371 and etcd on ${ETCD_WORKER_PORT:-23900}
# and that + 100 (a three-member cluster); then production_test.py (TLS with client certificates,
# authentication, etcd grpc-proxy) on ${PGPORT_PRODUCTION:-54380}-54382 and etcd
# ${ETCD_PRODUCTION_PORT:-24110} to that + 25; then bench/many_locks.py --quick on
# 127.0.0.1:${PGPORT_MANYLOCKS:-54390}, etcd ${ETCD_MANYLOCKS_PORT:-24300} and 24301. Needs the
# release package or `cargo pgrx install`.
#   tests/worker/run.sh [--only SCENARIO[,SCENARIO...]] [--worker-only]
# --worker-only: worker_test.py alone (the TLS, authentication, grpc-proxy and many-locks runs
# test the worker's etcd client, which is the same on every major; stage 18 uses it).
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
WORKER_ONLY=""
for a in "$@"; do [ "$a" = --worker-only ] && WORKER_ONLY=yes; done
cd "$(dirname "$0")/../.."
source scripts/lib.sh
need_python
PGBIN="$PGBIN" "$PY" tests/worker/worker_test.py "$@"
# etcd as in production (TLS, authentication, grpc-proxy): not with --only either.
if [[ " $* " != *" --only "* ]] && [ -z "$WORKER_ONLY" ]; then
    PGBIN="$PGBIN" "$PY" tests/worker/production_test.py
fi
# Many locks at once (200 locks of 20 sessions, 1,000 cycles; bench/many_locks.py checks what it
# measures): not when only some scenarios were asked for (--only).
if [[ " $* " != *" --only "* ]] && [ -z "$WORKER_ONLY" ]; then
    PGBIN="$PGBIN" "$PY" bench/many_locks.py --quick \
        --pg-port "${PGPORT_MANYLOCKS:-54390}" --etcd-port "${ETCD_MANYLOCKS_PORT:-24300}"
fi
