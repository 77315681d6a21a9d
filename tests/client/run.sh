#!/usr/bin/env bash
# The client examples (examples/rust-client, and with --client go examples/go-client, the same
# program flag for flag) against a real etcd and PostgreSQL 15.
#
# Builds the example and runs its unit tests, then starts a throwaway cluster on
# 127.0.0.1:${PGPORT_CLIENT:-54319} (no preloading) and a throwaway etcd on
# 127.0.0.1:${ETCD_CLIENT_TEST_PORT:-24101} (peer port +1), and checks:
#   1. the zombie: client A (lease TTL 2s, style sql) takes etcd lock "settlement", writes once and
#      is frozen with SIGSTOP (a GC pause); its lease expires; client B (style function) gets the
#      lock with a higher token, writes and exits 0; A is resumed with SIGCONT, its next write is
#      refused with FT001 and it exits 3. The row and an audit table (filled by a trigger, in
#      commit order) must show B's writes and no write of A's after B's first.
#   2. two clients alone (one per style, each inserting a new row first), each exiting 0, after
#      which no lock key and no lease is left in etcd.
# Prints PASS/FAIL per check; exits 1 if any check failed.
#
#   tests/client/run.sh              # the test (the Rust client; --client go for the Go one)
#   tests/client/run.sh --unfenced   # negative control: the same without fencing_protect (and B
#                                    # in style sql); the zombie write lands and the run must FAIL
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."

UNFENCED=""
CLIENT=rust
while [ $# -gt 0 ]; do
    case "$1" in
        --unfenced) UNFENCED=1 ;;
        --client) CLIENT=${2:-}; shift ;;
        *) echo "usage: $0 [--client rust|go] [--unfenced]" >&2; exit 2 ;;
    esac
    shift
done
case "$CLIENT" in rust|go) ;; *) echo "usage: $0 [--client rust|go] [--unfenced]" >&2; exit 2 ;; esac

PGPORT_TEST=${PGPORT_CLIENT:-54319}
ETCD_CLIENT_PORT=${ETCD_CLIENT_TEST_PORT:-24101}
ETCD_PEER_PORT=$((ETCD_CLIENT_PORT + 1))
source scripts/lib.sh

T0=$(date +%s%3N)
if [ "$CLIENT" = rust ]; then
    MANIFEST=examples/rust-client/Cargo.toml
    # The target directory of clients/rust: the crate's tests (tests/rustclient) reuse this build's
    # dependencies (same versions, same profile). The dev profile: what is tested here is what the
    # client sends and when, not its speed, and it builds in about half the time of release.
    export CARGO_TARGET_DIR="$PWD/clients/rust/target"
    BIN=$CARGO_TARGET_DIR/debug/pg-fencing-client
    echo "== building examples/rust-client (dev profile) and running its unit tests"
    cargo build --locked --manifest-path "$MANIFEST" -q
    if ! UNIT=$(cargo test --locked --manifest-path "$MANIFEST" -q 2>&1); then
        echo "$UNIT"
        echo "FAIL: cargo test of examples/rust-client"
        exit 1
    fi
    echo "   unit tests: $(echo "$UNIT" | grep -m1 '^test result')"
else
    # Debian 12's Go and its packaged etcd 3.4 client and pgx v4, in GOPATH mode: nothing is
    # downloaded. The build cache goes under target/ (the hermetic environment has no GOCACHE).
    BIN=examples/go-client/target/pg-fencing-client-go
    export GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$PWD/examples/go-client/target/go-build" GOFLAGS=
    mkdir -p examples/go-client/target
    echo "== building examples/go-client ($(go version | awk '{print $3}'), GOPATH mode) and running its unit tests"
    go build -o "$BIN" ./examples/go-client
    if ! UNIT=$(go test ./examples/go-client 2>&1); then
        echo "$UNIT"
        echo "FAIL: go test of examples/go-client"
        exit 1
    fi
    echo "   unit tests: $UNIT"
fi
echo "   built and unit-tested in $(( ($(date +%s%3N) - T0) / 1000 ))s"

CHILD_PIDS=""
fresh_workdir
trap 'cleanup_all' EXIT
trap 'exit 130' INT TERM

pg_start
etcd_start
ETCD="127.0.0.1:$ETCD_CLIENT_PORT"
CONN="host=127.0.0.1 port=$PGPORT_TEST user=postgres dbname=postgres"
q() { psql -X -qAt -v ON_ERROR_STOP=1 -c "$1"; }

psql -X -q -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
CREATE EXTENSION pg_fencing;
CREATE TABLE ledger (account int PRIMARY KEY, balance bigint NOT NULL);
-- Every committed write of ledger, in order, with the writer (its application_name).
CREATE TABLE ledger_audit (seq bigserial PRIMARY KEY, account int, balance bigint, token bigint,
                           writer text, at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION ledger_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger_audit (account, balance, token, writer)
    VALUES (NEW.account, NEW.balance, NEW.fence_token, current_setting('application_name'));
    RETURN NULL;
END $$;
SQL
if [ -n "$UNFENCED" ]; then
    echo "== NEGATIVE CONTROL: ledger is NOT protected; this run is expected to FAIL"
    q "ALTER TABLE ledger ADD COLUMN fence_token bigint" >/dev/null
else
    q "SELECT fencing_protect('ledger', 'settlement')" >/dev/null
fi
psql -X -q -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
CREATE TRIGGER ledger_audit AFTER INSERT OR UPDATE ON ledger
    FOR EACH ROW EXECUTE FUNCTION ledger_audit();
BEGIN;
SET LOCAL application_name = 'setup';
SET LOCAL pg_fencing.token = '1';
INSERT INTO ledger (account, balance) VALUES (1, 0);
COMMIT;
SQL

PASSED=0
FAILED=0
check() { # check DESCRIPTION COMMAND...: PASS if the command succeeds
    local what=$1
    shift
    if "$@"; then
        echo "PASS: $what"
        PASSED=$((PASSED + 1))
    else
        echo "FAIL: $what"
        FAILED=$((FAILED + 1))
    fi
}
eq() { [ "$1" = "$2" ] || { echo "      got '$1', expected '$2'"; return 1; }; }
gt() { [ "$1" -gt "$2" ] 2>/dev/null || { echo "      got '$1', expected > '$2'"; return 1; }; }
ge() { [ "$1" -ge "$2" ] 2>/dev/null || { echo "      got '$1', expected >= '$2'"; return 1; }; }
has() { grep -qE -- "$2" "$1" || { echo "      $1 has no line matching '$2':"; sed 's/^/        /' "$1"; return 1; }; }
now_ms() { date +%s%3N; }
elapsed() { awk -v ms=$(($(now_ms) - T_START)) 'BEGIN { printf "%6.2fs", ms / 1000 }'; }
say() { echo "  [$(elapsed)] $*"; }

# client NAME ARGS...: start the client in the background; stdout/stderr in $WORK/NAME.{out,err}.
client() {
    local name=$1
    shift
    "$BIN" --etcd "$ETCD" --pg "$CONN application_name=$name" --lock settlement "$@" \
        >"$WORK/$name.out" 2>"$WORK/$name.err" &
    CLIENT_PID=$!
    CHILD_PIDS="$CHILD_PIDS $CLIENT_PID"
}
# wait_line FILE REGEX SECONDS PID: until FILE has a matching line; fails on timeout or if PID died.
wait_line() {
    local deadline=$(($(now_ms) + $3 * 1000))
    until grep -qE -- "$2" "$1"; do
        if ! kill -0 "$4" 2>/dev/null || [ "$(now_ms)" -gt "$deadline" ]; then
            grep -qE -- "$2" "$1" && return 0
            echo "      no line matching '$2' in $1 (process $4 exited or timed out)"
            return 1
        fi
        sleep 0.05
    done
}
# wait_exit PID SECONDS: sets RC to the exit status, or to "timeout" (and kills the process).
# Not in $(...): only this shell can wait for its children.
wait_exit() {
    local deadline=$(($(now_ms) + $2 * 1000))
    RC=0
    while kill -0 "$1" 2>/dev/null; do
        if [ "$(now_ms)" -gt "$deadline" ]; then
            kill -CONT "$1" 2>/dev/null || true
            kill "$1" 2>/dev/null || true
            wait "$1" 2>/dev/null || true
            RC=timeout
            return
        fi
        sleep 0.05
    done
    wait "$1" || RC=$?
}
token_of() { sed -n 's/^token=\([0-9]*\)$/\1/p' "$WORK/$1.out" | head -n 1; }
writes_of() { grep -c '^wrote ' "$WORK/$1.out" || true; }
lock_keys() { etcdctl get --prefix settlement --keys-only; }
no_lock_keys() { local k; k=$(lock_keys); [ -z "$k" ] || { echo "      lock keys left: $k"; return 1; }; }
no_leases() {
    local l
    l=$(etcdctl lease list)
    echo "$l" | grep -q '^found 0 leases' || { echo "      $l"; return 1; }
}
# A client revokes its lease when it ends, with a 2 s limit; past that the lease (and the lock
# key under it) goes at its TTL (10 s at most here). So what must be gone is waited for, up to
# 30 s (a loaded machine).
eventually() {
    local _
    for _ in $(seq 1 300); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
    "$@"
}
a_key_gone_at() {  # a_key_gone_at REVISION: A's key did not exist at that revision
    [ -n "$A_KEY" ] || { echo "      A's lock key was not found"; return 1; }
    local k
    k=$(etcdctl get --rev="$1" --keys-only "$A_KEY")
    [ -z "$k" ] || { echo "      $A_KEY still existed at revision $1"; return 1; }
    # And A's lease is gone (expired: A was frozen, it could not revoke it).
    etcdctl lease timetolive "${A_KEY##*/}" | grep -q 'already expired' \
        || { echo "      $(etcdctl lease timetolive "${A_KEY##*/}")"; return 1; }
}

echo
echo "== scenario 1: zombie client A (frozen past its lease) against client B"
T_START=$(now_ms)
B_STYLE=function
[ -n "$UNFENCED" ] && B_STYLE=sql
client A --ttl 2 --account 1 --amount 1 --writes 5 --interval-ms 1000 --style sql
A_PID=$CLIENT_PID
check "A acquires the lock and commits its first write" wait_line "$WORK/A.out" '^wrote ' 30 "$A_PID"
kill -STOP "$A_PID"
T_FROZEN=$(now_ms)
TOK_A=$(token_of A)
# A's lock key (settlement/<A's lease in hex>), for the check of mutual exclusion below.
A_KEY=$(lock_keys | sed -n 1p)  # (sed reads all: head would end etcdctl with SIGPIPE, status 141)
say "A holds 'settlement' with token $TOK_A (lease TTL 2s, key $A_KEY), wrote once, frozen with SIGSTOP"
client B --ttl 10 --account 1 --amount 100 --writes 3 --interval-ms 100 --style "$B_STYLE"
B_PID=$CLIENT_PID
check "B gets the lock once A's lease has expired" wait_line "$WORK/B.out" '^token=' 30 "$B_PID"
B_WAITED=$(($(now_ms) - T_FROZEN))
TOK_B=$(token_of B)
say "B got the lock with token $TOK_B, ${B_WAITED}ms after A was frozen"
wait_exit "$B_PID" 30
B_RC=$RC
say "B exited with status $B_RC after $(writes_of B) writes (style $B_STYLE)"
kill -CONT "$A_PID"
say "A resumed with SIGCONT; it still believes it holds the lock"
wait_exit "$A_PID" 30
A_RC=$RC
say "A exited with status $A_RC: $(grep -m1 'fenced off' "$WORK/A.err" || head -n 1 "$WORK/A.err")"

# Mutual exclusion by etcd, from etcd's own history rather than from how long B waited (which a
# slow machine changes): at the revision of B's grant (its token) A's key was gone already,
# deleted when A's lease expired (A, frozen, never released it).
check "when B got the lock (revision $TOK_B) A's key was gone: A's lease had expired" \
    a_key_gone_at "$TOK_B"
check "B exits 0" eq "$B_RC" 0
check "B committed all 3 writes" eq "$(writes_of B)" 3
check "A exits 3 (fenced off)" eq "$A_RC" 3
check "A printed 'fenced off: SQLSTATE FT001' naming its token" \
    has "$WORK/A.err" "^fenced off: SQLSTATE FT001: .*\\b$TOK_A\\b"
check "B's token is higher than A's" gt "$TOK_B" "$TOK_A"
A_WROTE=$(writes_of A)
check "A reported exactly the writes the audit shows for it" \
    eq "$(q "SELECT count(*) FROM ledger_audit WHERE writer = 'A'")" "$A_WROTE"
check "no write of A's committed after B's first write" \
    eq "$(q "SELECT count(*) FROM ledger_audit WHERE writer = 'A'
             AND seq > (SELECT min(seq) FROM ledger_audit WHERE writer = 'B')")" 0
check "committed tokens never decrease (audit, in commit order)" \
    eq "$(q "SELECT count(*) FROM (SELECT token < lag(token) OVER (ORDER BY seq) AS down
             FROM ledger_audit) s WHERE down")" 0
check "the row is B's: balance = A's $A_WROTE x 1 + 3 x 100, fence_token = B's token" \
    eq "$(q "SELECT balance || ' ' || coalesce(fence_token::text, 'NULL') FROM ledger WHERE account = 1")" \
    "$((A_WROTE + 300)) $TOK_B"
if [ -z "$UNFENCED" ]; then
    check "the resource's high-water mark is B's token" \
        eq "$(q "SELECT fencing_high_water('settlement')")" "$TOK_B"
fi
check "no lock key left in etcd" eventually no_lock_keys

if [ -z "$UNFENCED" ]; then
    echo
    echo "== scenario 2: a client alone, end to end, in each style (new rows: insert, then update)"
    PREV=$TOK_B
    ACCOUNT=2
    for style in sql function; do
        name=solo_$style
        T_START=$(now_ms)
        client "$name" --ttl 5 --account "$ACCOUNT" --amount 7 --writes 3 --interval-ms 50 --style "$style"
        wait_exit "$CLIENT_PID" 30
        TOK=$(token_of "$name")
        say "$name: token $TOK, $(writes_of "$name") writes, exit status $RC"
        check "$name exits 0" eq "$RC" 0
        check "$name printed nothing on stderr" eq "$(cat "$WORK/$name.err")" ""
        check "$name's token is higher than the previous holder's" gt "$TOK" "$PREV"
        check "$name committed 3 writes: balance 21, fence_token its token" \
            eq "$(q "SELECT balance || ' ' || fence_token FROM ledger WHERE account = $ACCOUNT")" "21 $TOK"
        check "$name released the lock: no key under 'settlement' in etcd" eventually no_lock_keys
        PREV=$TOK
        ACCOUNT=$((ACCOUNT + 1))
    done
    check "every lease was revoked or expired: none left in etcd" eventually no_leases
fi

echo
echo "tests/client/run.sh took $(( ($(now_ms) - T0) / 1000 ))s"
echo "client: $PASSED passed, $FAILED failed"
if [ "$FAILED" -gt 0 ]; then
    for f in "$WORK"/*.out "$WORK"/*.err; do
        echo "--- $(basename "$f")"
        cat "$f"
    done
    echo "--- ledger_audit"
    psql -X -q -c "TABLE ledger_audit" || true
    exit 1
fi
