#!/usr/bin/env bash
# The pg_regress suite, or some of its files, against a throwaway cluster that preloads the
# library (as stage 2 of scripts/test.sh runs it), on 127.0.0.1:${PGPORT_REGRESS:-54489}:
#
#   tests/pg_regress/run.sh                         # the whole schedule
#   tests/pg_regress/run.sh schema_changes hostile  # these files (fencing first: it creates the
#                                                   # extension the others use)
#
# Needs scripts/setup.sh --test (or scripts/test.sh) to have installed the extension;
# PGF_PG_MAJOR=18 runs it on PostgreSQL 18 (where scripts/test.sh's stage 4 installs it).
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh

CHILD_PIDS=""
fresh_workdir
trap 'cleanup_all' EXIT
trap 'exit 130' INT TERM
PGPORT_TEST=${PGPORT_REGRESS:-54489}
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'" pg_start
psql -X -q -c "CREATE DATABASE pg_fencing_regress"
if [ $# -eq 0 ]; then
    set -- --schedule=tests/pg_regress/schedule
elif [ "$1" != fencing ]; then
    set -- fencing "$@"
fi
mkdir -p "$WORK/regress"
if ! "$("$PGBIN/pg_config" --pkglibdir)/pgxs/src/test/regress/pg_regress" --bindir="$PGBIN" \
        --use-existing --host=127.0.0.1 --port="$PGPORT_TEST" --user=postgres \
        --dbname=pg_fencing_regress --inputdir=tests/pg_regress --outputdir="$WORK/regress" "$@"; then
    cat "$WORK/regress/regression.diffs" 2>/dev/null || true
    exit 1
fi
