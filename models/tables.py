"""The store's tables. Pure data: no queries here (they live in ``models.repositories``).

All times are naive UTC (``NaiveDatetime``: sqlmodel would otherwise insist on
aware ones), the same on SQLite and PostgreSQL. Ids are strings derived from stable inputs (see
``models.ids``), so that the same history always produces the same store, a retried
step cannot create a second copy of what it wrote, and two stores built from the
same input can be compared line by line.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import NaiveDatetime
from sqlalchemy import JSON, Column, Index, LargeBinary, Table, UniqueConstraint
from sqlmodel import Field, SQLModel


def table_of(model: type[SQLModel]) -> Table:
    """A table model's Core table, typed (the repositories' bulk statements use it)."""
    return model.__table__  # type: ignore[attr-defined]  # set by the mapping, not declared


# Closed vocabularies. Each is a StrEnum: a member is its string, so the columns hold
# plain text and every stored value compares equal to the member that wrote it.


class Tier(StrEnum):
    """Memory.tier."""

    HOT = "hot"  # the working set, searched by default
    COLD = "cold"  # kept, found by deep recall and by id


class Lifecycle(StrEnum):
    """Memory.lifecycle."""

    ACTIVE = "active"
    PROMOTED = "promoted"
    ARCHIVED = "archived"


class Origin(StrEnum):
    """Memory.origin: who wrote the memory. A summary's origin is also the operation of
    the consolidation that made it."""

    INGESTED = "ingest"
    DEDUP_SUMMARY = "dedup"  # stands for near-duplicates
    COMPRESSED = "compress"  # stands for a group of fading memories
    COLD_LEARNING = "cold"  # linksee's learning memory for cold notes on one entity
    META_MEMORY = "cluster"  # describes a cluster; its members stay as they are
    # What an older memory said besides a value an update superseded: its other
    # statements, in its own words, at its own date (the older memory goes cold).
    RESTATED = "restate"


class EdgeKind(StrEnum):
    """Edge.kind."""

    ASSOCIATION = "association"  # decays, can be pruned
    CONSOLIDATION = "consolidation"  # summary -> original; provenance
    SUMMARIZES = "summarizes"  # meta-memory -> member; provenance
    CONTRADICTS = "contradicts"  # creative: two decisions pulling apart
    DISCOVERED = "discovered"  # creative: subkind explains / shares_theme / parallel_context


META_KIND = "meta"  # the kind of a meta-memory
# Origins of memories that stand in for originals they superseded.
SUMMARY_ORIGINS = frozenset({Origin.DEDUP_SUMMARY, Origin.COMPRESSED, Origin.COLD_LEARNING})
# Memories Reverie derived from others: never raw material for dedup or clustering
# on their own account.
DERIVED_ORIGINS = SUMMARY_ORIGINS | {Origin.META_MEMORY}



class Operation(StrEnum):
    """Consolidation.operation: the decision an audit row records. A summary's operation
    is also its origin (see Origin), so the two share values."""

    DEDUP = Origin.DEDUP_SUMMARY.value
    COMPRESS = Origin.COMPRESSED.value
    COLD_LEARNING = Origin.COLD_LEARNING.value
    CLUSTER = Origin.META_MEMORY.value
    FORGET = "forget"  # archived some memories, deleted others (tombstones)
    MIGRATE_COLD = "migrate_cold"  # unused hot memories moved to cold; undoable
    EXPIRE_COLD = "expire_cold"  # long-cold memories turned into tombstones
    # Older statements of a fact moved to cold, superseded by the newest (it stays hot,
    # unchanged: no memory is written); undoable.
    SUPERSEDE = "supersede"
    # An older memory's other statements, written on when a supersession moves it cold;
    # undone with that supersession.
    RESTATE = Origin.RESTATED.value

PROVENANCE_KINDS = frozenset({EdgeKind.CONSOLIDATION, EdgeKind.SUMMARIZES})


class Profile(SQLModel, table=True):
    """One memory owner. Counters feed the event triggers."""

    id: str = Field(primary_key=True, max_length=128)
    created_at: NaiveDatetime
    store_count: int = 0
    session_count: int = 0
    # How many ingest transactions have written the profile's memories: each stamps what
    # it writes with the next number (Memory.ingest_seq). A run reads it when it takes
    # the profile, and works only on what is stamped no later (see models.store.ProfileTx).
    ingest_seq: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    # How many write transactions have touched the profile (every ``Store.writing`` and
    # every ingest bumps it, consolidation steps included, which leave ingest_seq
    # alone): a server's recall cache is valid while it holds still. Bookkeeping, not
    # memory state.
    write_seq: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    # The session that ended last: its end sent again (a retry) is not counted twice.
    last_session_id: str | None = None


class Memory(SQLModel, table=True):
    __table_args__ = (
        UniqueConstraint("profile_id", "external_id", name="uq_memory_profile_external"),
        Index("ix_memory_profile_tier", "profile_id", "tier"),
        Index("ix_memory_profile_ingest_seq", "profile_id", "ingest_seq"),
    )

    id: str = Field(primary_key=True)
    profile_id: str = Field(index=True, max_length=128)
    # The caller's own id, kept and shown everywhere; re-ingesting it updates.
    external_id: str | None = None
    content: str
    content_hash: str = Field(index=True)
    kind: str = "semantic"
    entity: str | None = None
    layer: str | None = None
    importance: float = 0.5
    confidence: float = 0.5  # also called trust
    stability: float = 1.0
    access_count: int = 0
    created_at: NaiveDatetime
    last_accessed_at: NaiveDatetime | None = None
    valid_from: NaiveDatetime | None = None
    valid_until: NaiveDatetime | None = None
    session_id: str | None = None
    status: str | None = None
    protected: bool = False
    lifecycle: str = Lifecycle.ACTIVE.value
    tier: str = Tier.HOT.value
    superseded_by: str | None = None
    origin: str = Origin.INGESTED.value
    # Set once a summary has been linked to its neighbours (step 6 is then done).
    linked_at: NaiveDatetime | None = None
    relevance: float | None = None
    pagerank: float | None = None
    community: int | None = None
    # The model that made the memory's vector (the vector is a MemoryVector row).
    embedding_model: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict, sa_column=Column("metadata", JSON))
    # Profile.ingest_seq of the ingest that last wrote the row (0: written by Reverie's
    # own steps, which never change it). Bookkeeping of when, not memory state: left out
    # of the canonical export.
    ingest_seq: int = Field(default=0, sa_column_kwargs={"server_default": "0"})


class MemoryVector(SQLModel, table=True):
    """A memory's embedding: unit float32 bytes. Apart from the memory row because
    steps that touch every memory (decay, scores, lifecycles) rewrite whole rows, and a
    1.5 KB vector in each would multiply the bytes they write several times over."""

    memory_id: str = Field(primary_key=True, foreign_key="memory.id")
    embedding: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class Edge(SQLModel, table=True):
    """A typed, weighted link between two memories of one profile.

    Association edges are undirected and stored with source < target.
    """

    __table_args__ = (
        Index("ix_edge_profile_kind_time", "profile_id", "kind", "last_strengthened_at"),
    )

    id: str = Field(primary_key=True)
    profile_id: str = Field(max_length=128)
    source_id: str = Field(index=True)
    target_id: str = Field(index=True)
    kind: str
    subkind: str | None = None
    weight: float
    # Weight at the last strengthening; decay is computed from it, never compounded.
    base_weight: float
    last_strengthened_at: NaiveDatetime
    confidence: float | None = None
    created_at: NaiveDatetime
    meta: dict[str, Any] = Field(default_factory=dict, sa_column=Column("metadata", JSON))


class CoreBlock(SQLModel, table=True):
    """A small always-in-context text block; one per (profile, block_type)."""

    profile_id: str = Field(primary_key=True, max_length=128)
    block_type: str = Field(primary_key=True)
    content: str
    source_ids: list[str] = Field(default_factory=list, sa_column=Column(JSON))
    mode: str = "rules"
    compiled_at: NaiveDatetime
    # Bumped only when the content changes.
    version: int = 1


class Consolidation(SQLModel, table=True):
    """Audit of one consolidation decision (a merge, a compression, a forget...)."""

    id: str = Field(primary_key=True)
    profile_id: str = Field(index=True, max_length=128)
    run_id: str | None = None
    operation: str
    summary_id: str | None = None
    member_ids: list[str] = Field(default_factory=list, sa_column=Column(JSON))
    parameters: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    created_at: NaiveDatetime
    undone_at: NaiveDatetime | None = None


class Tombstone(SQLModel, table=True):
    """What is left of a deleted memory: enough to prove it existed and why it went."""

    memory_id: str = Field(primary_key=True)
    profile_id: str = Field(index=True, max_length=128)
    external_id: str | None = None
    content_hash: str
    reason: str
    score: float | None = None
    run_id: str | None = None
    deleted_at: NaiveDatetime


class RunRecord(SQLModel, table=True):
    """One finished (non-dry) flow run for one profile: what ``reverie status`` shows.

    Operational history, not memory state: it is not part of a profile's canonical
    export (which compares states), but a backup carries it.
    """

    __table_args__ = (
        Index("ix_runrecord_profile_flow_finished", "profile_id", "flow", "finished_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    profile_id: str = Field(max_length=128)
    flow: str
    run_id: str | None = None
    as_of: NaiveDatetime
    started_at: NaiveDatetime
    finished_at: NaiveDatetime
    examined: int = 0
    changed: int = 0
    seconds: float = 0.0
    summary: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))


class Lease(SQLModel, table=True):
    """Who is consolidating a profile right now: at most one run per profile at a time.

    Operational state, not memory state: not part of a profile's export. A lease
    expires, so a run that died cannot lock its profile forever.
    """

    profile_id: str = Field(primary_key=True, max_length=128)
    holder: str
    acquired_at: NaiveDatetime
    expires_at: NaiveDatetime


class OutboxEvent(SQLModel, table=True):
    """A Prefect event written with the change that caused it, until the API has it.

    Operational state, not memory state: not part of a profile's export. Rows exist only
    while an event waits to be sent; ``seq`` is the order they are sent in. A sender
    claims rows for a while (``claimed_by`` until ``claimed_until``) so that two
    processes never send the same event; a sender that died loses its claim.
    """

    __tablename__ = "event_outbox"
    __table_args__ = (UniqueConstraint("key", name="uq_event_outbox_key"),)

    seq: int | None = Field(default=None, primary_key=True)
    profile_id: str = Field(max_length=128)
    name: str
    key: str  # the event's id derives from it: the same event is queued once
    payload: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    occurred_at: NaiveDatetime
    created_at: NaiveDatetime
    claimed_by: str | None = None
    claimed_until: NaiveDatetime | None = None


class StoreMeta(SQLModel, table=True):
    """Facts about the store itself, one row each: ``store_id``, a random id made when
    the store is created (or first migrated), which every event the store emits names so
    that automations react only to their own store's events (``models.events``)."""

    __tablename__ = "store_meta"
    key: str = Field(primary_key=True, max_length=64)
    value: str = Field(max_length=200)
