"""Core Memory blocks: one small always-in-context text per (profile, block type)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlmodel import Session, col

from reverie.models.records import BlockPlan
from reverie.models.store import ProfileTx
from reverie.models.tables import CoreBlock


def blocks(tx: ProfileTx) -> list[CoreBlock]:
    return list(
        tx.session.execute(
            select(CoreBlock).where(col(CoreBlock.profile_id) == tx.profile)
            .order_by(CoreBlock.block_type)
        ).scalars()
    )


def upsert_blocks(tx: ProfileTx, plans: Sequence[BlockPlan], as_of: datetime) -> list[str]:
    """INSERT-or-REPLACE each block; the version moves only when the content does.
    Returns the block types whose content changed."""
    return upsert(tx.session, tx.profile, plans, as_of)


def upsert(s: Session, profile: str, plans: Sequence[BlockPlan], as_of: datetime) -> list[str]:
    changed: list[str] = []
    current = {
        b.block_type: b
        for b in s.execute(select(CoreBlock).where(col(CoreBlock.profile_id) == profile)).scalars()
    }
    for plan in plans:
        block = current.get(plan.block_type)
        if block is None:
            s.add(
                CoreBlock(
                    profile_id=profile, block_type=plan.block_type, content=plan.content,
                    source_ids=list(plan.source_ids), mode=plan.mode, compiled_at=as_of,
                )
            )
            changed.append(plan.block_type)
        elif (block.content, tuple(block.source_ids), block.mode) != (
            plan.content, plan.source_ids, plan.mode
        ):
            if block.content != plan.content:
                block.version += 1
                changed.append(plan.block_type)
            block.content = plan.content
            block.source_ids = list(plan.source_ids)
            block.mode = plan.mode
            block.compiled_at = as_of
    # Sent now rather than at commit: a write's statements come from the function that
    # makes it (what tests/test_recall_cache.py audits them by).
    s.flush()
    return changed
