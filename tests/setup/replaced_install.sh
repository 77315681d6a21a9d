#!/usr/bin/env bash
# What setup replaces in the system PostgreSQL (scripts/system-install.sh), checked against a
# PostgreSQL of its own (a fake pg_config naming a temporary library and extension directory):
#   * a pg_fencing of another origin is copied aside (REPLACED_DIR/<time>/) before it is
#     replaced, the note names its version and how to put it back, LAST names the copy, and the
#     copy's restore.sh puts the files back (each written anew and renamed over);
#   * a build of this checkout (byte-equal to one under target/) is replaced without a copy.
# Usage: tests/setup/replaced_install.sh   (no server, no root; a second or two)
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh

fail=0
ok() { echo "  PASS: $*"; }
bad() { echo "  FAIL: $*" >&2; fail=1; }
fresh_workdir
trap cleanup_all EXIT
REPLACED_DIR="$WORK/replaced"   # not the system's backups
source scripts/system-install.sh
mkdir -p "$WORK/lib" "$WORK/share/extension" "$WORK/bin"
printf '#!/bin/sh\ncase "$1" in --pkglibdir) echo %s/lib;; --sharedir) echo %s/share;; esac\n' "$WORK" "$WORK" >"$WORK/bin/pg_config"
chmod +x "$WORK/bin/pg_config"

echo "-- nothing installed: nothing copied, nothing said"
out=$(replaced_install_backup "$WORK/bin/pg_config")
[ -z "$out" ] && [ ! -e "$REPLACED_DIR" ] && ok "no note, no copy" || bad "got '$out'"

echo "-- a pg_fencing of another origin: copied and named, with the way back"
echo "another build" >"$WORK/lib/pg_fencing.so"
echo "default_version = '0.1.9'" >"$WORK/share/extension/pg_fencing.control"
echo "-- 0.1.9" >"$WORK/share/extension/pg_fencing--0.1.9.sql"
out=$(replaced_install_backup "$WORK/bin/pg_config")
read -r copy _ <"$REPLACED_DIR/LAST" || true
grep -q "pg_fencing 0.1.9 installed in $WORK/lib" <<<"$out" && ok "the note names the version and the directory" || bad "note: $out"
grep -qF "To put it back: sudo sh $copy/restore.sh " <<<"$out" && ok "and how to put it back" || bad "note: $out"
for f in lib/pg_fencing.so share/extension/pg_fencing.control share/extension/pg_fencing--0.1.9.sql; do
    cmp -s "$WORK/$f" "$copy$WORK/$f" && ok "kept: $f" || bad "not kept: $f (in $copy)"
done
echo "this checkout's build" >"$WORK/lib/pg_fencing.so"
ino=$(stat -c %i "$WORK/lib/pg_fencing.so")
sh "$copy/restore.sh" >/dev/null
[ "$(cat "$WORK/lib/pg_fencing.so")" = "another build" ] && ok "restore.sh puts it back" || bad "restore.sh did not"
[ "$(stat -c %i "$WORK/lib/pg_fencing.so")" != "$ino" ] && ok "as a new file renamed over (a loaded library is not overwritten)" \
    || bad "restore.sh overwrote the library in place"

echo "-- a build of this checkout: replaced without a copy"
rm -rf "$REPLACED_DIR"
if [ -f target/debug/libpg_fencing.so ]; then
    cp target/debug/libpg_fencing.so "$WORK/lib/pg_fencing.so"
    out=$(replaced_install_backup "$WORK/bin/pg_config")
    [ -z "$out" ] && [ ! -e "$REPLACED_DIR" ] && ok "no note, no copy" || bad "got '$out'"
else
    echo "  (no target/debug/libpg_fencing.so: scripts/setup.sh builds it)"
fi

[ $fail -eq 0 ] && echo "replaced_install: all checks passed" || { echo "replaced_install: FAILED" >&2; exit 1; }
