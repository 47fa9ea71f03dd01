"""Controlled forgetting (AutoMem's task), off unless the operator sets thresholds.

A live hot memory whose relevance is below ``delete_threshold`` is deleted; below
``archive_threshold`` it is archived (moved to the cold tier, kept). Both thresholds
are 0.0 by default, which forgets nothing. Protection is a hard filter, checked
first, and a protected memory is never archived or deleted, whatever its score:

- flagged ``protected``;
- of a protected kind (``decision``, ``insight`` by default);
- importance at or above 0.7;
- younger than the grace period (90 days) at ``as_of``.

A summary that still stands for originals in the cold tier is archived instead of
deleted, so that no original points at a summary that is gone. Deletion removes the
row, its edges and its vector and leaves a tombstone (id, content hash, score,
reason, run). Nothing else is ever deleted by Reverie.

Core Memory blocks quote their source memories. When a forgotten memory feeds a block,
the blocks are compiled again without it and written in the forget's own transaction:
a deleted memory's text never outlives it in a block, not even until the next run.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

from models.config import ConsolidationConfig, ForgetConfig
from models.records import BlockPlan, MemoryView
from models.store import Store
from tasks.blocks import plan_blocks
from tasks.step import Change, StepArgs, StepReport, preview, step_task
from tasks.summarize import summarizer_for

ARCHIVE, DELETE, PROTECTED = "archive", "delete", "protected"


class Decision(NamedTuple):
    memory: MemoryView
    action: str
    reason: str


def protection(memory: MemoryView, as_of: datetime, config: ForgetConfig) -> str | None:
    """Why the memory may not be forgotten, or None if it may."""
    if memory.protected:
        return "flagged protected"
    if memory.kind in config.protected_kinds:
        return f"kind '{memory.kind}' is protected"
    if memory.importance >= config.protected_importance:
        return f"importance {memory.importance:g} >= {config.protected_importance:g}"
    age_days = (as_of - memory.created_at).total_seconds() / 86_400.0
    if age_days < config.grace_period_days:
        return f"{age_days:.1f} days old, inside the {config.grace_period_days:g}-day grace period"
    return None


def plan_forget(
    memories: Sequence[MemoryView],
    standing_for_originals: set[str],
    as_of: datetime,
    config: ForgetConfig,
) -> list[Decision]:
    """What to archive, delete, or keep although its score is low (and why)."""
    out: list[Decision] = []
    for m in memories:
        if not m.is_live or m.relevance is None:
            continue
        if m.relevance < config.delete_threshold:
            action, bound = DELETE, config.delete_threshold
        elif m.relevance < config.archive_threshold:
            action, bound = ARCHIVE, config.archive_threshold
        else:
            continue
        reason = f"relevance {m.relevance:.4f} < {bound:g}"
        shield = protection(m, as_of, config)
        if shield is not None:
            out.append(Decision(m, PROTECTED, shield))
        elif action == DELETE and m.id in standing_for_originals:
            keep_row = "; archived, not deleted: it stands for originals"
            out.append(Decision(m, ARCHIVE, reason + keep_row))
        else:
            out.append(Decision(m, action, reason))
    return out


def blocks_without(
    memories: Sequence[MemoryView],
    forgotten: set[str],
    block_sources: Sequence[Sequence[str]],
    as_of: datetime,
    config: ConsolidationConfig,
) -> tuple[list[BlockPlan], list[str]]:
    """The blocks compiled again without ``forgotten``, if any block quotes one of them
    (else none: blocks that quote nothing forgotten are left as they are)."""
    if not any(forgotten.intersection(ids) for ids in block_sources):
        return [], []
    remaining = [m for m in memories if m.id not in forgotten]
    return plan_blocks(remaining, as_of, config.blocks, summarizer_for(config.summarizer))


def forget(store: Store, args: StepArgs) -> StepReport:
    """Archive or delete the profile's least relevant unprotected memories, if enabled."""
    config = args.config.forget
    memories = store.memories(args.profile)
    decisions = plan_forget(memories, store.superseding_ids(args.profile), args.as_of, config)
    archive = [d.memory.id for d in decisions if d.action == ARCHIVE]
    doomed = [(d.memory.id, float(d.memory.relevance or 0.0), d.reason)
              for d in decisions if d.action == DELETE]
    forgotten = {d.memory.id for d in decisions if d.action in (ARCHIVE, DELETE)}
    blocks, notes = blocks_without(
        memories, forgotten, [b.source_ids for b in store.blocks(args.profile)], args.as_of,
        args.config,
    )
    rewritten = store.forget(
        args.profile, archive, doomed, args.as_of, args.run_id, config.model_dump(), blocks
    )
    report = StepReport("forget", args.profile, examined=len(memories), notes=notes)
    if config.archive_threshold == 0.0 and config.delete_threshold == 0.0:
        report.notes.append("forgetting is off: both thresholds are 0.0")
    elif not any(m.relevance is not None for m in memories):
        report.notes.append("no memory has a relevance score yet: run decay first")
    for d in decisions:
        if d.action == PROTECTED:
            report.skipped += 1
            kept = Change(PROTECTED, d.memory.id, d.reason, preview(d.memory.content))
            report.record(kept, counts=False)
        else:
            verb = "archived" if d.action == ARCHIVE else "deleted"
            report.record(Change(verb, d.memory.id, d.reason, preview(d.memory.content)))
    for block_type in rewritten:
        report.record(Change("recompiled", block_type, "without the memories forgotten"))
    report.facts = {
        "archived": len(archive), "deleted": len(doomed), "protected": report.skipped,
        "blocks_recompiled": len(rewritten),
    }
    return report


forget_task = step_task("forget", forget)
