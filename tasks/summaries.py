"""Summary plans: what a summary stands for, and how the plans that survive the
operator's vetoes are worded, embedded and written.

A summary always stands for originals (``stand_ins``: an earlier summary in a group is
replaced by what it stood for) and takes the strongest of their attributes
(``merged_attributes``). ``write_summaries`` is the tail every summarizing step shares:
drop the plans an operator vetoed by undoing them, have the summarizer reword only what
is left, embed the texts worded afresh, and write it all in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from reverie.engines.background_embedding import BackgroundEmbedding
from reverie.engines.embedding import embedder_for
from reverie.engines.wording import Summarizer, fallback_notes, summarizer_for
from reverie.models import ids
from reverie.models.records import MemoryView, MetaPlan, SummaryPlan
from reverie.models.repositories.memories import ingested_since
from reverie.models.repositories.summaries import apply_summaries
from reverie.models.store import ProfileTx, Store
from reverie.models.tables import SUMMARY_ORIGINS
from reverie.tasks.step import Change, StepArgs, StepReport


def merged_attributes(memories: Sequence[MemoryView]) -> dict[str, object]:
    """Attributes of a summary of ``memories``: the strongest importance, trust and use,
    the mean stability, and the widest span of time and validity."""
    starts = [m.valid_from for m in memories]
    ends = [m.valid_until for m in memories]
    accessed = [m.last_accessed_at for m in memories if m.last_accessed_at is not None]
    return {
        "importance": max(m.importance for m in memories),
        "confidence": max(m.confidence for m in memories),
        "stability": sum(m.stability for m in memories) / len(memories),
        "access_count": max(m.access_count for m in memories),
        "created_at": min(m.created_at for m in memories),
        "last_accessed_at": max(accessed) if accessed else None,
        # Open-ended if any member is: the summary is valid wherever one of them was.
        # (min and max only see lists without None: the ignores.)
        "valid_from": None if any(v is None for v in starts) else min(starts),  # type: ignore[type-var]
        "valid_until": None if any(v is None for v in ends) else max(ends),  # type: ignore[type-var]
    }


def stand_ins(
    hot: Sequence[MemoryView], originals: dict[str, list[MemoryView]]
) -> tuple[list[MemoryView], list[MemoryView]]:
    """(the originals a new summary of ``hot`` stands for, the earlier summaries it absorbs).

    A summary is always built from originals: an earlier summary in the group is
    replaced by the memories it stood for, so no summary ever summarises a summary.
    """
    absorbed = [m for m in hot if m.origin in SUMMARY_ORIGINS]
    members = [m for m in hot if m.origin not in SUMMARY_ORIGINS]
    # An absorbed summary may itself have absorbed an older one, which is then among
    # what it superseded; that older summary's originals are already its originals.
    members += [
        o for s in absorbed for o in originals.get(s.id, []) if o.origin not in SUMMARY_ORIGINS
    ]
    return members, absorbed


def summary_plan(
    profile: str,
    operation: str,
    hot: Sequence[MemoryView],
    originals: dict[str, list[MemoryView]],
    content: str,
    template: MemoryView,
    parameters: dict[str, object],
    **overrides: object,
) -> SummaryPlan:
    """The plan for a summary of the hot memories ``hot``, worded ``content`` by the rules,
    taking kind, entity, layer and session from ``template``; attributes merged over
    every memory it stands for, absorbed summaries included (they may have been used
    since). A summarizer rewording it reads the originals it stands for."""
    members, absorbed = stand_ins(hot, originals)
    fields: dict[str, Any] = {
        "summary_id": ids.summary_id(profile, operation, [m.id for m in members]),
        "operation": operation,
        "member_ids": tuple(sorted(m.id for m in members)),
        "absorbed_ids": tuple(sorted(s.id for s in absorbed)),
        "content": content,
        "kind": template.kind,
        "entity": template.entity,
        "layer": template.layer,
        "session_id": template.session_id,
        "representative_id": template.id,
        "meta": dict(template.meta),
        "parameters": parameters,
        "sources": tuple(members),
        "priors": {m.id: (m.tier, m.lifecycle, m.superseded_by) for m in (*members, *absorbed)},
        **merged_attributes([*hot, *members]),
    }
    fields.update(overrides)
    return SummaryPlan(**fields)


Wording = Callable[[SummaryPlan, Summarizer], SummaryPlan]


def write_summaries(
    store: Store,
    args: StepArgs,
    plans: Iterable[SummaryPlan],
    vetoed: set[str],
    word: Wording,
    report: StepReport,
    also: Callable[[ProfileTx], object] | None = None,
) -> list[SummaryPlan]:
    """Write the plans an operator has not vetoed (``vetoed``: the profile's undone
    summaries), each worded by ``word`` with the run's summarizer (which is asked
    nothing for a vetoed plan) and with its own vector; note vetoes and model
    fallbacks in ``report``. Returns what was written (a plan worded afresh names its
    model; its vector is in the store, not on the plan).

    ``plans`` may be a generator: each plan worded afresh goes to the model as soon as
    it is worded, and the model embeds on a worker thread while the step goes on
    planning and wording. The write begins when the model has about
    ``write_ahead_seconds`` of work left, and stores the vectors last. ``also`` writes
    the step's other decisions (supersessions) in the same transaction, first."""
    summarizer = summarizer_for(args.config.summarizer)
    settings = store.settings
    kept: list[SummaryPlan] = []
    with BackgroundEmbedding(lambda: embedder_for(settings)) as embedding:
        for plan in plans:
            if plan.summary_id in vetoed:
                note_veto(plan.summary_id, len(plan.member_ids), report)
                continue
            plan = word(plan, summarizer)
            if plan.embedding is None:
                embedding.add(plan.summary_id, plan.gist or plan.content)
            kept.append(plan)
        embedding.close()
        embedding.wait(settings.write_ahead_seconds)
        model = embedding.model_name()
        kept = [p if p.embedding is not None else replace(p, embedding_model=model)
                for p in kept]
        with args.writing(store) as tx:
            kept = drop_reingested(kept, ingested_since(tx), report)
            if also is not None:
                also(tx)
            apply_summaries(tx, kept, args.as_of, args.run_id, vectors=embedding.vectors)
    report.embedding_seconds = round(embedding.seconds, 4)
    report.notes += fallback_notes(summarizer)
    return kept


def drop_reingested(
    plans: list[SummaryPlan], reingested: set[str], report: StepReport
) -> list[SummaryPlan]:
    """The plans none of whose memories an ingest wrote since the run took the profile
    (``reingested``): a plan read them before, and would summarise words they no longer
    hold. Such a group waits, whole, for the next run, which reads them anew; the
    report says so."""
    if not reingested:
        return plans
    kept = []
    for plan in plans:
        changed = reingested.intersection((*plan.member_ids, *plan.absorbed_ids))
        if not changed:
            kept.append(plan)
            continue
        report.skipped += 1
        detail = (f"{len(plan.member_ids)} memories, {len(changed)} of them ingested again "
                  "during the run: left for the next run")
        report.record(Change("deferred", plan.summary_id, detail), counts=False)
    return kept


def reworded(
    plan: SummaryPlan, content: str, mode: str, gist: str | None = None, **changes: Any
) -> SummaryPlan:
    """``plan`` in a summarizer's words: worded afresh, it will get its own vector, made
    from ``gist`` if given, else from the whole ``content``."""
    return replace(plan, content=content, gist=gist, embedding=None, embedding_model=None,
                   parameters={**plan.parameters, "mode": mode}, **changes)


P = TypeVar("P", SummaryPlan, MetaPlan)


def drop_vetoed(
    vetoed: set[str], plans: list[P], key: Callable[[P], str], report: StepReport
) -> list[P]:
    """The plans an operator has not vetoed by undoing them (``vetoed``: the profile's
    ``undone_summaries``); vetoes are noted in ``report``."""
    for plan in plans:
        if key(plan) in vetoed:
            note_veto(key(plan), len(plan.member_ids), report)
    return [p for p in plans if key(p) not in vetoed]


def note_veto(summary_id: str, members: int, report: StepReport) -> None:
    """Say in ``report`` that a plan an operator undid was not made again."""
    report.skipped += 1
    detail = f"{members} memories: undone by an operator, not redone"
    report.record(Change("vetoed", summary_id, detail), counts=False)
