"""Starting a fenced transaction on a DB-API connection an ORM manages (``pg_fencing.sqlalchemy``,
``pg_fencing.django``), after the ORM has begun its transaction and before any statement:

* psycopg 3: ``BEGIN`` and the token as one query through the connection's ``pgconn``; psycopg
  then sees the transaction open and sends no ``BEGIN`` of its own, and the ORM's commit or
  rollback ends it. No extra round trip.
* psycopg2 (and other drivers): the driver sends its own ``BEGIN`` with the first statement, so
  the token goes as ``set_config`` on its own: one statement more than the same transaction
  unfenced (psycopg2 has no way to send a query without its ``BEGIN``).
"""
from ._sql import check_token, learn, token_statement


def start(dbapi_conn, token):
    """Give the transaction the ORM just began on ``dbapi_conn`` the token ``token``."""
    token = check_token(token)
    if hasattr(dbapi_conn, "pgconn"):  # psycopg 3
        import psycopg

        from .psycopg import _begin

        if dbapi_conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise RuntimeError("fenced() starts its own transaction: the connection is in one")
        _begin(dbapi_conn, token)
        return
    status = getattr(dbapi_conn, "get_transaction_status", None)
    if status is not None and status() != 0:  # psycopg2: not TRANSACTION_STATUS_IDLE
        raise RuntimeError("fenced() starts its own transaction: the connection is in one")
    sql, probing = token_statement(dbapi_conn, token, getattr(dbapi_conn, "server_version", 0))
    cur = dbapi_conn.cursor()
    try:
        cur.execute(sql)
        tag = getattr(cur, "statusmessage", None)  # psycopg2's; other drivers ask every time
        if probing and tag is not None:
            learn(dbapi_conn, tag)
    finally:
        cur.close()


def idle(dbapi_conn):
    """Is ``dbapi_conn`` out of any transaction on the server (the block ended the fenced one with
    a ``COMMIT`` or ``ROLLBACK`` statement of its own)? libpq's status, which psycopg 3 and
    psycopg2 both report; ``False`` where the driver does not tell."""
    if hasattr(dbapi_conn, "pgconn"):  # psycopg 3
        import psycopg

        return dbapi_conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    status = getattr(dbapi_conn, "get_transaction_status", None)
    return status is not None and status() == 0  # psycopg2: TRANSACTION_STATUS_IDLE


def in_error(dbapi_conn):
    """Has a statement failed in the transaction on ``dbapi_conn`` (so that it can only roll
    back)?"""
    if hasattr(dbapi_conn, "pgconn"):  # psycopg 3
        import psycopg

        return dbapi_conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
    status = getattr(dbapi_conn, "get_transaction_status", None)
    return status is not None and status() == 3  # psycopg2: TRANSACTION_STATUS_INERROR
