"""Tests of the Python package pg-fencing (clients/python), installed from its built wheel by
tests/pyclient/run.sh, against a real server with pg_fencing preloaded and
log_statement = all (the statements each transaction sends are counted from the server's log).

  "$PY" tests/pyclient/test_client.py --dsn DSN --url URL --log FILE
"""
import argparse
import asyncio
import sys
import time

import asyncpg
import psycopg
import psycopg2
import psycopg_pool

import pg_fencing
from pg_fencing import (LeaseLost, LockServiceUnavailable, NoToken, NotCurrentHolder,
                        ProtectionInactive, StaleToken)
from pg_fencing import asyncpg as pf_asyncpg
from pg_fencing import psycopg as pf_psycopg
from pg_fencing import psycopg2 as pf_psycopg2

FAILS = []


def check(what, cond, got=None):
    print(f"  {'ok' if cond else 'FAIL'}: {what}" + ("" if cond else f" (got {got!r})"))
    if not cond:
        FAILS.append(what)


def raises(what, exc_type, fn, **attrs):
    try:
        fn()
    except exc_type as e:
        bad = {k: getattr(e, k, None) for k, v in attrs.items() if getattr(e, k, None) != v}
        check(what, not bad, bad)
        return e
    except Exception as e:  # noqa: BLE001
        check(what, False, f"{type(e).__name__}: {e}")
        return None
    check(what, False, "no error")
    return None


async def araises(what, exc_type, coro, **attrs):
    try:
        await coro
    except exc_type as e:
        bad = {k: getattr(e, k, None) for k, v in attrs.items() if getattr(e, k, None) != v}
        check(what, not bad, bad)
        return
    except Exception as e:  # noqa: BLE001
        check(what, False, f"{type(e).__name__}: {e}")
        return
    check(what, False, "no error")


def statements(log, app):
    """The statements the server logged for connections named ``app``."""
    with open(log) as f:
        return [l for l in f if f"[{app}]" in l and "LOG:  statement:" in l or
                (f"[{app}]" in l and "LOG:  execute" in l)]


def token_forms(a, admin, pgss):
    """The statement that carries the token, per driver, on one connection: the first fenced
    transaction asks (the probe), the next ones use its answer: ``set_config`` where
    pg_stat_statements is loaded (``pgss``, PostgreSQL 15 here), ``SET LOCAL`` where it is not.
    Either way a stale token is refused and the connection's next transaction has no token."""
    where = "with pg_stat_statements" if pgss else "without pg_stat_statements"
    print(f"-- the token's statement, {where}")
    admin.execute("CREATE TABLE IF NOT EXISTS forms (id int PRIMARY KEY, v int)")
    resource = "forms_pgss" if pgss else "forms_nopgss"
    admin.execute("SELECT fencing_protect('forms', %s)", (resource,))
    admin.execute("SELECT fencing_advance(%s, 10)", (resource,))
    with psycopg.connect(a.dsn) as c, pf_psycopg.fenced(c, 10):
        c.execute("INSERT INTO forms VALUES (1, 0) ON CONFLICT DO NOTHING")
    suffix = "pgss" if pgss else "nopgss"
    # Each driver its pair of tokens (the second raises the mark), a stale one below them.
    tokens = {}

    def pair(app):
        base = 10 + 2 * len(tokens)
        tokens[app] = base + 1
        return base, base + 1

    def sync_driver(name, connect, fenced_, execute, plain_txn):
        app = f"pff_{name}_{suffix}"
        c = connect(app)
        for tok in pair(app):
            with fenced_(c, tok) as cur:
                execute(c, cur, "UPDATE forms SET v = v + 1 WHERE id = 1")

        def stale():
            with fenced_(c, 9) as cur:
                execute(c, cur, "UPDATE forms SET v = v + 100 WHERE id = 1")
        raises(f"{name}: a stale token in the second form is refused", StaleToken, stale, token=9)
        try:
            plain_txn(c, "UPDATE forms SET v = v + 100 WHERE id = 1")
            check(f"{name}: the next transaction carries no token", False, "committed")
        except Exception as err:  # noqa: BLE001
            check(f"{name}: the next transaction carries no token (NoToken)",
                  isinstance(pg_fencing.from_error(err), NoToken), err)
        c.close()
        return app

    def p3_plain(c, sql):
        with c.transaction():
            c.execute(sql)

    def p2_plain(c, sql):
        with c, c.cursor() as cur:
            cur.execute(sql)
    apps = [sync_driver("psycopg", lambda app: psycopg.connect(a.dsn, application_name=app),
                        pf_psycopg.fenced, lambda c, cur, sql: c.execute(sql), p3_plain),
            sync_driver("psycopg2", lambda app: psycopg2.connect(a.dsn, application_name=app),
                        pf_psycopg2.fenced, lambda c, cur, sql: cur.execute(sql), p2_plain)]

    async def async_drivers():
        app = f"pff_psycopgasync_{suffix}"
        c = await psycopg.AsyncConnection.connect(a.dsn, application_name=app)
        for tok in pair(app):
            async with pf_psycopg.afenced(c, tok):
                await c.execute("UPDATE forms SET v = v + 1 WHERE id = 1")

        async def astale():
            async with pf_psycopg.afenced(c, 9):
                await c.execute("UPDATE forms SET v = v + 100 WHERE id = 1")
        await araises("psycopg async: a stale token in the second form is refused", StaleToken, astale(), token=9)
        await c.close()
        apps.append(app)
        app = f"pff_asyncpg_{suffix}"
        pool = await asyncpg.create_pool(a.url, min_size=1, max_size=1, server_settings={"application_name": app})
        for tok in pair(app):  # a pool's connection: a new proxy for each acquire
            async with pool.acquire() as c:
                async with pf_asyncpg.fenced(c, tok):
                    await c.execute("UPDATE forms SET v = v + 1 WHERE id = 1")

        async def pstale():
            async with pool.acquire() as c:
                async with pf_asyncpg.fenced(c, 9):
                    await c.execute("UPDATE forms SET v = v + 100 WHERE id = 1")
        await araises("asyncpg (pool): a stale token in the second form is refused", StaleToken, pstale(), token=9)
        async with pool.acquire() as c:
            try:
                async with c.transaction():
                    await c.execute("UPDATE forms SET v = v + 100 WHERE id = 1")
                check("asyncpg (pool): the next borrower carries no token", False, "committed")
            except asyncpg.PostgresError as err:
                check("asyncpg (pool): the next borrower carries no token (NoToken)",
                      isinstance(pg_fencing.from_error(err), NoToken), err)
        await pool.close()
        apps.append(app)
    asyncio.run(async_drivers())
    check("nothing stale or tokenless was written", admin.execute("SELECT v FROM forms WHERE id = 1").fetchone()[0] == 8,
          admin.execute("SELECT v FROM forms WHERE id = 1").fetchone()[0])
    time.sleep(0.3)
    # PostgreSQL 16 and later normalise a SET's constants: SET LOCAL from the first transaction.
    v16 = admin.info.server_version >= 160000
    for app in apps:
        t = tokens[app]
        set_local = v16 or not pgss
        want = f"SET LOCAL pg_fencing.token = '{t}'" if set_local else f"SELECT pg_catalog.set_config('pg_fencing.token', '{t}', true)"
        begins = [l for l in statements(a.log, app) if "statement: BEGIN;" in l]
        first_ok = len(begins) >= 2 and (begins[0].rstrip().endswith(f"BEGIN; SET LOCAL pg_fencing.token = '{t - 1}'")
                                         if v16 else "UNION ALL SELECT NULL WHERE" in begins[0])
        second_ok = len(begins) >= 2 and begins[1].rstrip().endswith("BEGIN; " + want)
        first = "sends SET LOCAL" if v16 else "asks"
        check(f"{app}: the first transaction {first}, the second sends `{want}`", first_ok and second_ok,
              begins[:2])
    admin.execute("SELECT fencing_unprotect('forms')")
    admin.execute("DROP TABLE forms")


def sharing_part(a, admin):
    """A connection shared by two fenced blocks at once, a block cancelled while its BEGIN is in
    flight, a connection closed inside the block: never a write with another block's token,
    never a connection left in the fenced transaction, never a silent loss."""
    print("-- one connection, two fenced blocks at once; cancelled and closed blocks")
    admin.execute("CREATE TABLE shared (id int PRIMARY KEY, v int)")
    admin.execute("SELECT fencing_protect('shared', 'shared')")
    admin.execute("SELECT fencing_advance('shared', 11)")
    with psycopg.connect(a.dsn) as c, pf_psycopg.fenced(c, 11):
        c.execute("INSERT INTO shared VALUES (1, 0), (2, 0)")

    async def two_blocks():
        c = await psycopg.AsyncConnection.connect(a.dsn)
        out = {}

        async def block(name, token, sql):
            try:
                async with pf_psycopg.afenced(c, token):
                    await c.execute(sql)
                out[name] = "ok"
            except Exception as e:  # noqa: BLE001
                out[name] = type(e).__name__
        await asyncio.gather(block("stale", 10, "UPDATE shared SET v = 100 WHERE id = 1"),
                             block("holder", 11, "UPDATE shared SET v = 1 WHERE id = 2"))
        await c.close()
        return out
    out = asyncio.run(two_blocks())
    check(f"psycopg async: a second fenced block on a connection in use is refused ({out})",
          out.get("holder") == "RuntimeError" and out.get("stale") in ("StaleToken", "ok"), out)
    check("… the stale block's write never commits with the other block's token",
          admin.execute("SELECT v FROM shared WHERE id = 1").fetchone()[0] == 0)

    async def cancelled():
        c = await asyncpg.connect(a.url)

        async def use():
            async with pf_asyncpg.fenced(c, 11):
                await c.execute("UPDATE shared SET v = v + 1 WHERE id = 2")
        task = asyncio.create_task(use())
        await asyncio.sleep(0)  # the BEGIN is sent; its answer not yet read
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        if c.is_closed():
            return "closed"
        try:
            token = await c.fetchval("SHOW pg_fencing.token")
            state = "in a transaction" if c.is_in_transaction() else "idle"
            await c.close()
            return f"{state}, token {token!r}"
        except Exception as e:  # noqa: BLE001
            return type(e).__name__
    got = asyncio.run(cancelled())
    check(f"asyncpg: a block cancelled with its BEGIN in flight leaves no connection in the fenced transaction ({got})",
          got == "closed" or got == "idle, token ''", got)

    c2 = psycopg2.connect(a.dsn)

    def closed_inside():
        with pf_psycopg2.fenced(c2, 11) as cur:
            cur.execute("UPDATE shared SET v = 50 WHERE id = 2")
            c2.close()
    raises("psycopg2: a connection closed inside the block is an error, not a silent loss",
           psycopg2.InterfaceError, closed_inside)
    check("… nothing of it committed", admin.execute("SELECT v FROM shared WHERE id = 2").fetchone()[0] != 50)
    admin.execute("SELECT fencing_unprotect('shared')")
    admin.execute("DROP TABLE shared")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--url", required=True, help="the same server as a URL (asyncpg)")
    ap.add_argument("--log", required=True)
    ap.add_argument("--set-local-only", action="store_true",
                    help="only the token's statement on a server without pg_stat_statements")
    a = ap.parse_args()
    dsn = a.dsn
    admin = psycopg.connect(dsn, autocommit=True)
    if a.set_local_only:
        token_forms(a, admin, pgss=False)
        print(f"python client (without pg_stat_statements): {'FAILED' if FAILS else 'all checks passed'}")
        return 1 if FAILS else 0
    token_forms(a, admin, pgss=True)
    sharing_part(a, admin)
    admin.execute("CREATE TABLE IF NOT EXISTS acct (id int PRIMARY KEY, v int)")
    admin.execute("SELECT fencing_protect('acct', 'py')")
    admin.execute("SELECT fencing_advance('py', 10)")

    print("-- tokens")
    raises("a str token is refused", TypeError, lambda: pg_fencing.check_token("10"))
    raises("a bool token is refused", TypeError, lambda: pg_fencing.check_token(True))
    raises("token 0 is refused", ValueError, lambda: pg_fencing.check_token(0))
    raises("token 2^63 is refused", ValueError, lambda: pg_fencing.check_token(2**63))

    print("-- psycopg 3")
    conn = psycopg.connect(dsn, application_name="pf_psycopg")
    with pf_psycopg.fenced(conn, 10):
        conn.execute("INSERT INTO acct VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET v = 1")
    check("a fenced transaction commits, the row stamped with its token",
          admin.execute("SELECT fence_token FROM acct WHERE id = 1").fetchone()[0] == 10)
    check("the connection is back to its own mode (not autocommit)", conn.autocommit is False)

    def stale():
        with pf_psycopg.fenced(conn, 9):
            conn.execute("UPDATE acct SET v = 2 WHERE id = 1")
    e = raises("a stale token raises StaleToken with the resource and numbers", StaleToken, stale,
               sqlstate="FT001", token=9, high_water=10, resource="py", superseded=True)
    check("StaleToken's cause is psycopg's error", isinstance(getattr(e, "__cause__", None), psycopg.Error))
    check("the refused transaction left nothing", admin.execute("SELECT v FROM acct WHERE id = 1").fetchone()[0] == 1)

    try:
        with conn.transaction():
            conn.execute("UPDATE acct SET v = 3 WHERE id = 1")
        check("the same connection after a fenced transaction carries no token", False, "committed")
    except psycopg.Error as err:
        check("the same connection after a fenced transaction carries no token (FT002 → NoToken)",
              isinstance(pg_fencing.from_error(err), NoToken), err.sqlstate)

    def in_block():
        with pf_psycopg.fenced(conn, 10):
            conn.execute("UPDATE acct SET v = 4 WHERE id = 1")
            raise KeyError("the handler failed")
    raises("an exception in the block rolls back and propagates unchanged", KeyError, in_block)
    check("… nothing committed", admin.execute("SELECT v FROM acct WHERE id = 1").fetchone()[0] == 1)

    conn.close()
    ac = psycopg.connect(dsn, autocommit=True)
    with pf_psycopg.fenced(ac, 10):
        ac.execute("UPDATE acct SET v = 41 WHERE id = 1")
        ac.execute("UPDATE acct SET v = 42 WHERE id = 1")
        check("in autocommit mode the block's statements share one transaction",
              ac.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS, ac.info.transaction_status)
    check("… committed at its end, and the connection stays in autocommit mode",
          admin.execute("SELECT v FROM acct WHERE id = 1").fetchone()[0] == 42 and ac.autocommit is True)

    def stale_ac():
        with pf_psycopg.fenced(ac, 9):
            ac.execute("UPDATE acct SET v = 43 WHERE id = 1")
    raises("in autocommit mode a stale token raises StaleToken", StaleToken, stale_ac, token=9)
    check("… and the connection is idle again", ac.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)
    ac.close()
    with psycopg.connect(dsn) as fix, pf_psycopg.fenced(fix, 10):
        fix.execute("UPDATE acct SET v = 1 WHERE id = 1")
    # Round trips: a fenced transaction sends as many statements as the same unfenced one.
    fc = psycopg.connect(dsn, application_name="pf_rt_fenced")
    uc = psycopg.connect(dsn, application_name="pf_rt_plain")
    with pf_psycopg.fenced(fc, 10):
        fc.execute("UPDATE acct SET v = v + 1 WHERE id = %s", (1,))
    admin.execute("CREATE TABLE IF NOT EXISTS plain (id int PRIMARY KEY, v int)")
    admin.execute("INSERT INTO plain VALUES (1, 0) ON CONFLICT DO NOTHING")
    with uc.transaction():
        uc.execute("UPDATE plain SET v = v + 1 WHERE id = %s", (1,))
    time.sleep(0.3)
    nf, nu = len(statements(a.log, "pf_rt_fenced")), len(statements(a.log, "pf_rt_plain"))
    check(f"psycopg 3: a fenced one-row transaction sends as many statements as an unfenced one ({nf} and {nu})",
          nf == nu and nf > 0, (nf, nu))
    fc.close()
    uc.close()

    # The same for psycopg2 and asyncpg.
    f2 = psycopg2.connect(dsn, application_name="pf2_rt_fenced")
    u2 = psycopg2.connect(dsn, application_name="pf2_rt_plain")
    with pf_psycopg2.fenced(f2, 10) as cur:
        cur.execute("UPDATE acct SET v = v + 1 WHERE id = %s", (1,))
    with u2, u2.cursor() as cur:
        cur.execute("UPDATE plain SET v = v + 1 WHERE id = %s", (1,))
    f2.close()
    u2.close()

    async def asyncpg_round_trips():
        fa = await asyncpg.connect(a.url, server_settings={"application_name": "pfa_rt_fenced"})
        ua = await asyncpg.connect(a.url, server_settings={"application_name": "pfa_rt_plain"})
        async with pf_asyncpg.fenced(fa, 10):
            await fa.execute("UPDATE acct SET v = v + 1 WHERE id = $1", 1)
        async with ua.transaction():
            await ua.execute("UPDATE plain SET v = v + 1 WHERE id = $1", 1)
        await fa.close()
        await ua.close()
    asyncio.run(asyncpg_round_trips())
    time.sleep(0.3)
    for drv, app in (("psycopg2", "pf2"), ("asyncpg", "pfa")):
        nf, nu = len(statements(a.log, f"{app}_rt_fenced")), len(statements(a.log, f"{app}_rt_plain"))
        check(f"{drv}: a fenced one-row transaction sends as many statements as an unfenced one ({nf} and {nu})",
              nf == nu and nf > 0, (nf, nu))

    print("-- pg_stat_statements: one entry whatever the token (not one per token)")
    admin.execute("SELECT pg_stat_statements_reset()")
    tokens = (4242424201, 4242424202, 4242424203)
    for tok in tokens:
        with psycopg.connect(dsn) as c3, pf_psycopg.fenced(c3, tok):
            c3.execute("SELECT 1")
        c4 = psycopg2.connect(dsn)
        with pf_psycopg2.fenced(c4, tok) as cur:
            cur.execute("SELECT 1")
        c4.close()

        async def one_asyncpg(tok=tok):
            c5 = await asyncpg.connect(a.url)
            async with pf_asyncpg.fenced(c5, tok):
                await c5.execute("SELECT 1")
            await c5.close()
        asyncio.run(one_asyncpg())
    per_token = admin.execute("SELECT query FROM pg_stat_statements WHERE query ~ '42424242'").fetchall()
    check(f"no pg_stat_statements entry carries a token ({len(per_token)} do)", not per_token, per_token)
    setter = admin.execute("SELECT sum(calls) FROM pg_stat_statements WHERE query ~* 'pg_fencing|set_config'").fetchone()[0]
    check(f"the token's statement is one normalised entry, called once per transaction ({setter})",
          setter is not None and setter >= 9, setter)

    print("-- psycopg_pool: the next borrower never carries the token")
    with psycopg_pool.ConnectionPool(dsn, min_size=1, max_size=1, open=True) as pool:
        with pool.connection() as c1:
            pid1 = c1.info.backend_pid
            with pf_psycopg.fenced(c1, 10):
                c1.execute("UPDATE acct SET v = v + 1 WHERE id = 1")
        with pool.connection() as c2:
            check("the same server connection is lent again", c2.info.backend_pid == pid1)
            try:
                with c2.transaction():
                    c2.execute("UPDATE acct SET v = v + 1 WHERE id = 1")
                check("the next borrower's write without a token is refused", False, "committed")
            except psycopg.Error as err:
                check("the next borrower's write without a token is refused (FT002 → NoToken)",
                      isinstance(pg_fencing.from_error(err), NoToken), err.sqlstate)

    print("-- typed errors for every SQLSTATE")
    for state, cls in (("FT001", StaleToken), ("FT002", NoToken), ("FT003", LeaseLost),
                       ("FT004", ProtectionInactive), ("FT005", LockServiceUnavailable),
                       ("FT006", NotCurrentHolder)):
        try:
            admin.execute(f"DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '{state}'; END $$")
        except psycopg.Error as err:
            t = pg_fencing.from_error(err)
            check(f"{state} → {cls.__name__}", type(t) is cls and t.sqlstate == state, type(t))
    try:
        admin.execute("SELECT 1/0")
    except psycopg.Error as err:
        check("another SQLSTATE is not a fencing error", pg_fencing.from_error(err) is None)
    c = psycopg.connect(dsn)

    def inactive():
        with pf_psycopg.fenced(c, 10):
            c.execute("""SELECT fenced_update('plain', '{"id": 1}', '{"v": 5}', 10)""")
    raises("fenced_update of a table that is not protected: ProtectionInactive", ProtectionInactive,
           inactive, sqlstate="FT004")
    c.close()

    print("-- psycopg2")
    c2 = psycopg2.connect(dsn, application_name="pf_psycopg2")
    with pf_psycopg2.fenced(c2, 10) as cur:
        cur.execute("UPDATE acct SET v = %s WHERE id = %s", (6, 1))
    check("psycopg2: committed", admin.execute("SELECT v FROM acct WHERE id = 1").fetchone()[0] == 6)

    def stale2():
        with pf_psycopg2.fenced(c2, 3) as cur:
            cur.execute("UPDATE acct SET v = 7 WHERE id = 1")
    raises("psycopg2: StaleToken", StaleToken, stale2, token=3, high_water=10, resource="py")
    check("psycopg2: the connection is back to its own mode", c2.autocommit is False)

    def in_with_block():
        with c2:
            with pf_psycopg2.fenced(c2, 10) as cur:
                cur.execute("UPDATE acct SET v = 99 WHERE id = 1")
    raises("psycopg2: fenced() inside `with conn:` (psycopg2's own transaction) is refused", RuntimeError, in_with_block)
    check("… nothing written, the connection idle in its own mode",
          admin.execute("SELECT v FROM acct WHERE id = 1").fetchone()[0] == 6 and c2.autocommit is False
          and c2.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE)
    c2.close()

    print("-- a PostgreSQL lease (psycopg 3)")
    with pf_psycopg.Lease(dsn, "py-lease", ttl=1.2) as lease:
        check("the lease has a token", isinstance(lease.token, int) and lease.token > 0)
        admin.execute("SELECT fencing_advance('py', %s)", (lease.token,))
        time.sleep(2.0)
        check("renewed past its TTL, it is not lost", not lease.lost.is_set(), lease.error)
        w = psycopg.connect(dsn)
        with pf_psycopg.fenced(w, lease.token):
            lease.check()
            w.execute("UPDATE acct SET v = 8 WHERE id = 1")
        check("a write with the live lease's token", admin.execute("SELECT v FROM acct WHERE id = 1").fetchone()[0] == 8)
        admin.execute("SELECT pg_terminate_backend(%s)", (lease.backend_pid,))
        lost = lease.lost.wait(3)
        check("a lease whose renewal fails is lost", lost)
        raises("lease.check() raises LeaseLost", LeaseLost, lease.check)
        w.close()
    token = lease.token
    time.sleep(1.3)
    w = psycopg.connect(dsn)

    def expired():
        with pf_psycopg.fenced(w, token):
            w.execute("UPDATE acct SET v = 9 WHERE id = 1")
    raises("the lost lease's token, expired, is refused by the server (LeaseLost)", LeaseLost, expired, sqlstate="FT003")
    w.close()

    print("-- run_with_lease: a lease lost mid-job stops the handler before its write commits")

    def job(conn):
        conn.execute("UPDATE acct SET v = 10 WHERE id = 1")
        pid = admin.execute("SELECT pid FROM pg_stat_activity WHERE query LIKE 'SELECT fencing_lease_%' "
                            "AND pid <> pg_backend_pid() ORDER BY backend_start DESC LIMIT 1").fetchone()
        admin.execute("SELECT pg_terminate_backend(%s)", (pid[0],))
        time.sleep(1.0)
        return "done"
    raises("run_with_lease raises LeaseLost", LeaseLost,
           lambda: pf_psycopg.run_with_lease(dsn, "py-job", 0.9, job))
    check("… and its write was not committed", admin.execute("SELECT v FROM acct WHERE id = 1").fetchone()[0] == 8)
    r = pf_psycopg.run_with_lease(dsn, "py-job2", 5, lambda conn: conn.execute(
        "SELECT fencing_advance('py', current_setting('pg_fencing.token')::bigint)").fetchone()[0])
    check("run_with_lease returns the function's result", isinstance(r, int) and r > 0, r)

    print("-- psycopg 3 async and asyncpg")

    admin.execute("CREATE TABLE acct2 (id int PRIMARY KEY, v int)")
    admin.execute("SELECT fencing_protect('acct2', 'py2')")
    admin.execute("SELECT fencing_advance('py2', 20)")

    async def async_part():
        top = 20
        ac = await psycopg.AsyncConnection.connect(dsn)
        async with pf_psycopg.afenced(ac, top):
            await ac.execute("INSERT INTO acct2 VALUES (1, 11)")
        check("psycopg async: committed", admin.execute("SELECT v FROM acct2 WHERE id = 1").fetchone()[0] == 11)

        async def astale():
            async with pf_psycopg.afenced(ac, 5):
                await ac.execute("UPDATE acct2 SET v = 12 WHERE id = 1")
        await araises("psycopg async: StaleToken", StaleToken, astale(), token=5)
        await ac.close()
        conn = await asyncpg.connect(a.url, server_settings={"application_name": "pf_asyncpg"})
        async with pf_asyncpg.fenced(conn, top):
            await conn.execute("UPDATE acct2 SET v = $1 WHERE id = $2", 13, 1)
        check("asyncpg: committed", admin.execute("SELECT v FROM acct2 WHERE id = 1").fetchone()[0] == 13)

        async def astale2():
            async with pf_asyncpg.fenced(conn, 5):
                await conn.execute("UPDATE acct2 SET v = 14 WHERE id = 1")
        await araises("asyncpg: StaleToken with the numbers", StaleToken, astale2(), token=5, high_water=top)
        try:
            await conn.execute("UPDATE acct2 SET v = 15 WHERE id = 1")
            check("asyncpg: no token after the fenced transaction", False, "committed")
        except asyncpg.PostgresError as err:
            check("asyncpg: no token after the fenced transaction (NoToken)",
                  isinstance(pg_fencing.from_error(err), NoToken), err.sqlstate)
        async with pf_asyncpg.Lease(a.url, "py-async-lease", ttl=1.2) as lease:
            await asyncio.sleep(1.8)
            check("asyncpg lease renewed past its TTL", not lease.lost.is_set(), lease.error)
        await conn.close()

    asyncio.run(async_part())
    outside_check_part(a, admin)
    ended_inside_part(a, admin)
    orm_part(a, admin)
    print(f"python client: {'FAILED' if FAILS else 'all checks passed'}")
    return 1 if FAILS else 0


def outside_check_part(a, admin):
    """What the outside check of the packages found (each fixed; its repro showed the old code
    failing)."""
    import os
    import signal

    import psycopg2.pool

    dsn = a.dsn
    admin.execute("CREATE TABLE oc (id int PRIMARY KEY, v int)")
    admin.execute("SELECT fencing_protect('oc', 'oc')")
    admin.execute("SELECT fencing_advance('oc', 20)")
    with psycopg.connect(dsn) as c, pf_psycopg.fenced(c, 20):
        c.execute("INSERT INTO oc VALUES (1, 0)")
    v = lambda: admin.execute("SELECT v FROM oc WHERE id = 1").fetchone()[0]  # noqa: E731

    print("-- psycopg2: the block closes the cursor fenced() gave it; the pool's next borrower")
    pool = psycopg2.pool.SimpleConnectionPool(1, 1, dsn)
    c = pool.getconn()
    try:
        with pf_psycopg2.fenced(c, 20) as cur:
            with cur:
                cur.execute("UPDATE oc SET v = v + 100 WHERE id = 1")
    except Exception as e:  # noqa: BLE001
        check("closing the yielded cursor does not break the commit", False, repr(e))
    pool.putconn(c)
    c = pool.getconn()
    lent = c.get_transaction_status()
    with c.cursor() as cur:
        cur.execute("SELECT current_setting('pg_fencing.token', true)")
        carried = cur.fetchone()[0]
    check(f"the next borrower gets an idle connection that carries no token ({carried!r})",
          not carried and lent == psycopg2.extensions.TRANSACTION_STATUS_IDLE and c.autocommit is False,
          (carried, lent, c.autocommit))
    c.rollback()
    pool.putconn(c)
    pool.closeall()
    check("… the block's write committed once", v() == 100, v())

    print("-- a failed statement whose error the block caught: RolledBack, nothing committed")

    def swallow_p3():
        with psycopg.connect(dsn) as c3, pf_psycopg.fenced(c3, 20):
            c3.execute("UPDATE oc SET v = v + 1 WHERE id = 1")
            try:
                c3.execute("SELECT 1/0")
            except psycopg.Error:
                pass
    raises("psycopg 3: RolledBack", pg_fencing.RolledBack, swallow_p3)

    def swallow_p2():
        c2 = psycopg2.connect(dsn)
        try:
            with pf_psycopg2.fenced(c2, 20) as cur:
                cur.execute("UPDATE oc SET v = v + 1 WHERE id = 1")
                try:
                    cur.execute("SELECT 1/0")
                except psycopg2.Error:
                    pass
        finally:
            c2.close()
    raises("psycopg2: RolledBack", pg_fencing.RolledBack, swallow_p2)

    async def swallow_async():
        out = []
        ac = await psycopg.AsyncConnection.connect(dsn)
        try:
            async with pf_psycopg.afenced(ac, 20):
                await ac.execute("UPDATE oc SET v = v + 1 WHERE id = 1")
                try:
                    await ac.execute("SELECT 1/0")
                except psycopg.Error:
                    pass
        except pg_fencing.RolledBack:
            out.append("psycopg async")
        await ac.close()
        c5 = await asyncpg.connect(a.url)
        try:
            async with pf_asyncpg.fenced(c5, 20):
                await c5.execute("UPDATE oc SET v = v + 1 WHERE id = 1")
                try:
                    await c5.execute("SELECT 1/0")
                except asyncpg.PostgresError:
                    pass
        except pg_fencing.RolledBack:
            out.append("asyncpg")
        await c5.close()
        return out
    got = asyncio.run(swallow_async())
    check("psycopg 3 async and asyncpg: RolledBack", got == ["psycopg async", "asyncpg"], got)
    check("… nothing of those blocks committed", v() == 100, v())

    print("-- tokens: an int subclass cannot change what is sent")

    class Evil(int):
        def __str__(self):
            return "1', true); SELECT set_config('pg_fencing.token', '999999"

        __format__ = lambda self, spec: str(self)  # noqa: E731

        def __gt__(self, other):
            return True

        def __le__(self, other):
            return True
    check("the BEGIN query carries the plain value", pg_fencing.check_token(Evil(7)) == 7
          and type(pg_fencing.check_token(Evil(7))) is int
          and not any("999999" in pg_fencing._sql.set_token(Evil(7), form) for form in (False, True)))
    raises("a negative int subclass with lying comparisons is refused", ValueError,
           lambda: pg_fencing.check_token(Evil(-7)))

    print("-- typed errors: names with quotes, spaces and newlines")
    for name in ('quo"te', 'two""quotes', 'x" of table y', "new\nline"):
        admin.execute("SELECT fencing_advance(%s, 5)", (name,))
        try:
            admin.execute("SELECT fencing_advance(%s, 4)", (name,))
        except psycopg.Error as err:
            e = pg_fencing.from_error(err)
            check(f"resource {name!r}: parsed exactly", e is not None and e.resource == name and e.token == 4
                  and e.high_water == 5, e and (e.resource, e.token, e.high_water))
    admin.execute('CREATE TABLE "my table" (id text PRIMARY KEY, v int)')
    admin.execute("""SELECT fencing_protect('"my table"')""")
    with psycopg.connect(dsn) as c, pf_psycopg.fenced(c, 9):
        c.execute("""INSERT INTO "my table" VALUES (%s, 1)""", ("a\nb",))

    def odd_row():
        with psycopg.connect(dsn) as c, pf_psycopg.fenced(c, 8):
            c.execute("""UPDATE "my table" SET v = 2 WHERE id = %s""", ("a\nb",))
    e = raises("a row of a table with a space in its name, a key with a newline", StaleToken, odd_row,
               token=8, high_water=9, table='public."my table"')
    check("… its row parsed", e is not None and e.row is not None and "a" in e.row and "b" in e.row, e and e.row)

    print("-- a lease whose renewals stall (its connection frozen) is lost at its TTL")
    with pf_psycopg.Lease(dsn, "oc-stall", ttl=1.2) as lease:
        time.sleep(0.2)
        os.kill(lease.backend_pid, signal.SIGSTOP)
        t0 = time.time()
        try:
            time.sleep(1.6)
            raises("lease.check() raises LeaseLost once the TTL passed without a renewal", LeaseLost, lease.check)
            t0 = time.time()
        finally:
            os.kill(lease.backend_pid, signal.SIGCONT)
    check("… and release() did not wait for the stalled renewal (or returned once it could)",
          time.time() - t0 < 2.0, time.time() - t0)

    def stalled_job(conn):
        conn.execute("UPDATE oc SET v = 7 WHERE id = 1")
        pid = admin.execute("SELECT holder_pid FROM fencing_leases WHERE name = 'oc-job'").fetchone()[0]
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(1.5)
        finally:
            os.kill(pid, signal.SIGCONT)
        return "done"
    raises("run_with_lease whose lease stalled past its TTL raises LeaseLost", LeaseLost,
           lambda: pf_psycopg.run_with_lease(dsn, "oc-job", 1.0, stalled_job))
    check("… and its write was not committed", v() == 100, v())

# What a fenced block that ends the fenced transaction itself raises (its message contains it).
ENDED = "ended the fenced transaction"


def ended_check(what, fn):
    """``fn()`` (a block that ran ROLLBACK or COMMIT itself) raises RuntimeError saying so: never
    reported as committed."""
    e = raises(f"{what}: EndedInBlock, not success", pg_fencing.EndedInBlock, fn)
    check(f"… a RuntimeError whose message says '{ENDED}'",
          isinstance(e, RuntimeError) and ENDED in str(e), e)


async def aended_check(what, fn):
    """``ended_check`` of a coroutine function."""
    try:
        await fn()
        check(f"{what}: EndedInBlock, not success", False, "no error")
    except pg_fencing.EndedInBlock as e:
        check(f"{what}: EndedInBlock saying '{ENDED}'", ENDED in str(e), e)
    except Exception as e:  # noqa: BLE001
        check(f"{what}: EndedInBlock", False, f"{type(e).__name__}: {e}")


def ended_inside_part(a, admin):
    """The block ends the fenced transaction itself (a ROLLBACK or COMMIT statement, or the
    driver's rollback()/commit() where it sends one): the helper's COMMIT would find no
    transaction (a warning, no error), so it must not report success."""
    dsn = a.dsn
    admin.execute("CREATE TABLE ei (id int PRIMARY KEY, v int)")
    admin.execute("SELECT fencing_protect('ei', 'ei')")
    admin.execute("SELECT fencing_advance('ei', 40)")
    with psycopg.connect(dsn) as c, pf_psycopg.fenced(c, 40):
        c.execute("INSERT INTO ei VALUES (1, 0)")
    v = lambda: admin.execute("SELECT v FROM ei WHERE id = 1").fetchone()[0]  # noqa: E731

    print("-- the block ends the fenced transaction itself: never reported as committed")
    for end in ("ROLLBACK", "COMMIT", "rollback()", "commit()"):
        before = v()
        c = psycopg.connect(dsn)

        def p3():
            with pf_psycopg.fenced(c, 40):
                c.execute("UPDATE ei SET v = v + 1 WHERE id = 1")
                if end.endswith("()"):
                    getattr(c, end[:-2])()
                else:
                    c.execute(end)
        ended_check(f"psycopg 3: the block ran {end}", p3)
        check("… the connection is left idle", c.closed or c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)
        c.close()
        if end.startswith("ROLLBACK") or end == "rollback()":
            check("… nothing committed", v() == before, v())

    for end in ("ROLLBACK", "COMMIT"):
        before = v()
        c2 = psycopg2.connect(dsn)

        def p2():
            with pf_psycopg2.fenced(c2, 40) as cur:
                cur.execute("UPDATE ei SET v = v + 1 WHERE id = 1")
                cur.execute(end)
        ended_check(f"psycopg2: the block ran {end}", p2)
        check("… the connection is left idle, its own mode back", c2.closed or (
            c2.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE and c2.autocommit is False))
        c2.close()
        if end == "ROLLBACK":
            check("… nothing committed", v() == before, v())

    async def async_ended():
        for end in ("ROLLBACK", "COMMIT"):
            before = v()
            ac = await psycopg.AsyncConnection.connect(dsn)

            async def p3a():
                async with pf_psycopg.afenced(ac, 40):
                    await ac.execute("UPDATE ei SET v = v + 1 WHERE id = 1")
                    await ac.execute(end)
            await aended_check(f"psycopg 3 async: the block ran {end}", p3a)
            check("… the connection is left idle, its own mode back", ac.closed or (
                ac.info.transaction_status == psycopg.pq.TransactionStatus.IDLE and ac.autocommit is False))
            await ac.close()
            if end == "ROLLBACK":
                check("… nothing committed", v() == before, v())

            before = v()
            c5 = await asyncpg.connect(a.url)

            async def apg():
                async with pf_asyncpg.fenced(c5, 40):
                    await c5.execute("UPDATE ei SET v = v + 1 WHERE id = 1")
                    await c5.execute(end)
            await aended_check(f"asyncpg: the block ran {end}", apg)
            check("… the connection is left idle", c5.is_closed() or not c5.is_in_transaction())
            await c5.close()
            if end == "ROLLBACK":
                check("… nothing committed", v() == before, v())
    asyncio.run(async_ended())


def orm_part(a, admin):
    """SQLAlchemy 2 (psycopg 3 and psycopg2 dialects, Connection and Session) and Django."""
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    from pg_fencing import sqlalchemy as pf_sa

    admin.execute("CREATE TABLE orm (id int PRIMARY KEY, v int)")
    admin.execute("SELECT fencing_protect('orm', 'orm')")
    admin.execute("SELECT fencing_advance('orm', 30)")
    admin.execute("CREATE TABLE orm_plain (id int PRIMARY KEY, v int)")
    admin.execute("INSERT INTO orm_plain VALUES (1, 0)")
    v = lambda: admin.execute("SELECT v FROM orm WHERE id = 1").fetchone()[0]  # noqa: E731
    url = a.url.replace("postgresql://", "postgresql+psycopg://")
    print("-- SQLAlchemy (psycopg 3)")
    eng = sa.create_engine(url, connect_args={"application_name": "pf_sa_fenced"})
    with eng.connect() as c:
        with pf_sa.fenced(c, 30):
            c.execute(sa.text("INSERT INTO orm VALUES (1, 1)"))
        check("SQLAlchemy Connection: committed, stamped",
              admin.execute("SELECT v, fence_token FROM orm WHERE id = 1").fetchone() == (1, 30))

        def stale():
            with pf_sa.fenced(c, 29):
                c.execute(sa.text("UPDATE orm SET v = 2 WHERE id = 1"))
        e = raises("SQLAlchemy: StaleToken from its DBAPIError", StaleToken, stale, token=29, high_water=30,
                   resource="orm")
        check("… its cause is SQLAlchemy's error", isinstance(getattr(e, "__cause__", None), sa.exc.DBAPIError))
        check("… nothing committed, the connection out of its transaction", v() == 1 and not c.in_transaction())
        try:
            with c.begin():
                c.execute(sa.text("UPDATE orm SET v = 3 WHERE id = 1"))
            check("SQLAlchemy: the same connection afterwards carries no token", False, "committed")
        except sa.exc.DBAPIError as err:
            check("SQLAlchemy: the same connection afterwards carries no token (NoToken)",
                  isinstance(pg_fencing.from_error(err), NoToken))
        c.rollback()
        with c.begin():
            raises("fenced() inside a transaction is refused", RuntimeError,
                   lambda: pf_sa.fenced(c, 30).__enter__())
    def sa_swallow():
        with eng.connect() as c, pf_sa.fenced(c, 30):
            c.execute(sa.text("UPDATE orm SET v = 3 WHERE id = 1"))
            try:
                c.execute(sa.text("SELECT 1/0"))
            except sa.exc.DBAPIError:
                pass
    raises("SQLAlchemy: a failed statement's error caught in the block: RolledBack", pg_fencing.RolledBack, sa_swallow)
    check("… nothing committed", v() == 1, v())
    for end in ("ROLLBACK", "COMMIT"):
        before = v()

        def sa_ended():
            with eng.connect() as c, pf_sa.fenced(c, 30):
                c.execute(sa.text("UPDATE orm SET v = v + 1 WHERE id = 1"))
                c.execute(sa.text(end))
        ended_check(f"SQLAlchemy (psycopg 3): the block ran {end}", sa_ended)
        if end == "ROLLBACK":
            check("… nothing committed", v() == before, v())
    with Session(eng) as session:
        with pf_sa.fenced(session, 30):
            session.execute(sa.text("UPDATE orm SET v = 4 WHERE id = 1"))
        check("SQLAlchemy Session: committed", v() == 4)

        def in_block():
            with pf_sa.fenced(session, 30):
                session.execute(sa.text("UPDATE orm SET v = 5 WHERE id = 1"))
                raise KeyError("the handler failed")
        raises("SQLAlchemy Session: an exception rolls back and propagates", KeyError, in_block)
        check("… nothing committed", v() == 4)
    plain = sa.create_engine(url, connect_args={"application_name": "pf_sa_plain"})
    with eng.connect() as f, plain.connect() as u:
        with pf_sa.fenced(f, 30):
            f.execute(sa.text("UPDATE orm SET v = v + 1 WHERE id = :id"), {"id": 1})
        with u.begin():
            u.execute(sa.text("UPDATE orm_plain SET v = v + 1 WHERE id = :id"), {"id": 1})
    eng.dispose()
    plain.dispose()
    time.sleep(0.3)
    # Each engine's last transaction, from its BEGIN (SQLAlchemy's first connection also sends
    # the dialect's set-up queries): as many statements fenced as unfenced.
    def last_txn(app):
        st = statements(a.log, app)
        begin = max(i for i, l in enumerate(st) if "statement: BEGIN" in l)
        return st[begin:]
    lf, lu = last_txn("pf_sa_fenced"), last_txn("pf_sa_plain")
    # The engine's first transaction asked (PostgreSQL 15 with pg_stat_statements: set_config).
    begin_form = ("BEGIN; SET LOCAL pg_fencing.token" if admin.info.server_version >= 160000
                  else "BEGIN; SELECT pg_catalog.set_config")
    check(f"SQLAlchemy (psycopg 3): a fenced transaction sends as many statements as an unfenced one "
          f"({len(lf)} and {len(lu)})", len(lf) == len(lu) == 3 and begin_form in lf[0]
          and "COMMIT" in lf[-1] and "COMMIT" in lu[-1], (lf, lu))

    print("-- SQLAlchemy (psycopg2): the token as one more statement")
    eng2 = sa.create_engine(a.url.replace("postgresql://", "postgresql+psycopg2://"))
    with eng2.connect() as c:
        with pf_sa.fenced(c, 30):
            c.execute(sa.text("UPDATE orm SET v = 7 WHERE id = 1"))
        check("psycopg2 dialect: committed", v() == 7)

        def stale2():
            with pf_sa.fenced(c, 1):
                c.execute(sa.text("UPDATE orm SET v = 8 WHERE id = 1"))
        raises("psycopg2 dialect: StaleToken", StaleToken, stale2, token=1)

        for end in ("ROLLBACK", "COMMIT"):
            before = v()

            def sa2_ended():
                with pf_sa.fenced(c, 30):
                    c.execute(sa.text("UPDATE orm SET v = v + 1 WHERE id = 1"))
                    c.execute(sa.text(end))
            ended_check(f"SQLAlchemy (psycopg2): the block ran {end}", sa2_ended)
            check("… the connection out of its transaction", not c.in_transaction())
            if end == "ROLLBACK":
                check("… nothing committed", v() == before, v())
    eng2.dispose()

    print("-- Django")
    import django
    from django.conf import settings
    from django.db import connection, transaction

    from pg_fencing import django as pf_django
    host, port = a.url.split("@")[1].split("/")[0].split(":")
    settings.configure(DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "postgres",
                                              "USER": "postgres", "HOST": host, "PORT": port,
                                              "OPTIONS": {"application_name": "pf_django"}}},
                       USE_TZ=True)
    django.setup()
    with pf_django.fenced(30):
        with connection.cursor() as cur:
            cur.execute("UPDATE orm SET v = 9 WHERE id = 1")
            with transaction.atomic():  # a savepoint inside
                cur.execute("UPDATE orm SET v = 10 WHERE id = 1")
    check(f"Django ({connection.Database.__name__}): committed, a savepoint inside works", v() == 10)

    def dstale():
        with pf_django.fenced(29):
            with connection.cursor() as cur:
                cur.execute("UPDATE orm SET v = 11 WHERE id = 1")
    raises("Django: StaleToken from its DatabaseError", StaleToken, dstale, token=29, resource="orm")
    check("… nothing committed, autocommit back on", v() == 10 and connection.get_autocommit())
    try:
        with connection.cursor() as cur:
            cur.execute("UPDATE orm SET v = 12 WHERE id = 1")
        check("Django: the connection afterwards carries no token", False, "committed")
    except Exception as err:  # noqa: BLE001
        check("Django: the connection afterwards carries no token (NoToken)", isinstance(pg_fencing.from_error(err), NoToken), err)
    with transaction.atomic():
        raises("Django: fenced() inside atomic() is refused", RuntimeError, lambda: pf_django.fenced(30).__enter__())
    transaction.set_autocommit(False)
    try:
        raises("Django: fenced() with autocommit off (atomic() only a savepoint then) is refused", RuntimeError,
               lambda: pf_django.fenced(30).__enter__())
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)

    def dswallow():
        with pf_django.fenced(30):
            with connection.cursor() as cur:
                cur.execute("UPDATE orm SET v = 13 WHERE id = 1")
                try:
                    cur.execute("SELECT 1/0")
                except Exception:  # noqa: BLE001
                    pass
    raises("Django: a failed statement's error caught in the block: RolledBack", pg_fencing.RolledBack, dswallow)
    check("… nothing committed", v() == 10, v())

    for end in ("ROLLBACK", "COMMIT"):
        before = v()

        def dended():
            with pf_django.fenced(30):
                with connection.cursor() as cur:
                    cur.execute("UPDATE orm SET v = v + 1 WHERE id = 1")
                    cur.execute(end)
        ended_check(f"Django: the block ran {end}", dended)
        check("… autocommit back on, not in atomic()", connection.get_autocommit() and not connection.in_atomic_block)
        if end == "ROLLBACK":
            check("… nothing committed", v() == before, v())
    connection.close()


if __name__ == "__main__":
    sys.exit(main())
