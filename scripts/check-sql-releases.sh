#!/usr/bin/env bash
# Released SQL scripts are never edited. A released version's install script
# (sql/pg_fencing--V.sql) and every upgrade script into a released version
# (sql/pg_fencing--A--V.sql) are listed with their SHA-256 in sql/RELEASED.sha256 when the
# version is released; a later change goes into a new upgrade script instead. This check fails when
#   * a listed script is missing or its content changed (sha256sum -c);
#   * with git history at hand, a listed script differs from the content it had in the commit
#     that added it (so editing the script and its checksum together is caught too);
#   * a script in sql/ for a version other than the one in development is not listed;
#   * a released version has no chain of upgrade scripts to the current version;
#   * (with tags in the clone) a released version has no tag vX on a tree of version X;
#   * the version numbers in Cargo.toml and META.json disagree.
# Usage: scripts/check-sql-releases.sh [SOURCE_TREE]   (default: this repository)
set -euo pipefail
source "$(dirname "$0")/hermetic.sh" "$@"
source "$(dirname "$0")/lib.sh"
need_python
cd "${1:-$(dirname "$0")/..}"
ext=pg_fencing
current=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }

(cd sql && sha256sum --quiet -c RELEASED.sha256) || bad "a released script in sql/ was changed or removed (see above)"

listed=$(awk '{print $2}' sql/RELEASED.sha256)
if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && [ "$(git rev-parse --is-shallow-repository 2>/dev/null)" = false ]; then
    for f in $listed; do
        first=$(git log --diff-filter=A --format=%H -- "sql/$f" | tail -1)
        if [ -z "$first" ]; then
            echo "  (sql/$f is not committed yet: only its checksum is checked)"
        elif ! git show "$first:sql/$f" | cmp -s - "sql/$f"; then
            bad "sql/$f differs from the content it was released with in commit ${first:0:12}"
        fi
    done
else
    echo "  (no full git history: only checksums are checked)"
fi

# Versions that are released: those with a listed install or upgrade-target script.
released=$(for f in $listed; do v=${f%.sql}; echo "${v##*--}"; done | sort -u)
for path in sql/$ext--*.sql; do
    f=$(basename "$path")
    v=${f%.sql}; v=${v##*--}
    if [ "$v" != "$current" ] && ! grep -qx "$f" <<<"$listed"; then
        bad "sql/$f is for version $v, which is not the version in development ($current), but is not listed in sql/RELEASED.sha256"
    fi
done
for v in $released; do
    [ "$v" = "$current" ] && continue
    at=$v; hops=0
    while [ "$at" != "$current" ] && [ $hops -lt 100 ]; do
        next=$(ls sql/ | sed -n "s/^$ext--$at--\(.*\)\.sql$/\1/p" | sort -V | tail -1)
        [ -n "$next" ] || break
        at=$next; hops=$((hops + 1))
    done
    [ "$at" = "$current" ] || bad "no chain of upgrade scripts from released version $v to $current (stuck at $at)"
done

# Each released version has its tag, made from a tree of that version (checked when the clone
# has tags; a shallow clone without them is covered by the checksums alone).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && [ -n "$(git tag -l 'v*')" ]; then
    for v in $released; do
        [ "$v" = "$current" ] && continue
        if ! git rev-parse -q --verify "refs/tags/v$v" >/dev/null; then
            bad "released version $v has no tag v$v"
        elif [ "$(git show "v$v:Cargo.toml" | sed -n 's/^version = "\(.*\)"/\1/p' | head -1)" != "$v" ]; then
            bad "tag v$v does not point at a tree of version $v"
        fi
    done
fi

meta=$("$PY" -c 'import json; m=json.load(open("META.json")); print(m["version"], m["provides"]["pg_fencing"]["version"])')
[ "$meta" = "$current $current" ] || bad "META.json versions ($meta) differ from Cargo.toml ($current)"

[ $fail -eq 0 ] && echo "released SQL scripts unchanged; upgrade chain to $current complete; versions agree"
exit $fail
