"""Step 1 of full consolidation: merge groups of near-duplicate memories.

Candidates are hot, live, unprotected memories valid at ``as_of`` (meta-memories,
which describe clusters rather than replace them, are left alone). Memories are
taken as group representatives in order of how informative they are; each
representative gathers every unclaimed candidate at cosine >= the threshold *to
itself* (never to another member, so groups cannot chain), and only a group of at
least ``min_group_size`` is merged. A merged group becomes one summary memory in the
hot tier; its members move to the cold tier with ``superseded_by`` set and a
consolidation edge from the summary. Nothing is deleted.

Because representatives are taken greedily and claim all their neighbours, no hot
memory is left within the threshold of a new summary: a second pass over the same
store finds nothing more to merge.

Compression runs after merging and writes summaries of its own, which can be near
each other or near what merging left. ``dedup_new_summaries`` is the same merge
again, after compression, so that one full run leaves no near-duplicates for the
next run to find (a second run with the same ``as_of`` changes nothing). It merges
only when a summary that is not linked yet (written by this run, or by a killed
one) has a candidate within the threshold: a group the first pass did not form
needs such a summary in it, since everything else only lost neighbours since.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from reverie.engines.llm import facts, kept_names
from reverie.engines.similarity import (
    DEFAULT_SEARCH,
    Neighbours,
    chosen_rows,
    comparisons_per_row,
    radius_neighbours,
    similarities_to_first,
)
from reverie.engines.wording import Summarizer, content_words
from reverie.models.config import DedupConfig, SearchConfig
from reverie.models.records import MemoryView, SummaryPlan
from reverie.models.repositories.memories import snapshot
from reverie.models.repositories.summaries import (
    apply_supersessions,
    originals_of,
    undone_summaries,
    undone_supersessions,
)
from reverie.models.store import ProfileTx, Store
from reverie.models.tables import DERIVED_ORIGINS, SUMMARY_ORIGINS, Origin
from reverie.models.vectors import to_blob
from reverie.tasks.linking import link_rows, needs_link
from reverie.tasks.step import Change, StepArgs, StepReport, preview, step_task
from reverie.tasks.summaries import reworded, stand_ins, summary_plan, write_summaries
from reverie.tasks.supersede import (
    RESTATE_RULE,
    SupersedePlan,
    compatible,
    is_event,
    plan_summary_updates,
    plan_supersessions,
    summary_frame_groups,
    summary_groups,
    superseded_ids,
    values,
    with_frame_pairs,
    with_frame_radius,
)

OPERATION = Origin.DEDUP_SUMMARY
# Why a merge's members were grouped (its audit's ``rule``; ``similarities`` holds each
# one's cosine to the representative, an absorbed summary standing for its originals).
RULE = "near-duplicates: each within the similarity of the most informative representative"
_WORD = re.compile(r"\w+")


def is_candidate(memory: MemoryView, as_of: datetime) -> bool:
    return (
        memory.is_live
        and not memory.protected
        and memory.origin != Origin.META_MEMORY
        and memory.valid_at(as_of)
    )


def representative_order(
    memories: Sequence[MemoryView], rows: Iterable[int] | None = None
) -> list[int]:
    """Most informative first: more distinct words, then importance, use, and id.
    ``rows``: only these rows (default: all)."""

    def key(i: int) -> tuple[int, float, int, str]:
        m = memories[i]
        return (-len(set(_WORD.findall(m.content.lower()))), -m.importance, -m.access_count, m.id)

    return sorted(range(len(memories)) if rows is None else rows, key=key)


def duplicate_groups(
    neighbours: Neighbours, order: Sequence[int], config: DedupConfig,
    alike: Callable[[int, int], bool] | None = None,
) -> list[list[int]]:
    """Row groups, each led by its representative; every member is within the
    threshold of the representative and, given ``alike``, alike to it (a member that
    states another value of one of its facts is an update, never a duplicate). Rows
    are claimed by the first group they join."""
    claimed = np.zeros(len(neighbours.indices), dtype=bool)
    groups: list[list[int]] = []
    for rep in order:
        if claimed[rep]:
            continue
        members = [rep, *(int(j) for j in neighbours.indices[rep]
                          if not claimed[j] and (alike is None or alike(rep, int(j))))]
        if len(members) >= config.min_group_size:
            claimed[members] = True
            groups.append(members)
    return groups


@dataclass(frozen=True, slots=True)
class Duplicates:
    """The candidates, their vectors (row-aligned) and the groups found among them."""

    candidates: list[MemoryView]
    vectors: np.ndarray
    groups: list[list[int]]
    # Row-aligned with each group: every member's cosine to the group's representative
    # (its first row, 1.0), as the search found it.
    similarities: list[list[float]] = field(default_factory=list)

    def absorbed(self) -> list[str]:
        """The earlier summaries in some group: the only ones whose originals a plan
        reads (at a million memories, reading every summary's was gigabytes)."""
        return [self.candidates[i].id for group in self.groups for i in group
                if self.candidates[i].origin in SUMMARY_ORIGINS]


def find_duplicates(
    memories: Sequence[MemoryView], vectors: np.ndarray, as_of: datetime,
    config: DedupConfig, search: SearchConfig = DEFAULT_SEARCH,
    leaving: Set[str] = frozenset(),
) -> Duplicates:
    """The groups of near-duplicates among the candidates (``memories`` and
    ``vectors`` row-aligned), less ``leaving`` (memories a supersession moves to cold)."""
    candidates, cand_vectors = chosen_rows(
        memories, vectors, lambda m: is_candidate(m, as_of) and m.id not in leaving)
    neighbours = radius_neighbours(cand_vectors, config.similarity, search=search)
    # Only a row with a neighbour can lead a group (min_group_size >= 2): ranking the
    # others, most rows of a store, was a tenth of the search's time.
    order = representative_order(
        candidates, (i for i, hits in enumerate(neighbours.indices) if len(hits)))
    groups = duplicate_groups(
        neighbours, order, config, lambda i, j: compatible(candidates[i], candidates[j]))
    return Duplicates(candidates, cand_vectors, groups,
                      [similarities_to_first(neighbours, group) for group in groups])



def plan_merges(
    profile: str, found: Duplicates, originals: dict[str, list[MemoryView]],
    config: DedupConfig,
) -> list[SummaryPlan]:
    """One SummaryPlan per group, worded by the rules (``merge_wording``): the
    representative's own words and vector, and whole any member that says more than
    they do (a fact, or a share of its words: ``restated_share``). ``originals`` maps
    each earlier summary in a group to the memories it replaced: a new summary that
    takes in an earlier one stands for those originals, never for the summary itself."""
    parameters = {
        "rule": RULE,
        "similarity": config.similarity,
        "min_group_size": config.min_group_size,
        "mode": "rules",
    }
    if config.restated_share:
        # Absent, the audit means the rule every merge had before the knob: a member
        # stating no new fact goes unsaid.
        parameters["restated_share"] = config.restated_share
    plans: list[SummaryPlan] = []
    for group, sims in zip(found.groups, found.similarities, strict=True):
        hot = [found.candidates[i] for i in group]
        rep = hot[0]
        members, _ = stand_ins(hot, originals)
        # The summary keeps the representative's vector even where members are added to
        # its words: the group is every candidate within the threshold of that vector,
        # so no hot memory is left near the summary and a second pass merges nothing
        # more (a vector of the longer words could reach memories the group never met).
        # The added members are near-duplicates of the representative, which stands for
        # them all: the vector is its words' (the summary's gist), as any memory's is.
        plans.append(
            summary_plan(profile, OPERATION, hot, originals,
                         merge_wording(rep, members, config.restated_share), rep,
                         {**parameters, "representative": rep.id},
                         embedding=to_blob(found.vectors[group[0]]),
                         embedding_model=rep.embedding_model,
                         similarities={m.id: sim for m, sim in sorted(
                             zip(hot, sims, strict=True), key=lambda p: p[0].id)})
        )
    return plans


def stated_facts(texts: Sequence[str]) -> frozenset[str]:
    """The numbers and names (dates among them: their day, month and year) ``texts``
    state, as a model's merge of them is held to them (``engines.llm.check_answer``)."""
    known = [facts(t) for t in texts]
    return frozenset().union(*(k.numbers for k in known)) | kept_names(known)


def _stem(word: str) -> str:
    # A light stem, so that "volunteers", "volunteered" and "volunteering" are one word
    # to this test, as they are to a reader; six letters keep "company" and
    # "compassion" apart.
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    return word[:6]


def stems(text: str) -> set[str]:
    """The stems of the content words of ``text``."""
    return {_stem(w) for w in content_words(text)}


def restated(member: str, said: set[str]) -> float:
    """The share of ``member``'s content words (as stems) already in ``said``."""
    own = stems(member)
    return len(own & said) / len(own) if own else 1.0


def merge_wording(
    rep: MemoryView, members: Sequence[MemoryView], restated_share: float = 0.0
) -> str:
    """A merge in the rules' words: the representative's own, then, whole and oldest
    first, each member that says more than the words so far: one stating a number,
    name or date they do not ("capped at 8 seconds" where the representative says no
    cap), or one whose content words the words so far say less than ``restated_share``
    of ("... and received a medal" where the representative says only that she
    volunteers). Only members said enough already are left unsaid: their originals are
    in the cold tier."""
    text = rep.content
    said = facts(text)
    said_words = stems(text)
    wanted = stated_facts([m.content for m in members])
    for m in sorted(members, key=lambda m: (m.created_at, m.id)):
        own = facts(m.content)
        new_fact = not (own.numbers | own.words) & wanted <= said.numbers | said.words
        if m.id == rep.id or (
                not new_fact and restated(m.content, said_words) >= restated_share):
            continue
        text = text.rstrip()
        text = f"{text}{'' if text[-1:] in '.!?' else '.'} {m.content.strip()}"
        said = facts(text)
        said_words |= stems(m.content)
    return text


def word_merge(plan: SummaryPlan, summarizer: Summarizer) -> SummaryPlan:
    """The plan in the summarizer's words, where it gives other words than the
    representative's (which keep the representative's vector)."""
    text = summarizer.merge(plan.sources)
    return reworded(plan, text, summarizer.mode) if text and text != plan.content else plan


def nothing_merged_note(candidates: int, config: DedupConfig) -> list[str]:
    """Why a pass merged nothing, in the terms of its knobs."""
    if candidates < config.min_group_size:
        return []  # too few to ask: the report's "examined" already says it
    return [f"no {config.min_group_size} of the {candidates} memories are alike at cosine "
            f">= {config.similarity:g}"]


def is_update_candidate(memory: MemoryView, as_of: datetime) -> bool:
    """A memory a supersession may involve: a merge candidate written as itself (a
    summary's date is its oldest member's, not when its words were said) that states a
    fact, not an event (``tasks.supersede.is_event``)."""
    return (is_candidate(memory, as_of) and memory.origin not in DERIVED_ORIGINS
            and not is_event(memory))


def is_update_source(memory: MemoryView, as_of: datetime) -> bool:
    """A summary whose members may be updated by a newer memory, or may update an older
    one: a merge or a compression, or a cold note (protected, it is never rewritten, but
    its members' values are the newest of their facts as much as any memory's)."""
    if memory.origin == Origin.COLD_LEARNING:
        return memory.is_live and memory.valid_at(as_of)
    return is_candidate(memory, as_of) and memory.origin in (
        Origin.DEDUP_SUMMARY, Origin.COMPRESSED)


def find_updates(
    profile: str, memories: Sequence[MemoryView], vectors: np.ndarray, as_of: datetime,
    config: DedupConfig, search: SearchConfig = DEFAULT_SEARCH,
    vetoed: Set[str] = frozenset(),
) -> list[SupersedePlan]:
    """The supersessions among the candidates (see ``tasks.supersede``), less those an
    operator undid (``vetoed``: their audit ids)."""
    candidates, cand_vectors = chosen_rows(
        memories, vectors, lambda m: is_update_candidate(m, as_of))
    plans = plan_supersessions(profile, candidates, cand_vectors, config, search)
    return [p for p in plans if p.consolidation_id not in vetoed]


def stale_summary_pairs(
    memories: Sequence[MemoryView], vectors: np.ndarray, as_of: datetime, config: DedupConfig,
    search: SearchConfig = DEFAULT_SEARCH, leaving: Set[str] = frozenset(),
) -> tuple[list[MemoryView], list[list[tuple[MemoryView, float]]], list[list[tuple[int, float]]]]:
    """The hot summaries that may state a value a memory updates, per summary the
    update candidates within ``supersede_similarity`` of it (with the cosine), and the
    other summaries within it (by position among those returned, with the cosine): a
    search within groups of one entity, among texts that state a number or a name, so
    only the summaries found need their originals read. Texts of one frame are searched
    down to ``supersede_frame_similarity``, as among plain memories."""
    summaries, s_vectors = chosen_rows(
        memories, vectors, lambda m: m.id not in leaving and is_update_source(m, as_of))
    if not summaries:
        return [], [], []
    plain, p_vectors = chosen_rows(
        memories, vectors, lambda m: is_update_candidate(m, as_of) and m.id not in leaving)
    both = np.concatenate([s_vectors, p_vectors]) if len(plain) else s_vectors
    texts = [values(m.content) for m in (*summaries, *plain)]
    found = radius_neighbours(both, config.supersede_similarity, search=search,
                              groups=summary_groups(summaries, plain, texts))
    if config.supersede_frame_similarity < config.supersede_similarity:
        # The same words around their values, as among plain memories: a summary that
        # says "works at Google" and "working for Stripe" may be further apart than the
        # first radius (``tasks.supersede.frame``); the word test still decides.
        found = with_frame_pairs(found, radius_neighbours(
            both, config.supersede_frame_similarity, search=search,
            groups=summary_frame_groups(summaries, plain, texts)))
    kept: list[int] = []
    out_near: list[list[tuple[MemoryView, float]]] = []
    near_summaries: list[list[tuple[int, float]]] = []
    for row in range(len(summaries)):
        hits = list(zip(found.indices[row].tolist(), found.similarities[row].tolist(),
                        strict=True))
        near = [(plain[j - len(summaries)], round(float(sim), 6))
                for j, sim in hits if j >= len(summaries)]
        # Summary against summary: an older one's member that a newer one's updates.
        others = [(j, round(float(sim), 6)) for j, sim in hits if j < len(summaries)]
        if near or others:
            kept.append(row)
            out_near.append(near)
            near_summaries.append(others)
    position = {row: k for k, row in enumerate(kept)}
    peers = [[(position[j], sim) for j, sim in others if j in position]
             for others in near_summaries]
    return [summaries[row] for row in kept], out_near, peers


def find_stale_summaries(
    tx: ProfileTx, profile: str, memories: Sequence[MemoryView], vectors: np.ndarray,
    as_of: datetime, config: DedupConfig, search: SearchConfig, vetoed: Set[str],
    leaving: Set[str],
) -> list[SupersedePlan]:
    """Supersessions between summaries and the hot memories near them, both ways, and
    between summaries (``tasks.supersede``'s ``plan_summary_updates``), reading the
    originals of the summaries that may hold one."""
    summaries, near, peers = stale_summary_pairs(
        memories, vectors, as_of, config, search, leaving)
    if not summaries:
        return []
    originals = originals_of(tx, [s.id for s in summaries])
    return with_frame_radius(plan_summary_updates(
        profile, [(s, [o for o in originals[s.id] if o.origin not in SUMMARY_ORIGINS])
                  for s in summaries], near, vetoed, peers), config)


def dedup(store: Store, args: StepArgs) -> StepReport:
    """Supersede older statements of an updated fact (older summaries' among them),
    then merge near-duplicates of one profile into summaries; what either replaces goes
    cold."""
    with args.reading(store) as tx:
        memories, vectors = snapshot(tx)
        undone = undone_supersessions(tx)
        updates = find_updates(args.profile, memories, vectors, args.as_of,
                               args.config.dedup, args.config.search, undone)
        updates += find_stale_summaries(
            tx, args.profile, memories, vectors, args.as_of, args.config.dedup,
            args.config.search, undone, superseded_ids(updates))
        leaving = superseded_ids(updates) | {
            a for u in updates for r in u.restated for a in r.absorbed_ids}
        found, originals, vetoed = _groups_and_history(tx, memories, vectors, args, leaving)
    report = StepReport("dedup", args.profile, examined=len(found.candidates))
    return _merge(store, args, found, originals, vetoed, report, updates)


def _groups_and_history(
    tx: ProfileTx, memories: Sequence[MemoryView], vectors: np.ndarray, args: StepArgs,
    leaving: Set[str] = frozenset(),
) -> tuple[Duplicates, dict[str, list[MemoryView]], set[str]]:
    """The groups, what the earlier summaries among them stand for, and the summaries
    an operator undid."""
    found = find_duplicates(memories, vectors, args.as_of, args.config.dedup,
                            args.config.search, leaving)
    return found, originals_of(tx, found.absorbed()), undone_summaries(tx)


def may_have_new_duplicates(
    memories: Sequence[MemoryView], vectors: np.ndarray, as_of: datetime, config: DedupConfig,
    search: SearchConfig = DEFAULT_SEARCH,
) -> bool:
    """Whether some new summary may have another candidate within the threshold: the
    only way a store that one merge pass left alone can hold a group again.

    The check compares every new summary with every candidate. When there are more new
    summaries than the merge's own search compares each candidate with (a full run at
    100k: 22,508 new among 36,136 candidates, 5 s of checking for a 1.5 s search), it
    would cost more than it saves, and the answer is "maybe": the search decides."""
    candidates, cand_vectors = chosen_rows(memories, vectors, lambda m: is_candidate(m, as_of))
    new = link_rows(candidates)
    if not new:
        return False
    if len(new) > comparisons_per_row(len(candidates), search):
        return True
    found = radius_neighbours(cand_vectors, config.similarity, queries=cand_vectors[new])
    return any(len(hits) > 1 for hits in found.indices)  # each finds itself


def dedup_new_summaries(store: Store, args: StepArgs) -> StepReport:
    """Merge again after compression: new summaries that are near-duplicates of each
    other or of what the first pass left (see the module's docstring)."""
    with args.reading(store) as tx:
        memories, vectors = snapshot(tx)
        report = StepReport(
            "dedup_new_summaries", args.profile,
            examined=sum(needs_link(m) and is_candidate(m, args.as_of) for m in memories),
        )
        # Most runs end here: the history is read only when there is something to merge.
        config = args.config
        if not may_have_new_duplicates(
            memories, vectors, args.as_of, config.dedup, config.search
        ):
            return report
        found, originals, vetoed = _groups_and_history(tx, memories, vectors, args)
    return _merge(store, args, found, originals, vetoed, report)


def _merge(
    store: Store, args: StepArgs, found: Duplicates,
    originals: dict[str, list[MemoryView]], vetoed: set[str], report: StepReport,
    updates: Sequence[SupersedePlan] = (),
) -> StepReport:
    config = args.config
    plans = plan_merges(args.profile, found, originals, config.dedup)
    if not plans and not updates:
        report.notes += nothing_merged_note(report.examined, config.dedup)
    restated = [r for u in updates for r in u.restated]
    written = write_summaries(
        store, args, [*restated, *plans], vetoed, _worded, report,
        also=lambda tx: apply_supersessions(tx, updates, args.as_of, args.run_id),
    )
    plans = [p for p in written if not _is_restatement(p)]
    for r in written:
        if _is_restatement(r):
            report.record(Change("restated", r.summary_id,
                                 f"what {r.parameters.get('restates')} said besides an "
                                 "updated value", preview(r.content)))
    for update in updates:
        sims = ", ".join(f"{mid} {sim:.3f}" for mid, sim in update.similarities.items())
        detail = (
            f"{len(update.member_ids)} older statement(s) of the same fact with another "
            f"value ({', '.join(sorted(set(update.conflicts.values())))}) superseded by the "
            f"newest {update.newest_id}; cosine to it: {sims}"
        )
        content = update.newest.content if update.newest is not None else None
        report.record(Change("superseded", update.newest_id, detail, preview(content)))
    for plan in plans:
        absorbing = (
            f", absorbing {len(plan.absorbed_ids)} earlier summaries" if plan.absorbed_ids else ""
        )
        detail = (
            f"{len(plan.member_ids)} near-duplicates at cosine >= {config.dedup.similarity} "
            f"(representative {plan.representative_id}){absorbing}"
        )
        report.record(Change("merged", plan.summary_id, detail, preview(plan.content)))
    report.facts = {"groups": len(plans), "archived": sum(len(p.member_ids) for p in plans)}
    if updates:
        report.facts |= {"superseded": sum(len(u.member_ids) for u in updates),
                         "updates": len(updates)}
    return report


def _is_restatement(plan: SummaryPlan) -> bool:
    return str(plan.parameters.get("rule", "")).startswith(RESTATE_RULE)


def _worded(plan: SummaryPlan, summarizer: Summarizer) -> SummaryPlan:
    """A merge in the summarizer's words; a restatement keeps the words its members said
    (it only leaves out the statements an update replaced)."""
    return plan if _is_restatement(plan) else word_merge(plan, summarizer)


dedup_task = step_task("dedup", dedup)
dedup_new_summaries_task = step_task("dedup_new_summaries", dedup_new_summaries)
