"""Lock acquisition latency of four lock services, side by side in one run, with real servers on
loopback (bench/run.sh --locks starts them): one acquisition and release per sample, one client
at a time, nothing else running.

  Redis      SET key value NX PX 10000, then DEL (redis-py; no token)
  etcd       etcd-client (Rust, bench/etcd-lock-bench): lease grant, lock, unlock, lease revoke;
             and `etcdctl lock NAME -- true` (a process per acquisition, as shell scripts use it)
  ZooKeeper  kazoo's Lock recipe (an ephemeral sequential znode, the children listed, deleted)
             on an open session
  pg_fencing SELECT fencing_acquire(NAME) and SELECT fencing_release(NAME) from an open
             connection: the worker takes the etcd lock as etcd-client does, plus the IPC

Environment: ETCD_ENDPOINT, ETCD_BENCH_BIN, ZK_HOSTS, REDIS_PORT, PGPORT (the cluster has the
worker), BENCH_LOCK_N (samples per path, default 500; etcdctl: a fifth of it).
Prints a markdown table: p50 and p99 in milliseconds, n.
"""

import os
import statistics
import subprocess
import sys
import time

import psycopg2
import redis
from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock

N = int(os.environ.get("BENCH_LOCK_N", "500"))


def timed(n, once):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        once()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def redis_path():
    r = redis.Redis(host="127.0.0.1", port=int(os.environ["REDIS_PORT"]))
    r.ping()

    def once():
        if not r.set("bench-lock", "me", nx=True, px=10000):
            raise RuntimeError("Redis lock held by someone else")
        r.delete("bench-lock")
    return timed(N, once)


def etcd_client_path():
    r = subprocess.run([os.environ["ETCD_BENCH_BIN"], os.environ["ETCD_ENDPOINT"], "bench-direct", str(N)],
                       capture_output=True, text=True, check=True)
    return [float(x) / 1e3 for x in r.stdout.split()]


def etcdctl_path():
    env = dict(os.environ, ETCDCTL_API="3")
    env.pop("ETCDCTL_ENDPOINTS", None)  # conflicts with --endpoints

    def once():
        subprocess.run(["etcdctl", "--endpoints", os.environ["ETCD_ENDPOINT"], "lock", "bench-ctl", "--", "true"],
                       env=env, capture_output=True, check=True)
    return timed(max(N // 5, 20), once)


def zookeeper_path():
    zk = KazooClient(hosts=os.environ["ZK_HOSTS"], timeout=10)
    zk.start(timeout=10)
    lock = Lock(zk, "/locks/bench", identifier="bench")
    lock.acquire(timeout=10)  # the lock's parent nodes exist before the first sample
    lock.release()

    def once():
        if not lock.acquire(timeout=10):
            raise RuntimeError("ZooKeeper lock not granted")
        lock.release()
    try:
        return timed(N, once)
    finally:
        zk.stop()
        zk.close()


def fencing_path():
    c = psycopg2.connect(host="127.0.0.1", port=int(os.environ["PGPORT"]), user="postgres", dbname="postgres")
    c.autocommit = True
    cur = c.cursor()
    cur.execute("SELECT fencing_acquire('bench-fa')")  # the first connects the worker's lock slot
    cur.execute("SELECT fencing_release('bench-fa')")

    def once():
        cur.execute("SELECT fencing_acquire('bench-fa')")
        cur.fetchone()
        cur.execute("SELECT fencing_release('bench-fa')")
        cur.fetchone()
    try:
        return timed(N, once)
    finally:
        c.close()


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def main():
    rows = [
        ("Redis: SET NX PX + DEL (redis-py)", "about 0.4", redis_path),
        ("etcd: etcd-client directly, lease + lock + unlock + revoke (Rust)", "about 2.8", etcd_client_path),
        ("etcd: `etcdctl lock NAME -- true` (a process each)", "", etcdctl_path),
        ("ZooKeeper: kazoo Lock acquire + release (recipe)", "about 3.5 (Curator mutex)", zookeeper_path),
        ("pg_fencing: fencing_acquire + fencing_release (SQL, worker → etcd)", "", fencing_path),
    ]
    results = {}
    print("| lock service and client | p50 ms | p99 ms | mean ms | n | figure usually quoted, ms |")
    print("|---|---:|---:|---:|---:|---|")
    for name, quoted, fn in rows:
        v = fn()
        results[name] = v
        print(f"| {name} | {pct(v, 50):.2f} | {pct(v, 99):.2f} | {statistics.mean(v):.2f} | {len(v)} | {quoted} |")
        sys.stdout.flush()
    direct = pct(results[rows[1][0]], 50)
    ours = pct(results[rows[4][0]], 50)
    print()
    print(f"fencing_acquire + fencing_release p50 minus etcd-client's direct p50: {ours - direct:+.2f} ms")


if __name__ == "__main__":
    main()
