"""pg_fencing benchmarks: each variant side by side with its baseline, in the same run,
alternating over several rounds; prints a markdown table of medians and ratios.

Started by bench/run.sh (which builds the extension and starts a throwaway cluster and etcd).
Environment: PGHOST/PGPORT/PGUSER (the cluster), ETCD_ENDPOINT, BENCH_ROUNDS, BENCH_SECONDS,
BENCH_ROWS_BIG, BENCH_CLIENTS, ETCD_BENCH_BIN, BENCH_ONLY (single: section 1 only; locks: section 4 only).
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import psycopg2

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "10"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", str(2 * os.cpu_count())))
BIG = int(os.environ.get("BENCH_ROWS_BIG", "1000000"))
ROWS = 10000
TOKEN = 5
PGBENCH = "/usr/lib/postgresql/15/bin/pgbench"
WORK = tempfile.mkdtemp(prefix="pg_fencing_bench.")


def conn():
    c = psycopg2.connect(dbname="postgres")
    c.autocommit = True
    return c


def sql(statements):
    c = conn()
    cur = c.cursor()
    for s in statements:
        cur.execute(s)
    c.close()


PLPGSQL_TRIGGER = """
CREATE TABLE IF NOT EXISTS hand_hw (resource text PRIMARY KEY, high_water bigint NOT NULL);
CREATE OR REPLACE FUNCTION hand_fence() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    t bigint := nullif(current_setting('app.token', true), '')::bigint;
    h bigint;
BEGIN
    IF t IS NULL THEN RAISE EXCEPTION 'no token' USING ERRCODE = 'FT002'; END IF;
    -- The same rule as pg_fencing's resource mode, written by hand: the resource's mark row is
    -- locked for the rest of the transaction, so writers with the current token serialize.
    SELECT high_water INTO h FROM hand_hw WHERE resource = TG_ARGV[0] FOR UPDATE;
    IF h IS NULL THEN
        INSERT INTO hand_hw VALUES (TG_ARGV[0], t) ON CONFLICT (resource) DO NOTHING;
    ELSIF t < h THEN
        RAISE EXCEPTION 'stale token % < %', t, h USING ERRCODE = 'FT001';
    ELSIF t > h THEN
        UPDATE hand_hw SET high_water = t WHERE resource = TG_ARGV[0];
    END IF;
    IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    NEW.fence_token := t;
    RETURN NEW;
END $$;
"""


def setup():
    stmts = ["CREATE EXTENSION IF NOT EXISTS pg_fencing", PLPGSQL_TRIGGER]
    for t in ["b_plain", "b_row", "b_res", "b_plpgsql", "b_app", "b_fenced", "b_floor"]:
        stmts += [f"DROP TABLE IF EXISTS {t}",
                  f"CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL, fence_token bigint)",
                  f"INSERT INTO {t} SELECT g, 0, 1 FROM generate_series(1, {ROWS}) g"]
    stmts += ["SELECT fencing_protect('b_row')",
              "SELECT fencing_protect('b_res', 'bench')",
              "SELECT fencing_protect('b_fenced')",
              # The floor of any row-trigger design: PostgreSQL's own C trigger that does nothing
              # here (the new row always differs), so only the cost of having a BEFORE ROW trigger.
              "CREATE TRIGGER floor BEFORE UPDATE ON b_floor FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()",
              "CREATE TRIGGER hand BEFORE INSERT OR UPDATE OR DELETE ON b_plpgsql FOR EACH ROW EXECUTE FUNCTION hand_fence('bench-hand')",
              "VACUUM ANALYZE"]
    sql(stmts)


def pgbench(script, options=""):
    path = os.path.join(WORK, "script.sql")
    with open(path, "w") as f:
        f.write(script)
    env = dict(os.environ, PGOPTIONS=options, PGDATABASE="postgres")
    out = subprocess.run([PGBENCH, "-n", "-M", "prepared", "-c", str(CLIENTS), "-j", str(min(CLIENTS, 2)),
                          "-T", str(SECONDS), "-f", path], capture_output=True, text=True, env=env)
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out.stdout)
    if not m:
        print(out.stdout, out.stderr, file=sys.stderr)
        raise RuntimeError("pgbench failed")
    failed = re.search(r"number of failed transactions: (\d+)", out.stdout)
    if failed and int(failed.group(1)) > 0:
        raise RuntimeError(f"pgbench: {failed.group(1)} failed transactions")
    return float(m.group(1))


TOKEN_OPT = f"-c pg_fencing.token={TOKEN} -c app.token={TOKEN}"
SET_ID = f"\\set id random(1, {ROWS})\n"
SINGLE_ROW = [
    ("unprotected UPDATE", SET_ID + "UPDATE b_plain SET v = v + 1 WHERE id = :id;\n", ""),
    ("floor: a C BEFORE ROW trigger that does nothing here (suppress_redundant_updates_trigger)",
     SET_ID + "UPDATE b_floor SET v = v + 1 WHERE id = :id;\n", ""),
    ("per-row mode UPDATE", SET_ID + "UPDATE b_row SET v = v + 1 WHERE id = :id;\n", TOKEN_OPT),
    ("resource mode UPDATE", SET_ID + "UPDATE b_res SET v = v + 1 WHERE id = :id;\n", TOKEN_OPT),
    ("PL/pgSQL trigger, same rule", SET_ID + "UPDATE b_plpgsql SET v = v + 1 WHERE id = :id;\n", TOKEN_OPT),
    ("application-side conditional UPDATE",
     SET_ID + f"UPDATE b_app SET v = v + 1, fence_token = {TOKEN} WHERE id = :id AND fence_token <= {TOKEN};\n", ""),
    ("fenced_update(...)",
     SET_ID + f"SELECT fenced_update('b_fenced', jsonb_build_object('id', :id::int), jsonb_build_object('v', :id::int), {TOKEN});\n", ""),
]


def timed(statements, options=""):
    c = psycopg2.connect(dbname="postgres", options=options)
    c.autocommit = True
    cur = c.cursor()
    t0 = time.perf_counter()
    for s in statements:
        cur.execute(s)
    dt = time.perf_counter() - t0
    c.close()
    return dt


def table_size(name):
    c = conn()
    cur = c.cursor()
    cur.execute("SELECT pg_total_relation_size(%s)", (name,))
    v = cur.fetchone()[0]
    c.close()
    return v


def bulk():
    """One UPDATE of BIG rows and COPY FROM of BIG rows: unprotected vs resource vs per-row."""
    csv = os.path.join(WORK, "rows.csv")
    with open(csv, "w") as f:
        for i in range(1, BIG + 1):
            f.write(f"{i},{i % 97}\n")
    os.chmod(WORK, 0o755)
    os.chmod(csv, 0o644)
    sql(["DROP TABLE IF EXISTS g_plain, g_res, g_row"]
        + [f"CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL, fence_token bigint)" for t in ("g_plain", "g_res", "g_row")]
        + ["SELECT fencing_protect('g_res', 'bulk')", "SELECT fencing_protect('g_row')"])
    variants = [("unprotected", "g_plain", ""), ("resource mode", "g_res", TOKEN_OPT), ("per-row mode", "g_row", TOKEN_OPT)]
    copy_t = {v[0]: [] for v in variants}
    upd_t = {v[0]: [] for v in variants}
    for r in range(ROUNDS):
        for name, table, opt in variants:
            sql([f"SET pg_fencing.token = '{TOKEN}'; TRUNCATE {table}" if opt else f"TRUNCATE {table}"])
            copy_t[name].append(timed([f"COPY {table} (id, v) FROM '{csv}' WITH (FORMAT csv)"], opt))
            sql([f"VACUUM ANALYZE {table}"])
            upd_t[name].append(timed([f"UPDATE {table} SET v = v + 1"], opt))
    return copy_t, upd_t


def tombstones():
    """INSERT then DELETE of N new keys in per-row mode vs unprotected; tombstone storage."""
    n = min(BIG, 200000)
    sql(["DROP TABLE IF EXISTS t_plain, t_row",
         "CREATE TABLE t_plain (id int PRIMARY KEY, v int, fence_token bigint)",
         "CREATE TABLE t_row (id int PRIMARY KEY, v int, fence_token bigint)",
         "SELECT fencing_protect('t_row')"])
    res = {"unprotected": {"insert": [], "delete": []}, "per-row mode": {"insert": [], "delete": []}}
    growth = []
    for r in range(ROUNDS):
        base = r * n
        for name, table, opt in (("unprotected", "t_plain", ""), ("per-row mode", "t_row", TOKEN_OPT)):
            before = table_size("_pg_fencing.row_tombstone")
            res[name]["insert"].append(timed([f"INSERT INTO {table} SELECT g, 0 FROM generate_series({base + 1}, {base + n}) g"], opt))
            res[name]["delete"].append(timed([f"DELETE FROM {table}"], opt))
            if name == "per-row mode":
                growth.append((table_size("_pg_fencing.row_tombstone") - before) * (1_000_000 / n))
    return n, res, growth


def lock_round_trips(n=200):
    """acquire, one fenced write, release: fencing_acquire vs etcd-client directly vs etcdctl lock."""
    out = {}
    ep = os.environ["ETCD_ENDPOINT"]
    sql(["DROP TABLE IF EXISTS l_res", "CREATE TABLE l_res (id int PRIMARY KEY, v int, fence_token bigint)",
         "INSERT INTO l_res VALUES (1, 0, NULL)", "SELECT fencing_protect('l_res', 'bench-lock')"])
    c = conn()
    cur = c.cursor()
    lat_full, lat_lock = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        cur.execute("SELECT fencing_acquire('bench-lock')")
        cur.execute("UPDATE l_res SET v = v + 1 WHERE id = 1")
        cur.execute("SELECT fencing_release('bench-lock')")
        lat_full.append((time.perf_counter() - t0) * 1e6)
    for _ in range(n):
        t0 = time.perf_counter()
        cur.execute("SELECT fencing_acquire('bench-lock2')")
        cur.execute("SELECT fencing_release('bench-lock2')")
        lat_lock.append((time.perf_counter() - t0) * 1e6)
    c.close()
    out["fencing_acquire + fenced UPDATE + fencing_release (SQL)"] = lat_full
    out["fencing_acquire + fencing_release (SQL)"] = lat_lock
    binary = os.environ.get("ETCD_BENCH_BIN")
    if binary and os.path.exists(binary):
        r = subprocess.run([binary, ep, "bench-direct", str(n)], capture_output=True, text=True, check=True)
        out["etcd-client directly: lease, lock, unlock, revoke (Rust)"] = [float(x) for x in r.stdout.split()]
    env = dict(os.environ, ETCDCTL_API="3")
    env.pop("ETCDCTL_ENDPOINTS", None)  # conflicts with --endpoints
    lat = []
    for _ in range(min(n, 100)):
        t0 = time.perf_counter()
        r = subprocess.run(["etcdctl", "--endpoints", ep, "lock", "bench-ctl", "--", "sh", "-c", "true"], env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"etcdctl lock failed: {r.stderr.strip()}", file=sys.stderr)
            continue
        lat.append((time.perf_counter() - t0) * 1e6)
    out["etcdctl lock NAME -- sh -c true (process start included)"] = lat
    return out


def pct(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def main():
    only = os.environ.get("BENCH_ONLY", "")
    setup()
    if only == "locks":
        lats = lock_round_trips()
        for name, v in lats.items():
            print(f"| {name} | {pct(v, 50):,.0f} | {pct(v, 99):,.0f} | {len(v)} |")
        return
    print(f"# pg_fencing benchmarks\n")
    print(f"{ROUNDS} rounds, variants alternating within each round; pgbench -M prepared -c {CLIENTS} "
          f"-T {SECONDS}; medians.\n")
    # 1. single-row UPDATE
    tps = {name: [] for name, _, _ in SINGLE_ROW}
    for r in range(ROUNDS):
        for name, script, opt in SINGLE_ROW:
            tps[name].append(pgbench(script, opt))
    base = statistics.median(tps["unprotected UPDATE"])
    print("## 1. Single-row UPDATE by primary key (10,000 rows, random key)\n")
    print("| variant | median TPS | ratio to unprotected | rounds |")
    print("|---|---:|---:|---|")
    for name, _, _ in SINGLE_ROW:
        m = statistics.median(tps[name])
        print(f"| {name} | {m:,.0f} | {m / base:.3f} | {', '.join(f'{x:,.0f}' for x in tps[name])} |")
    hand = statistics.median(tps["PL/pgSQL trigger, same rule"])
    print(f"\nresource mode vs PL/pgSQL trigger: {statistics.median(tps['resource mode UPDATE']) / hand:.2f}x; "
          f"per-row mode vs PL/pgSQL trigger: {statistics.median(tps['per-row mode UPDATE']) / hand:.2f}x\n")
    sys.stdout.flush()
    if only == "single":
        return

    # 2. bulk
    copy_t, upd_t = bulk()
    print(f"## 2. One UPDATE of {BIG:,} rows and COPY FROM of {BIG:,} rows\n")
    print("| variant | COPY median s | COPY throughput ratio | UPDATE median s | UPDATE throughput ratio |")
    print("|---|---:|---:|---:|---:|")
    cb, ub = statistics.median(copy_t["unprotected"]), statistics.median(upd_t["unprotected"])
    for name in copy_t:
        cm, um = statistics.median(copy_t[name]), statistics.median(upd_t[name])
        print(f"| {name} | {cm:.2f} | {cb / cm:.3f} | {um:.2f} | {ub / um:.3f} |")
    print()
    sys.stdout.flush()

    # 3. tombstones
    n, res, growth = tombstones()
    print(f"## 3. INSERT of {n:,} new keys, then DELETE of them (per-row mode leaves tombstones)\n")
    print("| variant | INSERT median s | ratio | DELETE median s | ratio |")
    print("|---|---:|---:|---:|---:|")
    ib, db = statistics.median(res["unprotected"]["insert"]), statistics.median(res["unprotected"]["delete"])
    for name in res:
        im, dm = statistics.median(res[name]["insert"]), statistics.median(res[name]["delete"])
        print(f"| {name} | {im:.2f} | {ib / im:.3f} | {dm:.2f} | {db / dm:.3f} |")
    print(f"\nTombstone storage: {statistics.median(growth) / 1048576:.0f} MiB per 1,000,000 deleted keys "
          f"(table and index of _pg_fencing.row_tombstone).\n")
    sys.stdout.flush()

    # 4. locks
    lats = lock_round_trips()
    print("## 4. Lock round trip against the same etcd (microseconds)\n")
    print("| path | p50 µs | p99 µs | n |")
    print("|---|---:|---:|---:|")
    for name, v in lats.items():
        print(f"| {name} | {pct(v, 50):,.0f} | {pct(v, 99):,.0f} | {len(v)} |")
    print()


if __name__ == "__main__":
    import shutil
    try:
        main()
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
