"""A fenced one-row transaction through the Python package pg-fencing against the same
transaction unfenced through the same driver (issue 46): psycopg 3, psycopg2 and asyncpg, one
connection each, BENCH_ROUNDS interleaved rounds of BENCH_TXNS transactions, the median latency
of a transaction per round, then the median over rounds. Run by bench/pyclient.sh.

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


def timed(fn):
    lat = []
    for i in range(TXNS):
        t0 = time.perf_counter()
        fn(i)
        lat.append(time.perf_counter() - t0)
    return statistics.median(lat) * 1e6


async def atimed(fn):
    lat = []
    for i in range(TXNS):
        t0 = time.perf_counter()
        await fn(i)
        lat.append(time.perf_counter() - t0)
    return statistics.median(lat) * 1e6


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

    def p3_fenced(i):
        with pf_psycopg.fenced(p3, 5):
            p3.execute("UPDATE pb_fenced SET v = v + 1 WHERE id = %s", (i % 1000 + 1,))

    def p3_plain(i):
        with p3.transaction():
            p3.execute("UPDATE pb_plain SET v = v + 1 WHERE id = %s", (i % 1000 + 1,))

    def p2_fenced(i):
        with pf_psycopg2.fenced(p2, 5) as cur:
            cur.execute("UPDATE pb_fenced SET v = v + 1 WHERE id = %s", (i % 1000 + 1,))

    def p2_plain(i):
        with p2, p2.cursor() as cur:
            cur.execute("UPDATE pb_plain SET v = v + 1 WHERE id = %s", (i % 1000 + 1,))

    results = {k: [] for k in ("psycopg 3", "psycopg2", "asyncpg")}

    async def asyncpg_rounds():
        c = await asyncpg.connect(a.url)

        async def fenced(i):
            async with pf_asyncpg.fenced(c, 5):
                await c.execute("UPDATE pb_fenced SET v = v + 1 WHERE id = $1", i % 1000 + 1)

        async def plain(i):
            async with c.transaction():
                await c.execute("UPDATE pb_plain SET v = v + 1 WHERE id = $1", i % 1000 + 1)
        out = []
        for r in range(ROUNDS):
            pair = [await atimed(fenced), await atimed(plain)] if r % 2 == 0 else \
                list(reversed([await atimed(plain), await atimed(fenced)]))
            out.append(pair)
        await c.close()
        return out

    for r in range(ROUNDS):
        for name, f, u in (("psycopg 3", p3_fenced, p3_plain), ("psycopg2", p2_fenced, p2_plain)):
            if r % 2 == 0:
                results[name].append((timed(f), timed(u)))
            else:
                uu = timed(u)
                results[name].append((timed(f), uu))
    results["asyncpg"] = [tuple(p) for p in asyncio.run(asyncpg_rounds())]
    lines = [f"PostgreSQL 15, one connection per driver on loopback (fsync off); {ROUNDS} interleaved "
             f"rounds of {TXNS} one-row UPDATE transactions, median latency per transaction.", "",
             "| driver | fenced (µs) | unfenced (µs) | fenced / unfenced |", "|---|---:|---:|---:|"]
    for name, rs in results.items():
        f = statistics.median(x[0] for x in rs)
        u = statistics.median(x[1] for x in rs)
        lines.append(f"| {name} | {f:.0f} | {u:.0f} | {f / u:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
