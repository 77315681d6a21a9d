"""PostgreSQL leases under concurrency (docs/leases.md): waiting and waking, timeouts, cancel,
renewal from another session, NOTIFY pg_fencing, and a concurrent run checked by an independent
checker. Run by tests/leases/run.sh against a throwaway cluster (PGHOST/PGPORT set).

The checker does not trust pg_fencing: it reads what each client saw (the grant's acquired_at and
expires_at as the database clock reported them in the grant's own transaction, renewals and
releases with their clock readings) and the commit timestamps PostgreSQL recorded for the logged
writes (track_commit_timestamp), and checks
  * at most one live holder per name at any instant: each grant of a name starts at or after the
    end (expiry, or release) of the one before, and its token is higher;
  * committed writes of each resource, in commit order, never carry a decreasing token;
  * every committed write was made while its lease was live: the write's statement began before
    the lease's end (the time fence).
"""
import json
import os
import random
import sys
import threading
import time

import psycopg2
import psycopg2.extensions

failures = []


def check(what, cond, detail=""):
    print(("  PASS: " if cond else "  FAIL: ") + what + (f" ({detail})" if detail and not cond else ""))
    if not cond:
        failures.append(what)


def connect(autocommit=True):
    c = psycopg2.connect("")
    c.autocommit = autocommit
    return c


def q(conn, sql, args=()):
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchone() if cur.description else None


def sqlstate_of(fn):
    try:
        fn()
        return "ok"
    except psycopg2.Error as e:
        return e.pgcode


def in_thread(fn):
    out = {}

    def run():
        t0 = time.monotonic()
        try:
            out["value"] = fn()
            out["state"] = "ok"
        except psycopg2.Error as e:
            out["state"] = e.pgcode
        out["seconds"] = time.monotonic() - t0
        out["end"] = time.monotonic()

    t = threading.Thread(target=run)
    t.start()
    return t, out


def pid_of(conn):
    return q(conn, "SELECT pg_backend_pid()")[0]


def wait_waiting(pid, within=30.0):
    """Waits (a generous bound: a loaded machine) until backend pid runs a statement that waits
    (pg_stat_activity: active, with a wait event), so that what the check does next (a release,
    a cancel, a rollback) meets the wait and not a statement still on its way. True if in time."""
    obs = connect()
    try:
        end = time.monotonic() + within
        while time.monotonic() < end:
            if q(obs, "SELECT coalesce(bool_or(state = 'active' AND wait_event_type IS NOT NULL), false) "
                      "FROM pg_stat_activity WHERE pid = %s", (pid,))[0]:
                return True
            time.sleep(0.02)
        return False
    finally:
        obs.close()


def lease_times(conn, token):
    """(acquired_at, expires_at) of a lease, by the database's clock."""
    return q(conn, "SELECT acquired_at, expires_at FROM fencing_leases WHERE token = %s", (token,))


def waiting_and_waking():
    print("-- a waiter is woken by the release's commit, not by polling")
    a, b = connect(), connect()
    ta = q(a, "SELECT fencing_lease_acquire('w', '30s')")[0]
    bpid = pid_of(b)
    t, out = in_thread(lambda: q(b, "SELECT fencing_lease_acquire('w', '5s', '20s')")[0])
    check("the waiter is still waiting while the lease is held", wait_waiting(bpid) and t.is_alive())
    released_at = time.monotonic()
    check("release returns true", q(a, "SELECT fencing_lease_release(%s)", (ta,))[0] is True)
    t.join(30)
    woke = time.monotonic() - released_at
    check("the waiter got the lease", out.get("state") == "ok", out)
    # Its wait (20 s) and the holder's expiry (30 s) are far off: only the release can wake it.
    check("... soon after the release (the holder's expiry 30 s away, its wait 20 s)", woke < 5.0, f"{woke:.2f} s")
    check("... with a higher token", out.get("value", 0) > ta)
    q(b, "SELECT fencing_lease_release(%s)", (out["value"],))

    print("-- a waiter takes the lease when the holder's lease expires")
    ta = q(a, "SELECT fencing_lease_acquire('e', '1500ms')")[0]
    a_expires = lease_times(a, ta)[1]
    tb = q(b, "SELECT fencing_lease_acquire('e', '5s', '10s')")[0]
    b_acquired = lease_times(b, tb)[0]
    # By the database's clock: not before the holder's expiry, and long before the end of the
    # waiter's own wait (10 s).
    late = (b_acquired - a_expires).total_seconds()
    check("granted at the holder's expiry (1.5 s)", 0 <= late < 5.0,
          f"{late:.3f} s after the holder's lease ended")
    check("with a higher token", tb > ta)
    check("the old holder can no longer renew (FT003)",
          sqlstate_of(lambda: q(a, "SELECT fencing_lease_renew(%s)", (ta,))) == "FT003")

    print("-- wait runs out, statement_timeout, cancel")
    q(a, "SELECT fencing_lease_acquire('held', '60s')")
    # (statement_timeout 20 s only keeps a wait that does not end from hanging the test.)
    q(b, "SET statement_timeout = '20s'")
    t0 = time.monotonic()
    st = sqlstate_of(lambda: q(b, "SELECT fencing_lease_acquire('held', '5s', '500ms')"))
    took = time.monotonic() - t0
    check("wait 500ms runs out: 55P03", st == "55P03", st)
    check("... after about 0.5 s", 0.45 <= took < 10.0, f"{took:.2f} s")
    q(b, "SET statement_timeout = '300ms'")
    t0 = time.monotonic()
    st = sqlstate_of(lambda: q(b, "SELECT fencing_lease_acquire('held', '5s', '30s')"))
    took = time.monotonic() - t0
    check("statement_timeout ends the wait: 57014", st == "57014", st)
    check("... after about 0.3 s, not the wait's 30 s", took < 10.0, f"{took:.2f} s")
    q(b, "SET statement_timeout = '20s'")
    print("-- a grant not yet committed is waited for at most `wait` too")
    u = connect(autocommit=False)
    q(u, "SELECT fencing_lease_acquire('uncommitted', '60s')")
    for wait, least in (("0", 0.0), ("700ms", 0.65)):
        t0 = time.monotonic()
        st = sqlstate_of(lambda: q(b, "SELECT fencing_lease_acquire('uncommitted', '5s', %s)", (wait,)))
        took = time.monotonic() - t0
        check(f"wait {wait}: 55P03 while the holder's grant is uncommitted", st == "55P03", st)
        check(f"... after its wait, not after the grant's end (statement_timeout 20 s)", least <= took < 10.0,
              f"{took:.2f} s")
    u.rollback()
    q(b, "RESET statement_timeout")
    print("-- a grant that waited for an uncommitted one gets its full ttl from when it got the name")
    q(u, "SELECT fencing_lease_acquire('late', '60s')")
    bpid = pid_of(b)

    def late():
        tok = q(b, "SELECT fencing_lease_acquire('late', '2s', '30s')")[0]
        return q(b, "SELECT %s, expires_at FROM fencing_leases WHERE token = %s", (tok, tok))
    t, out = in_thread(late)
    # The waiter has waited a while (1.5 s) when the other grant rolls back: a ttl counted from
    # its statement's start would end less than 0.5 s after the rollback.
    waited = wait_waiting(bpid)
    time.sleep(1.5)
    rolled_back_at = q(u, "SELECT clock_timestamp()")[0]
    u.rollback()
    t.join(30)
    check("the waiter got it once the other grant rolled back", waited and out.get("state") == "ok", out)
    left = (out["value"][1] - rolled_back_at).total_seconds() if out.get("state") == "ok" else -1
    check("... with all of its 2 s ttl from then on (database clock)", left >= 2.0,
          f"it ends {left:.3f} s after the rollback")
    check("after that grant rolled back the name is free",
          sqlstate_of(lambda: q(b, "SELECT fencing_lease_release(fencing_lease_acquire('uncommitted', '5s'))")) == "ok")
    u.close()
    pid = pid_of(b)
    t, out = in_thread(lambda: q(b, "SELECT fencing_lease_acquire('held', '5s', '30s')"))
    waited = wait_waiting(pid)   # cancelled once it waits (a cancel before the statement is lost)
    cancelled_at = time.monotonic()
    q(a, "SELECT pg_cancel_backend(%s)", (pid,))
    t.join(30)
    check("query cancel ends the wait: 57014", waited and out.get("state") == "57014", out)
    after = out.get("end", float("inf")) - cancelled_at
    check("... at once, not after the wait's 30 s", after < 10.0, f"{after:.2f} s after the cancel")
    a.close()
    b.close()


def renew_elsewhere():
    print("-- another session renews the lease; writes keep flowing past the first ttl")
    a, c = connect(), connect()
    tok = q(a, "SELECT fencing_lease_acquire('r', '1500ms')")[0]
    # Renewed for long enough that the write below, made after the first ttl, is inside it
    # however slow the machine is.
    new_expiry_ok = q(c, "SELECT fencing_lease_renew(%s, '60s') > clock_timestamp() + '50s'", (tok,))[0]
    check("renewed from another session", new_expiry_ok is True)
    time.sleep(2.0)
    st = sqlstate_of(lambda: q(a, "BEGIN; SELECT set_config('pg_fencing.token', %s, true); "
                                  "UPDATE ledger SET v = v + 1 WHERE id = 1; COMMIT", (str(tok),)))
    check("a write after the first ttl is admitted", st == "ok", st)
    check("released from the other session", q(c, "SELECT fencing_lease_release(%s)", (tok,))[0] is True)
    a.rollback() if not a.autocommit else None
    st = sqlstate_of(lambda: q(a, "BEGIN; SELECT set_config('pg_fencing.token', %s, true); "
                                  "UPDATE ledger SET v = v + 1 WHERE id = 1; COMMIT", (str(tok),)))
    q(a, "ROLLBACK")
    check("after the release the write is refused: FT003", st == "FT003", st)
    a.close()
    c.close()


def notices():
    print("-- NOTIFY pg_fencing")
    lis, a, b = connect(), connect(), connect()
    q(lis, "LISTEN pg_fencing")

    def received(timeout=15.0):
        # What must arrive is waited for up to 15 s (a loaded machine); "none" is checked over
        # a short time, and a late one would show in the next check.
        got, end = [], time.monotonic() + timeout
        while time.monotonic() < end:
            lis.poll()
            while lis.notifies:
                got.append(json.loads(lis.notifies.pop(0).payload))
            if got:
                return got
            time.sleep(0.05)
        return got

    ta = q(a, "SELECT fencing_lease_acquire('n', '1s')")[0]
    time.sleep(1.1)
    tb = q(b, "SELECT fencing_lease_acquire('n', '30s')")[0]
    got = received()
    check("take-over sends one notice", len(got) == 1, got)
    check("... naming the lease, the new and the previous token",
          got[:1] == [{"event": "lease_taken_over", "lease": "n", "token": tb, "previous_token": ta}], got)
    q(b, "SELECT fencing_lease_release(%s)", (tb,))
    check("a release and a new grant of a free name send none", received(0.5) == [])

    tx = q(a, "SELECT fencing_lease_acquire('nx', '30s')")[0]
    q(a, "BEGIN; SELECT set_config('pg_fencing.token', %s, true); UPDATE ledger SET v = 0 WHERE id = 2; COMMIT", (str(tx),))
    ty = q(b, "SELECT fencing_lease_acquire('ny', '30s')")[0]
    q(b, "BEGIN; SELECT set_config('pg_fencing.token', %s, true); UPDATE ledger SET v = 1 WHERE id = 2; COMMIT", (str(ty),))
    got = received()
    check("a mark rising above a live lease's token sends a notice",
          got == [{"event": "mark_raised", "resource": "ledger", "token": ty, "previous_token": tx}], got)
    q(b, "SELECT fencing_lease_release(%s)", (ty,))
    tz = q(a, "SELECT fencing_lease_acquire('nz', '30s')")[0]
    q(a, "BEGIN; SELECT set_config('pg_fencing.token', %s, true); UPDATE ledger SET v = 2 WHERE id = 2; COMMIT", (str(tz),))
    got = received(0.5)
    check("... but not when the previous mark's lease is no longer live (released)", got == [], got)
    for t in (tx, tz):
        q(a, "SELECT fencing_lease_release(%s)", (t,))
    lis.close()
    a.close()
    b.close()


def concurrent_run(seconds, clients, seed, unfenced):
    print(f"-- {clients} clients, {seconds} s, 3 lease names, zombies among them (seed {seed})"
          + (", tables NOT protected (negative control)" if unfenced else ""))
    names = ["c0", "c1", "c2"]
    setup = connect()
    for n in names:
        q(setup, f"CREATE TABLE res_{n} (id int PRIMARY KEY, v bigint)")
        if not unfenced:
            q(setup, f"SELECT fencing_protect('res_{n}', 'res-{n}')")
    q(setup, "CREATE TABLE write_log (name text, token bigint, began timestamptz)")
    setup.close()
    grants, lock = [], threading.Lock()
    stop = time.monotonic() + seconds
    refused = {"FT003": 0, "FT001": 0}

    def client(i):
        rng = random.Random(seed * 100 + i)
        conn = connect(autocommit=False)
        while time.monotonic() < stop:
            name = rng.choice(names)
            ttl_ms = rng.randint(150, 600)
            try:
                cur = conn.cursor()
                cur.execute("SELECT fencing_lease_acquire(%s, %s::interval, '2s')", (name, f"{ttl_ms}ms"))
                tok = cur.fetchone()[0]
                cur.execute("SELECT acquired_at, expires_at FROM fencing_leases WHERE token = %s", (tok,))
                acquired_at, expires_at = cur.fetchone()
                conn.commit()
            except psycopg2.Error as e:
                conn.rollback()
                if e.pgcode != "55P03":
                    failures.append(f"acquire failed: {e.pgcode} {e}")
                continue
            g = {"name": name, "token": tok, "acquired_at": acquired_at, "end": expires_at}
            with lock:
                grants.append(g)
            for _ in range(rng.randint(1, 4)):
                # Sometimes pause past the lease (a zombie), sometimes renew first.
                r = rng.random()
                if r < 0.25:
                    time.sleep(ttl_ms / 1000 * rng.uniform(0.8, 1.6))
                elif r < 0.5:
                    try:
                        cur.execute("SELECT fencing_lease_renew(%s, %s::interval)", (tok, f"{ttl_ms}ms"))
                        new_end = cur.fetchone()[0]
                        conn.commit()
                        with lock:
                            g["end"] = max(g["end"], new_end)
                    except psycopg2.Error as e:
                        conn.rollback()
                        if e.pgcode != "FT003":
                            failures.append(f"renew failed: {e.pgcode} {e}")
                try:
                    cur.execute("SELECT set_config('pg_fencing.token', %s, true)", (str(tok),))
                    cur.execute("INSERT INTO write_log VALUES (%s, %s, clock_timestamp())", (name, tok))
                    cur.execute(f"INSERT INTO res_{name} VALUES (1, %s) ON CONFLICT (id) DO UPDATE SET v = excluded.v", (tok,))
                    conn.commit()
                except psycopg2.Error as e:
                    conn.rollback()
                    if e.pgcode in refused:
                        with lock:
                            refused[e.pgcode] += 1
                    else:
                        failures.append(f"write failed: {e.pgcode} {e}")
            if rng.random() < 0.6:
                try:
                    cur.execute("SELECT fencing_lease_release(%s), clock_timestamp()", (tok,))
                    live, at = cur.fetchone()
                    conn.commit()
                    if live:
                        with lock:
                            g["end"] = min(g["end"], at)
                except psycopg2.Error as e:
                    conn.rollback()
                    failures.append(f"release failed: {e.pgcode} {e}")
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    conn = connect()
    with conn.cursor() as cur:
        cur.execute("SELECT name, token, began, pg_xact_commit_timestamp(xmin) FROM write_log")
        writes = cur.fetchall()
    conn.close()
    by_token = {g["token"]: g for g in grants}
    overlaps, order, fence = [], [], []
    for n in names:
        gs = sorted((g for g in grants if g["name"] == n), key=lambda g: g["acquired_at"])
        for prev, cur_ in zip(gs, gs[1:]):
            if cur_["acquired_at"] < prev["end"]:
                overlaps.append((n, prev["token"], str(prev["end"]), cur_["token"], str(cur_["acquired_at"])))
            if cur_["token"] <= prev["token"]:
                order.append((n, prev["token"], cur_["token"]))
        ws = sorted((w for w in writes if w[0] == n), key=lambda w: w[3])
        for prev, cur_ in zip(ws, ws[1:]):
            if cur_[1] < prev[1]:
                order.append(("write", n, prev[1], cur_[1]))
    for name, tok, began, _ in writes:
        g = by_token.get(tok)
        if g is None or not (g["acquired_at"] <= began < g["end"]):
            fence.append((name, tok, str(began), g and str(g["end"])))
    print(f"  {len(grants)} grants, {len(writes)} committed writes, refused: {refused}")
    check("enough grants and writes to mean something", len(grants) >= 30 and len(writes) >= 30,
          f"{len(grants)} grants, {len(writes)} writes")
    if not unfenced:
        check("zombies were refused (the run exercised the fence)", refused["FT003"] > 0, refused)
    check("at most one live holder per name at any instant", not overlaps, overlaps[:3])
    check("tokens of grants and of committed writes never decrease", not order, order[:3])
    check("every committed write began while its lease was live", not fence, fence[:3])


def main():
    unfenced = os.environ.get("LEASE_UNFENCED") == "1"
    seconds = float(os.environ.get("LEASE_SECONDS", "12"))
    seed = int(os.environ.get("LEASE_SEED", "1"))
    if unfenced:
        # The negative control: without the fence the checker must see zombie writes land.
        connect().cursor().execute("CREATE EXTENSION IF NOT EXISTS pg_fencing")
        concurrent_run(seconds, 8, seed, True)
        sys.exit(1 if failures else 0)
    setup = connect()
    q(setup, "CREATE EXTENSION IF NOT EXISTS pg_fencing")
    q(setup, "CREATE TABLE ledger (id int PRIMARY KEY, v bigint)")
    q(setup, "SELECT fencing_protect('ledger', 'ledger')")
    tok = q(setup, "SELECT fencing_lease_acquire('setup', '10s')")[0]
    q(setup, "BEGIN; SELECT set_config('pg_fencing.token', %s, true); "
             "INSERT INTO ledger VALUES (1, 0), (2, 0); COMMIT", (str(tok),))
    q(setup, "SELECT fencing_lease_release(%s)", (tok,))
    setup.close()
    waiting_and_waking()
    renew_elsewhere()
    notices()
    concurrent_run(seconds, 8, seed, False)
    if failures:
        print(f"FAIL: {len(failures)} check(s) failed", file=sys.stderr)
        sys.exit(1)
    print("all lease checks passed")


if __name__ == "__main__":
    main()
