"""Lock acquisition latency of four lock services, side by side in one run, with real servers on
loopback (bench/run.sh --locks starts them): one acquisition and release per sample, one client
at a time, nothing else running.

  Redis      SET key value NX PX 10000, then DEL (redis-py; no token)
  etcd       etcd-client (Rust, bench/etcd-lock-bench): lease grant, lock, unlock, lease revoke;
             the same with one lease for all samples (a Go concurrency.Session): lock, unlock;
             and `etcdctl lock NAME -- true` (a process per acquisition, as shell scripts use it)
  ZooKeeper  kazoo's Lock recipe (an ephemeral sequential znode, the children listed, deleted)
             on an open session
  pg_fencing SELECT fencing_acquire(NAME) and SELECT fencing_release(NAME) from an open
             connection: the worker takes the etcd lock under the session's lease (granted by
             the warm-up), plus the IPC; and SELECT fencing_lease_acquire(NAME, '30s') and
             SELECT fencing_lease_release(TOKEN): a PostgreSQL lease, no lock service (each
             grant's commit flushed to disk: the cluster runs with fsync on in this mode)

Environment: ETCD_ENDPOINT, ETCD_BENCH_BIN, ZK_HOSTS, REDIS_PORT, PGPORT (the cluster has the
worker), BENCH_LOCK_N (samples per path, default 500, in 5 rounds in which the paths take turns; etcdctl:
a fifth of it).
Prints a markdown table: p50 and p99 in milliseconds of the acquisition alone (where a client
can tell it apart: the request that returns the lock) and of the whole round trip, n.
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
# The paths take turns, N / ROUNDS samples each per round, so that a slow spell of the machine's
# disk (etcd and ZooKeeper fsync every write) falls on all of them alike.
ROUNDS = 5


def timed(n, acquire, release=None):
    """(acquisition ms, round trip ms) per sample; without `release` the acquisition is not told
    apart (None)."""
    acq, total = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        acquire()
        t1 = time.perf_counter()
        if release:
            release()
        t2 = time.perf_counter()
        acq.append((t1 - t0) * 1e3)
        total.append((t2 - t0) * 1e3)
    return (acq if release else None), total


def redis_path(n):
    r = redis.Redis(host="127.0.0.1", port=int(os.environ["REDIS_PORT"]))
    r.ping()

    def acquire():
        if not r.set("bench-lock", "me", nx=True, px=10000):
            raise RuntimeError("Redis lock held by someone else")
    return timed(n, acquire, lambda: r.delete("bench-lock"))


def etcd_client_path(n, mode="lease-per-lock"):
    r = subprocess.run([os.environ["ETCD_BENCH_BIN"], os.environ["ETCD_ENDPOINT"], "bench-direct", str(n), mode],
                       capture_output=True, text=True, check=True)
    pairs = [line.split() for line in r.stdout.splitlines() if line.strip()]
    return [float(a) / 1e3 for a, _ in pairs], [float(t) / 1e3 for _, t in pairs]


def etcd_client_session_path(n):
    return etcd_client_path(n, "session")


def etcdctl_path(n):
    env = dict(os.environ, ETCDCTL_API="3")
    env.pop("ETCDCTL_ENDPOINTS", None)  # conflicts with --endpoints

    def once():
        subprocess.run(["etcdctl", "--endpoints", os.environ["ETCD_ENDPOINT"], "lock", "bench-ctl", "--", "true"],
                       env=env, capture_output=True, check=True)
    return timed(max(n // 5, 4), once)


def zookeeper_path(n):
    zk = KazooClient(hosts=os.environ["ZK_HOSTS"], timeout=10)
    zk.start(timeout=10)
    lock = Lock(zk, "/locks/bench", identifier="bench")
    lock.acquire(timeout=10)  # the lock's parent nodes exist before the first sample
    lock.release()

    def acquire():
        if not lock.acquire(timeout=10):
            raise RuntimeError("ZooKeeper lock not granted")
    try:
        return timed(n, acquire, lock.release)
    finally:
        zk.stop()
        zk.close()


def fencing_path(n):
    c = psycopg2.connect(host="127.0.0.1", port=int(os.environ["PGPORT"]), user="postgres", dbname="postgres")
    c.autocommit = True
    cur = c.cursor()
    cur.execute("SELECT fencing_acquire('bench-fa')")  # the first connects the worker's lock slot
    cur.execute("SELECT fencing_release('bench-fa')")

    def acquire():
        cur.execute("SELECT fencing_acquire('bench-fa')")
        cur.fetchone()

    def release():
        cur.execute("SELECT fencing_release('bench-fa')")
        cur.fetchone()
    try:
        return timed(n, acquire, release)
    finally:
        c.close()


def lease_path(n):
    c = psycopg2.connect(host="127.0.0.1", port=int(os.environ["PGPORT"]), user="postgres", dbname="postgres")
    c.autocommit = True
    cur = c.cursor()
    token = [None]

    def acquire():
        cur.execute("SELECT fencing_lease_acquire('bench-lease', '30s')")
        token[0] = cur.fetchone()[0]

    def release():
        cur.execute("SELECT fencing_lease_release(%s)", (token[0],))
        cur.fetchone()
    try:
        return timed(n, acquire, release)
    finally:
        c.close()


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def main():
    rows = [
        ("Redis: SET NX PX + DEL (redis-py)", "about 0.4", redis_path),
        ("etcd: etcd-client directly, lease + lock + unlock + revoke (Rust)", "about 2.8", etcd_client_path),
        ("etcd: etcd-client directly, one session lease: lock + unlock (Rust)", "", etcd_client_session_path),
        ("etcd: `etcdctl lock NAME -- true` (a process each)", "", etcdctl_path),
        ("ZooKeeper: kazoo Lock acquire + release (recipe)", "about 3.5 (Curator mutex)", zookeeper_path),
        ("pg_fencing: fencing_acquire + fencing_release (SQL, worker → etcd)", "", fencing_path),
        ("pg_fencing: fencing_lease_acquire + fencing_lease_release (SQL, PostgreSQL leases, no lock service)", "", lease_path),
    ]
    results = {}
    print("| lock service and client | acquire p50 ms | acquire p99 ms | round trip p50 ms | round trip p99 ms | n | figure usually quoted, ms |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for _ in range(ROUNDS):
        for name, _, fn in rows:
            acq, total = fn(max(N // ROUNDS, 1))
            had = results.setdefault(name, (None if acq is None else [], []))
            if acq is not None:
                had[0].extend(acq)
            had[1].extend(total)
    for name, quoted, _ in rows:
        acq, total = results[name]
        a50, a99 = (f"{pct(acq, 50):.2f}", f"{pct(acq, 99):.2f}") if acq else ("", "")
        print(f"| {name} | {a50} | {a99} | {pct(total, 50):.2f} | {pct(total, 99):.2f} | {len(total)} | {quoted} |")
        sys.stdout.flush()
    direct, session, ours = results[rows[1][0]], results[rows[2][0]], results[rows[5][0]]
    print()
    print(f"fencing_acquire p50 minus etcd-client's direct acquisition (lease grant + lock) p50: "
          f"{pct(ours[0], 50) - pct(direct[0], 50):+.2f} ms")
    print(f"fencing_acquire + fencing_release p50 minus etcd-client's direct round trip p50: "
          f"{pct(ours[1], 50) - pct(direct[1], 50):+.2f} ms")
    print(f"fencing_acquire p50 minus etcd-client's direct acquisition with a session lease (lock) p50: "
          f"{pct(ours[0], 50) - pct(session[0], 50):+.2f} ms")
    print(f"fencing_acquire + fencing_release p50 minus that client's round trip (lock + unlock) p50: "
          f"{pct(ours[1], 50) - pct(session[1], 50):+.2f} ms")

if __name__ == "__main__":
    main()
