"""pg_fencing with psycopg2: ``fenced(conn, token)`` and ``Lease``, as in ``pg_fencing.psycopg``.

    with fenced(conn, token) as cur:
        cur.execute("UPDATE ledger SET v = v + 1 WHERE id = %s", (1,))
"""
import contextlib

import psycopg2
import psycopg2.extensions as ext

from ._lease import ThreadLease
from ._sql import begin_fenced
from .errors import RolledBack, from_error


def _end(conn, own, command):
    """Send ``command`` (COMMIT or ROLLBACK) on the package's own cursor; a connection whose
    transaction cannot be ended is closed, never left in it (a pool then discards it)."""
    if conn.closed or conn.get_transaction_status() == ext.TRANSACTION_STATUS_IDLE:
        return
    try:
        own.execute(command)
    except psycopg2.Error:
        if not conn.closed and conn.get_transaction_status() != ext.TRANSACTION_STATUS_IDLE:
            conn.close()
        if command == "COMMIT":
            raise


@contextlib.contextmanager
def fenced(conn, token):
    """A transaction on ``conn`` (not in a transaction) fenced by ``token``; yields a cursor of
    its own (closing it in the block is fine: BEGIN, COMMIT and ROLLBACK go on another).
    ``BEGIN`` and the token go in one query, instead of psycopg2's own ``BEGIN``. ``RolledBack``
    if a statement failed inside (its error caught there) so that nothing could commit."""
    sql = begin_fenced(token)
    if conn.get_transaction_status() != ext.TRANSACTION_STATUS_IDLE:
        raise RuntimeError("fenced() starts its own transaction: the connection is in one")
    autocommit = conn.autocommit
    conn.autocommit = True
    own = conn.cursor()
    cur = conn.cursor()
    try:
        try:
            own.execute(sql)
            if conn.status != ext.STATUS_READY:
                # psycopg2 2.9 began a transaction of its own first: inside `with conn:` it does,
                # whatever autocommit says. Its transaction would outlive this block's COMMIT.
                conn.rollback()
                raise RuntimeError("fenced() cannot run inside psycopg2's `with conn:` block, which "
                                   "starts a transaction of its own; use fenced() instead of it")
            yield cur
        except BaseException as e:
            _end(conn, own, "ROLLBACK")
            if isinstance(e, psycopg2.Error):
                t = from_error(e)
                if t is not None:
                    raise t from e
            raise
        if conn.get_transaction_status() == ext.TRANSACTION_STATUS_INERROR:
            _end(conn, own, "ROLLBACK")
            raise RolledBack("the fenced transaction was rolled back: a statement in it failed "
                             "(its error was caught inside the block), so nothing was committed")
        try:
            _end(conn, own, "COMMIT")
        except psycopg2.Error as e:
            raise (from_error(e) or e) from e
    finally:
        for c in (cur, own):
            try:
                c.close()
            except psycopg2.Error:
                pass
        if not conn.closed:
            if conn.get_transaction_status() != ext.TRANSACTION_STATUS_IDLE:
                conn.close()  # the transaction could not be ended: never lend it on
            elif conn.status == ext.STATUS_READY:
                conn.autocommit = autocommit


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
