#!/usr/bin/env bash
# Redis fencing tokens, shown honestly: a Redisson-style token (`INCR` of one counter key while
# the lock is held, as Redisson's getFencedLock and bsm/redislock hand it out) against a real
# Redis primary and its replica (Debian's redis-server 7), and PostgreSQL with pg_fencing.
#
# A throwaway primary on 127.0.0.1:${REDIS_TEST_PORT:-24194}, its replica on that + 1, and a
# throwaway cluster on 127.0.0.1:${PGPORT_REDIS:-54473}. Checks:
#   1. without a failover the tokens behave: holder A takes the lock (SET NX PX) and its token
#      (INCR), the lock expires while A is paused, B takes the lock and a higher token; A's
#      write after B's is refused (FT001);
#   2. a failover that loses the last increment (Redis replicates asynchronously): A takes the
#      lock and INCRs on the primary while the replica is paused; the primary dies before the
#      replica got the INCR; the replica is promoted; B takes the lock there (A's lock key is
#      gone too) and INCRs to the SAME token as A's. Both write to the protected table with
#      that token and both writes are accepted: equal tokens pass (one holder writes many
#      times with its token), so pg_fencing cannot tell two holders with the same token apart.
#      That is the point of the test: it must happen, or the demonstration is broken.
# Prints ok/FAIL per check; exits 1 if any check failed. docs/clients.md ("Redis") says what
# Redis users should do instead.
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh

PGPORT_TEST=${PGPORT_REDIS:-54473}
PRIMARY=${REDIS_TEST_PORT:-24194}
REPLICA=$((PRIMARY + 1))
CHILD_PIDS=""
fresh_workdir
trap cleanup_all EXIT
trap 'exit 130' INT TERM

redis_at() {  # redis_at <port> [replicaof port]: a throwaway Redis, nothing saved
    local extra=()
    [ -z "${2:-}" ] || extra=(--replicaof 127.0.0.1 "$2")
    mkdir -p "$WORK/redis-$1"
    redis-server --port "$1" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK/redis-$1" \
        --repl-diskless-sync-delay 0 \
        "${extra[@]}" >"$WORK/redis-$1.log" 2>&1 &
    CHILD_PIDS="$CHILD_PIDS $!"
    disown "$!"   # killed on purpose below: no job-control message
    for _ in $(seq 1 600); do
        [ "$(redis-cli -p "$1" ping 2>/dev/null)" = PONG ] && return 0
        sleep 0.05
    done
    echo "Redis on $1 did not start; see $WORK/redis-$1.log" >&2
    return 1
}
pid_of() { redis-cli -p "$1" info server | sed -n 's/^process_id:\([0-9]*\).*/\1/p' | tr -d '\r'; }
rcli() { redis-cli -p "$@" | tr -d '\r'; }
synced() {  # synced <replica port> <key> <value>: wait (up to 30 s) until the replica has key = value
    for _ in $(seq 1 600); do
        [ "$(rcli "$1" get "$2")" = "$3" ] && return 0
        sleep 0.05
    done
    return 1
}
# A holder's lock and token, as Redisson's fenced lock takes them: the lock (SET NX PX), then
# INCR of the counter, both on the current primary. Prints the token, or nothing without the lock.
# The lock's expiry (PX, 1500 ms unless given) is what the stories wait out with a sleep, which
# can only last longer than asked; a lock that must still be held later is taken for long.
take() {  # take <port> <holder> [px in ms]
    [ "$(rcli "$1" set lock:settlement "$2" NX PX "${3:-1500}")" = OK ] || return 0
    rcli "$1" incr token:settlement
}
write() {  # write <holder> <token>: the holder's write, the token set for its transaction; ok or SQLSTATE
    sqlstate_of psql -X -q -v ON_ERROR_STOP=1 -o /dev/null \
        -c "SELECT set_config('pg_fencing.token', '$2', true); UPDATE settlement SET holder = '$1'"
}

echo "== Redis $(redis-server --version | sed 's/.* v=\([^ ]*\).*/\1/') primary on 127.0.0.1:$PRIMARY, replica on $REPLICA"
redis_at "$PRIMARY"
redis_at "$REPLICA" "$PRIMARY"
for _ in $(seq 1 600); do
    rcli "$REPLICA" info replication | grep -q '^master_link_status:up' && break
    sleep 0.05
done
pg_start
psql -X -q -v ON_ERROR_STOP=1 -o /dev/null <<'SQL'
CREATE EXTENSION pg_fencing;
CREATE TABLE settlement (id int PRIMARY KEY, holder text);
INSERT INTO settlement VALUES (1, 'nobody');
SELECT fencing_protect('settlement', 'settlement');
SQL

echo "== 1. no failover: the lock expires while A is paused, B takes it"
ta=$(take "$PRIMARY" A)
sleep 1.7   # A's lock (1.5 s) expires while A is "paused"
tb=$(take "$PRIMARY" B)
echo "  A's token $ta, B's token $tb"
expect "B's token is above A's" yes "$([ -n "$ta" ] && [ -n "$tb" ] && [ "$tb" -gt "$ta" ] && echo yes || echo "no ($ta, $tb)")"
expect "B's write" ok "$(write B "$tb")"
expect "A's write after B's (a zombie's) is refused" FT001 "$(write A "$ta")"

echo "== 2. a failover that loses the last increment"
synced "$REPLICA" token:settlement "$tb" || true
expect "the replica has the counter before the failover" "$tb" "$(rcli "$REPLICA" get token:settlement)"
sleep 1.7   # B's lock expires
# The replica falls behind (a slow link, a GC pause, ...): paused, and its link dropped by the
# primary, so that nothing written from now on reaches it (a paused process would still find
# what was sent in its socket's buffer).
rpid=$(pid_of "$REPLICA")
kill -STOP "$rpid"
rcli "$PRIMARY" client kill type replica >/dev/null
ta2=$(take "$PRIMARY" A)
echo "  A takes the lock and INCRs on the primary: token $ta2; the replica has not got it"
kill -9 "$(pid_of "$PRIMARY")"      # the primary dies before the INCR reaches the replica
while redis-cli -p "$PRIMARY" ping >/dev/null 2>&1; do sleep 0.05; done
kill -CONT "$rpid"
rcli "$REPLICA" replicaof no one >/dev/null   # promoted (as Sentinel would)
expect "the promoted replica's counter is the one before A's INCR" "$tb" "$(rcli "$REPLICA" get token:settlement)"
tb2=$(take "$REPLICA" B 60000)   # held until after A's write below, however slow the machine
echo "  B takes the lock on the promoted replica (A's lock key never got there): token $tb2"
expect "B got the same token as A (two holders, one token)" "yes $ta2" "$([ -n "$ta2" ] && echo yes) $tb2"
expect "B's write with that token" ok "$(write B "$tb2")"
expect "A's write with the same token is accepted too: equal tokens pass, pg_fencing cannot tell the holders apart" \
    ok "$(write A "$ta2")"
expect "B still holds the lock on the new primary after A's write" yes \
    "$([ "$(rcli "$REPLICA" get lock:settlement)" = B ] && echo yes || echo no)"
expect "the row ends with A's write, made while B held the lock" A "$(psql -X -Atc "SELECT holder FROM settlement")"
exit $fail
