#!/usr/bin/env bash
# The zombie-client demo, with the real `etcdctl lock` as the lock client.
#
#   holder 1 takes etcd lock "settlement" (token = its ETCD_LOCK_REV) and is frozen (SIGSTOP)
#            before it writes; its lease (TTL $LEASE_TTL s) expires;
#   holder 2 takes the lock (higher ETCD_LOCK_REV) and writes;
#   holder 1 is resumed (SIGCONT) and writes with its old token: a zombie write.
#
# The scenario runs twice on a throwaway PostgreSQL cluster and etcd (127.0.0.1, non-default
# ports): once on a table without protection (the zombie's write lands and corrupts the row) and
# once on a table protected by pg_fencing (the zombie's write is refused with FT001).
#
# Usage: scripts/demo.sh [--no-setup]
#   --no-setup  skip scripts/setup.sh (dependencies and extension already installed)
# Exit status: 0 if the protected run refused the stale write and kept holder 2's row;
#              1 if a stale write was accepted on the protected table;
#              2 if the scenario itself did not happen as described (e.g. tokens not increasing).
set -euo pipefail
# Setup runs with the caller's environment (registry settings); the demo itself is hermetic.
if [ -z "${PGF_HERMETIC:-}" ] && [ "${1:-}" != "--no-setup" ]; then
    "$(dirname "$0")/setup.sh"
    set -- --no-setup
fi
source "$(dirname "$0")/hermetic.sh" "$@"
cd "$(dirname "$0")/.."
ROOT=$(pwd)

source scripts/lib.sh
LEASE_TTL=${LEASE_TTL:-3}
CHILD_PIDS=""
trap 'cleanup_all' EXIT
trap 'echo; echo "interrupted"; exit 130' INT TERM

fresh_workdir
t0=$(date +%s.%N)
say() { printf '  [%6.2fs] %s\n' "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { print a - b }')" "$*"; }

echo "== starting a throwaway PostgreSQL 15 (127.0.0.1:$PGPORT_TEST) and etcd (127.0.0.1:$ETCD_CLIENT_PORT) in $WORK"
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'" pg_start
etcd_start
PSQL=(psql -X -q -v ON_ERROR_STOP=1)
"${PSQL[@]}" -c "CREATE EXTENSION pg_fencing"

# One settlement writer: takes the etcd lock and, inside it, writes the ledger row with its token.
# $1 = holder name, $2 = table, $3 = balance it writes, $4 = wait for this file before writing.
# Writes WORK/<holder>.<table>.token (ETCD_LOCK_REV) and WORK/<holder>.<table>.result.
holder_script() {
    cat <<SH
set -u
echo "\$ETCD_LOCK_REV" > "$WORK/$1.$2.token"
while [ -n "$4" ] && [ ! -e "$4" ]; do sleep 0.05; done
if out=\$(psql -X -q -v ON_ERROR_STOP=1 -v VERBOSITY=verbose 2>&1 <<SQL
BEGIN;
SET LOCAL pg_fencing.token = '\$ETCD_LOCK_REV';
UPDATE $2 SET balance = $3, settled_by = '$1' WHERE account = 'acme';
COMMIT;
SQL
); then
    echo "accepted" > "$WORK/$1.$2.result"
else
    echo "\$out" | grep -m1 'ERROR' > "$WORK/$1.$2.result"
fi
SH
}

run_scenario() {
    local table=$1
    local lock="settlement"
    rm -f "$WORK/go1"
    echo
    echo "== scenario on table '$table': $("${PSQL[@]}" -Atc "SELECT CASE WHEN EXISTS (SELECT 1 FROM fencing_protected_tables WHERE relation = '$table'::regclass AND active) THEN 'protected by pg_fencing (resource mode, resource ''settlement'')' ELSE 'NOT protected' END")"
    say "row before: $("${PSQL[@]}" -Atc "SELECT format('balance=%s settled_by=%s', balance, settled_by) FROM $table")"

    holder_script holder1 "$table" 100 "$WORK/go1" >"$WORK/h1.sh"
    setsid etcdctl lock --ttl="$LEASE_TTL" "$lock" -- bash "$WORK/h1.sh" >"$WORK/h1.$table.out" 2>&1 &
    local h1=$!
    CHILD_PIDS="$CHILD_PIDS $h1"
    for _ in $(seq 1 100); do [ -s "$WORK/holder1.$table.token" ] && break; sleep 0.05; done
    local tok1; tok1=$(cat "$WORK/holder1.$table.token")
    say "holder 1 acquired lock '$lock' with lease TTL ${LEASE_TTL}s: token (ETCD_LOCK_REV) = $tok1"
    kill -STOP -- "-$h1"
    say "holder 1 frozen with SIGSTOP before writing (think: a long GC pause)"
    touch "$WORK/go1"

    local waited=0
    while [ -n "$(etcdctl get --prefix "$lock/" --keys-only)" ]; do
        sleep 0.2; waited=$((waited + 1))
        if [ $waited -gt $((LEASE_TTL * 5 + 50)) ]; then echo "lease of holder 1 never expired" >&2; exit 2; fi
    done
    say "holder 1's lease expired; etcd deleted its lock key"

    holder_script holder2 "$table" 200 "" >"$WORK/h2.sh"
    etcdctl lock --ttl="$LEASE_TTL" "$lock" -- bash "$WORK/h2.sh" >"$WORK/h2.$table.out" 2>&1
    local tok2; tok2=$(cat "$WORK/holder2.$table.token")
    say "holder 2 acquired lock '$lock': token = $tok2; wrote balance=200: $(cat "$WORK/holder2.$table.result")"

    kill -CONT -- "-$h1"
    say "holder 1 resumed with SIGCONT; still believes it holds the lock; writes balance=100 with token $tok1"
    wait "$h1" 2>/dev/null || true
    CHILD_PIDS=""
    say "holder 1's write: $(cat "$WORK/holder1.$table.result")"
    say "row after:  $("${PSQL[@]}" -Atc "SELECT format('balance=%s settled_by=%s fence_token=%s', balance, settled_by, coalesce(fence_token::text, '-')) FROM $table")"

    if [ "$tok1" -ge "$tok2" ]; then
        echo "scenario broken: token of holder 1 ($tok1) is not below holder 2's ($tok2)" >&2
        exit 2
    fi
    if [ "$(cat "$WORK/holder2.$table.result")" != "accepted" ]; then
        echo "scenario broken: holder 2's write was not accepted" >&2
        exit 2
    fi
}

for t in ledger_unprotected ledger_protected; do
    "${PSQL[@]}" -c "CREATE TABLE $t (account text PRIMARY KEY, balance bigint NOT NULL, settled_by text, fence_token bigint)
                     ; INSERT INTO $t VALUES ('acme', 0, 'nobody', NULL)"
done
"${PSQL[@]}" -c "SELECT fencing_protect('ledger_protected', 'settlement')" >/dev/null

run_scenario ledger_unprotected
run_scenario ledger_protected

echo
echo "== verdict"
unprot=$("${PSQL[@]}" -Atc "SELECT settled_by FROM ledger_unprotected")
prot=$("${PSQL[@]}" -Atc "SELECT settled_by FROM ledger_protected")
z_unprot=$(cat "$WORK/holder1.ledger_unprotected.result")
z_prot=$(cat "$WORK/holder1.ledger_protected.result")
echo "  without pg_fencing: zombie write $z_unprot; final row written by $unprot"
echo "  with pg_fencing:    zombie write $z_prot"
echo "                      final row written by $prot"
"${PSQL[@]}" -c "SELECT resource, high_water, accepted, rejected, last_rejected_token, last_rejection_high_water FROM fencing_resources"
if [ "$z_unprot" != "accepted" ] || [ "$unprot" != "holder1" ]; then
    echo "scenario broken: without protection the zombie write should have landed" >&2
    exit 2
fi
if [ "$z_prot" = "accepted" ] || [ "$prot" != "holder2" ]; then
    echo "FAIL: pg_fencing accepted a stale write" >&2
    exit 1
fi
if ! grep -q "FT001" <<<"$z_prot"; then
    echo "FAIL: the zombie write failed, but not with FT001: $z_prot" >&2
    exit 1
fi
echo "OK: the stale write was refused (FT001); holder 2's settlement stands."
