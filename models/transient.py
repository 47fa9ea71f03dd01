"""Which faults are worth trying again, and how long to wait before each try.

A fault is transient when the same call may succeed later without anyone changing
anything: the database dropped the connection, was restarting or held a lock too
long; the network or a server behind it failed for a moment. Everything else (bad
input, a bug in planning, a refused configuration) fails the same way every time,
so retrying it only delays the report.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from reverie.models.errors import StorePermanentError, TransientError

T = TypeVar("T")

# HTTP answers that mean "not now" rather than "no".
TRANSIENT_HTTP_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


def is_transient(exc: BaseException) -> bool:
    """True for a fault that may pass by itself (see the module docstring)."""
    import httpx
    from sqlalchemy import exc as db

    # The store's own errors say which they are (models.errors): its translation of
    # the driver's faults is the one answer, whatever the cause chain holds.
    if isinstance(exc, StorePermanentError):
        return False
    if isinstance(exc, TransientError | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, db.DBAPIError) and exc.connection_invalidated:
        return True
    # OperationalError: the server went away, refused the connection, or a lock wait
    # timed out ("database is locked" on SQLite); not a wrong statement.
    if isinstance(exc, db.OperationalError | db.InterfaceError | db.DisconnectionError
                  | db.TimeoutError):
        return True
    if isinstance(exc, httpx.TransportError):
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code in TRANSIENT_HTTP_STATUSES
    cause = exc.__cause__
    return cause is not None and cause is not exc and is_transient(cause)


# Jitter from a generator of its own: drawing from the global one would shift the
# sequence of an application (or a seeded test) that uses it, from whichever thread retries.
_jitter = random.Random()


def backoff(first: float, cap: float, attempts: int) -> Iterator[float]:
    """Delays before each retry: doubling from ``first`` up to ``cap``, each drawn at
    random from its upper half, so runs that failed together do not retry together."""
    delay = first
    for _ in range(attempts):
        yield _jitter.uniform(delay / 2, delay)
        delay = min(delay * 2, cap)


def retrying(
    call: Callable[[], T], attempts: int, first: float, cap: float,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
) -> T:
    """``call()``, tried again after a backoff while it fails transiently, at most
    ``attempts`` more times; the last failure, or any other, is raised."""
    delays = backoff(first, cap, attempts)
    tried = 0
    while True:
        try:
            return call()
        except Exception as exc:
            delay = next(delays, None) if is_transient(exc) else None
            if delay is None:
                raise
            tried += 1
            if on_retry is not None:
                on_retry(tried, exc, delay)
            time.sleep(delay)
