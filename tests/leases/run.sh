#!/usr/bin/env bash
# PostgreSQL leases under concurrency (tests/leases/leases_test.py): waiting and waking on a
# release's commit, wait, statement_timeout and cancel, renewal from another session, NOTIFY
# pg_fencing, and a concurrent run with zombies checked by an independent checker; on a
# throwaway cluster on 127.0.0.1:${PGPORT_LEASES:-54499} that does not preload the library
# (leases need no worker). The regress file tests/pg_regress/sql/leases.sql has the time fence
# on every write path.
# Then the checker's negative control: the same concurrent run on tables that are not protected
# must show a committed write made after its lease ended.
# Usage: tests/leases/run.sh [--seconds N] [--seed N]   (pg_fencing's current build installed)
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh
need_python
LEASE_SECONDS=12
LEASE_SEED=1
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) LEASE_SECONDS=$2; shift 2 ;;
        --seed) LEASE_SEED=$2; shift 2 ;;
        *) echo "usage: $0 [--seconds N] [--seed N]" >&2; exit 2 ;;
    esac
done
CHILD_PIDS=""
fresh_workdir
trap cleanup_all EXIT
trap 'exit 130' INT TERM
PGPORT_TEST=${PGPORT_LEASES:-54499}
PG_EXTRA_CONF="track_commit_timestamp = on
max_connections = 50" pg_start
LEASE_SECONDS=$LEASE_SECONDS LEASE_SEED=$LEASE_SEED "$PY" tests/leases/leases_test.py
echo "-- negative control: the same checker, tables not protected"
psql -X -q -c "CREATE DATABASE unfenced"
if out=$(PGDATABASE=unfenced LEASE_UNFENCED=1 LEASE_SECONDS=6 LEASE_SEED=$LEASE_SEED "$PY" tests/leases/leases_test.py 2>&1); then
    echo "$out" | tail -8
    echo "FAIL: the checker found nothing wrong with zombie writes on unprotected tables" >&2
    exit 1
fi
echo "$out" | grep -m1 "FAIL: every committed write began while its lease was live" \
    | sed 's/^ *FAIL: /  as expected without the fence, the checker found: not /' | cut -c1-200 \
    || { echo "$out" | tail -8; echo "FAIL: the negative control failed for another reason" >&2; exit 1; }
