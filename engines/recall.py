"""Recall: the memories of one profile most similar to a query.

Searches the hot tier; ``deep`` adds the cold tier, where superseded originals live,
and a hit on one of them says which summary replaced it. With ``track`` the hits
count as accessed, which strengthens the associations among them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from reverie.engines.similarity import top_k
from reverie.models.config import RECALL_DEFAULT
from reverie.models.embeddings import get_embedder
from reverie.models.records import MemoryView
from reverie.models.repositories.memories import record_access, snapshot
from reverie.models.store import Store
from reverie.models.tables import Tier
from reverie.models.timestamps import utcnow


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
    with store.reading(profile) as tx:
        memories, vectors = snapshot(tx, (Tier.HOT, Tier.COLD) if deep else (Tier.HOT,))
    if not memories or k <= 0:
        return []
    embedder = get_embedder(store.settings.embedding_model_path,
                            store.settings.embedding_batch_size)
    query_vector = embedder.encode([query])
    sims, idx = top_k(vectors, query_vector, k)
    hits = [
        Hit(memories[int(i)], round(float(s), 6))
        for s, i in zip(sims[0], idx[0], strict=True)
        if i >= 0
    ]
    if track and hits:
        with store.writing(profile) as tx:
            record_access(tx, [h.memory.id for h in hits], at or utcnow(),
                          RECALL_DEFAULT.co_access_bonus)
    return hits
