"""Consolidation of cold notes (linksee's sleep-mode ``consolidate``), and what follows it.

Candidates are live, unprotected memories of the layers ``context``, ``emotion`` and
``implementation`` that name an entity, are at least ``min_age_days`` old (7; 0 right
after a bulk import) and are cold: heat < 30 on linksee's heat index (0-100)::

    heat = min(3 * accesses in the last 30 days, 30)
         + min(accesses in the last 90 days, 20)
         + recency (+20 if accessed within 7 days, +10 within 30, 0 within 90, -10 after)
         + min(0.5 * accesses, 15)
         + 15 * importance

(as linksee, all accesses count as recent when the last one is). They are grouped by
(entity, layer); each group of at least 2 becomes one protected ``learning``-layer
memory that says every note whole, grouped by day as a compression does
(``tasks.compress.rules_wording``), with linksee's top 3 exemplars by importance (200
characters each), the period covered, the count and the replaced ids in its metadata.
With a model configured (linksee's ``use_llm``; ``config.summarizer``), the model words
it instead, checked like every wording, the rules' text staying where it gives none.
Unlike linksee, which deletes the originals, Reverie supersedes them into the cold tier,
so the step can be undone.

``scope`` is ``all`` or ``session`` (only one session's memories). The flow follows
with the forget sweep and stalled detection: unprotected ``in_progress`` memories
untouched for 30 days or more become ``stalled``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from reverie.engines.wording import Summarizer
from reverie.models.config import ColdConfig
from reverie.models.records import MemoryView, SummaryPlan
from reverie.models.repositories.memories import memories as memories_of
from reverie.models.repositories.memories import set_statuses
from reverie.models.repositories.summaries import originals_of, undone_summaries
from reverie.models.store import Store
from reverie.models.tables import SUMMARY_ORIGINS, Origin
from reverie.models.timestamps import days_between
from reverie.tasks.compress import rules_wording
from reverie.tasks.step import Change, StepArgs, StepReport, preview, preview_chars, step_task
from reverie.tasks.summaries import reworded, summary_plan, write_summaries

OPERATION = Origin.COLD_LEARNING
LEARNING_LAYER = "learning"
LEARNING_KIND = "insight"
IN_PROGRESS, STALLED = "in_progress", "stalled"
# Why a learning memory's notes were grouped (its audit's ``rule``; ``heats`` holds each
# note's heat at as_of). Notes group by what they are about, not by similarity.
RULE = ("cold notes: one entity and layer, at least min_age_days old, heat below max_heat")


def heat(access_count: int, days_since_access: float, importance: float) -> float:
    """linksee's heat index of a memory, 0 (frozen) to 100 (hot)."""
    in_30 = access_count if days_since_access < 30 else 0
    in_90 = access_count if days_since_access < 90 else 0
    if days_since_access <= 7:
        recency = 20.0
    elif days_since_access <= 30:
        recency = 10.0
    elif days_since_access <= 90:
        recency = 0.0
    else:
        recency = -10.0
    score = (
        min(in_30 * 3, 30) + min(in_90, 20) + recency + min(access_count * 0.5, 15)
        + importance * 15
    )
    return max(0.0, min(100.0, score))


def days_untouched(memory: MemoryView, as_of: datetime) -> float:
    touched = memory.last_accessed_at or memory.created_at
    return days_between(touched, as_of)


def is_candidate(memory: MemoryView, as_of: datetime, config: ColdConfig) -> bool:
    return (
        memory.is_live
        and not memory.protected
        and memory.layer in config.layers
        and memory.entity is not None
        and (config.scope == "all" or memory.session_id == config.session_id)
        and memory.created_at <= as_of - timedelta(days=config.min_age_days)
        and heat(memory.access_count, days_untouched(memory, as_of), memory.importance)
        < config.max_heat
    )


def _fragment(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def learning_plan(
    profile: str,
    group: Sequence[MemoryView],
    config: ColdConfig,
    originals: dict[str, list[MemoryView]] | None = None,
    as_of: datetime | None = None,
) -> SummaryPlan:
    """The protected learning memory standing for one (entity, layer) group; a summary
    in the group is absorbed, and the learning memory stands for its ``originals``.
    Its audit says why (``rule``) and, given ``as_of``, each note's heat then."""
    first = group[0]
    best = sorted(group, key=lambda m: (-m.importance, m.created_at, m.id))[: config.exemplars]
    exemplars = [
        {"fragment": _fragment(m.content, config.exemplar_chars),
         "when": m.created_at.date().isoformat(), "importance": m.importance}
        for m in best
    ]
    period = {
        "from": min(m.created_at for m in group).date().isoformat(),
        "to": max(m.created_at for m in group).date().isoformat(),
    }
    # Every note is said whole, by day (the exemplars are linksee's quotes, kept in the
    # metadata): a learning memory stands for its notes in the hot tier, so it must say
    # what each of them said. The header names the entity, so the digest does not.
    header = (f"{len(group)} {first.layer} notes on {first.entity} from {period['from']} "
              f"to {period['to']}: ")
    digest = rules_wording(group, lead=False)
    meta = {
        "original_layer": first.layer,
        "count": len(group),
        "period": period,
        "exemplars": exemplars,
        "replaced_ids": sorted(m.external_id or m.id for m in group),
    }
    importance = max(sum(m.importance for m in group) / len(group), config.min_importance)
    parameters: dict[str, object] = {
        "rule": RULE, "same": ["entity", "layer"], "min_age_days": config.min_age_days,
        "max_heat": config.max_heat, "scope": config.scope, "mode": "rules"}
    if as_of is not None:
        parameters["heats"] = {
            m.id: round(heat(m.access_count, days_untouched(m, as_of), m.importance), 4)
            for m in sorted(group, key=lambda m: m.id)
        }
    # A model words it from the group as it reads today: an absorbed summary speaks for
    # its own originals.
    notes = sorted(group, key=lambda m: (m.origin not in SUMMARY_ORIGINS, m.id))
    return summary_plan(
        profile, OPERATION, group, originals or {}, header + digest.text, first, parameters,
        layer=LEARNING_LAYER, kind=LEARNING_KIND, protected=True, importance=importance,
        meta=meta, sources=tuple(notes), gist=header + digest.gist,
    )


def word_learning(plan: SummaryPlan, summarizer: Summarizer) -> SummaryPlan:
    """linksee's ``use_llm``: the model words each learning memory from its notes,
    checked as every wording is; where it gives none, the rules' exemplars stay."""
    text = summarizer.compress(plan.sources) if plan.sources else None
    return plan if text is None else reworded(plan, text, summarizer.mode)


def plan_cold(
    profile: str,
    memories: Sequence[MemoryView],
    as_of: datetime,
    config: ColdConfig,
    originals: dict[str, list[MemoryView]] | None = None,
) -> list[SummaryPlan]:
    """One learning memory per (entity, layer) group of at least ``min_group_size``."""
    groups: dict[tuple[str, str], list[MemoryView]] = {}
    for m in sorted(memories, key=lambda m: (m.created_at, m.id)):
        if is_candidate(m, as_of, config):
            # A candidate has an entity and a layer (is_candidate).
            groups.setdefault((m.entity, m.layer), []).append(m)  # type: ignore[arg-type]
    return [
        learning_plan(profile, group, config, originals, as_of)
        for _, group in sorted(groups.items())
        if len(group) >= config.min_group_size
    ]


def plan_stalled(
    memories: Sequence[MemoryView], as_of: datetime, config: ColdConfig
) -> list[MemoryView]:
    """In-progress live memories untouched for ``stalled_after_days`` or more."""
    return [
        m for m in memories
        # linksee's sweep leaves protected memories alone: a pinned goal is never stalled.
        if m.is_live and m.status == IN_PROGRESS and not m.protected
        and (config.scope == "all" or m.session_id == config.session_id)
        and days_untouched(m, as_of) >= config.stalled_after_days
    ]


def consolidate_cold(store: Store, args: StepArgs) -> StepReport:
    """Replace each (entity, layer) group of cold notes by one protected learning memory."""
    config = args.config.cold
    with args.reading(store) as tx:
        memories = memories_of(tx)
        summaries = [m.id for m in memories if m.origin in SUMMARY_ORIGINS and m.is_live]
        originals = originals_of(tx, summaries)
        vetoed = undone_summaries(tx)
    plans = plan_cold(args.profile, memories, args.as_of, config, originals)
    report = StepReport(
        "consolidate_cold", args.profile,
        examined=sum(is_candidate(m, args.as_of, config) for m in memories),
    )
    plans = write_summaries(store, args, plans, vetoed, word_learning, report)
    for plan in plans:
        detail = (f"{len(plan.member_ids)} {plan.meta['original_layer']} notes on "
                  f"{plan.entity} ({plan.meta['period']['from']} to {plan.meta['period']['to']})")
        report.record(Change("consolidated", plan.summary_id, detail, preview(plan.content)))
    report.facts = {"groups": len(plans), "archived": sum(len(p.member_ids) for p in plans)}
    return report


def mark_stalled(store: Store, args: StepArgs) -> StepReport:
    """Mark in-progress memories nobody has touched for a month as stalled."""
    with args.reading(store) as tx:
        memories = memories_of(tx)
    stalled = plan_stalled(memories, args.as_of, args.config.cold)
    with args.writing(store) as tx:
        set_statuses(tx, [(m.id, STALLED) for m in stalled])
    report = StepReport("mark_stalled", args.profile, examined=len(memories))
    chars = preview_chars()
    for m in stalled:
        detail = f"in progress, untouched for {days_untouched(m, args.as_of):.0f} days"
        report.record(Change("stalled", m.id, detail, preview(m.content, chars)))
    return report


consolidate_cold_task = step_task("consolidate_cold", consolidate_cold)
mark_stalled_task = step_task("mark_stalled", mark_stalled)
