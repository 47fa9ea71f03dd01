"""Controlled forgetting, off unless the operator turns it on; two policies.

``thresholds`` (AutoMem's task, the default): a live hot memory whose relevance is
below ``delete_threshold`` is deleted; below ``archive_threshold`` it is archived
(moved to the cold tier, kept). Both thresholds are 0.0 by default, which forgets
nothing.

``risk`` (linksee's forget sweep, which follows its cold consolidation): each live hot
memory's forgetting risk, from its heat, importance, idle days and layer::

    risk = (1 - heat / 100) * (1 - importance) * d * (1 + d / 30)

with ``d`` the days since its last access (or creation) at ``as_of`` and ``heat``
linksee's heat index (tasks/cold_notes.py), and risk 0 for the exempt layers (goal; caveat,
which linksee protects when storing it). Risk at or above 50 archives (linksee
compresses), at or above 200 deletes (linksee drops). The delete level deletes only
while ``delete_threshold`` is above 0.0, the switch the flows ask approval on;
otherwise such a memory is archived. linksee's sweep only drops; Reverie archives
what it would compress, since the cold tier keeps it findable and undoable.

Under both policies protection is a hard filter, checked first, and a protected
memory is never archived or deleted, whatever its score or risk:

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

from reverie.engines.wording import summarizer_for
from reverie.models.config import ConsolidationConfig, ForgetConfig
from reverie.models.records import BlockPlan, MemoryView
from reverie.models.repositories.blocks import blocks as blocks_of
from reverie.models.repositories.forgetting import Spared, below_relevance, superseding_ids
from reverie.models.repositories.forgetting import forget as forget_memories
from reverie.models.repositories.memories import hot_count
from reverie.models.repositories.memories import memories as memories_of
from reverie.models.store import Store
from reverie.models.timestamps import days_between
from reverie.tasks.blocks import compiled
from reverie.tasks.cold_notes import days_untouched, heat
from reverie.tasks.decay import relevance_notes
from reverie.tasks.step import (
    Change,
    StepArgs,
    StepReport,
    preview,
    preview_chars,
    step_task,
)


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
    # The forgetting risk under policy 'risk' (None under 'thresholds').
    risk: float | None = None


def forgetting_risk(
    heat_score: float, importance: float, days_since_access: float, layer: str | None,
    config: ForgetConfig,
) -> float:
    """linksee's forgetting risk, 0 upwards: high for cold, unimportant, long idle memories.
    Exempt layers have none; a memory touched at or after as_of (a backfill) has none."""
    if layer in config.risk_exempt_layers:
        return 0.0
    days = max(days_since_access, 0.0)
    time_factor = days * (1.0 + days / config.risk_time_scale_days)
    return (1.0 - heat_score / 100.0) * (1.0 - importance) * time_factor


def risk_action(risk: float, config: ForgetConfig) -> Action | None:
    """What a risk calls for, by linksee's levels (both inclusive): delete, archive, or
    nothing (None)."""
    if risk >= config.risk_delete_at:
        return DELETE
    if risk >= config.risk_archive_at:
        return ARCHIVE
    return None


class Risk(NamedTuple):
    """A memory's forgetting risk and what it was computed from."""

    risk: float
    heat: float
    days: float

    def explain(self, memory: MemoryView) -> str:
        return (f"heat {self.heat:.1f}, importance {memory.importance:g}, "
                f"{self.days:.1f} days idle, layer {memory.layer or '-'}")


def assess(memory: MemoryView, as_of: datetime, config: ForgetConfig) -> Risk:
    days = days_untouched(memory, as_of)
    hotness = heat(memory.access_count, days, memory.importance)
    return Risk(forgetting_risk(hotness, memory.importance, days, memory.layer, config),
                hotness, days)


def protection(memory: MemoryView, as_of: datetime, config: ForgetConfig) -> str | None:
    """Why the memory may not be forgotten, or None if it may."""
    if memory.protected:
        return "flagged protected"
    if memory.kind in config.protected_kinds:
        return f"kind '{memory.kind}' is protected"
    if memory.importance >= config.protected_importance:
        return f"importance {memory.importance:g} >= {config.protected_importance:g}"
    age_days = days_between(memory.created_at, as_of)
    if age_days < config.grace_period_days:
        return f"{age_days:.1f} days old, inside the {config.grace_period_days:g}-day grace period"
    return None


def spared_reason(group: Spared, config: ForgetConfig) -> str:
    """Why the memories of ``group`` may not be forgotten: the first rule of
    ``protection`` that shields them all."""
    if group.flagged:
        return "flagged protected"
    if group.kind is not None:
        return f"kind '{group.kind}' is protected"
    if group.important:
        return f"importance >= {config.protected_importance:g}"
    return f"inside the {config.grace_period_days:g}-day grace period"


def spared_counts(groups: Sequence[Spared], config: ForgetConfig) -> dict[str, int]:
    """How many protected memories each reason spared, in ``protection``'s order of
    rules (kinds by name)."""
    counts: dict[str, int] = {}
    for group in sorted(groups, key=lambda g: (not g.flagged, g.kind is None, g.kind or "",
                                               not g.important)):
        reason = spared_reason(group, config)
        counts[reason] = counts.get(reason, 0) + group.count
    return counts


def plan_forget(
    memories: Sequence[MemoryView],
    standing_for_originals: set[str],
    as_of: datetime,
    config: ForgetConfig,
    deletable: Collection[str] | None = None,
) -> list[Decision]:
    """What to archive, delete, or keep although its score is low (and why), by the
    configured policy. ``deletable``: the only memories that may be deleted (None: any
    the policy selects)."""
    if config.policy == "risk":
        return plan_forget_by_risk(memories, standing_for_originals, as_of, config, deletable)
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


def plan_forget_by_risk(
    memories: Sequence[MemoryView],
    standing_for_originals: set[str],
    as_of: datetime,
    config: ForgetConfig,
    deletable: Collection[str] | None = None,
) -> list[Decision]:
    """linksee's forget sweep: archive or delete each unprotected live memory by its
    forgetting risk. Protection is decided first and the risk cannot overturn it; a
    protected memory's risk is computed only to list it, as the thresholds policy lists
    the protected memories it would otherwise have forgotten."""
    deleting = config.delete_threshold > 0.0
    out: list[Decision] = []
    for m in memories:
        if not m.is_live or m.layer in config.risk_exempt_layers:
            continue
        shield = protection(m, as_of, config)
        assessed = assess(m, as_of, config)
        action = risk_action(assessed.risk, config)
        if action is None:
            continue
        level = config.risk_delete_at if action == DELETE else config.risk_archive_at
        reason = (f"risk {assessed.risk:.2f} >= {level:g} (policy risk: "
                  f"{assessed.explain(m)})")
        if shield is not None:
            out.append(Decision(m, PROTECTED, f"{shield}; risk {assessed.risk:.2f}",
                                assessed.risk))
        elif action == DELETE and not deleting:
            out.append(Decision(m, ARCHIVE, reason + "; archived, not deleted: "
                                "delete_threshold is 0.0", assessed.risk))
        elif action == DELETE and m.id in standing_for_originals:
            out.append(Decision(m, ARCHIVE, reason + "; archived, not deleted: it "
                                "stands for originals", assessed.risk))
        elif action == DELETE and deletable is not None and m.id not in deletable:
            # Past the delete level is past the archive level: archived, as a run
            # without deletion would.
            out.append(Decision(m, ARCHIVE, reason + "; its deletion was not approved, "
                                "archived", assessed.risk))
        else:
            out.append(Decision(m, action, reason, assessed.risk))
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
    return compiled(remaining, as_of, config.blocks, summarizer_for(config.summarizer))


def forget(
    store: Store, args: StepArgs, deletable: Collection[str] | None = None
) -> StepReport:
    """Archive or delete the profile's least relevant (policy 'risk': most at risk)
    unprotected memories, if enabled (deleting only ``deletable`` when given)."""
    config = args.config.forget
    # The thresholds policy can only select live unprotected memories scored below a
    # threshold: only those are read, and the protected ones below it only counted, so
    # a run costs what it forgets, not the profile's size.
    below = None if config.policy == "risk" else max(config.archive_threshold,
                                                     config.delete_threshold)
    spared: dict[str, int] = {}
    with args.reading(store) as tx:
        hot, scored = hot_count(tx)
        if below is None:
            memories = memories_of(tx)
        else:
            memories, groups = below_relevance(tx, below, args.as_of, config)
            spared = spared_counts(groups, config)
        # Only a deletion asks whether a memory stands for originals, and only a memory
        # forgotten whether a block quotes it: a run that can do neither skips the reads.
        superseding = superseding_ids(tx) if config.delete_threshold > 0.0 else set()
        block_sources = [b.source_ids for b in blocks_of(tx)] if memories else []
        stale = relevance_notes(tx, args.as_of, scored, args.config.decay)
    decisions = plan_forget(memories, superseding, args.as_of, config, deletable)
    archive = [d.memory.id for d in decisions if d.action == ARCHIVE]
    doomed = [(d.memory.id, tombstone_score(d), d.reason)
              for d in decisions if d.action == DELETE]
    forgotten = {d.memory.id for d in decisions if d.action in (ARCHIVE, DELETE)}
    if below is not None and any(forgotten.intersection(ids) for ids in block_sources):
        with args.reading(store) as tx:
            memories = memories_of(tx)  # blocks are compiled from the whole profile
    blocks, notes = blocks_without(memories, forgotten, block_sources, args.as_of, args.config)
    rewritten: list[str] = []
    if archive or doomed:
        with args.writing(store) as tx:
            rewritten = forget_memories(
                tx, archive, doomed, args.as_of, args.run_id, config.model_dump(), blocks
            )
    report = StepReport("forget", args.profile, examined=hot, notes=notes)
    if config.policy == "risk":
        report.notes.append(
            f"policy risk (linksee's forget sweep): archive at risk >= "
            f"{config.risk_archive_at:g}, delete at >= {config.risk_delete_at:g}"
            + ("" if config.delete_threshold > 0.0 else
               " (deletion off, delete_threshold 0.0: archived instead)"))
    elif config.archive_threshold == 0.0 and config.delete_threshold == 0.0:
        report.notes.append("forgetting is off: both thresholds are 0.0")
    else:
        report.notes += stale
    unapproved = sum(d.action == NOT_APPROVED for d in decisions)
    if unapproved:
        report.notes.append(f"{unapproved} memories below the delete threshold kept: "
                            "their deletion was not approved")
    chars = preview_chars()

    def listed(d: Decision) -> Change:
        verb = {ARCHIVE: "archived", DELETE: "deleted"}.get(d.action, d.action.value)
        return Change(verb, d.memory.id, d.reason, preview(d.memory.content, chars))

    # Memories kept (protected, not approved) are listed but not counted as changes; the
    # protected ones the thresholds policy only counted, one line per reason, first so
    # that the listing limit never hides them. Lines are built only for what the report
    # lists.
    for reason, count in spared.items():
        report.record(Change("protected", f"{count} memor{'y' if count == 1 else 'ies'}",
                             f"{reason}; relevance below {below:g}, kept"), counts=False)
    report.skipped += sum(spared.values()) + sum(d.action == PROTECTED for d in decisions)
    report.tally(sum(d.action in (ARCHIVE, DELETE) for d in decisions), map(listed, decisions))
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


def tombstone_score(decision: Decision) -> float:
    """The score a deletion's tombstone keeps: the risk that decided it, or the
    relevance."""
    if decision.risk is not None:
        return decision.risk
    return float(decision.memory.relevance or 0.0)


def deletion_row(profile: str, decision: Decision) -> dict[str, Any]:
    """One deletion as the ``deletions`` table lists it (content as a preview only);
    under policy 'risk' with the risk that decided it."""
    m = decision.memory
    row: dict[str, Any] = {
        "profile": profile, "id": m.id, "external_id": m.external_id or "",
        "kind": m.kind, "relevance": round(float(m.relevance or 0.0), 4),
    }
    if decision.risk is not None:
        row |= {"policy": "risk", "risk": round(decision.risk, 2)}
    return row | {"content": preview(m.content) or ""}


forget_task = step_task("forget", forget)


def forget_task_deleting(
    deletable: frozenset[str] | None,
) -> Task[..., list[StepReport]]:
    """The forget task, deleting only the memories in ``deletable`` (an approved list of
    ids); None: the plain task, deleting whatever the thresholds select."""
    if deletable is None:
        return forget_task

    def forget_approved(store: Store, args: StepArgs) -> StepReport:
        """Archive or delete the profile's least relevant unprotected memories, deleting
        only those whose deletion was approved."""
        return forget(store, args, deletable)

    return step_task("forget", forget_approved)
