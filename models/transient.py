"""Which faults are worth trying again, and the one way Reverie tries again.

A fault is transient when the same call may succeed later without anyone changing
anything: the database dropped the connection, was restarting or held a lock too
long; the network or a server behind it failed for a moment. Everything else (bad
input, a bug in planning, a refused configuration) fails the same way every time,
so retrying it only delays the report. ``is_transient`` is the one answer; every
retry loop (the store's, the LLM client's, the command line's) asks it, through
``retrying``, which leaves the attempts, the back-off and its testing mode to stamina.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy import exc as db

from reverie.models.errors import StorePermanentError, TransientError

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from stamina.instrumentation import RetryDetails, RetryHook

T = TypeVar("T")

# HTTP answers that mean "not now" rather than "no".
TRANSIENT_HTTP_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})

# The driver's errors that mean "not now": lost connections, lock waits ("database is
# locked"), serialization failures and deadlocks (PostgreSQL's TransactionRollbackError
# is an OperationalError), a pool that had no connection to give. ``models.db`` turns
# them into ``StoreUnavailableError``; nothing else may list them.
TRANSIENT_DB_ERRORS: tuple[type[Exception], ...] = (
    db.OperationalError, db.InterfaceError, db.DisconnectionError, db.TimeoutError,
)

# Told (attempt number from 1, the error, the seconds until the next attempt) before
# each wait.
OnRetry = Callable[[int, BaseException, float], None]


def is_transient(exc: BaseException) -> bool:
    """True for a fault that may pass by itself (see the module docstring)."""
    import httpx

    # The store's own errors say which they are (models.errors): its translation of
    # the driver's faults is the one answer, whatever the cause chain holds.
    if isinstance(exc, StorePermanentError):
        return False
    if isinstance(exc, TransientError | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, db.DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, TRANSIENT_DB_ERRORS):
        return True
    if isinstance(exc, httpx.TransportError):
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code in TRANSIENT_HTTP_STATUSES
    cause = exc.__cause__
    return cause is not None and cause is not exc and is_transient(cause)


def retry_wait(exc: BaseException, cap: float) -> bool | float:
    """What stamina is told about a failure: not retried (False), retried after the
    usual back-off (True), or after the wait the fault itself asks for (a server's
    ``Retry-After``, ``TransientError.retry_after``), up to ``cap``."""
    if not is_transient(exc):
        return False
    asked = getattr(exc, "retry_after", None)
    return min(asked, cap) if asked else True


def retrying(
    call: Callable[[], T], attempts: int | None, first: float, cap: float,
    on_retry: OnRetry | None = None, timeout: float | None = None,
) -> T:
    """``call()``, tried again while it fails transiently, at most ``attempts`` more
    times (None: no limit) and, if ``timeout`` is given, no more once that many seconds
    have passed; the last failure, or any other, is raised. The waits double from
    ``first / 2`` up to ``cap``, each with up to ``first / 2`` of random jitter (the
    n-th lies between ``first * 2**(n-2)`` and that plus ``first / 2``), so runs that
    failed together do not retry together; a fault may ask for its own wait
    (``retry_wait``). Under ``stamina.set_testing`` nothing waits."""
    # The first try outside stamina: it succeeds almost always, and setting up stamina's
    # loop costs about 45 us, a tenth of a small profile's step, paid per profile and step.
    try:
        return call()
    except Exception as exc:
        if attempts == 0 or not is_transient(exc):
            raise
        failed: Exception | None = exc
    # Imported here: stamina (and tenacity) cost 80 ms at a command's start.
    import stamina

    _install_announcer()
    token = _announce.set(on_retry or _silent)
    try:
        for attempt in stamina.retry_context(
            on=lambda exc: retry_wait(exc, cap),
            attempts=None if attempts is None else attempts + 1, timeout=timeout,
            wait_initial=first / 2, wait_max=cap, wait_jitter=first / 2,
        ):
            with attempt:
                if failed is not None:  # stamina's first attempt is the one above
                    first_failure, failed = failed, None
                    raise first_failure
                return call()
    finally:
        _announce.reset(token)
    raise AssertionError("unreachable")  # pragma: no cover - stamina raises or returns


def _silent(_attempt: int, _exc: BaseException, _wait: float) -> None:
    return None


# stamina tells its retries to process-wide hooks (by default a warning through the
# "stamina" logger); each of our loops says what it wants said, so a hook hands the
# retry to the ``on_retry`` of the loop running it, and leaves the defaults to others.
_announce: ContextVar[OnRetry | None] = ContextVar("reverie_on_retry", default=None)
_installed = threading.Lock()
_announcing = False


def _install_announcer() -> None:
    global _announcing
    if _announcing:
        return
    with _installed:
        if _announcing:
            return
        from stamina.instrumentation import get_on_retry_hooks, set_on_retry_hooks

        others = get_on_retry_hooks()
        set_on_retry_hooks([_announce_retry, *(_unless_ours(h) for h in others)])
        _announcing = True


def _announce_retry(details: RetryDetails) -> None:
    announce = _announce.get()
    if announce is not None:
        announce(details.retry_num, details.caused_by, details.wait_for)


def _unless_ours(hook: RetryHook) -> RetryHook:
    def maybe(details: RetryDetails) -> AbstractContextManager[None] | None:
        return None if _announce.get() is not None else hook(details)

    return maybe
