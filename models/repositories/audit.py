"""The audit of consolidation decisions: one Consolidation row per decision, which
undo reads back and which keeps a decision already made from being made again."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlmodel import Session

from reverie.models import tables
from reverie.models.repositories.bulk import chunks
from reverie.models.store import ProfileTx
from reverie.models.tables import Operation

C = tables.Consolidation.__table__  # type: ignore[attr-defined]

# Operations whose effects undo can reverse (a forget deletes rows; it cannot).
UNDOABLE = frozenset({Operation.DEDUP, Operation.COMPRESS, Operation.COLD_LEARNING,
                      Operation.CLUSTER, Operation.MIGRATE_COLD, Operation.SUPERSEDE})


def consolidations(tx: ProfileTx, limit: int = 50) -> list[tables.Consolidation]:
    """The profile's consolidation decisions, newest first."""
    return list(
        tx.session.execute(
            select(tables.Consolidation)
            .where(tables.Consolidation.profile_id == tx.profile)
            .order_by(tables.Consolidation.created_at.desc(), tables.Consolidation.id)
            .limit(limit)
        ).scalars()
    )


def decided(s: Session, audit_ids: Iterable[str]) -> set[str]:
    """Which of ``audit_ids`` are recorded already."""
    return {
        cid
        for batch in chunks(audit_ids)
        for cid in s.execute(select(C.c.id).where(C.c.id.in_(batch))).scalars()
    }
