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

Events are sent only when a Prefect API is configured (``PREFECT_API_URL``), directly
and without reconnect attempts, from a short-lived thread with a deadline: storing
memories never fails, and never waits long, because the API is down. Event ids are
derived from what happened, so a retried ingest cannot trigger twice.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from models.settings import get_settings

log = logging.getLogger(__name__)

MEMORY_STORED = "reverie.memory.stored"
STORE_THRESHOLD = "reverie.profile.store-threshold"
SESSION_ENDED = "reverie.session.ended"
SESSION_THRESHOLD = "reverie.profile.session-threshold"
SEND_DEADLINE_SECONDS = 5.0
_NAMESPACE = uuid.UUID("5f2b7c1e-9a4d-4c1b-8e0f-6d3a2b1c0e9f")


@dataclass(frozen=True, slots=True)
class ProfileEvent:
    name: str
    profile: str
    key: str  # what makes this event unique: its id is derived from it
    payload: dict[str, Any]
    at: datetime


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


def emit(events: Sequence[ProfileEvent]) -> bool:
    """Send the events if a Prefect API is configured; True when they were delivered.
    Never raises: a failure is logged and the caller goes on."""
    url = api_url() if events and get_settings().emit_events else None
    if not url:
        return False
    outcome: list[BaseException | None] = []
    # Prefect's settings context does not follow into a new thread: pass the URL along.
    thread = threading.Thread(target=lambda: outcome.append(_send(events, url)), daemon=True)
    thread.start()
    thread.join(SEND_DEADLINE_SECONDS)
    error = outcome[0] if outcome else TimeoutError("no answer in time")
    if error is not None:
        log.warning("could not send %d event(s) to the Prefect API: %s", len(events), error)
        return False
    return True


def _send(events: Sequence[ProfileEvent], url: str) -> BaseException | None:
    from prefect.events import Event
    from prefect.events.clients import PrefectEventsClient

    async def send() -> None:
        async with PrefectEventsClient(api_url=url, reconnection_attempts=0) as client:
            for e in events:
                await client.emit(Event(
                    id=uuid.uuid5(_NAMESPACE, e.key), event=e.name, resource=resource(e.profile),
                    payload=e.payload, occurred=e.at.replace(tzinfo=UTC),
                ))

    try:
        asyncio.run(send())
    except BaseException as exc:  # noqa: BLE001 - reported to the caller
        return exc
    return None
