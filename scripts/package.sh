#!/usr/bin/env bash
# Builds the release packages of pg_fencing (docs/operations.md, "Install" and "Releasing a
# version"), from `cargo pgrx package` (release build), into target/packages/:
#   postgresql-15-pg-fencing_<version>_amd64.deb   PostgreSQL 15 (Debian's paths): the library,
#                                                  the control file, the SQL scripts, the docs;
#                                                  depends on postgresql-15 and on the libraries
#                                                  the .so links (dpkg-shlibdeps)
#   pg_fencing-<version>-pg15.tar.gz               the same files, to unpack at / on a server
#   pg_fencing-<version>-pg18.tar.gz               PostgreSQL 18, the same layout with 18 for 15
#                                                  (usr/lib/postgresql/18/lib, usr/share/postgresql/18/extension)
#   pg_fencing-<version>-pg18.oci.tar              (`image` only) the extension image for
#                                                  CloudNativePG's image volumes: an OCI image
#                                                  (layout, tarred) from scratch holding only
#                                                  lib/pg_fencing.so, share/extension/ (control file
#                                                  and SQL scripts) and licenses/pg_fencing/, built
#                                                  offline with umoci; its control file names the
#                                                  library without $libdir, so that PostgreSQL 18
#                                                  finds it through dynamic_library_path
# The build for 18 uses PostgreSQL 18 for building (scripts/pg18.sh; scripts/setup.sh --test
# installs it) and its own target directory.
#
# Usage: scripts/package.sh [15|18|all|image|pgxn]   (default all: 15 and 18; image: 18 and its
# image; pgxn: the source archive PGXN takes, pg_fencing-<version>.zip, from the committed HEAD)
set -euo pipefail
source "$(dirname "$0")/hermetic.sh" "$@"
cd "$(dirname "$0")/.."
source scripts/lib.sh

WHICH=${1:-all}
case "$WHICH" in 15|18|all|image|pgxn) ;; *) echo "usage: scripts/package.sh [15|18|all|image|pgxn]" >&2; exit 2 ;; esac
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
OUT=target/packages
mkdir -p "$OUT"
fresh_workdir
trap cleanup_all EXIT

# stage <major> <pg_config> <built tree>: the files of one major in the layout of Debian's
# PostgreSQL packages, under $WORK/root-<major>; prints that directory.
stage() {
    local root="$WORK/root-$1" lib share
    lib="$3$("$2" --pkglibdir)"
    share="$3$("$2" --sharedir)/extension"
    mkdir -p "$root/usr/lib/postgresql/$1/lib" "$root/usr/share/postgresql/$1/extension" \
        "$root/usr/share/doc/postgresql-$1-pg-fencing"
    install -m 0644 "$lib/pg_fencing.so" "$root/usr/lib/postgresql/$1/lib/"
    install -m 0644 "$share"/pg_fencing.control "$share"/pg_fencing--*.sql "$root/usr/share/postgresql/$1/extension/"
    # The license's notice goes with every copy (LICENSE), in Debian's machine-readable format.
    { echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
      echo "Upstream-Name: pg_fencing"
      echo
      echo "Files: *"
      echo "Copyright: 2026, pg_fencing developers"
      echo "License: PostgreSQL"
      sed -e 's/^$/./' -e 's/^/ /' LICENSE; } >"$root/usr/share/doc/postgresql-$1-pg-fencing/copyright"
    chmod 0644 "$root/usr/share/doc/postgresql-$1-pg-fencing/copyright"
    echo "$root"
}

tarball() {  # tarball <major> <root>
    tar -C "$2" --owner=0 --group=0 -czf "$OUT/pg_fencing-$VERSION-pg$1.tar.gz" usr
    echo "  $OUT/pg_fencing-$VERSION-pg$1.tar.gz"
}

if [ "$WHICH" = pgxn ]; then
    # PGXN's release format: a zip of the source with META.json at the top of one directory
    # named <name>-<version>; the build goes through the Makefile (PGXN's client runs make).
    grep -q "\"version\": \"$VERSION\"" META.json || { echo "META.json's version is not $VERSION" >&2; exit 1; }
    git archive --format=zip --prefix="pg_fencing-$VERSION/" -o "$OUT/pg_fencing-$VERSION.zip" HEAD
    echo "  $OUT/pg_fencing-$VERSION.zip (PGXN, from $(git rev-parse --short HEAD))"
    exit 0
fi

if [ "$WHICH" = all ] || [ "$WHICH" = 15 ]; then
    PGC=/usr/lib/postgresql/15/bin/pg_config
    rm -rf target/release/pg_fencing-pg15
    cargo pgrx package --pg-config "$PGC" >"$WORK/package-15.log" 2>&1 || { tail -30 "$WORK/package-15.log"; exit 1; }
    root=$(stage 15 "$PGC" target/release/pg_fencing-pg15)
    tarball 15 "$root"

    PKG=postgresql-15-pg-fencing
    doc="$root/usr/share/doc/$PKG"
    mkdir -p "$doc/docs" "$root/DEBIAN"
    install -m 0644 README.md BENCHMARKS.md "$doc/"
    install -m 0644 CHANGELOG.md "$doc/changelog"
    install -m 0644 docs/*.md "$doc/docs/"
    # As Debian's tools do: the changelog and every document over 4 KiB compressed, the library
    # stripped of its symbol table (dh_strip; the tarballs keep cargo pgrx package's file).
    find "$doc" -type f ! -name copyright \( -name changelog -o -size +4k \) -exec gzip -9n {} +
    strip --strip-unneeded "$root/usr/lib/postgresql/15/lib/pg_fencing.so"
    # The libraries the .so links, as Debian package dependencies (dpkg-shlibdeps reads a
    # debian/control of its own).
    mkdir -p "$WORK/shlibs/debian"
    printf 'Source: pg-fencing\n\nPackage: %s\nArchitecture: amd64\n' "$PKG" >"$WORK/shlibs/debian/control"
    shlibs=$(cd "$WORK/shlibs" && dpkg-shlibdeps -O -e "$root/usr/lib/postgresql/15/lib/pg_fencing.so" 2>/dev/null \
        | sed -n 's/^shlibs:Depends=//p')
    [ -n "$shlibs" ] || { echo "dpkg-shlibdeps found no dependencies of pg_fencing.so" >&2; exit 1; }
    cat >"$root/DEBIAN/control" <<CONTROL
Package: $PKG
Version: $VERSION
Architecture: amd64
Maintainer: pg_fencing developers <maintainers@pg-fencing.invalid>
Depends: postgresql-15, $shlibs
Section: database
Priority: optional
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Description: fencing tokens enforced by PostgreSQL 15: stale lock holders cannot write
 pg_fencing compares the fencing token a session supplies with per-row and per-resource
 high-water marks in the same transaction as the write, and refuses stale writes with
 SQLSTATE FT001. An optional background worker takes etcd locks and watches hand-overs
 (shared_preload_libraries = 'pg_fencing'). CREATE EXTENSION pg_fencing in each database.
CONTROL
    (cd "$root" && find usr -type f -exec md5sum {} + | sort -k2) >"$root/DEBIAN/md5sums"
    dpkg-deb --root-owner-group -Zxz --build "$root" "$OUT/${PKG}_${VERSION}_amd64.deb" >/dev/null
    echo "  $OUT/${PKG}_${VERSION}_amd64.deb"
fi

if [ "$WHICH" != 15 ]; then
    PGC=$PG18_BIN/pg_config
    [ -x "$PGC" ] || { echo "PostgreSQL 18 for building is missing ($PGC): run scripts/setup.sh --test" >&2; exit 1; }
    rm -rf target/pg18/release/pg_fencing-pg18
    CARGO_TARGET_DIR=target/pg18 cargo pgrx package --no-default-features --features pg18 --pg-config "$PGC" \
        >"$WORK/package-18.log" 2>&1 || { tail -30 "$WORK/package-18.log"; exit 1; }
    root=$(stage 18 "$PGC" target/pg18/release/pg_fencing-pg18)
    tarball 18 "$root"
fi

if [ "$WHICH" = image ]; then
    # The layout of CloudNativePG's extension images (docs/operations.md, "CloudNativePG"): the
    # operator mounts the image at /extensions/<name> and adds its share/ to
    # extension_control_path and its lib/ to dynamic_library_path.
    img="$WORK/image-root"
    mkdir -p "$img/lib" "$img/share/extension" "$img/licenses/pg_fencing"
    install -m 0644 "$root/usr/lib/postgresql/18/lib/pg_fencing.so" "$img/lib/"
    install -m 0644 "$root"/usr/share/postgresql/18/extension/* "$img/share/extension/"
    install -m 0644 LICENSE "$img/licenses/pg_fencing/"
    sed -i "s|^module_pathname = '\$libdir/pg_fencing'\$|module_pathname = 'pg_fencing'|" "$img/share/extension/pg_fencing.control"
    grep -qx "module_pathname = 'pg_fencing'" "$img/share/extension/pg_fencing.control" \
        || { echo "package.sh image: the control file's module_pathname was not rewritten" >&2; exit 1; }
    tag="$VERSION-pg18"
    umoci init --layout "$WORK/oci"
    umoci new --image "$WORK/oci:$tag"
    rootless=()
    [ "$(id -u)" -eq 0 ] || rootless=(--rootless)
    umoci unpack "${rootless[@]}" --image "$WORK/oci:$tag" "$WORK/bundle" >/dev/null
    cp -a "$img/." "$WORK/bundle/rootfs/"
    umoci repack --image "$WORK/oci:$tag" "$WORK/bundle"
    umoci config --image "$WORK/oci:$tag" --os linux --architecture amd64 \
        --config.label "org.opencontainers.image.title=pg_fencing" \
        --config.label "org.opencontainers.image.version=$VERSION" \
        --config.label "org.opencontainers.image.licenses=PostgreSQL" \
        --config.label "io.cloudnativepg.image.postgresql.major=18"
    umoci gc --layout "$WORK/oci"
    tar -C "$WORK/oci" --owner=0 --group=0 -cf "$OUT/pg_fencing-$VERSION-pg18.oci.tar" .
    echo "  $OUT/pg_fencing-$VERSION-pg18.oci.tar (OCI layout, tag $tag)"
fi
