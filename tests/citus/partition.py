"""A Citus worker partitioned away (tests/citus/partition.sh sets up the cluster and the network;
issue 45, docs/citus.md "What holds"). The table `pt` (4 shards, two on each worker) is protected
in resource mode; worker2 is cut off and brought back with blackhole routes. Checked
independently of pg_fencing's views: the mark by `fencing_high_water`, the rows and their
tokens by reading the table, the prepared transactions on each worker by `pg_prepared_xacts`.

  "$PY" tests/citus/partition.py --coordinator DSN --worker2 DSN --worker2-port PORT \
      --namespace NS --host-ip IP --worker2-ip IP
"""
import argparse
import subprocess
import sys
import threading
import time

import psycopg

FAILS = []


def check(what, cond, got=None):
    print(f"  {'ok' if cond else 'FAIL'}: {what}" + ("" if cond else f" (got {got!r})"))
    if not cond:
        FAILS.append(what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--worker2", required=True, help="worker2 over its unix socket (reachable when cut off)")
    ap.add_argument("--worker2-port", type=int, required=True)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--host-ip", required=True, help="the coordinator's and worker1's address on the bridge")
    ap.add_argument("--worker2-ip", required=True)
    a = ap.parse_args()
    admin = psycopg.connect(a.coordinator, autocommit=True)
    one = lambda sql, *p: admin.execute(sql, p or None).fetchone()[0]  # noqa: E731

    def write(token, sql, dsn=None):
        """`ok` or the SQLSTATE (`error` without one) of one transaction with the token, sent to
        the coordinator (or `dsn`); and how long it took."""
        t0 = time.monotonic()
        try:
            with psycopg.connect(dsn or a.coordinator) as c:
                c.execute("SET statement_timeout = '20s'")
                c.execute("SELECT set_config('pg_fencing.token', %s, true)", (str(token),))
                c.execute(sql)
                c.commit()
            return "ok", time.monotonic() - t0
        except psycopg.Error as e:
            return (e.sqlstate or "error"), time.monotonic() - t0

    def cut(on):
        """Blackhole routes on both sides (iproute2 only): packets vanish, nothing is refused."""
        verb = "add" if on else "del"
        subprocess.run(["ip", "netns", "exec", a.namespace, "ip", "route", verb, "blackhole", a.host_ip + "/32"], check=True)
        subprocess.run(["ip", "route", verb, "blackhole", a.worker2_ip + "/32"], check=True)

    admin.execute("CREATE TABLE pt (id int PRIMARY KEY, v int)")
    admin.execute("SELECT create_distributed_table('pt', 'id', shard_count => 4)")
    admin.execute("SELECT fencing_protect('pt', 'part')")
    check("holder 10 fills the table", write(10, "INSERT INTO pt SELECT g, 0 FROM generate_series(1, 40) g")[0] == "ok")

    def ids_on(port):
        return [r[0] for r in admin.execute(
            "SELECT id FROM pt WHERE (SELECT nodeport FROM citus_shards s WHERE s.shardid = "
            "get_shard_id_for_distribution_column('pt', id)) = %s ORDER BY id", (port,))]
    w2 = ids_on(a.worker2_port)
    w1 = [i for i in range(1, 41) if i not in w2]
    check(f"both workers hold rows ({len(w1)} and {len(w2)})", len(w1) > 2 and len(w2) > 2, (w1, w2))
    check("holder 20 writes a row on worker1 only", write(20, f"UPDATE pt SET v = v + 1 WHERE id = {w1[0]}")[0] == "ok")

    # A distributed transaction that has written both workers, whose COMMIT loses worker2.
    t = psycopg.connect(a.coordinator)
    t.execute("SELECT set_config('pg_fencing.token', '30', true)")
    t.execute("UPDATE pt SET v = v + 1000")
    print("-- worker2 cut off")
    cut(True)
    outcome = {}

    def commit():
        t0 = time.monotonic()
        try:
            t.commit()
            outcome["r"] = "ok"
        except psycopg.Error as e:
            outcome["r"] = e.sqlstate or "error"
        outcome["s"] = time.monotonic() - t0
    th = threading.Thread(target=commit, daemon=True)
    th.start()
    th.join(120)
    if th.is_alive():
        check("the COMMIT that lost worker2 ends within 120 s", False, "still waiting")
        cut(False)
        return 1
    check(f"the COMMIT of holder 30 that lost worker2 half-way fails ({outcome['r']} after {outcome['s']:.1f} s)",
          outcome["r"] != "ok", outcome)
    t.close()

    r, s = write(40, f"UPDATE pt SET v = v + 1 WHERE id = {w2[0]}")
    check(f"holder 40 writing a row on the cut-off worker fails ({r} after {s:.1f} s)", r != "ok", r)
    r, s = write(10, f"UPDATE pt SET v = -1 WHERE id = {w2[0]}")
    check(f"stale 10 writing a row on the cut-off worker fails ({r} after {s:.1f} s)", r != "ok", r)
    check("holder 20 on the reachable worker", write(20, f"UPDATE pt SET v = v + 1 WHERE id = {w1[1]}")[0] == "ok")
    check("stale 10 on the reachable worker: FT001", write(10, f"UPDATE pt SET v = -1 WHERE id = {w1[1]}")[0] == "FT001")
    # Writes entering at the cut-off worker itself (Citus gave it the metadata: it plans them and
    # runs them on its own shards), which cannot reach the coordinator that holds the marks.
    shard = one("SELECT shard_name('pt', get_shard_id_for_distribution_column('pt', %s))", w2[0])
    for token in (10, 20, 40):
        r, s = write(token, f"UPDATE pt SET v = -1 WHERE id = {w2[0]}", a.worker2)
        check(f"token {token}: an UPDATE entering at the cut-off worker, of its own shard: FT004 ({r} after {s:.1f} s)",
              r == "FT004", r)
    r, s = write(40, f"INSERT INTO pt VALUES ({1000 + w2[0]}, -1)", a.worker2)
    check(f"an INSERT entering at the cut-off worker: refused ({r} after {s:.1f} s)", r != "ok", r)
    r, s = write(40, f"UPDATE {shard} SET v = -1 WHERE id = {w2[0]}", a.worker2)
    check(f"an UPDATE of the shard {shard} by name on the cut-off worker: FT004 ({r})", r == "FT004", r)
    r, s = write(40, f"DELETE FROM {shard} WHERE id = {w2[0]}", a.worker2)
    check(f"a DELETE from the shard by name on the cut-off worker: FT004 ({r})", r == "FT004", r)
    r, s = write(40, "TRUNCATE pt", a.worker2)
    check(f"a TRUNCATE entering at the cut-off worker: FT004 ({r})", r == "FT004", r)
    try:
        with psycopg.connect(a.worker2) as c:
            c.execute("SELECT set_config('pg_fencing.token', '40', true)")
            with c.cursor().copy("COPY pt (id, v) FROM STDIN") as cp:
                cp.write_row((2000 + w2[0], -1))
        r = "ok"
    except psycopg.Error as e:
        r = e.sqlstate or "error"
    check(f"a COPY entering at the cut-off worker: refused ({r})", r != "ok", r)
    check("the failed writes raised no mark", one("SELECT fencing_high_water('part')") == 20,
          one("SELECT fencing_high_water('part')"))

    print("-- worker2 back")
    cut(False)
    # Citus's two-phase-commit recovery (its maintenance daemon does it every
    # citus.recover_2pc_interval) ends what the lost COMMIT left prepared on either worker.
    w2c = psycopg.connect(a.worker2, autocommit=True)
    left = None
    for _ in range(60):
        try:
            admin.execute("SELECT recover_prepared_transactions()")
        except psycopg.Error:
            pass
        left = (one("SELECT count(*) FROM pg_prepared_xacts"),
                w2c.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0],
                one("SELECT count(*) FROM run_command_on_workers('SELECT 1') WHERE NOT success"))
        if left == (0, 0, 0):
            break
        time.sleep(0.5)
    check("after recovery no prepared transaction is left on any node, every worker answers", left == (0, 0, 0), left)
    check("the mark is still the holder's (20)", one("SELECT fencing_high_water('part')") == 20,
          one("SELECT fencing_high_water('part')"))
    rows = admin.execute("SELECT count(*) FILTER (WHERE v >= 1000 OR v < 0), max(fence_token) FROM pt").fetchone()
    check("no row of the lost COMMIT or of a refused write, no token above the mark", rows == (0, 20), rows)
    check("no row inserted at the cut-off worker", one("SELECT count(*) FROM pt WHERE id > 1000") == 0)
    check("all 40 rows still there (no TRUNCATE got through)", one("SELECT count(*) FROM pt") == 40)
    r, _ = write(10, f"UPDATE pt SET v = -1 WHERE id = {w2[1]}")
    check("stale 10 on worker2's shards, which holder 20 never wrote: FT001", r == "FT001", r)
    check("holder 20 writes there", write(20, f"UPDATE pt SET v = v + 1 WHERE id = {w2[1]}")[0] == "ok")
    check("… its row stamped 20", one(f"SELECT fence_token FROM pt WHERE id = {w2[1]}") == 20)
    print(f"citus partition: {'FAILED' if FAILS else 'all checks passed'}")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
