"""The cold tier's upkeep (cognitive-memory's maintenance tick): cold migration, then
cold TTL expiry. Both are off unless ``config.cold_tier`` sets their days.

*Migration* moves a live hot memory to the cold tier once it has gone unused for
``migrate_after_days`` or more at ``as_of``: days since its last access, or since its
creation if it was never accessed, so an access starts the count again. The memory is
kept whole (archived, found by deep recall and by id) and each move is audited with
the memory's prior state, so ``reverie undo <consolidation id>`` brings it back to hot;
a memory whose move an operator undid is not moved again. Never migrated: memories
flagged ``protected``, and promoted ones (Reverie's counterpart of cognitive-memory's
core memories, which it exempts).

cognitive-memory migrates a memory after ``cold_migration_days`` (7) consecutive daily
ticks with its retention at its floor (0.02), which its own per-category decay model
decides; an access lifts retention off the floor and restarts the count. Reverie has
no such floor, and counts a tick's state nowhere (a run is a pure function of the store
and ``as_of``), so it counts days unused instead.

*Expiry* turns a memory that has been cold for ``ttl_days`` or more at ``as_of``
(cognitive-memory's ``cold_storage_ttl_days``, 180) into a tombstone: the row, its
vector and its edges go; the tombstone keeps its id, external id, content hash and a
reason naming its dates (created, last used, cold since), and the audit row keeps the
dates as data. Where cognitive-memory's stub keeps the first 200 characters, Reverie
keeps none: expiry is deletion, and no text outlives it (a Core Memory block quoting an
expired memory is compiled again without it, in the same transaction). "Cold since" is
the date of the decision that last moved the memory to cold (a migration, a forget's
archiving, a summary superseding it), read from the audit. Never expired: memories
flagged ``protected``; originals a summary stands for (undoing that summary needs them,
and the summary already holds what they said); summaries standing for cold originals
(the originals would point at nothing); and memories whose move to cold is not on
record. Expiry deletes, so it is approved: a run that is not (the flow's
``auto_approve_expiry``) lists what it would expire and expires nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import NamedTuple

from reverie.models.config import ColdTierConfig
from reverie.models.records import MemoryView
from reverie.models.repositories.blocks import blocks as blocks_of
from reverie.models.repositories.forgetting import (
    cold_since,
    forget,
    migrate_to_cold,
    superseding_ids,
    undone_migrations,
)
from reverie.models.repositories.memories import memories as memories_of
from reverie.models.store import Store
from reverie.models.tables import Lifecycle, Operation, Tier
from reverie.models.timestamps import days_between
from reverie.tasks.forget import blocks_without
from reverie.tasks.step import Change, StepArgs, StepReport, preview, preview_chars, step_task


class Action(StrEnum):
    MIGRATE = "migrated"
    EXPIRE = "expired"
    # Past the threshold, and kept: protected, or as the reason says.
    EXEMPT = "exempt"
    # Past the TTL, and kept: the run was not approved to expire.
    NOT_APPROVED = "not approved"


class Decision(NamedTuple):
    memory: MemoryView
    action: Action
    reason: str


def days_unused(memory: MemoryView, as_of: datetime) -> float:
    """Days from the memory's last use (its last access, else its creation) to as_of."""
    used = memory.last_accessed_at or memory.created_at
    return days_between(used, as_of)


def plan_migration(
    memories: Sequence[MemoryView],
    as_of: datetime,
    config: ColdTierConfig,
    undone: frozenset[str] | set[str] = frozenset(),
) -> list[Decision]:
    """The live hot memories unused for ``migrate_after_days`` or more, each migrated
    or exempt (and why); ``undone``: memories whose earlier move an operator undid."""
    if config.migrate_after_days is None:
        return []
    out: list[Decision] = []
    for m in memories:
        if not m.is_live:
            continue
        idle = days_unused(m, as_of)
        if idle < config.migrate_after_days:
            continue
        reason = f"unused for {idle:.1f} days >= {config.migrate_after_days:g}"
        if m.protected:
            out.append(Decision(m, Action.EXEMPT, "flagged protected"))
        elif m.lifecycle == Lifecycle.PROMOTED:
            out.append(Decision(m, Action.EXEMPT, "promoted"))
        elif m.id in undone:
            out.append(Decision(m, Action.EXEMPT, reason + "; its migration was undone"))
        else:
            out.append(Decision(m, Action.MIGRATE, reason))
    return out


def plan_expiry(
    memories: Sequence[MemoryView],
    cold_since: Mapping[str, datetime],
    standing_for_originals: set[str] | frozenset[str],
    as_of: datetime,
    config: ColdTierConfig,
    approved: bool = True,
) -> list[Decision]:
    """The cold memories cold for ``ttl_days`` or more, each expired, exempt or (in a
    run not approved to expire) kept, and why; a cold memory whose move to cold is not
    on record is listed as exempt."""
    if config.ttl_days is None:
        return []
    out: list[Decision] = []
    for m in memories:
        if m.tier != Tier.COLD:
            continue
        since = cold_since.get(m.id)
        if since is None:
            out.append(Decision(m, Action.EXEMPT, "no record of when it went cold"))
            continue
        cold_days = days_between(since, as_of)
        if cold_days < config.ttl_days:
            continue
        reason = (f"cold for {cold_days:.1f} days >= {config.ttl_days:g} (cold since "
                  f"{_day(since)}; created {_day(m.created_at)}, last used "
                  f"{_day(m.last_accessed_at) if m.last_accessed_at else 'never'})")
        if m.protected:
            out.append(Decision(m, Action.EXEMPT, "flagged protected"))
        elif m.superseded_by is not None:
            out.append(Decision(m, Action.EXEMPT, f"an original {m.superseded_by} stands for"))
        elif m.id in standing_for_originals:
            out.append(Decision(m, Action.EXEMPT, "it stands for originals in the cold tier"))
        elif not approved:
            out.append(Decision(m, Action.NOT_APPROVED, reason + "; expiry not approved"))
        else:
            out.append(Decision(m, Action.EXPIRE, reason))
    return out


def _day(at: datetime) -> str:
    return at.date().isoformat()


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def _record(report: StepReport, decisions: Sequence[Decision]) -> None:
    chars = preview_chars()
    for d in decisions:
        done = d.action in (Action.MIGRATE, Action.EXPIRE)
        report.skipped += int(d.action == Action.EXEMPT)
        report.record(
            Change(d.action.value, d.memory.id, d.reason, preview(d.memory.content, chars)),
            counts=done)


def migrate_cold(store: Store, args: StepArgs) -> StepReport:
    """Move the profile's long-unused, unprotected memories to the cold tier (undoable)."""
    config = args.config.cold_tier
    with args.reading(store) as tx:
        memories = memories_of(tx)
        undone = undone_migrations(tx) if config.migrate_after_days else set()
        block_sources = [b.source_ids for b in blocks_of(tx)]
    decisions = plan_migration(memories, args.as_of, config, undone)
    moved = [d.memory.id for d in decisions if d.action == Action.MIGRATE]
    blocks, notes = blocks_without(
        memories, set(moved), block_sources, args.as_of,
        args.config) if moved else ([], [])
    with args.writing(store) as tx:
        rewritten = migrate_to_cold(
            tx, moved, args.as_of, args.run_id, {"cold_tier": config.model_dump()}, blocks)
    report = StepReport("migrate_cold", args.profile, examined=len(memories), notes=notes)
    if config.migrate_after_days is None:
        report.notes.append("cold migration is off: cold_tier.migrate_after_days is empty")
    _record(report, decisions)
    for block_type in rewritten:
        report.record(Change("recompiled", block_type, "without the memories migrated"))
    report.facts = {"migrated": len(moved), "exempt": report.skipped,
                    "blocks_recompiled": len(rewritten)}
    return report


def expire_cold(store: Store, args: StepArgs, approved: bool = True) -> StepReport:
    """Turn the profile's memories cold for longer than the TTL into tombstones."""
    config = args.config.cold_tier
    with args.reading(store) as tx:
        cold = memories_of(tx, (Tier.COLD,)) if config.ttl_days is not None else []
        since = cold_since(tx) if cold else {}
        superseding = superseding_ids(tx) if cold else set()
        hot = memories_of(tx) if cold else []
        block_sources = [b.source_ids for b in blocks_of(tx)] if cold else []
    decisions = plan_expiry(cold, since, superseding, args.as_of, config, approved)
    doomed = [d for d in decisions if d.action == Action.EXPIRE]
    rewritten: list[str] = []
    notes: list[str] = []
    if doomed:
        blocks, notes = blocks_without(
            hot, {d.memory.id for d in doomed}, block_sources, args.as_of, args.config)
        dates = {d.memory.id: {
            "external_id": d.memory.external_id, "created_at": _iso(d.memory.created_at),
            "last_accessed_at": _iso(d.memory.last_accessed_at),
            "cold_since": _iso(since[d.memory.id]),
        } for d in doomed}
        with args.writing(store) as tx:
            rewritten = forget(
                tx, [], [(d.memory.id, d.memory.relevance, d.reason) for d in doomed],
                args.as_of, args.run_id, {"cold_tier": config.model_dump(), "expired": dates},
                blocks, operation=Operation.EXPIRE_COLD)
    report = StepReport("expire_cold", args.profile, examined=len(cold), notes=notes)
    if config.ttl_days is None:
        report.notes.append("cold expiry is off: cold_tier.ttl_days is empty")
    unapproved = sum(d.action == Action.NOT_APPROVED for d in decisions)
    if unapproved:
        report.notes.append(f"{unapproved} cold memories past the TTL kept: expiry was not "
                            "approved (auto_approve_expiry)")
    _record(report, decisions)
    for block_type in rewritten:
        report.record(Change("recompiled", block_type, "without the memories expired"))
    report.facts = {"expired": len(doomed), "exempt": report.skipped,
                    "not_approved": unapproved, "blocks_recompiled": len(rewritten)}
    return report


def expire_cold_unapproved(store: Store, args: StepArgs) -> StepReport:
    """List the memories cold for longer than the TTL; expire none (not approved)."""
    return expire_cold(store, args, approved=False)


migrate_cold_task = step_task("migrate_cold", migrate_cold)
expire_cold_task = step_task("expire_cold", expire_cold)
expire_cold_unapproved_task = step_task("expire_cold", expire_cold_unapproved)
