"""etcd locks taken by the coordinator's background worker fence a distributed table (issue 45,
docs/citus.md "What holds"; run by tests/citus/run.sh, which starts etcd and gives its endpoint).
The coordinator gets `pg_fencing.etcd_endpoints` by a reload; a session takes an etcd lock with
`fencing_acquire` and writes the distributed table with its token (the lock's revision), `etcdctl
lock` takes the lock after it (a holder outside PostgreSQL), and the first session's token is
refused on a shard the newer holder never wrote; a lock whose etcd lease is revoked refuses its
holder's next write (`FT003`). Rows and marks read back independently of pg_fencing's views.

  "$PY" tests/citus/etcd.py --port COORDINATOR_PORT --etcd HOST:PORT
"""
import argparse
import os
import subprocess
import sys
import time

import psycopg

FAILS = []


def check(what, cond, got=None):
    print(f"  {'ok' if cond else 'FAIL'}: {what}" + ("" if cond else f" (got {got!r})"))
    if not cond:
        FAILS.append(what)


def state(conn, sql, *params):
    try:
        conn.execute(sql, params or None)
        return "ok"
    except psycopg.Error as e:
        return e.sqlstate or "error"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--etcd", required=True)
    a = ap.parse_args()
    dsn = f"host=127.0.0.1 port={a.port} user=postgres dbname=postgres"
    env = dict(os.environ, ETCDCTL_ENDPOINTS=a.etcd, ETCDCTL_API="3")
    admin = psycopg.connect(dsn, autocommit=True)
    one = lambda sql, *p: admin.execute(sql, p or None).fetchone()[0]  # noqa: E731
    print("-- etcd locks from the coordinator's worker")
    admin.execute(f"ALTER SYSTEM SET pg_fencing.etcd_endpoints = '{a.etcd}'")  # host:port, ours
    admin.execute("ALTER SYSTEM SET pg_fencing.lease_ttl = 3")
    admin.execute("SELECT pg_reload_conf()")
    admin.execute("CREATE TABLE el (account int PRIMARY KEY, v int)")
    admin.execute("SELECT create_distributed_table('el', 'account', shard_count => 4)")
    admin.execute("SELECT fencing_protect('el', 'etcd_el')")

    holder = psycopg.connect(dsn, autocommit=True)
    t1 = None
    for _ in range(100):  # the worker connects to etcd after the reload
        try:
            t1 = holder.execute("SELECT fencing_acquire('citus/el', '5s')").fetchone()[0]
            break
        except psycopg.Error:
            time.sleep(0.2)
    check(f"fencing_acquire on the coordinator gives a token (the lock's revision, {t1})", t1 is not None and t1 > 0)
    if t1 is None:
        return 1
    check("its holder fills the distributed table with the session's token",
          state(holder, "INSERT INTO el SELECT g, 0 FROM generate_series(1, 20) g") == "ok")
    check("… every row on every shard stamped with it", one("SELECT array_agg(DISTINCT fence_token) FROM el") == [t1],
          one("SELECT array_agg(DISTINCT fence_token) FROM el"))
    check("fencing_release", holder.execute("SELECT fencing_release('citus/el')").fetchone()[0] is True)
    holder.close()

    # A holder outside PostgreSQL: `etcdctl lock`, whose command prints the lock's revision.
    out = open(os.devnull, "w")
    lock = subprocess.Popen(["etcdctl", "lock", "citus/el", "--", "sh", "-c", 'echo "$ETCD_LOCK_REV"; exec sleep 600'],
                            env=env, stdout=subprocess.PIPE, stderr=out, text=True, start_new_session=True)
    try:
        t2 = int(lock.stdout.readline().strip())
        check(f"etcdctl lock takes it after the release, a higher revision ({t2} > {t1})", t2 > t1, t2)

        def write(token, sql):
            with psycopg.connect(dsn) as c:
                try:
                    c.execute("SELECT set_config('pg_fencing.token', %s, true)", (str(token),))
                    c.execute(sql)
                    c.commit()
                    return "ok"
                except psycopg.Error as e:
                    return e.sqlstate or "error"
        check("the etcdctl holder writes one row", write(t2, "UPDATE el SET v = v + 1 WHERE account = 1") == "ok")
        far = one("SELECT min(account) FROM el WHERE get_shard_id_for_distribution_column('el', account) "
                  "<> get_shard_id_for_distribution_column('el', 1) AND (SELECT nodeport FROM citus_shards s WHERE "
                  "s.shardid = get_shard_id_for_distribution_column('el', account)) <> (SELECT nodeport FROM "
                  "citus_shards s WHERE s.shardid = get_shard_id_for_distribution_column('el', 1))")
        check(f"the first holder's token on a shard of the other worker (account {far}), never written by the newer holder: FT001",
              write(t1, f"UPDATE el SET v = -1 WHERE account = {far}") == "FT001")
        check("the mark is the newer holder's revision", one("SELECT fencing_high_water('etcd_el')") == t2,
              one("SELECT fencing_high_water('etcd_el')"))
    finally:
        os.killpg(lock.pid, 15)
        lock.wait()

    # A lock whose etcd lease is revoked: its holder's next write is refused (FT003).
    lost = psycopg.connect(dsn, autocommit=True)
    t3 = lost.execute("SELECT fencing_acquire('citus/el', '10s')").fetchone()[0]
    lease = lost.execute("SELECT lease_id FROM fencing_locks WHERE lock = 'citus/el' AND pid = pg_backend_pid()").fetchone()[0]
    check(f"a third holder takes the lock ({t3} > {t2})", t3 > t2, t3)
    subprocess.run(["etcdctl", "lease", "revoke", format(lease, "x")], env=env, check=True, stdout=subprocess.DEVNULL)
    seen = None
    for _ in range(100):  # the worker hears of the revoked lease
        seen = one("SELECT state FROM fencing_locks WHERE lock = 'citus/el' AND pid = %s",
                   lost.info.backend_pid)
        if seen != "held":
            break
        time.sleep(0.1)
    got = state(lost, "UPDATE el SET v = v + 100 WHERE account = 2")
    check(f"once its etcd lease is revoked (the lock {seen}), its holder's write is refused: FT003 ({got})",
          got == "FT003", got)
    check("no row of the refused writes", one("SELECT count(*) FROM el WHERE v < 0 OR v >= 100") == 0)
    lost.close()
    admin.execute("ALTER SYSTEM RESET pg_fencing.etcd_endpoints")
    admin.execute("ALTER SYSTEM RESET pg_fencing.lease_ttl")
    admin.execute("SELECT pg_reload_conf()")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
