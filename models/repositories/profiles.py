"""Profile rows: created on first ingest, and the counters the event triggers read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from sqlalchemy import select, update
from sqlmodel import Session

from reverie.models.tables import Profile


def ensure_profiles(s: Session, names: Iterable[str], at: datetime) -> None:
    names = set(names)
    if not names:
        return
    known = set(s.execute(select(Profile.id).where(Profile.id.in_(list(names)))).scalars())
    for name in sorted(names - known):
        s.add(Profile(id=name, created_at=at))
    s.flush()


def count_stored(s: Session, stored: Mapping[str, int]) -> dict[str, int]:
    """Add ``stored`` new memories to each profile's store count; returns the counts
    before, which the store-threshold events are computed from."""
    before = dict(
        s.execute(
            select(Profile.id, Profile.store_count).where(Profile.id.in_(list(stored)))
        ).all()
    )
    for name, n in stored.items():
        s.execute(
            update(Profile).where(Profile.id == name).values(store_count=Profile.store_count + n)
        )
    return before
