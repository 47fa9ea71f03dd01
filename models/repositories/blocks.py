"""Core Memory blocks: one small always-in-context text per (profile, block type)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime

from sqlalchemy import select
from sqlmodel import Session, col

from reverie.models.block_text import SEPARATOR, block_rank, fact_text, fit_facts
from reverie.models.records import BlockPlan, MemoryView
from reverie.models.repositories.memories import memories
from reverie.models.store import ProfileTx
from reverie.models.tables import CoreBlock, Tier


def blocks(tx: ProfileTx) -> list[CoreBlock]:
    """The profile's blocks in their priority order (``BLOCK_TYPES``)."""
    found = tx.session.execute(
        select(CoreBlock).where(col(CoreBlock.profile_id) == tx.profile)
    ).scalars()
    return sorted(found, key=lambda b: (block_rank(b.block_type), b.block_type))


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


def requote(tx: ProfileTx, rewritten: Collection[str], at: datetime) -> list[str]:
    """Take out of the profile's blocks what their memories no longer say, in the
    transaction that changed the memories (an ingest, an undo): until the next compile,
    an agent reading its Core Memory was told words a memory had been given anew, or a
    summary an ingest had released. A fact whose memory is gone, no longer live or no
    longer valid at ``at`` is dropped; one whose memory has new content (``rewritten``)
    says the new words. No block grows past the length it was compiled to, so both
    limits still hold: facts that no longer fit drop off its end. A block an LLM worded
    stands for all of its facts, so it becomes the rules' list of those still true.
    The next compile chooses and orders them anew. Returns the block types whose
    content changed."""
    stored = blocks(tx)
    quoted = sorted({mid for b in stored for mid in b.source_ids})
    if not quoted:
        return []
    current = {m.id: m for m in memories(tx, tiers=list(Tier), ids_=quoted)}

    def true_now(m: MemoryView | None) -> bool:
        return m is not None and m.is_live and m.valid_at(at)

    changed: list[str] = []
    for block in stored:
        sources = block.source_ids
        if all(mid not in rewritten and true_now(current.get(mid)) for mid in sources):
            continue
        facts = block.content.split(SEPARATOR) if block.content else []
        # A rules block lists one fact per source, in order (the last may be cut): the
        # facts still true are kept as they stand.
        listed = block.mode == "rules" and len(facts) == len(sources)
        kept_facts: list[str] = []
        kept_ids: list[str] = []
        for n, mid in enumerate(sources):
            memory = current.get(mid)
            if memory is None or not true_now(memory):
                continue
            kept_facts.append(facts[n] if listed and mid not in rewritten
                              else fact_text(memory.content))
            kept_ids.append(mid)
        fitted = fit_facts(kept_facts, len(block.content))
        content = SEPARATOR.join(fitted)
        if content != block.content:
            block.version += 1
            changed.append(block.block_type)
        block.content = content
        block.source_ids = kept_ids[: len(fitted)]
        block.mode = "rules"
    # Sent now, as upsert's are (tests/test_recall_cache.py audits writes by function).
    tx.session.flush()
    return changed
