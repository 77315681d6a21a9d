"""pg_fencing with asyncpg: ``fenced(conn, token)``, ``Lease`` (renewed by an asyncio task) and
``run_with_lease``.

    async with fenced(conn, token):
        await conn.execute("UPDATE ledger SET v = v + 1 WHERE id = $1", 1)
"""
import asyncio
import contextlib
import time

import asyncpg

from ._lease import LeaseBase
from ._sql import REMAINING, begin_fenced, check_token, exclusive, learn
from .errors import ended_by_block, from_error, raise_typed, rolled_back

_ACQUIRE = "SELECT fencing_lease_acquire($1, make_interval(secs => $2), make_interval(secs => $3))"
_RENEW = "SELECT fencing_lease_renew($1, make_interval(secs => $2))"
_RELEASE = "SELECT fencing_lease_release($1)"
_REMAINING = REMAINING.replace("%s", "$1")


@contextlib.asynccontextmanager
async def fenced(conn, token):
    """A transaction on ``conn`` (not in a transaction) fenced by ``token``. ``BEGIN`` and the
    token go in one simple query, instead of asyncpg's own ``BEGIN``. ``RolledBack`` if a
    statement failed inside (its error caught there) so that nothing could commit;
    ``RuntimeError`` if the block ended the transaction itself (``COMMIT`` or ``ROLLBACK``)."""
    v = conn.get_server_version()
    # A pool's connection comes as a proxy made for each acquire: the answer is the connection's.
    key = conn._con if isinstance(conn, asyncpg.pool.PoolConnectionProxy) else conn
    sql, probing = begin_fenced(key, token, v.major * 10000 + v.minor)
    with exclusive(key):
        if conn.is_in_transaction():
            raise RuntimeError("fenced() starts its own transaction: the connection is in one")
        try:
            status = await conn.execute(sql)
        except asyncpg.PostgresError:
            if not conn.is_closed() and conn.is_in_transaction():
                await conn.execute("ROLLBACK")
            raise
        except BaseException:
            # Cancelled (or the connection failed) with the BEGIN in flight: whether the server
            # began the fenced transaction is unknown, and asyncpg would hand its answer to the
            # connection's next user. Never lend it on.
            if not conn.is_closed():
                conn.terminate()
            raise
        if probing:
            learn(key, status)
        try:
            try:
                yield conn
            except BaseException as e:
                if not conn.is_closed() and conn.is_in_transaction():
                    await conn.execute("ROLLBACK")
                raise_typed(e, asyncpg.PostgresError)
                raise
            if not conn.is_in_transaction():  # the block sent COMMIT or ROLLBACK itself
                raise ended_by_block()
            try:
                status = await conn.execute("COMMIT")
            except asyncpg.PostgresError as e:
                raise_typed(e, asyncpg.PostgresError)
                raise
            if status == "ROLLBACK":  # PostgreSQL's answer to COMMIT of an aborted transaction
                raise rolled_back()
        finally:
            if not conn.is_closed() and conn.is_in_transaction():
                conn.terminate()  # the transaction could not be ended: never lend it on


class Lease(LeaseBase):
    """A PostgreSQL lease on its own asyncpg connection (``dsn``), renewed by an asyncio task;
    ``async with Lease(dsn, name, ttl) as lease``."""

    def __init__(self, dsn, name, ttl, wait=0, renew_every=None):
        super().__init__(name, ttl, wait, renew_every)
        self.dsn = dsn
        self._conn = None
        self._task = None

    async def acquire(self):
        self._conn = await asyncpg.connect(self.dsn)
        try:
            sent = time.monotonic()
            self.token = check_token(await self._conn.fetchval(_ACQUIRE, self.name, self.ttl, self.wait))
            if self.wait:
                # Granted at some moment of the wait: ask how long it has left.
                sent = time.monotonic()
                self.valid_until = sent + float(await self._conn.fetchval(_REMAINING, self.token) or 0)
            else:
                self._confirmed(sent)
        except Exception as e:
            await self._conn.close()
            raise (from_error(e) or e)
        self._task = asyncio.get_running_loop().create_task(self._renew_loop())
        return self

    async def _renew_loop(self):
        while True:
            await asyncio.sleep(self.renew_every)
            try:
                sent = time.monotonic()
                # Bounded: a renewal stuck on a stalled connection must not outlive the TTL.
                await self._conn.fetchval(_RENEW, self.token, self.ttl, timeout=self.renew_every)
                self._confirmed(sent)
            except Exception as e:
                self._lose(e)
                return

    async def release(self):
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        try:
            if self.lost.is_set():
                return False
            return bool(await self._conn.fetchval(_RELEASE, self.token, timeout=self.renew_every))
        except Exception:
            return False
        finally:
            try:
                await self._conn.close(timeout=self.renew_every)
            except Exception:
                self._conn.terminate()

    async def __aenter__(self):
        return await self.acquire()

    async def __aexit__(self, *exc):
        await self.release()
        return False


async def run_with_lease(dsn, name, ttl, fn, wait=0):
    """``pg_fencing.psycopg.run_with_lease`` for asyncpg: ``await fn(conn)`` in a transaction
    fenced by the lease's token, the lease checked before the commit."""
    async with Lease(dsn, name, ttl, wait) as lease:
        conn = await asyncpg.connect(dsn)
        try:
            async with fenced(conn, lease.token):
                result = await fn(conn)
                lease.check()
            return result
        finally:
            await conn.close()
