#!/usr/bin/env bash
# Citus 14.0.1 for the Citus suite (tests/citus/run.sh; docs/citus.md), built against PostgreSQL
# 18 (the wheel's, PG18_BIN) and installed into it. Citus is in no package registry; its source
# is taken, in this order, from:
#   1. CITUS_SRC: a directory of Citus's source, or a .tar.gz of it;
#   2. citus-14.0.1.tar.gz in the vendor directory beside the checkout (shared/vendor in the
#      checkout's parent), checked against the sha256 its README.md gives for it;
#   3. the public release tag v14.0.1 (github.com/citusdata/citus), if it can be fetched.
# None of them: it says so and fails (the suite never passes without Citus). Nothing to do when
# the same version is installed already (CITUS_REBUILD=1 builds anyway).
#
#   tests/citus/build.sh
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
source scripts/lib.sh
VERSION=14.0.1
PG_CONFIG=$PG18_BIN/pg_config
if [ ! -x "$PG_CONFIG" ]; then
    echo "FAIL: no PostgreSQL 18 at $PG18_BIN: run scripts/setup.sh --test first (docs/citus.md)" >&2
    exit 1
fi
CONTROL=$("$PG_CONFIG" --sharedir)/extension/citus.control
if [ -z "${CITUS_REBUILD:-}" ] && [ -f "$CONTROL" ] && grep -q "^default_version = '14.0-1'" "$CONTROL" \
    && [ -f "$("$PG_CONFIG" --pkglibdir)/citus.so" ]; then
    echo "  Citus $VERSION is installed in $("$PG_CONFIG" --pkglibdir)"
    exit 0
fi
BUILD=$(mktemp -d /tmp/pg_fencing-citus.XXXXXX)
trap 'rm -rf "$BUILD"' EXIT
VENDOR="$(dirname "$ROOT")/shared/vendor"  # beside the checkout
TARBALL=""
if [ -n "${CITUS_SRC:-}" ]; then
    if [ -d "$CITUS_SRC" ]; then
        cp -a "$CITUS_SRC" "$BUILD/src"
    else
        TARBALL=$CITUS_SRC
    fi
    echo "  Citus from CITUS_SRC ($CITUS_SRC)"
elif [ -f "$VENDOR/citus-$VERSION.tar.gz" ]; then
    want=$(grep -o "citus-$VERSION\.tar\.gz.*" "$VENDOR/README.md" | grep -oE '\b[0-9a-f]{64}\b' | head -1 || true)
    got=$(sha256sum "$VENDOR/citus-$VERSION.tar.gz" | cut -d' ' -f1)
    if [ -z "$want" ] || [ "$want" != "$got" ]; then
        echo "FAIL: $VENDOR/citus-$VERSION.tar.gz has sha256 $got; $VENDOR/README.md gives ${want:-none}" >&2
        exit 1
    fi
    TARBALL="$VENDOR/citus-$VERSION.tar.gz"
    echo "  Citus from $TARBALL (sha256 $got, as $VENDOR/README.md gives)"
else
    url="https://github.com/citusdata/citus/archive/refs/tags/v$VERSION.tar.gz"
    if curl -fsSL --max-time 120 -o "$BUILD/citus.tar.gz" "$url"; then
        TARBALL="$BUILD/citus.tar.gz"
        echo "  Citus from $url"
    else
        echo "FAIL: no Citus source: CITUS_SRC is not set, $VENDOR/citus-$VERSION.tar.gz does not exist," >&2
        echo "      and $url could not be fetched. Set CITUS_SRC to Citus $VERSION's source." >&2
        exit 1
    fi
fi
if [ -n "$TARBALL" ]; then
    mkdir "$BUILD/src"
    tar -xzf "$TARBALL" -C "$BUILD/src" --strip-components=1
fi
# The wheel's pg_config passes -Wmissing-variable-declarations (clang's), which gcc 12 rejects.
cat >"$BUILD/cc" <<'CC'
#!/bin/sh
for a in "$@"; do
    [ "$a" = "-Wmissing-variable-declarations" ] || set -- "$@" "$a"
    shift
done
exec gcc "$@"
CC
chmod +x "$BUILD/cc"
cd "$BUILD/src"
if ! { ./configure --without-lz4 --without-zstd --without-libcurl CC="$BUILD/cc" PG_CONFIG="$PG_CONFIG" \
        && make -j"$(nproc)" CC="$BUILD/cc" && make install; } >"$BUILD/build.log" 2>&1; then
    echo "FAIL: building Citus failed; the end of its log:" >&2
    tail -30 "$BUILD/build.log" >&2
    exit 1
fi
echo "  Citus $VERSION built and installed into $("$PG_CONFIG" --pkglibdir)"
