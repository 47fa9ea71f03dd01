"""Recall's ranking, pure: the memories of one profile most similar to a query, among
candidates already read (``recall.search`` reads them from the store).

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

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Generic, Protocol, TypeVar

import numpy as np

from reverie.engines.similarity import FlatSearch
from reverie.models.ids import restatement_id
from reverie.models.records import MemoryView
from reverie.models.tables import SUMMARY_ORIGINS, Origin, Tier


def day(at: datetime) -> str:
    """A day as summaries and recall write it: "12 May 2023"."""
    return f"{at.day} {at:%B %Y}"


def dated(memory: MemoryView) -> str:
    """A memory as a context shows it: its words and its day."""
    return f"{memory.content} ({day(memory.created_at)})"


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


class Ranked(Protocol):
    """What recall plans its candidates from: a whole ``MemoryView``, or the outline of
    one (``repositories.memories.Outline``) when only the hits are read whole."""

    @property
    def id(self) -> str: ...
    @property
    def tier(self) -> str: ...
    @property
    def superseded_by(self) -> str | None: ...
    @property
    def origin(self) -> str: ...


R = TypeVar("R", bound=Ranked)


@dataclass(frozen=True)
class Searchable:
    """The vectors one query is ranked against, each naming its candidate row and its
    key (-1: the row's own vector), with their index built once."""

    search: FlatSearch
    owners: np.ndarray
    key_of: np.ndarray


# A memory read whole, beside its content (at most 4 bytes a character): its other
# fields, as Python objects.
SHOWN_ROW_BYTES = 2048


@dataclass(frozen=True)
class Candidates(Generic[R]):
    """What recall ranks: memories row-aligned with their vectors, and recall keys
    (extra vectors, each scoring the memory at the same row of ``key_owners``)."""

    memories: list[R]
    vectors: np.ndarray
    key_vectors: np.ndarray
    key_owners: np.ndarray
    # The original each key is the vector of (row-aligned with ``key_owners``).
    key_memories: tuple[R, ...] = ()
    # Memories read whole for earlier hits, by id. They hold as long as the candidates
    # do: a cached entry holds while the profile's write count does, and every write
    # bumps it. Reading 5 hits by id was the largest part of a cached recall outside
    # the model (0.5 of 6 ms of CPU, 8 clients at 10k).
    shown: dict[str, MemoryView] = field(default_factory=dict, compare=False, repr=False)

    def shows_members(self, row: int) -> bool:
        """Whether a hit on ``row`` through a key shows the key's original: only a
        summary's originals are its statements; an update's older value is not current."""
        return self.memories[row].origin in SUMMARY_ORIGINS

    @cached_property
    def own_rows(self) -> np.ndarray:
        """The rows found by their own vector: all but the summaries with keys, which
        are found by them alone (a summary's vector blurs its members together). The
        newest memory of an update is found by its own words as well as by the older
        values it replaced."""
        keyed = np.unique(self.key_owners)
        blurred = [r for r in keyed.tolist() if self.shows_members(r)]
        return np.setdiff1d(np.arange(len(self.memories), dtype=np.int64),
                            np.array(blurred, dtype=np.int64))

    @cached_property
    def searchable(self) -> Searchable:
        """Built on first use and kept with the candidates: a cached profile's queries
        share it."""
        keys, own = len(self.key_owners), self.own_rows
        owners = np.concatenate([own, self.key_owners])
        key_of = np.concatenate([np.full(len(own), -1, np.int64), np.arange(keys)])
        every = (np.vstack([self.vectors[own], self.key_vectors]) if keys
                 else self.vectors[own])
        return Searchable(FlatSearch(every), owners, key_of)

    @property
    def nbytes(self) -> int:
        """About what keeping them costs, searchable built, memories read whole so far."""
        shown = sum(map(shown_bytes, list(self.shown.values())))
        return (self.vectors.nbytes + self.key_vectors.nbytes + self.searchable.search.nbytes
                + shown)


def shown_bytes(view: MemoryView) -> int:
    """About what keeping one memory read whole costs."""
    return SHOWN_ROW_BYTES + 4 * len(view.content)


def tiers_for(deep: bool) -> tuple[str, ...]:
    return (Tier.HOT, Tier.COLD) if deep else (Tier.HOT,)


def plan_candidates(
    memories: Sequence[R], vectors: np.ndarray, tiers: Sequence[str]
) -> Candidates[R]:
    """The candidates among ``memories`` (every tier of a profile, with their vectors) for
    a recall over ``tiers``: the memories in ``tiers``, less the summaries whose originals
    are all there, and the keys of the summaries whose originals are not."""
    wanted = set(tiers)
    in_tiers = {m.id for m in memories if m.tier in wanted}
    originals: dict[str, list[int]] = {}
    for row, m in enumerate(memories):
        if m.superseded_by is not None and m.origin not in SUMMARY_ORIGINS:
            originals.setdefault(m.superseded_by, []).append(row)

    def standing_in(m: R) -> bool:
        """A summary whose every original is ranked in its own right."""
        if m.origin not in SUMMARY_ORIGINS:
            return False
        if m.superseded_by is not None:  # absorbed by a later summary: its originals moved on
            return True
        rows = originals.get(m.id, [])
        return bool(rows) and all(memories[r].id in in_tiers for r in rows)

    kept = [r for r, m in enumerate(memories) if m.id in in_tiers and not standing_in(m)]
    position = {memories[r].id: n for n, r in enumerate(kept)}
    # An older memory whose other statements were restated (``tasks.supersede``) is no
    # key of the update: a question about its other fact would find the newest, which
    # does not state it, instead of the restatement, which does and is ranked itself.
    restated = {m.id for m in memories if m.origin == Origin.RESTATED and m.id in in_tiers}
    keys = [
        # Standing in for its summary (above): superseded_by is set.
        (r, position[memories[r].superseded_by])  # type: ignore[index]
        for r, m in enumerate(memories)
        if m.id not in in_tiers and m.origin not in SUMMARY_ORIGINS
        and m.superseded_by in position
        and not (restated and restatement_id(m.id) in restated)
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


def passages(candidates: Candidates[R], queries: np.ndarray, k: int) -> list[list[Passage]]:
    """Per query, the passages (each candidate's own vector but a keyed summary's, each
    key) best first, up to and including the one that brings the ``k``-th distinct
    row (``Candidates.own_rows``)."""
    n = len(candidates.memories)
    if n == 0 or k <= 0:
        return [[] for _ in range(len(queries))]
    keys = len(candidates.key_owners)
    searchable = candidates.searchable
    owners, key_of = searchable.owners, searchable.key_of
    # A row repeats at most once per key, so k + keys places hold k distinct rows.
    sims, idx = searchable.search.top_k(queries, min(len(owners), k + keys))
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


def shown_ids(candidates: Candidates[R], found: Sequence[Passage]) -> list[str]:
    """The memories one query's hits show (``hits_from``): each hit's row and each key
    it was found by, in passage order. Only these are read whole."""
    return ([candidates.memories[row].id for row, _, _ in found]
            + [candidates.key_memories[key].id for _, key, _ in found if key >= 0])


def hits_from(
    candidates: Candidates[R], found: Sequence[Passage], views: Mapping[str, MemoryView]
) -> list[Hit]:
    """The hits of one query's passages: one per row, at its best passage's place and
    score, a summary with the members whose keys are among the passages; the memories
    shown are ``views`` (by id: every id of ``shown_ids``)."""
    order: list[int] = []
    score: dict[int, float] = {}
    members: dict[int, list[MemoryView]] = {}
    for row, key, s in found:
        if row not in score:
            order.append(row)
            score[row] = s
        if key >= 0 and candidates.shows_members(row):
            members.setdefault(row, []).append(views[candidates.key_memories[key].id])
    return [
        Hit(views[candidates.memories[row].id], round(score[row], 6),
            tuple(sorted(members.get(row, []), key=lambda m: (m.created_at, m.id))))
        for row in order
    ]


def rank(candidates: Candidates[R], queries: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
    """Per query, the ``k`` best candidate rows with their scores, best first; a summary
    with keys scores as its best key, any other row as the best of its own vector and
    its keys: each row at its first passage (``passages``)."""
    out: list[list[tuple[int, float]]] = []
    for found in passages(candidates, queries, k):
        best: dict[int, float] = {}
        for row, _, score in found:  # best first: a row's first place is its score
            best.setdefault(row, score)
        out.append(list(best.items()))
    return out


@dataclass
class _Entry:
    seq: int
    candidates: Candidates[Ranked]
    nbytes: int  # the candidates' when put, with what they remembered since


class RecallCache:
    """The candidates of recently recalled profiles, kept by a long-lived process (the
    agent servers), up to ``budget_bytes``, least recently used first out.

    An entry holds while its profile's write count (``Profile.write_seq``, bumped by
    every write transaction of the profile) is the one it was read at; a recall reads
    the count in its own snapshot (one row) and the entry's memories must match it, so
    a write by any process is seen by the next recall. Without a cache a recall reads
    the whole profile's vectors each time (15 MB at 10k memories). The memories an
    entry's hits read whole (``remember``) count toward the budget as they come."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str, bool], _Entry] = OrderedDict()
        self._total = 0
        self.hits = self.misses = 0

    def get(self, url: str, profile: str, deep: bool, seq: int) -> Candidates[Ranked] | None:
        key = (url, profile, deep)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.seq != seq:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry.candidates

    def put(self, url: str, profile: str, deep: bool, seq: int,
            candidates: Candidates[Ranked]) -> None:
        size = candidates.nbytes  # the search index built here, outside the lock
        if size > self.budget_bytes:
            return
        key = (url, profile, deep)
        with self._lock:
            held = self._entries.get(key)
            if held is not None and held.seq > seq:
                return  # a newer state is held already (an older read finished later)
            if held is not None:
                self._total -= held.nbytes
            self._entries[key] = _Entry(seq, candidates, size)
            self._entries.move_to_end(key)
            self._total += size
            self._trim()

    def remember(self, url: str, profile: str, deep: bool, candidates: Candidates[Ranked],
                 views: Sequence[MemoryView]) -> None:
        """``views``, read whole for hits on ``candidates``, kept with them while they
        are the entry held (the same rows: every write bumps the write count). Over the
        budget, the least recently used entries go first; alone, the entry forgets
        what it remembered (the next hits read their memories again)."""
        key = (url, profile, deep)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.candidates is not candidates:
                return  # not kept (too large, or replaced meanwhile): nothing to add to
            new = [v for v in views if v.id not in candidates.shown]
            candidates.shown.update((v.id, v) for v in new)
            grown = sum(map(shown_bytes, new))
            entry.nbytes += grown
            self._total += grown
            self._entries.move_to_end(key)
            self._trim()
            if self._total > self.budget_bytes:
                forgotten = sum(map(shown_bytes, candidates.shown.values()))
                candidates.shown.clear()
                entry.nbytes -= forgotten
                self._total -= forgotten

    def _trim(self) -> None:
        while self._total > self.budget_bytes and len(self._entries) > 1:
            _, dropped = self._entries.popitem(last=False)
            self._total -= dropped.nbytes

    @property
    def nbytes(self) -> int:
        """What the entries held cost, by the budget's count."""
        with self._lock:
            return self._total

    def __len__(self) -> int:
        return len(self._entries)
