"""A protected distributed table against unprotected ones on the same Citus cluster (issue 45;
docs/citus.md, "What it costs"), run by bench/citus.sh on a coordinator and two workers.

Three tables of the same shape, hash-distributed on `account` (32 shards, 10,000 rows):
  * protected: `fencing_protect(table, 'bench')` (the Citus shape);
  * floor: unprotected, the statement stamps the token column itself (`fence_token = 5`): the
    same statement with the token stamped and no check;
  * baseline: unprotected, the statement leaves the token column alone.
Single-row UPDATE through the coordinator (pgbench, one client, each transaction one simple-query
round trip: `BEGIN; SET LOCAL pg_fencing.token = '5'; UPDATE … WHERE account = :a; COMMIT;`,
the baseline without the SET LOCAL), BENCH_ROUNDS interleaved rounds of BENCH_SECONDS each;
and COPY of BENCH_COPY_ROWS rows (the token column left to the default on the protected table,
given on the floor, left out on the baseline), BENCH_ROUNDS interleaved rounds. Prints a
markdown table of medians and ratios.

  "$PY" bench/citus.py --port <coordinator port> --pgbin <PostgreSQL 18 bin> [--work DIR] [--out FILE]

With --work (the cluster's directory), also the servers' CPU time per autocommit UPDATE, summed
over the three nodes from /proc: steadier than TPS on a small noisy machine.
"""
import argparse
import os
import statistics
import subprocess
import tempfile
import time

import psycopg

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "5"))
COPY_ROWS = int(os.environ.get("BENCH_COPY_ROWS", "100000"))
ROWS = 10_000

# Single-row UPDATE, one statement in autocommit; the token given as a connection option
# (PGOPTIONS='-c pg_fencing.token=5', a source that counts: docs/security.md, "Token sources").
UPDATE = {
    "protected": "UPDATE b_protected SET v = v + 1 WHERE account = :a;",
    "floor": "UPDATE b_floor SET v = v + 1, fence_token = 5 WHERE account = :a;",
    "baseline": "UPDATE b_baseline SET v = v + 1 WHERE account = :a;",
}
# The same UPDATE in a transaction that sets its own token (one simple-query round trip).
UPDATE_TX = {
    "protected": "BEGIN; SET LOCAL pg_fencing.token = '5'; UPDATE b_protected SET v = v + 1 WHERE account = :a; COMMIT;",
    "floor": "BEGIN; SET LOCAL pg_fencing.token = '5'; UPDATE b_floor SET v = v + 1, fence_token = 5 WHERE account = :a; COMMIT;",
    "baseline": "BEGIN; UPDATE b_baseline SET v = v + 1 WHERE account = :a; COMMIT;",
}
COPY = {
    "protected": ("b_protected", "(account, v)", False),
    "floor": ("b_floor", "(account, v, fence_token)", True),
    "baseline": ("b_baseline", "(account, v)", False),
}


def setup(conn):
    with conn.cursor() as cur:
        for t in UPDATE:
            cur.execute(f"DROP TABLE IF EXISTS b_{t}")
            cur.execute(f"CREATE TABLE b_{t} (account int PRIMARY KEY, v int, fence_token bigint)")
            cur.execute(f"SELECT create_distributed_table('b_{t}', 'account', shard_count => 32)")
        cur.execute("SELECT fencing_protect('b_protected', 'bench')")
        cur.execute("SELECT fencing_advance('bench', 5)")
        for t in UPDATE:
            cur.execute("BEGIN")
            cur.execute("SET LOCAL pg_fencing.token = '5'")
            cur.execute(f"INSERT INTO b_{t} SELECT g, 0, 5 FROM generate_series(1, {ROWS}) g")
            cur.execute("COMMIT")


def server_cpu(work):
    """CPU seconds used so far by the cluster's servers (postmasters, their live children, and
    the children that exited), from /proc."""
    if not work:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for node in ("coordinator", "worker1", "worker2"):
        with open(os.path.join(work, node, "postmaster.pid")) as f:
            pm = f.readline().strip()
        pids = [pm]
        try:
            with open(f"/proc/{pm}/task/{pm}/children") as f:
                pids += f.read().split()
        except OSError:
            pass
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / tick


def pgbench_tps(pgbin, port, script):
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(f"\\set a random(1, {ROWS})\n{script}\n")
        path = f.name
    try:
        out = subprocess.run(
            [f"{pgbin}/pgbench", "-n", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
             "-c", "1", "-T", str(SECONDS), "-f", path, "postgres"],
            check=True, capture_output=True, text=True,
            env=dict(os.environ, PGOPTIONS="-c pg_fencing.token=5")).stdout
    finally:
        os.unlink(path)
    tps = txns = None
    for line in out.splitlines():
        if line.startswith("tps = "):
            tps = float(line.split()[2])
        if line.startswith("number of transactions actually processed:"):
            txns = int(line.split(":")[1].split("/")[0])
    if tps is None or not txns:
        raise RuntimeError(out)
    return tps, txns


def copy_seconds(conn, variant, round_no):
    table, columns, with_token = COPY[variant]
    base = 100_000 + round_no * COPY_ROWS
    rows = "".join(
        f"{base + i}\t1\t5\n" if with_token else f"{base + i}\t1\n" for i in range(COPY_ROWS))
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("SET LOCAL pg_fencing.token = '5'")
        t0 = time.perf_counter()
        with cur.copy(f"COPY {table} {columns} FROM STDIN") as cp:
            cp.write(rows)
        cur.execute("COMMIT")
        return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pgbin", required=True)
    ap.add_argument("--out")
    ap.add_argument("--work", help="the cluster's directory (coordinator, worker1, worker2): server CPU too")
    a = ap.parse_args()
    conn = psycopg.connect(host="127.0.0.1", port=a.port, user="postgres", dbname="postgres",
                           autocommit=True)
    setup(conn)
    tps = {v: [] for v in UPDATE}
    tps_tx = {v: [] for v in UPDATE_TX}
    cpu = {v: [] for v in UPDATE}
    copy = {v: [] for v in COPY}

    def run(script):
        before = server_cpu(a.work)
        t, n = pgbench_tps(a.pgbin, a.port, script)
        return t, (server_cpu(a.work) - before) / n * 1e6

    for r in range(ROUNDS):
        order = list(UPDATE) if r % 2 == 0 else list(reversed(list(UPDATE)))
        for v in order:
            t, c = run(UPDATE[v])
            tps[v].append(t)
            cpu[v].append(c)
        for v in order:
            tps_tx[v].append(run(UPDATE_TX[v])[0])
        for v in order:
            copy[v].append(copy_seconds(conn, v, r))
    med = {v: statistics.median(x) for v, x in tps.items()}
    med_tx = {v: statistics.median(x) for v, x in tps_tx.items()}
    cmed_cpu = {v: statistics.median(x) for v, x in cpu.items()}
    cmed = {v: statistics.median(x) for v, x in copy.items()}

    def row(name, m):
        return (f"| {name} | {m['protected']:.0f} | {m['floor']:.0f} | {m['baseline']:.0f} "
                f"| {m['protected'] / m['floor']:.2f} | {m['protected'] / m['baseline']:.2f} |")

    def rounds(name, d, fmt):
        return f"{name}: " + "; ".join(f"{v} {', '.join(fmt(x) for x in d[v])}" for v in d)

    lines = [
        f"Citus 14.0.1 on PostgreSQL 18, a coordinator and two workers on loopback (fsync off), "
        f"32 shards of 10,000 rows; {ROUNDS} interleaved rounds, medians.",
        "",
        "| path | protected | floor (stamped, no check) | baseline (unprotected) | protected / floor | protected / baseline |",
        "|---|---:|---:|---:|---:|---:|",
        row(f"single-row UPDATE through the coordinator, autocommit, token as a connection option (TPS, 1 client, {SECONDS} s a round)", med),
        row("the same in `BEGIN; SET LOCAL pg_fencing.token …; UPDATE …; COMMIT;` (the baseline without SET LOCAL)", med_tx),
        f"| the autocommit UPDATE's server CPU, all three nodes (µs a transaction; ratios are speeds) "
        f"| {cmed_cpu['protected']:.0f} | {cmed_cpu['floor']:.0f} | {cmed_cpu['baseline']:.0f} "
        f"| {cmed_cpu['floor'] / cmed_cpu['protected']:.2f} | {cmed_cpu['baseline'] / cmed_cpu['protected']:.2f} |" if a.work else "",
        f"| COPY of {COPY_ROWS:,} rows in a transaction with SET LOCAL (seconds; ratios are speeds) "
        f"| {cmed['protected']:.3f} | {cmed['floor']:.3f} | {cmed['baseline']:.3f} "
        f"| {cmed['floor'] / cmed['protected']:.2f} | {cmed['baseline'] / cmed['protected']:.2f} |",
        "",
        rounds("UPDATE TPS", tps, lambda x: f"{x:.0f}") + ". " + rounds("In a transaction", tps_tx, lambda x: f"{x:.0f}")
        + ". " + rounds("COPY seconds", copy, lambda x: f"{x:.3f}")
        + (". " + rounds("Server CPU µs", cpu, lambda x: f"{x:.0f}") if a.work else "") + ".",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
