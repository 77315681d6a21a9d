"""The bypass hunter's contract on a Citus cluster (issue 45; docs/citus.md): random sequences
of writes to a protected hash-distributed table and a protected reference table, through every
write path Citus offers (entering at the coordinator or at a worker, or aimed at a shard), with
tokens of every class (the current holder's, a new holder's, a stale one, none), between shard
moves, re-creations of the table by Citus (alter_distributed_table, undistribute_table and
create_distributed_table) and rolled-back transactions; each outcome compared with a model of the documented
contract (the table of docs/citus.md), kept here independently of the extension:

* through the coordinator: no token FT002; a token below the resource's mark FT001; otherwise
  admitted, the rows stamped with it, the mark raised to it when the transaction commits;
* INSERT … SELECT (repartitioned or routed to one shard) through the coordinator: as any write
  there;
* a write entering at a worker, one aimed at a shard on its worker: FT004 whatever the token;
  MERGE and a COPY that gives the token column: 0A000;
* a rolled-back transaction raises nothing.

After every step: no value a refused write tried to write (negative) is in either table; every
row carries a token that some admitted write carried, at most the mark; and at the end the
resources' marks equal the model's.

  "$PY" tests/citus/hunt.py --port <coordinator port> [--seed S] [--steps N]
"""
import argparse
import random
import sys

import psycopg

FAIL = []


def sqlstate(conn, sql, copy_rows=None):
    """Run sql (a transaction's statements, ';'-separated, in one transaction); the SQLSTATE or
    'ok'."""
    try:
        with conn.transaction():
            with conn.cursor() as cur:
                for stmt in sql:
                    if copy_rows is not None and stmt.startswith("COPY"):
                        with cur.copy(stmt) as cp:
                            cp.write(copy_rows)
                    else:
                        cur.execute(stmt)
        return "ok"
    except psycopg.Error as e:
        return e.sqlstate or "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=150)
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    dsn = lambda port: f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    coord = psycopg.connect(dsn(a.port), autocommit=True)
    worker = psycopg.connect(dsn(a.port + 1), autocommit=True)
    q = lambda sql: coord.execute(sql).fetchall()
    coord.execute("DROP TABLE IF EXISTS hunt_d, hunt_r")
    coord.execute("CREATE TABLE hunt_d (account int PRIMARY KEY, v int)")
    coord.execute("SELECT create_distributed_table('hunt_d', 'account', shard_count => 6)")
    coord.execute("CREATE TABLE hunt_r (id int PRIMARY KEY, v int)")
    coord.execute("SELECT create_reference_table('hunt_r')")
    marks = {"hunt_d": 0, "hunt_r": 0}
    res = lambda t: f"{t}_seed{a.seed}"
    for t in marks:
        coord.execute(f"SELECT fencing_protect('{t}', '{res(t)}')")
        coord.execute(f"SELECT fencing_advance('{res(t)}', 1)")
        marks[t] = 1
    for t, n in (("hunt_d", 40), ("hunt_r", 5)):
        key = "account" if t == "hunt_d" else "id"
        assert sqlstate(coord, ["SET LOCAL pg_fencing.token = '1'",
                                f"INSERT INTO {t} ({key}, v) SELECT g, 0 FROM generate_series(1, {n}) g"]) == "ok"
    seen_tokens = {1}
    paths = ["router_update", "multi_update", "router_delete", "upsert", "cte_update", "copy",
             "truncate", "insert_select", "insert_select_router", "merge", "copy_token", "worker_update",
             "shard_update", "multi_delete"]
    admitted = {p: 0 for p in paths}
    recreated = 0
    for step in range(1, a.steps + 1):
        table = rnd.choice(["hunt_d", "hunt_d", "hunt_r"])
        key = "account" if table == "hunt_d" else "id"
        nrows = 40 if table == "hunt_d" else 5
        mark = marks[table]
        kind = rnd.choice(["current", "current", "new", "stale", "none"])
        token = {"current": mark, "new": mark + rnd.randint(1, 3),
                 "stale": rnd.randint(max(1, mark - 3), mark - 1) if mark > 1 else None,
                 "none": None}[kind]
        if kind == "stale" and token is None:
            kind = "none"
        path = rnd.choice(paths)
        rollback = rnd.random() < 0.1
        k = rnd.randint(1, nrows)
        value = step if kind in ("current", "new") else -step
        stmts = [f"SET LOCAL pg_fencing.token = '{token}'"] if token is not None else []
        conn = coord
        copy_rows = None
        if path == "router_update":
            stmts.append(f"UPDATE {table} SET v = {value} WHERE {key} = {k}")
        elif path == "multi_update":
            stmts.append(f"UPDATE {table} SET v = {value} WHERE {key} % 3 = {k % 3}")
        elif path == "router_delete":
            stmts.append(f"DELETE FROM {table} WHERE {key} = {k}")
            stmts.append(f"INSERT INTO {table} ({key}, v) VALUES ({k}, {value})")
        elif path == "multi_delete":
            stmts.append(f"DELETE FROM {table} WHERE {key} > {nrows}")
        elif path == "upsert":
            stmts.append(f"INSERT INTO {table} ({key}, v) VALUES ({k}, {value}) "
                         f"ON CONFLICT ({key}) DO UPDATE SET v = excluded.v")
        elif path == "cte_update":
            stmts.append(f"WITH x AS (UPDATE {table} SET v = {value} WHERE {key} = {k} RETURNING 1) "
                         f"SELECT count(*) FROM x")
        elif path == "copy":
            stmts.append(f"COPY {table} ({key}, v) FROM STDIN")
            copy_rows = "".join(f"{1000 * step + i}\t{value}\n" for i in range(3))
        elif path == "copy_token":
            stmts.append(f"COPY {table} FROM STDIN")
            copy_rows = f"{1000 * step}\t{value}\t{token or 1}\n"
        elif path == "truncate":
            stmts.append(f"TRUNCATE {table}")
            stmts.append(f"INSERT INTO {table} ({key}, v) SELECT g, {value} FROM generate_series(1, {nrows}) g")
        elif path == "insert_select":
            stmts.append(f"INSERT INTO {table} ({key}, v) SELECT {key} + 100000 * {step}, {value} FROM {table}")
        elif path == "insert_select_router":
            stmts.append(f"INSERT INTO {table} ({key}, v) SELECT {key} + 100000 * {step}, {value} FROM {table} "
                         f"WHERE {key} = {k}")
        elif path == "merge":
            stmts.append(f"MERGE INTO {table} t USING (SELECT {k} AS k) s ON t.{key} = s.k "
                         f"WHEN MATCHED THEN UPDATE SET v = {value}")
        elif path == "worker_update":
            conn = worker
            stmts.append(f"UPDATE {table} SET v = {value} WHERE {key} = {k}")
        elif path == "shard_update":
            conn = worker
            worker.execute("SET citus.override_table_visibility = off")
            shard = worker.execute(
                "SELECT relname FROM pg_class WHERE relname ~ %s ORDER BY random() LIMIT 1",
                (f"^{table}_[0-9]+$",)).fetchall()
            if not shard:
                continue
            stmts.append(f"UPDATE {shard[0][0]} SET v = {value}")
        if rollback:
            stmts.append("SELECT 1/0")  # the transaction fails after its writes
        # The model.
        if path in ("merge", "copy_token"):
            expected = "0A000"
        elif path in ("worker_update", "shard_update"):
            expected = "FT004"
        elif token is None:
            expected = "FT002"
        elif token < mark:
            expected = "FT001"
        else:
            expected = "22012" if rollback else "ok"
        got = sqlstate(conn, stmts, copy_rows)
        if got != expected:
            FAIL.append(f"step {step}: {path} on {table} with {kind} token {token} "
                        f"(mark {mark}){' rolled back' if rollback else ''}: expected {expected}, got {got}")
        if got == "ok":
            admitted[path] += 1
            marks[table] = max(mark, token)
            seen_tokens.add(token)
        # The independent checks, after every step.
        for t in marks:
            neg = q(f"SELECT count(*) FROM {t} WHERE v < 0")[0][0]
            if neg:
                FAIL.append(f"step {step}: {neg} rows of {t} carry a refused write's value")
            tokens = {r[0] for r in q(f"SELECT DISTINCT fence_token FROM {t}")}
            if not tokens <= seen_tokens or max(tokens, default=0) > marks[t]:
                FAIL.append(f"step {step}: {t} carries tokens {sorted(tokens)}, admitted "
                            f"{sorted(seen_tokens)}, mark {marks[t]}")
            real = q(f"SELECT fencing_high_water('{res(t)}')")[0][0]
            if real != marks[t]:
                FAIL.append(f"step {step}: mark of {res(t)} is {real}, the model's {marks[t]}")
        if rnd.random() < 0.05:
            s = q("SELECT shardid, nodeport FROM citus_shards WHERE table_name = 'hunt_d'::regclass "
                  "ORDER BY random() LIMIT 1")[0]
            to = a.port + 2 if s[1] == a.port + 1 else a.port + 1
            coord.execute("SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s, "
                          "shard_transfer_mode => 'block_writes')", (s[0], s[1], to))
            coord.execute("CALL citus_cleanup_orphaned_resources()")
        if rnd.random() < 0.03:
            # Citus re-creates the protected table (docs/citus.md, "Distributing a protected
            # table"): its protection and the resource's mark must carry over.
            n = q("SELECT shard_count FROM citus_tables WHERE table_name = 'hunt_d'::regclass")[0][0]
            with coord.transaction():
                if rnd.random() < 0.5:
                    coord.execute(f"SELECT alter_distributed_table('hunt_d', shard_count := {10 - n}, "
                                  "cascade_to_colocated := false)")
                else:
                    coord.execute("SELECT undistribute_table('hunt_d')")
                    coord.execute(f"SELECT create_distributed_table('hunt_d', 'account', shard_count => {10 - n})")
            recreated += 1
        if len(FAIL) > 20:
            break
    print(f"citus hunt: seed {a.seed}, {step} steps, the table re-created {recreated} times; admitted: "
          + ", ".join(f"{p} {n}" for p, n in admitted.items() if n))
    for f in FAIL:
        print("  FAIL:", f)
    if not admitted["router_update"] or not admitted["copy"]:
        print("  FAIL: the hunt admitted no router UPDATE or no COPY: it tested nothing")
        return 1
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
