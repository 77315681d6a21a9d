#!/usr/bin/env python3
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

  bench/citus.py --port <coordinator port> --pgbin <PostgreSQL 18 bin> [--out FILE]
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
    for line in out.splitlines():
        if line.startswith("tps = "):
            return float(line.split()[2])
    raise RuntimeError(out)


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
    a = ap.parse_args()
    conn = psycopg.connect(host="127.0.0.1", port=a.port, user="postgres", dbname="postgres",
                           autocommit=True)
    setup(conn)
    tps = {v: [] for v in UPDATE}
    tps_tx = {v: [] for v in UPDATE_TX}
    copy = {v: [] for v in COPY}
    for r in range(ROUNDS):
        order = list(UPDATE) if r % 2 == 0 else list(reversed(list(UPDATE)))
        for v in order:
            tps[v].append(pgbench_tps(a.pgbin, a.port, UPDATE[v]))
        for v in order:
            tps_tx[v].append(pgbench_tps(a.pgbin, a.port, UPDATE_TX[v]))
        for v in order:
            copy[v].append(copy_seconds(conn, v, r))
    med = {v: statistics.median(x) for v, x in tps.items()}
    med_tx = {v: statistics.median(x) for v, x in tps_tx.items()}
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
        f"| COPY of {COPY_ROWS:,} rows in a transaction with SET LOCAL (seconds; ratios are speeds) "
        f"| {cmed['protected']:.3f} | {cmed['floor']:.3f} | {cmed['baseline']:.3f} "
        f"| {cmed['floor'] / cmed['protected']:.2f} | {cmed['baseline'] / cmed['protected']:.2f} |",
        "",
        rounds("UPDATE TPS", tps, lambda x: f"{x:.0f}") + ". " + rounds("In a transaction", tps_tx, lambda x: f"{x:.0f}")
        + ". " + rounds("COPY seconds", copy, lambda x: f"{x:.3f}") + ".",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
