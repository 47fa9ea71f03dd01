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

What a recalled summary shows is what it was found by: the members (cold originals)
whose keys ranked among the passages recall went through, whole and each at its own
date, in date order, not the whole summary (``Hit.members``, ``Hit.text``); the summary
itself is one ``reverie get`` away. (Tried and not kept: the whole summary when it is no
shorter than its matches; on LoCoMo, a merge shown whole is dated when it was written, and
one of three conversations lost 3 answers in 2,000 characters.) A summary of eight does
not spend a context's room on seven facts nobody asked for. A key of a memory that is
not a summary (the older value of an update chain) never shows: its hit shows the
newest value, whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np

from reverie.engines.embedding import embedder_for
from reverie.engines.similarity import top_k
from reverie.models.config import RECALL_DEFAULT
from reverie.models.records import MemoryView
from reverie.models.repositories.memories import outline, record_access, snapshot
from reverie.models.store import Store
from reverie.models.tables import SUMMARY_ORIGINS, Tier
from reverie.models.timestamps import utcnow


def dated(memory: MemoryView) -> str:
    """A memory as a context shows it: its words and its day."""
    d = memory.created_at
    return f"{memory.content} ({d.day} {d:%B %Y})"


@dataclass(frozen=True, slots=True)
class Hit:
    memory: MemoryView
    score: float
    # The summary's members that matched, oldest first; empty: the memory shows whole.
    members: tuple[MemoryView, ...] = ()

    @property
    def superseded_by(self) -> str | None:
        return self.memory.superseded_by

    @property
    def excerpted(self) -> bool:
        """Whether recall shows the matched members rather than the whole memory."""
        return bool(self.members)

    @property
    def text(self) -> str:
        """What recall shows: the matched members, each whole and dated, else the
        memory's own words."""
        if not self.members:
            return self.memory.content
        return "\n".join(dated(m) for m in self.members)


@dataclass(frozen=True)
class Candidates:
    """What recall ranks: memories row-aligned with their vectors, and recall keys
    (extra vectors, each scoring the memory at the same row of ``key_owners``)."""

    memories: list[MemoryView]
    vectors: np.ndarray
    key_vectors: np.ndarray
    key_owners: np.ndarray
    # The original each key is the vector of (row-aligned with ``key_owners``).
    key_memories: tuple[MemoryView, ...] = ()

    def shows_members(self, row: int) -> bool:
        """Whether a hit on ``row`` through a key shows the key's original: only a
        summary's originals are its statements; an update's older value is not current."""
        return self.memories[row].origin in SUMMARY_ORIGINS


def tiers_for(deep: bool) -> tuple[str, ...]:
    return (Tier.HOT, Tier.COLD) if deep else (Tier.HOT,)


def plan_candidates(
    memories: Sequence[MemoryView], vectors: np.ndarray, tiers: Sequence[str]
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

    def standing_in(m: MemoryView) -> bool:
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
        # Standing in for its summary (above): superseded_by is set.
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
        tuple(memories[r] for r, _ in keys),
    )


# A passage: (candidate row, key index or -1 for the row's own vector, score).
Passage = tuple[int, int, float]


def passages(candidates: Candidates, queries: np.ndarray, k: int) -> list[list[Passage]]:
    """Per query, the passages (each keyless candidate's own vector, each key) best
    first, up to and including the one that brings the ``k``-th distinct row. A row
    with keys is found by them alone (its own vector blurs its members together)."""
    n = len(candidates.memories)
    if n == 0 or k <= 0:
        return [[] for _ in range(len(queries))]
    keys = len(candidates.key_owners)
    keyless = np.setdiff1d(np.arange(n, dtype=np.int64), candidates.key_owners)
    owners = np.concatenate([keyless, candidates.key_owners])
    key_of = np.concatenate([np.full(len(keyless), -1, np.int64), np.arange(keys)])
    every = (np.vstack([candidates.vectors[keyless], candidates.key_vectors]) if keys
             else candidates.vectors[keyless])
    # A row repeats at most once per key, so k + keys places hold k distinct rows.
    sims, idx = top_k(every, queries, min(len(every), k + keys))
    out: list[list[Passage]] = []
    for srow, irow in zip(sims, idx, strict=True):
        seen: set[int] = set()
        found: list[Passage] = []
        for s, i in zip(srow, irow, strict=True):
            if i < 0:
                continue
            row = int(owners[i])
            if row not in seen:
                if len(seen) == k:
                    break
                seen.add(row)
            found.append((row, int(key_of[i]), float(s)))
        out.append(found)
    return out


def hits_from(candidates: Candidates, found: Sequence[Passage]) -> list[Hit]:
    """The hits of one query's passages: one per row, at its best passage's place and
    score, a summary with the members whose keys are among the passages."""
    order: list[int] = []
    score: dict[int, float] = {}
    members: dict[int, list[MemoryView]] = {}
    for row, key, s in found:
        if row not in score:
            order.append(row)
            score[row] = s
        if key >= 0 and candidates.shows_members(row):
            members.setdefault(row, []).append(candidates.key_memories[key])
    return [
        Hit(candidates.memories[row], round(score[row], 6),
            tuple(sorted(members.get(row, []), key=lambda m: (m.created_at, m.id))))
        for row in order
    ]


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
    # memories read only for what the hits show (building 10k of them took a third of
    # a recall at 10k memories).
    with store.reading(profile) as tx:
        outlines, vectors = outline(tx, (Tier.HOT, Tier.COLD))
        # Outlines have every field plan_candidates reads (id, tier, superseded_by, origin).
        candidates = plan_candidates(outlines, vectors, tiers_for(deep))  # type: ignore[arg-type]
        if not candidates.memories:
            return []
        [found] = passages(candidates, vector, k)
        shown = [candidates.memories[row].id for row, _, _ in found]
        shown += [candidates.key_memories[key].id for _, key, _ in found if key >= 0]
        views, _ = snapshot(tx, (Tier.HOT, Tier.COLD), shown)
    whole = {v.id: v for v in views}
    candidates = replace(
        candidates, memories=[whole.get(m.id, m) for m in candidates.memories],
        key_memories=tuple(whole.get(m.id, m) for m in candidates.key_memories))
    hits = hits_from(candidates, found)
    if track and hits:
        with store.writing(profile) as tx:
            record_access(tx, [h.memory.id for h in hits], at or utcnow(),
                          RECALL_DEFAULT.co_access_bonus)
    return hits
