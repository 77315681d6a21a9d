#!/usr/bin/env bash
# The CloudNativePG extension image (scripts/package.sh image, target/packages/
# pg_fencing-<version>-pg18.oci.tar) used the way CloudNativePG uses it, without Kubernetes: its
# layout checked (only lib/pg_fencing.so, share/extension/ with the control file and every SQL
# script of the release tarball for 18, licenses/pg_fencing/LICENSE; the control file names the
# library without $libdir), then its unpacked contents mounted into a throwaway PostgreSQL 18
# cluster on 127.0.0.1:${PGPORT_IMAGE:-54475} as the operator mounts an image volume: its share/
# first in extension_control_path, its lib/ first in dynamic_library_path, and the library
# preloaded from there. CREATE EXTENSION takes the image's files (checked: the functions' library
# is 'pg_fencing', resolved through dynamic_library_path, and the server has the image's .so
# mapped), and the pg_regress suite runs against it.
#
#   tests/image/run.sh [IMAGE.oci.tar]
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
PGF_PG_MAJOR=18
source scripts/lib.sh

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
IMAGE=${1:-target/packages/pg_fencing-$VERSION-pg18.oci.tar}
TARBALL=target/packages/pg_fencing-$VERSION-pg18.tar.gz
[ -f "$IMAGE" ] || { echo "no image $IMAGE: run scripts/package.sh image" >&2; exit 1; }
[ -f "$TARBALL" ] || { echo "no tarball $TARBALL: run scripts/package.sh 18" >&2; exit 1; }
PGPORT_TEST=${PGPORT_IMAGE:-54475}
CHILD_PIDS=""
fresh_workdir
trap cleanup_all EXIT
trap 'exit 130' INT TERM

echo "== the image's layout ($IMAGE, tag $VERSION-pg18)"
mkdir -p "$WORK/oci"
tar -C "$WORK/oci" -xf "$IMAGE"
rootless=()
[ "$(id -u)" -eq 0 ] || rootless=(--rootless)
umoci unpack "${rootless[@]}" --image "$WORK/oci:$VERSION-pg18" "$WORK/bundle" >/dev/null
EXT="$WORK/bundle/rootfs"   # where the operator mounts it: /extensions/pg_fencing
(cd "$EXT" && find . -mindepth 1 ! -type d | sed 's|^\./||' | sort) >"$WORK/image-files"
{ echo lib/pg_fencing.so; echo licenses/pg_fencing/LICENSE
  tar -tzf "$TARBALL" | sed -n 's|^usr/share/postgresql/18/\(extension/.*[^/]\)$|share/\1|p'; } | sort >"$WORK/want-files"
expect "the image holds exactly the library, the control file and SQL scripts of the tarball for 18, and the license" \
    "$(tr '\n' ' ' <"$WORK/want-files")" "$(tr '\n' ' ' <"$WORK/image-files")"
expect "its control file names the library without \$libdir" "module_pathname = 'pg_fencing'" \
    "$(grep '^module_pathname' "$EXT/share/extension/pg_fencing.control")"
config=$(skopeo inspect --config "oci:$WORK/oci:$VERSION-pg18")
arch=$(readelf -h "$EXT/lib/pg_fencing.so" | sed -n 's/^ *Machine: *//p')
case "$arch" in *X86-64*) arch=amd64 ;; *AArch64*) arch=arm64 ;; esac
expect "the image's platform is its library's (linux/$arch)" "linux $arch" \
    "$(echo "$config" | sed -n 's/^ *"os": "\(.*\)",*$/\1/p;' | head -1) $(echo "$config" | sed -n 's/^ *"architecture": "\(.*\)",*$/\1/p' | head -1)"
chmod -R a+rX "$WORK/bundle"

echo "== mounted into PostgreSQL 18 as an image volume"
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'
extension_control_path = '$EXT/share:\$system'
dynamic_library_path = '$EXT/lib:\$libdir'" pg_start
pm=$(head -1 "$PGDATA_TEST/postmaster.pid")
expect "the server mapped the image's library (shared_preload_libraries through dynamic_library_path)" yes \
    "$(grep -q "$EXT/lib/pg_fencing.so" "/proc/$pm/maps" && echo yes || echo "no: $(grep pg_fencing "/proc/$pm/maps" | head -1)")"
psql -X -q -c "CREATE DATABASE image_check"
psql -X -q -d image_check -c "CREATE EXTENSION pg_fencing"
expect "CREATE EXTENSION took the image's control file and scripts (the functions' library is 'pg_fencing')" pg_fencing \
    "$(psql -X -Atd image_check -c "SELECT string_agg(DISTINCT probin, ',') FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'pg_fencing' WHERE p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'c')")"
expect "a stale write is refused (FT001)" FT001 "$(sqlstate_of psql -X -q -d image_check -v ON_ERROR_STOP=1 \
    -c "CREATE TABLE t (id int PRIMARY KEY, v int); SELECT fencing_protect('t', 'r'); SELECT fencing_advance('r', 10)" \
    -c "BEGIN; SET LOCAL pg_fencing.token = '9'; INSERT INTO t VALUES (1, 1); COMMIT")"

echo "== the pg_regress suite against the image's extension"
psql -X -q -c "CREATE DATABASE pg_fencing_regress"
mkdir -p "$WORK/regress"
if ! "$("$PGBIN/pg_config" --pkglibdir)/pgxs/src/test/regress/pg_regress" --bindir="$PGBIN" \
        --use-existing --host=127.0.0.1 --port="$PGPORT_TEST" --user=postgres \
        --dbname=pg_fencing_regress --inputdir=tests/pg_regress --outputdir="$WORK/regress" \
        --schedule=tests/pg_regress/schedule; then
    cat "$WORK/regress/regression.diffs" 2>/dev/null || true
    fail=1
fi
exit $fail
