"""Prefect events the store emits, so that deployment triggers can react to it.

Events, each about the resource ``reverie.profile.<name>`` (with the label
``reverie.profile``):

- ``reverie.memory.stored``: an ingest stored new memories (payload: how many, and the
  profile's running count). The idle trigger waits for these to stop.
- ``reverie.profile.store-threshold``: the profile's store count crossed a multiple of
  ``REVERIE_STORE_TRIGGER_EVERY`` (50): lightweight consolidation.
- ``reverie.session.ended``: a session of the profile ended: full consolidation.
- ``reverie.profile.session-threshold``: the session count reached a multiple of
  ``REVERIE_SESSION_TRIGGER_EVERY`` (5): full consolidation.

Events exist only when a Prefect API is configured (``PREFECT_API_URL``) and
``REVERIE_EMIT_EVENTS`` is on. The store then writes them to its outbox
(``models.outbox``) in the transaction that made them happen, and after the commit
sends what is pending, in order, directly and without reconnect attempts, from a
short-lived thread with a deadline: storing memories never fails, and never waits long,
because the API is down, and an event the API did not take is sent later instead of
lost. Event ids are derived from what happened, so a retried ingest cannot trigger twice.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from reverie.models.settings import get_settings


class EventName(StrEnum):
    MEMORY_STORED = "reverie.memory.stored"
    STORE_THRESHOLD = "reverie.profile.store-threshold"
    SESSION_ENDED = "reverie.session.ended"
    SESSION_THRESHOLD = "reverie.profile.session-threshold"


MEMORY_STORED = EventName.MEMORY_STORED
STORE_THRESHOLD = EventName.STORE_THRESHOLD
SESSION_ENDED = EventName.SESSION_ENDED
SESSION_THRESHOLD = EventName.SESSION_THRESHOLD
SEND_DEADLINE_SECONDS = 5.0
_SEND_THREAD = "reverie-events-send"
_NAMESPACE = uuid.UUID("5f2b7c1e-9a4d-4c1b-8e0f-6d3a2b1c0e9f")


@dataclass(frozen=True, slots=True)
class ProfileEvent:
    name: str
    profile: str
    key: str  # what makes this event unique: its id is derived from it
    payload: dict[str, Any]
    at: datetime  # naive UTC, as every time in the store

    @property
    def id(self) -> uuid.UUID:
        return uuid.uuid5(_NAMESPACE, self.key)


def resource(profile: str) -> dict[str, str]:
    return {
        "prefect.resource.id": f"reverie.profile.{profile}",
        "prefect.resource.name": profile,
        "reverie.profile": profile,
    }


def crossings(before: int, after: int, every: int) -> int:
    """How many multiples of ``every`` a count passed going from ``before`` to ``after``."""
    if every <= 0 or after <= before:
        return 0
    return after // every - before // every


def stored_events(
    profile: str, before: int, after: int, at: datetime, every: int
) -> list[ProfileEvent]:
    """Events for an ingest that took the profile's store count from ``before`` to ``after``."""
    if after <= before:
        return []
    events = [ProfileEvent(MEMORY_STORED, profile, f"{profile}:stored:{after}",
                           {"count": after - before, "store_count": after}, at)]
    if crossings(before, after, every):
        events.append(ProfileEvent(
            STORE_THRESHOLD, profile, f"{profile}:store-threshold:{after // every}",
            {"store_count": after, "every": every}, at))
    return events


def session_events(
    profile: str, session_id: str | None, count: int, at: datetime, every: int
) -> list[ProfileEvent]:
    """Events for the end of the profile's ``count``-th session."""
    events = [ProfileEvent(SESSION_ENDED, profile, f"{profile}:session:{count}",
                           {"session_id": session_id, "session_count": count}, at)]
    if every > 0 and count % every == 0:
        events.append(ProfileEvent(
            SESSION_THRESHOLD, profile, f"{profile}:session-threshold:{count}",
            {"session_count": count, "every": every}, at))
    return events


def api_url() -> str | None:
    """The Prefect server to send events to; None for an ephemeral API (which would start
    a server for a second and lose the events with it)."""
    from prefect.settings import get_current_settings

    return get_current_settings().api.url


def api_configured() -> bool:
    return bool(api_url())


def wanted() -> bool:
    """Whether the store should keep events at all: without an API nobody would ever
    send them, and a local-only store's outbox would grow forever."""
    return get_settings().emit_events and api_configured()


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
                    id=e.id, event=e.name, resource=resource(e.profile),
                    payload=e.payload, occurred=e.at.replace(tzinfo=UTC),
                ))

    try:
        asyncio.run(asyncio.wait_for(send(), SEND_DEADLINE_SECONDS))
    except BaseException as exc:  # noqa: BLE001 - reported to the caller
        return exc
    return None
