"""Recall against the store: read one profile's candidates in one snapshot, rank them
(``engines.ranking``, pure: what a hit is, recall keys, the cache), read whole only the
memories the hits show, and with ``track`` count the hits as accessed in one write.

This is the part of recall that touches the store, so it sits above models and engines:
engines know nothing of the store.
"""

from __future__ import annotations

from datetime import datetime

from reverie.engines.embedding import embedder_for
from reverie.engines.ranking import (
    Candidates,
    Hit,
    RecallCache,
    hits_from,
    passages,
    plan_candidates,
    shown_ids,
    tiers_for,
)
from reverie.models.config import RECALL_DEFAULT
from reverie.models.errors import InputError, NotFoundError
from reverie.models.records import MemoryView
from reverie.models.repositories.memories import outline, record_access, snapshot
from reverie.models.repositories.profiles import write_seq
from reverie.models.store import Store
from reverie.models.tables import Tier
from reverie.models.text import has_visible_text
from reverie.models.timestamps import utcnow


def candidates_for(store: Store, profile: str, deep: bool) -> Candidates[MemoryView]:
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
    cache: RecallCache | None = None,
) -> list[Hit]:
    """The ``k`` memories most like ``query``. With ``cache``, the profile's candidates
    come from it while the profile is unchanged; the hits are the same either way."""
    if not has_visible_text(query):
        # Embedded, an empty query answers with whatever lies nearest to nothing.
        raise InputError("the query shows no text: give the words to look for")
    vector = embedder_for(store.settings).encode([query]) if k > 0 else None
    # One snapshot: the profile's write count, its outline (ids and vectors) ranked,
    # then whole memories read only for what the hits show (building 10k of them took a
    # third of a recall at 10k memories).
    with store.reading(profile) as tx:
        seq = write_seq(tx.session, tx.profile)
        if seq is None:
            raise NotFoundError(f"no profile named {tx.profile!r}")
        if vector is None:
            return []
        candidates = None if cache is None else cache.get(store.url, tx.profile, deep, seq)
        if candidates is None:
            outlines, vectors = outline(tx, (Tier.HOT, Tier.COLD))
            candidates = plan_candidates(outlines, vectors, tiers_for(deep))
            if cache is not None:
                cache.put(store.url, tx.profile, deep, seq, candidates)
        if not candidates.memories:
            return []
        [found] = passages(candidates, vector, k)
        wanted = shown_ids(candidates, found)
        # A cached entry's memories read before are the same rows: read only the others.
        # One ``get`` each: the cache may forget them meanwhile (``RecallCache.remember``).
        known = {i: v for i in wanted if (v := candidates.shown.get(i)) is not None}
        missing = [i for i in wanted if i not in known]
        if missing:
            views, _ = snapshot(tx, (Tier.HOT, Tier.COLD), missing)
            known.update((v.id, v) for v in views)
            if cache is not None:
                cache.remember(store.url, tx.profile, deep, candidates, views)
    hits = hits_from(candidates, found, known)
    if deep:
        hits = successors_first(hits)
    if track and hits:
        with store.writing(profile) as tx:
            record_access(tx, [h.memory.id for h in hits], at or utcnow(),
                          RECALL_DEFAULT.co_access_bonus)
    return hits


def successors_first(hits: list[Hit]) -> list[Hit]:
    """The same hits, each one a newer memory replaced (an older value superseded, a
    merge's member) moved to right after that memory when it is a hit too: deep recall
    put "the rent is 900 euros" (cold) above "the rent is now 1000 euros" it found as
    well. The others keep their rank."""
    shown = {h.memory.id for h in hits}
    after: dict[str, list[Hit]] = {}
    first: list[Hit] = []
    for h in hits:
        newer = h.memory.superseded_by
        if newer in shown and newer != h.memory.id:
            after.setdefault(newer, []).append(h)
        else:
            first.append(h)
    ordered: list[Hit] = []

    def place(h: Hit) -> None:
        ordered.append(h)
        for follower in after.pop(h.memory.id, []):
            place(follower)

    for h in first:
        place(h)
    return ordered + [h for rest in after.values() for h in rest]  # never dropped
