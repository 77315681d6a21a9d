# Sourced by scripts/setup.sh and scripts/test.sh: what they replace in the system PostgreSQL.
# Both put this checkout's pg_fencing into the system PostgreSQL 15 (setup: `cargo pgrx install`;
# the test command: its Debian package, then its release build). A pg_fencing that was there
# before and is not a build of this checkout (the release .deb, another version, a build of
# another checkout) is copied first into target/replaced-install/<time>/, and the scripts say
# what they replaced and how to put it back (issue 42: they replaced it without a word).

REPLACED_DIR=target/replaced-install

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
    for f in "$so" "$ext"/pg_fencing.control "$ext"/pg_fencing--*.sql; do
        [ -f "$f" ] && cp --parents "$f" "$dest/"
    done
    owner=$(dpkg-query -S "$so" 2>/dev/null | cut -d: -f1 | head -1 || true)
    version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$ext/pg_fencing.control" 2>/dev/null || true)
    echo "$dest${owner:+ $owner}" >"$REPLACED_DIR/LAST"
    replaced_install_say "$dest" "$owner" "${version:-unknown}" "$lib"
}

# replaced_install_say DIR OWNER VERSION LIBDIR: the message (also repeated by the test command
# at its end).
replaced_install_say() {
    local dir=$1
    case "$dir" in /*) ;; *) dir="$(pwd)/$dir" ;; esac
    printf '\033[1mnote:\033[0m pg_fencing %s installed in %s%s is being replaced by this checkout'"'"'s build.\n' \
        "$3" "$4" "${2:+ (package $2)}"
    printf '      Its files are kept in %s. To put it back:%s sudo cp -a %s/. / (then restart the servers that load it).\n' \
        "$dir" "${2:+ sudo apt-get install --reinstall $2 (from its .deb), or}" "$dir"  # not run: text
}
