"""The audit of consolidation decisions: one Consolidation row per decision, which
undo reads back and which keeps a decision already made from being made again."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import ColumnElement, func, select
from sqlmodel import Session, col

from reverie.models import tables
from reverie.models.repositories.bulk import chunks
from reverie.models.store import ProfileTx
from reverie.models.tables import Operation

C = tables.table_of(tables.Consolidation)

# Operations whose effects undo can reverse (a forget deletes rows; it cannot).
UNDOABLE = frozenset({Operation.DEDUP, Operation.COMPRESS, Operation.COLD_LEARNING,
                      Operation.CLUSTER, Operation.MIGRATE_COLD, Operation.SUPERSEDE,
                      Operation.RESTATE})


# What a released decision's id ends with, before the ingest number that released it
# (``summaries.release``): its own id is free for the decision to be made again.
RELEASED = "~released-"


def released_id(consolidation_id: str, ingest_seq: int) -> str:
    """The id a decision takes when the ingest numbered ``ingest_seq`` releases it."""
    return f"{consolidation_id}{RELEASED}{ingest_seq}"


def released_prefix(consolidation_id: str) -> str:
    """What the ids of ``consolidation_id``'s releases start with."""
    return consolidation_id + RELEASED


def standing_id() -> ColumnElement[bool]:
    """Decisions no ingest released: those undone among them are an operator's."""
    return ~C.c.id.contains(RELEASED, autoescape=True)


def consolidations(tx: ProfileTx, limit: int | None = 50) -> list[tables.Consolidation]:
    """The profile's consolidation decisions, newest first (``limit``: at most so many;
    None: all)."""
    query = (
        select(tables.Consolidation)
        .where(col(tables.Consolidation.profile_id) == tx.profile)
        .order_by(col(tables.Consolidation.created_at).desc(), col(tables.Consolidation.id))
    )
    return list(tx.session.execute(query if limit is None else query.limit(limit)).scalars())


def consolidation_count(tx: ProfileTx) -> int:
    """How many consolidation decisions the profile has (what ``consolidations`` can
    show without a limit)."""
    return int(tx.session.execute(
        select(func.count()).select_from(C).where(C.c.profile_id == tx.profile)
    ).scalar_one())


def summary_texts(tx: ProfileTx, decisions: Iterable[tables.Consolidation]) -> dict[str, str]:
    """The text of each decision's summary (or, for a supersession, the newest memory
    that stands), by consolidation id: the memory as it is now, in any tier, or, once
    undone, the words its audit row kept. A decision without one (a forget) is absent."""
    decisions = list(decisions)
    wanted = sorted({d.summary_id for d in decisions if d.summary_id})
    M = tables.table_of(tables.Memory)
    found = {
        mid: content
        for batch in chunks(wanted)
        for mid, content in tx.session.execute(
            select(M.c.id, M.c.content).where(M.c.profile_id == tx.profile)
            .where(M.c.id.in_(batch))
        )
    }
    out: dict[str, str] = {}
    for d in decisions:
        # An undone decision's own words first: its summary id may name one made
        # again since, and a released supersession's newest memory says other words.
        kept = (d.parameters or {}).get("undone_summary") or {}
        text = kept.get("content") or found.get(d.summary_id or "")
        if text is not None:
            out[d.id] = text
    return out


def decided(s: Session, audit_ids: Iterable[str]) -> set[str]:
    """Which of ``audit_ids`` are recorded already."""
    return {
        cid
        for batch in chunks(audit_ids)
        for cid in s.execute(select(C.c.id).where(C.c.id.in_(batch))).scalars()
    }
