"""Compression of fading memories (cognitive-memory), a step of full consolidation.

Candidates are live hot memories that are active (not promoted), unprotected, and
whose stored relevance is below ``max_relevance`` (0.20; the decay flow scores it).
Within each kind, memories are taken oldest first as group seeds; a seed gathers
unclaimed candidates at cosine >= ``similarity`` (0.70) to itself, most similar first,
until the group holds ``group_size`` (5); a group that cannot reach that size is not
compressed. Each group becomes one summary: the model's compression (the prompt asks
it to keep names, dates, numbers and preferences) or, without one, ``"Summary: "``
and the members' words joined by ``" | "``; the highest importance, the mean
stability, the highest access count, a fresh embedding, and a provenance link of
weight 0.8 to each original. The originals move to the cold tier, superseded by it.
A group holding an earlier summary stands for that summary's originals instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reverie.models.config import CompressConfig
from reverie.models.records import MemoryView, SummaryPlan
from reverie.models.repositories.memories import snapshot
from reverie.models.repositories.summaries import originals_of
from reverie.models.store import Store
from reverie.models.tables import SUMMARY_ORIGINS, Lifecycle, Origin
from reverie.tasks.decay import relevance_notes
from reverie.engines.similarity import radius_neighbours
from reverie.tasks.step import Change, StepArgs, StepReport, preview, step_task
from reverie.tasks.summarize import (
    Summarizer,
    stand_ins,
    summarizer_for,
    summary_plan,
    write_summaries,
)

OPERATION = Origin.COMPRESSED


def is_candidate(memory: MemoryView, config: CompressConfig) -> bool:
    return (
        memory.is_live
        and memory.lifecycle == Lifecycle.ACTIVE
        and not memory.protected
        and memory.origin != Origin.META_MEMORY
        and memory.relevance is not None
        and memory.relevance < config.max_relevance
    )


def fading_groups(
    memories: Sequence[MemoryView], vectors: np.ndarray, config: CompressConfig
) -> list[list[int]]:
    """Rows grouped greedily around seeds taken oldest first; only full groups."""
    neighbours = radius_neighbours(vectors, config.similarity)
    claimed = np.zeros(len(memories), dtype=bool)
    groups: list[list[int]] = []
    def age_order(i: int) -> tuple[object, str]:
        return memories[i].created_at, memories[i].id

    for seed in sorted(range(len(memories)), key=age_order):
        if claimed[seed]:
            continue
        group = [seed]
        for other in neighbours.indices[seed]:
            if len(group) >= config.group_size:
                break
            if not claimed[other]:
                group.append(int(other))
        if len(group) >= config.group_size:
            claimed[group] = True
            groups.append(group)
    return groups


def rules_wording(members: Sequence[MemoryView]) -> str:
    return "Summary: " + " | ".join(m.content for m in members)


def plan_compression(
    profile: str,
    memories: Sequence[MemoryView],
    vectors: np.ndarray,
    originals: dict[str, list[MemoryView]],
    config: CompressConfig,
    summarizer: Summarizer,
) -> list[SummaryPlan]:
    """One summary plan per full group of fading memories of the same kind."""
    plans: list[SummaryPlan] = []
    rows = [i for i, m in enumerate(memories) if is_candidate(m, config)]
    for kind in sorted({memories[i].kind for i in rows}):
        same_kind = [i for i in rows if memories[i].kind == kind]
        candidates = [memories[i] for i in same_kind]
        for group in fading_groups(candidates, vectors[same_kind], config):
            hot = [candidates[i] for i in group]
            members, _ = stand_ins(hot, originals)
            ordered = sorted(members, key=lambda m: (m.created_at, m.id))
            wording = summarizer.compress(ordered)
            parameters = {
                "max_relevance": config.max_relevance,
                "similarity": config.similarity,
                "group_size": config.group_size,
                "mode": summarizer.mode if wording else "rules",
            }
            plans.append(
                summary_plan(
                    profile, OPERATION, hot, originals, wording or rules_wording(ordered),
                    hot[0], parameters, link_weight=config.link_weight,
                )
            )
    return plans


def nothing_to_compress_note(fading: int, config: CompressConfig) -> list[str]:
    """Why a pass compressed nothing, in the terms of its knobs."""
    if fading < config.group_size:
        return [f"{fading} fading memories (relevance below {config.max_relevance:g}); a "
                f"compression group needs {config.group_size}"]
    return [f"no {config.group_size} of the {fading} fading memories are alike at cosine "
            f">= {config.similarity:g}"]


def compress_fading(store: Store, args: StepArgs) -> StepReport:
    """Replace full groups of similar fading memories by summaries; originals go cold."""
    config = args.config.compress
    with store.reading(args.profile) as tx:
        memories, vectors = snapshot(tx)
        summaries = [m.id for m in memories if m.origin in SUMMARY_ORIGINS]
        originals = originals_of(tx, summaries)
        stale = relevance_notes(tx, args.as_of, any(m.relevance is not None for m in memories))
    summarizer = summarizer_for(args.config.summarizer)
    plans = plan_compression(
        args.profile, memories, vectors, originals,
        config, summarizer,
    )
    report = StepReport(
        "compress_fading", args.profile, examined=sum(is_candidate(m, config) for m in memories)
    )
    report.notes += stale
    if not plans:
        report.notes += nothing_to_compress_note(report.examined, config)
    plans = write_summaries(
        store, args.profile, args.as_of, args.run_id, plans, summarizer, report
    )
    for plan in plans:
        detail = f"{len(plan.member_ids)} fading {plan.kind} memories"
        report.record(Change("compressed", plan.summary_id, detail, preview(plan.content)))
    report.facts = {"groups": len(plans), "archived": sum(len(p.member_ids) for p in plans)}
    return report


compress_fading_task = step_task("compress_fading", compress_fading)
