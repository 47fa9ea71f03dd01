"""The event outbox: Prefect events kept in the store until the Prefect API has them.

The repository functions take the caller's session, so that an event is written in the
transaction of the change that caused it: an ingest that rolls back leaves no event,
and a process that dies after its commit loses none. The store queues events only when
a Prefect API is configured (``runner.event_delivery.wanted``): without one nobody would
send them, and a local-only store's outbox would only grow.

``runner.event_delivery.flush`` sends what is pending, oldest first, and deletes what
the API confirmed. It claims the rows it sends in a short transaction first (the writer
lock serialises claims on SQLite, an advisory lock on PostgreSQL), so two processes
never send the same event, and while one process holds a claim the others leave every
row alone: sending later events around an earlier one in flight would reorder them.
The holder looks again before it stops, and so takes what others queued meanwhile. Prefect does not
make resending harmless: it stores an event id once, but its triggers remember the ids
they saw only in memory, for 30 minutes.

A sender that dies between its send and its delete, or whose send outlived the deadline
and arrived after all, leaves events that are sent again once its claim lapses
(CLAIM_SECONDS): at least once, with the same ids, which Prefect's triggers ignore
within those 30 minutes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlmodel import Session

from reverie.models.db import read_store_id
from reverie.models.events import ProfileEvent
from reverie.models.repositories.bulk import insert_rows
from reverie.models.store import Store
from reverie.models.tables import OutboxEvent, table_of
from reverie.models.timestamps import utcnow

_O = table_of(OutboxEvent)
# Events one send takes: a backlog goes out in a few sends, each well within its deadline.
BATCH = 500
# How long a claim holds: far beyond a send's deadline, so that only a sender that died
# (or is stuck on the store) loses its rows to another.
CLAIM_SECONDS = 60.0
# PostgreSQL advisory lock serialising claims ("reverie" in ASCII, then 1).
_CLAIM_LOCK = 0x7265766572696501


@dataclass(frozen=True, slots=True)
class Pending:
    profile: str
    events: int
    oldest: datetime  # when the oldest of them happened


# --- the repository ----------------------------------------------------------------------


def add(s: Session, queued: Sequence[ProfileEvent]) -> int:
    """Queue events in the caller's transaction; an event already queued (same key) is
    left as it is. Returns how many were given."""
    if not queued:
        return 0
    now = utcnow()
    rows = [
        {"profile_id": e.profile, "name": str(e.name), "key": e.key, "payload": e.payload,
         "occurred_at": e.at, "created_at": now}
        for e in queued
    ]
    insert_rows(s, _O, rows, on_conflict="ON CONFLICT (key) DO NOTHING")
    return len(queued)


def claim(
    s: Session, holder: str, now: datetime, limit: int = BATCH
) -> list[ProfileEvent] | None:
    """Claim the oldest pending events for ``holder``, in order; None while another
    holder's claim is live (its events go first, and it takes the rest after them)."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(select(func.pg_advisory_xact_lock(_CLAIM_LOCK)))
    busy = s.execute(
        select(_O.c.seq).where(_O.c.claimed_until > now).where(_O.c.claimed_by != holder)
        .limit(1)
    ).first()
    if busy is not None:
        return None
    rows = s.execute(
        select(_O.c.seq, _O.c.name, _O.c.profile_id, _O.c.key, _O.c.payload, _O.c.occurred_at)
        .order_by(_O.c.seq).limit(limit)
    ).all()
    store = read_store_id(s) if rows else None
    if rows:
        s.execute(
            update(_O).where(_O.c.seq.in_([r.seq for r in rows]))
            .values(claimed_by=holder, claimed_until=now + timedelta(seconds=CLAIM_SECONDS))
        )
    return [ProfileEvent(r.name, r.profile_id, r.key, r.payload or {}, r.occurred_at, store)
            for r in rows]


def settle(s: Session, holder: str, delivered: bool) -> None:
    """Delete the holder's claimed events once the API has them, or give them back.
    Rows whose claim lapsed and went to another holder are that holder's now."""
    mine = _O.c.claimed_by == holder
    if delivered:
        s.execute(delete(_O).where(mine))
    else:
        s.execute(update(_O).where(mine).values(claimed_by=None, claimed_until=None))


def count(s: Session) -> int:
    return s.execute(select(func.count()).select_from(_O)).scalar_one()


def pending(s: Session) -> list[Pending]:
    """How many events wait, per profile (counts only: payloads stay in the store)."""
    rows = s.execute(
        select(_O.c.profile_id, func.count(), func.min(_O.c.occurred_at))
        .group_by(_O.c.profile_id).order_by(_O.c.profile_id)
    ).all()
    return [Pending(profile, n, oldest) for profile, n, oldest in rows]


def waiting(store_url: str) -> list[Pending]:
    with Store(store_url).reading_all() as s:
        return pending(s)
