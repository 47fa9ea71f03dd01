"""Run history, leases (one run per profile at a time) and session ends."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col

from reverie.models import events, outbox, tables
from reverie.models.errors import NotFoundError
from reverie.models.repositories.bulk import chunks, cursor_result
from reverie.models.store import ProfileTx
from reverie.models.tables import Profile

_L = tables.table_of(tables.Lease)
_R = tables.table_of(tables.RunRecord)


def record_runs(s: Session, records: Sequence[tables.RunRecord]) -> None:
    s.add_all(records)


def run_history(
    s: Session,
    profile: str | None = None,
    flow: str | None = None,
    limit: int | None = 20,
    as_of: datetime | None = None,
) -> list[tables.RunRecord]:
    """The most recent finished runs, newest first (all of them with ``limit=None``)."""
    query = select(tables.RunRecord).order_by(
        col(tables.RunRecord.finished_at).desc(), col(tables.RunRecord.id).desc()
    )
    if profile is not None:
        query = query.where(col(tables.RunRecord.profile_id) == profile)
    if flow is not None:
        query = query.where(col(tables.RunRecord.flow) == flow)
    if as_of is not None:
        query = query.where(col(tables.RunRecord.as_of) == as_of)
    return list(s.execute(query.limit(limit)).scalars())


def last_as_of(s: Session, profile: str, flow: str) -> datetime | None:
    """The as_of of the profile's most recent finished run of ``flow`` (as run_history
    orders them), if any: one column, for steps that read it every run."""
    return s.execute(
        select(_R.c.as_of).where(_R.c.profile_id == profile).where(_R.c.flow == flow)
        .order_by(_R.c.finished_at.desc(), _R.c.id.desc()).limit(1)
    ).scalar()


def latest_as_of(s: Session, profiles: Sequence[str]) -> dict[tuple[str, str], datetime]:
    """The latest as_of each of ``profiles`` has a finished run of, per flow (by the
    flow's Prefect name): where its history stands, for telling a backfill into the past."""
    found: dict[tuple[str, str], datetime] = {}
    for part in chunks(sorted(set(profiles))):
        found.update({(p, f): when for p, f, when in s.execute(
            select(_R.c.profile_id, _R.c.flow, func.max(_R.c.as_of))
            .where(_R.c.profile_id.in_(part)).group_by(_R.c.profile_id, _R.c.flow)
        ).tuples()})
    return found


# --- leases: one run per profile at a time -------------------------------------------


def acquire_leases(
    s: Session, profiles: Sequence[str], holder: str, seconds: float, at: datetime
) -> list[str]:
    """Take every free (or expired, or already ours) profile among ``profiles`` for
    ``holder``; returns the profiles taken. Safe against other processes taking the
    same profile at the same moment, on SQLite and PostgreSQL alike."""
    until = at + timedelta(seconds=seconds)
    taken: list[str] = []
    for profile in sorted(set(profiles)):
        claimed = cursor_result(s.execute(
            update(_L)
            .where(_L.c.profile_id == profile)
            .where(or_(_L.c.holder == holder, _L.c.expires_at <= at))
            .values(holder=holder, acquired_at=at, expires_at=until)
        )).rowcount
        if not claimed:
            try:
                with s.begin_nested():
                    s.execute(insert(_L).values(
                        profile_id=profile, holder=holder, acquired_at=at, expires_at=until
                    ))
                claimed = 1
            except IntegrityError:  # someone holds it (or took it just now)
                claimed = 0
        if claimed:
            taken.append(profile)
    return taken


def expired_leases(
    s: Session, profiles: Sequence[str], holder: str, at: datetime
) -> dict[str, str]:
    """The profiles among ``profiles`` whose lease another holder let expire, each with
    that holder. A run gives its leases back as it ends, and renews them while it
    lives: one left to expire was held by a run that died holding it (or hung)."""
    return dict(s.execute(
        select(_L.c.profile_id, _L.c.holder).where(_L.c.profile_id.in_(sorted(set(profiles))))
        .where(_L.c.expires_at <= at).where(_L.c.holder != holder)
    ).tuples().all())


def renew_leases(
    s: Session, profiles: Sequence[str], holder: str, seconds: float, at: datetime
) -> list[str]:
    """Extend ``holder``'s leases among ``profiles``; never takes one it does not
    hold (a lease given back, or taken by another run after it expired). Returns
    the profiles renewed."""
    renewed = s.execute(
        update(_L).where(_L.c.profile_id.in_(list(profiles)))
        .where(_L.c.holder == holder)
        .values(expires_at=at + timedelta(seconds=seconds))
        .returning(_L.c.profile_id)
    ).scalars().all()
    return sorted(renewed)


def release_leases(s: Session, profiles: Sequence[str], holder: str) -> None:
    s.execute(
        delete(tables.Lease)
        .where(col(tables.Lease.profile_id).in_(list(profiles)))
        .where(col(tables.Lease.holder) == holder)
    )


def lease_holders(s: Session) -> dict[str, str]:
    return dict(
        s.execute(select(col(tables.Lease.profile_id), col(tables.Lease.holder))).tuples().all()
    )


# --- sessions ----------------------------------------------------------------------------


def end_session(
    tx: ProfileTx, session_id: str | None, at: datetime, every: int, queue_events: bool
) -> tuple[int, bool]:
    """Count a finished session of the profile; with ``queue_events``, queue the events
    that tell Prefect (full consolidation follows, through the deployment triggers) in
    the outbox, for the caller to deliver once committed. Returns the session count, and
    whether this call counted it: the end of the session that ended last, sent again (a
    client's retry), counts nothing and queues nothing."""
    row = tx.session.get(Profile, tx.profile)
    if row is None:
        raise NotFoundError(f"no profile named {tx.profile!r}")
    if session_id is not None and session_id == row.last_session_id:
        return row.session_count, False
    row.session_count += 1
    row.last_session_id = session_id
    count = row.session_count
    if queue_events:
        outbox.add(tx.session, events.session_events(tx.profile, session_id, count, at, every))
    return count, True
