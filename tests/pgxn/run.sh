#!/usr/bin/env bash
# PGXN: the release archive (scripts/package.sh pgxn, target/packages/pg_fencing-<version>.zip)
# as PGXN takes it and as a PGXN user installs it:
#   1. its META.json validated by pgxn_meta (PGXN's JSON schemas of the Meta Spec; `cargo install
#      pgxn_meta`, scripts/setup.sh --test), first shown to refuse a META.json with a wrong
#      license; the archive holds one directory pg_fencing-<version> with META.json, whose
#      version is Cargo.toml's and whose provided file is in the archive;
#   2. `pgxn install ./pg_fencing-<version>.zip --pg_config <18's pg_config>` (as root: no --sudo), as
#      docs/operations.md ("Install", PGXN) tells a PGXN user: PGXN's client unpacks it and runs
#      the Makefile (cargo pgrx package, then the files renamed into pg_config's directories);
#      cargo's target directory is this checkout's target/pg18 (TARGET), so only pg_fencing
#      itself is compiled again;
#   3. a throwaway PostgreSQL 18 cluster on 127.0.0.1:${PGPORT_PGXN:-54477}: CREATE EXTENSION
#      from what was installed (the installed library is the one just built), a stale write
#      refused (FT001).
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
PGF_PG_MAJOR=18
source scripts/lib.sh

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
ARCHIVE=${1:-target/packages/pg_fencing-$VERSION.zip}
[ -f "$ARCHIVE" ] || { echo "no archive $ARCHIVE: run scripts/package.sh pgxn" >&2; exit 1; }
PGXN_META=$(command -v pgxn_meta || echo "${CARGO_HOME:-$HOME/.cargo}/bin/pgxn_meta")
PGPORT_TEST=${PGPORT_PGXN:-54477}
CHILD_PIDS=""
fresh_workdir
trap cleanup_all EXIT
trap 'exit 130' INT TERM

echo "== the archive ($ARCHIVE) and its META.json"
(cd "$WORK" && unzip -q "$ROOT/$ARCHIVE")
expect "one top directory, pg_fencing-$VERSION" "pg_fencing-$VERSION" "$(ls "$WORK")"
DIST="$WORK/pg_fencing-$VERSION"
sed 's/"license": "postgresql"/"license": "no-such-license"/' "$DIST/META.json" >"$WORK/bad-META.json"
expect "pgxn_meta refuses a META.json with a license PGXN does not know (the check can fail)" refused \
    "$("$PGXN_META" "$WORK/bad-META.json" >/dev/null 2>&1 && echo accepted || echo refused)"
expect "pgxn_meta validates the archive's META.json" "$DIST/META.json is OK" "$("$PGXN_META" "$DIST/META.json" 2>&1)"
expect "META.json's version is Cargo.toml's" yes \
    "$(grep -q "^   \"version\": \"$VERSION\"" "$DIST/META.json" && echo yes || echo no)"
provided=$(sed -n 's/^ *"file": "\(.*\)",*$/\1/p' "$DIST/META.json" | head -1)
expect "the file META.json provides ($provided) is in the archive" yes "$([ -f "$DIST/$provided" ] && echo yes || echo no)"

echo "== pgxn install from the archive into PostgreSQL 18 ($PGBIN)"
LIB="$("$PGBIN/pg_config" --pkglibdir)/pg_fencing.so"
before=$(stat -c %i "$LIB" 2>/dev/null || echo none)
if ! (cd "$WORK" && TARGET="$ROOT/target/pg18" pgxn install --yes --pg_config "$PGBIN/pg_config" \
        "$ROOT/$ARCHIVE" >"$WORK/pgxn-install.log" 2>&1); then
    tail -30 "$WORK/pgxn-install.log"
    echo "FAIL: pgxn install" >&2
    exit 1
fi
grep -E "^(INFO|WARNING|ERROR)" "$WORK/pgxn-install.log" | sed 's/^/  pgxn: /' | head -8 || true
built="$ROOT/target/pg18/release/pg_fencing-pg18$LIB"
expect "pg_config's library is the one pgxn install just built, a new file" yes \
    "$(cmp -s "$built" "$LIB" && [ "$(stat -c %i "$LIB")" != "$before" ] && echo yes || echo no)"

echo "== PostgreSQL 18 with what pgxn installed"
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'" pg_start
psql -X -q -c "CREATE EXTENSION pg_fencing"
expect "CREATE EXTENSION pg_fencing installs version $VERSION" "$VERSION" \
    "$(psql -X -Atc "SELECT extversion FROM pg_extension WHERE extname = 'pg_fencing'")"
expect "a stale write is refused (FT001)" FT001 "$(sqlstate_of psql -X -q -v ON_ERROR_STOP=1 \
    -c "CREATE TABLE t (id int PRIMARY KEY, v int); SELECT fencing_protect('t', 'r'); SELECT fencing_advance('r', 10)" \
    -c "BEGIN; SET LOCAL pg_fencing.token = '9'; INSERT INTO t VALUES (1, 1); COMMIT")"
exit $fail
