"""A lock holder with ZooKeeper's lock recipe (kazoo's Lock), writing through pg_fencing: the
example docs/clients.md ("ZooKeeper") describes, run by tests/zookeeper/run.sh and by
scripts/demo.sh --lock-service zookeeper.

The token is the czxid of the holder's lock znode: the zxid of the transaction that created it.
zxids are global to the ensemble and only grow, so a later holder's node always has a higher
czxid, whatever lock path, and even after the lock's parent node was deleted and re-created. The
node's sequence number is not a token: it counts the children ever created under the parent
node, so it starts again at 0 when the parent is re-created (tests/zookeeper/zk_test.py shows
it), and it is a different counter from czxid, so one resource must only ever see one kind.

    holder.py --zk HOST:PORT --dsn DSN --name A --lock /locks/settlement [--session-timeout S]
              [--table settlement] [--id 1] [--wait-for-go]

Prints `acquired czxid=N seq=M node=PATH` once it holds the lock. With --wait-for-go it then
reads one line from stdin before writing (the test freezes it there with SIGSTOP, a pause between
"I hold the lock" and the write, as a GC pause would); it writes regardless of what happened to
its session meanwhile, as a zombie does. It runs STATEMENT (default `UPDATE settlement SET
holder = NAME WHERE id = 1`; %(name)s in it is the holder's name) in one transaction with the
token set for it (set_config(..., true)), prints `write ok` or `write SQLSTATE message`, and
exits 0 on ok, 3 on FT001 (fenced off: it stops and never retries with the same token), 1 else.
"""

import argparse
import sys

import psycopg2
from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zk", required=True)
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--lock", required=True)
    ap.add_argument("--session-timeout", type=float, default=2.0)
    ap.add_argument("--sql", default="UPDATE settlement SET holder = %(name)s WHERE id = 1")
    ap.add_argument("--wait-for-go", action="store_true")
    args = ap.parse_args()

    zk = KazooClient(hosts=args.zk, timeout=args.session_timeout)
    zk.start(timeout=10)
    lock = Lock(zk, args.lock, identifier=args.name)
    if not lock.acquire(timeout=30):
        print("no lock within 30 s", flush=True)
        return 1
    node = f"{lock.path}/{lock.node}"
    stat = zk.exists(node)
    token = stat.czxid
    seq = int(lock.node[-10:])
    print(f"acquired czxid={token} seq={seq} node={node}", flush=True)
    if args.wait_for_go:
        sys.stdin.readline()
    conn = psycopg2.connect(args.dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT set_config('pg_fencing.token', %s, true)", (str(token),))
            cur.execute(args.sql, {"name": args.name})
        print("write ok", flush=True)
        rc = 0
    except psycopg2.Error as e:
        print(f"write {e.pgcode} {str(e).splitlines()[0]}", flush=True)
        rc = 3 if e.pgcode == "FT001" else 1
    finally:
        conn.close()
    try:
        if rc == 0:
            lock.release()
        zk.stop()
        zk.close()
    except Exception:  # the session may be gone (expired while frozen): nothing left to release
        pass
    return rc


if __name__ == "__main__":
    sys.exit(main())
