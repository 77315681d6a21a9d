"""Server instructions of the statements a client package adds to a transaction (issue 46).

The fenced transaction of a client package differs from the same transaction unfenced by the
token's statement in BEGIN's query and, where the driver does not show COMMIT's command tag, a
statement before COMMIT that fails if the transaction is aborted or over. This counts what each
candidate costs the server: a single-user backend (`postgres --single`, the extension preloaded)
under `valgrind --tool=callgrind` runs N and then 2N copies of one transaction; the difference
over N is one transaction (bench/instructions.py's method and template cluster).

Usage: token_statements.py --pgbin DIR --work DIR [--n 1000]
Prints a markdown table: transaction, instructions, and the difference to `BEGIN; COMMIT;`.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import instructions  # noqa: E402

TXNS = {
    "BEGIN; COMMIT;": "BEGIN; COMMIT;",
    "+ SET LOCAL pg_fencing.token": "BEGIN; SET LOCAL pg_fencing.token = '100'; COMMIT;",
    "+ SET LOCAL work_mem (a built-in setting, for comparison)": "BEGIN; SET LOCAL work_mem = '5MB'; COMMIT;",
    "+ SELECT set_config('pg_fencing.token', …, true)":
        "BEGIN; SELECT pg_catalog.set_config('pg_fencing.token', '100', true); COMMIT;",
    "+ SET LOCAL pg_fencing.token, SAVEPOINT before COMMIT":
        "BEGIN; SET LOCAL pg_fencing.token = '100'; SAVEPOINT pg_fencing_commit; COMMIT;",
    "+ SET LOCAL pg_fencing.token, SELECT 1 before COMMIT":
        "BEGIN; SET LOCAL pg_fencing.token = '100'; SELECT 1; COMMIT;",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pgbin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--n", type=int, default=1000)
    args = ap.parse_args()
    template, _ = instructions.template_cluster(args.pgbin, args.work, "template", instructions.SETUP, "SELECT 1")
    per = {}
    for label, txn in TXNS.items():
        one = instructions.callgrind_total(args.pgbin, args.work, template, (txn + "\n") * args.n, label)
        two = instructions.callgrind_total(args.pgbin, args.work, template, (txn + "\n") * (2 * args.n), label)
        per[label] = (two - one) / args.n
        print(f"  {label}: {per[label]:,.0f}", file=sys.stderr)
    base = per["BEGIN; COMMIT;"]
    print(f"Server instructions per transaction (callgrind, `postgres --single`, N = {args.n} and 2N):")
    print()
    print("| transaction | instructions | added to `BEGIN; COMMIT;` |")
    print("|---|---:|---:|")
    for label, v in per.items():
        print(f"| {label} | {v:,.0f} | {v - base:,.0f} |")


if __name__ == "__main__":
    main()
