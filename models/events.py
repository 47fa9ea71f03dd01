"""Prefect events the store emits, so that deployment triggers can react to it.

Events, each about the resource ``reverie.profile.<name>`` (with the labels
``reverie.profile`` and ``reverie.store``, the store's id), related to the resource
``reverie.store.<store id>`` (role ``store``):

- ``reverie.memory.stored``: an ingest stored new memories (payload: how many, and the
  profile's running count). The idle trigger waits for these to stop.
- ``reverie.memory.recalled``: an agent recalled memories through ``reverie api`` or
  ``reverie mcp`` (payload: how many were asked for and found, never the query). Activity,
  as a store is: the idle trigger waits for both to stop.
- ``reverie.profile.store-threshold``: the profile's store count crossed a multiple of
  ``REVERIE_STORE_TRIGGER_EVERY`` (50): lightweight consolidation.
- ``reverie.session.ended``: a session of the profile ended: full consolidation.
- ``reverie.profile.session-threshold``: the session count reached a multiple of
  ``REVERIE_SESSION_TRIGGER_EVERY`` (5): full consolidation.

Events exist only when a Prefect API is configured (``PREFECT_API_URL``) and
``REVERIE_EMIT_EVENTS`` is on (``runner.event_delivery.wanted``). The store then writes
them to its outbox (``models.outbox``) in the transaction that made them happen; the
caller sends what is pending once it has committed (``runner.event_delivery``): storing
memories never fails, and never waits long, because the API is down, and an event the
API did not take is sent later instead of lost. Event ids are derived from what
happened, so a retried ingest cannot trigger twice.

Every event names its store, whose id the store keeps (``store_meta``, made when the
store is created): two stores with the same profile names on one Prefect API are two
sets of resources to its automations, which match only their own store's id (see
prefect.yaml), and the event ids differ too (Prefect keeps one event per id).

This module only says what the events are: nothing here talks to Prefect.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class EventName(StrEnum):
    MEMORY_STORED = "reverie.memory.stored"
    MEMORY_RECALLED = "reverie.memory.recalled"
    STORE_THRESHOLD = "reverie.profile.store-threshold"
    SESSION_ENDED = "reverie.session.ended"
    SESSION_THRESHOLD = "reverie.profile.session-threshold"


MEMORY_STORED = EventName.MEMORY_STORED
MEMORY_RECALLED = EventName.MEMORY_RECALLED
STORE_THRESHOLD = EventName.STORE_THRESHOLD
SESSION_ENDED = EventName.SESSION_ENDED
SESSION_THRESHOLD = EventName.SESSION_THRESHOLD
_NAMESPACE = uuid.UUID("5f2b7c1e-9a4d-4c1b-8e0f-6d3a2b1c0e9f")


@dataclass(frozen=True, slots=True)
class ProfileEvent:
    name: str
    profile: str
    key: str  # what makes this event unique: its id is derived from it
    payload: dict[str, Any]
    at: datetime  # naive UTC, as every time in the store
    # The id of the store the event comes from; set when it leaves the outbox.
    store: str | None = None

    @property
    def id(self) -> uuid.UUID:
        # The store is part of the id: two stores' "alice's 50th store" are two events.
        return uuid.uuid5(_NAMESPACE, self.key if self.store is None
                          else f"{self.store}:{self.key}")


STORE_LABEL = "reverie.store"
STORE_ROLE = "store"


def resource(profile: str, store: str | None = None) -> dict[str, str]:
    """The resource an event is about: the profile, labelled with its store's id."""
    about = {
        "prefect.resource.id": f"reverie.profile.{profile}",
        "prefect.resource.name": profile,
        "reverie.profile": profile,
    }
    if store is not None:
        about[STORE_LABEL] = store
    return about


def store_resource_id(store: str) -> str:
    return f"reverie.store.{store}"


def related(store: str | None) -> list[dict[str, str]]:
    """The resources an event relates to: its store (what automations match on)."""
    if store is None:
        return []
    return [{"prefect.resource.id": store_resource_id(store),
             "prefect.resource.role": STORE_ROLE,
             "prefect.resource.name": f"store {store}"}]


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


def recalled_event(profile: str, asked: int, found: int, at: datetime) -> ProfileEvent:
    """The event of one recall: activity for the idle trigger. Each recall is its own
    event (a fresh key), as each is its own activity; a retried recall is a new one."""
    return ProfileEvent(MEMORY_RECALLED, profile, f"{profile}:recalled:{uuid.uuid4()}",
                        {"k": asked, "found": found}, at)
