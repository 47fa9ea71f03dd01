"""Sending the store's Prefect events: the one place Reverie talks to Prefect's event
API. The store queues events in its outbox (``models.outbox``) in the transaction that
caused them; whoever made that change (an ingest, a session end) calls ``deliver``
after the commit.

``flush`` sends what is pending, oldest first, directly and without reconnect attempts,
from a short-lived thread with a deadline, and deletes what the API confirmed; see
``models.outbox`` for how two senders keep out of each other's way. A failed send is a
warning, never an error of the change that queued the events: they wait for the next
flush.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import tomllib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC
from enum import StrEnum
from pathlib import Path

from reverie.models import outbox
from reverie.models.events import ProfileEvent, related, resource
from reverie.models.repositories.runs import end_session as count_end
from reverie.models.settings import get_settings
from reverie.models.store import Store
from reverie.models.timestamps import utcnow

log = logging.getLogger(__name__)

SEND_DEADLINE_SECONDS = 5.0
_SEND_THREAD = "reverie-events-send"


class Outcome(StrEnum):
    DELIVERED = "delivered"  # nothing is pending any more
    UNREACHABLE = "unreachable"  # the API did not take the events: they stay for later
    BUSY = "busy"  # another process is sending; it takes what is pending before it stops
    INCOMPLETE = "incomplete"  # sends went through, but time ran out with events left
    NO_API = "no-api"  # no Prefect API is configured to send them to


@dataclass(frozen=True, slots=True)
class FlushResult:
    outcome: Outcome
    sent: int
    pending: int  # events left in the outbox afterwards (others may be adding)
    error: str | None = None  # why the API did not take them (no event content)


def api_url() -> str | None:
    """The Prefect server to send events to; None for an ephemeral API (which would start
    a server for a second and lose the events with it)."""
    # Once Prefect is imported, a settings context (temporary_settings, a test harness)
    # may hold a URL no file or variable names: then only Prefect knows.
    if "prefect" not in sys.modules and not _api_url_may_be_set():
        return None
    from prefect.settings import get_current_settings

    return get_current_settings().api.url


def _api_url_may_be_set() -> bool:
    """Whether any source Prefect 3 reads its settings from could name an API URL: a
    ``PREFECT_API...`` environment variable, ``.env``, ``prefect.toml`` or
    ``pyproject.toml``'s ``[tool.prefect]`` in the working folder, or a profiles file
    (``PREFECT_PROFILES_PATH``, else ``$PREFECT_HOME/profiles.toml``, else
    ``~/.prefect/profiles.toml``; without one Prefect's bundled default profile is
    ephemeral). When none can, the URL is None without importing Prefect: half a second
    of ``reverie status`` or ``reverie ingest`` on a machine with no Prefect server.
    When one can, Prefect itself decides."""
    if any(name.upper().startswith("PREFECT_API") for name in os.environ):
        return True
    here = Path.cwd()
    if (here / ".env").exists() or (here / "prefect.toml").exists():
        return True
    pyproject = here / "pyproject.toml"
    if pyproject.exists():
        try:
            tables = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return True  # Prefect reads it its own way: let it
        if "prefect" in tables.get("tool", {}):
            return True
    # Read as Prefect reads them (os.getenv: exact names, empty is unset).
    if profiles := os.environ.get("PREFECT_PROFILES_PATH"):
        return Path(profiles).exists()
    if home := os.environ.get("PREFECT_HOME"):
        return (Path(home) / "profiles.toml").exists()
    return (Path.home() / ".prefect" / "profiles.toml").exists()


def api_configured() -> bool:
    return bool(api_url())


def wanted() -> bool:
    """Whether the store should keep events at all: without an API nobody would ever
    send them, and a local-only store's outbox would grow forever."""
    # The shared local server a process pointed itself at records runs; nothing there
    # acts on events.
    return get_settings().emit_events and api_configured() and not pointed_by_us()


# The API address this process set for itself: the shared local server
# (``deployments.local_server``). A long-lived process (``reverie api``, ``reverie mcp``)
# must tell it apart from an operator's API, which has the deployments and automations.
_POINTED: list[str] = []


def pointed_at(url: str) -> None:
    _POINTED[:] = [url]


def pointed_by_us() -> bool:
    """Whether this process's Prefect API is the local server it pointed itself at."""
    return bool(_POINTED) and os.environ.get("PREFECT_API_URL") == _POINTED[0]


def send(events: Sequence[ProfileEvent], url: str) -> BaseException | None:
    """Deliver the events, in order, to the Prefect API at ``url``; what went wrong, or
    None once the server has confirmed receiving every one of them. Waits at most
    SEND_DEADLINE_SECONDS, and never raises."""
    if not events:
        return None
    outcome: list[BaseException | None] = []
    _quiet_prefect_client()
    # Prefect's settings context does not follow into a new thread: the URL is passed.
    thread = threading.Thread(target=lambda: outcome.append(_send(events, url)),
                              name=_SEND_THREAD, daemon=True)
    thread.start()
    # The send cancels itself at the deadline; the margin lets it say so.
    thread.join(SEND_DEADLINE_SECONDS + 1.0)
    return outcome[0] if outcome else TimeoutError("no answer in time")


class _FromOtherThreads(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != _SEND_THREAD


def _quiet_prefect_client() -> None:
    """Our caller warns once about a failed send (the events wait in the store); Prefect's
    client would add its own warning, saying the events may be lost."""
    client_log = logging.getLogger("prefect.events.clients")
    if not any(isinstance(f, _FromOtherThreads) for f in client_log.filters):
        client_log.addFilter(_FromOtherThreads())


def _send(events: Sequence[ProfileEvent], url: str) -> BaseException | None:
    """The one place events leave the process (tests replace it to watch them go)."""
    from prefect.events import Event
    from prefect.events.clients import PrefectEventsClient

    async def send() -> None:
        # A checkpoint after the last event: the client then waits for the server's pong,
        # which follows every event on the socket, so a return means they arrived.
        async with PrefectEventsClient(
            api_url=url, reconnection_attempts=0, checkpoint_every=len(events)
        ) as client:
            for e in events:
                await client.emit(Event(
                    id=e.id, event=e.name, resource=resource(e.profile, e.store),
                    related=related(e.store), payload=e.payload,
                    occurred=e.at.replace(tzinfo=UTC),
                ))

    try:
        asyncio.run(asyncio.wait_for(send(), SEND_DEADLINE_SECONDS))
    except BaseException as exc:  # noqa: BLE001 - reported to the caller
        return exc
    return None


def flush(
    store_url: str, budget: float = SEND_DEADLINE_SECONDS, api: str | None = None
) -> FlushResult:
    """Send the store's pending events to the Prefect API (``api``, default the
    configured one), oldest first, for at most about ``budget`` seconds plus one send's
    deadline. Stops at the first send the API does not confirm, with one warning; never
    raises for the API (the store's own errors do raise)."""
    url = api or api_url()
    with Store(store_url).reading_all() as s:
        left = outbox.count(s)
    if not left:
        return FlushResult(Outcome.DELIVERED, 0, 0)
    if not url:
        return FlushResult(Outcome.NO_API, 0, left, "no Prefect API is configured")
    holder = uuid.uuid4().hex
    sent = 0
    stop_at = time.monotonic() + budget
    while True:
        with Store(store_url).writing_all() as s:
            batch = outbox.claim(s, holder, utcnow())
        if batch is None:
            return FlushResult(Outcome.BUSY, sent, _count(store_url))
        if not batch:
            return FlushResult(Outcome.DELIVERED, sent, 0)
        error = send(batch, url)
        with Store(store_url).writing_all() as s:
            outbox.settle(s, holder, delivered=error is None)
        if error is not None:
            reason = str(error) or type(error).__name__
            left = _count(store_url)
            log.warning("could not send %d event(s) to the Prefect API at %s (%s); %d wait "
                        "in the store for the next ingest or `reverie events flush`",
                        len(batch), url, reason, left)
            return FlushResult(Outcome.UNREACHABLE, sent, left, reason)
        sent += len(batch)
        if time.monotonic() >= stop_at:
            left = _count(store_url)
            return FlushResult(Outcome.DELIVERED if not left else Outcome.INCOMPLETE, sent, left)


def deliver(store_url: str) -> None:
    """After a commit that queued events: one flush, whose failure (the API's or the
    store's) is a warning, since what was stored is stored."""
    try:
        flush(store_url)
    except Exception as exc:  # noqa: BLE001 - the events wait for the next flush
        log.warning("could not flush the event outbox (%s); the events wait in the store",
                    type(exc).__name__)


@dataclass(frozen=True)
class SessionEnded:
    count: int  # the profile's sessions ended so far
    counted: bool  # False: this session had ended already (a retry), nothing was done
    sent: bool  # its events (full consolidation follows, by the trigger) queued to send


def end_session(store: Store, profile: str, session: str | None) -> SessionEnded:
    """Count the end of one of ``profile``'s sessions, once per session id."""
    queue_events = wanted()
    with store.writing(profile) as tx:
        count, counted = count_end(tx, session, utcnow(),
                                   store.settings.session_trigger_every, queue_events)
    if queue_events:
        # A retry too: the first call's events may still wait for an API that was down.
        deliver(store.url)
    return SessionEnded(count, counted, queue_events and counted)


def _count(store_url: str) -> int:
    with Store(store_url).reading_all() as s:
        return outbox.count(s)
