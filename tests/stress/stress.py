"""Randomized stress test and independent checker for pg_fencing's invariant.

    for each resource and each row, the tokens of committed writes, taken in commit order,
    never decrease; every rejection (FT001) was justified; high-water marks never go down.

The checker below does not use pg_fencing's code: it reads the clients' own log, the server's
commit status and commit timestamps of every logged transaction (txid_status,
pg_xact_commit_timestamp; the cluster needs track_commit_timestamp = on) and the final table
contents, and recomputes everything from those.

Workload: N client threads on 127.0.0.1. Each repeatedly "acquires a lock" on a fencing domain
(a token from one increasing counter, standing in for a lock service such as etcd), sometimes
announces it with fencing_advance, then runs one transaction of 1-3 writes with random pauses
(sometimes long, so that newer holders overtake it and it becomes a zombie), in a random
isolation level. Domains: three resource-mode tables (one resource each, 4 rows) and one per-row
table (8 keys) that also sees deletes and re-inserts. Writes use UPDATE, INSERT ... ON CONFLICT
DO UPDATE / DO NOTHING, MERGE, DELETE, and fenced_update / fenced_insert / fenced_delete.

    stress.py setup  --dsn DSN
    stress.py run    --dsn DSN --log FILE [--clients 16] [--writes 20000] [--seconds 120] [--seed S] [--unfenced] [--prune]
    stress.py check  --dsn DSN --log FILE [--after-crash] [--lock-service [--etcd-history FILE]]

With --lock-service (tests/partition: tokens come from a real lock service, etcd, under network
faults) the log also has "grant" records (a lock granted to a client with its token, and when);
a rejection (FT001) is then also justified by a grant of a higher token before the rejected
statement returned (a watched resource's mark rises at the hand-over, before the new holder
writes), and the lock service's own refusals (FT003 lock lost, FT005 unreachable, FT006 not
verified, 55P03 timeout) are expected. With --etcd-history (etcd's own event history of the lock
keys, `etcdctl watch --rev 1 -w json` output) a rejection that reports the high-water mark it
met is also justified when etcd's history shows that mark to be a revision at which the lock
was granted (the holder's key was created at it) or at which no one held the lock: grants
the clients never learned of (a client gave up waiting) and a watch's raise to the current
revision of a free lock are both legitimate, and a mark etcd cannot account for is reported.

With --prune a pruner thread runs fencing_prune_tombstones on the per-row table every 50-300 ms,
with a floor a little below the newest token granted, so that it also refuses holders that are
still running (a floor is only safe when holders below it are gone, which a load of overtaken
holders does not promise: here it is a source of refusals, like a newer holder's write). The
log then has "prune" records; the checker counts a committed prune with a floor above a
rejected per-row write's token, committed before the write's statement returned, as the
rejection's justification (the floor is the high-water mark of keys without a tombstone), and
takes the floor into account for the tombstones of deleted keys. Prunes never count as writes
of rows: a row that exists is fenced by its own token, below the floor or not.

Exit status of `check`: 0 if no violation was found, 1 otherwise.
"""
import argparse
import base64
import json
import random
import sys
import threading
import time

import psycopg2
import psycopg2.errors
import psycopg2.extensions

RESOURCE_TABLES = {"stress_a": "stress-a", "stress_b": "stress-b", "stress_c": "stress-c"}
ROW_TABLE = "stress_jobs"
ROWS_PER_RESOURCE_TABLE = 4
ROW_KEYS = 8
LEVELS = [
    psycopg2.extensions.ISOLATION_LEVEL_READ_COMMITTED,
    psycopg2.extensions.ISOLATION_LEVEL_REPEATABLE_READ,
    psycopg2.extensions.ISOLATION_LEVEL_SERIALIZABLE,
]
LEVEL_NAMES = {1: "read committed", 2: "repeatable read", 3: "serializable"}
# Errors a client may legitimately meet; anything else is reported as unexpected.
EXPECTED_ERRORS = {"FT001", "40001", "40P01", "23505", "P0002"}
# With a real lock service under network faults (check --lock-service): the lock was lost, etcd
# was unreachable, the token could not be verified, a wait timed out, a statement was cancelled.
LOCK_SERVICE_ERRORS = {"FT003", "FT005", "FT006", "55P03", "57014", "CONN", "08006", "08003", "25P02"}


def connect(dsn):
    conn = psycopg2.connect(dsn)
    conn.autocommit = False
    return conn


# ---------------------------------------------------------------------------------------------
# setup

def setup(dsn):
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute("CREATE EXTENSION IF NOT EXISTS pg_fencing")
    for table, resource in RESOURCE_TABLES.items():
        cur.execute(f"DROP TABLE IF EXISTS {table}")
        cur.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v bigint NOT NULL, writer text)")
        cur.execute("SELECT fencing_protect(%s, %s)", (table, resource))
        cur.execute("BEGIN")
        cur.execute("SET LOCAL pg_fencing.token = '1'")
        cur.execute(f"INSERT INTO {table} SELECT g, 0, 'setup' FROM generate_series(1, %s) g",
                    (ROWS_PER_RESOURCE_TABLE,))
        cur.execute("COMMIT")
    cur.execute(f"DROP TABLE IF EXISTS {ROW_TABLE}")
    cur.execute(f"CREATE TABLE {ROW_TABLE} (id int PRIMARY KEY, v bigint NOT NULL, writer text)")
    cur.execute("SELECT fencing_protect(%s)", (ROW_TABLE,))
    cur.execute("BEGIN")
    cur.execute("SET LOCAL pg_fencing.token = '1'")
    cur.execute(f"INSERT INTO {ROW_TABLE} SELECT g, 0, 'setup' FROM generate_series(1, %s) g", (ROW_KEYS,))
    cur.execute("COMMIT")
    conn.close()


# ---------------------------------------------------------------------------------------------
# workload

class Tokens:
    """Stands in for a lock service: every grant gets a token higher than all earlier grants."""

    def __init__(self, start):
        self.next = start
        self.lock = threading.Lock()

    def grant(self):
        with self.lock:
            self.next += 1
            return self.next

    def newest(self):
        with self.lock:
            return self.next


def pruner(args, tokens, log, log_lock, stop):
    """--prune: fencing_prune_tombstones on the per-row table now and then (see above)."""
    rng = random.Random(args.seed * 7919)
    conn = None
    while not stop.wait(rng.uniform(0.05, 0.3)):
        if conn is None:
            try:
                conn = connect(args.dsn)
            except psycopg2.Error:
                continue
        floor = max(1, tokens.newest() - rng.randint(0, 30))
        rec = {"ev": "prune", "floor": floor, "xid": None}
        try:
            cur = conn.cursor()
            cur.execute("SELECT txid_current()")
            rec["xid"] = cur.fetchone()[0]
            rec["t0"] = time.time()
            cur.execute("SELECT fencing_prune_tombstones(%s, %s)", (ROW_TABLE, floor))
            rec["deleted"] = cur.fetchone()[0]
            conn.commit()
            rec["outcome"] = "ok"
        except psycopg2.Error as e:
            rec["outcome"] = sqlstate_of(e)
            try:
                conn.rollback()
            except psycopg2.Error:
                conn = None
        rec["t"] = time.time()
        with log_lock:
            log.write(json.dumps(rec) + "\n")
    if conn is not None:
        conn.close()


def sqlstate_of(exc):
    return getattr(exc, "pgcode", None) or "CONN"


class Client(threading.Thread):
    def __init__(self, idx, args, tokens, budget, log, log_lock, deadline):
        super().__init__(daemon=True)
        self.idx = idx
        self.args = args
        self.tokens = tokens
        self.budget = budget
        self.log = log
        self.log_lock = log_lock
        self.deadline = deadline
        self.rng = random.Random(args.seed * 1000 + idx)
        self.conn = None

    def emit(self, rec):
        with self.log_lock:
            self.log.write(json.dumps(rec) + "\n")

    def pause(self):
        r = self.rng.random()
        if r < 0.05:
            time.sleep(self.rng.uniform(0.02, 0.08))   # a "GC pause": newer holders overtake us
        elif r < 0.5:
            time.sleep(self.rng.uniform(0, 0.003))

    def take_budget(self):
        with self.budget["lock"]:
            if self.budget["left"] <= 0 or time.time() > self.deadline:
                return False
            self.budget["left"] -= 1
            return True

    def statement(self, cur, domain):
        """One write; returns (sql, params, kind, table) where kind says what the rows mean."""
        rng = self.rng
        if domain in RESOURCE_TABLES:
            t = domain
            rid = rng.randint(1, ROWS_PER_RESOURCE_TABLE)
            choice = rng.random()
            if choice < 0.45:
                return (f"UPDATE {t} SET v = v + 1, writer = %s WHERE id = %s RETURNING id", (self.name, rid))
            if choice < 0.65:
                return (f"INSERT INTO {t} VALUES (%s, 1, %s) ON CONFLICT (id) DO UPDATE "
                        f"SET v = {t}.v + 1, writer = excluded.writer RETURNING id", (rid, self.name))
            if choice < 0.8:
                return (f"MERGE INTO {t} s USING (VALUES (%s)) x(id) ON s.id = x.id "
                        f"WHEN MATCHED THEN UPDATE SET v = s.v + 1, writer = %s", (rid, self.name))
            if self.args.unfenced:
                return (f"UPDATE {t} SET v = v + 1, writer = %s WHERE id = %s RETURNING id", (self.name, rid))
            return ("SELECT (fenced_update(%s::regclass, jsonb_build_object('id', %s), "
                    "jsonb_build_object('writer', %s), %s) ->> 'id')::int",
                    (t, rid, self.name, "TOKEN"))
        key = domain[1]
        t = ROW_TABLE
        choice = rng.random()
        if choice < 0.35:
            return (f"UPDATE {t} SET v = v + 1, writer = %s WHERE id = %s RETURNING id", (self.name, key))
        if choice < 0.5:
            return (f"DELETE FROM {t} WHERE id = %s RETURNING id", (key,))
        if choice < 0.7:
            return (f"INSERT INTO {t} VALUES (%s, 1, %s) ON CONFLICT (id) DO NOTHING RETURNING id",
                    (key, self.name))
        if choice < 0.8:
            return (f"INSERT INTO {t} VALUES (%s, 1, %s) ON CONFLICT (id) DO UPDATE "
                    f"SET v = {t}.v + 1, writer = excluded.writer RETURNING id", (key, self.name))
        if self.args.unfenced:
            return (f"UPDATE {t} SET v = v + 1, writer = %s WHERE id = %s RETURNING id", (self.name, key))
        if choice < 0.9:
            return ("SELECT (fenced_update(%s::regclass, jsonb_build_object('id', %s), "
                    "jsonb_build_object('writer', %s), %s) ->> 'id')::int", (t, key, self.name, "TOKEN"))
        return ("SELECT (fenced_delete(%s::regclass, jsonb_build_object('id', %s), %s) ->> 'id')::int",
                (t, key, "TOKEN"))

    def run(self):
        rng = self.rng
        txn = 0
        while time.time() < self.deadline:
            if self.conn is None:
                try:
                    self.conn = connect(self.args.dsn)
                    if self.args.unfenced:
                        # Negative control: the guard triggers do not fire, so the checker must
                        # find violations.
                        with self.conn.cursor() as c:
                            c.execute("SET session_replication_role = replica")
                        self.conn.commit()
                except psycopg2.Error:
                    time.sleep(0.2)
                    continue
            if rng.random() < 0.75:
                domain = rng.choice(list(RESOURCE_TABLES))
            else:
                domain = ("row", rng.randint(1, ROW_KEYS))
            token = self.tokens.grant()
            level = rng.choice(LEVELS)
            txn += 1
            tag = f"{self.idx}.{txn}"
            cur = None
            xid = None
            try:
                self.conn.set_session(isolation_level=level)
                cur = self.conn.cursor()
                cur.execute("SELECT txid_current()")
                xid = cur.fetchone()[0]
                self.emit({"ev": "begin", "txn": tag, "xid": xid, "token": token, "level": LEVEL_NAMES[level]})
                if domain in RESOURCE_TABLES and rng.random() < 0.15:
                    t0 = time.time()
                    try:
                        cur.execute("SELECT fencing_advance(%s, %s)", (RESOURCE_TABLES[domain], token))
                        self.emit({"ev": "write", "txn": tag, "op": "advance", "resource": RESOURCE_TABLES[domain],
                                   "table": domain, "rows": [], "token": token, "outcome": "ok",
                                   "t0": t0, "t1": time.time()})
                    except psycopg2.Error as e:
                        self.emit({"ev": "write", "txn": tag, "op": "advance", "resource": RESOURCE_TABLES[domain],
                                   "table": domain, "rows": [], "token": token, "outcome": sqlstate_of(e),
                                   "t0": t0, "t1": time.time()})
                        raise
                cur.execute("SET LOCAL pg_fencing.token = %s", (str(token),))
                for _ in range(rng.randint(1, 3)):
                    if not self.take_budget():
                        break
                    self.pause()
                    sql, params = self.statement(cur, domain)
                    params = tuple(token if p == "TOKEN" else p for p in params)
                    table = domain if domain in RESOURCE_TABLES else ROW_TABLE
                    t0 = time.time()
                    try:
                        cur.execute(sql, params)
                        rows = [r[0] for r in cur.fetchall()] if cur.description else []
                        if sql.startswith("MERGE"):
                            rows = [params[0]] if cur.rowcount > 0 else []
                        rows = [r for r in rows if r is not None]
                        op = "delete" if ("DELETE" in sql or "fenced_delete" in sql) else "write"
                        self.emit({"ev": "write", "txn": tag, "op": op, "table": table,
                                   "resource": RESOURCE_TABLES.get(table), "rows": rows, "token": token,
                                   "outcome": "ok", "t0": t0, "t1": time.time()})
                    except psycopg2.Error as e:
                        self.emit({"ev": "write", "txn": tag, "op": "write", "table": table,
                                   "resource": RESOURCE_TABLES.get(table),
                                   "rows": [params[0] if domain in RESOURCE_TABLES else domain[1]],
                                   "token": token, "outcome": sqlstate_of(e), "t0": t0, "t1": time.time(),
                                   "message": str(e).splitlines()[0] if str(e) else ""})
                        raise
                self.pause()
                self.conn.commit()
                self.emit({"ev": "commit", "txn": tag, "xid": xid, "outcome": "ok", "t": time.time()})
            except psycopg2.Error as e:
                state = sqlstate_of(e)
                try:
                    self.conn.rollback()
                    self.emit({"ev": "commit", "txn": tag, "xid": xid, "outcome": "rolled back:" + str(state),
                               "t": time.time()})
                except psycopg2.Error:
                    # Connection lost (e.g. the server crashed): the outcome is unknown to us;
                    # the checker asks the server (txid_status).
                    self.emit({"ev": "commit", "txn": tag, "xid": xid, "outcome": "unknown", "t": time.time()})
                    try:
                        self.conn.close()
                    except psycopg2.Error:
                        pass
                    self.conn = None
            if self.budget["left"] <= 0:
                break


def run(args):
    conn = psycopg2.connect(args.dsn)
    cur = conn.cursor()
    cur.execute("SELECT coalesce(max(high_water), 1) FROM fencing_resources")
    start = cur.fetchone()[0]
    conn.close()
    tokens = Tokens(start + 1)
    budget = {"left": args.writes, "lock": threading.Lock()}
    log_lock = threading.Lock()
    deadline = time.time() + args.seconds
    with open(args.log, "a", buffering=1) as log:
        clients = [Client(i, args, tokens, budget, log, log_lock, deadline) for i in range(args.clients)]
        for c in clients:
            c.start()
        stop = threading.Event()
        prune = None
        if args.prune:
            prune = threading.Thread(target=pruner, args=(args, tokens, log, log_lock, stop), daemon=True)
            prune.start()
        for c in clients:
            c.join()
        stop.set()
        if prune is not None:
            prune.join()
    print(f"run: {args.clients} clients, {args.writes - max(budget['left'], 0)} write attempts, log {args.log}")


# ---------------------------------------------------------------------------------------------
# independent checker

def etcd_lock_history(path, resources):
    """From etcd's event history (one watch response per line, `etcdctl watch -w json`): per
    resource, the revisions that can be a hand-over revision (the holder is the key under
    "<resource>/" with the lowest create revision, as etcd's lock recipe decides; when it changes,
    both the revision of the change and the new holder's create revision are legitimate marks:
    src/watch.rs takes the later of the two, its compacted-history fallback the holder's create
    revision) and the revision ranges in which no key was there (the lock was free)."""
    events = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            for ev in json.loads(line).get("Events") or []:
                kv = ev["kv"]
                key = base64.b64decode(kv["key"]).decode()
                events.append((kv["mod_revision"], ev.get("type", 0) == 1, key, kv.get("create_revision", 0)))
    events.sort(key=lambda e: e[0])
    out = {}
    for res in resources:
        prefix = res + "/"
        keys, held, free, free_from, holder = {}, set(), [], 1, None
        mine = [e for e in events if e[2].startswith(prefix)]
        for i, (rev, deleted, key, created) in enumerate(mine):
            if deleted:
                keys.pop(key, None)
            else:
                if not keys and free_from is not None:
                    free.append((free_from, rev - 1))
                free_from = None
                keys.setdefault(key, created)
            last_of_rev = i + 1 == len(mine) or mine[i + 1][0] != rev
            if last_of_rev:
                if keys:
                    first = min(keys.items(), key=lambda kv: kv[1])
                    if first != holder:
                        holder = first
                        held.update((rev, first[1]))
                else:
                    holder = None
                    if free_from is None:
                        free_from = rev
        if free_from is not None:
            free.append((free_from, float("inf")))
        out[res] = (held, free)
    return out


def check(args):
    begins, writes, commits, grants, prunes = {}, [], {}, [], []
    with open(args.log) as f:
        for line in f:
            rec = json.loads(line)
            if rec["ev"] == "grant":
                grants.append(rec)
            elif rec["ev"] == "prune":
                prunes.append(rec)
            elif rec["ev"] == "begin":
                begins[rec["txn"]] = rec
            elif rec["ev"] == "write":
                writes.append(rec)
            elif rec["ev"] == "commit":
                commits[rec["txn"]] = rec

    conn = psycopg2.connect(args.dsn)
    conn.autocommit = True
    cur = conn.cursor()
    # The server decides what committed and when; the client's log says what was attempted.
    status, commit_ts = {}, {}
    xids = [b["xid"] for b in begins.values() if b.get("xid") is not None]
    xids += [p["xid"] for p in prunes if p.get("xid") is not None]
    for i in range(0, len(xids), 5000):
        chunk = xids[i:i + 5000]
        cur.execute("SELECT x, txid_status(x), extract(epoch FROM pg_xact_commit_timestamp((x %% 4294967296)::text::xid)) "
                    "FROM unnest(%s::bigint[]) x", (chunk,))
        for x, st, ts in cur.fetchall():
            status[x] = st
            commit_ts[x] = float(ts) if ts is not None else None

    # Transactions that wrote WAL besides their commit record: a row changed, or an advance.
    # PostgreSQL commits the others asynchronously whatever synchronous_commit says (nothing of
    # theirs could be lost), so a crash may take their commit with it and hand their xid out
    # again: no proof of a lost write (a DELETE that matched no row did that once in 7 runs).
    wrote = {w["txn"] for w in writes if w["outcome"] == "ok" and (w["rows"] or w["op"] == "advance")}
    problems = []
    counts = {"transactions": len(begins), "attempted writes": 0, "accepted": 0, "rejected (FT001)": 0}
    other_errors = {}
    committed_txn = {}
    txn_commit_ts = {}
    for tag, b in begins.items():
        st = status.get(b["xid"])
        claimed = commits.get(tag, {}).get("outcome")
        ended = commits.get(tag, {}).get("t")
        ts = commit_ts.get(b["xid"])
        if st == "committed" and ts is not None and ended is not None and ts > ended:
            # The server committed this xid only after this client had given up on the
            # transaction (its connection was gone): after a crash, xids whose WAL records were
            # lost are handed out again, so this is another transaction's commit.
            st = "aborted (its xid was reused after the crash)"
        txn_commit_ts[tag] = ts if st == "committed" else None
        if claimed == "ok" and st != "committed":
            if tag in wrote:
                problems.append(f"LOST: client saw transaction {tag} (xid {b['xid']}) commit, server says {st}")
            else:
                counts["commits without writes lost in the crash"] = counts.get("commits without writes lost in the crash", 0) + 1
        if claimed and claimed.startswith("rolled back") and st == "committed":
            problems.append(f"transaction {tag} was rolled back by the client but is committed")
        committed_txn[tag] = st == "committed"
    counts["committed transactions"] = sum(committed_txn.values())

    # Per domain: (commit_ts, token, txn) of committed writes, and rejections to justify.
    domain_writes = {}
    row_last = {}      # (table, id) -> (commit_ts, token, op)
    rejections = []
    for w in writes:
        counts["attempted writes"] += 1 if w["op"] != "advance" else 0
        if w["outcome"] == "ok":
            if w["op"] != "advance":
                counts["accepted"] += 1
        elif w["outcome"] == "FT001":
            counts["rejected (FT001)"] += 1
            rejections.append(w)
        else:
            other_errors[w["outcome"]] = other_errors.get(w["outcome"], 0) + 1
            expected = EXPECTED_ERRORS | (LOCK_SERVICE_ERRORS if args.lock_service else set())
            if w["outcome"] not in expected and not (args.after_crash and w["outcome"] in ("CONN", "57P01", "57P02", "57P03", "08006", "08003", "25P02")):
                problems.append(f"unexpected error {w['outcome']} in {w['txn']}: {w.get('message', '')}")
        if w["outcome"] != "ok" or not committed_txn.get(w["txn"]):
            continue
        ts = txn_commit_ts.get(w["txn"])
        if ts is None:
            problems.append(f"committed transaction {w['txn']} has no commit timestamp (track_commit_timestamp off?)")
            continue
        if w["resource"]:
            domain_writes.setdefault(("resource", w["resource"]), []).append((ts, w["token"], w["txn"]))
        for r in w["rows"]:
            if not w["resource"]:
                domain_writes.setdefault(("row", r), []).append((ts, w["token"], w["txn"]))
            prev = row_last.get((w["table"], r))
            if prev is None or prev[0] <= ts:
                row_last[(w["table"], r)] = (ts, w["token"], w["op"])

    violations = 0
    ties = 0
    for dom, seq in domain_writes.items():
        seq[:] = sorted(set(seq))   # one entry per transaction and domain
        high = None
        for i, (ts, tok, tag) in enumerate(seq):
            if high is not None and tok < high[1]:
                if ts == high[0]:
                    ties += 1
                else:
                    violations += 1
                    problems.append(f"VIOLATION on {dom}: token {tok} ({tag}) committed at {ts:.6f} after "
                                    f"token {high[1]} ({high[2]}) committed at {high[0]:.6f}")
            if high is None or tok > high[1]:
                high = (ts, tok, tag)

    # Committed prunes (--prune): (commit time, floor). The server's word, as for the clients.
    floors = []
    for p in prunes:
        st = status.get(p.get("xid"))
        ts = commit_ts.get(p.get("xid"))
        if st == "committed" and ts is not None and ts <= p["t"] + 0.001:
            floors.append((ts, p["floor"]))
        elif p.get("outcome") == "ok":
            problems.append(f"LOST: prune at floor {p['floor']} (xid {p.get('xid')}) committed for the pruner, server says {st}")
        elif p.get("outcome") not in ("40P01", "CONN", "57P01", "57P02", "57P03", "08006", "08003"):
            problems.append(f"unexpected error {p.get('outcome')} in a prune at floor {p['floor']}")
    counts["prunes committed"] = len(floors)
    by_floor = 0

    # Every rejection must be explained by a committed write/advance with a higher token that
    # committed before the rejected statement returned (or, per-row, a prune's floor above it).
    history = etcd_lock_history(args.etcd_history, RESOURCE_TABLES.values()) if args.etcd_history else None
    unjustified = by_history = 0
    for w in rejections:
        dom = ("resource", w["resource"]) if w["resource"] else ("row", w["rows"][0])
        ok = any(tok > w["token"] and ts <= w["t1"] + 0.001 for ts, tok, _ in domain_writes.get(dom, []))
        if not ok and not w["resource"] and any(f > w["token"] and ts <= w["t1"] + 0.001 for ts, f in floors):
            ok = True
            by_floor += 1
        if not ok and args.lock_service and w["resource"]:
            # A hand-over to a higher token before the statement returned (fencing_watch).
            # The client logs a grant when it learns its token, a moment after etcd granted it
            # (and the watch raised the mark): allow a second.
            ok = any(g["resource"] == w["resource"] and g["token"] > w["token"] and g["t"] <= w["t1"] + 1.0
                     for g in grants)
        if not ok and history is not None and w["resource"] in history and w.get("mark") is not None:
            # The mark the write met, accounted for by etcd's own history: a grant (possibly to
            # a client that gave up waiting for it) or a revision at which the lock was free.
            held, free = history[w["resource"]]
            mark = w["mark"]
            ok = mark > w["token"] and (mark in held or any(a <= mark <= b for a, b in free))
            if ok:
                by_history += 1
        if not ok:
            unjustified += 1
            problems.append(f"UNJUSTIFIED rejection of token {w['token']} on {dom} ({w['txn']})")

    # Final state: marks never below the committed history, rows carry their last committed token.
    cur.execute("SELECT resource, high_water FROM fencing_resources WHERE resource LIKE 'stress-%'")
    marks = dict(cur.fetchall())
    for (kind, name), seq in domain_writes.items():
        if kind == "resource":
            top = max(t for _, t, _ in seq)
            if marks.get(name) is None or marks[name] < top:
                problems.append(f"high-water mark of {name} is {marks.get(name)}, below committed token {top}")
    for table in list(RESOURCE_TABLES) + [ROW_TABLE]:
        cur.execute(f"SELECT id, fence_token FROM {table}")
        present = dict(cur.fetchall())
        for (t, r), (ts, tok, op) in row_last.items():
            if t != table:
                continue
            if op == "delete":
                if r in present and present[r] < tok:
                    problems.append(f"{table} row {r}: deleted at token {tok} but present with token {present[r]}")
            elif present.get(r) != tok:
                problems.append(f"{table} row {r}: last committed write carried token {tok}, row has {present.get(r)}")
    cur.execute("SELECT t.key, t.high_water FROM _pg_fencing.row_tombstone t JOIN _pg_fencing.protected_table p "
                "ON p.id = t.protection_id WHERE p.relid = %s::regclass", (ROW_TABLE,))
    tombs = dict(cur.fetchall())
    # A pruned tombstone is replaced by the table's floor (the high-water mark of keys without one).
    cur.execute("SELECT coalesce(tombstone_floor, 0) FROM _pg_fencing.protected_table WHERE relid = %s::regclass",
                (ROW_TABLE,))
    floor_now = cur.fetchone()[0]
    if floors and floor_now < max(f for _, f in floors):
        problems.append(f"tombstone floor of {ROW_TABLE} is {floor_now}, below committed prune floor {max(f for _, f in floors)}")
    for (t, r), (ts, tok, op) in row_last.items():
        if t == ROW_TABLE and op == "delete" and max(tombs.get(f"({r})", 0), floor_now) < tok:
            problems.append(f"tombstone of {ROW_TABLE} key {r} is {tombs.get(f'({r})')} (floor {floor_now}), "
                            f"below delete token {tok}")

    if args.lock_service:
        counts["lock grants"] = len(grants)
    counts["other errors"] = other_errors
    counts["same-timestamp ties (not orderable)"] = ties
    counts["violations"] = violations
    if history is not None:
        counts["rejections justified by etcd history"] = by_history
    if args.prune or floors:
        counts["rejections justified by a prune's floor"] = by_floor
    counts["unjustified rejections"] = unjustified
    print("stress check:")
    for k, v in counts.items():
        print(f"  {k:40} {v}")
    for p in problems[:50]:
        print("  PROBLEM:", p)
    if len(problems) > 50:
        print(f"  ... and {len(problems) - 50} more problems")
    return 1 if problems else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["setup", "run", "check"])
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--log")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--writes", type=int, default=20000)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--after-crash", action="store_true")
    ap.add_argument("--lock-service", action="store_true",
                    help="tokens came from a lock service (tests/partition): see above")
    ap.add_argument("--etcd-history", help="etcd's event history of the lock keys (with --lock-service): see above")
    ap.add_argument("--prune", action="store_true",
                    help="run: a pruner thread prunes the per-row table's tombstones during the load (see above)")
    ap.add_argument("--unfenced", action="store_true",
                    help="negative control: run the load with the guard triggers skipped")
    args = ap.parse_args()
    if args.command == "setup":
        setup(args.dsn)
    elif args.command == "run":
        run(args)
    else:
        sys.exit(check(args))


if __name__ == "__main__":
    main()
