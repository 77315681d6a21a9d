"""The SQL the drivers' modules send, in one place."""
import threading
import weakref
from datetime import timedelta

MAX_TOKEN = 2**63 - 1


def check_token(token):
    """The token as an int: a positive bigint (``TypeError`` for anything but an int,
    ``ValueError`` out of range). Tokens are never interpolated from text: only this int is."""
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"a fencing token is an int, not {type(token).__name__}")
    # The plain int's value: an int subclass's own __str__, __format__ or comparisons never run.
    value = int.__index__(token)
    if not 0 < value <= MAX_TOKEN:
        raise ValueError(f"fencing token {value} is out of range (1 .. {MAX_TOKEN})")
    return value


# May a connection's token go as ``SET LOCAL pg_fencing.token = '…'``? Learnt per connection
# object (``begin_fenced``/``learn``), forgotten with it.
_set_local = weakref.WeakKeyDictionary()

# On PostgreSQL 15 and earlier, the probe's second row says that pg_stat_statements is not loaded
# (its settings exist only where it is preloaded, and preloading needs a restart, which ends the
# connection): then SET LOCAL leaves no entry per token either.
_PROBE = " UNION ALL SELECT NULL WHERE pg_catalog.current_setting('pg_stat_statements.max', true) IS NULL"


def set_token(token, set_local=False):
    """The statement that gives the current transaction the token, transaction-scoped:
    ``SET LOCAL pg_fencing.token = '…'`` where ``set_local``, else ``SELECT
    pg_catalog.set_config('pg_fencing.token', '…', true)``. The ``SELECT`` costs the server a plan and the
    client a row (3-6 % of a one-row transaction, BENCHMARKS.md "Issue 46"), but PostgreSQL 15
    keeps the constants of utility statements in pg_stat_statements, one entry per token; a
    SELECT's are normalised on every version, a SET's from PostgreSQL 16 on. The token is an int
    checked by ``check_token``, written as digits."""
    t = check_token(token)
    if set_local:
        return "SET LOCAL pg_fencing.token = '%d'" % t
    # pg_catalog's, whatever the session's search_path puts before it.
    return "SELECT pg_catalog.set_config('pg_fencing.token', '%d', true)" % t


def token_statement(conn, token, server_version):
    """The statement that gives ``conn``'s transaction the token, and whether its command tag must
    go to ``learn``: ``SET LOCAL`` where the server (``server_version``, as in
    ``server_version_num``) is PostgreSQL 16 or later or ``conn`` was learnt to have no
    pg_stat_statements; the first on a connection to an older server asks, in the same
    statement, with the ``set_config`` form; after that the answer holds for the connection."""
    if server_version >= 160000:
        return set_token(token, True), False
    try:
        known = _set_local.get(conn)
    except TypeError:  # a connection object that cannot be weakly referenced: asked every time
        known = None
    if known is not None:
        return set_token(token, known), False
    return set_token(token) + _PROBE, True


def begin_fenced(conn, token, server_version):
    """One simple-protocol query that opens the transaction and gives it the token
    (``token_statement``), sent instead of the driver's own BEGIN, so a fenced transaction takes
    as many round trips as an unfenced one; and whether its command tag must go to ``learn``."""
    sql, probing = token_statement(conn, token, server_version)
    return "BEGIN; " + sql, probing


def learn(conn, command_tag):
    """Remember the answer of ``begin_fenced``'s probe, the command tag of its query's last
    statement (``SELECT 2``: no pg_stat_statements, ``SET LOCAL`` from now on)."""
    tag = command_tag.decode() if isinstance(command_tag, bytes) else command_tag
    try:
        _set_local[conn] = tag == "SELECT 2"
    except TypeError:
        pass


# Connections with a fenced transaction in progress, by id() (a block holds its connection, so
# the id cannot be reused while it is here): a second `fenced` on one of them (another thread or
# task sharing the connection) would replace the first one's token inside its transaction, so
# that the first one's writes went out with the second one's token.
_busy = set()
_busy_lock = threading.Lock()


class exclusive:
    """``with exclusive(conn):`` holds ``conn`` for one fenced transaction; ``RuntimeError`` if
    another block holds it. A class, not a generator: it runs on every fenced transaction."""

    __slots__ = ("_key",)

    def __init__(self, conn):
        self._key = id(conn)

    def __enter__(self):
        with _busy_lock:
            if self._key in _busy:
                raise RuntimeError("fenced(): the connection already runs a fenced transaction (shared "
                                   "between threads or tasks?); one transaction at a time per connection")
            _busy.add(self._key)
        return self

    def __exit__(self, *exc):
        _busy.discard(self._key)
        return False


def seconds(ttl):
    """A TTL as float seconds (a number of seconds or a ``timedelta``; positive)."""
    s = ttl.total_seconds() if isinstance(ttl, timedelta) else float(ttl)
    if not s > 0:
        raise ValueError(f"a lease's ttl must be positive, not {ttl!r}")
    return s


ACQUIRE = "SELECT fencing_lease_acquire(%s, make_interval(secs => %s), make_interval(secs => %s))"
RENEW = "SELECT fencing_lease_renew(%s, make_interval(secs => %s))"
RELEASE = "SELECT fencing_lease_release(%s)"
# Seconds the lease holding a token still has, on the database clock (after a grant that waited).
REMAINING = ("SELECT extract(epoch FROM expires_at OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp())::float8 "
             "FROM fencing_leases WHERE token = %s")
