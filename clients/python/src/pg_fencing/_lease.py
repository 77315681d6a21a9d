"""The renewal loop of a PostgreSQL lease, shared by the drivers' ``Lease`` classes: renew every
third of the TTL on the lease's own connection; the first renewal that fails (``FT003``: the
lease ended; or the connection broke and the lease may have ended) marks the lease lost. A
lease also counts as lost once its TTL has passed since the last grant or renewal was sent
(``valid_until``, on the monotonic clock): a renewal stuck on a stalled connection cannot keep
it alive, and the server's own expiry is never earlier than that."""
import threading
import time

from ._sql import RELEASE, REMAINING, RENEW, check_token, seconds
from .errors import LeaseLost, from_error


class LeaseBase:
    """What every ``Lease`` has: ``name``, ``ttl`` (seconds), ``token`` once acquired, ``lost``
    (a ``threading.Event`` set when a renewal failed), ``error`` (why), ``check()``."""

    def __init__(self, name, ttl, wait=0, renew_every=None):
        if not isinstance(name, str) or not name:
            raise ValueError("a lease's name is a non-empty string")
        self.name = name
        self.ttl = seconds(ttl)
        self.wait = float(wait)
        self.renew_every = float(renew_every) if renew_every else self.ttl / 3
        if not 0 < self.renew_every < self.ttl:
            raise ValueError("renew_every must be positive and shorter than the ttl")
        self.token = None
        self.lost = threading.Event()
        self.error = None
        self.valid_until = 0.0  # time.monotonic() before which the lease cannot have expired

    def _confirmed(self, sent):
        """A grant or renewal sent at ``sent`` (monotonic) succeeded."""
        self.valid_until = max(self.valid_until, sent + self.ttl)

    def check(self):
        """Raise ``LeaseLost`` if the lease was lost, or may have expired because no renewal got
        through within its TTL (call it before each write; ``run_with_lease`` calls it before
        its fenced transaction commits)."""
        if not self.lost.is_set() and time.monotonic() >= self.valid_until:
            self.error = f"no renewal got through within its TTL ({self.ttl:g} s)"
            self.lost.set()
        if self.lost.is_set():
            raise LeaseLost(f"lease {self.name!r} (token {self.token}) was lost: {self.error}")

    def _lose(self, exc):
        typed = from_error(exc)
        self.error = typed.message if typed else f"renewal failed: {exc}"
        self.lost.set()


class ThreadLease(LeaseBase):
    """A lease renewed by a daemon thread; ``execute(sql, params)`` is the driver's one-row call
    on the lease's own connection (``_connect``/``_close`` open and close it)."""

    def _execute(self, sql, params):
        raise NotImplementedError

    def _connect(self):
        raise NotImplementedError

    def _close(self):
        raise NotImplementedError

    def acquire(self):
        from ._sql import ACQUIRE

        self._connect()
        try:
            sent = time.monotonic()
            self.token = check_token(self._execute(ACQUIRE, (self.name, self.ttl, self.wait)))
            if self.wait:
                # Granted at some moment of the wait: ask how long it has left.
                sent = time.monotonic()
                self.valid_until = sent + float(self._execute(REMAINING, (self.token,)) or 0)
            else:
                self._confirmed(sent)
        except Exception as e:
            self._close()
            raise from_error(e) or e
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name=f"lease {self.name}",
                                         daemon=True)
        self._thread.start()
        return self

    def _renew_loop(self):
        while not self._stop.wait(self.renew_every):
            try:
                sent = time.monotonic()
                self._execute(RENEW, (self.token, self.ttl))
                self._confirmed(sent)
            except Exception as e:  # the lease ended, or its connection broke
                self._lose(e)
                return

    def release(self):
        """Stop renewing and release the lease (``True`` if it was still held). A renewal stuck
        on a stalled connection is not waited for beyond one renewal period: then ``False``."""
        self._stop.set()
        self._thread.join(self.renew_every)
        if self._thread.is_alive():
            return False
        try:
            return bool(self._execute(RELEASE, (self.token,))) if not self.lost.is_set() else False
        except Exception:
            return False
        finally:
            self._close()

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False
