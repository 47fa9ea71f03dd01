"""How summaries and Core Memory blocks are worded, behind one interface.

Mode A (``rules``) is deterministic and needs no model: a merged group is worded as
its representative memory, a compression joins its members' words, and blocks are
compiled by rules. Modes B and C (``llm``, ``tasks.llm``) ask a model. Steps ask
``summarizer_for(name)`` and never know which mode they got. A summarizer may decline
(return ``None``): the step then uses the rules, and its report says why. A summarizer
never raises for a wording it could not make: a step that failed would be retried by
Prefect, and the retry would ask the model again.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Protocol, TypeVar

from reverie.engines.embedding import embedder_for
from reverie.models import ids
from reverie.models.config import SummarizerName
from reverie.models.errors import ConfigError
from reverie.models.records import MemoryView, MetaPlan, SummaryPlan
from reverie.models.repositories.summaries import apply_summaries, undone_summaries
from reverie.models.settings import get_settings
from reverie.models.store import Store
from reverie.models.tables import SUMMARY_ORIGINS
from reverie.models.vectors import to_blob
from reverie.tasks.step import Change, StepReport


class Summarizer(Protocol):
    mode: str
    # Why calls fell back to the rules (no memory text), for the step's report: one
    # entry per wording, "what: reason kind", so that reports can count them.
    failures: list[str]
    # Run-level events the report should carry (e.g. the circuit breaker opened).
    events: list[str]

    def merge(self, representative: MemoryView, members: Sequence[MemoryView]) -> str | None:
        """Wording of one summary standing for ``members``; None to use the rules."""

    def compress(self, members: Sequence[MemoryView]) -> str | None:
        """Wording of a compression of fading ``members``; None to use the rules."""

    def compile_block(
        self, block_type: str, facts: Sequence[MemoryView], char_limit: int
    ) -> str | None:
        """Wording of one Core Memory block from ``facts``; None to use the rules."""

    def describe_cluster(self, members: Sequence[MemoryView], dominant_kind: str) -> str | None:
        """Wording of a meta-memory describing a cluster; None to use the rules."""


class RulesSummarizer:
    """Mode A: the representative's own words; blocks compiled by rules."""

    mode = "rules"

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.events: list[str] = []

    def merge(self, representative: MemoryView, members: Sequence[MemoryView]) -> str | None:
        return representative.content

    def compress(self, members: Sequence[MemoryView]) -> str | None:
        return None

    def compile_block(
        self, block_type: str, facts: Sequence[MemoryView], char_limit: int
    ) -> str | None:
        return None

    def describe_cluster(self, members: Sequence[MemoryView], dominant_kind: str) -> str | None:
        return None


def _llm() -> Summarizer:
    from reverie.engines.llm import LLMSummarizer

    return LLMSummarizer()


_FACTORIES: dict[str, Callable[[], Summarizer]] = {"rules": RulesSummarizer, "llm": _llm}


def summarizer_for(name: SummarizerName) -> Summarizer:
    """The summarizer called ``name``; "auto" is "llm" when an LLM server is configured."""
    if name == "auto":
        name = "llm" if get_settings().llm_base_url else "rules"
    try:
        return _FACTORIES[name]()
    except KeyError:  # the config's type admits no other name; a caller outside it might
        raise ConfigError(
            f"unknown summarizer {name!r}; choose one of auto, {', '.join(sorted(_FACTORIES))}"
        ) from None


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
        "valid_from": None if any(v is None for v in starts) else min(starts),  # type: ignore[type-var]
        "valid_until": None if any(v is None for v in ends) else max(ends),  # type: ignore[type-var]
    }


def fallback_notes(summarizer: Summarizer) -> list[str]:
    """Report notes when a model's wordings were replaced by the rules, grouped by
    reason with counts, then the summarizer's run-level events (the breaker opened)."""
    notes: list[str] = []
    if summarizer.failures:
        reasons = "; ".join(
            reason if n == 1 else f"{reason} x{n}"
            for reason, n in sorted(Counter(summarizer.failures).items())
        )
        notes.append(
            f"{summarizer.mode}: {len(summarizer.failures)} wording(s) fell back to rules "
            f"({reasons})"
        )
    # getattr: a summarizer registered before events existed has none.
    return notes + list(getattr(summarizer, "events", ()))


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
    """The plan for a summary of the hot memories ``hot``, worded ``content``, taking kind,
    entity, layer and session from ``template``; attributes merged over every memory it
    stands for, absorbed summaries included (they may have been used since)."""
    members, absorbed = stand_ins(hot, originals)
    fields: dict[str, object] = {
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
        **merged_attributes([*hot, *members]),
    }
    fields.update(overrides)
    return SummaryPlan(**fields)  # type: ignore[arg-type]


def embed_new_wordings(store: Store, plans: list[SummaryPlan]) -> list[SummaryPlan]:
    """Give every summary worded afresh (no vector yet) its own embedding."""
    fresh = [p for p in plans if p.embedding is None]
    if not fresh:
        return plans
    embedder = embedder_for(store.settings)
    vectors = embedder.encode([p.content for p in fresh])
    model = embedder.name
    replaced = {
        p.summary_id: replace(p, embedding=to_blob(v), embedding_model=model)
        for p, v in zip(fresh, vectors, strict=True)
    }
    return [replaced.get(p.summary_id, p) for p in plans]


def write_summaries(
    store: Store,
    profile: str,
    as_of: datetime,
    run_id: str | None,
    plans: list[SummaryPlan],
    summarizer: Summarizer,
    report: StepReport,
    word: Callable[[list[SummaryPlan]], list[SummaryPlan]] | None = None,
) -> list[SummaryPlan]:
    """Write the plans an operator has not vetoed (by undoing them), each with its own
    vector, and note vetoes and model fallbacks in ``report``. ``word`` rewords the
    plans that survived the vetoes (a model is asked nothing for a vetoed one).
    Returns what was kept."""
    with store.reading(profile) as tx:
        vetoed = undone_summaries(tx)
    kept = drop_vetoed(vetoed, plans, lambda p: p.summary_id, report)
    if word is not None:
        kept = word(kept)
    started = time.perf_counter()
    kept = embed_new_wordings(store, kept)
    report.embedding_seconds = round(time.perf_counter() - started, 4)
    with store.writing(profile) as tx:
        apply_summaries(tx, kept, as_of, run_id)
    report.notes += fallback_notes(summarizer)
    return kept


P = TypeVar("P", SummaryPlan, MetaPlan)


def drop_vetoed(
    vetoed: set[str], plans: list[P], key: Callable[[P], str], report: StepReport
) -> list[P]:
    """The plans an operator has not vetoed by undoing them (``vetoed``: the profile's
    ``undone_summaries``); vetoes are noted in ``report``."""
    for plan in plans:
        if key(plan) in vetoed:
            report.skipped += 1
            detail = f"{len(plan.member_ids)} memories: undone by an operator, not redone"
            report.record(Change("vetoed", key(plan), detail), counts=False)
    return [p for p in plans if key(p) not in vetoed]
