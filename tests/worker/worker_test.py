"""Tests of the pg_fencing background worker against real etcd 3.4 processes on 127.0.0.1.

Each scenario prints "ok: ..." or "FAIL: ..."; the exit status is 1 if any failed.
Run by tests/worker/run.sh (which is part of scripts/test.sh).

Scenarios (issue "Background worker", docs/design.md, "Worker"):
  requests       a free lock costs a lease grant and one transaction (no Lock request, no lease
                 read), its token the creation revision of its key; a held one is queued with
                 etcd's Lock service and its lease read after the wait (etcd's request counters)
  session_lease  the locks of a session share one lease: a deleted key loses its lock alone, the
                 revoked lease all of them (not another session's); a lease unused for a TTL goes
  state_file     the etcd state file has a higher revision within a second, and at a stop
  interop        a PostgreSQL session holds `orders`; `etcdctl lock orders` waits until release and
                 then gets a higher token; and the reverse
  timeout        fencing_acquire honours its timeout (55P03), statement_timeout (57014) and
                 leaves nothing behind
  revoke         lease revoked from outside: fencing_locks says lost, the next write gets FT003
  freeze         worker frozen with SIGSTOP past the TTL: writes with its token get FT003
  etcd_down      etcd down when PostgreSQL starts: server serves, stored marks still enforced,
                 fencing_acquire fails with FT005; when etcd comes up the worker reconnects
  kill9          kill -9 of the postmaster: the worker's lock key disappears when its lease (TTL) expires
  cluster        three-member etcd cluster: the leader stops while a lock is held; lease and
                 lock survive, writes with the token keep working
  shutdown       pg_ctl stop -m fast takes at most about a second, etcd reachable or not
  max_locks      pg_fencing.max_locks = 3: a fourth lock gets 53400, a released slot is taken again
  no_preload     without shared_preload_libraries the worker functions fail with 55000
  threads        the worker's etcd threads block PostgreSQL's signals; its main thread does not
  watch_gap      a hand-over (Z to A, then A releases) while PostgreSQL is stopped: after the restart
                 the restarted watch derives the mark from etcd (A's grant); Z, writing right after the
                 restart, gets FT001 (the write waits until the watch has read etcd)
  watch_txn      fencing_watch/fencing_unwatch take effect at commit (rollback, savepoint, PREPARE
                 refused with 0A000); a new watch admits no write before it read etcd (FT005 with
                 pg_fencing.watch_sync_timeout = 0)
  watch_compacted  a new watch after etcd compacted the history that tells the holder's grant:
                 it starts (no endless reconnect), the mark is the compaction revision (a safe
                 bound: the former holder and the holder are refused), the next holder writes
  state_lock     fencing_reset and fencing_unwatch take the resource's lock and the watch state's
                 file lock in one order (no deadlock hidden from PostgreSQL); a wait for the file
                 lock honours pg_cancel_backend
  verify_wait    a write waiting for a verify watch to catch up ends at once on pg_cancel_backend
                 (57014) and on postmaster death (kill -9), not after pg_fencing.verify_max_lag
"""
import datetime
import fcntl
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import psycopg2

# The server binaries: scripts/lib.sh sets PGBIN for the major under test (PGF_PG_MAJOR).
PGBIN = os.environ.get("PGBIN", "/usr/lib/postgresql/15/bin")
PGPORT = int(os.environ.get("PGPORT_WORKER", "54369"))
ETCD_BASE = int(os.environ.get("ETCD_WORKER_PORT", "23900"))
TTL = 3
FAILED = []
WORK = tempfile.mkdtemp(prefix="pg_fencing_worker.")
os.chmod(WORK, 0o755)
if os.getuid() == 0:
    shutil.chown(WORK, "postgres", "postgres")
PROCS = []
ETCDS = []


def ok(cond, what, detail=""):
    if cond:
        print(f"  ok: {what}")
    else:
        print(f"  FAIL: {what} {detail}")
        FAILED.append(what)


def etcdctl_env():
    """The environment for etcdctl: ours, without the caller's ETCDCTL_* settings (etcdctl 3.4
    refuses an --endpoints flag next to ETCDCTL_ENDPOINTS, and the tests pass their endpoints)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
    env["ETCDCTL_API"] = "3"
    return env


def as_pg(args, **kw):
    if os.getuid() == 0:
        args = ["sudo", "-u", "postgres", "--"] + args
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


# ------------------------------------------------------------------------------------------ etcd

class Etcd:
    def __init__(self, members=1, base=ETCD_BASE, tag="e"):
        self.procs = {}
        self.members = [f"{tag}{i}" for i in range(members)]
        self.client = {m: base + 10 * i for i, m in enumerate(self.members)}
        self.peer = {m: base + 10 * i + 1 for i, m in enumerate(self.members)}
        self.cluster = ",".join(f"{m}=http://127.0.0.1:{self.peer[m]}" for m in self.members)
        self.dirs = {m: os.path.join(WORK, f"etcd-{m}") for m in self.members}
        ETCDS.append(self)  # stopped at exit, whatever happened

    def endpoints(self):
        return ",".join(f"127.0.0.1:{self.client[m]}" for m in self.members)

    def start(self, member=None):
        for m in ([member] if member else self.members):
            log = open(os.path.join(WORK, f"etcd-{m}.log"), "a")
            p = subprocess.Popen(
                ["etcd", "--name", m, "--data-dir", self.dirs[m],
                 "--listen-client-urls", f"http://127.0.0.1:{self.client[m]}",
                 "--advertise-client-urls", f"http://127.0.0.1:{self.client[m]}",
                 "--listen-peer-urls", f"http://127.0.0.1:{self.peer[m]}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer[m]}",
                 "--initial-cluster", self.cluster, "--initial-cluster-state", "new",
                 "--heartbeat-interval", "50", "--election-timeout", "500"],
                stdout=log, stderr=log)
            self.procs[m] = p
            PROCS.append(p)
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.ctl("endpoint", "health", check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("etcd did not become healthy")

    def stop(self, member=None):
        for m in ([member] if member else list(self.procs)):
            p = self.procs.pop(m, None)
            if p:
                p.terminate()
                p.wait(timeout=10)

    def ctl(self, *args, check=True, endpoints=None, timeout=30):
        env = etcdctl_env()
        return subprocess.run(["etcdctl", "--endpoints", endpoints or self.endpoints(), *args],
                              capture_output=True, text=True, env=env, check=check, timeout=timeout)

    def leader(self):
        for m in self.procs:
            out = self.ctl("endpoint", "status", "-w", "fields", endpoints=f"127.0.0.1:{self.client[m]}",
                           check=False).stdout
            mid = lead = None
            for line in out.splitlines():
                if line.startswith('"MemberID"'):
                    mid = line.split(":")[1].strip()
                if line.startswith('"Leader"'):
                    lead = line.split(":")[1].strip()
            if mid and mid == lead:
                return m
        return None

    def keys(self, prefix):
        return [k for k in self.ctl("get", "--prefix", prefix, "--keys-only").stdout.split() if k]


# ------------------------------------------------------------------------------------ PostgreSQL

class Pg:
    def __init__(self, name, port, conf):
        self.data = os.path.join(WORK, name)
        self.port = port
        self.log = os.path.join(WORK, name + ".log")
        os.makedirs(self.data)
        if os.getuid() == 0:
            shutil.chown(self.data, "postgres", "postgres")
        as_pg([f"{PGBIN}/initdb", "-D", self.data, "-U", "postgres", "-A", "trust", "--no-sync"])
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(f"port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{WORK}'\n"
                    f"fsync = off\n{conf}\n")

    def start(self):
        as_pg([f"{PGBIN}/pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60", "start"])

    def stop(self, mode="fast"):
        t0 = time.time()
        as_pg([f"{PGBIN}/pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop"])
        return time.time() - t0

    def connect(self):
        c = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres")
        c.autocommit = True
        return c

    def pid(self):
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            return int(f.readline())


def sqlstate(cur, sql, params=None):
    try:
        cur.execute(sql, params)
        return "ok"
    except psycopg2.Error as e:
        return e.pgcode


def log_lines(pg, text):
    """The server log's lines that contain text (pg_fencing's rejection log, pg_fencing.log_rejections)."""
    with open(pg.log, errors="replace") as f:
        return [l.rstrip("\n") for l in f if text in l]


def worker_pid(pg):
    out = subprocess.run(["pgrep", "-P", str(pg.pid()), "-f", "pg_fencing etcd worker"],
                         capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


def setup_schema(cur):
    cur.execute("CREATE EXTENSION IF NOT EXISTS pg_fencing")
    cur.execute("DROP TABLE IF EXISTS orders_t")
    cur.execute("CREATE TABLE orders_t (id int PRIMARY KEY, v int)")
    cur.execute("SELECT fencing_protect('orders_t', 'orders')")


def protected_table(cur, table, resource):
    """A fresh table protected in resource mode, with one row written with token 1."""
    cur.execute(f"DROP TABLE IF EXISTS {table}")
    cur.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int)")
    cur.execute("SELECT fencing_protect(%s, %s)", (table, resource))
    cur.execute(f"BEGIN; SET LOCAL pg_fencing.token = '1'; INSERT INTO {table} VALUES (1, 0); COMMIT")


def high_water(cur, resource):
    cur.execute("SELECT fencing_high_water(%s)", (resource,))
    return cur.fetchone()[0] or 0


def lock_state(cur, name):
    cur.execute("SELECT state, token FROM fencing_locks WHERE lock = %s", (name,))
    return cur.fetchone()


# Timing the tests do not control (a loaded machine, issue 42): a check waits for the condition
# it needs with a generous bounded poll (LONG seconds, unless the check is about a bound), and a
# lock held by another holder is held until the test lets it go, never for a fixed time.
LONG = 30


class GatedHolder:
    """`etcdctl lock [--ttl TTL] LOCK` holding the lock until release(), so that what a check
    needs happens while it is held, however slow the machine is. (etcdctl does not pass its
    stdin on to the command: the command waits for a file to appear.)"""
    count = 0

    def __init__(self, etcd, lock, ttl=None):
        GatedHolder.count += 1
        self.gate = os.path.join(WORK, f"gate-{GatedHolder.count}")
        args = ["etcdctl", "--endpoints", etcd.endpoints(), "lock"] + ([f"--ttl={ttl}"] if ttl else [])
        self.p = subprocess.Popen(args + [lock, "--", "sh", "-c", 'echo $ETCD_LOCK_REV; while [ ! -e "$0" ]; do '
                                          'sleep 0.05; done', self.gate],
                                  stdout=subprocess.PIPE, text=True, env=etcdctl_env())
        PROCS.append(self.p)

    def token(self):
        """Waits until etcd granted the lock; its ETCD_LOCK_REV."""
        return int(self.p.stdout.readline())

    def release(self, timeout=LONG):
        """etcdctl unlocks once its command ends, and exits."""
        open(self.gate, "w").close()
        self.p.wait(timeout=timeout)


def in_thread(fn):
    """Runs fn() in a thread of its own; returns (thread, out), out then holding "state" ("ok" or
    the SQLSTATE it failed with), "value" and "end" (time.time() when it returned)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
            out["state"] = "ok"
        except psycopg2.Error as e:
            out["state"], out["message"] = e.pgcode, (e.pgerror or "").strip()
        out["end"] = time.time()
    th = threading.Thread(target=run)
    th.start()
    return th, out


def backend_pid(cur):
    cur.execute("SELECT pg_backend_pid()")
    return cur.fetchone()[0]


def wait_waiting(cur, pid, within=LONG):
    """Waits until backend pid runs a statement that waits (pg_stat_activity: active, with a
    wait event): the statement has started and reached its wait. True if it did in time."""
    def waiting():
        cur.execute("SELECT state = 'active' AND wait_event_type IS NOT NULL FROM pg_stat_activity WHERE pid = %s",
                    (pid,))
        r = cur.fetchone()
        return bool(r and r[0])
    return wait_for(waiting, within) is not None


def wait_setting(cur, name, value, within=LONG):
    """Waits until the session of cur sees setting name = value (after ALTER SYSTEM and
    pg_reload_conf(), a backend reads the file when the postmaster's SIGHUP reached it, at its
    next statement). True if it did in time."""
    def seen():
        cur.execute("SELECT current_setting(%s)", (name,))
        return cur.fetchone()[0] == value
    return wait_for(seen, within) is not None


def granted_ttl(etcd, lease_id):
    """The TTL etcd granted lease lease_id with (etcdctl lease timetolive), or None."""
    out = etcd.ctl("lease", "timetolive", format(int(lease_id), "x"), check=False).stdout
    m = re.search(r"granted with TTL\((\d+)s\)", out)
    return int(m.group(1)) if m else None


def wait_worker_ttl(pg, etcd, ttl, within=LONG):
    """Waits until the worker grants new sessions' leases with TTL ttl (after a reload of
    pg_fencing.lease_ttl: the worker reads it when it handles its SIGHUP): each try is a new
    session (a session keeps its lease) taking and releasing lock 'ttl-probe'. True if in time."""
    def probe():
        c = pg.connect()
        try:
            cur = c.cursor()
            cur.execute("SELECT fencing_acquire('ttl-probe')")
            lease = lock_lease(cur, "ttl-probe")
            cur.execute("SELECT fencing_release('ttl-probe')")
            return granted_ttl(etcd, lease) == ttl
        finally:
            c.close()
    return wait_for(probe, within, step=0.2) is not None


def wait_server_gone(pg, within=LONG):
    """After kill -9 of the postmaster: waits until no process of the server is left (its
    backends and workers notice the postmaster's death and exit; exited ones may linger as
    zombies). Found by what every PostgreSQL process has, its working directory, so that a child
    forked just before the kill is not missed. True if they are gone in time."""
    data = os.path.realpath(pg.data)

    def alive():
        left = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{d}/cwd") != data:
                    continue
                with open(f"/proc/{d}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        left.append(int(d))
            except OSError:
                pass
        return left
    return wait_for(lambda: not alive(), within, step=0.1) is not None


# ------------------------------------------------------------------------------------- scenarios

def scenarios_single(etcd, pg):
    c1 = pg.connect()
    cur = c1.cursor()
    setup_schema(cur)

    print("== interop with etcdctl lock")
    cur.execute("SELECT fencing_acquire('orders')")
    pg_token = cur.fetchone()[0]
    cur.execute("SHOW pg_fencing.token")
    ok(cur.fetchone()[0] == str(pg_token), "fencing_acquire sets the session's pg_fencing.token")
    ok(any(k.startswith("orders/") for k in etcd.keys("orders/")), "the lock key uses the concurrency-mutex layout orders/<lease>")
    env = etcdctl_env()
    other = subprocess.Popen(["etcdctl", "--endpoints", etcd.endpoints(), "lock", "orders", "--",
                              "sh", "-c", "echo $ETCD_LOCK_REV"], stdout=subprocess.PIPE, text=True, env=env)
    # Its key queued behind ours (two keys under orders/), it must still be waiting.
    queued = wait_for(lambda: len(etcd.keys("orders/")) == 2, LONG) is not None
    ok(queued and other.poll() is None, "etcdctl lock orders waits while the PostgreSQL session holds it")
    cur.execute("INSERT INTO orders_t VALUES (1, 1)")
    cur.execute("SELECT fencing_release('orders')")
    ok(cur.fetchone()[0] is True, "fencing_release returns true")
    out, _ = other.communicate(timeout=LONG)
    rev = int(out.strip() or 0)
    ok(rev > pg_token, f"etcdctl then gets a higher token ({rev} > {pg_token})")
    cur.execute("SELECT fencing_release('orders')")
    ok(cur.fetchone()[0] is False, "releasing a lock not held returns false")

    # etcdctl holds the lock until released: the session's request must wait in etcd's queue
    # (its key there), and get a higher token once etcdctl lets go.
    holder = GatedHolder(etcd, "orders")
    ext_rev = holder.token()
    th, out = in_thread(lambda: (cur.execute("SELECT fencing_acquire('orders', '60s')"), cur.fetchone()[0])[1])
    queued = wait_for(lambda: len(etcd.keys("orders/")) == 2, LONG) is not None
    time.sleep(0.5)   # the lock stays held: a request that did not wait would be done by now
    waiting = th.is_alive()
    holder.release()
    th.join(LONG)
    tok2 = out.get("value", 0)
    ok(queued and waiting and out.get("state") == "ok" and tok2 > ext_rev,
       f"fencing_acquire waits for etcdctl's holder (queued in etcd: {queued}, still waiting: {waiting}), "
       f"then gets a higher token ({tok2} > {ext_rev}; {out})")
    cur.execute("SET pg_fencing.token = %s", (str(tok2),))
    ok(sqlstate(cur, "UPDATE orders_t SET v = 2 WHERE id = 1") == "ok", "writes with the acquired token are accepted")
    cur.execute("SELECT fencing_release('orders')")

    print("== timeout, statement_timeout, cancel")
    holder = GatedHolder(etcd, "orders")
    holder.token()
    # (statement_timeout only keeps a timeout that does not work from hanging the test.)
    cur.execute("SET statement_timeout = '20s'")
    t0 = time.time()
    st = sqlstate(cur, "SELECT fencing_acquire('orders', '1s')")
    took = time.time() - t0
    ok(st == "55P03" and took >= 0.9,
       f"fencing_acquire times out with 55P03 after its timeout, the lock still held ({st}, {took:.1f}s)")
    cur.execute("SET statement_timeout = '500ms'")
    st = sqlstate(cur, "SELECT fencing_acquire('orders', '10s')")
    reset_statement_timeout(cur)
    ok(st == "57014", f"statement_timeout interrupts fencing_acquire ({st})")
    left = wait_for(lambda: (cur.execute("SELECT count(*) FROM fencing_locks"), cur.fetchone()[0] == 0)[1], LONG)
    ok(left is not None, "nothing is left in fencing_locks after a timeout or cancel")
    holder.release()
    ok(wait_for(lambda: etcd.keys("orders/") == [], LONG) is not None,
       f"no waiter key of ours is left in etcd ({etcd.keys('orders/')})")

    print("== lease revoked from outside")
    cur.execute("SELECT fencing_acquire('orders')")
    tok = cur.fetchone()[0]
    cur.execute("SELECT lease_id FROM fencing_locks WHERE lock = 'orders'")
    lease = cur.fetchone()[0]
    etcd.ctl("lease", "revoke", format(lease, "x"))
    # Noticed from etcd (the watch on the lock's key, or the next keepalive round every TTL/3),
    # not only when the lease's TTL would have run out on the worker's clock.
    t0 = time.time()
    wait_for(lambda: (lock_state(cur, "orders") or ("",))[0] == "lost", LONG, step=0.02)
    noticed = time.time() - t0
    state = lock_state(cur, "orders")
    ok(state and state[0] == "lost" and noticed < TTL,
       f"fencing_locks shows lost after the revoke, before the lease's TTL could run out ({state}, after "
       f"{noticed:.2f}s; TTL {TTL}s)")
    st = sqlstate(cur, "UPDATE orders_t SET v = 3 WHERE id = 1")
    ok(st == "FT003", f"a write with the lost lock's token gets FT003 ({st})")
    other = pg.connect().cursor()
    # One transaction: SET and the write (pg_fencing.token_scope = transaction, the default).
    st = sqlstate(other, "SET pg_fencing.token = '%d'; UPDATE orders_t SET v = 3 WHERE id = 1" % tok)
    ok(st == "FT003", f"another session carrying the lost token gets FT003 too ({st})")
    other.connection.close()
    lines = log_lines(pg, f'pg_fencing refused a write (FT003): fencing token {tok} of lock "orders", which was lost')
    ok(len(lines) == 2 and all("backend pid" in l and "client 127.0.0.1:" in l for l in lines),
       f"each FT003 is logged once with its origin ({len(lines)} lines: {lines[-1] if lines else ''})")
    del c1.notices[:]
    cur.execute("SELECT fencing_release('orders')")
    released = cur.fetchone()[0]
    warned = [n.strip() for n in c1.notices if 'lock "orders"' in n and "had already been lost" in n]
    ok(released is False and len(warned) == 1,
       f"fencing_release of the lost lock returns false with a WARNING saying why ({released}, {warned})")
    ok(lock_state(cur, "orders") is None, "and the lost lock is forgotten")

    print("== a request whose lease is revoked while it waits in the queue")
    holder = GatedHolder(etcd, "queued", 10)
    holder.token()
    waiter = pg.connect()
    th, outcome = in_thread(lambda: waiter.cursor().execute("SELECT fencing_acquire('queued', '60s')"))
    # Revoked once the request's key is in etcd's queue behind etcdctl's.
    queued = wait_for(lambda: len(etcd.keys("queued/")) == 2, LONG) is not None
    cur.execute("SELECT lease_id, state FROM fencing_locks WHERE lock = 'queued'")
    row = cur.fetchone()
    ok(queued and row is not None and row[0] is not None,
       f"the request waits in etcd's queue under its own lease ({row}, keys {etcd.keys('queued/')})")
    # Give the request time to be waiting in etcd's Lock service (it queues right after its key
    # is in), so that the revoke finds it there: etcd 3.4 keeps such a request waiting for the
    # holder even though its key is gone.
    time.sleep(0.5)
    if row and row[0]:
        etcd.ctl("lease", "revoke", format(row[0], "x"))
    revoked_at = time.time()
    # A bound: the request fails while etcdctl still holds the lock, within two TTLs of the revoke
    # (the keepalive finds the lease gone within TTL/3), not when the holder lets go.
    th.join(2 * TTL)
    held_meanwhile = holder.p.poll() is None
    holder.release()
    th.join(LONG)
    msg = outcome.get("message", "")
    took = outcome.get("end", float("inf")) - revoked_at
    ok(outcome.get("state") == "FT003" and "was not granted" in msg and "token 0" not in msg
       and took < 2 * TTL and held_meanwhile,
       f"fencing_acquire fails with FT003 within two TTLs of the revoke, while the holder still "
       f"holds the lock: not granted, no token issued ({took:.1f}s, holder still held it: "
       f"{held_meanwhile}; {outcome})")
    waiter.close()

    print("== waits longer than 5 s, cancelled requests leave no slot behind")
    holder = GatedHolder(etcd, "longwait")
    holder.token()
    th, out = in_thread(lambda: cur.execute("SELECT fencing_acquire('longwait', '60s')"))
    queued = wait_for(lambda: len(etcd.keys("longwait/")) == 2, LONG) is not None
    # The holder lets go 6 s after the request was in the queue: it has waited longer than 5 s.
    queued_at = time.time()
    while th.is_alive() and time.time() - queued_at < 6:
        time.sleep(0.1)
    waiting = th.is_alive()
    holder.release()
    th.join(LONG)
    ok(queued and waiting and out.get("state") == "ok",
       f"fencing_acquire waits more than 5 s for the holder, then gets the lock (queued: {queued}, "
       f"still waiting after 6 s: {waiting}; {out})")
    cur.execute("SELECT fencing_release('longwait')")
    # A '0s' request finds the lock free: it may be granted (within the millisecond its timeout is
    # rounded to), and then the lock is the session's; it is released here, like the ones below
    # (what must not happen is a lock left behind by a request that failed).
    granted = 0
    for _ in range(100):
        if sqlstate(cur, "SELECT fencing_acquire('z', '0s')") == "ok":
            granted += 1
            cur.execute("SELECT fencing_release('z')")
    for _ in range(50):
        cur.execute("SET statement_timeout = '1ms'")
        st = sqlstate(cur, "SELECT fencing_acquire('z', '10s')")
        reset_statement_timeout(cur)
        if st == "ok":
            granted += 1
            cur.execute("SELECT fencing_release('z')")
    left = wait_for(lambda: (cur.execute("SELECT count(*) FROM fencing_locks"), cur.fetchone()[0] == 0)[1], LONG)
    ok(left is not None, f"150 timed-out or cancelled requests leave no slot behind ({granted} granted in time "
                         f"and released)")
    st = sqlstate(cur, "SELECT fencing_acquire('z', '10s')")
    ok(st == "ok", f"and the next acquire works ({st})")
    cur.execute("SELECT fencing_release('z')")
    cur.execute("ALTER SYSTEM SET pg_fencing.lock_prefix = %s", ("p" * 300,))
    cur.execute("SELECT pg_reload_conf()")
    seen = wait_setting(cur, "pg_fencing.lock_prefix", "p" * 300)
    st = sqlstate(cur, "SELECT fencing_acquire('name')")
    ok(seen and st == "22023", f"a prefix and name too long for the key are refused, not cut ({st})")
    cur.execute("ALTER SYSTEM RESET pg_fencing.lock_prefix")
    cur.execute("SELECT pg_reload_conf()")
    ok(wait_setting(cur, "pg_fencing.lock_prefix", ""), "the prefix is reset")

    print("== worker stopped with SIGTERM")
    cur.execute("SELECT fencing_acquire('orders')")
    wpid = worker_pid(pg)
    os.kill(wpid, signal.SIGTERM)
    # The stopping worker makes its locks lost first (nobody keeps their leases alive any more):
    # by the time it has exited, writes with their tokens fail, and the lock says why.
    gone = wait_for(lambda: worker_pid(pg) != wpid, LONG) is not None
    st = sqlstate(cur, "UPDATE orders_t SET v = 6 WHERE id = 1")
    ok(gone and st == "FT003", f"writes with its locks' tokens get FT003 once it stopped ({st})")
    ok(wait_for(lambda: worker_pid(pg) not in (None, wpid), LONG, step=0.2) is not None,
       "the postmaster restarts the worker")
    del c1.notices[:]
    cur.execute("SELECT fencing_release('orders')")
    warned = [n.strip() for n in c1.notices if "had already been lost" in n]
    ok(len(warned) == 1 and "the pg_fencing worker stopped" in warned[0],
       f"the lock was lost because the worker stopped, not when its lease ran out ({warned})")
    st = sqlstate(cur, "SELECT fencing_acquire('orders', '10s')")
    ok(st == "ok", f"the restarted worker takes locks ({st})")
    cur.execute("SELECT fencing_release('orders')")

    print("== worker frozen (SIGSTOP) past the TTL")
    cur.execute("SELECT fencing_acquire('orders')")
    wpid = worker_pid(pg)
    ok(wpid is not None, f"found the worker process ({wpid})")
    os.kill(wpid, signal.SIGSTOP)
    try:
        time.sleep(TTL + 1)
        st = sqlstate(cur, "UPDATE orders_t SET v = 4 WHERE id = 1")
        ok(st == "FT003", f"with the worker frozen past the TTL, a write with its token gets FT003 ({st})")
        state = lock_state(cur, "orders")
        ok(state and state[0] == "lost", f"fencing_locks shows lost ({state})")
    finally:
        os.kill(wpid, signal.SIGCONT)
    cur.execute("SELECT fencing_release('orders')")
    cur.execute("SELECT fencing_acquire('orders')")
    ok(sqlstate(cur, "UPDATE orders_t SET v = 5 WHERE id = 1") == "ok", "after SIGCONT a new lock works")
    cur.execute("SELECT fencing_release('orders')")

    print("== configuration reload (SIGHUP)")
    cur.execute("ALTER SYSTEM SET pg_fencing.lock_prefix = 'pgf/'")
    cur.execute("ALTER SYSTEM SET pg_fencing.lease_ttl = 7")
    cur.execute("SELECT pg_reload_conf()")
    # A new session uses the new prefix once the postmaster re-read the file, and its lease has
    # the new TTL once the worker handled its SIGHUP: each try is a new session (a session keeps
    # the lease it has), until both show.
    seen = {}

    def new_session_lock():
        c3 = pg.connect()
        try:
            cur3 = c3.cursor()
            cur3.execute("SELECT fencing_acquire('orders')")
            cur3.execute("SELECT key, ttl_left FROM fencing_locks WHERE lock = 'orders'")
            seen["key"], seen["ttl_left"] = cur3.fetchone()
            seen["keys"] = etcd.keys("pgf/orders/")
            cur3.execute("SELECT fencing_release('orders')")
            return seen["key"].startswith("pgf/") and seen["ttl_left"] > TTL
        finally:
            c3.close()
    wait_for(new_session_lock, LONG, step=0.2)
    ok(seen.get("key", "").startswith("pgf/orders/") and bool(seen.get("keys")),
       f"the new lock_prefix is used ({seen.get('key')}, {seen.get('keys')})")
    ok((seen.get("ttl_left") or 0) > TTL, f"the new lease_ttl is used ({seen.get('ttl_left')}s left)")
    cur.execute("ALTER SYSTEM RESET pg_fencing.lock_prefix")
    cur.execute("ALTER SYSTEM RESET pg_fencing.lease_ttl")
    cur.execute("SELECT pg_reload_conf()")
    ok(wait_setting(cur, "pg_fencing.lock_prefix", "") and wait_worker_ttl(pg, etcd, TTL),
       f"after the reset the prefix is empty again and the worker grants {TTL} s leases")

    print("== session exit releases")
    c2 = pg.connect()
    c2.cursor().execute("SELECT fencing_acquire('orders')")
    c2.close()
    ok(wait_for(lambda: etcd.keys("orders/") == [], LONG, step=0.1) is not None,
       "the lock key is deleted when the holding session ends")
    c1.close()


def reset_statement_timeout(cur):
    """RESET statement_timeout, which a timeout of a few milliseconds can cancel itself."""
    for _ in range(100):
        if sqlstate(cur, "RESET statement_timeout") == "ok":
            return
    raise RuntimeError("could not reset statement_timeout")


def txn_state(cur, sql):
    """The SQLSTATE of a transaction script ("ok" if it committed); a failed one is rolled back."""
    st = sqlstate(cur, sql)
    if st != "ok":
        cur.execute("ROLLBACK")
    return st


def scenario_tombstone_retention(etcd, pg):
    """The tombstone pruner (pg_fencing.tombstone_prune_database, interval 1 s) applies
    fencing_tombstone_retention: tombstones of keys deleted with a lock's token are pruned once
    the retention has passed the sampled etcd revision, the floor refuses the old holder's stale
    re-insert of a pruned key, a lock granted later gets a token above the floor, and a holder
    that keeps its lock longer than the retention is refused for new keys (as documented)."""
    print("tombstone retention (pruner worker)")
    # Error exits of the pruner from here on (earlier scenarios restart and stop the server).
    exits_before = len([l for l in log_lines(pg, "pg_fencing tombstone pruner") if "exited with exit code" in l])
    # A protection row whose table is gone without the drop event trigger seeing it (a drop in
    # single-user mode, where event triggers do not fire; temporary tables, which used to leave
    # such rows at session end, can no longer be protected), with a retention and a tombstone:
    # it must not stop the pruner.
    c = pg.connect()
    cur = c.cursor()
    cur.execute("SELECT coalesce(max(oid::int8), 0) + 100000 FROM pg_class")
    gone = cur.fetchone()[0]
    cur.execute(f"INSERT INTO _pg_fencing.protected_table (relid, resource, token_column, tombstone_retention) "
                f"VALUES ({gone}::oid::regclass, NULL, 'fence_token', '1 second') RETURNING id")
    gone_id = cur.fetchone()[0]
    cur.execute(f"INSERT INTO _pg_fencing.row_tombstone (protection_id, key, high_water) VALUES ({gone_id}, '(1)', 1)")
    cur.execute("DROP TABLE IF EXISTS ret_jobs")
    cur.execute("CREATE TABLE ret_jobs (id int PRIMARY KEY, v text)")
    cur.execute("SELECT fencing_protect('ret_jobs')")
    cur.execute("SELECT fencing_tombstone_retention('ret_jobs', '2 seconds')")
    cur.execute("SELECT tombstone_retention::text FROM fencing_protected_tables WHERE relation = 'ret_jobs'::regclass")
    ok(cur.fetchone()[0] == "00:00:02", "fencing_tombstone_retention is shown in fencing_protected_tables")
    cur.execute("SELECT fencing_acquire('ret-old')")
    old = cur.fetchone()[0]
    cur.execute("SELECT fencing_acquire('ret-long')")
    long_token = cur.fetchone()[0]
    cur.execute(f"BEGIN; SET LOCAL pg_fencing.token = '{old}'; "
                "INSERT INTO ret_jobs SELECT g, 'job' FROM generate_series(1, 3) g; DELETE FROM ret_jobs; COMMIT")
    cur.execute("SELECT fencing_release('ret-old')")

    def pruned():
        cur.execute("SELECT tombstones, tombstone_floor FROM fencing_protected_tables "
                    "WHERE relation = 'ret_jobs'::regclass")
        n, floor = cur.fetchone()
        return n == 0 and floor is not None and floor >= old
    took = wait_for(pruned, 30)
    ok(took is not None, "the pruner pruned the tombstones once the retention had passed their token",
       f"(tombstones/floor: {cur.fetchone() if took is None else ''})")
    cur.execute("SELECT count(*) FROM _pg_fencing.revision_sample")
    ok(cur.fetchone()[0] > 0, "the pruner samples etcd revisions into _pg_fencing.revision_sample")
    st = txn_state(cur, f"BEGIN; SET LOCAL pg_fencing.token = '{old}'; INSERT INTO ret_jobs VALUES (1, 'zombie'); COMMIT")
    ok(st == "FT001", "the old holder's re-insert of a pruned key is refused by the floor", st)
    cur.execute("SELECT fencing_acquire('ret-new')")
    new = cur.fetchone()[0]
    cur.execute("SELECT tombstone_floor FROM fencing_protected_tables WHERE relation = 'ret_jobs'::regclass")
    floor = cur.fetchone()[0]
    ok(new > floor, "a lock granted after the prune has a token above the floor", f"({new} vs {floor})")
    st = txn_state(cur, f"BEGIN; SET LOCAL pg_fencing.token = '{new}'; INSERT INTO ret_jobs VALUES (1, 'new'); COMMIT")
    ok(st == "ok", "the new holder inserts the key", st)
    cur.execute("SELECT fencing_release('ret-new')")
    # A holder that kept its lock past the retention: once the floor passes its token, it may
    # not create keys any more (the documented cost of a retention shorter than a hold).
    def floor_past_long():
        cur.execute("SELECT coalesce(tombstone_floor, 0) FROM fencing_protected_tables WHERE relation = 'ret_jobs'::regclass")
        return cur.fetchone()[0] > long_token
    # Deleting a key with a newer token makes a tombstone the pruner must remove, above long_token.
    cur.execute("SELECT fencing_acquire('ret-newer')")
    newer = cur.fetchone()[0]
    cur.execute(f"BEGIN; SET LOCAL pg_fencing.token = '{newer}'; DELETE FROM ret_jobs WHERE id = 1; COMMIT")
    cur.execute("SELECT fencing_release('ret-newer')")
    ok(wait_for(floor_past_long, 30) is not None, "the floor passes a lock held longer than the retention")
    st = txn_state(cur, f"BEGIN; SET LOCAL pg_fencing.token = '{long_token}'; INSERT INTO ret_jobs VALUES (50, 'late'); COMMIT")
    ok(st == "FT001", "a holder past the retention is refused for a new key", st)
    cur.execute("SELECT fencing_release('ret-long')")
    crashes = [l for l in log_lines(pg, "pg_fencing tombstone pruner") if "exited with exit code" in l][exits_before:]
    ok(not crashes, "the pruner ran without an error exit (a leftover protection of a table that is gone)",
       crashes[:2])
    # pg_terminate_backend ends the pruner (it takes SIGTERM as PostgreSQL's workers do) and the
    # postmaster starts it again after the interval.
    def pruner_pid():
        cur.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_fencing tombstone pruner'")
        r = cur.fetchone()
        return r[0] if r else None
    first_pid = pruner_pid()
    cur.execute("SELECT pg_terminate_backend(%s)", (first_pid,))
    ok(first_pid is not None and wait_for(lambda: pruner_pid() not in (None, first_pid), LONG) is not None,
       "pg_terminate_backend ends the pruner and it is started again", f"(pid {first_pid} -> {pruner_pid()})")
    cur.execute("SELECT fencing_tombstone_retention('ret_jobs', NULL)")
    cur.execute("DROP TABLE ret_jobs")
    cur.execute(f"DELETE FROM _pg_fencing.row_tombstone WHERE protection_id = {gone_id}")
    cur.execute(f"DELETE FROM _pg_fencing.protected_table WHERE id = {gone_id}")
    c.close()


def scenario_cancel_storm(etcd, pg):
    """Requests that time out or are cancelled right after the worker took them, over and over:
    the worker once read a slot's generation before its state, so a slot freed and taken again in
    between went to the etcd thread under the old request's generation, and that request's lease
    was neither kept alive nor cleaned up (the lock could even end up held by a request that had
    been cancelled). Every round must leave no slot behind, and a normal acquire must work."""
    print("== many requests cancelled or timed out as soon as the worker takes them")
    c = pg.connect()
    cur = c.cursor()
    rng = random.Random(7)
    bad = []
    granted = 0
    for rnd in range(8):
        for _ in range(60):
            # A '0s' request may still be granted (the lock is free and etcd answers within the
            # millisecond tokio's timer rounds it to): the session's, released like the others.
            if sqlstate(cur, "SELECT fencing_acquire('storm', '0s')") == "ok":
                cur.execute("SELECT fencing_release('storm')")
        for _ in range(40):
            cur.execute(f"SET statement_timeout = '{rng.randint(1, 4)}ms'")
            st = sqlstate(cur, "SELECT fencing_acquire('storm', '10s')")
            reset_statement_timeout(cur)
            if st == "ok":
                # Granted in time (the lock is free): the session's, released; a request that
                # failed, even one granted a moment before its statement was cancelled, must
                # leave nothing behind.
                granted += 1
                cur.execute("SELECT fencing_release('storm')")
        left = wait_for(lambda: (cur.execute("SELECT count(*) FROM fencing_locks"), cur.fetchone()[0] == 0)[1], LONG)
        st = sqlstate(cur, "SELECT fencing_acquire('storm', '5s')")
        if st == "ok":
            cur.execute("SELECT fencing_release('storm')")
            released = cur.fetchone()[0]
        else:
            released = None
        if left is None or st != "ok" or released is not True:
            cur.execute("SELECT lock, state FROM fencing_locks")
            bad.append((rnd, st, released, cur.fetchall()))
    ok(not bad, f"8 rounds of 100 cancelled requests each leave no slot behind, and the next acquire works "
                f"({granted} of 320 granted in time and released; {bad})")
    ok(wait_for(lambda: etcd.keys("storm/") == [], LONG) is not None, f"and no key of theirs is left in etcd ({etcd.keys('storm/')})")
    c.close()


def scenario_etcd_down(etcd, pg):
    print("== etcd down when PostgreSQL starts")
    pg.stop()
    etcd.stop()
    pg.start()
    c = pg.connect()
    cur = c.cursor()
    cur.execute("SELECT fencing_high_water('orders')")
    hw = cur.fetchone()[0]
    ok(hw is not None, "the server serves without etcd")
    st = sqlstate(cur, f"BEGIN; SET LOCAL pg_fencing.token = '{hw - 1}'; UPDATE orders_t SET v = 9; COMMIT")
    cur.execute("ROLLBACK") if st != "ok" else None
    ok(st == "FT001", f"stored high-water marks are still enforced ({st})")
    # FT005 (etcd unreachable), not the timeout's 55P03: the timeout is long, so that a slow
    # machine cannot turn one into the other.
    t0 = time.time()
    st = sqlstate(cur, "SELECT fencing_acquire('orders', '20s')")
    ok(st == "FT005", f"fencing_acquire fails with FT005 ({st}, {time.time() - t0:.1f}s)")
    etcd.start()
    deadline = time.time() + 60
    st = None
    while time.time() < deadline:
        st = sqlstate(cur, "SELECT fencing_acquire('orders', '5s')")
        if st == "ok":
            break
        time.sleep(0.5)
    ok(st == "ok", f"after etcd comes up the worker reconnects without a restart ({st})")
    cur.execute("SELECT fencing_release('orders')")

    print("== pg_ctl stop -m fast is quick")
    # Measured by the server's own log, without the time sudo and pg_ctl take to start and to
    # notice the end: the worker gives the etcd thread 700 ms at most to revoke its leases.
    cur.execute("SELECT fencing_acquire('orders')")
    c.close()
    took = pg.stop()
    server = server_stop_seconds(pg)
    ok(server is not None and server < 2.5, f"stop with etcd reachable took {server}s ({took:.1f}s with pg_ctl)")
    etcd.stop()
    pg.start()
    took = pg.stop()
    server = server_stop_seconds(pg)
    ok(server is not None and server < 2.5, f"stop with etcd unreachable took {server}s ({took:.1f}s with pg_ctl)")
    etcd.start()
    pg.start()


def server_stop_seconds(pg):
    """How long the server's last fast shutdown took by its log (log_line_prefix's %m, the
    default): from "received fast shutdown request" to "database system is shut down"."""
    start = end = None
    with open(pg.log, errors="replace") as f:
        for line in f:
            if "received fast shutdown request" in line:
                start, end = line, None
            elif "database system is shut down" in line and start:
                end = line
    if not (start and end):
        return None

    def at(line):
        return datetime.datetime.strptime(" ".join(line.split()[:2]), "%Y-%m-%d %H:%M:%S.%f")
    return round((at(end) - at(start)).total_seconds(), 3)


def scenario_kill9(etcd, pg):
    print("== kill -9 of the postmaster (and of the worker, as in a machine crash)")
    c = pg.connect()
    cur = c.cursor()
    cur.execute("SELECT fencing_acquire('orders')")
    ttl = granted_ttl(etcd, lock_lease(cur, "orders"))
    pid = pg.pid()
    wpid = worker_pid(pg)
    ok(bool(etcd.keys("orders/")) and ttl == TTL, f"the lock key exists before the crash, its lease's TTL {ttl} s")
    # Without the worker, nothing revokes the lease or keeps it alive: etcd must expire it, a
    # TTL after the last keepalive (TTL + TTL/3 at most, and etcd checks expiry every 500 ms;
    # bounded here by 3 TTLs + 1 s, so that a loaded machine's etcd is not held to the moment).
    os.kill(wpid, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)
    gone = wait_for(lambda: not etcd.keys("orders/"), LONG, step=0.1)
    ok(gone is not None and gone <= 3 * TTL + 1,
       f"the worker's lock key disappears when its lease expires (after {gone}s, TTL {TTL}s)")
    # Restart once every process of the killed server has exited; the dead postmaster may linger
    # as a zombie, so its lock files would look live.
    ok(wait_server_gone(pg), "every process of the killed server exits")
    for f in (os.path.join(pg.data, "postmaster.pid"), os.path.join(WORK, f".s.PGSQL.{pg.port}.lock")):
        if os.path.exists(f):
            os.unlink(f)
    pg.start()


def etcdctl_holder(etcd, lock, ttl, hold_s):
    """`etcdctl lock --ttl TTL LOCK` holding for hold_s seconds; returns (process, token)."""
    env = etcdctl_env()
    p = subprocess.Popen(["etcdctl", "--endpoints", etcd.endpoints(), "lock", f"--ttl={ttl}", lock, "--",
                          "sh", "-c", f"echo $ETCD_LOCK_REV; sleep {hold_s}"],
                         stdout=subprocess.PIPE, text=True, env=env)
    PROCS.append(p)
    return p


def write_with(cur, table, token):
    st = sqlstate(cur, f"BEGIN; SET LOCAL pg_fencing.token = '{token}'; UPDATE {table} SET v = v + 1; COMMIT")
    if st != "ok":
        cur.execute("ROLLBACK")
    return st


def wait_for(pred, timeout, step=0.01):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return time.time() - t0
        time.sleep(step)
    return None


def scenario_watch(etcd, pg):
    print("== watched resource: a zombie is fenced off at the hand-over, before the new holder writes")
    c = pg.connect()
    cur = c.cursor()
    protected_table(cur, "jobs_t", "jobs")
    cur.execute("SELECT fencing_watch('jobs')")
    ok(wait_for(lambda: (cur.execute("SELECT status FROM fencing_watches WHERE resource = 'jobs'"),
                         cur.fetchone()[0].startswith("watching"))[1], LONG) is not None, "the worker watches lock 'jobs'")
    h1 = etcdctl_holder(etcd, "jobs", 2, 60)
    t1 = int(h1.stdout.readline())
    os.kill(h1.pid, signal.SIGSTOP)   # a long GC pause: its lease is no longer kept alive
    h2 = etcdctl_holder(etcd, "jobs", 10, 4)
    t2 = int(h2.stdout.readline())     # granted once holder 1's lease expired
    granted = time.time()

    def mark():
        return high_water(cur, "jobs")
    delay = wait_for(lambda: mark() > t1, LONG)
    ok(delay is not None and t1 < mark() <= t2,
       f"the mark moved to the hand-over revision {mark()} (holder 1 had {t1}, holder 2 has {t2}) "
       f"{(delay or 0) * 1000:.0f} ms after etcd granted holder 2, which has not written")
    os.kill(h1.pid, signal.SIGCONT)
    st = write_with(cur, "jobs_t", t1)
    ok(st == "FT001", f"holder 1 resumes and writes with its old token {t1}: FT001 ({st})")
    st = write_with(cur, "jobs_t", t2)
    ok(st == "ok", f"holder 2's token {t2} is accepted ({st})")
    h1.kill()
    h1.wait(timeout=10)
    h2.wait(timeout=10)

    print("== verify: a token etcd did not issue is refused (FT006) and moves no mark")
    cur.execute("SELECT fencing_watch('jobs', NULL, true)")
    wait_for(lambda: (cur.execute("SELECT view_age_ms FROM fencing_watches WHERE resource = 'jobs'"),
                      (cur.fetchone()[0] or 10**9) < 500)[1], LONG)
    rev = etcd_revision(etcd)
    before = mark()
    st = write_with(cur, "jobs_t", rev + 1000)
    ok(st == "FT006", f"a forged token {rev + 1000} above etcd's revision {rev}: FT006 ({st})")
    lines = log_lines(pg, f'pg_fencing refused a write (FT006): unverified fencing token {rev + 1000} for resource "jobs"')
    ok(len(lines) == 1, f"the FT006 is logged once ({lines[-1] if lines else 'no line'})")
    ok(mark() == before, f"the mark did not move ({mark()})")
    h3 = etcdctl_holder(etcd, "jobs", 10, 3)
    t3 = int(h3.stdout.readline())
    # A write a moment before the watch reports the grant waits for it, up to verify_max_lag;
    # this one may wait as long as a slow machine needs (the lag itself is checked below).
    cur.execute("SET pg_fencing.verify_max_lag = 10000")
    st = write_with(cur, "jobs_t", t3)
    ok(st == "ok", f"the current holder's token {t3} is verified and accepted ({st})")
    h3.wait(timeout=10)

    print("== verify: the worker frozen longer than pg_fencing.verify_max_lag")
    cur.execute("SET pg_fencing.verify_max_lag = 300")
    cur.execute("SELECT fencing_high_water('orders')")
    orders_token = (cur.fetchone()[0] or 0) + 1
    wpid = worker_pid(pg)
    os.kill(wpid, signal.SIGSTOP)
    try:
        time.sleep(1.0)
        st = write_with(cur, "jobs_t", t3)
        ok(st == "FT006", f"a verified write is refused while the worker's view is too old ({st})")
        st = write_with(cur, "orders_t", orders_token)
        ok(st == "ok", f"writes to an unverified resource keep working ({st})")
    finally:
        os.kill(wpid, signal.SIGCONT)
    ok(wait_for(lambda: write_with(cur, "jobs_t", t3) == "ok", LONG) is not None,
       "after SIGCONT verified writes are accepted again")
    cur.execute("RESET pg_fencing.verify_max_lag")

    print("== the watch survives etcd compaction and an etcd restart without missing a hand-over")
    cur.execute("SELECT fencing_watch('jobs')")
    ha = etcdctl_holder(etcd, "jobs", 10, 4)
    ta = int(ha.stdout.readline())
    etcd.ctl("compact", str(etcd_revision(etcd)))
    m = etcd.members[0]
    etcd.stop(m)
    etcd.start(m)
    hb = etcdctl_holder(etcd, "jobs", 10, 1)
    tb = int(hb.stdout.readline())
    delay = wait_for(lambda: mark() > ta, LONG)
    ok(delay is not None and ta < mark() <= tb,
       f"after compaction and restart the hand-over from {ta} to {tb} raised the mark to {mark()}")
    ha.wait(timeout=10)
    hb.wait(timeout=10)

    print("== fencing_reset and fencing_unwatch of a watched resource")
    cur.execute("SELECT fencing_reset('jobs', 5)")
    ok(mark() == 5, f"fencing_reset sets the hand-over revision too ({mark()})")
    hc = etcdctl_holder(etcd, "jobs", 10, 1)
    tc = int(hc.stdout.readline())
    ok(wait_for(lambda: mark() == tc, LONG) is not None, f"the next hand-over raises it again ({mark()} = {tc})")
    hc.wait(timeout=10)
    ok(sqlstate(cur, "SELECT fencing_unwatch('jobs')") == "ok", "fencing_unwatch")
    cur.execute("SELECT count(*) FROM fencing_watches")
    ok(cur.fetchone()[0] == 0, "no watch is left")
    ok(mark() == tc, f"the mark keeps the last hand-over revision after fencing_unwatch ({mark()})")
    # The watch is gone at once, so the stored mark must survive a crash even when the unwatch
    # committed asynchronously.
    cur.execute("SELECT fencing_watch('jobs')")
    hd = etcdctl_holder(etcd, "jobs", 10, 1)
    td = int(hd.stdout.readline())
    ok(wait_for(lambda: mark() >= td, LONG) is not None, f"the watch raised the mark to {mark()} ({td})")
    hd.wait(timeout=10)
    cur.execute("SET synchronous_commit = off")
    cur.execute("SELECT fencing_unwatch('jobs')")
    c.close()
    pg.stop("immediate")
    pg.start()
    c = pg.connect()
    cur = c.cursor()
    ok(mark() >= td, f"after an asynchronous fencing_unwatch and a crash the mark is still {mark()} (>= {td})")
    st = write_with(cur, "jobs_t", tc - 1)
    ok(st == "FT001", f"an older holder is still refused after fencing_unwatch ({st})")
    c.close()


def blocked_signals(pid, tid):
    """The set of signal numbers thread tid of process pid blocks (from /proc)."""
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        mask = int(next(l for l in f if l.startswith("SigBlk:")).split()[1], 16)
    return {n for n in range(1, 65) if mask & (1 << (n - 1))}


def scenario_worker_threads(pg):
    print("== the worker's etcd threads never run PostgreSQL's signal handlers")
    wpid = worker_pid(pg)
    tids = [int(t) for t in os.listdir(f"/proc/{wpid}/task") if int(t) != wpid]
    ok(len(tids) >= 1, f"the worker has its etcd thread(s) ({len(tids)})")
    needed = {signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2,
              signal.SIGALRM, signal.SIGCHLD}
    missing = {t: sorted(int(s) for s in needed - blocked_signals(wpid, t)) for t in tids}
    missing = {t: m for t, m in missing.items() if m}
    ok(not missing, "every thread but the worker's main thread blocks PostgreSQL's signals", f"(unblocked: {missing})")
    main_blocked = blocked_signals(wpid, wpid) & {int(signal.SIGTERM), int(signal.SIGHUP)}
    ok(not main_blocked, "the worker's main thread still takes SIGTERM and SIGHUP", f"(blocked: {main_blocked})")


def scenario_verify_wait(etcd, pg):
    print("== a write waiting for the watch (verify) honours cancel and postmaster death")
    c = pg.connect()
    cur = c.cursor()
    cur.execute("SELECT fencing_watch('jobs', NULL, true)")
    ok(wait_for(lambda: (cur.execute("SELECT view_age_ms FROM fencing_watches WHERE resource = 'jobs'"),
                         (cur.fetchone()[0] or 10**9) < 500)[1], LONG) is not None, "the verify watch is fresh")
    # A token above etcd's revision waits for the watch to catch up, up to verify_max_lag (60 s).
    token = etcd_revision(etcd) + 1000
    w = pg.connect()
    wcur = w.cursor()
    wcur.execute("SET pg_fencing.verify_max_lag = 60000")
    bpid = backend_pid(wcur)
    th, outcome = in_thread(lambda: write_with(wcur, "jobs_t", token))
    # Cancelled once it waits (a cancel that came before the statement would be lost).
    ok(wait_waiting(cur, bpid) and th.is_alive(), "the write waits for the watch")
    cancelled = time.time()
    cur.execute("SELECT pg_cancel_backend(%s)", (bpid,))
    th.join(LONG)
    after = outcome.get("end", float("inf")) - cancelled
    ok(not th.is_alive() and outcome.get("value") == "57014" and after < 10,
       f"pg_cancel_backend ends the wait at once (57014), not after verify_max_lag (60 s): "
       f"{outcome}, {after:.1f}s after the cancel")

    th, outcome = in_thread(lambda: sqlstate(
        wcur, f"BEGIN; SET LOCAL pg_fencing.token = '{token}'; UPDATE jobs_t SET v = v + 1; COMMIT"))
    ok(wait_waiting(cur, bpid) and th.is_alive(), "a second write waits for the watch")
    os.kill(pg.pid(), signal.SIGKILL)
    gone = wait_for(lambda: not os.path.exists(f"/proc/{bpid}"), LONG, step=0.05)
    ok(gone is not None and gone < 15,
       f"after kill -9 of the postmaster the waiting backend exits at once ({gone}s, verify_max_lag 60 s)")
    th.join(LONG)
    # Restart as in scenario_kill9, once the old server's processes are gone (they notice the
    # postmaster's death; the dead postmaster's lock files would look live).
    ok(wait_server_gone(pg), "every process of the killed server exits")
    for f in (os.path.join(pg.data, "postmaster.pid"), os.path.join(WORK, f".s.PGSQL.{pg.port}.lock")):
        if os.path.exists(f):
            os.unlink(f)
    pg.start()
    c = pg.connect()
    c.cursor().execute("SELECT fencing_unwatch('jobs')")
    c.close()


def scenario_state_lock(pg):
    print("== fencing_reset and fencing_unwatch at once: one lock order, no deadlock PostgreSQL cannot see")
    a = pg.connect()
    acur = a.cursor()
    b = pg.connect()
    bcur = b.cursor()
    bpid = backend_pid(bcur)
    o = pg.connect()    # looks at pg_stat_activity (a transaction keeps its first look)
    ocur = o.cursor()
    acur.execute("SELECT fencing_watch('jobs')")
    acur.execute("SELECT coalesce(fencing_high_water('jobs'), 0) + 1")
    t = acur.fetchone()[0]
    acur.execute("SELECT fencing_reset('jobs', %s)", (t,))   # a hand-over revision that unwatch stores
    # A holds the resource's lock (an advance in an open transaction); B unwatches (it needs that
    # lock and the watch state's file lock) and waits; then A resets (it needs both too). Taken in
    # the wrong order, B would hold the file lock while it waits, and A would wait for it until
    # B's lock_timeout (30 s) ended B's wait.
    acur.execute("BEGIN")
    acur.execute("SELECT fencing_advance('jobs', %s)", (t,))
    bcur.execute("SET lock_timeout = '30s'")
    th, out = in_thread(lambda: sqlstate(bcur, "SELECT fencing_unwatch('jobs')"))
    waiting = wait_waiting(ocur, bpid)
    t0 = time.time()
    st = sqlstate(acur, "SELECT fencing_reset('jobs', %s)", (t,))
    took = time.time() - t0
    acur.execute("COMMIT" if st == "ok" else "ROLLBACK")
    th.join(2 * LONG)
    ok(waiting and st == "ok" and took < 15,
       f"fencing_reset by the session holding the resource's lock goes through while fencing_unwatch waits "
       f"(B waiting: {waiting}; {st}, {took:.1f}s)")
    ok(out.get("value") == "ok", f"the waiting fencing_unwatch completes after that commit ({out})")

    print("== a wait for the watch state's file lock honours cancel")
    with open(os.path.join(pg.data, "pg_fencing_watches.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)   # as another process holding it for long would
        th, out = in_thread(lambda: sqlstate(bcur, "SELECT fencing_watch('jobs')"))
        # Cancelled once it waits (a cancel that came before the statement would be lost).
        ok(wait_waiting(ocur, bpid) and th.is_alive(), "fencing_watch waits while another process holds the file lock")
        cancelled = time.time()
        acur.execute("SELECT pg_cancel_backend(%s)", (bpid,))
        th.join(LONG)
        after = out.get("end", float("inf")) - cancelled
        ok(not th.is_alive() and out.get("value") == "57014" and after < 10,
           f"pg_cancel_backend ends the wait at once (57014): {out}, {after:.1f}s after the cancel")
        fcntl.flock(f, fcntl.LOCK_UN)
    th.join(LONG)
    acur.execute("SELECT count(*) FROM fencing_watches WHERE resource = 'jobs'")
    ok(acur.fetchone()[0] == 0, "no watch of 'jobs' is left")
    a.close()
    b.close()
    o.close()


def scenario_watch_gap(etcd, pg):
    print("== a hand-over while PostgreSQL is stopped still raises the mark (the watch replays history)")
    c = pg.connect()
    cur = c.cursor()
    protected_table(cur, "gap_t", "gap")
    cur.execute("SELECT fencing_watch('gap')")
    hz = etcdctl_holder(etcd, "gap", 10, 3)
    tz = int(hz.stdout.readline())

    def mark():
        return high_water(cur, "gap")
    ok(wait_for(lambda: mark() >= tz, LONG) is not None, f"holder Z's hand-over raised the mark to {mark()} (Z has {tz})")
    c.close()
    # The worker saves the hand-over revision in its state file (every 100 ms): stopped once it has.
    ok(wait_for(lambda: (state_file_handover(pg, "gap") or 0) >= tz, LONG) is not None,
       f"the state file has Z's hand-over ({state_file_handover(pg, 'gap')})")
    pg.stop()
    # While PostgreSQL is down: Z hands the lock to A, and A releases it again.
    hz.wait(timeout=10)
    ha = etcdctl_holder(etcd, "gap", 10, 1)
    ta = int(ha.stdout.readline())
    ha.wait(timeout=10)
    pg.start()
    c = pg.connect()
    cur = c.cursor()
    # At once, before anything waited for the watch: the write waits until the restarted watch
    # has replayed etcd's history (pg_fencing.watch_sync_timeout, here as long as a slow machine
    # may need), then meets A's hand-over.
    cur.execute("SET pg_fencing.watch_sync_timeout = 60000")
    st = write_with(cur, "gap_t", tz)
    ok(st == "FT001", f"zombie Z writes with its token {tz} right after the restart: FT001 ({st})")
    ok(wait_for(lambda: mark() >= ta, LONG) is not None,
       f"after the restart the mark is A's hand-over revision {mark()} (Z had {tz}, A {ta}; the lock is free now)")
    cur.execute("SELECT fencing_unwatch('gap')")
    c.close()


def state_file_handover(pg, resource):
    """The hand-over revision $PGDATA/pg_fencing_watches.state has for resource (its lines:
    database oid, resource, key prefix, verify, hand-over revision, ...), or None."""
    try:
        with open(os.path.join(pg.data, "pg_fencing_watches.state")) as f:
            for line in f:
                fields = line.rstrip("\n").split("\t")
                if len(fields) > 4 and fields[1] == resource:
                    return int(fields[4])
    except (OSError, ValueError):
        pass
    return None


def freeze_worker(pg, wpid, within=LONG):
    """SIGSTOP the worker, at a moment when it does not hold $PGDATA/pg_fencing_watches.lock (its
    etcd thread saves the state file under it, and a commit that changes a watch takes it): tried
    again until then. True once every thread of the worker is stopped and the lock is free."""
    path = os.path.join(pg.data, "pg_fencing_watches.lock")

    def stopped():
        try:
            return all(open(f"/proc/{wpid}/task/{t}/stat").read().rsplit(")", 1)[1].split()[0] == "T"
                       for t in os.listdir(f"/proc/{wpid}/task"))
        except OSError:
            return False
    deadline = time.time() + within
    while time.time() < deadline:
        os.kill(wpid, signal.SIGSTOP)
        if wait_for(stopped, LONG) is not None:
            with open(path, "a") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(f, fcntl.LOCK_UN)
                    return True
                except BlockingIOError:
                    pass
        os.kill(wpid, signal.SIGCONT)
        time.sleep(0.05)
    return False


def scenario_watch_txn(etcd, pg):
    print("== fencing_watch / fencing_unwatch are transactional; a new watch admits no write before it read etcd")
    c = pg.connect()
    cur = c.cursor()
    o = pg.connect()
    ocur = o.cursor()
    protected_table(cur, "txn_t", "txn")

    def listed(cur_=ocur):
        cur_.execute("SELECT count(*) FROM fencing_watches WHERE resource = 'txn'")
        return cur_.fetchone()[0]

    def rows():
        ocur.execute("SELECT count(*) FROM _pg_fencing.watch WHERE resource = 'txn'")
        return ocur.fetchone()[0]
    cur.execute("BEGIN")
    cur.execute("SELECT fencing_watch('txn')")
    ok(listed() == 0 and rows() == 0, "an uncommitted fencing_watch is not running for other sessions")
    cur.execute("ROLLBACK")
    ok(listed() == 0 and rows() == 0, "a rolled-back fencing_watch leaves no watch and no row")
    # "Before the watch read etcd" for certain, however quick the worker is: it is frozen from
    # before the commit until after the write (the worker's etcd thread runs the watch).
    wpid = worker_pid(pg)
    frozen = freeze_worker(pg, wpid)
    try:
        cur.execute("BEGIN")
        cur.execute("SELECT fencing_watch('txn')")
        cur.execute("COMMIT")
        cur.execute("SET pg_fencing.watch_sync_timeout = 0")
        st = write_with(cur, "txn_t", 10**6)
    finally:
        os.kill(wpid, signal.SIGCONT)
    ok(frozen and st == "FT005",
       f"a write right after the commit, before the watch read etcd, with watch_sync_timeout = 0: FT005 ({st})")
    cur.execute("RESET pg_fencing.watch_sync_timeout")
    ok(listed() == 1 and rows() == 1, "committed: the watch runs and its row exists")
    ok(write_with(cur, "txn_t", 10**6) == "ok", "with the default watch_sync_timeout the write waits for the watch and passes")
    cur.execute("BEGIN")
    cur.execute("SELECT fencing_unwatch('txn')")
    ok(listed() == 1, "an uncommitted fencing_unwatch leaves the watch running")
    cur.execute("ROLLBACK")
    ok(listed() == 1 and rows() == 1, "a rolled-back fencing_unwatch leaves the watch and its row")
    cur.execute("BEGIN")
    cur.execute("SAVEPOINT s")
    cur.execute("SELECT fencing_unwatch('txn')")
    cur.execute("ROLLBACK TO SAVEPOINT s")
    cur.execute("COMMIT")
    ok(listed() == 1, "an unwatch rolled back to a savepoint leaves the watch running")
    cur.execute("BEGIN")
    cur.execute("SELECT fencing_unwatch('txn')")
    st = sqlstate(cur, "PREPARE TRANSACTION 'w'")
    ok(st == "0A000", f"PREPARE TRANSACTION after fencing_unwatch: 0A000 ({st})")
    cur.execute("ROLLBACK")
    ok(listed() == 1, "still watched after the refused PREPARE")
    cur.execute("SELECT fencing_unwatch('txn'), fencing_unwatch('txn')")
    ok(cur.fetchone() == (True, False), "fencing_unwatch twice in one statement: true, then false")
    ok(listed() == 0 and rows() == 0, "committed unwatch: no watch, no row")
    c.close()
    o.close()


def ssi_commit_fails(pg, work):
    """Run `work(cur)` in a SERIALIZABLE transaction whose COMMIT then fails (40001: a
    read/write dependency cycle with another transaction that commits first), after the
    PRE_COMMIT callbacks ran. Returns the SQLSTATE of that COMMIT."""
    a, b = pg.connect(), pg.connect()
    ca, cb = a.cursor(), b.cursor()
    ca.execute("CREATE TABLE IF NOT EXISTS ssi_1 (x int); CREATE TABLE IF NOT EXISTS ssi_2 (x int)")
    ca.execute("BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT count(*) FROM ssi_1")
    cb.execute("BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT count(*) FROM ssi_2")
    ca.execute("INSERT INTO ssi_2 VALUES (1)")
    cb.execute("INSERT INTO ssi_1 VALUES (1)")
    work(cb)
    ca.execute("COMMIT")
    st = sqlstate(cb, "COMMIT")
    a.close()
    b.close()
    return st


def scenario_watch_commit_fails(etcd, pg):
    print("== a commit that fails after fencing_unwatch / fencing_watch ran their pre-commit part changes no watch")
    c = pg.connect()
    cur = c.cursor()
    protected_table(cur, "cf_t", "cf")
    cur.execute("SELECT fencing_watch('cf')")
    for i in range(20):   # etcd's revision well above the stored mark (1)
        etcd.ctl("put", f"cf_pad/{i}", "x")
    hz = GatedHolder(etcd, "cf", 10)   # holds the lock until the end of the scenario
    tz = hz.token()

    def handover():
        cur.execute("SELECT handover_revision FROM fencing_watches WHERE resource = 'cf'")
        r = cur.fetchone()
        return r[0] if r else None
    ok(wait_for(lambda: handover() == tz, LONG) is not None, f"the watch saw holder Z's grant ({handover()}, Z has {tz})")
    # This session has looked at the watches already (as every session that wrote does).
    st = ssi_commit_fails(pg, lambda k: k.execute("SELECT fencing_unwatch('cf')"))
    ok(st == "40001", f"the unwatching transaction's COMMIT fails with a serialization failure ({st})")
    ok(handover() == tz, f"the watch is still listed with its hand-over revision ({handover()})")
    st = write_with(cur, "cf_t", tz - 1)
    ok(st == "FT001", f"an older holder's write (token {tz - 1}) after the failed unwatch: FT001 ({st})")
    ok(write_with(cur, "cf_t", tz) == "ok", "Z's own write passes (the resumed watch has read etcd again)")
    cur.execute("SELECT count(*) FROM _pg_fencing.watch WHERE resource = 'cf'")
    ok(cur.fetchone()[0] == 1, "the registration row is still there")
    # A new registration whose commit fails is not left running.
    st = ssi_commit_fails(pg, lambda k: k.execute("SELECT fencing_watch('cf_new')"))
    cur.execute("SELECT count(*) FROM fencing_watches WHERE resource = 'cf_new'")
    n = cur.fetchone()[0]
    ok(st == "40001" and n == 0, f"a fencing_watch whose COMMIT failed ({st}) leaves no watch ({n} listed)")
    # A changed registration whose commit fails keeps the lock it had.
    st = ssi_commit_fails(pg, lambda k: k.execute("SELECT fencing_watch('cf', 'cf_other')"))
    cur.execute("SELECT lock_key_prefix FROM fencing_watches WHERE resource = 'cf'")
    prefix = cur.fetchone()[0]
    ok(st == "40001" and prefix == "cf/", f"a changed registration whose COMMIT failed ({st}) keeps its lock ({prefix!r})")
    ok(wait_for(lambda: handover() == tz, LONG) is not None and write_with(cur, "cf_t", tz - 1) == "FT001",
       "and still fences the older holder")
    cur.execute("SELECT fencing_unwatch('cf')")
    hz.release()
    c.close()


def scenario_watch_dropped_database(etcd, pg):
    print("== the watches of a dropped database are removed (no slot is held forever)")
    c = pg.connect()
    cur = c.cursor()
    cur.execute("DROP DATABASE IF EXISTS wd_db")
    cur.execute("CREATE DATABASE wd_db")
    d = psycopg2.connect(host="127.0.0.1", port=pg.port, user="postgres", dbname="wd_db")
    d.autocommit = True
    dcur = d.cursor()
    dcur.execute("CREATE EXTENSION pg_fencing")
    dcur.execute("SELECT fencing_watch('jobs', 'wd_lock')")
    cur.execute("SELECT oid FROM pg_database WHERE datname = 'wd_db'")
    oid = cur.fetchone()[0]
    d.close()
    state = os.path.join(pg.data, "pg_fencing_watches.state")

    def lines_of_db():
        with open(state) as f:
            return [l for l in f.read().splitlines() if l.split("\t")[0] == str(oid)]
    ok(len(lines_of_db()) == 1, f"the watch of database {oid} is in the state file")
    cur.execute("DROP DATABASE wd_db")
    # The first session that looks after the drop removes it.
    n = pg.connect()
    n.cursor().execute("SELECT count(*) FROM fencing_watches")
    n.close()
    ok(lines_of_db() == [], f"after DROP DATABASE the first session's look removed it ({lines_of_db()})")
    c.close()


def scenario_watch_compacted(etcd, pg):
    print("== a new watch when etcd compacted the history it needs to find the holder's grant")
    c = pg.connect()
    cur = c.cursor()
    protected_table(cur, "comp_t", "comp")
    # P holds; H queues behind it and is granted when P releases (H's grant is after its key's
    # creation); then unrelated writes, and a compaction of everything before now. H holds the
    # lock until the checks are done (a free lock would be another case).
    hp = etcdctl_holder(etcd, "comp", 10, 1)
    tp = int(hp.stdout.readline())
    hh = GatedHolder(etcd, "comp", 10)
    th = hh.token()
    for i in range(3):
        etcd.ctl("put", f"pad/comp{i}", "x")
    cr = etcd_revision(etcd)
    etcd.ctl("compact", str(cr))
    cur.execute("SELECT fencing_watch('comp')")

    def status():
        cur.execute("SELECT status FROM fencing_watches WHERE resource = 'comp'")
        return (cur.fetchone() or [""])[0]
    ok(wait_for(lambda: status().startswith("watching"), LONG) is not None and "compacted" in status(),
       f"the watch starts and says the history is compacted ({status()!r})")
    m = high_water(cur, "comp")
    ok(m == cr, f"the mark is the compaction revision {cr}, a safe bound (P had {tp}, H {th}): {m}")
    ok(write_with(cur, "comp_t", tp) == "FT001", "P, fenced off by H's grant, is refused")
    ok(write_with(cur, "comp_t", th) == "FT001",
       "H's own grant is below the bound (no history tells it): H is refused too and must take the lock again")
    hh.release()
    hn = etcdctl_holder(etcd, "comp", 10, 1)
    tn = int(hn.stdout.readline())
    ok(wait_for(lambda: high_water(cur, "comp") >= tn, LONG) is not None and write_with(cur, "comp_t", tn) == "ok",
       f"the next holder ({tn}) writes")
    hn.wait(timeout=10)
    cur.execute("SELECT fencing_unwatch('comp')")
    c.close()


def etcd_requests(etcd, counter="handled"):
    """etcd's count of the gRPC requests it answered (or, counter "started", began), by method
    (its /metrics on the client port)."""
    import urllib.request
    counts = {}
    for m in etcd.procs:
        with urllib.request.urlopen(f"http://127.0.0.1:{etcd.client[m]}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(f"grpc_server_{counter}_total{{") and 'grpc_type="unary"' in line:
                    method = line.split('grpc_method="')[1].split('"')[0]
                    counts[method] = counts.get(method, 0) + int(float(line.rsplit(" ", 1)[1]))
    return counts


def scenario_requests(etcd, pg):
    print("== the etcd requests of an acquisition: a free lock in two, a held one queued with etcd's lock service")
    c = pg.connect()
    cur = c.cursor()
    cur.execute("SELECT fencing_acquire('requests')")   # warm: the worker is connected
    cur.execute("SELECT fencing_release('requests')")
    c.close()
    # A TTL of 30 s: no keepalive round (every TTL/3, with its lease read) during the count.
    c = pg.connect()
    cur = c.cursor()
    cur.execute("ALTER SYSTEM SET pg_fencing.lease_ttl = 30")
    cur.execute("SELECT pg_reload_conf()")
    ok(wait_worker_ttl(pg, etcd, 30),
       "the worker grants 30 s leases after the reload")
    # The leases of earlier sessions (renewed, with a lease read, every TTL/3 until they have
    # been unused for a TTL, or revoked within TTL/3 after their session ended) gone first.
    ok(wait_for(lambda: not etcd_leases(etcd) or None, 2 * LONG, step=0.2) is not None,
       f"no lease left from earlier sessions ({etcd_leases(etcd)})")
    n = 5
    before = etcd_requests(etcd)
    tokens = []
    for _ in range(n):
        cur.execute("SELECT fencing_acquire('requests')")
        tokens.append(cur.fetchone()[0])
        keys = json.loads(etcd.ctl("get", "--prefix", "requests/", "-w", "json").stdout).get("kvs", [])
        created = [kv["create_revision"] for kv in keys]
        ok(created == [tokens[-1]],
           f"a free lock: the token is the creation revision of the only key of the lock ({tokens[-1]}, {created})")
        cur.execute("SELECT fencing_release('requests')")
    after = etcd_requests(etcd)
    delta = {k: after.get(k, 0) - before.get(k, 0)
             for k in ("LeaseGrant", "Txn", "Lock", "LeaseTimeToLive", "DeleteRange", "LeaseRevoke")}
    ok(delta == {"LeaseGrant": 1, "Txn": n, "Lock": 0, "LeaseTimeToLive": 0, "DeleteRange": n, "LeaseRevoke": 0},
       f"{n} free locks of one session: one lease grant (the session's), one transaction each, no Lock "
       f"request, no lease read; one key deletion to release, the lease kept for the session ({delta})")
    ok(tokens == sorted(set(tokens)), f"their tokens grow ({tokens})")

    # Held by etcdctl: the request queues (Lock) and the lease is read after the wait. etcdctl
    # lets go once etcd has started the request's Lock call (etcd's own counter, read over HTTP,
    # which adds no gRPC request to the count).
    holder = GatedHolder(etcd, "requests")
    ext = holder.token()
    before = etcd_requests(etcd)
    locks_started = etcd_requests(etcd, "started").get("Lock", 0)
    th, out = in_thread(lambda: (cur.execute("SELECT fencing_acquire('requests', '60s')"), cur.fetchone()[0])[1])
    queued = wait_for(lambda: etcd_requests(etcd, "started").get("Lock", 0) > locks_started, LONG) is not None
    holder.release()
    th.join(LONG)
    tok = out.get("value", 0)
    after = etcd_requests(etcd)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in ("Txn", "Lock", "Range", "LeaseTimeToLive")}
    ok(queued and tok > ext and delta["Lock"] == 1 and delta["Range"] == 1 and delta["LeaseTimeToLive"] == 0,
       f"a held lock: queued with one Lock request, its key read after the wait, a higher token ({tok} > {ext}, "
       f"{delta}; {out})")
    keys = etcd.keys("requests/")
    ok(len(keys) == 1 and keys[0].endswith(format(int(lock_lease(cur, "requests")), "x")),
       f"and the only key of the lock is ours, the one the transaction created ({keys})")
    cur.execute("SELECT fencing_release('requests')")
    cur.execute("ALTER SYSTEM RESET pg_fencing.lease_ttl")
    cur.execute("SELECT pg_reload_conf()")
    ok(wait_worker_ttl(pg, etcd, TTL), f"after the reset the worker grants {TTL} s leases again")
    c.close()


def etcd_leases(etcd):
    # "found N leases", then one id (hex) per line.
    lines = etcd.ctl("lease", "list").stdout.splitlines()[1:]
    return {int(x.strip(), 16) for x in lines if x.strip()}


def scenario_session_lease(etcd, pg):
    print("== one lease per session: its locks share it, each is still lost on its own, the lease goes when unused")
    c = pg.connect()
    cur = c.cursor()
    names = ["sl-a", "sl-b", "sl-c"]
    for n in names:
        cur.execute("SELECT fencing_acquire(%s)", (n,))
    cur.execute("SELECT lock, lease_id, state FROM fencing_locks WHERE lock LIKE 'sl-%%' ORDER BY lock")
    rows = cur.fetchall()
    leases = {r[1] for r in rows}
    ok(len(rows) == 3 and len(leases) == 1 and all(r[2] == "held" for r in rows),
       f"three locks of one session share one lease ({rows})")
    lease = int(next(iter(leases)))
    ok(lease in etcd_leases(etcd), f"the lease exists in etcd ({lease:x})")
    # Another session gets its own lease.
    c2 = pg.connect()
    cur2 = c2.cursor()
    cur2.execute("SELECT fencing_acquire('sl-other')")
    other = int(lock_lease(cur2, "sl-other"))
    ok(other != lease, f"another session has a lease of its own ({other:x} vs {lease:x})")
    # A key under the session's lease that no lock of the session uses (as a transaction
    # answered after its acquisition gave up would leave): deleted by the next keepalive round.
    etcd.ctl("put", f"--lease={lease:x}", "sl-stray/x", "v")
    gone = wait_for(lambda: not etcd.keys("sl-stray/") or None, LONG, step=0.1)
    mine = [k for n in names for k in etcd.keys(f"{n}/")]
    ok(gone is not None and len(mine) == 3,
       f"a stray key under the session's lease is deleted, the locks' keys stay ({etcd.keys('sl-stray/')}, {mine})")
    # One lock's key deleted: that lock alone is lost.
    etcd.ctl("del", f"sl-b/{lease:x}")
    wait_for(lambda: (lock_state(cur, "sl-b") or ("",))[0] == "lost" or None, LONG)
    states = {n: (lock_state(cur, n) or ("none",))[0] for n in names}
    ok(states == {"sl-a": "held", "sl-b": "lost", "sl-c": "held"},
       f"a deleted key loses its lock only ({states})")
    # The session's lease revoked: every lock under it is lost, the other session's is not.
    etcd.ctl("lease", "revoke", format(lease, "x"))
    wait_for(lambda: all((lock_state(cur, n) or ("",))[0] == "lost" for n in names) or None, LONG)
    states = {n: (lock_state(cur, n) or ("none",))[0] for n in names}
    ok(all(v == "lost" for v in states.values()) and lock_state(cur2, "sl-other")[0] == "held",
       f"the revoked lease loses all the session's locks, not another session's ({states})")
    tok = lock_state(cur, "sl-a")[1]
    protected_table(cur, "sl_t", "sl-res")
    ok(sqlstate(cur, f"BEGIN; SET LOCAL pg_fencing.token = '{tok}'; UPDATE sl_t SET v = 1; COMMIT") == "FT003",
       "a write with a lost lock's token: FT003")
    cur.execute("ROLLBACK")
    for n in names:
        cur.execute("SELECT fencing_release(%s)", (n,))
    # A new acquisition of the session takes a new lease.
    cur.execute("SELECT fencing_acquire('sl-a')")
    fresh = int(lock_lease(cur, "sl-a"))
    ok(fresh != lease and lock_state(cur, "sl-a")[0] == "held", f"after the loss, a new lease ({fresh:x})")
    cur.execute("SELECT fencing_release('sl-a')")
    cur2.execute("SELECT fencing_release('sl-other')")
    # Unused for one TTL: revoked (within TTL + TTL/3 by the worker's pace; waited for longer).
    gone = wait_for(lambda: (fresh not in etcd_leases(etcd) and other not in etcd_leases(etcd)) or None, LONG, step=0.1)
    ok(gone is not None, f"the leases of sessions without locks are revoked after a TTL ({etcd_leases(etcd)})")
    c.close()
    c2.close()


def lock_lease(cur, name):
    cur.execute("SELECT lease_id FROM fencing_locks WHERE lock = %s", (name,))
    row = cur.fetchone()
    return row[0] if row else 0


def etcd_state_file(pg):
    """(cluster id, highest revision) from $PGDATA/pg_fencing_etcd.state."""
    path = os.path.join(pg.data, "pg_fencing_etcd.state")
    try:
        with open(path) as f:
            head = f.readline().split()
        return head[0], int(head[1])
    except (OSError, IndexError, ValueError):
        return None, 0


def scenario_state_file(etcd, pg):
    print("== the etcd state file: a higher revision saved within a second, and when the worker stops")
    c = pg.connect()
    cur = c.cursor()
    cur.execute("SELECT fencing_acquire('statefile')")
    tok = cur.fetchone()[0]
    cur.execute("SELECT fencing_release('statefile')")
    # Saved off the requests' path within STATE_SAVE_INTERVAL (1 s) by the worker's pace; waited
    # for longer, the point being that it is saved while the worker runs.
    saved = wait_for(lambda: etcd_state_file(pg)[1] >= tok or None, LONG)
    ok(saved is not None, f"the state file reaches the token's revision while the worker runs, after {saved}s "
                          f"({etcd_state_file(pg)}, token {tok})")
    for _ in range(3):
        cur.execute("SELECT fencing_acquire('statefile')")
        tok = cur.fetchone()[0]
        cur.execute("SELECT fencing_release('statefile')")
    c.close()
    pg.stop()
    ok(etcd_state_file(pg)[1] >= tok,
       f"a stop right after an acquisition saves its revision ({etcd_state_file(pg)}, token {tok})")
    pg.start()


def etcd_revision(etcd):
    out = etcd.ctl("get", "none-such-key", "-w", "json").stdout
    return json.loads(out)["header"]["revision"]


def scenario_restore(etcd, pg):
    print("== etcd restored from an older snapshot: its revisions go backwards")
    c = pg.connect()
    cur = c.cursor()
    snap = os.path.join(WORK, "etcd-snapshot.db")
    etcd.ctl("snapshot", "save", snap)
    for i in range(40):
        etcd.ctl("put", f"bump-{i}", "x")
    cur.execute("SELECT fencing_acquire('orders', '5s')")
    high = cur.fetchone()[0]
    cur.execute("SELECT fencing_release('orders')")
    cur.execute("SELECT fencing_watch('orders')")
    m = etcd.members[0]
    etcd.stop()
    restored = etcd.dirs[m] + "-restored"
    subprocess.run(["etcdctl", "snapshot", "restore", snap, "--data-dir", restored, "--name", m,
                    "--initial-cluster", etcd.cluster,
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd.peer[m]}"],
                   check=True, capture_output=True, env=etcdctl_env())
    etcd.dirs[m] = restored
    etcd.start()
    rev = etcd_revision(etcd)
    ok(rev < high, f"the restored etcd is at revision {rev}, below the token {high} handed out before")
    # FT005, not the timeout's 55P03 (a long timeout, so that a slow reconnect cannot turn one
    # into the other).
    try:
        cur.execute("SELECT fencing_acquire('orders', '20s')")
        st, msg = "ok", ""
    except psycopg2.Error as e:
        st, msg = e.pgcode, e.pgerror or ""
    ok(st == "FT005" and "went back" in msg,
       f"fencing_acquire refuses with FT005, saying why ({st}: {msg.splitlines()[0] if msg else ''})")
    cur.execute("SELECT state, key FROM fencing_locks WHERE lock = ''")
    row = cur.fetchone()
    ok(row is not None and row[0] == "etcd_regressed", f"fencing_locks shows it ({row})")
    cur.execute("SELECT DISTINCT lock_service_problem FROM fencing_resources")
    problems = [r[0] for r in cur.fetchall()]
    ok(problems and all(p and "went back" in p for p in problems), "fencing_resources shows it")
    st = sqlstate(cur, "SELECT fencing_acquire('orders', '5s')")
    ok(st == "FT005", f"it stays refused ({st})")
    status = lambda: (cur.execute("SELECT status FROM fencing_watches WHERE resource = 'orders'"), cur.fetchone()[0])[1]
    ok(wait_for(lambda: "not advancing marks" in status(), LONG) is not None,
       f"the watch of 'orders' stops advancing marks ({status()})")
    c.close()
    pg.stop()
    pg.start()
    c = pg.connect()
    cur = c.cursor()
    st = sqlstate(cur, "SELECT fencing_acquire('orders', '5s')")
    ok(st == "FT005", f"and after a server restart too (saved in the data directory) ({st})")
    # Recovery: the operator checks etcd, then fencing_reset (keeping the mark where it is).
    cur.execute("SELECT fencing_high_water('orders')")
    hw = cur.fetchone()[0]
    cur.execute("SELECT fencing_reset('orders', %s)", (hw,))
    st = sqlstate(cur, "SELECT fencing_acquire('orders', '20s')")
    ok(st == "ok", f"after fencing_reset the worker hands out tokens again ({st})")
    cur.execute("SELECT count(*) FROM fencing_locks WHERE state = 'etcd_regressed'")
    ok(cur.fetchone()[0] == 0, "fencing_locks no longer shows the regression")
    status = lambda: (cur.execute("SELECT status FROM fencing_watches WHERE resource = 'orders'"), cur.fetchone()[0])[1]
    ok(wait_for(lambda: not status().startswith("reconnecting"), LONG) is not None,
       f"and the watch resumes ({status()})")
    cur.execute("SELECT fencing_unwatch('orders')")
    cur.execute("SELECT fencing_release('orders')")
    # The marks still refuse the low tokens of the restored etcd until its revisions catch up.
    c.close()


def scenario_restore_watched(etcd, pg):
    """Issue 30, case 3: an etcd restore is noticed from what a watch saw, also when the worker
    itself wrote nothing since the snapshot (before, only the answers to its own requests were
    compared: tokens below the mark were handed out and the watch reported a hand-over at the
    restored revision)."""
    print("== etcd restored below what a watch saw, with no request of the worker's since the snapshot")
    c = pg.connect()
    cur = c.cursor()
    cur.execute("SELECT fencing_watch('settle-w')")
    status = lambda: (cur.execute("SELECT status FROM fencing_watches WHERE resource = 'settle-w'"), cur.fetchone()[0])[1]
    ok(wait_for(lambda: not status().startswith(("starting", "reconnecting")), LONG) is not None,
       f"the watch of 'settle-w' runs ({status()})")
    snap = os.path.join(WORK, "etcd-snapshot-watched.db")
    etcd.ctl("snapshot", "save", snap)
    env = etcdctl_env()
    for _ in range(4):
        # Outside lock holders only: each hand-over is seen by the watch alone.
        subprocess.run(["etcdctl", "--endpoints", etcd.endpoints(), "lock", "settle-w", "--", "true"],
                       check=True, capture_output=True, env=env, timeout=20)
    seen = etcd_revision(etcd)
    # Read once the watch has seen all of it (the last hand-over included).
    ok(wait_for(lambda: (cur.execute("SELECT latest_revision FROM fencing_watches WHERE resource = 'settle-w'"),
                         (cur.fetchone()[0] or 0) >= seen)[1], LONG) is not None,
       f"the watch has seen etcd's revision {seen}")
    cur.execute("SELECT fencing_high_water('settle-w')")
    mark = cur.fetchone()[0]
    ok(mark is not None and mark > 0, f"the watch raised the mark at the hand-overs ({mark}, etcd at {seen})")
    m = etcd.members[0]
    etcd.stop()
    restored = etcd.dirs[m] + "-restored-watched"
    subprocess.run(["etcdctl", "snapshot", "restore", snap, "--data-dir", restored, "--name", m,
                    "--initial-cluster", etcd.cluster,
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd.peer[m]}"],
                   check=True, capture_output=True, env=env)
    etcd.dirs[m] = restored
    etcd.start()
    rev = etcd_revision(etcd)
    ok(rev < mark, f"the restored etcd is at revision {rev}, below the mark {mark} the watch raised")
    problem = lambda: (cur.execute("SELECT string_agg(DISTINCT lock_service_problem, '; ') FROM fencing_resources"),
                       cur.fetchone()[0])[1]
    ok(wait_for(lambda: "went back" in (problem() or ""), LONG) is not None,
       f"fencing_resources says etcd went back ({problem()})")
    st = sqlstate(cur, "SELECT fencing_acquire('settle-w', '5s')")
    ok(st == "FT005", f"fencing_acquire hands out no token below the mark ({st})")
    cur.execute("SELECT fencing_high_water('settle-w')")
    ok(cur.fetchone()[0] == mark, "the mark stayed where it was")
    cur.execute("SELECT fencing_reset('settle-w', %s)", (mark,))
    cur.execute("SELECT fencing_unwatch('settle-w')")
    c.close()


def scenario_cluster():
    print("== three-member etcd cluster: the leader stops while a lock is held")
    etcd3 = Etcd(members=3, base=ETCD_BASE + 100, tag="m")
    etcd3.start()
    pg = Pg("pg3", PGPORT + 1, f"shared_preload_libraries = 'pg_fencing'\npg_fencing.etcd_endpoints = '{etcd3.endpoints()}'\n"
                               f"pg_fencing.lease_ttl = {TTL}")
    pg.start()
    try:
        c = pg.connect()
        cur = c.cursor()
        setup_schema(cur)
        cur.execute("SELECT fencing_acquire('orders')")
        tok = cur.fetchone()[0]
        leader = etcd3.leader()
        ok(leader is not None, f"found the leader ({leader})")
        etcd3.stop(leader)
        time.sleep(TTL * 2)
        state = lock_state(cur, "orders")
        ok(state and state[0] == "held" and state[1] == tok, f"lock still held after the leader stopped ({state})")
        ok(sqlstate(cur, "INSERT INTO orders_t VALUES (10, 10)") == "ok", "writes with the token keep working")
        remaining = [m for m in etcd3.procs]
        keys = etcd3.ctl("get", "--prefix", "orders/", "--keys-only",
                         endpoints=",".join(f"127.0.0.1:{etcd3.client[m]}" for m in remaining)).stdout.split()
        ok(len([k for k in keys if k]) == 1, "the lock key survives in the remaining members")
        cur.execute("SELECT fencing_release('orders')")
        c.close()
    finally:
        pg.stop("immediate")
        etcd3.stop()


def scenario_no_preload():
    print("== without shared_preload_libraries")
    pg = Pg("pg_nopreload", PGPORT + 2, "")
    pg.start()
    try:
        c = pg.connect()
        cur = c.cursor()
        cur.execute("CREATE EXTENSION pg_fencing")
        ok(sqlstate(cur, "SELECT fencing_acquire('orders')") == "55000", "fencing_acquire fails with 55000")
        ok(sqlstate(cur, "SELECT fencing_release('orders')") == "55000", "fencing_release fails with 55000")
        ok(sqlstate(cur, "SELECT fencing_watch('orders')") == "55000", "fencing_watch fails with 55000")
        cur.execute("SELECT count(*) FROM fencing_locks")
        ok(cur.fetchone()[0] == 0, "fencing_locks is empty")
        cur.execute("CREATE TABLE np (id int PRIMARY KEY)")
        cur.execute("SELECT fencing_protect('np', 'np')")
        ok(sqlstate(cur, "BEGIN; SET LOCAL pg_fencing.token = '3'; INSERT INTO np VALUES (1); COMMIT") == "ok",
           "fencing works without the worker")
        c.close()
    finally:
        pg.stop("immediate")


def scenario_max_locks(etcd, _pg=None):
    print("== pg_fencing.max_locks: the number of lock slots, set at server start")
    pg = Pg("pg_maxlocks", PGPORT + 2, f"shared_preload_libraries = 'pg_fencing'\n"
                                       f"pg_fencing.etcd_endpoints = '{etcd.endpoints()}'\npg_fencing.max_locks = 3")
    pg.start()
    try:
        c = pg.connect()
        cur = c.cursor()
        cur.execute("CREATE EXTENSION pg_fencing")
        cur.execute("SELECT setting, context FROM pg_settings WHERE name = 'pg_fencing.max_locks'")
        row = cur.fetchone()
        ok(row == ("3", "postmaster"), f"the setting is 3, changed only at server start ({row})")
        cur.execute("SELECT allocated_size FROM pg_shmem_allocations WHERE name = 'pg_fencing lock slots'")
        size = cur.fetchone()
        ok(size is not None and 0 < size[0] < 16384, f"the slots take shared memory for 3 ({size})")
        for i in range(3):
            cur.execute("SELECT fencing_acquire(%s)", (f"ml{i}",))
        try:
            cur.execute("SELECT fencing_acquire('ml3')")
            got = ("ok", "")
        except psycopg2.Error as e:
            got = (e.pgcode, e.pgerror)
        ok(got[0] == "53400" and "all 3 lock slots" in got[1] and "max_locks" in got[1],
           f"a fourth lock: 53400 naming the limit and the setting ({got})")
        cur.execute("SELECT fencing_release('ml1')")
        cur.execute("SELECT fencing_acquire('ml3') > 0")
        ok(cur.fetchone()[0], "a released slot is taken again")
        c.close()
    finally:
        pg.stop("immediate")


def main():
    etcd = Etcd()
    etcd.start()
    pg = Pg("pg", PGPORT, f"shared_preload_libraries = 'pg_fencing'\npg_fencing.etcd_endpoints = '{etcd.endpoints()}'\n"
                          f"pg_fencing.lease_ttl = {TTL}\n"
                          "pg_fencing.tombstone_prune_database = 'postgres'\npg_fencing.tombstone_prune_interval = 1")
    pg.start()
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
    try:
        if only:
            # Development: run just these scenarios (by name without "scenario_").
            setup_schema(pg.connect().cursor())
            for name in only:
                scenario = globals()["scenario_" + name]
                # Most scenarios take (etcd, pg); a few need only the server.
                scenario(*(etcd, pg)[2 - scenario.__code__.co_argcount:])
        else:
            steps = [(scenarios_single, etcd, pg), (scenario_requests, etcd, pg), (scenario_session_lease, etcd, pg),
                     (scenario_state_file, etcd, pg), (scenario_watch, etcd, pg), (scenario_worker_threads, pg),
                     (scenario_verify_wait, etcd, pg), (scenario_state_lock, pg), (scenario_watch_gap, etcd, pg),
                     (scenario_watch_txn, etcd, pg), (scenario_watch_commit_fails, etcd, pg),
                     (scenario_watch_dropped_database, etcd, pg), (scenario_watch_compacted, etcd, pg),
                     (scenario_tombstone_retention, etcd, pg), (scenario_cancel_storm, etcd, pg),
                     (scenario_etcd_down, etcd, pg), (scenario_kill9, etcd, pg), (scenario_restore, etcd, pg),
                     (scenario_restore_watched, etcd, pg), (pg.stop, "immediate"), (scenario_max_locks, etcd),
                     (etcd.stop,), (scenario_cluster,), (scenario_no_preload,)]
            for fn, *args in steps:
                started = time.monotonic()
                fn(*args)
                print(f"  [{fn.__name__}: {time.monotonic() - started:.1f} s]")
    finally:
        for p in PROCS:
            if p.poll() is None:
                p.kill()
        for e in ETCDS:
            for p in e.procs.values():
                p.kill()
        for d in os.listdir(WORK):
            full = os.path.join(WORK, d)
            if os.path.exists(os.path.join(full, "postmaster.pid")):
                subprocess.run(["sudo", "-u", "postgres", f"{PGBIN}/pg_ctl", "-D", full, "-m", "immediate", "stop"],
                               capture_output=True)
        if not os.environ.get("KEEP_WORK"):
            shutil.rmtree(WORK, ignore_errors=True)
    if FAILED:
        print(f"{len(FAILED)} worker checks FAILED")
        sys.exit(1)
    print("all worker checks passed")


if __name__ == "__main__":
    main()
