"""A procrastinate app whose job handler writes through pg_fencing with a PostgreSQL lease's token
(examples/job-queues/README.md; run by tests/jobqueue/run.sh).

procrastinate notices a stalled worker by its heartbeats (every `update_heartbeat_interval`
seconds, in `procrastinate_workers`); the app's own periodic task `retry_stalled_jobs` (the
recovery procrastinate's documentation recommends) puts the jobs of a worker silent for
`stalled_worker_timeout` seconds back in the queue, and another worker runs them. The silent
worker may be alive: frozen by a GC pause, a SIGSTOP, a VM migration. When it wakes up it
finishes the job it still believes it owns. So the handler takes a PostgreSQL lease named after
the job, with a TTL no longer than the stall timeout, renews it every third of the TTL on a
connection of its own, and writes with the lease's token: on a table protected by pg_fencing
the zombie's write is refused (FT003: its lease ran out and was taken over; or FT001: a newer
token already wrote the row) and rolled back.

procrastinate then writes the end of the handler (`succeeded`, `failed`, or a retry) onto the job
by its id, whoever runs the job now: a zombie that returned or raised would end its successor's
attempt. So a handler fenced off checks whether the job is still its own attempt: if it is
(nobody took it over), it raises, and procrastinate records the failure; if not, the worker exits
without ending the job, and leaves it to the attempt that owns it (its supervisor starts a new
worker).

    procrastinate --app=procrastinate_worker.app schema --apply      # once per database
    procrastinate --app=procrastinate_worker.app worker --name A
    procrastinate --app=procrastinate_worker.app defer charge_order \\
        '{"order": 7, "amount": 100, "work_seconds": 1, "finish_seconds": 2}'

(`procrastinate` is `python -m procrastinate`; run it in this directory so that
`procrastinate_worker` imports.) The database comes from the libpq variables PGHOST, PGPORT,
PGUSER, PGDATABASE. JOB_LEASE_TTL (seconds, default 2) is the lease's TTL and the stall timeout;
RECOVERY_CRON (default every 10 minutes) how often `retry_stalled_jobs` runs (the test: every
second). WORKER_NAME names this worker in what it writes and prints (default host:pid).

It prints one line per step, for people and for the test:
    worker=NAME job=ID leased token=TOKEN attempts=N
    worker=NAME job=ID write ok result=TEXT
    worker=NAME job=ID write refused SQLSTATE MESSAGE     (FT001/FT003: a zombie, fenced off)
    worker=NAME job=ID write failed SQLSTATE MESSAGE      (anything else)
    worker=NAME job=ID renew refused SQLSTATE MESSAGE     (the lease had ended)
    worker=NAME job=ID superseded: ...; exiting           (the job is another attempt's)
    worker=NAME job=ID done
"""

import asyncio
import os
import socket
from datetime import timedelta

import psycopg
from pg_fencing import FencingError, from_error
from pg_fencing.psycopg import afenced
from procrastinate import App, JobContext, PsycopgConnector

LEASE_TTL = timedelta(seconds=float(os.environ.get("JOB_LEASE_TTL", "2")))
WORKER = os.environ.get("WORKER_NAME") or f"{socket.gethostname()}:{os.getpid()}"

app = App(
    connector=PsycopgConnector(),  # libpq's PG* variables
    worker_defaults={
        # A worker silent for the lease's TTL is stalled: its lease has run out by then too.
        "stalled_worker_timeout": LEASE_TTL.total_seconds(),
        "update_heartbeat_interval": LEASE_TTL.total_seconds() / 4,
        "fetch_job_polling_interval": 0.5,
    },
)

# The job's effect, keyed by the job: on a protected table (fencing_protect('results')) each row
# remembers the token of its last write, and the lease remembers whether a token is still live.
UPSERT = """
    INSERT INTO results (job_id, order_id, amount, worker)
    VALUES (%s, %s, %s, %s)
    ON CONFLICT (job_id) DO UPDATE
       SET order_id = EXCLUDED.order_id, amount = EXCLUDED.amount, worker = EXCLUDED.worker
"""


def say(job_id: object, text: str) -> None:
    print(f"worker={WORKER} job={job_id} {text}", flush=True)


@app.periodic(cron=os.environ.get("RECOVERY_CRON", "*/10 * * * *"))
@app.task(queueing_lock="retry_stalled_jobs", pass_context=True)
async def retry_stalled_jobs(context: JobContext, timestamp: int) -> None:
    """procrastinate's stalled-job recovery: the jobs of workers whose heartbeats stopped go back
    to the queue (their attempts count goes up by one)."""
    stalled = await app.job_manager.get_stalled_jobs(
        seconds_since_heartbeat=LEASE_TTL.total_seconds()
    )
    for job in stalled:
        await app.job_manager.retry_job(job)


async def renew(job_id: int, token: int) -> None:
    """The lease's heartbeat, every third of the TTL, on a connection of its own (so a long
    statement of the handler never delays it). Stops at the first refusal: the lease has ended."""
    async with await psycopg.AsyncConnection.connect(autocommit=True) as conn:
        while True:
            await asyncio.sleep(LEASE_TTL.total_seconds() / 3)
            try:
                await conn.execute("SELECT fencing_lease_renew(%s)", (token,))
            except psycopg.Error as e:
                say(job_id, f"renew refused {e.sqlstate} {e.diag.message_primary}")
                return


async def still_this_attempt(conn: psycopg.AsyncConnection, context: JobContext) -> bool:
    """Is the job still the attempt this handler runs? procrastinate's stalled-job recovery
    (`retry_job`) puts it back to `todo` with one attempt more; another worker then runs it."""
    cur = await conn.execute(
        "SELECT status, attempts FROM procrastinate_jobs WHERE id = %s", (context.job.id,)
    )
    row = await cur.fetchone()
    return row is not None and row[0] == "doing" and row[1] == context.job.attempts


@app.task(name="charge_order", pass_context=True)
async def charge_order(
    context: JobContext,
    order: int,
    amount: int,
    work_seconds: float = 0,
    finish_seconds: float = 0,
) -> None:
    job_id = context.job.id
    async with await psycopg.AsyncConnection.connect(autocommit=True) as conn:
        # One lease per job. A retry of this job (same id) on another worker asks for the same
        # lease: it waits for the old one to run out and gets a higher token.
        cur = await conn.execute(
            "SELECT fencing_lease_acquire(%s, %s, %s)", (f"job:{job_id}", LEASE_TTL, LEASE_TTL)
        )
        token = (await cur.fetchone())[0]
        say(job_id, f"leased token={token} attempts={context.job.attempts}")
        heartbeat = asyncio.create_task(renew(job_id, token))
        try:
            # The job's real work. A worker frozen here past the stall timeout is the zombie:
            # procrastinate has given the job to another worker.
            await asyncio.sleep(work_seconds)
            try:
                # The token goes with the write, in the write's own transaction (pg-fencing sends
                # BEGIN and the token as one query and rolls back if the write fails).
                async with afenced(conn, token):
                    await conn.execute(UPSERT, (str(job_id), order, amount, WORKER))
            except (FencingError, psycopg.Error) as e:
                t = from_error(e)
                fenced = t is not None and t.superseded  # FT001, FT003 (FT006): superseded
                verdict = "refused" if fenced else "failed"
                say(job_id, f"write {verdict} {t.sqlstate if t else e.sqlstate} "
                            f"{t.message if t else e.diag.message_primary}")
                if not fenced or await still_this_attempt(conn, context):
                    # Nobody else runs the job: procrastinate records this attempt's failure
                    # (or retries it, by the task's retry policy).
                    raise
                # Superseded: the job is another attempt's now. Whatever this handler returned
                # or raised, procrastinate would write it onto that attempt's job; so the worker
                # exits without ending it.
                say(job_id, "superseded: the job is another attempt's; exiting")
                os._exit(3)
            say(job_id, f"write ok result=amount:{amount}")
            # The rest of the job (a receipt, a notification) before it ends.
            await asyncio.sleep(finish_seconds)
        finally:
            heartbeat.cancel()
            # false when the lease is no longer ours; nothing to do then.
            await conn.execute("SELECT fencing_lease_release(%s)", (token,))
    say(job_id, "done")
