"""Forgetting and the cold tier: archiving, deleting (with tombstones), moving unused
memories to cold, and what the audit says about when each went there."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, case, delete, func, select, true, update

from reverie.models import ids, tables
from reverie.models.config import ForgetConfig
from reverie.models.errors import ConflictError
from reverie.models.records import BlockPlan, MemoryView
from reverie.models.repositories import blocks as core_blocks
from reverie.models.repositories.audit import C
from reverie.models.repositories.bulk import chunks, owned_by
from reverie.models.repositories.edges import E
from reverie.models.repositories.memories import (
    LIVE,
    VIEW_COLUMNS,
    M,
    V,
    metadata,
    view,
    within_horizon,
)
from reverie.models.store import ProfileTx
from reverie.models.tables import Operation, Tier, Tombstone

# Operations that move memories to the cold tier, and where their audit names them.
_TO_COLD = {
    Operation.DEDUP: "prior", Operation.COMPRESS: "prior", Operation.COLD_LEARNING: "prior",
    Operation.FORGET: "archived", Operation.MIGRATE_COLD: "prior",
    Operation.SUPERSEDE: "prior", Operation.RESTATE: "prior",
}


def superseding_ids(tx: ProfileTx) -> set[str]:
    """Memories that others are superseded by: they stand for originals in cold."""
    return set(
        tx.session.execute(
            select(M.c.superseded_by).distinct().where(M.c.profile_id == tx.profile)
            .where(M.c.superseded_by.is_not(None))
        ).scalars()
    )


class Spared(NamedTuple):
    """Protected live memories scored below a forget threshold, counted by what protects
    them: the flag, a protected kind (None: not of one), high importance (else: the
    grace period)."""

    flagged: bool
    kind: str | None
    important: bool
    count: int  # type: ignore[assignment]  # shadows tuple.count, which nothing here calls


def protected(as_of: datetime, config: ForgetConfig) -> ColumnElement[bool]:
    """tasks.forget.protection as SQL: true for a memory forget may never take."""
    try:
        born_after = as_of - timedelta(days=config.grace_period_days)
    except OverflowError:  # a grace period reaching back past year 1 covers everything
        return true()
    return (
        M.c.protected | M.c.kind.in_(list(config.protected_kinds))
        | (M.c.importance >= config.protected_importance) | (M.c.created_at > born_after)
    )


def below_relevance(
    tx: ProfileTx, below: float, as_of: datetime, config: ForgetConfig
) -> tuple[list[MemoryView], list[Spared]]:
    """The live memories scored below ``below`` that forget may take, ordered by id, and
    how many more it may not (protected), by reason, in no set order. The protected ones
    are only counted: a profile can hold thousands of them, below the threshold on
    every run."""
    shield = protected(as_of, config).label("shielded")
    scored_below = ((M.c.profile_id == tx.profile) & LIVE & (M.c.relevance < below)
                    & within_horizon(tx))
    kind = case((M.c.kind.in_(list(config.protected_kinds)), M.c.kind), else_=None)
    important = M.c.importance >= config.protected_importance
    # One pass counts both sides; the rows forget may take are read only if there are
    # any, which after the first run is rare: what stays below is mostly protected.
    groups = tx.session.execute(
        select(shield, M.c.protected, kind, important, func.count())
        .where(scored_below).group_by(shield, M.c.protected, kind, important)
    ).all()
    spared = [Spared(bool(f), k, bool(i), n) for s, f, k, i, n in groups if s]
    if len(spared) == len(groups):
        return [], spared
    candidates = [view(r) for r in tx.session.execute(
        select(*VIEW_COLUMNS).where(scored_below & ~shield).order_by(M.c.id))]
    return candidates, spared


def undone_migrations(tx: ProfileTx) -> set[str]:
    """Memories whose move to the cold tier an operator undid: never moved again."""
    return {
        mid
        for members in tx.session.execute(
            select(C.c.member_ids).where(C.c.profile_id == tx.profile)
            .where(C.c.operation == Operation.MIGRATE_COLD)
            .where(C.c.undone_at.is_not(None))
        ).scalars()
        for mid in members or ()
    }


def cold_since(tx: ProfileTx) -> dict[str, datetime]:
    """When each memory last went to the cold tier (the as_of of the decision that
    moved it, undone ones aside), read from the audit; a memory never moved has none."""
    since: dict[str, datetime] = {}
    rows = tx.session.execute(
        select(C.c.operation, C.c.parameters, C.c.created_at)
        .where(C.c.profile_id == tx.profile).where(C.c.undone_at.is_(None))
        .where(C.c.operation.in_(list(_TO_COLD)))
    )
    for operation, parameters, at in rows:
        for mid in metadata(parameters).get(_TO_COLD[operation]) or ():
            if mid not in since or since[mid] < at:
                since[mid] = at
    return since


def forget(
    tx: ProfileTx,
    archive: Sequence[str],
    delete_: Sequence[tuple[str, float | None, str]],
    as_of: datetime,
    run_id: str | None,
    parameters: dict[str, Any],
    blocks: Sequence[BlockPlan] = (),
    operation: Operation = Operation.FORGET,
) -> list[str]:
    """Archive memories to cold, and delete others (row, edges and vector) leaving a
    tombstone with their content hash, score and reason; one audit row records both
    (as ``operation``: cold-tier expiry deletes this way too).
    ``blocks``, compiled without the forgotten memories, replace the Core Memory
    blocks in the same transaction, so no block keeps a deleted memory's text.
    Returns the block types whose content changed."""
    if not archive and not delete_:
        return []
    s, profile = tx.session, tx.profile
    doomed = [mid for mid, _, _ in delete_]
    for batch in chunks(archive):
        s.execute(
            update(M).where(owned_by(M, profile)).where(M.c.id.in_(batch))
            .values(tier=Tier.COLD, lifecycle=tables.Lifecycle.ARCHIVED)
        )
    if delete_:
        known = {
            r.id: r
            for batch in chunks(doomed)
            for r in s.execute(
                select(M.c.id, M.c.external_id, M.c.content_hash)
                .where(owned_by(M, profile)).where(M.c.id.in_(batch))
            )
        }
        for mid, score, reason in delete_:
            row = known[mid]
            s.add(Tombstone(
                memory_id=mid, profile_id=profile, external_id=row.external_id,
                content_hash=row.content_hash, reason=reason, score=score,
                run_id=run_id, deleted_at=as_of,
            ))
        for batch in chunks(doomed):
            for end in (E.c.source_id, E.c.target_id):
                s.execute(
                    delete(E).where(E.c.profile_id == profile).where(end.in_(batch))
                )
            s.execute(delete(V).where(V.c.memory_id.in_(batch)))
            s.execute(
                delete(M).where(owned_by(M, profile)).where(M.c.id.in_(batch))
            )
    s.add(tables.Consolidation(
        id=ids.consolidation_id(profile, operation, as_of.isoformat()),
        profile_id=profile, run_id=run_id, operation=operation,
        member_ids=sorted([*archive, *doomed]),
        parameters={**parameters, "archived": sorted(archive), "deleted": sorted(doomed)},
        created_at=as_of,
    ))
    return core_blocks.upsert(s, profile, blocks, as_of)


def migrate_to_cold(
    tx: ProfileTx,
    memory_ids: Sequence[str],
    as_of: datetime,
    run_id: str | None,
    parameters: dict[str, Any],
    blocks: Sequence[BlockPlan] = (),
) -> list[str]:
    """Move live hot memories to the cold tier (archived, kept), auditing each one's
    prior state so that ``undo`` brings them back; ``blocks``, compiled without them,
    replace the Core Memory blocks in the same transaction (as forget's archiving
    does). The same move decided again (a retried step) is skipped. Returns the
    block types whose content changed."""
    if not memory_ids:
        return []
    s, profile = tx.session, tx.profile
    wanted = sorted(memory_ids)
    audit_id = ids.consolidation_id(
        profile, Operation.MIGRATE_COLD, f"{as_of.isoformat()}|{','.join(wanted)}")
    if s.get(tables.Consolidation, audit_id) is not None:
        return []
    prior = {
        r.id: [r.tier, r.lifecycle, r.superseded_by]
        for batch in chunks(wanted)
        for r in s.execute(
            select(M.c.id, M.c.tier, M.c.lifecycle, M.c.superseded_by)
            .where(owned_by(M, profile)).where(M.c.id.in_(batch))
        )
    }
    if len(prior) != len(wanted) or any(t != Tier.HOT for t, _, _ in prior.values()):
        raise ConflictError("cold migration: memories changed since they were read")
    for batch in chunks(wanted):
        s.execute(
            update(M).where(owned_by(M, profile)).where(M.c.id.in_(batch))
            .values(tier=Tier.COLD, lifecycle=tables.Lifecycle.ARCHIVED)
        )
    s.add(tables.Consolidation(
        id=audit_id, profile_id=profile, run_id=run_id,
        operation=Operation.MIGRATE_COLD, member_ids=wanted,
        parameters={**parameters, "prior": prior}, created_at=as_of,
    ))
    return core_blocks.upsert(s, profile, blocks, as_of)
