"""Creative association discovery (AutoMem's weekly task).

A sample of the profile's relevant memories (relevance > 0.3; 20 by default) is
drawn with a generator seeded by the profile and ``as_of``, so a re-run of the same
date draws the same sample. Every pair in the sample not already joined by an edge
is tested against four rules, in order; the first that matches creates a typed edge:

1. both decisions, similarity < 0.3        -> ``contradicts``        (confidence 0.6)
2. an insight and a pattern, similarity > 0.5 -> ``discovered/explains`` (0.7), insight -> pattern
3. different kinds, similarity > 0.7       -> ``discovered/shares_theme`` (confidence = similarity)
4. created within 7 days, similarity < 0.4 -> ``discovered/parallel_context`` (0.5)

The thresholds and confidences above are CreativeConfig's defaults. Edges carry their
confidence (also their weight), when they were discovered and by which algorithm.
Once linked, a pair is skipped, so a second run adds nothing.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from datetime import datetime

import numpy as np

from reverie.engines.similarity import pair_similarities
from reverie.models.config import CreativeConfig
from reverie.models.records import MemoryView, NewEdge
from reverie.models.repositories.edges import add_edges, linked_pairs
from reverie.models.repositories.memories import live_ids, relevance_spread, snapshot
from reverie.models.store import Store
from reverie.models.tables import EdgeKind
from reverie.models.timestamps import days_between
from reverie.tasks.decay import none_above_note, relevance_notes
from reverie.tasks.step import Change, StepArgs, StepReport, step_task

ALGORITHM = "creative_association"


def is_candidate(memory: MemoryView, config: CreativeConfig) -> bool:
    return (
        memory.is_live
        and memory.relevance is not None
        and memory.relevance > config.min_relevance
    )


def draw_sample(count: int, size: int, profile: str, as_of: datetime) -> list[int]:
    """Row indices of the sample: the same profile and date always draw the same rows."""
    seed = hashlib.sha256(f"{profile}\x1f{as_of.isoformat()}".encode()).digest()
    return sorted(random.Random(seed).sample(range(count), min(size, count)))


def connection(a: MemoryView, b: MemoryView, sim: float, config: CreativeConfig) -> NewEdge | None:
    """The edge the first matching rule creates between ``a`` and ``b``, if any."""
    kinds = {a.kind, b.kind}
    if a.kind == b.kind == "decision" and sim < config.contradiction_below:
        confidence = config.contradiction_confidence
        return NewEdge(a.id, b.id, EdgeKind.CONTRADICTS, confidence, confidence=confidence)
    if kinds == {"insight", "pattern"} and sim > config.explains_above:
        insight, pattern = (a, b) if a.kind == "insight" else (b, a)
        confidence = config.explains_confidence
        return NewEdge(insight.id, pattern.id, EdgeKind.DISCOVERED, confidence, "explains",
                       confidence)
    if a.kind != b.kind and sim > config.shared_theme_above:
        confidence = round(sim, 6)
        return NewEdge(a.id, b.id, EdgeKind.DISCOVERED, confidence, "shares_theme", confidence)
    apart_days = abs(days_between(b.created_at, a.created_at))
    if apart_days <= config.parallel_within_days and sim < config.parallel_below:
        confidence = config.parallel_confidence
        return NewEdge(a.id, b.id, EdgeKind.DISCOVERED, confidence, "parallel_context",
                       confidence)
    return None


def plan_creative(
    sample: Sequence[MemoryView],
    vectors: np.ndarray,
    linked: set[frozenset[str]],
    as_of: datetime,
    config: CreativeConfig,
) -> tuple[list[NewEdge], int]:
    """(edges to create, pairs skipped because already linked) for a sample."""
    sims = pair_similarities(vectors)
    edges: list[NewEdge] = []
    skipped = 0
    meta = {"discovered_at": as_of.isoformat(), "algorithm": ALGORITHM}
    for i in range(len(sample)):
        for j in range(i + 1, len(sample)):
            a, b = sample[i], sample[j]
            if frozenset((a.id, b.id)) in linked:
                skipped += 1
                continue
            edge = connection(a, b, float(sims[i, j]), config)
            if edge is not None:
                edges.append(NewEdge(edge.source_id, edge.target_id, edge.kind, edge.weight,
                                     edge.subkind, edge.confidence, meta))
    return edges, skipped


def creative(store: Store, args: StepArgs) -> StepReport:
    """Link pairs of a reproducible sample of relevant memories by the four rules."""
    config = args.config.creative
    # Only the sample is read: what this costs follows the sample, not the profile.
    # The candidates are is_candidate's memories, drawn by id in the store's order.
    with args.reading(store) as tx:
        candidates = live_ids(tx, relevance_above=config.min_relevance)
        drawn = draw_sample(len(candidates), config.sample_size, args.profile, args.as_of)
        sample, vectors = snapshot(tx, ids_=[candidates[k] for k in drawn])
        linked = linked_pairs(tx, [m.id for m in sample])
        # A candidate is scored above the floor: only an empty draw needs the profile's
        # whole spread, to say why it is empty (a third of this step's reads otherwise).
        spread = None if candidates else relevance_spread(tx)
        scored = spread is None or spread.scored > 0
        stale = relevance_notes(tx, args.as_of, scored, args.config.decay)
    edges, skipped = plan_creative(sample, vectors, linked, args.as_of, config)
    with args.writing(store) as tx:
        add_edges(tx, edges, args.as_of)
    pairs = len(sample) * (len(sample) - 1) // 2
    report = StepReport("creative", args.profile, examined=pairs, skipped=skipped)
    report.notes += stale
    if spread is not None:
        report.notes += none_above_note(spread, config.min_relevance, "sample for associations")
    for e in edges:
        label = e.kind if e.subkind is None else f"{e.kind}/{e.subkind}"
        detail = f"{label}, confidence {e.confidence:.3f}"
        report.record(Change("linked", f"{e.source_id} -> {e.target_id}", detail))
    report.facts = {"candidates": len(candidates), "sample": len(sample)}
    return report


creative_task = step_task("creative", creative)
