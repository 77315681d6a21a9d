#!/usr/bin/env bash
# The isolation specs, or some of them, with PostgreSQL's pg_isolation_regress against a
# throwaway cluster that preloads the library (as stage 3 of scripts/test.sh runs them), in both
# table shapes, on
# 127.0.0.1:${PGPORT_ISOLATION:-54471}:
#
#   tests/isolation/run.sh                      # the whole schedule
#   tests/isolation/run.sh row_race mark_cache  # these specs (tests/isolation/specs/NAME.spec)
#
# Needs the extension installed (scripts/test.sh --only install, or scripts/setup.sh);
# PGF_PG_MAJOR=18 runs them on PostgreSQL 18 (where scripts/test.sh's stage 4 installs it).
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh

CHILD_PIDS=""
fresh_workdir
trap 'cleanup_all' EXIT
trap 'exit 130' INT TERM
PGPORT_TEST=${PGPORT_ISOLATION:-54471}
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'" pg_start
psql -X -q -c "CREATE DATABASE pg_fencing_isolation"
psql -X -q -d pg_fencing_isolation -c "CREATE EXTENSION pg_fencing"
[ $# -gt 0 ] || set -- --schedule=tests/isolation/schedule
# Twice: in the shape fencing_protect gives where the library is preloaded (set-based for plain
# tables), then with pg_fencing.set_based_shape off for the database (the row-trigger shape);
# the expected outputs are the same (docs/design.md, "The set-based shape").
for shape in set-based row-trigger; do
    echo "-- isolation specs, tables in the $shape shape"
    if [ "$shape" = row-trigger ]; then
        psql -X -q -c "ALTER DATABASE pg_fencing_isolation SET pg_fencing.set_based_shape = off"
    fi
    mkdir -p "$WORK/isolation-$shape"
    if ! "$("$PGBIN/pg_config" --pkglibdir)/pgxs/src/test/isolation/pg_isolation_regress" --bindir="$PGBIN" \
            --use-existing --host=127.0.0.1 --port="$PGPORT_TEST" --user=postgres \
            --dbname=pg_fencing_isolation --inputdir=tests/isolation --outputdir="$WORK/isolation-$shape" "$@"; then
        cat "$WORK/isolation-$shape/regression.diffs" 2>/dev/null || true
        exit 1
    fi
done
