"""pg-fencing: fencing tokens enforced by PostgreSQL (the pg_fencing extension).

A client that holds a lock (a PostgreSQL lease, an etcd lock, …) writes in a transaction that
carries the lock's fencing token; PostgreSQL refuses the write when a newer holder has written
(docs/clients.md of the extension). This package makes that one call per driver:

* ``pg_fencing.psycopg`` (psycopg 3, sync and async), ``pg_fencing.psycopg2``,
  ``pg_fencing.asyncpg``: ``fenced(conn, token)`` opens a transaction whose token is sent with its
  ``BEGIN`` (no extra round trip) and is transaction-scoped (never seen by the next user of a
  pooled connection); ``Lease`` takes a PostgreSQL lease and renews it in the background on its
  own connection; ``run_with_lease`` does all of it around one function.
* ``pg_fencing.sqlalchemy`` (``fenced(connection_or_session, token)``) and
  ``pg_fencing.django`` (``fenced(token, using=None)``, an outermost ``atomic()`` with the
  token): with psycopg 3 underneath, the token goes with the ORM's ``BEGIN`` too.
* typed errors (``StaleToken`` FT001 … ``NotCurrentHolder`` FT006), raised from the driver's
  errors (also as SQLAlchemy or Django wrapped them), with the resource or row and the numbers
  from the server's message; ``RolledBack`` when the block caught a failed statement's error and
  the transaction could therefore not commit; ``EndedInBlock`` (a ``RuntimeError``) when the block
  ended the transaction itself.
"""
from .errors import (
    EndedInBlock,
    FencingError,
    LeaseLost,
    LockServiceUnavailable,
    NoToken,
    NotCurrentHolder,
    ProtectionInactive,
    RolledBack,
    StaleToken,
    from_error,
)
from ._sql import check_token

__all__ = [
    "FencingError",
    "StaleToken",
    "NoToken",
    "LeaseLost",
    "ProtectionInactive",
    "LockServiceUnavailable",
    "NotCurrentHolder",
    "RolledBack",
    "EndedInBlock",
    "from_error",
    "check_token",
]
__version__ = "0.1.0"
