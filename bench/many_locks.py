"""Many locks at once: what 1,000 concurrently held fencing_acquire locks cost the server and etcd.

A self-contained run (it starts its own etcd 3.4 and a throwaway PostgreSQL cluster with the
installed pg_fencing preloaded, pg_fencing.max_locks = 2048 and pg_fencing.lease_ttl = 10):

  1. 100 sessions (psycopg2 connections) each take 10 distinct locks ml-<session>-<i> with
     fencing_acquire, from 20 threads (each thread owns 5 sessions, so 20 acquisitions are in
     flight at a time): 1,000 locks held at once; every acquisition's latency is recorded.
  2. Steady state (all held) for 20 s: etcd's requests per second by gRPC method (its /metrics:
     grpc_server_handled_total for unary calls, grpc_server_msg_received_total for the
     LeaseKeepAlive and Watch streams), the RSS of the worker process ("pg_fencing etcd
     worker", /proc/<pid>/status) and pg_fencing's shared memory (pg_shmem_allocations).
     Checked: fencing_locks has 1,000 'held' rows with distinct tokens, 10 per session; etcd has
     exactly those 1,000 keys, each created at its lock's token; and one lease per session (the
     locks of a session share its lease: `etcdctl lease list` shows 100 leases).
  3. All released; the same 1,000 acquisitions again from one thread (latency without
     concurrency), released; then 10,000 acquire/release cycles spread over the 100 sessions
     (20 threads), with etcd's requests per cycle.
  4. Half the sessions end (their leases must go at once), the other half stay open without a
     lock (their leases must go after one lease TTL), then they end too. Checked: fencing_locks
     empty, no etcd key under ml-, and within lease_ttl + 5 s no lease left.

Prints a markdown table and writes it to bench/many_locks.md (--out; --quick writes no file
unless --out is given). Exits 1 with the failed checks (and the server log's pg_fencing lines)
if any check fails, so it runs as a test: tests/worker/run.sh runs it with --quick (20 sessions,
200 locks, 1,000 cycles), bench/run.sh --many-locks the full run (about two minutes).

An installed build that does not know pg_fencing.max_locks (64 slots, a lease per lock) is
detected from its shared library: the setting is then left out and the lease checks expect a
lease per lock, e.g. for a dry run of the plumbing with --sessions 6 --locks-per-session 10.

Ports: --pg-port / PGPORT_MANYLOCKS and --etcd-port / ETCD_MANYLOCKS_PORT (etcd's peer port is
the next one); free loopback ports if not given. PGBIN: the server binaries (default
/usr/lib/postgresql/15/bin). KEEP_WORK=1 keeps the work directory (logs, data).
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import psycopg2

PGBIN = os.environ.get("PGBIN", "/usr/lib/postgresql/15/bin")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "ml-"
TTL = 10
MAX_LOCKS = 2048
ACQUIRE_TIMEOUT = "30s"
# How soon after its session ends a session's lease must be gone: the worker may notice at its
# next keepalive round (every TTL/3), plus slack for the revoke on a busy machine.
ENDED_LIMIT = TTL / 3 + 3


class Failure(Exception):
    pass


def parse_args():
    ap = argparse.ArgumentParser(description="1,000 concurrently held fencing_acquire locks: latency, etcd traffic, memory")
    ap.add_argument("--quick", action="store_true", help="20 sessions x 10 locks, 1,000 cycles, 10 s steady state (the test command)")
    ap.add_argument("--sessions", type=int)
    ap.add_argument("--locks-per-session", type=int)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--cycles", type=int)
    ap.add_argument("--steady-seconds", type=float)
    ap.add_argument("--no-sequential", action="store_true", help="skip the one-thread pass")
    ap.add_argument("--out", help="markdown file to write (default bench/many_locks.md; none with --quick)")
    ap.add_argument("--pg-port", type=int, default=int(os.environ.get("PGPORT_MANYLOCKS", "0")))
    ap.add_argument("--etcd-port", type=int, default=int(os.environ.get("ETCD_MANYLOCKS_PORT", "0")))
    ap.add_argument("--time-limit", type=int, help="seconds before the run gives up (default 540, --quick 300)")
    a = ap.parse_args()
    quick = dict(sessions=20, locks_per_session=10, threads=10, cycles=1000, steady_seconds=10.0, time_limit=300)
    full = dict(sessions=100, locks_per_session=10, threads=20, cycles=10000, steady_seconds=20.0, time_limit=540)
    for k, v in (quick if a.quick else full).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.threads = max(1, min(a.threads, a.sessions))
    if a.out is None and not a.quick:
        a.out = os.path.join(ROOT, "bench", "many_locks.md")
    return a


# --------------------------------------------------------------------------------------- helpers

def free_port(avoid=()):
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p not in avoid and p + 1 not in avoid and port_is_free(p + 1):
            return p
    raise Failure("no free loopback port found")


def port_is_free(p):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", p))
            return True
        except OSError:
            return False


def as_pg(args, **kw):
    if os.getuid() == 0:
        args = ["sudo", "-u", "postgres", "--"] + args
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] if s else float("nan")


def wait_until(pred, timeout, step=0.2):
    """Polls pred() until it returns a true value or timeout seconds pass; returns its last value
    and the seconds it took."""
    t0 = time.monotonic()
    while True:
        v = pred()
        if v or time.monotonic() - t0 >= timeout:
            return v, time.monotonic() - t0
        time.sleep(step)


def legacy_build():
    """True if the installed pg_fencing knows no pg_fencing.max_locks (the build before session
    leases): read off its shared library, as the setting must not be in postgresql.conf then."""
    libdir = subprocess.run([f"{PGBIN}/pg_config", "--pkglibdir"], capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(libdir, "pg_fencing.so"), "rb") as f:
        return b"pg_fencing.max_locks" not in f.read()


# ------------------------------------------------------------------------------------- services

class Etcd:
    def __init__(self, work, port):
        self.port, self.peer = port, port + 1
        self.dir = os.path.join(work, "etcd")
        self.log = os.path.join(work, "etcd.log")
        self.proc = None

    def endpoint(self):
        return f"127.0.0.1:{self.port}"

    def start(self):
        log = open(self.log, "a")
        self.proc = subprocess.Popen(
            ["etcd", "--name", "ml", "--data-dir", self.dir,
             "--listen-client-urls", f"http://127.0.0.1:{self.port}",
             "--advertise-client-urls", f"http://127.0.0.1:{self.port}",
             "--listen-peer-urls", f"http://127.0.0.1:{self.peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer}",
             "--initial-cluster", f"ml=http://127.0.0.1:{self.peer}", "--initial-cluster-state", "new"],
            stdout=log, stderr=log)
        ok, _ = wait_until(lambda: self.proc.poll() is None and self.ctl("endpoint", "health", check=False).returncode == 0, 20)
        if not ok:
            raise Failure(f"etcd did not become healthy on {self.endpoint()}; see {self.log}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def ctl(self, *args, check=True):
        # etcdctl 3.4 refuses --endpoints next to ETCDCTL_ENDPOINTS: none of the caller's ETCDCTL_*.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
        env["ETCDCTL_API"] = "3"
        return subprocess.run(["etcdctl", "--endpoints", self.endpoint(), *args],
                              capture_output=True, text=True, env=env, check=check, timeout=60)

    def kvs(self, prefix):
        """The keys under prefix: {key: (create_revision, lease)}."""
        out = json.loads(self.ctl("get", "--prefix", prefix, "-w", "json").stdout)
        import base64
        return {base64.b64decode(kv["key"]).decode(): (int(kv["create_revision"]), int(kv.get("lease", 0)))
                for kv in out.get("kvs", [])}

    def leases(self):
        lines = self.ctl("lease", "list").stdout.split()
        # "found N leases" then one hex id a line
        return [l for l in lines[3:] if l]

    def metrics(self):
        """etcd's counters: {(name, grpc_method or ''): value}, unary calls by handled_total,
        stream messages by msg_received_total, and a few gauges and lease counters."""
        with urllib.request.urlopen(f"http://{self.endpoint()}/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            m = re.match(r"^(\w+)(?:\{([^}]*)\})? (\S+)$", line)
            if not m:
                continue
            name, labels, value = m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")), float(m.group(3))
            if name == "grpc_server_handled_total" and labels.get("grpc_type") == "unary":
                key = ("unary", labels["grpc_method"])
            elif name == "grpc_server_msg_received_total" and labels.get("grpc_type") != "unary":
                key = ("stream", labels["grpc_method"])
            elif name in ("etcd_debugging_mvcc_watcher_total", "etcd_debugging_mvcc_watch_stream_total",
                          "etcd_debugging_lease_renewed_total", "etcd_debugging_lease_granted_total",
                          "etcd_debugging_lease_revoked_total"):
                key = (name, "")
            else:
                continue
            out[key] = out.get(key, 0) + value
        return out


def requests_delta(m0, m1):
    """{method: count} of gRPC requests between two metrics() reads; a stream's method (its
    messages) as "LeaseKeepAlive (stream messages)"."""
    d = {}
    for (kind, method), v in m1.items():
        if kind in ("unary", "stream"):
            n = v - m0.get((kind, method), 0)
            if n:
                name = method if kind == "unary" else f"{method} (stream messages)"
                d[name] = d.get(name, 0) + n
    return d


class Pg:
    def __init__(self, work, port, conf):
        self.work, self.port = work, port
        self.data = os.path.join(work, "pgdata")
        self.log = os.path.join(work, "postgres.log")
        os.makedirs(self.data)
        if os.getuid() == 0:
            shutil.chown(self.data, "postgres", "postgres")
        as_pg([f"{PGBIN}/initdb", "-D", self.data, "-U", "postgres", "-A", "trust", "--no-sync"])
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(f"port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{work}'\n"
                    f"fsync = off\n{conf}\n")

    def start(self):
        try:
            as_pg([f"{PGBIN}/pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60", "start"])
        except subprocess.CalledProcessError:
            raise Failure(f"PostgreSQL did not start on port {self.port}:\n" + self.log_tail(20, all_lines=True))

    def running(self):
        return os.path.exists(os.path.join(self.data, "postmaster.pid"))

    def stop(self, mode="fast"):
        if self.running():
            subprocess.run((["sudo", "-u", "postgres", "--"] if os.getuid() == 0 else [])
                           + [f"{PGBIN}/pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop"],
                           capture_output=True, text=True)

    def connect(self, name="many_locks"):
        c = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                             application_name=name)
        c.autocommit = True
        return c

    def postmaster_pid(self):
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            return int(f.readline())

    def worker_pid(self):
        out = subprocess.run(["pgrep", "-P", str(self.postmaster_pid()), "-f", "pg_fencing etcd worker"],
                             capture_output=True, text=True).stdout.split()
        return int(out[0]) if out else None

    def log_tail(self, n=40, all_lines=False):
        try:
            with open(self.log, errors="replace") as f:
                lines = [l.rstrip("\n") for l in f]
        except OSError:
            return "(no server log)"
        if not all_lines:
            lines = [l for l in lines if re.search(r"pg_fencing|WARNING|ERROR|FATAL|PANIC|terminated|worker", l)]
        return "\n".join(lines[-n:])


def cpu_seconds(pid):
    """User + system CPU seconds of a process (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def build_kind():
    """Which of this tree's builds the installed pg_fencing.so is: "release", "debug" (an
    unoptimized build: latency, CPU and RSS are not those of the release package) or None."""
    import filecmp
    libdir = subprocess.run([f"{PGBIN}/pg_config", "--pkglibdir"], capture_output=True, text=True).stdout.strip()
    inst = os.path.join(libdir, "pg_fencing.so")
    for kind in ("release", "debug"):
        built = os.path.join(ROOT, "target", kind, "libpg_fencing.so")
        try:
            if os.path.getsize(built) == os.path.getsize(inst) and filecmp.cmp(built, inst, shallow=False):
                return kind
        except OSError:
            pass
    return None


def proc_mem(pid):
    """VmRSS, RssAnon, RssShmem and VmHWM of a process in MB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssShmem", "VmHWM"):
                out[k] = int(v.split()[0]) / 1024
    return out


# ------------------------------------------------------------------------------------- sessions

class Session:
    def __init__(self, pg, i):
        self.i = i
        self.conn = pg.connect(f"many_locks-{i}")
        self.cur = self.conn.cursor()
        self.cur.execute("SELECT pg_backend_pid()")
        self.pid = self.cur.fetchone()[0]

    def acquire(self, name):
        t0 = time.perf_counter()
        try:
            self.cur.execute("SELECT fencing_acquire(%s, %s::interval)", (name, ACQUIRE_TIMEOUT))
            token = self.cur.fetchone()[0]
        except psycopg2.Error as e:
            raise Failure(f"fencing_acquire('{name}') in session {self.i} (pid {self.pid}) failed: "
                          f"SQLSTATE {e.pgcode}: {(e.pgerror or str(e)).strip()}")
        return token, (time.perf_counter() - t0) * 1e3

    def release(self, name):
        t0 = time.perf_counter()
        try:
            self.cur.execute("SELECT fencing_release(%s)", (name,))
            released = self.cur.fetchone()[0]
        except psycopg2.Error as e:
            raise Failure(f"fencing_release('{name}') in session {self.i} (pid {self.pid}) failed: "
                          f"SQLSTATE {e.pgcode}: {(e.pgerror or str(e)).strip()}")
        if released is not True:
            notices = " ".join(n.strip() for n in self.conn.notices[-3:])
            raise Failure(f"fencing_release('{name}') in session {self.i} (pid {self.pid}) returned {released} {notices}")
        return (time.perf_counter() - t0) * 1e3

    def close(self):
        self.conn.close()


def lock_name(s, i):
    return f"{PREFIX}{s}-{i}"


def parallel(sessions, threads, per_thread):
    """Runs per_thread(its sessions, stop event) in `threads` threads, session k in thread
    k % threads; returns their results. The first failure stops the others and is raised."""
    groups = [sessions[t::threads] for t in range(threads)]
    results, errors = [None] * threads, []
    stop = threading.Event()

    def runner(t):
        try:
            results[t] = per_thread(groups[t], stop)
        except Exception as e:  # noqa: BLE001 — reported below, with the thread's session
            errors.append(e)
            stop.set()
    ts = [threading.Thread(target=runner, args=(t,), daemon=True) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        more = f" (and {len(errors) - 1} more failures)" if len(errors) > 1 else ""
        raise Failure(f"{errors[0]}{more}")
    return results


# ------------------------------------------------------------------------------------------ run

class Run:
    def __init__(self, args, work):
        self.a = args
        self.work = work
        self.failed = []
        self.r = {}  # measurements for the report
        self.etcd = self.pg = None
        self.sessions = []

    def check(self, cond, what, detail=""):
        if cond:
            print(f"  ok: {what}")
        else:
            print(f"  FAIL: {what} {detail}".rstrip())
            self.failed.append(what)
        sys.stdout.flush()
        return cond

    def say(self, text):
        print(text)
        sys.stdout.flush()

    # ---- set-up
    def start(self):
        a = self.a
        self.legacy = legacy_build()
        self.n_locks = a.sessions * a.locks_per_session
        if self.legacy:
            self.say("== the installed pg_fencing knows no pg_fencing.max_locks (the build before session leases): "
                     "left out of postgresql.conf; the lease checks expect a lease per lock")
            if self.n_locks > 64:
                raise Failure(f"{self.n_locks} locks: the installed build has 64 lock slots; "
                              f"try --sessions 6 --locks-per-session 10")
        etcd_port = a.etcd_port or free_port()
        pg_port = a.pg_port or free_port(avoid=(etcd_port, etcd_port + 1))
        self.etcd = Etcd(self.work, etcd_port)
        self.etcd.start()
        conf = (f"shared_preload_libraries = 'pg_fencing'\n"
                f"pg_fencing.etcd_endpoints = '{self.etcd.endpoint()}'\n"
                f"pg_fencing.lease_ttl = {TTL}\n"
                f"max_connections = {a.sessions + 20}\n")
        if not self.legacy:
            conf += f"pg_fencing.max_locks = {MAX_LOCKS}\n"
        self.pg = Pg(self.work, pg_port, conf)
        self.pg.start()
        self.mon = self.pg.connect("many_locks-monitor")
        self.mcur = self.mon.cursor()
        self.mcur.execute("CREATE EXTENSION IF NOT EXISTS pg_fencing")
        self.mcur.execute("SHOW server_version")
        self.r["pg_version"] = self.mcur.fetchone()[0]
        self.say(f"== etcd on {self.etcd.endpoint()}, PostgreSQL {self.r['pg_version']} on 127.0.0.1:{pg_port} "
                 f"(work directory {self.work})")
        if not self.legacy:
            self.mcur.execute("SHOW pg_fencing.max_locks")
            self.check(self.mcur.fetchone()[0] == str(MAX_LOCKS), f"pg_fencing.max_locks is {MAX_LOCKS}")
        self.wpid, _ = wait_until(self.pg.worker_pid, 10)
        if not self.wpid:
            raise Failure("no process titled 'pg_fencing etcd worker' under the postmaster:\n" + self.pg.log_tail())
        self.r["rss_idle"] = proc_mem(self.wpid)
        self.r["shm"] = self.shmem()
        self.sessions = [Session(self.pg, i) for i in range(a.sessions)]
        # One lock taken and released first, by session 0 (so its lease is a session's lease, not
        # one more): the worker is connected to etcd before we measure.
        self.sessions[0].acquire(PREFIX + "warm")
        self.sessions[0].release(PREFIX + "warm")

    def cpu(self):
        return cpu_seconds(self.wpid), cpu_seconds(self.etcd.proc.pid)

    def cpu_delta(self, c0):
        c1 = self.cpu()
        return c1[0] - c0[0], c1[1] - c0[1]

    def shmem(self):
        self.mcur.execute("SELECT name, allocated_size FROM pg_shmem_allocations WHERE name LIKE 'pg_fencing%' ORDER BY name")
        return self.mcur.fetchall()

    def view(self):
        self.mcur.execute("SELECT lock, key, token, state, pid FROM fencing_locks")
        return self.mcur.fetchall()

    # ---- 1. all locks at once
    def acquire_all(self, threads):
        a = self.a

        def work(group, stop):
            lat, tokens = [], {}
            for i in range(a.locks_per_session):
                for s in group:
                    if stop.is_set():
                        return lat, tokens
                    tok, ms = s.acquire(lock_name(s.i, i))
                    lat.append(ms)
                    tokens[lock_name(s.i, i)] = tok
            return lat, tokens
        c0, t0 = self.cpu(), time.monotonic()
        res = parallel(self.sessions, threads, work)
        took = time.monotonic() - t0
        self.r[f"cpu_acquire_{threads}"] = self.cpu_delta(c0)
        lat = [x for l, _ in res for x in l]
        tokens = {k: v for _, t in res for k, v in t.items()}
        return lat, tokens, took

    def release_all(self, threads):
        a = self.a

        def work(group, stop):
            lat = []
            for s in group:
                for i in range(a.locks_per_session):
                    if stop.is_set():
                        return lat
                    lat.append(s.release(lock_name(s.i, i)))
            return lat
        return [x for l in parallel(self.sessions, threads, work) for x in l]

    # ---- 2. steady state
    def steady(self, tokens):
        a = self.a
        self.say(f"== steady state: {self.n_locks} locks held, measuring for {a.steady_seconds:.0f} s")
        m0, c0, t0 = self.etcd.metrics(), self.cpu(), time.monotonic()
        time.sleep(a.steady_seconds)
        m1, t1 = self.etcd.metrics(), time.monotonic()
        self.r["cpu_steady"] = self.cpu_delta(c0)
        self.r["rss_steady"] = proc_mem(self.wpid)
        self.r["shm"] = self.shmem()
        dt = t1 - t0
        self.r["steady_rates"] = {k: v / dt for k, v in requests_delta(m0, m1).items()}
        self.r["steady_seconds"] = dt
        self.r["watchers"] = int(m1.get(("etcd_debugging_mvcc_watcher_total", ""), 0))
        self.r["watch_streams"] = int(m1.get(("etcd_debugging_mvcc_watch_stream_total", ""), 0))
        self.r["renewals_per_s"] = (m1.get(("etcd_debugging_lease_renewed_total", ""), 0)
                                    - m0.get(("etcd_debugging_lease_renewed_total", ""), 0)) / dt

        rows = [r for r in self.view() if r[0].startswith(PREFIX)]
        held = [r for r in rows if r[3] == "held"]
        self.check(len(held) == self.n_locks and len(rows) == self.n_locks,
                   f"fencing_locks: {self.n_locks} rows, all 'held'",
                   f"({len(rows)} rows, {len(held)} held; states {sorted({r[3] for r in rows})})")
        self.check(len({r[2] for r in rows}) == len(rows) and None not in {r[2] for r in rows},
                   "each with a distinct token")
        self.check(all(tokens.get(r[0]) == r[2] for r in rows),
                   "the view's tokens are those fencing_acquire returned")
        by_pid = {}
        for r in rows:
            by_pid.setdefault(r[4], []).append(r)
        pids = {s.pid for s in self.sessions}
        self.check(set(by_pid) == pids and all(len(v) == a.locks_per_session for v in by_pid.values()),
                   f"{a.locks_per_session} rows for each of the {a.sessions} sessions (by pid)")

        kvs = self.etcd.kvs(PREFIX)
        self.check(len(kvs) == self.n_locks, f"etcd holds {self.n_locks} keys under {PREFIX}", f"({len(kvs)})")
        view_keys = {r[1]: r for r in rows}
        missing = set(view_keys) ^ set(kvs)
        self.check(not missing, "they are the keys fencing_locks names",
                   f"({len(missing)} differ, e.g. {sorted(missing)[:3]})")
        wrong = [(k, kvs[k][0], view_keys[k][2]) for k in view_keys if k in kvs and kvs[k][0] != view_keys[k][2]]
        self.check(not wrong, "each key was created at its lock's token (free locks)", f"(e.g. {wrong[:3]})")
        lease_of_pid = {}
        for k, r in view_keys.items():
            if k in kvs:
                lease_of_pid.setdefault(r[4], set()).add(kvs[k][1])
        key_leases = {kv[1] for kv in kvs.values()}
        leases = self.etcd.leases()
        self.r["leases"] = len(leases)
        self.r["key_leases"] = len(key_leases)
        if self.legacy:
            self.check(len(key_leases) == self.n_locks, "a lease per lock (the installed build)", f"({len(key_leases)})")
            self.check(len(leases) == self.n_locks, f"etcdctl lease list: {self.n_locks} leases", f"({len(leases)})")
        else:
            self.check(all(len(v) == 1 for v in lease_of_pid.values()),
                       "the keys of a session share one lease",
                       f"(sessions with more: {sum(1 for v in lease_of_pid.values() if len(v) > 1)})")
            self.check(len(key_leases) == a.sessions, f"the keys carry {a.sessions} leases, one per session",
                       f"({len(key_leases)})")
            self.check(len(leases) == a.sessions, f"etcdctl lease list: {a.sessions} leases", f"({len(leases)})")
            # A lease is renewed every TTL/3: sessions x 3 / TTL keepalives a second (a margin for
            # the renewals that fall into the window's edges).
            expect = a.sessions * 3 / TTL
            got = self.r["steady_rates"].get("LeaseKeepAlive (stream messages)", 0)
            self.check(got <= 1.5 * expect + 1, f"LeaseKeepAlive messages grow with sessions: "
                       f"{got:.1f}/s (one per session every TTL/3: {expect:.1f}/s)")

    # ---- 3. one thread, then cycles
    def cycles(self):
        a = self.a
        per = [a.cycles // a.sessions + (1 if s.i < a.cycles % a.sessions else 0) for s in self.sessions]

        def work(group, stop):
            acq, rel, n = [], [], 0
            for k in range(max(per)):
                for s in group:
                    if k >= per[s.i] or stop.is_set():
                        continue
                    name = lock_name(s.i, k % a.locks_per_session)
                    _, ms = s.acquire(name)
                    acq.append(ms)
                    rel.append(s.release(name))
                    n += 1
            return acq, rel, n
        m0, c0 = self.etcd.metrics(), self.cpu()
        t0 = time.monotonic()
        res = parallel(self.sessions, a.threads, work)
        took = time.monotonic() - t0
        self.r["cpu_cycles"] = self.cpu_delta(c0)
        m1 = self.etcd.metrics()
        self.last_release = time.monotonic()
        n = sum(r[2] for r in res)
        self.r["cycles_n"] = n
        self.r["cycles_s"] = took
        self.r["cycles_acq"] = [x for r in res for x in r[0]]
        self.r["cycles_rel"] = [x for r in res for x in r[1]]
        self.r["cycle_requests"] = {k: v / n for k, v in requests_delta(m0, m1).items()}
        grants = requests_delta(m0, m1).get("LeaseGrant", 0)
        if not self.legacy:
            self.check(grants <= a.sessions,
                       f"the cycles grant at most a lease per session ({int(grants)} LeaseGrant for {n} cycles; "
                       f"each session took a lock every {took / max(1, n // a.sessions):.1f} s on average, "
                       f"so its lease was never unused for a TTL ({TTL} s))")

    # ---- 4. the end
    def end(self):
        """Every session takes one more lock and reads its lease off the key (<name>/<lease hex>).
        A quarter of the sessions end holding it, a quarter release it and end, the other half
        release it and stay open: the leases of the first two quarters must go when their
        sessions end (within ENDED_LIMIT), those of the idle open sessions within lease_ttl + 5 s of the
        release. Then all end: nothing may be left."""
        a = self.a
        self.say("== sessions end: a quarter holding a lock, a quarter after releasing it, the other half stay open idle")
        for s in self.sessions:
            s.acquire(lock_name(s.i, "last"))
        lease = {}
        for lock, key, _, _, pid in self.view():
            if lock.startswith(PREFIX) and lock.endswith("-last"):
                lease[pid] = int(key.rsplit("/", 1)[1], 16)
        self.check(len(lease) == len(self.sessions), "each session holds its last lock",
                   f"({len(lease)} of {len(self.sessions)})")
        holding, released, idle = self.sessions[0::4], self.sessions[2::4], self.sessions[1::2]
        for s in released + idle:
            s.release(lock_name(s.i, "last"))
        t_release = time.monotonic()
        for s in holding + released:
            s.close()
        t_close = time.monotonic()

        # Watch the three groups' leases together until each group's are gone (or long past
        # its limit, to tell how late they went): seconds from the session's end / the release.
        groups = {"holding": (holding, t_close, ENDED_LIMIT), "released": (released, t_close, ENDED_LIMIT),
                  "idle": (idle, t_release, TTL + 5)}
        groups = {k: v for k, v in groups.items() if v[0]}
        gone_after, left = {}, {}
        deadline = max(t0 + 2 * limit for _, t0, limit in groups.values())
        while True:
            current = {int(x, 16) for x in self.etcd.leases()}
            now = time.monotonic()
            for k, (group, t0, _) in groups.items():
                if k not in gone_after:
                    left[k] = sum(1 for x in group if lease.get(x.pid) in current)
                    if not left[k]:
                        gone_after[k] = now - t0
            if len(gone_after) == len(groups) or now > deadline:
                break
            time.sleep(0.25)
        for k, what in (("holding", "that ended holding a lock"), ("released", "that ended after releasing their locks"),
                        ("idle", "that stay open without a lock")):
            if k not in groups:
                continue
            group, _, limit = groups[k]
            took = gone_after.get(k)
            self.r[f"lease_gone_{k}_s"] = took
            since = "of the session's end" if k != "idle" else "of their release"
            self.check(took is not None and took <= limit,
                       f"the leases of the {len(group)} sessions {what} are gone within {limit:.1f} s {since}",
                       f"(gone after {took:.1f} s)" if took is not None
                       else f"({left[k]} still listed by etcdctl lease list after {deadline - groups[k][1]:.0f} s)")
        keys = self.etcd.kvs(PREFIX)
        self.check(not keys, f"no etcd key under {PREFIX} once those sessions ended or released", f"({sorted(keys)[:5]})")
        for s in idle:
            s.close()
        self.sessions = []
        rows, _ = wait_until(lambda: not [r for r in self.view() if r[0].startswith(PREFIX)], 10)
        self.check(rows, "fencing_locks is empty", f"({self.view()[:5]})")
        keys, _ = wait_until(lambda: not self.etcd.kvs(PREFIX), 5)
        self.check(keys, f"no etcd key under {PREFIX}", f"({sorted(self.etcd.kvs(PREFIX))[:5]})")
        leases, took = wait_until(lambda: not self.etcd.leases(), TTL + 5, 0.5)
        self.check(leases, f"no lease left within lease_ttl + 5 s ({took:.1f} s)", f"({self.etcd.leases()[:5]})")

    def all(self):
        a = self.a
        self.r["load_before"] = os.getloadavg()[0]
        self.start()
        self.say(f"== {a.sessions} sessions take {a.locks_per_session} locks each, from {a.threads} threads")
        lat, tokens, took = self.acquire_all(a.threads)
        self.r["conc_acq"], self.r["conc_s"] = lat, took
        self.steady(tokens)
        self.say("== all released")
        self.r["conc_rel"] = self.release_all(a.threads)
        rows, _ = wait_until(lambda: not [r for r in self.view() if r[0].startswith(PREFIX)], 5)
        self.check(rows, "fencing_locks is empty after the releases")
        self.check(not self.etcd.kvs(PREFIX), f"no etcd key under {PREFIX} after the releases")
        if not a.no_sequential:
            self.say(f"== the same {self.n_locks} acquisitions from one thread, then released")
            lat, _, took = self.acquire_all(1)
            self.r["seq_acq"], self.r["seq_s"] = lat, took
            self.r["seq_rel"] = self.release_all(1)
        self.say(f"== {a.cycles} acquire/release cycles over {a.sessions} sessions, from {a.threads} threads")
        self.cycles()
        self.end()

    def stop(self):
        for s in self.sessions:
            try:
                s.close()
            except Exception:  # noqa: BLE001 — closing what is left at the end
                pass
        if self.pg:
            self.pg.stop("fast")
        if self.etcd:
            self.etcd.stop()

    # ---- report
    def report(self):
        a, r = self.a, self.r
        ms = lambda v: f"{pct(v, 50):.2f} / {pct(v, 99):.2f}" if v else "–"  # noqa: E731
        rss = lambda m: f"{m['VmRSS']:.1f} (anonymous {m['RssAnon']:.1f})" if m else "–"  # noqa: E731
        etcd_v = subprocess.run(["etcd", "--version"], capture_output=True, text=True).stdout.split()
        etcd_v = etcd_v[2] if len(etcd_v) > 2 else "?"
        git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "?"
        libdir = subprocess.run([f"{PGBIN}/pg_config", "--pkglibdir"], capture_output=True, text=True).stdout.strip()
        try:
            built = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(os.path.getmtime(os.path.join(libdir, "pg_fencing.so"))))
        except OSError:
            built = "?"
        kind = build_kind()
        kind = {"release": ", this tree's release build", None: ""}.get(
            kind, ", this tree's DEBUG build: latency, CPU and RSS are not the release build's")
        with open("/etc/os-release") as f:
            osname = dict(l.rstrip("\n").split("=", 1) for l in f if "=" in l).get("PRETTY_NAME", "?").strip('"')
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        n, nl = a.sessions, self.n_locks
        cmd = " ".join(["bench/many_locks.py"] + sys.argv[1:])
        out = [
            f"Machine: {os.cpu_count()} cores, {mem_gb:.0f} GiB RAM, {osname}; PostgreSQL {r.get('pg_version', '?')}, "
            f"etcd {etcd_v} on loopback (its default fsync per write), pg_fencing as installed "
            f"(pg_fencing.so of {built}{kind}; tree at {git}){' — the build before session leases' if self.legacy else ''}; "
            f"date {time.strftime('%Y-%m-%d', time.gmtime())}; load average (1 min) {r.get('load_before', 0):.2f} before the run, "
            f"{os.getloadavg()[0]:.2f} after it (anything else running shares the {os.cpu_count()} cores with the clients, backends, worker and etcd).",
            f"Command: {cmd} ({n} sessions x {a.locks_per_session} locks = {nl} held at once, {a.threads} threads, "
            f"{a.cycles} cycles; pg_fencing.lease_ttl = {TTL}"
            f"{'' if self.legacy else f', pg_fencing.max_locks = {MAX_LOCKS}'}).",
            "",
            "| measure | value |",
            "|---|---:|",
            f"| acquire p50 / p99 ms, {nl} locks taken by {n} sessions from {a.threads} threads "
            f"({len(r.get('conc_acq', []))} samples, {r.get('conc_s', 0):.1f} s) | {ms(r.get('conc_acq'))} |",
        ]
        if r.get("seq_acq"):
            out.append(f"| acquire p50 / p99 ms, the same {nl} from one thread ({r['seq_s']:.1f} s) | {ms(r['seq_acq'])} |")
        out += [
            f"| release p50 / p99 ms, the {nl} held locks, {a.threads} threads | {ms(r.get('conc_rel'))} |",
            f"| acquire p50 / p99 ms, {r.get('cycles_n', 0)} acquire/release cycles, {a.threads} threads | {ms(r.get('cycles_acq'))} |",
            f"| release p50 / p99 ms, in those cycles | {ms(r.get('cycles_rel'))} |",
        ]
        if r.get("cycles_s"):
            out.append(f"| time of the {r['cycles_n']} cycles, s | {r['cycles_s']:.1f} ({r['cycles_n'] / r['cycles_s']:.0f} cycles/s) |")
        rates = r.get("steady_rates")
        if rates is not None:
            out.append(f"| etcd requests/s at steady state ({r['steady_seconds']:.0f} s, {nl} held), total | {sum(rates.values()):.1f} |")
            for k in sorted(rates, key=lambda k: -rates[k]):
                out.append(f"| &nbsp;&nbsp;{k} | {rates[k]:.1f} |")
            out.append(f"| lease renewals/s at steady state (etcd_debugging_lease_renewed_total) | {r['renewals_per_s']:.1f} |")
            out.append(f"| leases held at steady state (`etcdctl lease list`) | {r['leases']} |")
            out.append(f"| etcd watchers / watch streams at steady state | {r['watchers']} / {r['watch_streams']} |")
        out.append(f"| worker RSS MB before the locks | {rss(r.get('rss_idle'))} |")
        if r.get("rss_steady"):
            out.append(f"| worker RSS MB with {nl} locks held | {rss(r['rss_steady'])} |")
        shm = r.get("shm") or []
        out.append(f"| shared memory of pg_fencing MB (pg_shmem_allocations) | "
                   f"{sum(x[1] for x in shm) / 2**20:.2f} |")
        for name, size in shm:
            out.append(f"| &nbsp;&nbsp;{name} MB | {size / 2**20:.3f} |")
        cpu = lambda k, n: (f"{r[k][0] / n * 1e3:.2f} / {r[k][1] / n * 1e3:.2f}" if r.get(k) and n else "–")  # noqa: E731
        out.append(f"| CPU ms per acquisition, worker / etcd ({nl} from {a.threads} threads) | {cpu(f'cpu_acquire_{a.threads}', nl)} |")
        if r.get("cycles_n"):
            out.append(f"| CPU ms per acquire/release cycle, worker / etcd | {cpu('cpu_cycles', r['cycles_n'])} |")
        if r.get("cpu_steady"):
            out.append(f"| CPU at steady state, worker / etcd, % of a core | {r['cpu_steady'][0] / r['steady_seconds'] * 100:.1f} / "
                       f"{r['cpu_steady'][1] / r['steady_seconds'] * 100:.1f} |")
        if r.get("cycle_requests"):
            per = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["cycle_requests"].items(), key=lambda kv: -kv[1]))
            out.append(f"| etcd requests per acquire/release cycle | {per} |")
        for k, what, limit in (("holding", "a session that ends holding a lock, after its end", ENDED_LIMIT),
                               ("released", "a session that ends after releasing its lock, after its end", ENDED_LIMIT),
                               ("idle", "an open session without locks, after its last release", TTL + 5)):
            if f"lease_gone_{k}_s" in r:
                v = r[f"lease_gone_{k}_s"]
                out.append(f"| lease of {what}: gone after, s (limit {limit:.1f}) | {'not seen gone' if v is None else f'{v:.1f}'} |")
        out.append("")
        out.append("Checks: " + ("all passed." if not self.failed else "FAILED: " + "; ".join(self.failed) + "."))
        return "\n".join(out) + "\n"


def main():
    a = parse_args()
    work = tempfile.mkdtemp(prefix="pg_fencing_many_locks.")
    os.chmod(work, 0o755)
    if os.getuid() == 0:
        shutil.chown(work, "postgres", "postgres")
    run = Run(a, work)

    def too_long(*_):
        raise Failure(f"time limit of {a.time_limit} s exceeded")
    signal.signal(signal.SIGALRM, too_long)
    signal.alarm(a.time_limit)
    try:
        run.all()
    except Failure as e:
        run.failed.append(str(e).splitlines()[0])
        print(f"  FAIL: {e}")
    except psycopg2.Error as e:
        run.failed.append(f"SQLSTATE {e.pgcode}: {(e.pgerror or str(e)).strip()}")
        print(f"  FAIL: SQLSTATE {e.pgcode}: {(e.pgerror or str(e)).strip()}")
    finally:
        signal.alarm(0)
        if run.failed and run.pg:
            print(f"-- the server log's pg_fencing lines (last 40 of {run.pg.log}):")
            print(run.pg.log_tail())
        run.stop()
    print()
    table = run.report()
    print(table, end="")
    if a.out:
        with open(a.out, "w") as f:
            f.write(table)
        out = os.path.abspath(a.out)
        print(f"(written to {os.path.relpath(out, ROOT) if out.startswith(ROOT + os.sep) else out})")
    if os.environ.get("KEEP_WORK"):
        print(f"(work directory kept: {work})")
    else:
        shutil.rmtree(work, ignore_errors=True)
    if run.failed:
        print(f"many_locks: {len(run.failed)} checks FAILED")
        sys.exit(1)
    print("many_locks: all checks passed")


if __name__ == "__main__":
    main()
