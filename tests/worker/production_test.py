"""The background worker against etcd 3.4 set up as in production: TLS with client certificates,
authentication with a user limited to the lock prefix, and etcd behind `etcd grpc-proxy`.

Each scenario prints "ok: ..." or "FAIL: ..."; the exit status is 1 if any failed. Run by
tests/worker/run.sh after worker_test.py (whose helpers it imports), or by hand:
    source scripts/lib.sh; "$PY" tests/worker/production_test.py [--only tls,auth,proxy]
Ports: PostgreSQL ${PGPORT_PRODUCTION:-54380}-54382, etcd ${ETCD_PRODUCTION_PORT:-24110} to that
+ 25 (clients, peers and the proxy). Bounded: every wait has its own limit, the whole file stops
after 6 minutes (it takes about 3).

Scenarios:
  tls    openssl-made CA, server certificate (IP:127.0.0.1, DNS:localhost), client certificate and
         an unrelated second CA; etcd on https with --client-cert-auth. fencing_acquire/release,
         a verify watch with a hand-over by `etcdctl --cacert --cert --key lock`, loss detection
         (lease revoked: lost, FT003); the CA file relative to the data directory, an https://
         endpoint, pg_fencing.etcd_server_name right and wrong; then the wrong CA and no client
         certificate: FT005 saying why, the watch's status says why, logged once (not per retry)
  auth   etcd with authentication: user pgf whose role may read and write only under 'pgf/'
         (pg_fencing.lock_prefix), password in a 0600 file; acquire (free and queued behind
         etcdctl), release, a verify watch; a wrong password and a 0644 password file: FT005
         saying why, logged once
  proxy  PostgreSQL talks to `etcd grpc-proxy start`: a fencing_acquire lock (lease_ttl 3) held
         for 30 s with a write every second, all accepted; a verify watch (verify_max_lag 1000)
         after a hand-over made by etcdctl directly against etcd: the new holder writes for 30 s
         without FT006, status stays 'watching', the worker keeps its connections (no "too many
         pings" cycle, nothing logged); etcd restarted behind the proxy: the lock still held and
         writes accepted, or lost and writes refused (FT003), never accepted while etcd has no
         such lease; a new fencing_acquire of the same lock afterwards; etcd's errors as the
         proxy passes them on (gRPC code UNKNOWN, etcd's text): the session's lease revoked
         behind its back, the next fencing_acquire takes a new one (not FT005); a watch started
         after a compaction of the history since the lock's grant syncs
"""
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker_test as wt  # noqa: E402  (its main() runs only when it is the script)

# worker_test made a temp dir of its own at import: use one named for this file instead.
shutil.rmtree(wt.WORK, ignore_errors=True)
WORK = tempfile.mkdtemp(prefix="pg_fencing_production.")
os.chmod(WORK, 0o755)
if os.getuid() == 0:
    shutil.chown(WORK, "postgres", "postgres")
wt.WORK = WORK   # wt.Pg puts its data directories and sockets there

ok = wt.ok
sqlstate = wt.sqlstate
wait_for = wt.wait_for
write_with = wt.write_with
PGBIN = wt.PGBIN
PGPORT = int(os.environ.get("PGPORT_PRODUCTION", "54380"))
ETCD_BASE = int(os.environ.get("ETCD_PRODUCTION_PORT", "24110"))
TTL = 3
LONG = wt.LONG   # a generous bound for waits on what a loaded machine may delay (issue 42)
PROCS = []      # etcd, grpc-proxy: killed at exit
GROUPS = []     # etcdctl lock holders, each in a process group of its own: killed at exit
CERT_WORDS = r"certif|x509|issuer|tls|ssl|handshake|unknown ca|verify"


def chown_pg(path):
    if os.getuid() == 0:
        shutil.chown(path, "postgres", "postgres")


# --------------------------------------------------------------------------------- certificates

def make_certs(d):
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate signed by it,
    and a second, unrelated CA; EC P-256 keys, made with Debian's openssl. Returns the paths."""
    os.makedirs(d)
    conf = os.path.join(d, "openssl.cnf")
    with open(conf, "w") as f:
        f.write("[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = unused\n"
                "[ca]\nbasicConstraints = critical,CA:TRUE\nkeyUsage = critical,keyCertSign,cRLSign\n"
                "subjectKeyIdentifier = hash\n"
                # etcd's gateway also dials etcd with the server certificate: clientAuth too.
                "[server]\nbasicConstraints = critical,CA:FALSE\nkeyUsage = critical,digitalSignature\n"
                "extendedKeyUsage = serverAuth,clientAuth\nsubjectAltName = IP:127.0.0.1,DNS:localhost\n"
                "[client]\nbasicConstraints = critical,CA:FALSE\nkeyUsage = critical,digitalSignature\n"
                "extendedKeyUsage = clientAuth\n")
    p = {n: os.path.join(d, n) for n in ("ca.crt", "ca.key", "other-ca.crt", "other-ca.key", "server.crt",
                                         "server.key", "client.crt", "client.key")}

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca, cn in (("ca", "pg_fencing test CA"), ("other-ca", "unrelated CA")):
        run("req", "-config", conf, "-x509", *ec, "-keyout", p[f"{ca}.key"], "-out", p[f"{ca}.crt"],
            "-days", "2", "-subj", f"/CN={cn}", "-extensions", "ca")
    for n in ("server", "client"):
        csr = os.path.join(d, f"{n}.csr")
        run("req", "-config", conf, "-new", *ec, "-keyout", p[f"{n}.key"], "-out", csr, "-subj", f"/CN=pgf-{n}")
        run("x509", "-req", "-in", csr, "-CA", p["ca.crt"], "-CAkey", p["ca.key"], "-CAcreateserial",
            "-days", "2", "-extfile", conf, "-extensions", n, "-out", p[f"{n}.crt"])
    if os.getuid() == 0:   # the server (user postgres) reads the client key; etcd runs as root
        for f in os.listdir(d):
            chown_pg(os.path.join(d, f))
        chown_pg(d)
    return p


# ------------------------------------------------------------------------------- etcd, its proxy

class Etcd:
    """One etcd member on 127.0.0.1:client (http, or https with a client certificate required)."""

    def __init__(self, name, client, certs=None):
        self.name, self.client, self.peer, self.certs = name, client, client + 1, certs
        self.dir = os.path.join(WORK, f"etcd-{name}")
        self.log = os.path.join(WORK, f"etcd-{name}.log")
        self.proc = None
        self.user = None   # "user:password" for etcdctl once authentication is on

    def url(self):
        return f"{'https' if self.certs else 'http'}://127.0.0.1:{self.client}"

    def start(self):
        args = ["etcd", "--name", self.name, "--data-dir", self.dir,
                "--listen-client-urls", self.url(), "--advertise-client-urls", self.url(),
                "--listen-peer-urls", f"http://127.0.0.1:{self.peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer}",
                "--initial-cluster", f"{self.name}=http://127.0.0.1:{self.peer}",
                "--heartbeat-interval", "50", "--election-timeout", "500"]
        if self.certs:
            c = self.certs
            args += ["--cert-file", c["server.crt"], "--key-file", c["server.key"],
                     "--client-cert-auth", "--trusted-ca-file", c["ca.crt"]]
        log = open(self.log, "a")
        self.proc = subprocess.Popen(args, stdout=log, stderr=log)
        PROCS.append(self.proc)
        if wait_for(lambda: self.ctl("endpoint", "health", check=False, timeout=5).returncode == 0, 20) is None:
            raise RuntimeError(f"etcd {self.name} did not become healthy; see {self.log}")

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait(timeout=15)
            self.proc = None

    def flags(self, endpoint=None, user=None, cacert=None, client_cert=True):
        f = ["--endpoints", endpoint or self.url(), "--dial-timeout=3s", "--command-timeout=5s"]
        if self.certs:
            f += ["--cacert", cacert or self.certs["ca.crt"]]
            if client_cert:
                f += ["--cert", self.certs["client.crt"], "--key", self.certs["client.key"]]
        if user or self.user:
            f += ["--user", user or self.user]
        return f

    def ctl(self, *args, check=True, timeout=20, **flags):
        return subprocess.run(["etcdctl", *self.flags(**flags), *args], capture_output=True, text=True,
                              env=wt.etcdctl_env(), check=check, timeout=timeout)

    def keys(self, prefix):
        return [k for k in self.ctl("get", "--prefix", prefix, "--keys-only").stdout.split() if k]

    def lease_alive(self, lease_id):
        out = self.ctl("lease", "timetolive", format(lease_id, "x"), check=False).stdout
        return "remaining" in out and "expired" not in out


def start_proxy(etcd, port):
    log = open(os.path.join(WORK, "grpc-proxy.log"), "a")
    p = subprocess.Popen(["etcd", "grpc-proxy", "start", f"--endpoints=127.0.0.1:{etcd.client}",
                          f"--listen-addr=127.0.0.1:{port}", f"--advertise-client-url=127.0.0.1:{port}",
                          "--data-dir", os.path.join(WORK, "grpc-proxy.data")],
                         stdout=log, stderr=log)
    PROCS.append(p)
    if wait_for(lambda: etcd.ctl("endpoint", "health", check=False, timeout=5,
                                 endpoint=f"127.0.0.1:{port}").returncode == 0, 20) is None:
        raise RuntimeError("etcd grpc-proxy did not answer; see grpc-proxy.log")
    return p


def holder(etcd, lock, ttl, hold_s, **flags):
    """`etcdctl lock --ttl TTL LOCK` holding for hold_s seconds, in a process group of its own;
    hold_s None: until release(p) (etcdctl does not pass its stdin on: the command waits for a
    file to appear)."""
    gate = os.path.join(WORK, f"gate-{len(GROUPS)}")
    hold = f"sleep {hold_s}" if hold_s is not None else f'while [ ! -e "{gate}" ]; do sleep 0.05; done'
    p = subprocess.Popen(["etcdctl", *etcd.flags(**flags), "lock", f"--ttl={ttl}", lock, "--",
                          "sh", "-c", f"echo $ETCD_LOCK_REV; {hold}"],
                         stdout=subprocess.PIPE, text=True, env=wt.etcdctl_env(), start_new_session=True)
    p.gate = gate
    GROUPS.append(p)
    return p


def token_of(p, timeout=15):
    """The token (ETCD_LOCK_REV) a holder prints once granted, or 0 if none within timeout."""
    r, _, _ = select.select([p.stdout], [], [], timeout)
    line = p.stdout.readline() if r else ""
    return int(line.strip()) if line.strip().isdigit() else 0


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(timeout=10)


# ------------------------------------------------------------------------------------ PostgreSQL

def connect(pg):
    c = psycopg2.connect(host="127.0.0.1", port=pg.port, user="postgres", dbname="postgres",
                         options="-c statement_timeout=60000", connect_timeout=10)
    c.autocommit = True
    return c


def try_acquire(cur, name, timeout="2s"):
    """(SQLSTATE or "ok", token, primary message) of fencing_acquire."""
    try:
        cur.execute("SELECT fencing_acquire(%s, %s)", (name, timeout))
        return "ok", cur.fetchone()[0], ""
    except psycopg2.Error as e:
        return e.pgcode, None, (e.diag.message_primary or "")


def acquire_works(cur, name="probe", within=20):
    """Waits until fencing_acquire succeeds (the worker reconnected with new settings); the lock
    is released again. Returns the last outcome."""
    last = None
    deadline = time.time() + within
    while time.time() < deadline:
        last = try_acquire(cur, name)
        if last[0] == "ok":
            cur.execute("SELECT fencing_release(%s)", (name,))
            return last
        time.sleep(0.5)
    return last


def acquire_fails(cur, name="probe", timeout="2s", within=15):
    """Waits until fencing_acquire fails (the worker took new, broken settings). Returns the last
    outcome."""
    last = None
    deadline = time.time() + within
    while time.time() < deadline:
        last = try_acquire(cur, name, timeout)
        if last[0] != "ok":
            return last
        cur.execute("SELECT fencing_release(%s)", (name,))
        time.sleep(0.5)
    return last


def reload_with(cur, **settings):
    """ALTER SYSTEM SET pg_fencing.<name> = value (None: RESET) for each, then pg_reload_conf()."""
    for k, v in settings.items():
        if v is None:
            cur.execute(f"ALTER SYSTEM RESET pg_fencing.{k}")
        else:
            cur.execute(f"ALTER SYSTEM SET pg_fencing.{k} = %s", (str(v),))
    cur.execute("SELECT pg_reload_conf()")
    time.sleep(0.3)


def watch_status(cur, resource):
    cur.execute("SELECT status FROM fencing_watches WHERE resource = %s", (resource,))
    r = cur.fetchone()
    return r[0] if r else ""


def healthy(status):
    """A watch's status while it runs: 'watching...' or, after a hand-over, 'lock changed hands...'."""
    return status.startswith("watching") or status.startswith("lock changed hands")


def watch_fresh(cur, resource, within=LONG):
    def fresh():
        cur.execute("SELECT status, view_age_ms FROM fencing_watches WHERE resource = %s", (resource,))
        r = cur.fetchone()
        return r is not None and healthy(r[0]) and r[1] is not None and r[1] < 500
    return wait_for(fresh, within) is not None


def log_offset(pg):
    return os.path.getsize(pg.log) if os.path.exists(pg.log) else 0


def worker_log_lines(pg, offset):
    """The server log's LOG/WARNING lines about pg_fencing since offset, without PostgreSQL's
    own lines about a reload (parameter ... changed) and the backends' ERROR lines (each failed
    fencing_acquire is logged as an ERROR by PostgreSQL, as any error is)."""
    with open(pg.log, "rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()
    return [l for l in lines if "pg_fencing" in l and re.search(r"\b(LOG|WARNING):", l)
            and 'parameter "pg_fencing.' not in l and "received SIGHUP" not in l]


def failure_phase(pg, cur, what, words, resource, settle=12):
    """After a reload with broken settings: fencing_acquire (its default timeout, 10 s) fails
    with FT005 whose message says why (matches words), the watch of resource shows it, and the
    server log has the reason once, not once per retry (counted after `settle` seconds of
    retries)."""
    off = log_offset(pg)
    t0 = time.time()
    st, _, msg = acquire_fails(cur, timeout="10s", within=25)
    took = time.time() - t0
    ok(st == "FT005" and re.search(words, msg, re.I) is not None,
       f"{what}: fencing_acquire fails with FT005 saying why, after {took:.1f} s ({st}: {msg!r})")
    ok(wait_for(lambda: re.search(words, watch_status(cur, resource), re.I) is not None
                and not healthy(watch_status(cur, resource)), LONG) is not None,
       f"{what}: fencing_watches.status says why ({watch_status(cur, resource)!r})")
    # The worker keeps retrying (and a few more acquisitions make it try): still one line.
    while time.time() - t0 < took + settle:
        if try_acquire(cur, "probe", "1s")[0] == "ok":
            cur.execute("SELECT fencing_release('probe')")
        time.sleep(1.0)
    lines = worker_log_lines(pg, off)
    reason = [l for l in lines if re.search(words, l, re.I)]
    ok(1 <= len(reason) <= 2 and len(lines) <= 3,
       f"{what}: the server log has the reason once in {took + settle:.0f} s of retries, not per retry "
       f"({len(reason)} lines with it, {len(lines)} pg_fencing lines: {[l[:300] for l in lines[:3]]})")


def recovery_phase(cur, what, resource, **settings):
    """A reload with working settings again: the worker reconnects within a few seconds (it
    reconnects when its settings change; its backoff is 1 s at most, and a loaded machine may add
    some) and the watch of resource is fresh again."""
    reload_with(cur, **settings)
    t0 = time.time()
    st = acquire_works(cur, within=25)
    took = time.time() - t0
    ok(st[0] == "ok" and took <= 10, f"{what}: fencing_acquire works again {took:.1f} s after the reload ({st})")
    ok(watch_fresh(cur, resource), f"{what}: the watch is fresh again ({watch_status(cur, resource)!r})")


def server(name, port, conf):
    pg = wt.Pg(name, port, "shared_preload_libraries = 'pg_fencing'\n"
                           f"pg_fencing.lease_ttl = {TTL}\n{conf}")
    pg.start()
    return pg


def stop_server(pg):
    if pg and os.path.exists(os.path.join(pg.data, "postmaster.pid")):
        try:
            pg.stop("immediate")
        except subprocess.CalledProcessError:
            pass


def protected(cur, table, resource):
    wt.protected_table(cur, table, resource)


# ------------------------------------------------------------------------------------- scenarios

def scenario_tls():
    print("== TLS: etcd on https with client certificates (--client-cert-auth)")
    certs = make_certs(os.path.join(WORK, "certs"))
    etcd = Etcd("tls", ETCD_BASE, certs)
    etcd.start()
    # The set-up itself, checked with etcdctl: the client certificate is required, the CA matters.
    ok(etcd.ctl("put", "setup", "1", check=False).returncode == 0, "etcdctl with the CA and the client certificate writes")
    r = etcd.ctl("get", "setup", check=False, client_cert=False, timeout=20)
    ok(r.returncode != 0, "etcdctl without a client certificate is refused (--client-cert-auth)")
    r = etcd.ctl("get", "setup", check=False, cacert=certs["other-ca.crt"], timeout=20)
    ok(r.returncode != 0, "etcdctl trusting only the unrelated CA is refused")
    pg = server("pg_tls", PGPORT,
                f"pg_fencing.etcd_endpoints = '127.0.0.1:{etcd.client}'\n"
                f"pg_fencing.etcd_ca_file = '{certs['ca.crt']}'\n"
                f"pg_fencing.etcd_cert_file = '{certs['client.crt']}'\n"
                f"pg_fencing.etcd_key_file = '{certs['client.key']}'\n")
    try:
        c = connect(pg)
        cur = c.cursor()
        cur.execute("CREATE EXTENSION pg_fencing")
        protected(cur, "orders_t", "orders")
        st = acquire_works(cur, within=20)
        ok(st[0] == "ok", f"the worker connects over TLS with its client certificate ({st})")

        cur.execute("SELECT fencing_acquire('orders')")
        tok = cur.fetchone()[0]
        keys = etcd.keys("orders/")
        ok(len(keys) == 1, f"fencing_acquire over TLS: token {tok}, the lock key in etcd ({keys})")
        ok(sqlstate(cur, "UPDATE orders_t SET v = v + 1") == "ok", "a write with its token is accepted")
        cur.execute("SELECT fencing_release('orders')")
        ok(cur.fetchone()[0] is True and wait_for(lambda: etcd.keys("orders/") == [], LONG) is not None,
           "fencing_release returns true and deletes the key")

        print("== TLS: a verify watch and a hand-over by etcdctl lock over TLS")
        protected(cur, "tjobs_t", "tjobs")
        cur.execute("SELECT fencing_watch('tjobs', NULL, true)")
        ok(watch_fresh(cur, "tjobs"), f"the verify watch runs and is fresh ({watch_status(cur, 'tjobs')!r})")
        h1 = holder(etcd, "tjobs", 10, 2)
        t1 = token_of(h1)
        h2 = holder(etcd, "tjobs", 10, 8)
        t2 = token_of(h2)
        ok(t1 > 0 and t2 > t1, f"etcdctl lock hands the lock from {t1} to {t2}")
        ok(wait_for(lambda: wt.high_water(cur, "tjobs") > t1, LONG) is not None,
           f"the mark moves past the old holder ({wt.high_water(cur, 'tjobs')})")
        ok(write_with(cur, "tjobs_t", t1) == "FT001", "the old holder's token is refused (FT001)")
        st = write_with(cur, "tjobs_t", t2)
        ok(st == "ok", f"the new holder's token is verified and accepted ({st})")
        kill_group(h1)
        kill_group(h2)

        print("== TLS: a lease revoked from outside is noticed")
        cur.execute("SELECT fencing_acquire('orders')")
        cur.execute("SELECT lease_id FROM fencing_locks WHERE lock = 'orders'")
        lease = cur.fetchone()[0]
        etcd.ctl("lease", "revoke", format(lease, "x"))
        ok(wait_for(lambda: (wt.lock_state(cur, "orders") or ("",))[0] == "lost", LONG) is not None,
           f"fencing_locks says lost ({wt.lock_state(cur, 'orders')})")
        st = sqlstate(cur, "UPDATE orders_t SET v = v + 1")
        ok(st == "FT003", f"a write with the lost lock's token gets FT003 ({st})")
        cur.execute("SELECT fencing_release('orders')")

        print("== TLS: the CA file relative to the data directory, an https:// endpoint, etcd_server_name")
        rel = os.path.join(pg.data, "etcd-ca.crt")
        shutil.copy(certs["ca.crt"], rel)
        chown_pg(rel)
        reload_with(cur, etcd_ca_file="etcd-ca.crt")
        st = acquire_works(cur)
        ok(st[0] == "ok", f"etcd_ca_file = 'etcd-ca.crt' (in the data directory) works ({st})")
        reload_with(cur, etcd_endpoints=f"https://127.0.0.1:{etcd.client}")
        st = acquire_works(cur)
        ok(st[0] == "ok", f"an https://127.0.0.1:{etcd.client} endpoint works ({st})")
        reload_with(cur, etcd_server_name="localhost")
        st = acquire_works(cur)
        ok(st[0] == "ok", f"etcd_server_name = 'localhost' (in the certificate) works ({st})")
        reload_with(cur, etcd_server_name="db.example.com")
        st = acquire_fails(cur, timeout="10s", within=25)
        ok(st[0] == "FT005" and re.search(CERT_WORDS + r"|name", st[2], re.I) is not None,
           f"etcd_server_name = 'db.example.com' (not in the certificate): FT005 saying why ({st[0]}: {st[2]!r})")
        reload_with(cur, etcd_server_name=None, etcd_endpoints=f"127.0.0.1:{etcd.client}")
        st = acquire_works(cur)
        ok(st[0] == "ok", f"back to the right settings: fencing_acquire works ({st})")

        print("== TLS: the wrong CA, then no client certificate")
        reload_with(cur, etcd_ca_file=certs["other-ca.crt"])
        failure_phase(pg, cur, "the unrelated CA", CERT_WORDS, "tjobs")
        recovery_phase(cur, "the right CA", "tjobs", etcd_ca_file=certs["ca.crt"])
        reload_with(cur, etcd_cert_file="", etcd_key_file="")
        # (Longer: etcd's alert races with the first request, so the error's text may vary.)
        failure_phase(pg, cur, "no client certificate", CERT_WORDS + r"|alert|required", "tjobs", settle=20)
        recovery_phase(cur, "the client certificate back", "tjobs",
                       etcd_cert_file=certs["client.crt"], etcd_key_file=certs["client.key"])
        cur.execute("SELECT fencing_unwatch('tjobs')")
        c.close()
    finally:
        stop_server(pg)
        etcd.stop()


def scenario_auth():
    print("== authentication: a user allowed only the lock prefix 'pgf/'")
    etcd = Etcd("auth", ETCD_BASE + 10)
    etcd.start()
    for args in (("user", "add", "root:rootpw"), ("user", "grant-role", "root", "root"),
                 ("user", "add", "pgf:pgf-secret"), ("role", "add", "pgf"),
                 ("role", "grant-permission", "pgf", "--prefix=true", "readwrite", "pgf/"),
                 ("user", "grant-role", "pgf", "pgf"), ("auth", "enable")):
        etcd.ctl(*args)
    etcd.user = "root:rootpw"
    as_pgf = {"user": "pgf:pgf-secret"}
    ok(etcd.ctl("put", "pgf/setup", "1", check=False, **as_pgf).returncode == 0
       and etcd.ctl("put", "setup", "1", check=False, **as_pgf).returncode != 0,
       "set-up: user pgf may write under pgf/ and nowhere else")
    ok(etcd.ctl("get", "setup", check=False, user="pgf:wrong").returncode != 0, "set-up: a wrong password is refused")

    def pwfile(name, text, mode):
        path = os.path.join(WORK, name)
        with open(path, "w") as f:
            f.write(text)
        chown_pg(path)
        os.chmod(path, mode)
        return path
    good = pwfile("pgf.pass", "pgf-secret\n", 0o600)
    wrong = pwfile("pgf-wrong.pass", "not-the-password\n", 0o600)
    loose = pwfile("pgf-0644.pass", "pgf-secret\n", 0o644)
    pg = server("pg_auth", PGPORT + 1,
                f"pg_fencing.etcd_endpoints = '127.0.0.1:{etcd.client}'\n"
                "pg_fencing.lock_prefix = 'pgf/'\n"
                "pg_fencing.etcd_username = 'pgf'\n"
                f"pg_fencing.etcd_password_file = '{good}'\n")
    try:
        c = connect(pg)
        cur = c.cursor()
        cur.execute("CREATE EXTENSION pg_fencing")
        protected(cur, "orders_t", "orders")
        st = acquire_works(cur, within=20)
        ok(st[0] == "ok", f"the worker authenticates as pgf ({st})")
        cur.execute("SELECT fencing_acquire('orders')")
        tok = cur.fetchone()[0]
        keys = etcd.keys("pgf/orders/")
        ok(len(keys) == 1, f"fencing_acquire as pgf: token {tok}, key {keys}")
        ok(sqlstate(cur, "UPDATE orders_t SET v = v + 1") == "ok", "a write with its token is accepted")
        cur.execute("SELECT fencing_release('orders')")
        ok(cur.fetchone()[0] is True and wait_for(lambda: etcd.keys("pgf/orders/") == [], LONG) is not None,
           "fencing_release returns true and deletes the key")
        # etcdctl holds the lock until the request is in etcd's queue behind it (two keys).
        h = holder(etcd, "pgf/orders", 10, None, **as_pgf)
        th = token_of(h)
        got = {}
        t = threading.Thread(target=lambda: got.update(r=try_acquire(cur, "orders", "60s")))
        t.start()
        queued = wait_for(lambda: len(etcd.keys("pgf/orders/")) == 2, LONG) is not None
        open(h.gate, "w").close()   # etcdctl unlocks once its command has ended
        t.join(LONG)
        st, tq, msg = got.get("r", ("no answer", None, ""))
        ok(queued and st == "ok" and tq > th > 0,
           f"a lock held by etcdctl (as pgf): fencing_acquire queues (etcd's Lock service: {queued}), then gets "
           f"a higher token ({st} {msg} {tq} > {th})")
        kill_group(h)
        if st == "ok":
            cur.execute("SELECT fencing_release('orders')")

        print("== authentication: a verify watch of a lock under the prefix")
        protected(cur, "ajobs_t", "ajobs")
        cur.execute("SELECT fencing_watch('ajobs', NULL, true)")
        cur.execute("SELECT lock_key_prefix FROM fencing_watches WHERE resource = 'ajobs'")
        ok(cur.fetchone()[0] == "pgf/ajobs/", "the watch's key prefix is under pg_fencing.lock_prefix")
        ok(watch_fresh(cur, "ajobs"), f"the verify watch runs and is fresh ({watch_status(cur, 'ajobs')!r})")
        h1 = holder(etcd, "pgf/ajobs", 10, 2, **as_pgf)
        t1 = token_of(h1)
        h2 = holder(etcd, "pgf/ajobs", 10, 8, **as_pgf)
        t2 = token_of(h2)
        ok(t1 > 0 and t2 > t1, f"etcdctl lock (as pgf) hands the lock from {t1} to {t2}")
        ok(wait_for(lambda: wt.high_water(cur, "ajobs") > t1, LONG) is not None,
           f"the mark moves past the old holder ({wt.high_water(cur, 'ajobs')})")
        ok(write_with(cur, "ajobs_t", t1) == "FT001", "the old holder's token is refused (FT001)")
        st = write_with(cur, "ajobs_t", t2)
        ok(st == "ok", f"the new holder's token is verified and accepted ({st})")
        kill_group(h1)
        kill_group(h2)

        print("== authentication: a wrong password, a password file readable by others")
        reload_with(cur, etcd_password_file=wrong)
        failure_phase(pg, cur, "a wrong password", r"auth|password|user|credential", "ajobs")
        recovery_phase(cur, "the right password", "ajobs", etcd_password_file=good)
        reload_with(cur, etcd_password_file=loose)
        failure_phase(pg, cur, "a password file with mode 0644",
                      r"permission|mode|group|other|readable|0?644|0?600|u=rw", "ajobs")
        recovery_phase(cur, "the password file with mode 0600", "ajobs", etcd_password_file=good)
        cur.execute("SELECT fencing_unwatch('ajobs')")
        c.close()
    finally:
        stop_server(pg)
        etcd.stop()


def worker_conns(pg, port):
    """The local ports of the worker's established TCP connections to 127.0.0.1:port."""
    wpid = wt.worker_pid(pg)
    out = subprocess.run(["ss", "-Htnp", "state", "established", f"( dport = :{port} )"],
                         capture_output=True, text=True).stdout
    return {line.split()[2].rsplit(":", 1)[1] for line in out.splitlines() if f"pid={wpid}," in line}


def scenario_proxy():
    print("== etcd behind etcd grpc-proxy")
    etcd = Etcd("proxied", ETCD_BASE + 20)
    etcd.start()
    pport = ETCD_BASE + 25
    proxy = start_proxy(etcd, pport)
    plog = os.path.join(WORK, "grpc-proxy.log")
    via_proxy = {"endpoint": f"127.0.0.1:{pport}"}
    ok(etcd.ctl("put", "setup", "1", check=False, **via_proxy).returncode == 0
       and etcd.ctl("get", "setup", check=False).stdout.split()[-1:] == ["1"],
       "set-up: etcdctl writes through the proxy")
    pg = server("pg_proxy", PGPORT + 2,
                f"pg_fencing.etcd_endpoints = '127.0.0.1:{pport}'\npg_fencing.verify_max_lag = 1000\n")
    try:
        c = connect(pg)
        cur = c.cursor()
        cur.execute("CREATE EXTENSION pg_fencing")
        protected(cur, "held_t", "held")
        protected(cur, "pjobs_t", "pjobs")
        st = acquire_works(cur, within=20)
        ok(st[0] == "ok", f"the worker reaches etcd through the proxy ({st})")
        cur.execute("SELECT fencing_watch('pjobs', NULL, true)")
        ok(watch_fresh(cur, "pjobs"), f"the verify watch runs and is fresh ({watch_status(cur, 'pjobs')!r})")
        cur.execute("SELECT fencing_acquire('held')")
        held = cur.fetchone()[0]
        cur.execute("SELECT lease_id FROM fencing_locks WHERE lock = 'held'")
        lease = cur.fetchone()[0]

        # A hand-over made directly against etcd, not through the proxy.
        h1 = holder(etcd, "pjobs", 10, 2)
        t1 = token_of(h1)
        h2 = holder(etcd, "pjobs", 10, 300)
        t2 = token_of(h2)
        handover = time.time()
        ok(t1 > 0 and t2 > t1, f"etcdctl lock (directly against etcd) hands the lock from {t1} to {t2}")
        ok(wait_for(lambda: wt.high_water(cur, "pjobs") > t1, LONG) is not None,
           f"the mark moves past the old holder ({wt.high_water(cur, 'pjobs')})")
        ok(write_with(cur, "pjobs_t", t1) == "FT001", "the old holder's token is refused (FT001)")

        print(f"== through the proxy for 30 s: the lock (lease_ttl {TTL}) written every second, the new "
              "holder's verified writes, the watch's status, the worker's connections")
        conns0 = worker_conns(pg, pport)
        off = log_offset(pg)
        poff = os.path.getsize(plog)
        held_bad, verify_bad, status_bad, n_held, n_verify = [], [], [], 0, 0
        next_held = time.time()
        while time.time() - handover < 30:
            now = time.time()
            if now >= next_held:
                st = sqlstate(cur, "UPDATE held_t SET v = v + 1")
                n_held += 1
                if st != "ok":
                    held_bad.append((round(now - handover, 1), st, wt.lock_state(cur, "held")))
                next_held += 1.0
            st = write_with(cur, "pjobs_t", t2)
            n_verify += 1
            if st != "ok":
                cur.execute("SELECT view_age_ms, latest_revision FROM fencing_watches WHERE resource = 'pjobs'")
                verify_bad.append((round(now - handover, 1), st, cur.fetchone()))
            s = watch_status(cur, "pjobs")
            if not healthy(s):
                status_bad.append((round(now - handover, 1), s))
            time.sleep(0.25)
        ok(not held_bad and n_held >= 25,
           f"the fencing_acquire lock stays held through the proxy for 30 s ({30 // TTL} TTLs): "
           f"{n_held} writes with its token, refused: {held_bad[:3]}")
        first10 = [b for b in verify_bad if b[0] <= 10]
        ok(not first10, f"the new holder's verified writes in the 10 s after the hand-over all pass "
                        f"(verify_max_lag 1000; refused: {first10[:3]})")
        ok(not verify_bad, f"and for 30 s ({n_verify} writes; refused: {verify_bad[:3]})")
        ok(not status_bad, f"fencing_watches.status stays 'watching' (or 'lock changed hands') for 30 s "
                           f"({status_bad[:3]})")
        lines = worker_log_lines(pg, off)
        ok(not lines, f"nothing about pg_fencing in the server log meanwhile (no reconnects): {lines[:3]}")
        conns1 = worker_conns(pg, pport)
        ok(conns0 and conns0 == conns1,
           f"the worker keeps its connections to the proxy (local ports {sorted(conns0)} then {sorted(conns1)})")
        with open(plog, "rb") as f:
            f.seek(poff)
            pings = [l for l in f.read().decode(errors="replace").splitlines() if "too many pings" in l.lower()
                     or "too_many_pings" in l.lower()]
        ok(not pings, f"the proxy logged no 'too many pings' ({pings[:1]})")

        print("== etcd restarted behind the proxy (same data directory)")
        results = []

        def write_held():
            results.append((time.time(), sqlstate(cur, "UPDATE held_t SET v = v + 1"),
                            (wt.lock_state(cur, "held") or ("none",))[0]))
        etcd.stop()
        down = time.time()
        while time.time() - down < 1.0:
            write_held()
            time.sleep(0.1)
        etcd.start()
        up = time.time()
        # Settle: the worker's keepalives resume (or the lock is declared lost).
        while time.time() - up < TTL + 2:
            write_held()
            time.sleep(0.1)
        alive = etcd.lease_alive(lease)
        keys = etcd.keys("held/")
        state = wt.lock_state(cur, "held")
        st = sqlstate(cur, "UPDATE held_t SET v = v + 1")
        refused = [r[0] for r in results if r[1] != "ok"]
        after = [r for r in results if refused and r[0] > refused[0] and r[1] == "ok"]
        states = [r[2] for i, r in enumerate(results) if i == 0 or r[2] != results[i - 1][2]]
        print(f"  (etcd down {up - down:.1f} s; lease {'alive' if alive else 'gone'} in etcd, keys {keys}; "
              f"fencing_locks: {state}; a write: {st}; meanwhile {len(results)} writes: "
              f"{sum(1 for r in results if r[1] == 'ok')} accepted, {len(refused)} refused "
              f"({sorted(set(r[1] for r in results) - {'ok'})}), {len(after)} accepted after a refusal; "
              f"the lock's states {states})")
        ok(all(r[1] in ("ok", "FT003") for r in results), "during the restart a write is accepted or refused with FT003")
        if state and state[0] == "held":
            ok(st == "ok" and alive and any(k.endswith(format(lease, "x")) for k in keys),
               f"the lock survived: held, its lease and key are in etcd, a write is accepted ({st})")
        else:
            ok(state is not None and state[0] == "lost" and st == "FT003",
               f"the lock is reported lost and a write gets FT003 ({state}, {st})")
        if not alive:
            # The lease is gone: once refused, the token must stay refused, and no write may be
            # accepted more than a TTL after etcd was back (then etcd had expired or revoked it).
            late = [r for r in results if r[1] == "ok" and r[0] > up + TTL]
            ok(not after and not late, f"with the lease gone, no write accepted after a refusal ({len(after)}) "
                                       f"or more than a TTL after etcd was back ({len(late)})")
        # (With the lease alive in etcd at the end, every accepted write had it: a lease does not
        # come back once it ended, and while it lives nobody else's key can hold the lock.)
        cur.execute("SELECT fencing_release('held')")
        st, tok2, msg = try_acquire(cur, "held", "10s")
        ok(st == "ok" and tok2 > held, f"a new fencing_acquire of the same lock works after the restart ({st} {msg} {tok2})")
        ok(sqlstate(cur, "UPDATE held_t SET v = v + 1") == "ok", "and writes with its token are accepted")
        if st == "ok":
            cur.execute("SELECT fencing_release('held')")
        ok(wait_for(lambda: healthy(watch_status(cur, "pjobs"))
                    and write_with(cur, "pjobs_t", t2) == "ok", LONG) is not None,
           f"the verify watch is back and the holder's writes pass ({watch_status(cur, 'pjobs')!r})")
        print("== etcd's errors through the proxy (it passes them on as UNKNOWN, with etcd's text)")
        # The session's lease revoked behind its back: the next acquisition meets "requested
        # lease not found" and takes a new lease (not FT005).
        cur.execute("SELECT fencing_acquire('pn1')")
        cur.execute("SELECT lease_id FROM fencing_locks WHERE lock = 'pn1'")
        revoked = cur.fetchone()[0]
        etcd.ctl("lease", "revoke", format(revoked, "x"))
        st, tok, msg = try_acquire(cur, "pn2", "10s")
        ok(st == "ok" and tok > 0, f"after the session's lease was revoked, the next fencing_acquire takes a new "
                                   f"lease and the lock ({st} {msg} {tok})")
        for name in ("pn1", "pn2"):
            sqlstate(cur, f"SELECT fencing_release('{name}')")
        # A watch that starts after etcd compacted the history since the lock's grant: it reads
        # "required revision has been compacted" and starts from what etcd still has.
        h3 = holder(etcd, "pcomp", 60, 300)
        token_of(h3)
        for i in range(20):
            etcd.ctl("put", f"pcomp-filler-{i}", "x")
        rev = int(re.search(r'"revision":(\d+)', etcd.ctl("get", "pcomp-filler-0", "-w", "json").stdout).group(1))
        etcd.ctl("compact", str(rev))
        cur.execute("SELECT fencing_watch('pcomp', NULL, false)")
        ok(watch_fresh(cur, "pcomp"),
           f"a watch started after a compaction syncs through the proxy ({watch_status(cur, 'pcomp')!r})")
        cur.execute("SELECT fencing_unwatch('pcomp')")
        kill_group(h3)
        kill_group(h1)
        kill_group(h2)
        cur.execute("SELECT fencing_unwatch('pjobs')")
        c.close()
    finally:
        stop_server(pg)
        proxy.terminate()
        proxy.wait(timeout=10)
        etcd.stop()


SCENARIOS = {"tls": scenario_tls, "auth": scenario_auth, "proxy": scenario_proxy}


def cleanup():
    for p in GROUPS:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for p in PROCS:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    for d in os.listdir(WORK):
        full = os.path.join(WORK, d)
        if os.path.exists(os.path.join(full, "postmaster.pid")):
            args = [f"{PGBIN}/pg_ctl", "-D", full, "-m", "immediate", "-w", "-t", "30", "stop"]
            if os.getuid() == 0:
                args = ["sudo", "-u", "postgres", "--"] + args
            subprocess.run(args, capture_output=True)
    if not os.environ.get("KEEP_WORK"):
        shutil.rmtree(WORK, ignore_errors=True)
    else:
        print(f"(kept {WORK})")


def on_alarm(signum, frame):
    raise TimeoutError("production_test.py ran longer than 6 minutes")


def main():
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else list(SCENARIOS)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(1))
    signal.alarm(360)
    try:
        for name in only:
            try:
                SCENARIOS[name]()
            except Exception as e:   # one scenario's set-up failing does not hide the others
                traceback.print_exc()
                ok(False, f"scenario {name} ran to its end", f"({type(e).__name__}: {e})")
                if isinstance(e, TimeoutError):
                    break
    finally:
        signal.alarm(0)
        cleanup()
    if wt.FAILED:
        print(f"{len(wt.FAILED)} production checks FAILED")
        sys.exit(1)
    print("all production checks passed")


if __name__ == "__main__":
    main()
