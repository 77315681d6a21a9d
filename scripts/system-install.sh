# Sourced by scripts/setup.sh and scripts/test.sh: what they replace in the system PostgreSQL.
# Both put this checkout's pg_fencing into the system PostgreSQL 15 (setup: `cargo pgrx install`;
# the test command: its Debian package, then its release build). A pg_fencing that was there
# before and is not a build of this checkout (the release .deb, another version, a build of
# another checkout) is copied first, outside the checkout (a throwaway clone may be deleted):
# /var/backups/pg_fencing/<time>/ as root, else ~/.cache/pg_fencing/replaced-install/<time>/,
# with a restore.sh that writes each file anew and renames it over the installed one (a server
# that has the library loaded keeps its old copy). The scripts say what they replaced and how to
# put it back (issue 42: they replaced it without a word).

if [ -z "${REPLACED_DIR:-}" ]; then
    if [ "$(id -u)" -eq 0 ]; then
        REPLACED_DIR=/var/backups/pg_fencing
    else
        REPLACED_DIR="$HOME/.cache/pg_fencing/replaced-install"
    fi
fi

# replaced_install_backup PG_CONFIG: copy the installed pg_fencing aside unless it is a build of
# this checkout (byte-equal to one under target/), and say so. Prints nothing if there is none.
replaced_install_backup() {
    local pgc=$1 lib ext so owner version dest f ours=""
    lib=$("$pgc" --pkglibdir)
    ext="$("$pgc" --sharedir)/extension"
    so="$lib/pg_fencing.so"
    [ -f "$so" ] || return 0
    for f in target/debug/libpg_fencing.so target/release/libpg_fencing.so \
             target/release/pg_fencing-pg15/usr/lib/postgresql/15/lib/pg_fencing.so \
             target/debug/pg_fencing-pg15/usr/lib/postgresql/15/lib/pg_fencing.so; do
        [ -f "$f" ] && cmp -s "$f" "$so" && ours=1
    done
    [ -n "$ours" ] && return 0
    dest="$REPLACED_DIR/$(date -u +%Y%m%dT%H%M%SZ)"
    mkdir -p "$dest"
    {
        echo "#!/bin/sh"
        echo "# Puts back the pg_fencing files kept here: each written anew and renamed over."
        echo "set -e"
    } >"$dest/restore.sh"
    for f in "$so" "$ext"/pg_fencing.control "$ext"/pg_fencing--*.sql; do
        [ -f "$f" ] || continue
        cp --parents "$f" "$dest/"
        printf 'cp %q %q && mv -f %q %q\n' "$dest$f" "$(dirname "$f")/.$(basename "$f").restored" \
            "$(dirname "$f")/.$(basename "$f").restored" "$f" >>"$dest/restore.sh"
    done
    echo 'echo "pg_fencing put back; restart the servers that load it"' >>"$dest/restore.sh"
    owner=$(dpkg-query -S "$so" 2>/dev/null | cut -d: -f1 | head -1 || true)
    version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$ext/pg_fencing.control" 2>/dev/null || true)
    echo "$dest${owner:+ $owner}" >"$REPLACED_DIR/LAST"
    replaced_install_say "$dest" "$owner" "${version:-unknown}" "$lib"
}

# replaced_install_say DIR OWNER VERSION LIBDIR: the message (also repeated by the test command
# at its end).
replaced_install_say() {
    printf '\033[1mnote:\033[0m pg_fencing %s installed in %s%s is being replaced by this checkout'"'"'s build.\n' \
        "$3" "$4" "${2:+ (package $2)}"
    printf '      Its files are kept in %s. To put it back:%s sudo sh %s/restore.sh (then restart the servers that load it).\n' \
        "$1" "${2:+ sudo apt-get install --reinstall $2 (from its .deb), or}" "$1"  # not run: text
}
