"""Instruction counts of multi-row statements, unprotected against protected (issue 17).

The method of bench/instructions.py, per row instead of per transaction: a single-user backend
(`postgres --single`, fsync and autovacuum off, the extension preloaded) under callgrind runs
one transaction over 2N rows and one over N rows on fresh copies of one template cluster; the
difference of the two totals over N is the cost of N more rows, start-up and the statement's
fixed costs cancelled out. Where the statement needs rows to exist (DELETE), the same setup
without the statement is counted too and taken off, so only the statement is measured.

Statements (N = 20,000 by default; tokens: the data is written with token 1, the statement
runs with token 5):
  COPY FROM a file of new keys; INSERT ... SELECT of new keys; DELETE of every row.
Tables: `plain` (no protection, with a bigint token column like the others), per-row mode,
resource mode. Two reference rows contain no pg_fencing check at all and bound what any design
can reach: COPY into a plain table whose token column is set by a DEFAULT from the setting (no
trigger: COPY keeps its multi-row inserts), and a DELETE that also writes one row per deleted key
into a table keyed by the key (the cheapest exact tombstone: one heap tuple and one B-tree entry).

Usage: bulk_instructions.py --pgbin DIR --work DIR [--n 20000]
Prints a markdown table: statement, unprotected and protected instructions per row, ratio.
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from instructions import as_postgres, callgrind_total  # noqa: E402

TABLES = {
    "plain": "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, fence_token bigint);",
    "per-row": "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); SELECT fencing_protect('t');",
    "resource": "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); SELECT fencing_protect('t', 'bulk');",
    "plain, token DEFAULT": "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, "
                            "fence_token bigint DEFAULT pg_catalog.current_setting('pg_fencing.token')::bigint);",
    "plain, tombstone table": "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, fence_token bigint); "
                              "CREATE TABLE tomb (k int PRIMARY KEY, high_water bigint NOT NULL);",
}
FILL = "BEGIN; SET LOCAL pg_fencing.token = '1'; INSERT INTO t (id, v) SELECT g, 0 FROM generate_series(1, {n}) g; COMMIT;"
# name -> (rows exist before the statement?, statement with {n} and {file})
STATEMENTS = {
    "COPY FROM": (False, "BEGIN; SET LOCAL pg_fencing.token = '5'; COPY t (id, v) FROM '{file}'; COMMIT;"),
    "INSERT ... SELECT of new keys": (
        False, "BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO t (id, v) SELECT g, 0 FROM generate_series(1, {n}) g; COMMIT;"),
    "DELETE of every row": (True, "BEGIN; SET LOCAL pg_fencing.token = '5'; DELETE FROM t; COMMIT;"),
    "DELETE of every row, one tombstone row per key": (
        True, "BEGIN; SET LOCAL pg_fencing.token = '5'; "
              "WITH d AS (DELETE FROM t RETURNING id) INSERT INTO tomb SELECT id, 5 FROM d; COMMIT;"),
}
# (label, statement, protected table[, statement on it]): the unprotected column is the statement
# on `plain`, the protected one the statement (or the one named) on the protected table.
ROWS = [
    ("COPY FROM, resource mode", "COPY FROM", "resource"),
    ("COPY FROM, per-row mode", "COPY FROM", "per-row"),
    ("INSERT ... SELECT of new keys, per-row mode", "INSERT ... SELECT of new keys", "per-row"),
    ("DELETE of {n} keys, per-row mode", "DELETE of every row", "per-row"),
    ("DELETE of {n} keys, resource mode", "DELETE of every row", "resource"),
    ("reference: COPY FROM, the token column set by a DEFAULT from the setting (no trigger, no check)",
     "COPY FROM", "plain, token DEFAULT"),
    ("reference: DELETE of {n} keys writing one row per key into a table keyed by the key (no trigger, no check)",
     "DELETE of every row", "plain, tombstone table", "DELETE of every row, one tombstone row per key"),
]


def count(args, template, table, script):
    return callgrind_total(args.pgbin, args.work, template,
                           "CREATE EXTENSION pg_fencing;\n" + TABLES[table] + "\n" + script + "\n", table)


def per_row(args, template, statement, table):
    needs_rows, stmt = STATEMENTS[statement]
    totals = {}
    for n in (args.n, 2 * args.n):
        data = os.path.join(args.work, f"keys.{n}")
        with open(data, "w") as f:
            f.writelines(f"{i}\t0\n" for i in range(1, n + 1))
        os.chmod(data, 0o644)
        fill = FILL.format(n=n) if needs_rows else ""
        total = count(args, template, table, fill + "\n" + stmt.format(n=n, file=data))
        if needs_rows:
            total -= count(args, template, table, fill)
        totals[n] = total
    return (totals[2 * args.n] - totals[args.n]) / args.n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pgbin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--n", type=int, default=20_000)
    args = ap.parse_args()
    template = os.path.join(args.work, "bulk-template")
    as_postgres([f"{args.pgbin}/initdb", "-D", template, "-U", "postgres", "-A", "trust", "--no-sync"],
                stdout=subprocess.DEVNULL)
    cost = {}
    for label, statement, table, *other in ROWS:
        for st, t in ((statement, "plain"), (other[0] if other else statement, table)):
            if (st, t) not in cost:
                cost[(st, t)] = per_row(args, template, st, t)
                print(f"  {st}, {t}: {cost[(st, t)]:,.0f} instructions per row", file=sys.stderr)
    print(f"Instructions per row of multi-row statements (callgrind, `postgres --single`, one transaction "
          f"over {2 * args.n:,} rows minus one over {args.n:,}); ratio = unprotected / protected:")
    print()
    print("| statement | unprotected | protected | ratio |")
    print("|---|---:|---:|---:|")
    for label, statement, table, *other in ROWS:
        b, p = cost[(statement, "plain")], cost[(other[0] if other else statement, table)]
        print(f"| {label.format(n=f'{args.n:,}')} | {b:,.0f} | {p:,.0f} | {b / p:.2f} |")


if __name__ == "__main__":
    main()
