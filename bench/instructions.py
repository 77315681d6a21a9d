"""Instruction counts per transaction, unprotected against protected (issue 16).

Wall-clock TPS on a small, busy machine swings by several percent from run to run; instruction
counts do not. This runs a single-user backend (`postgres --single`, fsync and autovacuum off,
the extension preloaded) under `valgrind --tool=callgrind` twice for each path: once with N
transactions and once with 2N (the first N of the same seeded sequence, on fresh copies of one
template cluster). The difference of the two totals over N is the cost of one transaction, with
start-up, shutdown and statement preparation cancelled out.

Each transaction is `BEGIN; SET LOCAL pg_fencing.token = '100'; <statement>; COMMIT;` (the SET
also for unprotected tables, so both sides pay for it); the "lease token" paths set the token of
a live PostgreSQL lease (granted for 100 years in the template) instead. Keys are random over 10,000 rows; INSERT
uses new keys, DELETE keys that exist. The first row of the table is a floor, not pg_fencing:
PostgreSQL's built-in C trigger suppress_redundant_updates_trigger as a BEFORE UPDATE row trigger
(it does nothing here, every UPDATE changes the row), i.e. what any design built on a BEFORE row
trigger pays before it does anything (the row lock the trigger manager takes, the call).

Usage: instructions.py --pgbin DIR --work DIR [--n 1000] [--seed 1] [--only TEXT]
(--only: just the pairs whose label or statement names contain TEXT, e.g. "insert").
Prints a markdown table: path, unprotected and protected instructions per transaction, ratio.
"""
import argparse
import os
import random
import re
import shutil
import subprocess
import sys

ROWS = 10_000

SETUP = f"""
CREATE EXTENSION pg_fencing;
CREATE TABLE plain (id int PRIMARY KEY, v bigint NOT NULL, fence_token bigint);
CREATE TABLE prow (id int PRIMARY KEY, v bigint NOT NULL);
CREATE TABLE pres (id int PRIMARY KEY, v bigint NOT NULL);
CREATE TABLE floor (id int PRIMARY KEY, v bigint NOT NULL, fence_token bigint);
CREATE TRIGGER floor BEFORE UPDATE ON floor FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger();
SELECT fencing_protect('prow');
SELECT fencing_protect('pres', 'bench');
SELECT fencing_lease_acquire('bench', '100 years');
INSERT INTO plain SELECT g, 0, 100 FROM generate_series(1, {ROWS}) g;
INSERT INTO floor SELECT g, 0, 100 FROM generate_series(1, {ROWS}) g;
BEGIN; SET LOCAL pg_fencing.token = '100';
INSERT INTO prow SELECT g, 0 FROM generate_series(1, {ROWS}) g;
INSERT INTO pres SELECT g, 0 FROM generate_series(1, {ROWS}) g;
COMMIT;
VACUUM ANALYZE;
CHECKPOINT;
"""

# name -> (PREPARE statement, per-transaction statement with {k}; key kind)
STATEMENTS = {
    "update plain": ("PREPARE s(int) AS UPDATE plain SET v = v + 1 WHERE id = $1", "EXECUTE s({k})", "old"),
    "update floor": ("PREPARE s(int) AS UPDATE floor SET v = v + 1 WHERE id = $1", "EXECUTE s({k})", "old"),
    "update per-row": ("PREPARE s(int) AS UPDATE prow SET v = v + 1 WHERE id = $1", "EXECUTE s({k})", "old"),
    "update resource": ("PREPARE s(int) AS UPDATE pres SET v = v + 1 WHERE id = $1", "EXECUTE s({k})", "old"),
    # References, not pg_fencing: the cheapest SQL that stamps the token column from the GUC with
    # no check at all, and fenced_update's own work (jsonb key and changes in through
    # jsonb_populate_record, the new row out through to_jsonb) written as one plain statement.
    "update plain, token from the GUC in SQL": (
        "PREPARE s(int) AS UPDATE plain SET v = v + 1, fence_token = "
        "int8larger(fence_token, current_setting('pg_fencing.token')::bigint) WHERE id = $1",
        "EXECUTE s({k})", "old"),
    "update per-row, jsonb in and out in SQL": (
        "PREPARE s(int) AS UPDATE prow AS t SET v = (jsonb_populate_record(NULL::prow, '{\"v\": 1}')).v "
        "WHERE t.id = (jsonb_populate_record(NULL::prow, jsonb_build_object('id', $1))).id "
        "RETURNING to_jsonb(t.*)",
        "EXECUTE s({k})", "old"),
    # The same UPDATEs with the token of a live PostgreSQL lease (the time fence: one probe of the
    # lease's token index per transaction) instead of an etcd-style token; and the floor with it.
    "update per-row, lease token": ("PREPARE s(int) AS UPDATE prow SET v = v + 1 WHERE id = $1", "EXECUTE s({k})", "old"),
    "update resource, lease token": ("PREPARE s(int) AS UPDATE pres SET v = v + 1 WHERE id = $1", "EXECUTE s({k})", "old"),
    "update plain, token from the GUC in SQL, lease token": (
        "PREPARE s(int) AS UPDATE plain SET v = v + 1, fence_token = "
        "int8larger(fence_token, current_setting('pg_fencing.token')::bigint) WHERE id = $1",
        "EXECUTE s({k})", "old"),
    "fenced_update per-row": (
        "PREPARE s(int) AS SELECT fenced_update('prow', jsonb_build_object('id', $1), '{\"v\": 1}', 100)",
        "EXECUTE s({k})", "old"),
    "insert plain": ("PREPARE s(int) AS INSERT INTO plain (id, v) VALUES ($1, 0)", "EXECUTE s({k})", "new"),
    # The floor of a one-row INSERT: the token column set from the setting by a SQL expression,
    # no check (a one-row DELETE's floor is the plain DELETE: a token column has nothing to do).
    "insert plain, token from the GUC in SQL": (
        "PREPARE s(int) AS INSERT INTO plain (id, v, fence_token) "
        "VALUES ($1, 0, current_setting('pg_fencing.token')::bigint)",
        "EXECUTE s({k})", "new"),
    "insert per-row": ("PREPARE s(int) AS INSERT INTO prow (id, v) VALUES ($1, 0)", "EXECUTE s({k})", "new"),
    "insert resource": ("PREPARE s(int) AS INSERT INTO pres (id, v) VALUES ($1, 0)", "EXECUTE s({k})", "new"),
    # The same INSERTs sent as plain statements, planned every time (the planner hook's work
    # counts), as a client without prepared statements sends them.
    "insert plain, not prepared": ("", "INSERT INTO plain (id, v) VALUES ({k}, 0)", "new"),
    "insert plain, not prepared, token from the GUC in SQL": (
        "", "INSERT INTO plain (id, v, fence_token) VALUES ({k}, 0, current_setting('pg_fencing.token')::bigint)", "new"),
    "insert per-row, not prepared": ("", "INSERT INTO prow (id, v) VALUES ({k}, 0)", "new"),
    "fenced_insert per-row": (
        "PREPARE s(int) AS SELECT fenced_insert('prow', jsonb_build_object('id', $1, 'v', 0), 100)",
        "EXECUTE s({k})", "new"),
    "delete plain": ("PREPARE s(int) AS DELETE FROM plain WHERE id = $1", "EXECUTE s({k})", "unique"),
    "delete per-row": ("PREPARE s(int) AS DELETE FROM prow WHERE id = $1", "EXECUTE s({k})", "unique"),
    "delete resource": ("PREPARE s(int) AS DELETE FROM pres WHERE id = $1", "EXECUTE s({k})", "unique"),
    "fenced_delete per-row": (
        "PREPARE s(int) AS SELECT fenced_delete('prow', jsonb_build_object('id', $1), 100)",
        "EXECUTE s({k})", "unique"),
}

# (path, unprotected baseline, protected)
PAIRS = [
    ("floor: a C BEFORE UPDATE row trigger that does nothing (suppress_redundant_updates_trigger)",
     "update plain", "update floor"),
    ("per-row mode UPDATE", "update plain", "update per-row"),
    ("resource mode UPDATE", "update plain", "update resource"),
    ("fenced_update vs the plain prepared UPDATE of the per-row table", "update per-row", "fenced_update per-row"),
    ("reference, no pg_fencing code: the token column set from the GUC by a SQL expression, no check",
     "update plain", "update plain, token from the GUC in SQL"),
    ("reference: fenced_update's work as one SQL statement (jsonb_populate_record in, RETURNING "
     "to_jsonb out) vs the plain prepared UPDATE, both on the per-row table",
     "update per-row", "update per-row, jsonb in and out in SQL"),
    ("fenced_update vs that SQL statement", "update per-row, jsonb in and out in SQL", "fenced_update per-row"),
    ("per-row mode INSERT (new key)", "insert plain", "insert per-row"),
    ("... vs the floor: the token stamped by a SQL expression, no check",
     "insert plain, token from the GUC in SQL", "insert per-row"),
    ("per-row mode INSERT (new key), not prepared", "insert plain, not prepared", "insert per-row, not prepared"),
    ("... vs the floor: the token stamped by a SQL expression, no check",
     "insert plain, not prepared, token from the GUC in SQL", "insert per-row, not prepared"),
    ("resource mode INSERT", "insert plain", "insert resource"),
    ("... vs the floor: the token stamped by a SQL expression, no check",
     "insert plain, token from the GUC in SQL", "insert resource"),
    ("fenced_insert vs the plain INSERT of the per-row table", "insert per-row", "fenced_insert per-row"),
    ("per-row mode DELETE by key", "delete plain", "delete per-row"),
    ("resource mode DELETE by key", "delete plain", "delete resource"),
    ("fenced_delete vs the plain DELETE of the per-row table", "delete per-row", "fenced_delete per-row"),
    ("per-row mode UPDATE, token of a live PostgreSQL lease", "update plain", "update per-row, lease token"),
    ("... vs the floor: the lease token stamped by a SQL expression, no check",
     "update plain, token from the GUC in SQL, lease token", "update per-row, lease token"),
    ("... vs the same UPDATE with an etcd-style token (the time fence's own cost)", "update per-row", "update per-row, lease token"),
    ("resource mode UPDATE, token of a live PostgreSQL lease", "update plain", "update resource, lease token"),
    ("... vs the floor: the lease token stamped by a SQL expression, no check",
     "update plain, token from the GUC in SQL, lease token", "update resource, lease token"),
    ("... vs the same UPDATE with an etcd-style token (the time fence's own cost)", "update resource", "update resource, lease token"),
]


def as_postgres(cmd, **kw):
    if os.getuid() == 0:
        cmd = ["sudo", "-u", "postgres", "--"] + cmd
    return subprocess.run(cmd, check=True, **kw)


def keys(kind, n, rng):
    if kind == "old":
        return [rng.randint(1, ROWS) for _ in range(n)]
    if kind == "new":
        return list(range(ROWS + 1, ROWS + 1 + n))
    ks = list(range(1, ROWS + 1))
    rng.shuffle(ks)
    return ks[:n]


def count(args, template, name, n):
    prepare, stmt, kind = STATEMENTS[name]
    rng = random.Random(args.seed)
    token = args.lease_token if "lease token" in name else "100"
    lines = [prepare] + [
        f"BEGIN; SET LOCAL pg_fencing.token = '{token}'; {stmt.format(k=k)}; COMMIT;"
        for k in keys(kind, n, rng)
    ]
    return callgrind_total(args.pgbin, args.work, template, "\n".join(lines) + "\n", name)


def callgrind_total(pgbin, work, template, script_text, name, preload=True):
    """Instructions of one single-user backend on a fresh copy of `template` running
    `script_text` under callgrind (start-up and shutdown included; callers take differences);
    `preload`: with shared_preload_libraries = pg_fencing (else the library loads on first use)."""
    run_dir = os.path.join(work, "run")
    if os.path.exists(run_dir):
        shutil.rmtree(run_dir)
    as_postgres(["cp", "-a", template, run_dir])
    script = os.path.join(work, "input.sql")
    with open(script, "w") as f:
        f.write(script_text)
    log = os.path.join(work, "callgrind.log")
    # PGF_CALLGRIND_KEEP=DIR keeps each run's profile as DIR/<name>.<instructions> for
    # callgrind_annotate (BENCHMARKS.md, "Where the instructions go").
    keep = os.environ.get("PGF_CALLGRIND_KEEP")
    profile = os.path.join(work, "callgrind.out") if keep else "/dev/null"
    with open(script) as stdin:
        out = as_postgres(["valgrind", "--tool=callgrind", f"--log-file={log}", f"--callgrind-out-file={profile}",
                           f"{pgbin}/postgres", "--single", "-D", run_dir,
                           "-c", "fsync=off", "-c", "autovacuum=off",
                           "-c", "shared_preload_libraries=" + ("pg_fencing" if preload else ""),
                           "postgres"],
                          stdin=stdin, capture_output=True, text=True)
    # A statement that failed would make the counts meaningless.
    if "ERROR" in out.stdout + out.stderr:
        raise SystemExit(f"instructions: {name} failed:\n" + (out.stdout + out.stderr)[-2000:])
    with open(log) as f:
        m = re.search(r"Collected : (\d+)", f.read())
    if not m:
        raise SystemExit(f"instructions: no instruction count in {log}")
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(profile, os.path.join(keep, f"{re.sub(r'[^A-Za-z0-9]+', '_', name)}.{m.group(1)}"))
    return int(m.group(1))


def template_cluster(pgbin, work, name, setup_sql, query):
    """A template cluster WORK/NAME made by running `setup_sql` on a server (not under callgrind),
    stopped again; returns its path and the one-value answer to `query`, asked before the stop."""
    template = os.path.join(work, name)
    port = int(os.environ.get("PGPORT_BENCH", "54379"))
    as_postgres([f"{pgbin}/initdb", "-D", template, "-U", "postgres", "-A", "trust", "--no-sync"],
                stdout=subprocess.DEVNULL)
    as_postgres([f"{pgbin}/pg_ctl", "-D", template, "-w", "-o",
                 f"-p {port} -k {work} -c listen_addresses='' -c shared_preload_libraries=pg_fencing",
                 "-l", os.path.join(work, f"{name}.log"), "start"], stdout=subprocess.DEVNULL)
    psql = ["psql", "-X", "-h", work, "-p", str(port), "-U", "postgres", "-d", "postgres"]
    try:
        subprocess.run(psql + ["-q", "-v", "ON_ERROR_STOP=1", "-f", "-"], input=setup_sql, text=True,
                       check=True, stdout=subprocess.DEVNULL)
        answer = subprocess.run(psql + ["-At", "-c", query], capture_output=True, text=True,
                                check=True).stdout.strip()
    finally:
        as_postgres([f"{pgbin}/pg_ctl", "-D", template, "-w", "-m", "fast", "stop"], stdout=subprocess.DEVNULL)
    return template, answer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pgbin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", help="just the pairs whose label or statements contain this text")
    args = ap.parse_args()
    pairs = [p for p in PAIRS if not args.only or any(args.only in x for x in p)]
    needed = {n for _, base, prot in pairs for n in (base, prot)}
    template, args.lease_token = template_cluster(
        args.pgbin, args.work, "template", SETUP, "SELECT token FROM fencing_leases WHERE name = 'bench'")
    per_txn = {}
    for name in (n for n in STATEMENTS if n in needed):
        one = count(args, template, name, args.n)
        two = count(args, template, name, 2 * args.n)
        per_txn[name] = (two - one) / args.n
        print(f"  {name}: {per_txn[name]:,.0f} instructions per transaction", file=sys.stderr)
    print(f"Instructions per transaction (callgrind, `postgres --single`, N = {args.n} and 2N, "
          f"seed {args.seed}); ratio = unprotected / protected, 1.00 = free:")
    print()
    print("| path | unprotected | protected | ratio |")
    print("|---|---:|---:|---:|")
    for label, base, prot in pairs:
        b, p = per_txn[base], per_txn[prot]
        print(f"| {label} | {b:,.0f} | {p:,.0f} | {b / p:.2f} |")


if __name__ == "__main__":
    main()
