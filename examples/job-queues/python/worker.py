"""A pgqueuer worker whose job handler writes through pg_fencing with a PostgreSQL lease's token
(examples/job-queues/README.md; run by tests/jobqueue/run.sh).

pgqueuer re-picks a job whose worker stopped sending heartbeats for `--heartbeat-timeout`
seconds and hands it to another worker. The stopped worker may be alive: frozen by a GC pause, a
SIGSTOP, a VM migration. When it wakes up it finishes the job it still believes it owns and
writes its result over the retry's: a zombie write. So the handler takes a PostgreSQL lease
named after the job, with a TTL no longer than the heartbeat timeout, and writes with the
lease's token; on a table protected by pg_fencing the zombie's write is then refused (FT003: its
lease was taken over; or FT001: a newer token already wrote the row) and rolled back.

    pgq install                                     # pgqueuer's tables (once per database)
    pgq run worker:main --heartbeat-timeout 2 --dequeue-timeout 0.5
    pgq queue charge_order '{"order": 7, "amount": 100, "work_seconds": 1}'

(`pgq` is `python -m pgqueuer`; run it in this directory so that `worker:main` imports.) The
database comes from the libpq variables PGHOST, PGPORT, PGUSER, PGDATABASE (or PGDSN for the
CLI). JOB_LEASE_TTL (seconds, default 2) must not exceed the heartbeat timeout: the retry's
lease request waits up to that long for the old lease to run out. WORKER_NAME names this worker
in what it writes and prints (default host:pid).

It prints one line per step, for people and for the test:
    worker=NAME job=ID leased token=TOKEN
    worker=NAME job=ID write ok result=TEXT
    worker=NAME job=ID write refused SQLSTATE MESSAGE     (FT001/FT003: a zombie, fenced off)
    worker=NAME job=ID write failed SQLSTATE MESSAGE      (anything else)
"""

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import asyncpg
from pg_fencing import FencingError, from_error
from pg_fencing.asyncpg import fenced
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job

LEASE_TTL = timedelta(seconds=float(os.environ.get("JOB_LEASE_TTL", "2")))
WORKER = os.environ.get("WORKER_NAME") or f"{socket.gethostname()}:{os.getpid()}"

# The job's effect, keyed by the job: on a protected table (fencing_protect('results')) each row
# remembers the token of its last write, and the lease remembers whether a token is still live.
UPSERT = """
    INSERT INTO results (job_id, order_id, amount, worker)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT (job_id) DO UPDATE
       SET order_id = EXCLUDED.order_id, amount = EXCLUDED.amount, worker = EXCLUDED.worker
"""


def say(job: Job, text: str) -> None:
    print(f"worker={WORKER} job={job.id} {text}", flush=True)


@asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    """The factory `pgq run worker:main` enters (pgqueuer 1.6 wants an async context manager):
    one connection for the queue, a pool for the handlers."""
    connection = await asyncpg.connect()
    pool = await asyncpg.create_pool(min_size=1, max_size=4)
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint("charge_order")
    async def charge_order(job: Job) -> None:
        order = json.loads(job.payload or b"{}")
        async with pool.acquire() as conn:
            # One lease per job. A retry of this job (same id) on another worker asks for the
            # same lease: it waits for the old one to run out and gets a higher token.
            token = await conn.fetchval(
                "SELECT fencing_lease_acquire($1, $2, $3)", f"job:{job.id}", LEASE_TTL, LEASE_TTL
            )
            say(job, f"leased token={token}")
            try:
                # The job's real work. A worker frozen here past the heartbeat timeout and the
                # lease's TTL is the zombie: pgqueuer has given the job to another worker.
                await asyncio.sleep(float(order.get("work_seconds", 0)))
                amount = int(order.get("amount", 0))
                try:
                    # The token goes with the write, in the write's own transaction (pg-fencing
                    # sends BEGIN and the token as one query and rolls back if the write fails).
                    async with fenced(conn, token):
                        await conn.execute(
                            UPSERT, str(job.id), int(order.get("order", 0)), amount, WORKER
                        )
                except (FencingError, asyncpg.PostgresError) as e:
                    t = from_error(e)
                    # superseded: FT001, FT003 (FT006): another attempt owns the job now.
                    verdict = "refused" if t is not None and t.superseded else "failed"
                    state = t.sqlstate if t else e.sqlstate
                    say(job, f"write {verdict} {state} {t.message if t else (e.args[0] if e.args else e)}")
                    # Fenced off: stop; pgqueuer records the failure of this (stale) attempt.
                    raise
                say(job, f"write ok result=amount:{amount}")
            finally:
                # Returns false when the lease is no longer ours; nothing to do then.
                await conn.fetchval("SELECT fencing_lease_release($1)", token)

    try:
        yield pgq
    finally:
        await pool.close()
        await connection.close()
