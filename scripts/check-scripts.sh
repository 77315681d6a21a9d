#!/usr/bin/env bash
# Checks the rules of docs/testing.md "The environment" that can be read off the scripts, so that
# a script depending on something setup does not provision fails here, on every machine:
#   1. Python runs only as "$PY" (the project's virtualenv): no script calls python, python3 or
#      /usr/bin/python3 itself, nor stores such a path in a variable. Exceptions are lines marked
#      "# other python: WHY" (making a virtualenv from Debian's interpreter; the bare-PATH check).
#   2. Every shell script under scripts/, tests/ and bench/ (but setup.sh, which needs the
#      caller's registry settings) sources scripts/hermetic.sh "$@" before its first cd (it
#      starts the script again with a clean environment) and then scripts/lib.sh.
#   3. Python files are not entry points: no shebang, no execute bit; their run.sh starts them.
#   4. Package managers (apt-get, apt, dpkg -i/-r, cargo install, cargo pgrx init/install, rustup
#      toolchain/component, pip install/download, npm ci/install) run through apt_run or pkg_run
#      (scripts/pkg-env.sh): a clean environment, whatever the caller exported.
# Usage: scripts/check-scripts.sh [--self-test]   (exit status 1 and one line per finding if a
#        rule is broken; --self-test runs rule 1 on lines it must and must not catch)
set -euo pipefail
source "$(dirname "$0")/hermetic.sh" "$@"
cd "$(dirname "$0")/.."
source scripts/lib.sh

bad=0
finding() { echo "check-scripts: $*" >&2; bad=1; }

mapfile -t shells < <(git ls-files 'scripts/*.sh' 'tests/*.sh' 'bench/*.sh' '.ci/run' | sort)
mapfile -t pys < <(git ls-files 'tests/*.py' 'bench/*.py' 'scripts/*.py' | sort)

# 1. Any mention of a Python interpreter or pip (python, python3, python3.11, pip, pip3, with or
#    without a directory, quoted or not, in any position) outside comments, but the project's
#    own ("$PY", .venv/bin/python, "$VENV/bin/python" in setup.sh) and lines marked
#    "# other python: WHY". Broad on purpose: a mention that is only text gets the mark.
py_word='(^|[^[:alnum:]_.-])(pip[0-9.]*|python[0-9.]*)([^[:alnum:]_-]|$)'
other_python() {  # FILE: its lines (NUMBER:TEXT) that run or name a Python other than "$PY"
    local hit rest
    grep -nE "$py_word" "$1" | grep -vE '^[0-9]+:[[:space:]]*#' | grep -v '# other python: ' \
        | while IFS= read -r hit; do
            # What is left once the project's own interpreter is taken out must name no Python.
            rest=$(printf '%s' "$hit" | sed -E 's#"\$PROJECT_ROOT/\.venv/bin/python"##g;
                s#"\$VENV/bin/python" -I -m pip install##g; s#"\$VENV/bin/python"##g')
            if printf '%s' "$rest" | grep -qE "$py_word"; then printf '%s\n' "$hit"; fi
        done || true
}
# Python files: no interpreter path or name in a string (they run Python as sys.executable).
py_in_py='["'"'"'](/[^"'"'"']*/)?python[0-9.]*["'"'"']|/bin/python'

if [ "${1:-}" = "--self-test" ]; then
    # The rule must catch each "bad" line (the forms that broke fresh machines) and no "good" one.
    t=$(mktemp); trap 'rm -f "$t"' EXIT
    while IFS='|' read -r want line; do
        printf '%s\n' "$line" >"$t"
        got=good; [ -n "$(other_python "$t")" ] && got=bad
        [ "$got" = "$want" ] || finding "self-test: '$line' was taken as $got, should be $want"
    done <<'CASES'
bad|    python3 - "$1" "$2" "$PGPORT_TEST" <<'PY'
bad|/usr/bin/python3 tests/worker/worker_test.py
bad|BOUNCER_PORT=$BOUNCER_PORT /usr/bin/python3 tests/pooler/pooler_test.py
bad|PY=/usr/bin/python3
bad|meta=$(python3 -c 'import json')
bad|        /usr/bin/python3 bench/bench.py
bad|x=1; python t.py
bad|if python -c 'import psycopg2'; then
bad|exec env -i PATH=/bin python3.11 t.py
bad|out=`python3 t.py`
bad|sudo true && python3 t.py
bad|"python3" t.py
bad|"/usr/bin/python3" t.py
bad|/usr/bin/env python3 t.py
bad|timeout 60 /usr/bin/python3 tests/worker/worker_test.py
bad|sudo -u postgres python3 t.py
bad|as_pg python3 t.py
bad|python3<<'PY'
bad|{ python3 t.py; }
bad|a) python3 t.py ;;
bad|bash -c 'python3 t.py'
bad|xargs python3
bad|PY=/usr/bin/python3; "$PY" t.py
bad|PYTHON=$(command -v python3)
bad|pip3 install psycopg2
bad|"$PY" -m pip install x
bad|PY="$PROJECT_ROOT/.venv/bin/python"; python3 t.py
good|"$PY" tests/stress/stress.py run
good|BOUNCER_PORT=$BOUNCER_PORT "$PY" tests/pooler/pooler_test.py
good|PY="$PROJECT_ROOT/.venv/bin/python"
good|        "$VENV/bin/python" -I -m pip install --quiet --no-input --require-virtualenv -r "$REQUIREMENTS"
good|# python3 tests/x.py in a comment
good|/usr/bin/python3 -m venv "$VENV"  # other python: the virtualenv's base
good|echo "Python modules: $m"
CASES
    [ "$bad" -eq 0 ] && echo "check-scripts: self-test ok"
    exit "$bad"
fi

for f in "${shells[@]}"; do
    [ "$f" = scripts/check-scripts.sh ] && continue  # its self-test cases are data; it runs no Python
    while IFS= read -r hit; do
        finding "$f:${hit%%:*}: runs a Python other than \"\$PY\": ${hit#*:}"
    done < <(other_python "$f")
done

# 2. Hermetic entry points.
for f in "${shells[@]}"; do
    # Not entry points: what entry scripts source (lib.sh, hermetic.sh, pg18.sh), setup (it runs
    # with the caller's environment on purpose) and CI's wrapper.
    case "$f" in scripts/lib.sh | scripts/hermetic.sh | scripts/pg18.sh | scripts/pkg-env.sh | scripts/system-install.sh | scripts/setup.sh | .ci/run | tests/citus/cluster.sh) continue ;; esac  # (libraries the entry scripts source)
    herm=$(grep -nE '^[[:space:]]*(source|\.)[[:space:]].*hermetic\.sh" "\$@"' "$f" | head -1 | cut -d: -f1 || true)
    firstcd=$(grep -nE '^[[:space:]]*cd[[:space:]]' "$f" | head -1 | cut -d: -f1 || true)
    if [ -z "$herm" ]; then
        finding "$f: does not source scripts/hermetic.sh \"\$@\" (so it is not hermetic)"
    elif [ -n "$firstcd" ] && [ "$firstcd" -lt "$herm" ]; then
        finding "$f: changes directory (line $firstcd) before it sources scripts/hermetic.sh (line $herm)"
    fi
    grep -qE '^[[:space:]]*(source|\.)[[:space:]].*lib\.sh' "$f" \
        || finding "$f: does not source scripts/lib.sh"
done

for f in "${pys[@]}"; do
    while IFS= read -r hit; do
        finding "$f:${hit%%:*}: names a Python interpreter (use sys.executable): ${hit#*:}"
    done < <(grep -nE "$py_in_py" "$f" | grep -vE '^[0-9]+:[[:space:]]*#' || true)
done

# 4. Package managers in a clean environment (scripts/pkg-env.sh).
pkg_word='(^|[^[:alnum:]_./-])(apt-get|apt|dpkg[[:space:]]+-(i|r|P|-install|-remove|-purge)|cargo[[:space:]]+install|cargo[[:space:]]+pgrx[[:space:]]+(init|install)|rustup[[:space:]]+(toolchain|component)|pip[[:space:]]+(install|download)|npm[[:space:]]+(ci|install|i))([^[:alnum:]_-]|$)'
unclean_pkg() {  # FILE: its lines (NUMBER:TEXT) that run a package manager without apt_run/pkg_run
    grep -nE "$pkg_word" "$1" | grep -vE '^[0-9]+:[[:space:]]*#' \
        | grep -vE '(apt_run|pkg_run)[[:space:]]' | grep -vE '^[0-9]+:[[:space:]]*(log|echo|step|printf)[[:space:]]' \
        | grep -vE '# not run: ' || true
}
for f in "${shells[@]}"; do
    case "$f" in scripts/check-scripts.sh | scripts/pkg-env.sh) continue ;; esac
    while IFS= read -r hit; do
        [ -n "$hit" ] && finding "$f:${hit%%:*}: runs a package manager outside apt_run/pkg_run (scripts/pkg-env.sh): ${hit#*:}"
    done < <(unclean_pkg "$f")
done

# 3. Python files are started by their run.sh.
for f in "${pys[@]}"; do
    head -1 "$f" | grep -q '^#!' && finding "$f: has a shebang; start it with \"\$PY\" from its run.sh"
    [ -x "$f" ] && finding "$f: is executable; start it with \"\$PY\" from its run.sh"
done

if [ "$bad" -ne 0 ]; then
    echo "check-scripts: FAILED (rules: docs/testing.md, \"The environment\")" >&2
    exit 1
fi
echo "check-scripts: ok (${#shells[@]} shell scripts, ${#pys[@]} Python files)"
