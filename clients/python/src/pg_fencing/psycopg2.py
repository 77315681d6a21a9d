"""pg_fencing with psycopg2: ``fenced(conn, token)`` and ``Lease``, as in ``pg_fencing.psycopg``.

    with fenced(conn, token) as cur:
        cur.execute("UPDATE ledger SET v = v + 1 WHERE id = %s", (1,))
"""
import psycopg2
import psycopg2.extensions as ext

from ._lease import ThreadLease
from ._sql import begin_fenced, exclusive, learn
from .errors import ended_by_block, raise_typed, rolled_back


class fenced:
    """``with fenced(conn, token) as cur:`` a transaction on ``conn`` (not in a transaction)
    fenced by ``token``; ``cur`` is a cursor of its own, closed when the block ends. ``BEGIN``
    and the token go in one query on it, instead of psycopg2's own ``BEGIN`` (the connection is
    in autocommit mode for the block, its own mode given back after), ``COMMIT`` when the block
    ends (on a new cursor if the block closed this one), ``ROLLBACK`` if it raises (an FT
    SQLSTATE as its typed error); ``RolledBack`` if a statement failed inside (its error caught
    there) so that nothing could commit; ``RuntimeError`` if the block ended the transaction
    itself (a ``COMMIT`` or ``ROLLBACK`` statement). A class rather than a generator: a fenced one-row
    transaction through psycopg2 is mostly the client's own work (BENCHMARKS.md, "Issue 46")."""

    __slots__ = ("_conn", "_sql", "_probing", "_autocommit", "_cur", "_hold")

    def __init__(self, conn, token):
        self._conn = conn
        self._sql, self._probing = begin_fenced(conn, token, conn.server_version)
        self._cur = None
        self._hold = None

    def __enter__(self):
        conn = self._conn
        if self._hold is not None:
            raise RuntimeError("fenced(): this block is already entered")
        hold = exclusive(conn)
        hold.__enter__()
        autocommit = None
        try:
            if conn.get_transaction_status() != ext.TRANSACTION_STATUS_IDLE:
                raise RuntimeError("fenced() starts its own transaction: the connection is in one")
            autocommit = conn.autocommit
            conn.autocommit = True
            cur = conn.cursor()
        except BaseException:
            if autocommit is not None and not conn.closed:
                conn.autocommit = autocommit
            hold.__exit__(None, None, None)
            raise
        self._hold, self._autocommit, self._cur = hold, autocommit, cur
        try:
            cur.execute(self._sql)
            if self._probing:
                learn(conn, cur.statusmessage)
            if conn.status != ext.STATUS_READY:
                # psycopg2 2.9 began a transaction of its own first: inside `with conn:` it does,
                # whatever autocommit says. Its transaction would outlive this block's COMMIT.
                conn.rollback()
                raise RuntimeError("fenced() cannot run inside psycopg2's `with conn:` block, which "
                                   "starts a transaction of its own; use fenced() instead of it")
        except BaseException as e:
            self._end("ROLLBACK")
            self._finish()
            raise_typed(e, psycopg2.Error)
            raise
        return cur

    def __exit__(self, exc_type, exc, tb):
        conn = self._conn
        try:
            if exc is not None:
                self._end("ROLLBACK")
                raise_typed(exc, psycopg2.Error)
                return False
            if conn.get_transaction_status() == ext.TRANSACTION_STATUS_INERROR:
                self._end("ROLLBACK")
                raise rolled_back()
            if conn.closed:
                raise psycopg2.InterfaceError("the connection was closed inside the fenced block: "
                                              "nothing of it was committed")
            if conn.get_transaction_status() == ext.TRANSACTION_STATUS_IDLE:
                raise ended_by_block()  # the block sent COMMIT or ROLLBACK itself
            try:
                self._end("COMMIT")
            except psycopg2.Error as e:
                raise_typed(e, psycopg2.Error)
                raise
            return False
        finally:
            self._finish()

    def _end(self, command):
        """Send ``command`` (COMMIT or ROLLBACK); a connection whose transaction cannot be ended is
        closed, never left in it (a pool then discards it)."""
        conn = self._conn
        if conn.closed or conn.get_transaction_status() == ext.TRANSACTION_STATUS_IDLE:
            return
        cur = self._cur
        try:
            if cur.closed:
                cur = self._cur = conn.cursor()
            cur.execute(command)
        except psycopg2.Error:
            if not conn.closed and conn.get_transaction_status() != ext.TRANSACTION_STATUS_IDLE:
                conn.close()
            if command == "COMMIT":
                raise

    def _finish(self):
        conn = self._conn
        try:
            self._cur.close()
        except psycopg2.Error:
            pass
        try:
            if not conn.closed:
                if conn.get_transaction_status() != ext.TRANSACTION_STATUS_IDLE:
                    conn.close()  # the transaction could not be ended: never lend it on
                elif conn.status == ext.STATUS_READY:
                    conn.autocommit = self._autocommit
        finally:
            hold, self._hold = self._hold, None
            hold.__exit__(None, None, None)


class Lease(ThreadLease):
    """``pg_fencing.psycopg.Lease`` on a psycopg2 connection to ``dsn``."""

    def __init__(self, dsn, name, ttl, wait=0, renew_every=None):
        super().__init__(name, ttl, wait, renew_every)
        self.dsn = dsn
        self._conn = None

    def _connect(self):
        self._conn = psycopg2.connect(self.dsn)
        self._conn.autocommit = True

    def _close(self):
        if self._conn is not None:
            self._conn.close()

    def _execute(self, sql, params):
        with self._conn.cursor() as cur:
            cur.execute(sql, params)
            row = cur.fetchone()
            return row[0] if row else None
