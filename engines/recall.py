"""Recall: the memories of one profile most similar to a query.

Searches the hot tier; ``deep`` adds the cold tier, where superseded originals live,
and a hit on one of them says which summary replaced it. With ``track`` the hits
count as accessed, which strengthens the associations among them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from reverie.engines.similarity import top_k
from reverie.models.records import MemoryView
from reverie.models.store import Store
from reverie.models.tables import Tier


@dataclass(frozen=True, slots=True)
class Hit:
    memory: MemoryView
    score: float

    @property
    def superseded_by(self) -> str | None:
        return self.memory.superseded_by


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
    memories, vectors = store.snapshot(profile, (Tier.HOT, Tier.COLD) if deep else (Tier.HOT,))
    if not memories or k <= 0:
        return []
    query_vector = store.embedder().encode([query])
    sims, idx = top_k(vectors, query_vector, k)
    hits = [
        Hit(memories[int(i)], round(float(s), 6))
        for s, i in zip(sims[0], idx[0], strict=True)
        if i >= 0
    ]
    if track and hits:
        store.record_access([h.memory.id for h in hits], at)
    return hits
