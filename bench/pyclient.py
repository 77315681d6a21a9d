"""A fenced one-row transaction through the Python package pg-fencing against the same
transaction unfenced through the same driver (issue 46): psycopg 3, psycopg2 and asyncpg, one
connection each, BENCH_ROUNDS rounds of BENCH_TXNS transactions of each variant (fenced, its floor:
the same call on an unprotected table with the token stamped, unfenced) interleaved transaction by
transaction, the median latency of a transaction per round, then the median over rounds. Run by bench/pyclient.sh.

  "$PY" bench/pyclient.py --dsn DSN --url URL [--out FILE]
"""
import argparse
import asyncio
import os
import statistics
import time

import asyncpg
import psycopg
import psycopg2

from pg_fencing import asyncpg as pf_asyncpg
from pg_fencing import psycopg as pf_psycopg
from pg_fencing import psycopg2 as pf_psycopg2

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))
TXNS = int(os.environ.get("BENCH_TXNS", "2000"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--out")
    a = ap.parse_args()
    admin = psycopg.connect(a.dsn, autocommit=True)
    admin.execute("DROP TABLE IF EXISTS pb_fenced, pb_plain")
    admin.execute("CREATE TABLE pb_fenced (id int PRIMARY KEY, v int)")
    admin.execute("CREATE TABLE pb_plain (id int PRIMARY KEY, v int, fence_token bigint)")
    admin.execute("SELECT fencing_protect('pb_fenced', 'pybench')")
    admin.execute("SELECT fencing_advance('pybench', 5)")
    for t in ("pb_fenced", "pb_plain"):
        with admin.transaction():
            admin.execute("SELECT set_config('pg_fencing.token', '5', true)")
            admin.execute(f"INSERT INTO {t} (id, v) SELECT g, 0 FROM generate_series(1, 1000) g")

    p3 = psycopg.connect(a.dsn)
    p2 = psycopg2.connect(a.dsn)
    key = lambda i: i % 1000 + 1  # noqa: E731
    FLOOR = "UPDATE pb_plain SET v = v + 1, fence_token = 5 WHERE id = %s"

    def p3_fenced(i):
        with pf_psycopg.fenced(p3, 5):
            p3.execute("UPDATE pb_fenced SET v = v + 1 WHERE id = %s", (key(i),))

    def p3_floor(i):
        with pf_psycopg.fenced(p3, 5):
            p3.execute(FLOOR, (key(i),))

    def p3_plain(i):
        with p3.transaction():
            p3.execute("UPDATE pb_plain SET v = v + 1 WHERE id = %s", (key(i),))

    def p2_fenced(i):
        with pf_psycopg2.fenced(p2, 5) as cur:
            cur.execute("UPDATE pb_fenced SET v = v + 1 WHERE id = %s", (key(i),))

    def p2_floor(i):
        with pf_psycopg2.fenced(p2, 5) as cur:
            cur.execute(FLOOR, (key(i),))

    def p2_plain(i):
        with p2, p2.cursor() as cur:
            cur.execute("UPDATE pb_plain SET v = v + 1 WHERE id = %s", (key(i),))

    def rounds(variants):
        """Per round, each variant's median latency (µs); the variants interleaved transaction
        by transaction, the order rotating, so that drift weighs on each alike."""
        out = []
        for _ in range(ROUNDS):
            lat = [[] for _ in variants]
            for i in range(TXNS):
                for k in range(len(variants)):
                    n = (i + k) % len(variants)
                    t0 = time.perf_counter()
                    variants[n](i)
                    lat[n].append(time.perf_counter() - t0)
            out.append(tuple(statistics.median(x) * 1e6 for x in lat))
        return out

    async def arounds(variants):
        out = []
        for _ in range(ROUNDS):
            lat = [[] for _ in variants]
            for i in range(TXNS):
                for k in range(len(variants)):
                    n = (i + k) % len(variants)
                    t0 = time.perf_counter()
                    await variants[n](i)
                    lat[n].append(time.perf_counter() - t0)
            out.append(tuple(statistics.median(x) * 1e6 for x in lat))
        return out

    async def asyncpg_rounds():
        c = await asyncpg.connect(a.url)

        async def fenced(i):
            async with pf_asyncpg.fenced(c, 5):
                await c.execute("UPDATE pb_fenced SET v = v + 1 WHERE id = $1", key(i))

        async def floor(i):
            async with pf_asyncpg.fenced(c, 5):
                await c.execute("UPDATE pb_plain SET v = v + 1, fence_token = 5 WHERE id = $1", key(i))

        async def plain(i):
            async with c.transaction():
                await c.execute("UPDATE pb_plain SET v = v + 1 WHERE id = $1", key(i))
        out = await arounds((fenced, floor, plain))
        await c.close()
        return out

    results = {"psycopg 3": rounds((p3_fenced, p3_floor, p3_plain)),
               "psycopg2": rounds((p2_fenced, p2_floor, p2_plain)),
               "asyncpg": asyncio.run(asyncpg_rounds())}
    lines = [f"PostgreSQL 15, one connection per driver on loopback (fsync off); {ROUNDS} rounds of "
             f"{TXNS} one-row UPDATE transactions of each variant, interleaved transaction by "
             f"transaction; median latency per transaction. Floor: the same fenced() call and "
             f"token on an unprotected table, the token stamped by the statement (no check).", "",
             "| driver | fenced (µs) | floor (µs) | unfenced (µs) | fenced / floor | fenced / unfenced |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, rs in results.items():
        f, fl, u = (statistics.median(x[k] for x in rs) for k in range(3))
        lines.append(f"| {name} | {f:.0f} | {fl:.0f} | {u:.0f} | {f / fl:.3f} | {f / u:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
