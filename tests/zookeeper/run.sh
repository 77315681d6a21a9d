#!/usr/bin/env bash
# The zombie story with ZooKeeper's lock recipe against a real ZooKeeper 3.8 and PostgreSQL, the
# token being the czxid of the holder's lock znode (examples/zookeeper/holder.py says why czxid
# and not the sequence number), once with kazoo's Lock (examples/zookeeper/holder.py) and once
# with Apache Curator's InterProcessMutex (examples/zookeeper/CuratorHolder.java, compiled here
# against Debian's libcurator-recipes-java and libpostgresql-jdbc-java, OpenJDK 17).
#
# A throwaway ZooKeeper (standalone, tickTime 500 ms, so sessions of 1 to 10 s) on
# 127.0.0.1:${ZK_TEST_PORT:-24182} and a throwaway cluster on 127.0.0.1:${PGPORT_ZOOKEEPER:-54469}.
# Checks, for each holder, for table settlement (protected, resource mode, resource 'settlement')
# and then for settlement_unprotected (the negative control: the same story must corrupt it):
#   1. holder A (session timeout 2 s) takes lock /locks/<table>-<kazoo|curator> and is frozen with SIGSTOP
#      between taking the lock and writing; ZooKeeper expires its session and deletes its node;
#   2. holder B takes the lock (a higher czxid) and writes;
#   3. A is resumed and writes with its old czxid: refused with FT001 on the protected table (the
#      row keeps B's write), accepted on the unprotected one (the row ends with A's write).
# Then the two kinds of token: after the lock's parent node is deleted and re-created (an
# operator's cleanup, or a recipe that removes empty parents), the next holder's sequence number
# starts again at 0 and is below the previous holder's, while its czxid is above it.
# Prints ok/FAIL per check; exits 1 if any check failed.
set -euo pipefail
source "$(dirname "$0")/../../scripts/hermetic.sh" "$@"
cd "$(dirname "$0")/../.."
source scripts/lib.sh
need_python

PGPORT_TEST=${PGPORT_ZOOKEEPER:-54469}
ZK_PORT=${ZK_TEST_PORT:-24182}
CHILD_PIDS=""
fresh_workdir
trap cleanup_all EXIT
trap 'exit 130' INT TERM

echo "== ZooKeeper (Debian package zookeeper $(dpkg-query -W -f='${Version}' zookeeper)) on 127.0.0.1:$ZK_PORT"
zk_start
pg_start
DSN="host=127.0.0.1 port=$PGPORT_TEST user=postgres dbname=postgres"
PSQL=(psql -X -q -v ON_ERROR_STOP=1)
"${PSQL[@]}" -o /dev/null <<'SQL'
CREATE EXTENSION pg_fencing;
CREATE TABLE settlement (id int PRIMARY KEY, holder text);
CREATE TABLE settlement_unprotected (id int PRIMARY KEY, holder text);
INSERT INTO settlement VALUES (1, 'nobody');
INSERT INTO settlement_unprotected VALUES (1, 'nobody');
SELECT fencing_protect('settlement', 'settlement');
SQL
KAZOO=("$PY" examples/zookeeper/holder.py --zk "127.0.0.1:$ZK_PORT" --dsn "$DSN")
# Curator's holder: compiled against the jars Debian installs into /usr/share/java.
J=/usr/share/java
CURATOR_CP="$J/curator-client.jar:$J/curator-framework.jar:$J/curator-recipes.jar:$J/zookeeper.jar"
CURATOR_CP+=":$J/zookeeper-jute.jar:$J/guava.jar:$J/slf4j-api.jar:$J/slf4j-nop.jar:$J/postgresql.jar"
mkdir -p "$WORK/java"
javac -d "$WORK/java" -cp "$CURATOR_CP" examples/zookeeper/CuratorHolder.java
CURATOR=(java -cp "$WORK/java:$CURATOR_CP" CuratorHolder --zk "127.0.0.1:$ZK_PORT"
         --jdbc "jdbc:postgresql://127.0.0.1:$PGPORT_TEST/postgres?user=postgres")
HOLDER=("${KAZOO[@]}")
field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" "$2" | head -1; }
wait_line() {  # wait_line <file> <pattern>: up to 30 s
    for _ in $(seq 1 300); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "  (no '$2' in $1: $(cat "$1" 2>/dev/null))"; return 1
}

story() {  # story <table> [kazoo|curator]
    local table=$1 kind=${2:-kazoo} lock="/locks/$1-${2:-kazoo}" sql a_name=A b_name=B
    sql="UPDATE $table SET holder = %(name)s WHERE id = 1"
    if [ "$kind" = curator ]; then
        HOLDER=("${CURATOR[@]}")
        sql="UPDATE $table SET holder = ? WHERE id = 1"
        a_name=CA b_name=CB   # the rows then show Curator's holders wrote, not kazoo's before
    else
        HOLDER=("${KAZOO[@]}")
    fi
    echo "== the zombie story on $table ($lock), holders with $kind"
    mkfifo "$WORK/a-$table-$kind.go"
    "${HOLDER[@]}" --name "$a_name" --lock "$lock" --sql "$sql" --session-timeout 2 --wait-for-go \
        <"$WORK/a-$table-$kind.go" >"$WORK/a-$table-$kind.out" 2>&1 &
    local a=$!
    CHILD_PIDS="$CHILD_PIDS $a"
    exec 4>"$WORK/a-$table-$kind.go"
    wait_line "$WORK/a-$table-$kind.out" acquired
    local ta; ta=$(field czxid "$WORK/a-$table-$kind.out")
    kill -STOP "$a"
    echo "  holder A took the lock: czxid $ta; frozen with SIGSTOP before writing"
    # ZooKeeper expires A's session after 2 s without heartbeats and deletes its ephemeral node;
    # B is granted the lock then.
    "${HOLDER[@]}" --name "$b_name" --lock "$lock" --sql "$sql" --session-timeout 2 >"$WORK/b-$table-$kind.out" 2>&1 || true
    local tb; tb=$(field czxid "$WORK/b-$table-$kind.out")
    echo "  holder B took the lock after A's session expired: czxid $tb; $(grep -m1 '^write' "$WORK/b-$table-$kind.out")"
    expect "$table ($kind): B's token is above A's" yes "$([ -n "$ta" ] && [ -n "$tb" ] && [ "$tb" -gt "$ta" ] && echo yes || echo "no ($ta, $tb)")"
    expect "$table ($kind): B's write" "write ok" "$(grep -m1 '^write' "$WORK/b-$table-$kind.out")"
    kill -CONT "$a"
    echo go >&4
    exec 4>&-
    local rc=0
    wait "$a" || rc=$?
    echo "  holder A resumed and wrote with czxid $ta: $(grep -m1 '^write' "$WORK/a-$table-$kind.out")"
    if [ "$table" = settlement ]; then
        expect "$table ($kind): A's write (a zombie's)" FT001 "$(grep -m1 '^write' "$WORK/a-$table-$kind.out" | awk '{print $2}')"
        expect "$table ($kind): A stops (exit 3) after FT001" 3 "$rc"
        expect "$table ($kind): the row keeps B's write" "$b_name" "$("${PSQL[@]}" -Atc "SELECT holder FROM $table")"
    else
        expect "negative control, $table ($kind): A's write (a zombie's) lands" "write ok" "$(grep -m1 '^write' "$WORK/a-$table-$kind.out")"
        expect "negative control, $table ($kind): the row ends with the zombie's write" "$a_name" "$("${PSQL[@]}" -Atc "SELECT holder FROM $table")"
    fi
}
story settlement
story settlement_unprotected
expect "the resource's mark is B's czxid" "$(field czxid "$WORK/b-settlement-kazoo.out")" \
    "$("${PSQL[@]}" -Atc "SELECT high_water FROM fencing_resources WHERE resource = 'settlement'")"
# The same story with Curator: its tokens are czxids of the same ensemble, so they come after
# kazoo's on the same resource.
"${PSQL[@]}" -c "UPDATE settlement_unprotected SET holder = 'nobody'"
story settlement curator
story settlement_unprotected curator
expect "the resource's mark is Curator's B's czxid" "$(field czxid "$WORK/b-settlement-curator.out")" \
    "$("${PSQL[@]}" -Atc "SELECT high_water FROM fencing_resources WHERE resource = 'settlement'")"

echo "== the two kinds of token: czxid keeps growing, the sequence number starts again"
"$PY" - "127.0.0.1:$ZK_PORT" <<'PY' >"$WORK/kinds.out"
import sys
from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock
zk = KazooClient(hosts=sys.argv[1]); zk.start(timeout=10)
def take(name):
    lock = Lock(zk, "/locks/kinds", identifier=name); lock.acquire(timeout=10)
    st = zk.exists(f"{lock.path}/{lock.node}")
    out = (st.czxid, int(lock.node[-10:])); lock.release(); return out
first = [take("c%d" % i) for i in range(3)]
zk.delete("/locks/kinds", recursive=True)   # an empty lock directory removed by a cleanup
after = take("d0")
print("before", *first[-1]); print("after", *after)
PY
read -r _ c1 s1 < <(grep '^before' "$WORK/kinds.out")
read -r _ c2 s2 < <(grep '^after' "$WORK/kinds.out")
echo "  last holder before the parent was re-created: czxid $c1, sequence $s1; next holder: czxid $c2, sequence $s2"
expect "czxid of the next holder is above the last one's" yes "$([ "$c2" -gt "$c1" ] && echo yes || echo no)"
expect "the sequence number of the next holder is below the last one's (not a token)" yes "$([ "$s2" -lt "$s1" ] && echo yes || echo no)"
exit $fail
