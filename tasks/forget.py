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

A run may be told which memories it may delete (those an operator approved, see
flows/forget.py): a memory selected for deletion but not among them is archived if it
is also below ``archive_threshold``, else kept, and the report says why. Every
deletion, done or planned, is listed in the report's ``deletions`` table (Reverie's id
beside the caller's external id), which is what an approval is asked for.

Core Memory blocks quote their source memories. When a forgotten memory feeds a block,
the blocks are compiled again without it and written in the forget's own transaction:
a deleted memory's text never outlives it in a block, not even until the next run.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple

from prefect import Task

from models.config import ConsolidationConfig, ForgetConfig
from models.records import BlockPlan, MemoryView
from models.store import Store
from tasks.blocks import plan_blocks
from tasks.step import Change, StepArgs, StepBatch, StepReport, preview, step_task
from tasks.summarize import summarizer_for


class Action(StrEnum):
    ARCHIVE = "archive"
    DELETE = "delete"
    PROTECTED = "protected"
    # Selected for deletion, not approved for it, and not low enough to archive: kept.
    NOT_APPROVED = "not approved"


ARCHIVE, DELETE, PROTECTED, NOT_APPROVED = (
    Action.ARCHIVE, Action.DELETE, Action.PROTECTED, Action.NOT_APPROVED)


class Decision(NamedTuple):
    memory: MemoryView
    action: Action
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
    deletable: Collection[str] | None = None,
) -> list[Decision]:
    """What to archive, delete, or keep although its score is low (and why).
    ``deletable``: the only memories that may be deleted (None: any the thresholds
    select)."""
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
        elif action == DELETE and deletable is not None and m.id not in deletable:
            # Selected since the approval was asked (a newer score, a new profile):
            # no one approved deleting it, so it gets what archiving alone would do.
            unapproved = "; its deletion was not approved"
            if m.relevance < config.archive_threshold:
                out.append(Decision(m, ARCHIVE, reason + unapproved + ", archived"))
            else:
                out.append(Decision(m, NOT_APPROVED, reason + unapproved + ", kept"))
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


def forget(
    store: Store, args: StepArgs, deletable: Collection[str] | None = None
) -> StepReport:
    """Archive or delete the profile's least relevant unprotected memories, if enabled
    (deleting only ``deletable`` when given)."""
    config = args.config.forget
    memories = store.memories(args.profile)
    decisions = plan_forget(
        memories, store.superseding_ids(args.profile), args.as_of, config, deletable)
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
    unapproved = sum(d.action == NOT_APPROVED for d in decisions)
    if unapproved:
        report.notes.append(f"{unapproved} memories below the delete threshold kept: "
                            "their deletion was not approved")
    for d in decisions:
        if d.action in (PROTECTED, NOT_APPROVED):
            report.skipped += int(d.action == PROTECTED)
            kept = Change(d.action.value, d.memory.id, d.reason, preview(d.memory.content))
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
    if doomed:
        report.tables["deletions"] = [
            deletion_row(args.profile, d) for d in decisions if d.action == DELETE]
    return report


def deletion_row(profile: str, decision: Decision) -> dict[str, Any]:
    """One deletion as the ``deletions`` table lists it (content as a preview only)."""
    m = decision.memory
    return {
        "profile": profile, "id": m.id, "external_id": m.external_id or "",
        "kind": m.kind, "relevance": round(float(m.relevance or 0.0), 4),
        "content": preview(m.content) or "",
    }


forget_task = step_task("forget", forget)


def forget_task_deleting(
    deletable: frozenset[str] | None,
) -> Task[[StepBatch, Sequence[list[StepReport]]], list[StepReport]]:
    """The forget task, deleting only the memories in ``deletable`` (an approved list of
    ids); None: the plain task, deleting whatever the thresholds select."""
    if deletable is None:
        return forget_task

    def forget_approved(store: Store, args: StepArgs) -> StepReport:
        """Archive or delete the profile's least relevant unprotected memories, deleting
        only those whose deletion was approved."""
        return forget(store, args, deletable)

    return step_task("forget", forget_approved)
