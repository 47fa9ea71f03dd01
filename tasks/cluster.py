"""Clustering into meta-memories (AutoMem's monthly task), without a Python pair loop.

Candidates are live hot memories with relevance > 0.3 (meta-memories themselves
excluded). FAISS finds every pair at cosine >= 0.75 (inclusive) as arrays; igraph
groups them; every group of at least 5 gets one meta-memory: its dominant kind (most
common, ties broken alphabetically), its size, the real span in days between its
oldest and newest member, a summary content and a ``summarizes`` edge to each member.
Members are not superseded: a meta-memory describes a pattern, it replaces nothing.

Grouping methods (``cluster.method``):

- ``components`` (default, as AutoMem): connected components, i.e. single linkage.
  Chains join: if a~b and b~c, then a, b and c are one cluster even when a and c are
  far apart, so a long chain of gradually drifting memories becomes one cluster.
- ``leiden``: Leiden communities (modularity, weighted by similarity, seeded) on the
  same graph, which cuts long chains where they are thinnest.

A re-run finds the same clusters and updates their meta-memories in place; a cluster
that keeps at least ``reuse_overlap`` of an earlier meta-memory's members updates that
meta-memory rather than adding another.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from reverie.engines.graph import communities, components, similarity_graph
from reverie.engines.similarity import DEFAULT_SEARCH, chosen_rows, similarity_pairs
from reverie.engines.wording import Summarizer, fallback_notes, summarizer_for
from reverie.models import ids
from reverie.models.config import ClusterConfig, SearchConfig
from reverie.models.records import MemoryView, MetaPlan
from reverie.models.repositories.memories import snapshot
from reverie.models.repositories.meta_memories import apply_meta_memories, meta_memories
from reverie.models.repositories.summaries import undone_summaries
from reverie.models.store import Store
from reverie.models.tables import Operation, Origin
from reverie.models.timestamps import days_between
from reverie.models.vectors import to_blob
from reverie.tasks.decay import none_above_note, relevance_notes
from reverie.tasks.step import Change, StepArgs, StepReport, preview, step_task
from reverie.tasks.summaries import drop_vetoed

OPERATION = Operation.CLUSTER
# Why a cluster's members were grouped, by ``cluster.method`` (its audit's ``rule``;
# ``similarities`` holds each member's cosine to the centroid, the meta-memory's vector).
RULES = {
    "components": "connected at the similarity: each linked to another member (single "
                  "linkage)",
    "leiden": "a Leiden community of the graph of pairs at the similarity",
}


def is_candidate(memory: MemoryView, config: ClusterConfig) -> bool:
    return (
        memory.is_live
        and memory.origin != Origin.META_MEMORY
        and memory.relevance is not None
        and memory.relevance > config.min_relevance
    )


def find_clusters(
    vectors: np.ndarray, config: ClusterConfig, seed: int = 0,
    search: SearchConfig = DEFAULT_SEARCH,
) -> list[list[int]]:
    """Row groups of at least ``min_cluster_size``, each sorted, ordered by first row."""
    i, j, sims = similarity_pairs(vectors, config.similarity, search)
    graph = similarity_graph(len(vectors), i, j, sims)
    labels = components(graph) if config.method == "components" else communities(graph, seed)
    groups: dict[int, list[int]] = {}
    for row, label in enumerate(labels):
        groups.setdefault(label, []).append(row)
    return [g for g in groups.values() if len(g) >= config.min_cluster_size]


def dominant_kind(members: Sequence[MemoryView]) -> str:
    counts = Counter(m.kind for m in members)
    return min(counts, key=lambda kind: (-counts[kind], kind))


def temporal_span_days(members: Sequence[MemoryView]) -> float:
    times = [m.created_at for m in members]
    return round(days_between(min(times), max(times)), 4)


def rules_description(members: Sequence[MemoryView], kind: str, config: ClusterConfig) -> str:
    span = temporal_span_days(members)
    best = sorted(members, key=lambda m: (-m.importance, m.id))[: config.exemplars]
    examples = " | ".join(
        m.content if len(m.content) <= config.exemplar_chars
        else m.content[: config.exemplar_chars - 1] + "…"
        for m in best
    )
    return f"Pattern of {len(members)} related {kind} memories over {span:.0f} days: {examples}"


def match_existing(
    clusters: Sequence[Sequence[str]], existing: dict[str, set[str]], overlap: float
) -> list[str | None]:
    """For each cluster, the earlier meta-memory it continues (or None). An earlier
    meta-memory is continued by the cluster holding the largest share of its members,
    if that share reaches ``overlap``; each is continued at most once."""
    taken: set[str] = set()
    out: list[str | None] = []
    for cluster in clusters:
        members = set(cluster)
        best: tuple[float, str] | None = None
        for meta_id in sorted(existing):
            old = existing[meta_id]
            if meta_id in taken or not old:
                continue
            share = len(members & old) / len(old)
            if share >= overlap and (best is None or share > best[0]):
                best = (share, meta_id)
        out.append(best[1] if best else None)
        if best:
            taken.add(best[1])
    return out


def plan_clusters(
    profile: str,
    memories: Sequence[MemoryView],
    vectors: np.ndarray,
    existing: dict[str, set[str]],
    config: ClusterConfig,
    seed: int = 0,
    search: SearchConfig = DEFAULT_SEARCH,
) -> list[MetaPlan]:
    """One MetaPlan per cluster among the candidates (rows of ``memories``/``vectors``),
    described by the rules."""
    candidates, cand_vectors = chosen_rows(memories, vectors, lambda m: is_candidate(m, config))
    groups = find_clusters(cand_vectors, config, seed, search.with_probes(config.cell_probes))
    clusters = [[candidates[r] for r in g] for g in groups]
    cluster_ids = [[m.id for m in c] for c in clusters]
    continued = match_existing(cluster_ids, existing, config.reuse_overlap)
    plans: list[MetaPlan] = []
    for group, members, earlier in zip(groups, clusters, continued, strict=True):
        kind = dominant_kind(members)
        centroid = cand_vectors[group].astype(np.float64).mean(axis=0)
        centroid /= np.linalg.norm(centroid)
        member_ids = tuple(sorted(m.id for m in members))
        plans.append(
            MetaPlan(
                meta_id=earlier or ids.summary_id(profile, OPERATION, member_ids),
                member_ids=member_ids,
                content=rules_description(members, kind, config),
                importance=max(m.importance for m in members),
                confidence=round(sum(m.confidence for m in members) / len(members), 6),
                stability=round(sum(m.stability for m in members) / len(members), 6),
                embedding=to_blob(centroid.astype(np.float32)),
                embedding_model=members[0].embedding_model,
                meta={
                    "dominant_kind": kind,
                    "cluster_size": len(members),
                    "temporal_span_days": temporal_span_days(members),
                    "method": config.method,
                },
                parameters={
                    "rule": RULES[config.method],
                    "similarity": config.similarity,
                    "min_cluster_size": config.min_cluster_size,
                    "method": config.method,
                    "mode": "rules",
                },
                similarities=dict(sorted(zip(
                    (m.id for m in members),
                    (round(float(sim), 6) for sim in exact_to(cand_vectors[group], centroid)),
                    strict=True))),
                sources=tuple(members),
            )
        )
    return plans


def exact_to(vectors: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """Each row's cosine to ``centre`` (unit vectors), summed in float64."""
    return np.einsum("ij,j->i", vectors, centre.astype(np.float64), dtype=np.float64)


def word_clusters(plans: list[MetaPlan], summarizer: Summarizer) -> list[MetaPlan]:
    """The plans described in the summarizer's words, where it gives any (a
    meta-memory keeps its cluster's centroid for a vector, however it is worded)."""
    worded = []
    for plan in plans:
        text = summarizer.describe_cluster(plan.sources, plan.meta["dominant_kind"])
        worded.append(replace(plan, content=text, parameters={
            **plan.parameters, "mode": summarizer.mode}) if text else plan)
    return worded


def cluster(store: Store, args: StepArgs) -> StepReport:
    """Describe each cluster of similar relevant memories with a meta-memory."""
    config = args.config.cluster
    with args.reading(store) as tx:
        memories, vectors = snapshot(tx)
        existing = meta_memories(tx)
        vetoed = undone_summaries(tx)
        stale = relevance_notes(tx, args.as_of, any(m.relevance is not None for m in memories),
                                args.config.decay)
    plans = plan_clusters(
        args.profile, memories, vectors, existing, config,
        args.config.graph.community_seed, args.config.search,
    )
    report = StepReport(
        "cluster", args.profile, examined=sum(is_candidate(m, config) for m in memories)
    )
    plans = drop_vetoed(vetoed, plans, lambda p: p.meta_id, report)
    summarizer = summarizer_for(args.config.summarizer)
    plans = word_clusters(plans, summarizer)
    with args.writing(store) as tx:
        changed = set(apply_meta_memories(tx, plans, args.as_of, args.run_id))
    for plan in plans:
        if plan.meta_id in changed:
            action = "updated" if plan.meta_id in existing else "created"
            detail = (
                f"{len(plan.member_ids)} {plan.meta['dominant_kind']} memories over "
                f"{plan.meta['temporal_span_days']:.1f} days ({config.method})"
            )
            report.record(Change(action, plan.meta_id, detail, preview(plan.content)))
    report.notes += stale
    report.notes += none_above_note(memories, config.min_relevance, "cluster")
    report.notes += fallback_notes(summarizer)
    report.facts = {"clusters": len(plans), "clustered": sum(len(p.member_ids) for p in plans)}
    return report


cluster_task = step_task("cluster", cluster)
