"""pg_fencing with SQLAlchemy 2 (a ``Connection`` or an ORM ``Session``), on the psycopg 3 or
psycopg2 dialect.

    from pg_fencing.sqlalchemy import fenced

    with Session(engine) as session, fenced(session, token):
        session.execute(update(Ledger).where(Ledger.id == 1).values(v=Ledger.v + 1))

``fenced`` begins the transaction, gives it the token (with psycopg 3 in the same query as its
``BEGIN``: no extra round trip; with psycopg2 as one more statement), commits when the block ends
and rolls back if it raises. Errors with a pg_fencing SQLSTATE are raised as ``pg_fencing``
errors (``StaleToken`` …) from SQLAlchemy's ``DBAPIError``.
"""
import contextlib

import sqlalchemy.exc
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from . import _dbapi
from ._sql import check_token
from .errors import ended_by_block, raise_typed, rolled_back


@contextlib.contextmanager
def fenced(conn, token):
    """A transaction on ``conn`` (a ``Connection`` or ``Session`` not in a transaction) fenced
    by ``token``; yields ``conn``. ``RolledBack`` if a failed statement's error was caught in the
    block, ``RuntimeError`` if the block ended the transaction itself (a ``COMMIT`` or
    ``ROLLBACK`` statement)."""
    check_token(token)
    if not isinstance(conn, (Connection, Session)):
        raise TypeError(f"fenced() takes a SQLAlchemy Connection or Session, not {type(conn).__name__}")
    if conn.in_transaction():
        raise RuntimeError("fenced() starts its own transaction: the connection is in one")
    try:
        with conn.begin():
            c = conn.connection() if isinstance(conn, Session) else conn
            dbapi = c.connection.dbapi_connection
            _dbapi.start(dbapi, token)
            yield conn
            if _dbapi.in_error(dbapi):  # a failed statement's error was caught in the block
                raise rolled_back()
            if _dbapi.idle(dbapi):  # the block sent COMMIT or ROLLBACK itself
                raise ended_by_block()
    except sqlalchemy.exc.DBAPIError as e:
        raise_typed(e, sqlalchemy.exc.DBAPIError)
        raise
