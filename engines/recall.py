"""Recall: the memories of one profile most similar to a query.

Searches the hot tier; ``deep`` adds the cold tier, where superseded originals live,
and a hit on one of them says which summary replaced it. With ``track`` the hits
count as accessed, which strengthens the associations among them.

A summary is found by what it stands for: its score is the best of its originals'
vectors (its recall keys), not its own. A short question about one fact is closer to the one
original that holds it than to a summary of eight; without keys, compressing a fact
would make it harder to find. Keys are only the originals outside the tiers searched:
deep recall ranks the originals themselves, and a summary whose originals are all
there is left out of it, so deep recall ranks what the store held before any
consolidation and spends no room twice on the same facts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, TypeVar

import numpy as np

from reverie.engines.embedding import embedder_for
from reverie.engines.similarity import top_k
from reverie.models.config import RECALL_DEFAULT
from reverie.models.records import MemoryView
from reverie.models.repositories.memories import outline, record_access, snapshot
from reverie.models.store import Store
from reverie.models.tables import SUMMARY_ORIGINS, Tier
from reverie.models.timestamps import utcnow


@dataclass(frozen=True, slots=True)
class Hit:
    memory: MemoryView
    score: float

    @property
    def superseded_by(self) -> str | None:
        return self.memory.superseded_by


class Planned(Protocol):
    """What ``plan_candidates`` reads of a memory (a ``MemoryView`` or an ``Outline``)."""

    @property
    def id(self) -> str: ...
    @property
    def tier(self) -> str: ...
    @property
    def superseded_by(self) -> str | None: ...
    @property
    def origin(self) -> str: ...


P = TypeVar("P", bound=Planned)


@dataclass(frozen=True)
class Candidates:
    """What recall ranks: memories row-aligned with their vectors, and recall keys
    (extra vectors, each scoring the memory at the same row of ``key_owners``)."""

    memories: list[MemoryView]
    vectors: np.ndarray
    key_vectors: np.ndarray
    key_owners: np.ndarray


def tiers_for(deep: bool) -> tuple[str, ...]:
    return (Tier.HOT, Tier.COLD) if deep else (Tier.HOT,)


def plan_candidates(
    memories: Sequence[P], vectors: np.ndarray, tiers: Sequence[str]
) -> Candidates:
    """The candidates among ``memories`` (every tier of a profile, with their vectors) for
    a recall over ``tiers``: the memories in ``tiers``, less the summaries whose originals
    are all there, and the keys of the summaries whose originals are not."""
    wanted = set(tiers)
    in_tiers = {m.id for m in memories if m.tier in wanted}
    originals: dict[str, list[int]] = {}
    for row, m in enumerate(memories):
        if m.superseded_by is not None and m.origin not in SUMMARY_ORIGINS:
            originals.setdefault(m.superseded_by, []).append(row)

    def standing_in(m: P) -> bool:
        """A summary whose every original is ranked in its own right."""
        if m.origin not in SUMMARY_ORIGINS:
            return False
        if m.superseded_by is not None:  # absorbed by a later summary: its originals moved on
            return True
        rows = originals.get(m.id, [])
        return bool(rows) and all(memories[r].id in in_tiers for r in rows)

    kept = [r for r, m in enumerate(memories) if m.id in in_tiers and not standing_in(m)]
    position = {memories[r].id: n for n, r in enumerate(kept)}
    keys = [
        (r, position[memories[r].superseded_by])  # type: ignore[index]
        for r, m in enumerate(memories)
        if m.id not in in_tiers and m.origin not in SUMMARY_ORIGINS
        and m.superseded_by in position
    ]
    dim = vectors.shape[1] if vectors.ndim == 2 else 0
    return Candidates(
        [memories[r] for r in kept],
        vectors[kept] if kept else np.zeros((0, dim), np.float32),
        vectors[[r for r, _ in keys]] if keys else np.zeros((0, dim), np.float32),
        np.array([owner for _, owner in keys], dtype=np.int64),
    )


def rank(candidates: Candidates, queries: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
    """Per query, the ``k`` best candidate rows with their scores, best first; a row
    with keys scores as its best key, any other as its own vector."""
    n = len(candidates.memories)
    if n == 0 or k <= 0:
        return [[] for _ in range(len(queries))]
    if len(candidates.key_owners) == 0:
        sims, idx = top_k(candidates.vectors, queries, k)
        return [
            [(int(i), float(s)) for s, i in zip(srow, irow, strict=True) if i >= 0]
            for srow, irow in zip(sims, idx, strict=True)
        ]
    # A summary with keys is scored by them alone: its own vector blurs its members
    # together, and is never closer to a question than the member that answers it.
    keyless = np.setdiff1d(np.arange(n, dtype=np.int64), candidates.key_owners)
    owners = np.concatenate([keyless, candidates.key_owners])
    every = np.vstack([candidates.vectors[keyless], candidates.key_vectors])
    # A row repeats at most once per key, so k + keys places hold k distinct rows.
    sims, idx = top_k(every, queries, min(len(every), k + len(candidates.key_owners)))
    out: list[list[tuple[int, float]]] = []
    for srow, irow in zip(sims, idx, strict=True):
        seen: set[int] = set()
        best: list[tuple[int, float]] = []
        for s, i in zip(srow, irow, strict=True):  # best first: a row's first place is its score
            if i < 0:
                continue
            row = int(owners[i])
            if row not in seen:
                seen.add(row)
                best.append((row, float(s)))
                if len(best) == k:
                    break
        out.append(best)
    return out


def candidates_for(store: Store, profile: str, deep: bool) -> Candidates:
    with store.reading(profile) as tx:
        memories, vectors = snapshot(tx, (Tier.HOT, Tier.COLD))
    return plan_candidates(memories, vectors, tiers_for(deep))


def recall(
    store: Store,
    profile: str,
    query: str,
    k: int = 5,
    deep: bool = False,
    track: bool = False,
    at: datetime | None = None,
) -> list[Hit]:
    store.resolve_profiles(profile)
    if k <= 0:
        return []
    vector = embedder_for(store.settings).encode([query])
    # One transaction: the profile's outline (ids and vectors) ranked, then whole
    # memories read for the hits only (building 10k of them took a third of a recall).
    with store.reading(profile) as tx:
        outlines, vectors = outline(tx, (Tier.HOT, Tier.COLD))
        candidates = plan_candidates(outlines, vectors, tiers_for(deep))
        if not candidates.memories:
            return []
        [best] = rank(candidates, vector, k)
        ids = [candidates.memories[row].id for row, _ in best]
        views, _ = snapshot(tx, (Tier.HOT, Tier.COLD), ids)
    by_id = {v.id: v for v in views}
    hits = [Hit(by_id[candidates.memories[row].id], round(score, 6)) for row, score in best]
    if track and hits:
        with store.writing(profile) as tx:
            record_access(tx, [h.memory.id for h in hits], at or utcnow(),
                          RECALL_DEFAULT.co_access_bonus)
    return hits
