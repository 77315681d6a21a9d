#!/usr/bin/env bash
# The background worker against real etcd 3.4 (see worker_test.py for the scenarios): throwaway
# clusters on 127.0.0.1:${PGPORT_WORKER:-54369}-54371 and etcd on ${ETCD_WORKER_PORT:-23900}
# and that + 100 (a three-member cluster). Needs the release package or `cargo pgrx install`.
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh
need_python
PGBIN="$PGBIN" exec "$PY" tests/worker/worker_test.py "$@"
