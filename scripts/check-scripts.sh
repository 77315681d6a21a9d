#!/usr/bin/env bash
# Checks the rules of docs/testing.md "The environment" that can be read off the scripts, so that
# a script depending on something setup does not provision fails here, on every machine:
#   1. Python runs only as "$PY" (the project's virtualenv): no script calls python, python3 or
#      /usr/bin/python3 itself, nor stores such a path in a variable. Exceptions are lines marked
#      "# other python: WHY" (making a virtualenv from Debian's interpreter; the bare-PATH check).
#   2. Every shell script under scripts/, tests/ and bench/ (but setup.sh, which needs the
#      caller's registry settings) sources scripts/lib.sh, which makes it hermetic.
#   3. Python files are not entry points: no shebang, no execute bit; their run.sh starts them.
# Usage: scripts/check-scripts.sh [--self-test]   (exit status 1 and one line per finding if a
#        rule is broken; --self-test runs rule 1 on lines it must and must not catch)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

bad=0
finding() { echo "check-scripts: $*" >&2; bad=1; }

mapfile -t shells < <(git ls-files 'scripts/*.sh' 'tests/*.sh' 'bench/*.sh' '.ci/run' | sort)
mapfile -t pys < <(git ls-files 'tests/*.py' 'bench/*.py' 'scripts/*.py' | sort)

# 1. A python command: a word python, python3, python3.11 (with or without a directory) in command
#    position (line start, after ; & | ( ` $( or a keyword, after exec/env and VAR=value
#    prefixes), or a python path assigned to a variable.
assign='[A-Za-z_][A-Za-z0-9_]*=[^[:space:]]*[[:space:]]+'
py_cmd="(^|[;&|(\`]|\\\$\\(|\\b(if|then|else|elif|do|while|until|time|exec|!))[[:space:]]*(env[[:space:]]+(-[^[:space:]]+[[:space:]]+)*)?($assign)*([^[:space:];&|()]*/)?python[0-9.]*([[:space:]]|\$|\))"
py_assign='[A-Za-z_][A-Za-z0-9_]*=["'"'"']?([^[:space:]]*/)?python[0-9.]*(["'"'"'[:space:]]|$)'
other_python() {  # FILE: its lines (NUMBER:TEXT) that run or name a Python other than "$PY"
    grep -nE "$py_cmd|$py_assign" "$1" | grep -vE '^[0-9]+:[[:space:]]*#' \
        | grep -v '# other python: ' | grep -vF '/.venv/bin/python"' || true
}

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
good|"$PY" tests/stress/stress.py run
good|BOUNCER_PORT=$BOUNCER_PORT "$PY" tests/pooler/pooler_test.py
good|echo "the bare python3 first on PATH ($(command -v python3))"
good|PY="$PROJECT_ROOT/.venv/bin/python"
good|# python3 tests/x.py in a comment
good|/usr/bin/python3 -m venv "$VENV"  # other python: the virtualenv's base
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
    case "$f" in scripts/lib.sh | scripts/setup.sh | .ci/run) continue ;; esac
    grep -qE '^[[:space:]]*(source|\.)[[:space:]].*lib\.sh' "$f" \
        || finding "$f: does not source scripts/lib.sh (so it is not hermetic)"
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
