"""Plain records that pass between the store and the pure step functions.

The store reads rows into these, a step's pure function turns them into a plan made
of these, and the store writes the plan in one transaction. None holds a session.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from reverie.models.tables import Lifecycle, Tier


@dataclass(frozen=True, slots=True)
class MemoryView:
    """What the steps read of a memory (its vector travels separately, row-aligned)."""

    id: str
    profile_id: str
    content: str
    kind: str
    importance: float
    confidence: float
    stability: float
    access_count: int
    created_at: datetime
    external_id: str | None = None
    entity: str | None = None
    layer: str | None = None
    last_accessed_at: datetime | None = None
    valid_from: datetime | None = None
    valid_until: datetime | None = None
    session_id: str | None = None
    status: str | None = None
    protected: bool = False
    lifecycle: str = "active"
    tier: str = "hot"
    superseded_by: str | None = None
    origin: str = "ingest"
    linked_at: datetime | None = None
    relevance: float | None = None
    embedding_model: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def is_live(self) -> bool:
        """In the working set: hot, not replaced by a summary, not archived."""
        return (
            self.tier == Tier.HOT
            and self.superseded_by is None
            and self.lifecycle in (Lifecycle.ACTIVE, Lifecycle.PROMOTED)
        )

    def valid_at(self, at: datetime) -> bool:
        """Temporally valid: started (or no start) and not yet ended at ``at``."""
        started = self.valid_from is None or self.valid_from <= at
        ended = self.valid_until is not None and self.valid_until <= at
        return started and not ended


@dataclass(frozen=True, slots=True)
class SummaryPlan:
    """A new summary memory standing in for ``member_ids``, which go cold."""

    summary_id: str
    operation: str
    member_ids: tuple[str, ...]
    content: str
    kind: str
    importance: float
    confidence: float
    stability: float
    access_count: int
    created_at: datetime
    last_accessed_at: datetime | None
    valid_from: datetime | None
    valid_until: datetime | None
    entity: str | None = None
    layer: str | None = None
    session_id: str | None = None
    representative_id: str | None = None
    # Earlier summaries this one takes over; ``member_ids`` holds their originals.
    absorbed_ids: tuple[str, ...] = ()
    protected: bool = False
    # Weight of the provenance edge from the summary to each original.
    link_weight: float = 1.0
    # Unit float32 vector bytes, the summary's own embedding, and the model that made it.
    embedding: bytes | None = None
    embedding_model: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # Why the members were grouped: the rule and its knobs (``rule``, the representative
    # or seed...), kept in the audit row with ``similarities``.
    parameters: dict[str, Any] = field(default_factory=dict)
    # Each memory the rule grouped (a member, or an earlier summary it absorbs) and its
    # cosine to the group's representative or seed, as the search found it: the audit's
    # "why". Empty where the rule is not a similarity (cold notes group by entity).
    similarities: dict[str, float] = field(default_factory=dict)
    # The words a fresh vector is made from, when not the whole ``content`` (a
    # compression's, without its dates: see ``tasks.compress.Digest``); never stored.
    gist: str | None = field(default=None, compare=False, repr=False)
    # What a summarizer reads to reword it, in the order it reads them; never stored.
    sources: tuple[MemoryView, ...] = field(default=(), compare=False, repr=False)
    # (tier, lifecycle, superseded_by) of each memory it replaces (members and absorbed
    # summaries), as the plan read them: the write goes ahead only if they still hold
    # these, and an undo restores them.
    priors: dict[str, tuple[str, str, str | None]] = field(
        default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class BlockPlan:
    block_type: str
    content: str
    source_ids: tuple[str, ...]
    mode: str = "rules"


@dataclass(frozen=True, slots=True)
class EdgeView:
    id: str
    source_id: str
    target_id: str
    kind: str
    weight: float
    base_weight: float
    last_strengthened_at: datetime
    subkind: str | None = None


@dataclass(frozen=True, slots=True)
class NewEdge:
    source_id: str
    target_id: str
    kind: str
    weight: float
    subkind: str | None = None
    confidence: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GraphScore:
    memory_id: str
    pagerank: float
    community: int


@dataclass(frozen=True, slots=True)
class RelevanceInputs:
    """Column arrays, row-aligned with ``ids``, for scoring a whole profile at once.

    Times are seconds since the epoch (UTC); NaN where unknown.
    """

    ids: list[str]
    created: Any  # np.ndarray[float64]
    accessed: Any  # np.ndarray[float64]
    importance: Any  # np.ndarray[float64], NaN = unknown
    confidence: Any  # np.ndarray[float64], NaN = unknown
    relationships: Any  # np.ndarray[int64]: edges touching the memory
    relevance: Any  # np.ndarray[float64], NaN = never scored


@dataclass(frozen=True, slots=True)
class RelevanceSpread:
    """How a profile's hot memories are scored, from one aggregate query: what a step
    that reads only some rows still reports about all of them."""

    hot: int  # hot memories
    scored: int  # hot memories with a relevance score
    live_scored: int  # live ones (see MemoryView.is_live) with a score
    live_highest: float | None  # their highest score

    @classmethod
    def of(cls, memories: Sequence[MemoryView]) -> RelevanceSpread:
        """The same figures from rows already read."""
        live = [m.relevance for m in memories if m.is_live and m.relevance is not None]
        return cls(len(memories), sum(m.relevance is not None for m in memories), len(live),
                   max(live, default=None))


@dataclass(frozen=True, slots=True)
class MetaPlan:
    """A meta-memory describing a cluster; its members stay where they are."""

    meta_id: str
    member_ids: tuple[str, ...]
    content: str
    importance: float
    confidence: float
    stability: float
    embedding: bytes
    embedding_model: str | None
    meta: dict[str, Any]
    parameters: dict[str, Any] = field(default_factory=dict)
    # Each member's cosine to the cluster's centroid (the meta-memory's vector).
    similarities: dict[str, float] = field(default_factory=dict)
    # What a summarizer reads to reword it, in the order it reads them; never stored.
    sources: tuple[MemoryView, ...] = field(default=(), compare=False, repr=False)
