"""pg_fencing with psycopg 3 (sync and async).

    from pg_fencing.psycopg import fenced, Lease, run_with_lease

    with Lease(conninfo, "settlement", ttl=30) as lease:
        with psycopg.connect(conninfo) as conn, fenced(conn, lease.token):
            lease.check()
            conn.execute("UPDATE ledger SET v = v + 1 WHERE id = %s", (1,))

``fenced`` sends ``BEGIN`` and the token in one query (instead of psycopg's own ``BEGIN``), so the
transaction takes the round trips of an unfenced one; the token is transaction-scoped
(``SET LOCAL``), so the next user of a pooled connection never carries it. Errors with a
pg_fencing SQLSTATE are raised as ``pg_fencing`` errors (``StaleToken`` …), the driver's error as
their ``__cause__``.
"""
import contextlib

import psycopg

from ._lease import ThreadLease
from ._sql import begin_fenced, check_token, exclusive, learn
from .errors import ended_by_block, raise_typed, rolled_back


def _begin(conn, token):
    """``BEGIN`` and the token as one simple query on the connection's ``pgconn`` (psycopg's
    documented low-level interface): psycopg then sees the transaction open and sends no
    ``BEGIN`` of its own, in autocommit mode or not, and ``commit()``/``rollback()`` end it.
    (``conn.execute`` would cost a cursor and, outside autocommit mode, a ``BEGIN`` of psycopg's
    first.) Neither statement waits for anything on the server."""
    sql, probing = begin_fenced(conn, token, conn.info.server_version)
    with conn.lock:  # psycopg's own lock around the connection's libpq calls
        res = conn.pgconn.exec_(sql.encode())
    if res.status not in (psycopg.pq.ExecStatus.TUPLES_OK, psycopg.pq.ExecStatus.COMMAND_OK):
        why = (res.error_message or conn.pgconn.error_message or b"").decode(errors="replace").strip()
        if conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.pgconn.exec_(b"ROLLBACK")
        raise psycopg.OperationalError(f"could not start the fenced transaction: {why}")
    if probing:
        learn(conn, res.command_status)


def _close_if_in_transaction(conn):
    """A connection whose transaction could not be ended is closed, never lent on."""
    if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.close()


@contextlib.contextmanager
def fenced(conn, token):
    """A transaction on ``conn`` (idle, not in a transaction) fenced by ``token``: committed when
    the block ends, rolled back if it raises (``RolledBack`` if a statement failed inside and its
    error was caught there; ``RuntimeError`` if the block ended the transaction itself with a
    ``COMMIT`` or ``ROLLBACK``). The connection's autocommit setting is not touched."""
    check_token(token)
    with exclusive(conn):
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise RuntimeError("fenced() starts its own transaction: the connection is in one")
        _begin(conn, token)
        try:
            try:
                yield conn
            except BaseException as e:
                if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.rollback()
                raise_typed(e, psycopg.Error)
                raise
            if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                conn.rollback()
                raise rolled_back()
            if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                raise ended_by_block()  # commit() would do nothing and report success
            try:
                conn.commit()
            except psycopg.Error as e:
                raise_typed(e, psycopg.Error)
                raise
        finally:
            _close_if_in_transaction(conn)


@contextlib.asynccontextmanager
async def afenced(aconn, token):
    """``fenced`` for an ``AsyncConnection``."""
    sql, probing = begin_fenced(aconn, token, aconn.info.server_version)
    with exclusive(aconn):
        if aconn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise RuntimeError("afenced() starts its own transaction: the connection is in one")
        autocommit = aconn.autocommit
        await aconn.set_autocommit(True)
        try:
            try:
                cur = await aconn.execute(sql)
                if probing:
                    while cur.nextset():  # the answer is the last statement's
                        pass
                    learn(aconn, cur.statusmessage)
                yield aconn
            except BaseException as e:
                if not aconn.closed and aconn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    await aconn.execute("ROLLBACK")
                raise_typed(e, psycopg.Error)
                raise
            if aconn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                await aconn.execute("ROLLBACK")
                raise rolled_back()
            if aconn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                raise ended_by_block()  # COMMIT would answer with a warning only
            try:
                await aconn.execute("COMMIT")
            except psycopg.Error as e:
                raise_typed(e, psycopg.Error)
                raise
        finally:
            if not aconn.closed and aconn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                await aconn.close()  # the transaction could not be ended: never lend it on
            elif not aconn.closed:
                await aconn.set_autocommit(autocommit)


class Lease(ThreadLease):
    """A PostgreSQL lease (``fencing_lease_acquire``) on its own psycopg 3 connection to
    ``conninfo``, renewed every third of ``ttl`` (seconds or a timedelta) by a background thread
    until released; ``token`` is its fencing token, ``lost`` an Event set when a renewal failed,
    ``check()`` raises ``LeaseLost`` then. ``wait``: seconds to wait for a held lease
    (``55P03`` after it)."""

    def __init__(self, conninfo, name, ttl, wait=0, renew_every=None):
        super().__init__(name, ttl, wait, renew_every)
        self.conninfo = conninfo
        self._conn = None

    def _connect(self):
        self._conn = psycopg.connect(self.conninfo, autocommit=True)

    def _close(self):
        if self._conn is not None:
            self._conn.close()

    def _execute(self, sql, params):
        row = self._conn.execute(sql, params).fetchone()
        return row[0] if row else None

    @property
    def backend_pid(self):
        """The process id of the lease's own connection on the server."""
        return self._conn.info.backend_pid


def run_with_lease(conninfo, name, ttl, fn, wait=0):
    """Take lease ``name``, run ``fn(conn)`` in a transaction fenced by its token on a new
    connection while the lease is renewed, check the lease before committing, release it; returns
    what ``fn`` returns. ``LeaseLost`` if the lease was lost (nothing committed), ``StaleToken``
    if a newer holder wrote."""
    with Lease(conninfo, name, ttl, wait) as lease:
        with psycopg.connect(conninfo) as conn:
            with fenced(conn, lease.token):
                result = fn(conn)
                lease.check()
            return result
