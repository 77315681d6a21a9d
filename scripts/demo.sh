#!/usr/bin/env bash
# The zombie-client demo, with a real lock service and its standard lock client.
#
#   holder 1 takes lock "settlement" and is frozen (SIGSTOP) before it writes; its lease (TTL
#            $LEASE_TTL s) expires;
#   holder 2 takes the lock and writes;
#   holder 1 is resumed (SIGCONT) and writes with its old token: a zombie write.
#
# The lock service (--lock-service):
#   etcd       (the default) `etcdctl lock --ttl`: the token is ETCD_LOCK_REV, the lock key's
#              revision;
#   zookeeper  ZooKeeper's lock recipe (kazoo, examples/zookeeper/holder.py) with a session
#              timeout of $LEASE_TTL s: the token is the czxid of the holder's lock znode;
#   redis      `SET lock NX PX`: Redis hands out no token at all;
#   postgres   PostgreSQL leases (fencing_lease_acquire, lease $LEASE_TTL s): no lock service at
#              all, the token comes from the same database (docs/leases.md).
# The scenario runs twice on a throwaway PostgreSQL cluster and lock service (127.0.0.1,
# non-default ports): once on a table without protection (the zombie's write lands and corrupts
# the row) and once on a table protected by pg_fencing: with etcd and ZooKeeper the zombie's
# write is refused with FT001 (with PostgreSQL leases FT003: its lease ended, the time fence);
# with Redis every write is refused, holder 2's too, with FT002
# (no token): pg_fencing cannot tell a Redis lock's holders apart (README, "Lock services").
#
# Usage: scripts/demo.sh [--no-setup] [--lock-service etcd|zookeeper|redis|postgres]
#   --no-setup  skip scripts/setup.sh (dependencies and extension already installed)
# Exit status: 0 if the protected run behaved as described above (the stale write refused and
#                holder 2's row kept; with Redis, both writes refused with FT002);
#              1 if a stale write was accepted on the protected table;
#              2 if the scenario itself did not happen as described (e.g. tokens not increasing).
set -euo pipefail
LOCK_SERVICE=etcd
NO_SETUP=""
args=("$@")
while [ $# -gt 0 ]; do
    case "$1" in
        --no-setup) NO_SETUP=1 ;;
        --lock-service) LOCK_SERVICE=${2:-}; shift ;;
        --lock-service=*) LOCK_SERVICE=${1#*=} ;;
        *) echo "usage: scripts/demo.sh [--no-setup] [--lock-service etcd|zookeeper|redis|postgres]" >&2; exit 2 ;;
    esac
    shift
done
case "$LOCK_SERVICE" in
    etcd|zookeeper|redis|postgres) ;;
    *) echo "demo: --lock-service is etcd, zookeeper, redis or postgres, not '$LOCK_SERVICE'" >&2; exit 2 ;;
esac
# Setup runs with the caller's environment (registry settings); the demo itself is hermetic.
if [ -z "${PGF_HERMETIC:-}" ] && [ -z "$NO_SETUP" ]; then
    "$(dirname "$0")/setup.sh" --lock-service "$LOCK_SERVICE"
    args=(--no-setup --lock-service "$LOCK_SERVICE")
fi
set -- "${args[@]}"
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

case "$LOCK_SERVICE" in
    etcd) SERVICE_AT="etcd (127.0.0.1:$ETCD_CLIENT_PORT)" ;;
    postgres) SERVICE_AT="PostgreSQL leases (no lock service)" ;;
    zookeeper)
        SERVICE_AT="ZooKeeper (127.0.0.1:$ZK_PORT)"
        if ! [ -x "$PY" ] || ! command -v java >/dev/null; then
            echo "demo: ZooKeeper's holder needs Java, ZooKeeper and the project's Python with kazoo:" >&2
            echo "  run scripts/setup.sh --lock-service zookeeper (or the demo without --no-setup)" >&2
            exit 2
        fi ;;
    redis)
        SERVICE_AT="Redis (127.0.0.1:$REDIS_PORT)"
        command -v redis-server >/dev/null || { echo "demo: run scripts/setup.sh --lock-service redis (or the demo without --no-setup)" >&2; exit 2; } ;;
esac
echo "== starting a throwaway PostgreSQL 15 (127.0.0.1:$PGPORT_TEST) and $SERVICE_AT in $WORK"
PG_EXTRA_CONF="shared_preload_libraries = 'pg_fencing'" pg_start
case "$LOCK_SERVICE" in
    etcd) etcd_start ;;
    zookeeper) zk_start ;;
    redis) redis_start ;;
    postgres) ;;
esac
PSQL=(psql -X -q -v ON_ERROR_STOP=1)
"${PSQL[@]}" -c "CREATE EXTENSION pg_fencing"

# One settlement writer: takes the etcd lock and, inside it, writes the ledger row with its token.
# $1 = holder name, $2 = table, $3 = balance it writes, $4 = wait for this file before writing;
# $5 = how the script gets its token (default: ETCD_LOCK_REV, which etcdctl lock sets), $6 = what
# it runs after the write. Writes WORK/<holder>.<table>.token and WORK/<holder>.<table>.result.
holder_script() {
    cat <<SH
set -u
tok=${5:-\$ETCD_LOCK_REV}
echo "\$tok" > "$WORK/$1.$2.token"
while [ -n "$4" ] && [ ! -e "$4" ]; do sleep 0.05; done
if out=\$(psql -X -q -v ON_ERROR_STOP=1 -v VERBOSITY=verbose 2>&1 <<SQL
BEGIN;
SET LOCAL pg_fencing.token = '\$tok';
UPDATE $2 SET balance = $3, settled_by = '$1' WHERE account = 'acme';
COMMIT;
SQL
); then
    echo "accepted" > "$WORK/$1.$2.result"
else
    echo "\$out" | grep -m1 'ERROR' > "$WORK/$1.$2.result"
fi
${6:-}
SH
}

# The same writer with a PostgreSQL lease: takes lease "settlement" (waiting while another holds
# it), writes with the lease's token and releases the lease.
lease_holder_script() {
    holder_script "$1" "$2" "$3" "$4" \
        "\$(psql -X -q -At -v ON_ERROR_STOP=1 -c \"SELECT fencing_lease_acquire('settlement', '${LEASE_TTL}s', '60s')\")" \
        "psql -X -q -At -c \"SELECT fencing_lease_release(\$tok)\" >/dev/null 2>&1 || true"
}

# The same writer for Redis: takes the lock with SET NX PX (retrying until it is free) and writes
# without a token, since Redis gives none. WORK/<holder>.<table>.token says "none".
redis_holder_script() {
    cat <<SH
set -u
until [ "\$(redis-cli -p $REDIS_PORT SET lock:settlement $1 NX PX $((LEASE_TTL * 1000)))" = OK ]; do sleep 0.05; done
echo none > "$WORK/$1.$2.token"
while [ -n "$4" ] && [ ! -e "$4" ]; do sleep 0.05; done
if out=\$(psql -X -q -v ON_ERROR_STOP=1 -v VERBOSITY=verbose 2>&1 <<SQL
UPDATE $2 SET balance = $3, settled_by = '$1' WHERE account = 'acme';
SQL
); then
    echo "accepted" > "$WORK/$1.$2.result"
else
    echo "\$out" | grep -m1 'ERROR' > "$WORK/$1.$2.result"
fi
# Release the lock if it is still ours (a zombie's has expired, maybe re-taken by another).
redis-cli -p $REDIS_PORT EVAL "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end" 1 lock:settlement $1 >/dev/null
SH
}

# The same writer for ZooKeeper: examples/zookeeper/holder.py (kazoo's lock recipe, token = czxid
# of its lock node), run as zk_holder <holder> <table> <balance> [--wait-for-go] (its output in
# WORK/<holder>.<table>.out); zk_outcome <holder> <table> then writes the .token and .result files.
zk_holder() {
    "$PY" examples/zookeeper/holder.py --zk "127.0.0.1:$ZK_PORT" \
        --dsn "host=127.0.0.1 port=$PGPORT_TEST user=postgres dbname=postgres" --name "$1" \
        --lock /locks/settlement --session-timeout "$LEASE_TTL" \
        --sql "UPDATE $2 SET balance = $3, settled_by = %(name)s WHERE account = 'acme'" ${4:-} \
        >"$WORK/$1.$2.out" 2>&1
}
zk_outcome() {
    local out="$WORK/$1.$2.out" w
    sed -n 's/.*czxid=\([0-9]*\).*/\1/p' "$out" | head -1 >"$WORK/$1.$2.token"
    w=$(grep -m1 '^write' "$out" || true)
    case "$w" in
        "write ok") echo accepted ;;
        "") echo "no write: $(tail -1 "$out")" ;;
        *) w=${w#write }; echo "ERROR:  ${w%% *}: ${w#* }" ;;
    esac >"$WORK/$1.$2.result"
}

wait_for_file() {  # wait_for_file <file>: up to 30 s for it to be non-empty
    for _ in $(seq 1 600); do [ -s "$1" ] && return 0; sleep 0.05; done
    echo "scenario broken: $1 never appeared" >&2
    exit 2
}

run_scenario() {
    case "$LOCK_SERVICE" in
        etcd) run_scenario_etcd "$@" ;;
        zookeeper) run_scenario_zookeeper "$@" ;;
        redis) run_scenario_redis "$@" ;;
        postgres) run_scenario_postgres "$@" ;;
    esac
    say "row after:  $("${PSQL[@]}" -Atc "SELECT format('balance=%s settled_by=%s fence_token=%s', balance, settled_by, coalesce(fence_token::text, '-')) FROM $1")"
}

scenario_header() {
    echo
    echo "== scenario on table '$1' with $SERVICE_AT: $("${PSQL[@]}" -Atc "SELECT CASE WHEN EXISTS (SELECT 1 FROM fencing_protected_tables WHERE relation = '$1'::regclass AND active) THEN 'protected by pg_fencing (resource mode, resource ''settlement'')' ELSE 'NOT protected' END")"
    say "row before: $("${PSQL[@]}" -Atc "SELECT format('balance=%s settled_by=%s', balance, settled_by) FROM $1")"
}

run_scenario_zookeeper() {
    local table=$1
    scenario_header "$table"
    rm -f "$WORK/go1"
    mkfifo "$WORK/go1"
    zk_holder holder1 "$table" 100 --wait-for-go <"$WORK/go1" &
    local h1=$!
    CHILD_PIDS="$CHILD_PIDS $h1"
    exec 5>"$WORK/go1"
    for _ in $(seq 1 600); do grep -q acquired "$WORK/holder1.$table.out" 2>/dev/null && break; sleep 0.05; done
    zk_outcome holder1 "$table"
    local tok1; tok1=$(cat "$WORK/holder1.$table.token")
    [ -n "$tok1" ] || { echo "scenario broken: holder 1 got no lock: $(cat "$WORK/holder1.$table.out")" >&2; exit 2; }
    say "holder 1 acquired lock /locks/settlement (ZooKeeper session timeout ${LEASE_TTL}s): token (czxid of its lock node) = $tok1"
    # $h1 is the subshell running zk_holder; the holder is its child.
    pkill -STOP -P "$h1"
    say "holder 1 frozen with SIGSTOP before writing (think: a long GC pause)"
    # holder 2 waits in the lock recipe until ZooKeeper expires holder 1's session and deletes
    # its ephemeral node.
    zk_holder holder2 "$table" 200 || true
    zk_outcome holder2 "$table"
    local tok2; tok2=$(cat "$WORK/holder2.$table.token")
    say "holder 1's session expired; ZooKeeper deleted its lock node"
    say "holder 2 acquired the lock: token = $tok2; wrote balance=200: $(cat "$WORK/holder2.$table.result")"
    pkill -CONT -P "$h1"
    echo go >&5
    exec 5>&-
    say "holder 1 resumed with SIGCONT; still believes it holds the lock; writes balance=100 with token $tok1"
    wait "$h1" 2>/dev/null || true
    CHILD_PIDS=""
    zk_outcome holder1 "$table"
    say "holder 1's write: $(cat "$WORK/holder1.$table.result")"
    check_tokens "$tok1" "$tok2" "$table"
}

run_scenario_redis() {
    local table=$1
    scenario_header "$table"
    rm -f "$WORK/go1"
    redis_holder_script holder1 "$table" 100 "$WORK/go1" >"$WORK/h1.sh"
    setsid bash "$WORK/h1.sh" >"$WORK/h1.$table.out" 2>&1 &
    local h1=$!
    CHILD_PIDS="$CHILD_PIDS $h1"
    wait_for_file "$WORK/holder1.$table.token"
    say "holder 1 acquired the Redis lock (SET lock:settlement holder1 NX PX $((LEASE_TTL * 1000))): no token"
    kill -STOP -- "-$h1"
    say "holder 1 frozen with SIGSTOP before writing (think: a long GC pause)"
    touch "$WORK/go1"
    local waited=0
    while [ "$(redis-cli -p "$REDIS_PORT" EXISTS lock:settlement)" != 0 ]; do
        sleep 0.2; waited=$((waited + 1))
        if [ $waited -gt $((LEASE_TTL * 5 + 50)) ]; then echo "holder 1's Redis lock never expired" >&2; exit 2; fi
    done
    say "holder 1's lock expired (PX); Redis deleted the key"
    redis_holder_script holder2 "$table" 200 "" >"$WORK/h2.sh"
    bash "$WORK/h2.sh" >"$WORK/h2.$table.out" 2>&1
    say "holder 2 acquired the Redis lock: no token either; wrote balance=200: $(cat "$WORK/holder2.$table.result")"
    kill -CONT -- "-$h1"
    say "holder 1 resumed with SIGCONT; still believes it holds the lock; writes balance=100"
    wait "$h1" 2>/dev/null || true
    CHILD_PIDS=""
    say "holder 1's write: $(cat "$WORK/holder1.$table.result")"
}

check_tokens() {  # check_tokens <holder 1's> <holder 2's> <table>
    if [ -z "$1" ] || [ -z "$2" ] || [ "$1" -ge "$2" ]; then
        echo "scenario broken: token of holder 1 (${1:-none}) is not below holder 2's (${2:-none})" >&2
        exit 2
    fi
    if [ "$(cat "$WORK/holder2.$3.result")" != "accepted" ]; then
        echo "scenario broken: holder 2's write was not accepted" >&2
        exit 2
    fi
}

run_scenario_postgres() {
    local table=$1
    rm -f "$WORK/go1"
    scenario_header "$table"
    lease_holder_script holder1 "$table" 100 "$WORK/go1" >"$WORK/h1.sh"
    setsid bash "$WORK/h1.sh" >"$WORK/h1.$table.out" 2>&1 &
    local h1=$!
    CHILD_PIDS="$CHILD_PIDS $h1"
    for _ in $(seq 1 100); do [ -s "$WORK/holder1.$table.token" ] && break; sleep 0.05; done
    local tok1; tok1=$(cat "$WORK/holder1.$table.token")
    say "holder 1 acquired lease 'settlement' for ${LEASE_TTL}s from PostgreSQL itself: token = $tok1"
    kill -STOP -- "-$h1"
    say "holder 1 frozen with SIGSTOP before writing (think: a long GC pause)"
    touch "$WORK/go1"
    local waited=0
    while [ "$("${PSQL[@]}" -Atc "SELECT live FROM fencing_leases WHERE token = $tok1")" = t ]; do
        sleep 0.2; waited=$((waited + 1))
        if [ $waited -gt $((LEASE_TTL * 5 + 50)) ]; then echo "lease of holder 1 never expired" >&2; exit 2; fi
    done
    say "holder 1's lease expired (database clock); nobody holds 'settlement' now"
    lease_holder_script holder2 "$table" 200 "" >"$WORK/h2.sh"
    bash "$WORK/h2.sh" >"$WORK/h2.$table.out" 2>&1
    local tok2; tok2=$(cat "$WORK/holder2.$table.token")
    say "holder 2 acquired lease 'settlement': token = $tok2; wrote balance=200: $(cat "$WORK/holder2.$table.result")"
    kill -CONT -- "-$h1"
    say "holder 1 resumed with SIGCONT; still believes it holds the lease; writes balance=100 with token $tok1"
    wait "$h1" 2>/dev/null || true
    CHILD_PIDS=""
    say "holder 1's write: $(cat "$WORK/holder1.$table.result")"
    check_tokens "$tok1" "$tok2" "$table"
}

run_scenario_etcd() {
    local table=$1
    local lock="settlement"
    rm -f "$WORK/go1"
    scenario_header "$table"

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
    check_tokens "$tok1" "$tok2" "$table"
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
if [ "$LOCK_SERVICE" = redis ]; then
    h2_prot=$(cat "$WORK/holder2.ledger_protected.result")
    echo "  with pg_fencing:    holder 2's write $h2_prot"
    if [ "$z_prot" = "accepted" ] || [ "$h2_prot" = "accepted" ]; then
        echo "FAIL: pg_fencing accepted a write without a token" >&2
        exit 1
    fi
    if ! grep -q "FT002" <<<"$z_prot" || ! grep -q "FT002" <<<"$h2_prot"; then
        echo "FAIL: the writes without a token failed, but not with FT002: $z_prot / $h2_prot" >&2
        exit 1
    fi
    echo "OK, and not enough: Redis's SET NX PX lock hands out no token, so the zombie corrupted the"
    echo "unprotected table, and the protected table refuses every write without a token (FT002),"
    echo "holder 2's as well: pg_fencing cannot tell a Redis lock's holders apart. With Redis, take the"
    echo "token from a consensus service (etcd, ZooKeeper), or let pg_fencing's worker take the lock in"
    echo "etcd: fencing_acquire (README, \"Lock services\")."
    exit 0
fi
if [ "$z_prot" = "accepted" ] || [ "$prot" != "holder2" ]; then
    echo "FAIL: pg_fencing accepted a stale write" >&2
    exit 1
fi
expected=FT001
[ "$LOCK_SERVICE" = postgres ] && expected=FT003
if ! grep -q "$expected" <<<"$z_prot"; then
    echo "FAIL: the zombie write failed, but not with $expected: $z_prot" >&2
    exit 1
fi
if [ "$LOCK_SERVICE" = postgres ]; then
    echo "OK: the stale write was refused (FT003: its lease had ended, by the database clock); holder 2's"
    echo "settlement stands. No lock service was needed: the lease and the fence are the same database."
    echo "(The rejected column above counts stale tokens, FT001; an FT003 refusal is in the server log.)"
else
    echo "OK: the stale write was refused (FT001); holder 2's settlement stands."
fi
