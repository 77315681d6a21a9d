"""Jepsen-style network faults between PostgreSQL (with pg_fencing's worker) and a three-member
etcd cluster, each on its own address in a network namespace (tests/partition/run.sh builds
them), while clients take etcd locks and write with their tokens. The history is written in
tests/stress/stress.py's log format and checked by its independent checker (check
--lock-service): no stale write may commit.

Clients (threads, each with its own PostgreSQL connection over the Unix socket, so only the
server's own traffic to etcd crosses the faults):
  * sql     takes the lock with fencing_acquire (the worker's etcd lock, lease TTL 2 s), writes
            with its token, fencing_release;
  * etcdctl takes the lock with `etcdctl lock --ttl 2` (its own lease, from the root namespace),
            writes with ETCD_LOCK_REV, then lets etcdctl release it.
Either kind sometimes pauses for longer than the lease TTL before or between its writes (a
"GC pause"; an etcdctl holder's etcdctl is also stopped with SIGSTOP, so its lease expires), so
newer holders overtake it and it writes as a zombie. Resources: stress-a (watched), stress-b
(watched with verify), stress-c (not watched): the storage-side rule alone.

The nemesis, on a schedule drawn from the seed, alternates faults and heals:
  * minority:   PostgreSQL reaches only one etcd member, which is cut off from the other two;
  * pg-cut:     PostgreSQL reaches no etcd member;
  * leader:     the current etcd leader is cut off from its peers;
  * slow:       one host's link gets a rate limit with a queue (delay and drops; netem where the
                kernel has it, else tbf);
Partitions are blackhole routes inside the namespaces (iproute2 only).

    partition.py run --dsn DSN --log FILE --endpoints E1,E2,E3 --hosts NS=IP,... --pg-ns NS
                     [--seconds 120] [--seed S] [--sql-clients 4] [--etcd-clients 3] [--unfenced]
                     [--pause-rate 0.2] [--etcd-history FILE]
"""
import argparse
import base64
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import psycopg2

TABLES = {"stress-a": "stress_a", "stress-b": "stress_b", "stress-c": "stress_c"}
TTL = 2
ROWS = 4


def sqlstate_of(exc):
    return getattr(exc, "pgcode", None) or "CONN"


def mark_of(exc):
    """The high-water mark an FT001 refusal reports in its DETAIL, for the checker to account for."""
    diag = getattr(exc, "diag", None)
    m = re.search(r"high-water mark of .* is (\d+)\.$", (diag and diag.message_detail) or "")
    return int(m.group(1)) if m else None


def dump_etcd_history(endpoints, path):
    """etcd's whole event history of the lock keys ("stress-" prefix), for the checker: a watch
    from revision 1, read up to a marker key written after the run."""
    for _ in range(30):
        try:
            subprocess.run(["etcdctl", "--endpoints", endpoints, "--command-timeout=5s", "put", "stress-~end", "x"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=etcdctl_env())
            break
        except subprocess.CalledProcessError:
            time.sleep(1)
    else:
        raise SystemExit("partition: etcd did not take the end marker after the heal")
    p = subprocess.Popen(["etcdctl", "--endpoints", endpoints, "watch", "--prefix", "stress-", "--rev", "1", "-w", "json"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=etcdctl_env())
    end = base64.b64encode(b"stress-~end").decode()
    deadline = time.time() + 120
    try:
        with open(path, "w") as out:
            while time.time() < deadline:
                ready, _, _ = select.select([p.stdout], [], [], deadline - time.time())
                line = p.stdout.readline() if ready else ""
                if not line:
                    break
                out.write(line)
                if end in line:
                    return
        raise SystemExit("partition: etcd's history did not reach the end marker")
    finally:
        p.kill()
        p.wait()


def etcdctl_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")} | {"ETCDCTL_API": "3"}


class Log:
    def __init__(self, path):
        self.f = open(path, "a", buffering=1)
        self.lock = threading.Lock()

    def emit(self, rec):
        with self.lock:
            self.f.write(json.dumps(rec) + "\n")


class Client(threading.Thread):
    def __init__(self, name, args, log, deadline, seed):
        super().__init__(daemon=True)
        self.name = name
        self.args = args
        self.log = log
        self.deadline = deadline
        self.rng = random.Random(seed)
        self.conn = None
        self.txn = 0
        self.stopped = None   # a process to resume on the way out

    def db(self):
        if self.conn is None:
            self.conn = psycopg2.connect(self.args.dsn, connect_timeout=5)
            self.conn.autocommit = True
            with self.conn.cursor() as c:
                c.execute("SET statement_timeout = '10s'")
                if self.args.unfenced:
                    # Negative control: the guard only records in replica mode, it refuses
                    # nothing, so the checker must find the zombies' writes.
                    c.execute("SET session_replication_role = replica")
        return self.conn

    def drop(self):
        try:
            if self.conn is not None:
                self.conn.close()
        except psycopg2.Error:
            pass
        self.conn = None

    def gc_pause(self, proc=None):
        """Sometimes pause for longer than the lease TTL (and stop the lease's keeper)."""
        if self.rng.random() < self.args.pause_rate:
            if proc is not None:
                proc.send_signal(signal.SIGSTOP)
                self.stopped = proc
            time.sleep(self.rng.uniform(TTL + 1, TTL + 5))
            if proc is not None:
                proc.send_signal(signal.SIGCONT)
                self.stopped = None
        else:
            time.sleep(self.rng.uniform(0, 0.05))

    def transaction(self, resource, token, proc=None):
        """One transaction of 1-3 writes with the token; logged as stress.py's checker reads it."""
        self.txn += 1
        tag = f"{self.name}.{self.txn}"
        table = TABLES[resource]
        conn = self.db()
        conn.autocommit = False
        xid = None
        try:
            cur = conn.cursor()
            cur.execute("SELECT txid_current()")
            xid = cur.fetchone()[0]
            self.log.emit({"ev": "begin", "txn": tag, "xid": xid, "token": token, "level": "read committed"})
            cur.execute("SET LOCAL pg_fencing.token = %s", (str(token),))
            for _ in range(self.rng.randint(1, 3)):
                self.gc_pause(proc)
                rid = self.rng.randint(1, ROWS)
                t0 = time.time()
                try:
                    cur.execute(f"UPDATE {table} SET v = v + 1, writer = %s WHERE id = %s RETURNING id",
                                (self.name, rid))
                    rows = [r[0] for r in cur.fetchall()]
                    self.log.emit({"ev": "write", "txn": tag, "op": "write", "table": table, "resource": resource,
                                   "rows": rows, "token": token, "outcome": "ok", "t0": t0, "t1": time.time()})
                except psycopg2.Error as e:
                    self.log.emit({"ev": "write", "txn": tag, "op": "write", "table": table, "resource": resource,
                                   "rows": [rid], "token": token, "outcome": sqlstate_of(e), "t0": t0,
                                   "t1": time.time(), "message": str(e).splitlines()[0] if str(e) else "",
                                   "mark": mark_of(e)})
                    raise
            conn.commit()
            self.log.emit({"ev": "commit", "txn": tag, "xid": xid, "outcome": "ok", "t": time.time()})
        except psycopg2.Error as e:
            try:
                conn.rollback()
                self.log.emit({"ev": "commit", "txn": tag, "xid": xid, "outcome": "rolled back:" + sqlstate_of(e),
                               "t": time.time()})
            except psycopg2.Error:
                if xid is not None:
                    self.log.emit({"ev": "commit", "txn": tag, "xid": xid, "outcome": "unknown", "t": time.time()})
                self.drop()
        finally:
            if self.conn is not None:
                self.conn.autocommit = True

    def run(self):
        while time.time() < self.deadline:
            try:
                self.round(self.rng.choice(list(TABLES)))
            except psycopg2.Error:
                self.drop()
                time.sleep(0.2)
        if self.stopped is not None:
            self.stopped.send_signal(signal.SIGCONT)


class SqlClient(Client):
    def round(self, resource):
        cur = self.db().cursor()
        try:
            cur.execute("SELECT fencing_acquire(%s, '3s')", (resource,))
            token = cur.fetchone()[0]
        except psycopg2.Error:
            time.sleep(0.2)
            return
        self.log.emit({"ev": "grant", "resource": resource, "token": token, "t": time.time(), "client": self.name})
        self.transaction(resource, token)
        try:
            self.db().cursor().execute("SELECT fencing_release(%s)", (resource,))
        except psycopg2.Error:
            self.drop()


class EtcdctlClient(Client):
    def round(self, resource):
        # etcdctl runs its command with stdin closed: the command holds the lock until a gate file
        # appears, made once the transaction is done (then etcdctl unlocks).
        self.rounds = getattr(self, "rounds", 0) + 1
        gate = os.path.join(self.args.gates, f"{self.name}-{self.rounds}")
        p = subprocess.Popen(
            ["etcdctl", "--endpoints", self.args.endpoints, "--dial-timeout=1s", "--command-timeout=5s",
             "lock", f"--ttl={TTL}", resource, "--", "sh", "-c",
             'echo $ETCD_LOCK_REV; while [ ! -e "$0" ]; do sleep 0.05; done', gate],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=etcdctl_env())
        try:
            ready, _, _ = select.select([p.stdout], [], [], 5)
            line = p.stdout.readline() if ready else ""
            if not line.strip().isdigit():
                return
            token = int(line)
            self.log.emit({"ev": "grant", "resource": resource, "token": token, "t": time.time(), "client": self.name})
            self.transaction(resource, token, p)
            open(gate, "w").close()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        finally:
            open(gate, "w").close()   # the command ends in any case
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()


class Nemesis(threading.Thread):
    def __init__(self, args, deadline, seed, log):
        super().__init__(daemon=True)
        self.args = args
        self.deadline = deadline
        self.rng = random.Random(seed)
        self.log = log
        self.hosts = dict(h.split("=") for h in args.hosts.split(","))   # namespace -> address
        self.members = [ns for ns in self.hosts if ns != args.pg_ns]
        self.applied = []   # (namespace, kind, target)
        self.counts = {}
        self.netem = None

    def sh(self, ns, *cmd):
        return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True)

    def cut(self, ns, target_ns):
        self.sh(ns, "ip", "route", "add", "blackhole", self.hosts[target_ns] + "/32")
        self.applied.append((ns, "route", target_ns))

    def slow(self, ns):
        if self.netem is None:
            self.netem = self.sh(ns, "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "1ms").returncode == 0
            if self.netem:
                self.sh(ns, "tc", "qdisc", "del", "dev", "eth0", "root")
        if self.netem:
            self.sh(ns, "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "80ms", "20ms", "loss", "15%")
        else:
            # Rate limit with a short queue: queueing delay, and drops when it overflows.
            self.sh(ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "64kbit", "burst", "4kb",
                    "latency", "60ms")
        self.applied.append((ns, "qdisc", None))

    def heal(self):
        for ns, kind, target in self.applied:
            if kind == "route":
                self.sh(ns, "ip", "route", "del", "blackhole", self.hosts[target] + "/32")
            else:
                self.sh(ns, "tc", "qdisc", "del", "dev", "eth0", "root")
        self.applied = []

    def leader(self):
        out = subprocess.run(["etcdctl", "--endpoints", self.args.endpoints, "--command-timeout=2s",
                              "endpoint", "status", "-w", "json"], capture_output=True, text=True,
                             env=etcdctl_env()).stdout
        try:
            for st in json.loads(out):
                if st["Status"]["leader"] == st["Status"]["header"]["member_id"]:
                    host = st["Endpoint"].split("//")[-1].split(":")[0]
                    return next(ns for ns, ip in self.hosts.items() if ip == host)
        except (ValueError, KeyError, StopIteration):
            pass
        return None

    def run(self):
        while time.time() < self.deadline - 3:
            kind = self.rng.choice(["minority", "pg-cut", "leader", "slow"])
            if kind == "minority":
                x = self.rng.choice(self.members)
                for m in self.members:
                    if m != x:
                        self.cut(self.args.pg_ns, m)
                        self.cut(x, m)
                        self.cut(m, x)
            elif kind == "pg-cut":
                for m in self.members:
                    self.cut(self.args.pg_ns, m)
            elif kind == "leader":
                ld = self.leader()
                if ld is None:
                    continue
                for m in self.members:
                    if m != ld:
                        self.cut(ld, m)
                        self.cut(m, ld)
            else:
                self.slow(self.rng.choice(list(self.hosts)))
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.log.emit({"ev": "nemesis", "fault": kind, "t": time.time()})
            time.sleep(self.rng.uniform(2, 6))
            self.heal()
            self.log.emit({"ev": "nemesis", "fault": "heal", "t": time.time()})
            time.sleep(self.rng.uniform(1, 4))
        self.heal()


def run(args):
    args.gates = tempfile.mkdtemp(prefix="pg_fencing_partition_gates.")
    conn = psycopg2.connect(args.dsn)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute("SELECT fencing_watch('stress-a')")
    cur.execute("SELECT fencing_watch('stress-b', NULL, true)")
    conn.close()
    log = Log(args.log)
    deadline = time.time() + args.seconds
    nemesis = Nemesis(args, deadline, args.seed, log)
    clients = [SqlClient(f"sql{i}", args, log, deadline, args.seed * 100 + i) for i in range(args.sql_clients)]
    clients += [EtcdctlClient(f"etcdctl{i}", args, log, deadline, args.seed * 100 + 50 + i)
                for i in range(args.etcd_clients)]
    nemesis.start()
    for c in clients:
        c.start()
    for c in clients:
        c.join(args.seconds + 60)
    nemesis.join(30)
    nemesis.heal()
    if args.etcd_history:
        dump_etcd_history(args.endpoints, args.etcd_history)
    shutil.rmtree(args.gates, ignore_errors=True)
    faults = ", ".join(f"{k} {v}" for k, v in sorted(nemesis.counts.items()))
    print(f"partition: {args.seconds:.0f} s, {len(clients)} clients, faults: {faults or 'none'}"
          f" (slow links by {'netem' if nemesis.netem else 'tbf'})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["run"])
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--endpoints", required=True)
    ap.add_argument("--hosts", required=True)
    ap.add_argument("--pg-ns", required=True)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sql-clients", type=int, default=4)
    ap.add_argument("--etcd-clients", type=int, default=3)
    ap.add_argument("--etcd-history", help="write etcd's event history of the lock keys here after the run")
    ap.add_argument("--unfenced", action="store_true", help="negative control: writes are not refused")
    ap.add_argument("--pause-rate", type=float, default=0.2, help="share of writes preceded by a pause > TTL")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
