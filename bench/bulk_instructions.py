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
resource mode, each in the shape fencing_protect chooses where the library is preloaded (the
set-based shape: no BEFORE INSERT row trigger, COPY keeps its multi-row inserts; docs/design.md,
"The set-based shape") and in the row-trigger shape, measured preloaded and in a backend that
loads the library on first use (where fencing_protect chooses the row-trigger shape and the
set-based one refuses writes). Two reference rows contain no pg_fencing check at all and bound what any design
can reach: COPY into a plain table whose token column is set by a DEFAULT from the setting (no
trigger: COPY keeps its multi-row inserts), and a DELETE that also writes one row per deleted key
into a table keyed by the key (the cheapest exact tombstone: one heap tuple and one B-tree entry).

Each protected row is also read against its floor (issue 32): the same statement on `plain`
with its token column filled by a DEFAULT from the setting (no trigger, no check) for COPY and
INSERT ... SELECT, the plain statement for DELETE (a token column has nothing to do there).

The last row is the cost of one tombstone lookup by a writer below the table's highest delete
token: INSERT ... SELECT of new keys with token 5 into a per-row table that holds --tombstones
(default 1,000,000) tombstones at token 10 of other keys, per key, against the same INSERT into
the same table without tombstones.

Usage: bulk_instructions.py --pgbin DIR --work DIR [--n 20000] [--tombstones 1000000] [--only TEXT]
(--only: just the rows whose label contains TEXT, and the lookup if TEXT is in "lookup").
Prints a markdown table: statement, unprotected, floor and protected instructions per row, the
ratio to the unprotected statement and to the floor; then the lookup's cost.
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from instructions import as_postgres, callgrind_total, template_cluster  # noqa: E402

TABLES = {
    "plain": "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, fence_token bigint);",
    "per-row": "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); SELECT fencing_protect('t');",
    "resource": "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); SELECT fencing_protect('t', 'bulk');",
    "per-row, row-trigger shape": "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); "
                                  "SET pg_fencing.set_based_shape = off; SELECT fencing_protect('t');",
    "resource, row-trigger shape": "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); "
                                   "SET pg_fencing.set_based_shape = off; SELECT fencing_protect('t', 'bulk');",
    # The library not preloaded: fencing_protect chooses the row-trigger shape there.
    "per-row, not preloaded": "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); SELECT fencing_protect('t');",
    "resource, not preloaded": "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); SELECT fencing_protect('t', 'bulk');",
    "plain, token DEFAULT": "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, "
                            "fence_token bigint DEFAULT pg_catalog.current_setting('pg_fencing.token')::bigint);",
    "plain, tombstone table": "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, fence_token bigint); "
                              "CREATE TABLE tomb (k int PRIMARY KEY, high_water bigint NOT NULL);",
    # The per-row table with --tombstones tombstones at token 10 of keys above every inserted
    # key ({tombstones} is filled in), made in the template itself (see `tombstone_template`).
    "per-row, with tombstones": "",
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
# The floor of each statement: the table its floor runs on.
FLOOR = {"COPY FROM": "plain, token DEFAULT", "INSERT ... SELECT of new keys": "plain, token DEFAULT",
         "DELETE of every row": "plain"}
# (label, statement, protected table[, statement on it]): the unprotected column is the statement
# on `plain`, the protected one the statement (or the one named) on the protected table.
ROWS = [
    ("COPY FROM, resource mode (set-based shape, preloaded)", "COPY FROM", "resource"),
    ("COPY FROM, per-row mode (set-based shape, preloaded)", "COPY FROM", "per-row"),
    ("COPY FROM, resource mode, row-trigger shape (preloaded)", "COPY FROM", "resource, row-trigger shape"),
    ("COPY FROM, per-row mode, row-trigger shape (preloaded)", "COPY FROM", "per-row, row-trigger shape"),
    ("COPY FROM, resource mode, not preloaded (row-trigger shape)", "COPY FROM", "resource, not preloaded"),
    ("COPY FROM, per-row mode, not preloaded (row-trigger shape)", "COPY FROM", "per-row, not preloaded"),
    ("INSERT ... SELECT of new keys, resource mode (set-based shape, preloaded)", "INSERT ... SELECT of new keys", "resource"),
    ("INSERT ... SELECT of new keys, per-row mode (set-based shape, preloaded)", "INSERT ... SELECT of new keys", "per-row"),
    ("INSERT ... SELECT of new keys, per-row mode, row-trigger shape (preloaded)", "INSERT ... SELECT of new keys",
     "per-row, row-trigger shape"),
    ("INSERT ... SELECT of new keys, resource mode, not preloaded (row-trigger shape)", "INSERT ... SELECT of new keys",
     "resource, not preloaded"),
    ("INSERT ... SELECT of new keys, per-row mode, not preloaded (row-trigger shape)", "INSERT ... SELECT of new keys",
     "per-row, not preloaded"),
    ("DELETE of {n} keys, per-row mode", "DELETE of every row", "per-row"),
    ("DELETE of {n} keys, resource mode", "DELETE of every row", "resource"),
    ("reference: COPY FROM, the token column set by a DEFAULT from the setting (no trigger, no check)",
     "COPY FROM", "plain, token DEFAULT"),
    ("reference: DELETE of {n} keys writing one row per key into a table keyed by the key (no trigger, no check)",
     "DELETE of every row", "plain, tombstone table", "DELETE of every row, one tombstone row per key"),
]


def count(args, template, table, script):
    if table == "per-row, with tombstones":
        # The table is in the template already (made once, not under callgrind).
        return callgrind_total(args.pgbin, args.work, args.tomb_template, script + "\n", table)
    return callgrind_total(args.pgbin, args.work, template,
                           "CREATE EXTENSION pg_fencing;\n" + TABLES[table] + "\n" + script + "\n", table,
                           preload="not preloaded" not in table)


def tombstone_template(args):
    """A template cluster whose per-row table t has args.tombstones tombstones at token 10 of keys
    above 10,000,000 (no inserted key has one): made with a server, not under callgrind."""
    lo, hi = 10_000_001, 10_000_000 + args.tombstones
    sql = f"""
CREATE EXTENSION pg_fencing;
CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL);
SELECT fencing_protect('t');
BEGIN; SET LOCAL pg_fencing.token = '10';
INSERT INTO t (id, v) SELECT g, 0 FROM generate_series({lo}, {hi}) g;
DELETE FROM t;
COMMIT;
VACUUM ANALYZE;
CHECKPOINT;
"""
    tmpl, got = template_cluster(args.pgbin, args.work, "tomb-template", sql,
                                 "SELECT tombstones FROM fencing_protected_tables WHERE relation = 't'::regclass")
    if int(got) != args.tombstones:
        raise SystemExit(f"bulk: the tombstone template has {got} tombstones, not {args.tombstones}")
    return tmpl


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
    ap.add_argument("--tombstones", type=int, default=1_000_000)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    rows = [r for r in ROWS if args.only in r[0]]
    template = os.path.join(args.work, "bulk-template")
    as_postgres([f"{args.pgbin}/initdb", "-D", template, "-U", "postgres", "-A", "trust", "--no-sync"],
                stdout=subprocess.DEVNULL)
    cost = {}

    def measure(st, t):
        if (st, t) not in cost:
            cost[(st, t)] = per_row(args, template, st, t)
            print(f"  {st}, {t}: {cost[(st, t)]:,.0f} instructions per row", file=sys.stderr)
        return cost[(st, t)]

    for label, statement, table, *other in rows:
        for st, t in ((statement, "plain"), (statement, FLOOR[statement]), (other[0] if other else statement, table)):
            measure(st, t)
    lookup = None
    if args.only in "lookup":
        args.tomb_template = tombstone_template(args)
        # New keys below every tombstoned key: the same INSERT with and without the tombstones.
        with_tombs = measure("INSERT ... SELECT of new keys", "per-row, with tombstones")
        lookup = with_tombs - measure("INSERT ... SELECT of new keys", "per-row")
    print(f"Instructions per row of multi-row statements (callgrind, `postgres --single`, one transaction "
          f"over {2 * args.n:,} rows minus one over {args.n:,}); ratio = unprotected / protected, and "
          "floor / protected (floor: the same statement with the token column filled by a DEFAULT "
          "from the setting, no trigger and no check; for DELETE the plain statement):")
    print()
    print("| statement | unprotected | floor | protected | ratio | ratio to the floor |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, statement, table, *other in rows:
        b, f = cost[(statement, "plain")], cost[(statement, FLOOR[statement])]
        p = cost[(other[0] if other else statement, table)]
        print(f"| {label.format(n=f'{args.n:,}')} | {b:,.0f} | {f:,.0f} | {p:,.0f} | {b / p:.2f} | {f / p:.2f} |")
    if lookup is None:
        return
    print()
    print(f"Tombstone lookup by a writer below the table's highest delete token (INSERT ... SELECT of new "
          f"keys with token 5 into a per-row table holding {args.tombstones:,} tombstones at token 10, "
          f"minus the same INSERT without them): {lookup:,.0f} instructions per key "
          f"(the INSERT costs {with_tombs:,.0f} per key with them)")


if __name__ == "__main__":
    main()
