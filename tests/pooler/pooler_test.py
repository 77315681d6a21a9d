"""Pooler safety: a fencing token set by one client must never be used by another client that
later runs on the same server connection of a transaction-mode pgbouncer.

Started by tests/pooler/run.sh (a throwaway cluster and pgbouncer with ONE server connection, so
every client runs on the same backend; each check first proves that). Exits 1 on any failure.
"""
import os
import sys

import psycopg2

BOUNCER = int(os.environ["BOUNCER_PORT"])
failures = 0


def ok(cond, what):
    global failures
    print(("  ok: " if cond else "  FAIL: ") + what)
    if not cond:
        failures += 1


def client():
    c = psycopg2.connect(host="127.0.0.1", port=BOUNCER, dbname="postgres", user="postgres")
    c.autocommit = True
    return c


def run(c, sql):
    """(rows or None, SQLSTATE or None)."""
    cur = c.cursor()
    try:
        cur.execute(sql)
        return (cur.fetchall() if cur.description else None), None
    except psycopg2.Error as e:
        if not c.autocommit or c.get_transaction_status() != 0:
            c.rollback()
        return None, e.pgcode


def one(c, sql):
    rows, err = run(c, sql)
    assert err is None, (sql, err)
    return rows[0][0]


a, b = client(), client()
pid_a = one(a, "SELECT pg_backend_pid()")
pid_b = one(b, "SELECT pg_backend_pid()")
ok(pid_a == pid_b, f"both clients run on the same server connection (pid {pid_a})")

print("== a plain SET by client A does not reach client B")
run(a, "SET pg_fencing.token = '50'")
_, err = run(b, "UPDATE acct SET v = v + 1 WHERE id = 1")
ok(err == "FT002", f"client B's write without a token of its own: FT002 ({err})")
_, err = run(b, "INSERT INTO job VALUES (100, 'b')")
ok(err == "FT002", f"per-row table too: FT002 ({err})")
ok(one(b, "SELECT count(*) FROM job WHERE id = 100") == 0, "nothing of client B's write was kept")

print("== SET LOCAL ends with the transaction")
b.autocommit = False
run(b, "SET LOCAL pg_fencing.token = '60'")
_, err = run(b, "UPDATE acct SET v = v + 1 WHERE id = 1")
ok(err is None, f"client B's write inside its own SET LOCAL transaction is accepted ({err})")
b.commit()
b.autocommit = True
ok(one(a, "SELECT fence_token FROM acct WHERE id = 1") == 60, "the row carries B's token 60")
_, err = run(a, "UPDATE acct SET v = v + 1 WHERE id = 1")
ok(err == "FT002", f"client A's next write gets FT002, not token 60 nor its own stale 50 ({err})")

print("== SET inside a transaction counts in that transaction only")
a.autocommit = False
run(a, "SET pg_fencing.token = '61'")
_, err = run(a, "UPDATE acct SET v = v + 1 WHERE id = 1")
ok(err is None, f"write in the same transaction as the SET: accepted ({err})")
a.commit()
a.autocommit = True
_, err = run(b, "UPDATE acct SET v = v + 1 WHERE id = 1")
ok(err == "FT002", f"the next transaction (client B) does not carry 61: FT002 ({err})")

print("== ROLLBACK TO SAVEPOINT restores the transaction's own token")
b.autocommit = False
run(b, "SET LOCAL pg_fencing.token = '70'")
run(b, "SAVEPOINT s")
run(b, "SET LOCAL pg_fencing.token = '80'")
run(b, "ROLLBACK TO SAVEPOINT s")
_, err = run(b, "UPDATE acct SET v = v + 1 WHERE id = 1")
ok(err is None, f"write after ROLLBACK TO: accepted ({err})")
ok(one(b, "SELECT fence_token FROM acct WHERE id = 1") == 70, "it carries 70, the token before the savepoint")
b.commit()
b.autocommit = True

print("== RESET ALL and DISCARD ALL clear the token")
run(a, "SET pg_fencing.token = '90'")
run(a, "RESET ALL")
ok(one(b, "SHOW pg_fencing.token") == "", "after RESET ALL the setting is empty")
run(a, "SET pg_fencing.token = '91'")
run(a, "DISCARD ALL")
ok(one(b, "SHOW pg_fencing.token") == "", "after DISCARD ALL the setting is empty")

print("== fenced_* functions never leave their token behind")
rows, err = run(a, "SELECT fenced_update('acct', '{\"id\": 1}', '{\"v\": 0}', 95)")
ok(err is None, f"fenced_update with token 95 ({err})")
ok(one(b, "SHOW pg_fencing.token") == "", "client B sees no token afterwards")
_, err = run(b, "UPDATE acct SET v = v + 1 WHERE id = 1")
ok(err == "FT002", f"client B's plain write: FT002 ({err})")

print("== negative control: with pg_fencing.token_scope = session the leak is real")
run(a, "SET pg_fencing.token_scope = session")
run(a, "SET pg_fencing.token = '96'")
_, err = run(b, "UPDATE acct SET v = v + 1 WHERE id = 1")
ok(err is None and one(b, "SELECT fence_token FROM acct WHERE id = 1") == 96,
   f"client B's write carried client A's token 96 ({err}): what the default scope prevents")
run(a, "RESET ALL")
ok(one(b, "SHOW pg_fencing.token_scope") == "transaction", "RESET ALL restores the default scope")

print("== token_scope is for superusers only")
run(a, "CREATE ROLE pool_user LOGIN")
run(a, "GRANT ALL ON acct TO pool_user")
c = psycopg2.connect(host="127.0.0.1", port=BOUNCER, dbname="postgres", user="pool_user")
c.autocommit = True
_, err = run(c, "SET pg_fencing.token_scope = session")
ok(err == "42501", f"an ordinary role cannot widen the scope: 42501 ({err})")
c.close()

print("all pooler checks passed" if failures == 0 else f"{failures} pooler check(s) FAILED")
sys.exit(1 if failures else 0)
