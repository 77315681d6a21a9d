"""pg_fencing with Django (the ``postgresql`` backend on psycopg 3 or psycopg2).

    from pg_fencing.django import fenced

    with fenced(token):
        Ledger.objects.filter(id=1).update(v=F("v") + 1)

``fenced(token, using=None)`` is ``transaction.atomic()`` whose transaction carries the token
(with psycopg 3 sent with its ``BEGIN``: no extra round trip; with psycopg2 as one more
statement). It must be the outermost atomic block; savepoints (nested ``atomic()``) inside it
work as usual. Errors with a pg_fencing SQLSTATE are raised as ``pg_fencing`` errors
(``StaleToken`` …) from Django's ``DatabaseError``.
"""
import contextlib

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

from . import _dbapi
from ._sql import check_token
from .errors import ended_by_block, raise_typed, rolled_back


@contextlib.contextmanager
def fenced(token, using=None):
    """``transaction.atomic(using=using)`` fenced by ``token``; yields Django's connection.
    ``RolledBack`` if a failed statement's error was caught in the block, ``RuntimeError`` if the
    block ended the transaction itself (a ``COMMIT`` or ``ROLLBACK`` statement)."""
    check_token(token)
    alias = using or DEFAULT_DB_ALIAS
    conn = connections[alias]
    if conn.in_atomic_block:
        raise RuntimeError("fenced() starts its own transaction: it cannot run inside atomic()")
    if not conn.get_autocommit():
        # With autocommit off, atomic() is only a savepoint and nothing ends the transaction.
        raise RuntimeError("fenced() needs Django's autocommit on (transaction.set_autocommit(False) "
                           "leaves the transaction, and its token, open after the block)")
    try:
        with transaction.atomic(using=alias):
            conn.ensure_connection()
            _dbapi.start(conn.connection, token)
            yield conn
            # A failed statement's error caught in the block: Django would roll back quietly.
            if conn.needs_rollback or _dbapi.in_error(conn.connection):
                raise rolled_back()
            if _dbapi.idle(conn.connection):  # the block sent COMMIT or ROLLBACK itself
                raise ended_by_block()
    except DatabaseError as e:
        raise_typed(e, DatabaseError)
        raise
