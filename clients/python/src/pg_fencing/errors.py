"""Typed errors for pg_fencing's SQLSTATEs, from any driver's exception (``from_error``).

``superseded`` is true where the token will never be accepted again (a newer holder exists, or
the lock or lease is gone): stop, do not retry with this token, and do not report the job as
failed (another holder owns it now). ``FT002``/``FT004``/``FT005`` are faults to fix or retry.
"""
import re

# The server's FT001 message is exactly "stale fencing token N for resource "<name>"" or
# "... for row <key> of table <table>", the name and key written as they are (not escaped):
# the resource is everything between the first and the last quote, the table what follows the
# last " of table ". The detail ends with "... is <mark>.".
_STALE = re.compile(
    r'\Astale fencing token (?P<token>\d+) for (?:resource "(?P<resource>.*)"'
    r"|row (?P<row>.*) of table (?P<table>.*))\Z",
    re.DOTALL,
)
_MARK = re.compile(r"high-water mark of .* is (?P<high_water>\d+)\.?\Z", re.DOTALL)


class FencingError(Exception):
    """A write or lock operation refused by pg_fencing (SQLSTATE class FT)."""

    sqlstate = "FT000"
    superseded = False

    def __init__(self, message, *, detail=None, hint=None, sqlstate=None, cause=None):
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.hint = hint
        if sqlstate:
            self.sqlstate = sqlstate
        self.cause = cause
        m = _STALE.search(message or "")
        self.token = int(m.group("token")) if m else None
        self.resource = m.group("resource") if m and m.group("resource") is not None else None
        self.row = m.group("row") if m and m.group("row") else None
        self.table = m.group("table") if m and m.group("table") else None
        h = _MARK.search(detail or "")
        self.high_water = int(h.group("high_water")) if h else None


class StaleToken(FencingError):
    """FT001: the token is below the high-water mark of the resource or row (``resource``,
    ``row``/``table``, ``token``, ``high_water``)."""

    sqlstate = "FT001"
    superseded = True


class NoToken(FencingError):
    """FT002: a write to a protected table without a token that counts."""

    sqlstate = "FT002"


class LeaseLost(FencingError):
    """FT003: the token's lock or lease was lost (expired, released, revoked, taken over); also
    raised by ``Lease.check()`` when the background renewal failed."""

    sqlstate = "FT003"
    superseded = True


class ProtectionInactive(FencingError):
    """FT004: the table's protection cannot hold right now; writes are refused until it is
    repaired (the detail says why)."""

    sqlstate = "FT004"


class LockServiceUnavailable(FencingError):
    """FT005: the lock service (etcd) is unreachable or went backwards; retry later."""

    sqlstate = "FT005"


class RolledBack(Exception):
    """The fenced transaction could not commit: a statement in it failed (and the error was
    caught inside the block), so PostgreSQL had aborted it; it was rolled back, nothing of it
    was committed. ``cause`` is the typed error of the failure if the driver kept it."""


class EndedInBlock(RuntimeError):
    """The fenced block ended the fenced transaction itself (a ``COMMIT`` or ``ROLLBACK``
    statement, or the driver's ``commit()``/``rollback()``, inside it): whether its writes
    committed is not known to the helper, so it never reports success. A ``RuntimeError``, like
    the package's other misuses (a ``fenced`` on a connection already in a transaction)."""


class NotCurrentHolder(FencingError):
    """FT006: verify mode: the token is not the current holder's."""

    sqlstate = "FT006"
    superseded = True


_BY_STATE = {c.sqlstate: c for c in (StaleToken, NoToken, LeaseLost, ProtectionInactive,
                                     LockServiceUnavailable, NotCurrentHolder)}


def _fields(exc):
    """(sqlstate, message, detail, hint) of a psycopg 3, psycopg2 or asyncpg exception."""
    state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    diag = getattr(exc, "diag", None)
    if diag is not None:  # psycopg 3, psycopg2
        return (state or getattr(diag, "sqlstate", None), diag.message_primary or str(exc),
                diag.message_detail, diag.message_hint)
    return (state, getattr(exc, "message", None) or str(exc), getattr(exc, "detail", None),
            getattr(exc, "hint", None))


def from_error(exc):
    """The typed error for a driver's exception with an FT SQLSTATE (``None`` otherwise); also
    for one an ORM wrapped it in (SQLAlchemy's ``DBAPIError.orig``, Django's ``__cause__``)."""
    seen = 0
    while exc is not None and seen < 4:
        if isinstance(exc, FencingError):
            return exc
        state, message, detail, hint = _fields(exc)
        if state and state.startswith("FT"):
            cls = _BY_STATE.get(state, FencingError)
            return cls(message, detail=detail, hint=hint, sqlstate=state, cause=exc)
        exc = getattr(exc, "orig", None) or exc.__cause__
        seen += 1
    return None


def raise_typed(exc, driver_error):
    """In an ``except`` block: raises the typed error of ``exc`` (from it) when ``exc`` is a
    ``driver_error`` (the driver's or ORM's exception class) with an FT SQLSTATE, and returns
    otherwise, for the block's own ``raise``. The one place the packages turn a refusal into its
    typed error on the way out of a fenced block."""
    if isinstance(exc, driver_error):
        typed = from_error(exc)
        if typed is not None and typed is not exc:
            raise typed from exc


def ended_by_block():
    """The ``EndedInBlock`` of a fenced block that ended the fenced transaction itself. The
    helper's own ``COMMIT`` would then find no transaction (PostgreSQL answers with a warning, not
    an error)."""
    return EndedInBlock("fenced(): the block ended the fenced transaction itself (a COMMIT or ROLLBACK "
                        "inside it), so whether its writes committed is unknown; end nothing inside "
                        "the block (raise to roll back)")


def rolled_back():
    """The ``RolledBack`` of a fenced transaction whose failed statement's error was caught inside
    the block (PostgreSQL had aborted it)."""
    return RolledBack("the fenced transaction was rolled back: a statement in it failed (its error "
                      "was caught inside the block), so nothing was committed")
