"""Profile rows: created on first ingest, and the counters the event triggers read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from sqlalchemy import bindparam, select, update
from sqlmodel import Session, col

from reverie.models.repositories.bulk import insert_rows
from reverie.models.tables import Profile, table_of


def ensure_profiles(s: Session, names: Iterable[str], at: datetime) -> None:
    ensure_profiles_each(s, [(names, at)])


def ensure_profiles_each(s: Session, wanted: Sequence[tuple[Iterable[str], datetime]]) -> None:
    """``ensure_profiles`` of each (names, time) in turn, with one read: a profile new
    to the store is made at the time of the first that names it."""
    every = {name for names, _ in wanted for name in names}
    if not every:
        return
    known = set(
        s.execute(select(col(Profile.id)).where(col(Profile.id).in_(list(every)))).scalars()
    )
    rows: list[dict[str, object]] = []
    for names, at in wanted:
        for name in sorted(set(names) - known):
            rows.append({"id": name, "created_at": at, "store_count": 0, "session_count": 0,
                         "ingest_seq": 0, "write_seq": 0})
            known.add(name)
    # Two processes' first stores of one new profile may both find it missing (on
    # PostgreSQL they write side by side): the second waits for the first and adds
    # nothing, instead of failing on the key.
    insert_rows(s, table_of(Profile), rows, on_conflict="ON CONFLICT (id) DO NOTHING")


def count_stored(s: Session, stored: Mapping[str, int]) -> dict[str, int]:
    """Add ``stored`` new memories to each profile's store count; returns the counts
    before, which the store-threshold events are computed from."""
    before = dict(
        s.execute(
            select(col(Profile.id), col(Profile.store_count))
            .where(col(Profile.id).in_(list(stored)))
        ).tuples().all()
    )
    for name, n in stored.items():
        s.execute(
            update(Profile).where(col(Profile.id) == name)
            .values(store_count=col(Profile.store_count) + n)
        )
    return before


def ingest_horizons(s: Session, names: Sequence[str]) -> dict[str, int]:
    """Each profile's ingest_seq now: the horizon of a run that takes it now (see
    ``ProfileTx.horizon``; a profile with nothing stored yet has 0)."""
    found = dict.fromkeys(names, 0)
    found.update(s.execute(
        select(col(Profile.id), col(Profile.ingest_seq))
        .where(col(Profile.id).in_(list(found)))).tuples().all())
    return found


def next_ingest_seqs(s: Session, names: Iterable[str]) -> dict[str, int]:
    """Count one more ingest of each profile, and one more write (``bump_write_seqs``);
    returns the number its rows are stamped with. The counter is bumped in the ingest's
    own transaction, which holds the profile's row until it commits: ingests of a
    profile commit in the order of their numbers, so a run that reads the counter
    (``ingest_horizons``) sees every ingest numbered up to it and none after."""
    return take_ingest_seqs(s, dict.fromkeys(names, 1))


def take_ingest_seqs(s: Session, counts: Mapping[str, int]) -> dict[str, int]:
    """``next_ingest_seqs`` of ``counts[name]`` ingests of each profile at once, in one
    statement per profile: the number of the first; the others follow it."""
    out: dict[str, int] = {}
    for name in sorted(counts):  # a fixed order: two ingests never lock crosswise
        n = counts[name]
        out[name] = s.execute(
            update(Profile).where(col(Profile.id) == name)
            .values(ingest_seq=Profile.ingest_seq + n, write_seq=Profile.write_seq + n)
            .returning(col(Profile.ingest_seq))
        ).scalar_one() - n + 1
    return out


def bump_write_seqs(s: Session, names: Iterable[str]) -> None:
    """Count one more write transaction of each profile (``Profile.write_seq``). Called
    first in the transaction: it takes the profile's row lock before any other, in one
    fixed order, as ingest does, so writers of one profile never lock crosswise; and it
    commits with the writes, so a reader that sees the new count sees them too."""
    for name in sorted(set(names)):
        s.execute(update(Profile).where(col(Profile.id) == name)
                  .values(write_seq=Profile.write_seq + 1))


def lock_profiles(s: Session, names: Iterable[str]) -> None:
    """Take each profile's row lock, in the one order every writer takes them, changing
    nothing: for a transaction that then writes them in another order
    (``models.ingest.ingest_together``)."""
    for name in sorted(set(names)):
        s.execute(update(Profile).where(col(Profile.id) == name)
                  .values(ingest_seq=Profile.ingest_seq))


def write_seq(s: Session, name: str) -> int | None:
    """The profile's write count in the caller's snapshot; None if there is no such
    profile. One row by primary key: what a cache checks on every call."""
    return s.execute(_WRITE_SEQ, {"name": name}).scalar()


# Built once: every recall of a server reads it (see ``memories._BY_ID``).
_WRITE_SEQ = select(col(Profile.write_seq)).where(col(Profile.id) == bindparam("name"))
