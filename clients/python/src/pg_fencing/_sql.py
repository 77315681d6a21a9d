"""The SQL the drivers' modules send, in one place."""
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


def set_token(token):
    """The statement that gives the current transaction the token: ``set_config(…, true)``
    (``SET LOCAL``: transaction-scoped). Not ``SET LOCAL pg_fencing.token = '…'``: PostgreSQL 15
    keeps the constants of utility statements in pg_stat_statements, one entry per token; a
    SELECT's constants are normalised on every version. The token is an int checked by
    ``check_token``, written as digits."""
    return "SELECT set_config('pg_fencing.token', '%d', true)" % check_token(token)


def begin_fenced(token):
    """One simple-protocol query: open the transaction and give it the token. Sent instead of
    the driver's own BEGIN, so a fenced transaction takes as many round trips as an unfenced
    one."""
    return f"BEGIN; {set_token(token)}"


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
