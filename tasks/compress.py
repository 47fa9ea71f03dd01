"""Compression of fading memories (cognitive-memory), a step of full consolidation.

Candidates are live hot memories that are active (not promoted), unprotected, not
summaries themselves, and whose stored relevance is below ``max_relevance`` (0.20; the
decay flow scores it). Within each kind and entity, memories are taken oldest first as
group seeds; a seed gathers unclaimed candidates at cosine >= ``similarity`` (0.60) to
itself, most similar first, until the group holds ``max_group_size`` (8); a group
smaller than ``min_group_size`` (2) is not compressed. Each group becomes one summary:
the model's compression (the prompt asks it to keep names, dates, numbers and
preferences) preceded by its members' dates or, without a model, the members' statements
grouped by day, each whole, the shared subject said once; the highest importance, the
mean stability, the highest access count, a fresh embedding (of its words without the
dates that head them, as a member's vector holds no date), and a provenance link of
weight 0.8 to each original. The originals move to the cold tier, superseded by it.

A summary is dated when it is written (as_of), not at its oldest member: dated at its
oldest member, it would be born fading and the next group would absorb it again, a
merge treadmill that rewords the same facts run after run. Its members' dates stay in
its words and in its metadata (``members_from``, ``members_until``, ``member_dates``),
and it is never compressed again.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import NamedTuple

import numpy as np

from reverie.engines.ranking import day
from reverie.engines.similarity import DEFAULT_SEARCH, radius_neighbours, similarities_to_first
from reverie.engines.wording import Summarizer
from reverie.models.config import CompressConfig, SearchConfig
from reverie.models.records import MemoryView, SummaryPlan
from reverie.models.repositories.memories import snapshot
from reverie.models.repositories.summaries import undone_summaries
from reverie.models.store import Store
from reverie.models.tables import DERIVED_ORIGINS, Lifecycle, Origin
from reverie.tasks.decay import relevance_notes
from reverie.tasks.step import Change, StepArgs, StepReport, preview, step_task
from reverie.tasks.summaries import reworded, summary_plan, write_summaries
from reverie.tasks.supersede import compressible_together

OPERATION = Origin.COMPRESSED
# Why a compression's members were grouped (its audit's ``rule``; ``similarities``
# holds each one's cosine to the seed).
RULE = ("fading alike: same kind and entity, relevance below max_relevance, each within "
        "the similarity of the oldest (the seed)")


def is_candidate(memory: MemoryView, config: CompressConfig) -> bool:
    # A summary is never compressed again: it was written fresh, and compressing it would
    # only reword its originals once more (the merge treadmill).
    return (
        memory.is_live
        and memory.lifecycle == Lifecycle.ACTIVE
        and not memory.protected
        and memory.origin not in DERIVED_ORIGINS
        and memory.relevance is not None
        and memory.relevance < config.max_relevance
    )


def fading_groups(
    memories: Sequence[MemoryView], vectors: np.ndarray, config: CompressConfig,
    search: SearchConfig = DEFAULT_SEARCH,
) -> list[list[int]]:
    """Rows grouped greedily around seeds taken oldest first, most similar first, up to
    max_group_size, never two that state different values of one fact (``compatible``);
    a seed that gathers fewer than min_group_size is left alone."""
    return [group for group, _ in seeded_groups(memories, vectors, config, search)]


def seeded_groups(
    memories: Sequence[MemoryView], vectors: np.ndarray, config: CompressConfig,
    search: SearchConfig = DEFAULT_SEARCH,
) -> list[tuple[list[int], list[float]]]:
    """``fading_groups``, each with its members' cosine to its seed (its first row)."""
    neighbours = radius_neighbours(vectors, config.similarity, search=search)
    claimed = np.zeros(len(memories), dtype=bool)
    groups: list[tuple[list[int], list[float]]] = []

    def age_order(i: int) -> tuple[object, str]:
        return memories[i].created_at, memories[i].id

    for seed in sorted(range(len(memories)), key=age_order):
        if claimed[seed]:
            continue
        group = [seed]
        for other in neighbours.indices[seed]:
            if len(group) >= config.max_group_size:
                break
            # A fact stating another value of a fact a member states is an update:
            # compressed together, a wording could state the older value as current.
            if not claimed[other] and all(
                    compressible_together(memories[other], memories[g]) for g in group):
                group.append(int(other))
        if len(group) >= config.min_group_size:
            claimed[group] = True
            groups.append((group, similarities_to_first(neighbours, group)))
    return groups


_EDGE_PUNCTUATION = ".,;:!?\"'()[]"


def _norm(token: str) -> str:
    return token.strip(_EDGE_PUNCTUATION).lower()


def shared_subject(members: Sequence[MemoryView]) -> str | None:
    """The entity every member is about, when they agree on one."""
    entities = {m.entity for m in members}
    return entities.pop() if len(entities) == 1 and None not in entities else None


class Digest(NamedTuple):
    """A compression in the rules' words: ``text`` is read, ``gist`` is embedded."""

    text: str
    # The same words without the dates that head the days: a member's vector holds no
    # date (its date is metadata), nor then does its summary's. The headers were a
    # quarter of the tokens the model embeds at 100k; on LoCoMo, answers found stay
    # within a question of the dated vectors' (README, Quality).
    gist: str


# Words after which the subject is one of several ("Ann and her kids"): it stays.
_JOINING = frozenset({"and", "or", "nor", "&", "with"})


def statement(memory: MemoryView, subject: str | None) -> tuple[str, bool]:
    """What ``memory`` says once its subject is said for all: its words whole, bar a
    leading ``subject`` followed by a lower-case word ("Ann adopted a cat" -> "adopted a
    cat"; "Ann's cat", "Ann Lee ran" and "Ann and Bo ran" keep theirs) and the full stop
    that ends it. Whether the subject was dropped comes second."""
    tokens = memory.content.split()
    stripped = bool(subject and len(tokens) > 1 and tokens[0] == subject
                    and tokens[1][:1].islower() and tokens[1] not in _JOINING)
    if stripped:
        tokens = tokens[1:]
    return " ".join(tokens).rstrip(".;") or memory.content.strip(), stripped


def _said_in(words: str, said: Sequence[str]) -> bool:
    """Whether the words ``words`` (normalised, space-joined) run whole, in order, inside
    one of the statements ``said``."""
    return bool(words) and any(f" {words} " in f" {other} " for other in said)


def rules_wording(members: Sequence[MemoryView], lead: bool = True) -> Digest:
    """The members' statements, compactly: grouped by the day they were written ("8 May
    2023: a; b. 12 May: c.", the year once until it changes) and the shared subject said
    once ("Ann - ...", unless ``lead`` is false: a caller that names the subject itself).
    Nothing else is left out: each member's statement stays whole, its words in its own
    order, so every name, number and date it holds stays in its sentence. A statement
    whose words all run, in order, inside one already said that day is not said again
    (it would add neither a word nor a date)."""
    subject = shared_subject(members)
    days: list[tuple[datetime, list[str], list[str]]] = []
    stripped = False
    for m in members:
        text, dropped = statement(m, subject)
        normed = " ".join(w for w in (_norm(t) for t in text.split()) if w)
        if days and days[-1][0].date() == m.created_at.date():
            if _said_in(normed, days[-1][2]):
                continue
            days[-1][1].append(text)
            days[-1][2].append(normed)
        else:
            days.append((m.created_at, [text], [normed]))
        stripped = stripped or dropped
    dated: list[str] = []
    undated: list[str] = []
    year = None
    for at, texts, _ in days:
        when = f"{at.day} {at:%B}" if at.year == year else day(at)
        year = at.year
        undated.append(f"{'; '.join(texts)}.")
        dated.append(f"{when}: {undated[-1]}")
    head = f"{subject} - " if stripped and lead else ""
    return Digest(head + " ".join(dated), head + " ".join(undated))


def dated(wording: str, members: Sequence[MemoryView]) -> str:
    """A model's wording, preceded by when its members were written: the summary itself
    is dated when it is written."""
    first, last = day(members[0].created_at), day(members[-1].created_at)
    return f"{first}: {wording}" if first == last else f"{first} to {last}: {wording}"


def member_dates(members: Sequence[MemoryView]) -> dict[str, object]:
    """Metadata of a summary: when its members were written (it is dated itself when it
    is written, so a reader needs these to place what it says in time)."""
    return {
        "members_from": members[0].created_at.isoformat(),
        "members_until": members[-1].created_at.isoformat(),
        "member_dates": {m.id: m.created_at.isoformat() for m in members},
    }


def compression_plans(
    profile: str,
    as_of: datetime,
    memories: Sequence[MemoryView],
    vectors: np.ndarray,
    config: CompressConfig,
    search: SearchConfig = DEFAULT_SEARCH,
) -> Iterator[SummaryPlan]:
    """One summary plan per group of similar fading memories of the same kind and entity,
    worded by the rules; given one subject at a time, as they are made, so that the step
    hands each to the model while it plans the next."""
    parameters = {
        "rule": RULE,
        "same": ["kind", "entity"],
        "max_relevance": config.max_relevance,
        "similarity": config.similarity,
        "min_group_size": config.min_group_size,
        "max_group_size": config.max_group_size,
        "mode": "rules",
    }
    rows = [i for i, m in enumerate(memories) if is_candidate(m, config)]

    # One entity per summary: its subject is said once, and facts about two people never
    # blur into one memory.
    subjects: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i in rows:
        subjects[memories[i].kind, memories[i].entity or ""].append(i)
    for key in sorted(subjects):
        same = subjects[key]
        candidates = [memories[i] for i in same]
        for group, sims in seeded_groups(candidates, vectors[same], config, search):
            # Summaries are never candidates: a group is its own originals, and the
            # originals of earlier summaries need not be read.
            hot = [candidates[i] for i in group]
            ordered = sorted(hot, key=lambda m: (m.created_at, m.id))
            words = rules_wording(ordered)
            yield summary_plan(
                profile, OPERATION, hot, {}, words.text, hot[0],
                {**parameters, "seed": hot[0].id},
                similarities={m.id: sim for m, sim in sorted(
                    zip(hot, sims, strict=True), key=lambda p: p[0].id)},
                gist=words.gist, link_weight=config.link_weight, sources=tuple(ordered),
                # Fresh: a summary dated at its oldest member would be born fading.
                created_at=as_of, meta={**hot[0].meta, **member_dates(ordered)},
            )


def word_compression(plan: SummaryPlan, summarizer: Summarizer) -> SummaryPlan:
    """The plan in the summarizer's words, dated by its members (its vector made from
    the words alone, as the rules' is), where it gives any."""
    text = summarizer.compress(plan.sources)
    if not text:
        return plan
    return reworded(plan, dated(text, plan.sources), summarizer.mode, gist=text)


def nothing_to_compress_note(fading: int, config: CompressConfig) -> list[str]:
    """Why a pass compressed nothing, in the terms of its knobs."""
    if fading < config.min_group_size:
        return [f"{fading} fading memories (relevance below {config.max_relevance:g}); a "
                f"compression group needs {config.min_group_size}"]
    return [f"no {config.min_group_size} of the {fading} fading memories are alike at cosine "
            f">= {config.similarity:g}"]


def compress_fading(store: Store, args: StepArgs) -> StepReport:
    """Replace full groups of similar fading memories by summaries; originals go cold."""
    config = args.config.compress
    with args.reading(store) as tx:
        memories, vectors = snapshot(tx)
        vetoed = undone_summaries(tx)
        stale = relevance_notes(tx, args.as_of, any(m.relevance is not None for m in memories),
                                args.config.decay)
    report = StepReport(
        "compress_fading", args.profile, examined=sum(is_candidate(m, config) for m in memories)
    )
    report.notes += stale
    plans = write_summaries(
        store, args,
        compression_plans(args.profile, args.as_of, memories, vectors, config,
                          args.config.search),
        vetoed, word_compression, report,
    )
    if not plans and not report.skipped:
        report.notes += nothing_to_compress_note(report.examined, config)
    for plan in plans:
        detail = f"{len(plan.member_ids)} fading {plan.kind} memories"
        report.record(Change("compressed", plan.summary_id, detail, preview(plan.content)))
    report.facts = {"groups": len(plans), "archived": sum(len(p.member_ids) for p in plans)}
    return report


compress_fading_task = step_task("compress_fading", compress_fading)
