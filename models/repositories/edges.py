"""Edges between a profile's memories: reads, decay, and upserts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields as dataclass_fields
from datetime import datetime
from typing import Any

from sqlalchemy import delete, or_, select, update
from sqlmodel import Session

from reverie.models import ids
from reverie.models.records import EdgeView, NewEdge
from reverie.models.repositories.bulk import (
    bulk_set,
    chunks,
    insert_rows,
    owned_by,
    plain_rows,
)
from reverie.models.repositories.memories import M, beyond_horizon
from reverie.models.store import ProfileTx
from reverie.models.tables import Edge, EdgeKind, table_of

E = table_of(Edge)
_EDGE_VIEW_COLUMNS = [E.c[f.name] for f in dataclass_fields(EdgeView)]


def edges(tx: ProfileTx, kinds: Sequence[str] | None = None) -> list[EdgeView]:
    query = select(*_EDGE_VIEW_COLUMNS).where(E.c.profile_id == tx.profile).order_by(E.c.id)
    if kinds is not None:
        query = query.where(E.c.kind.in_(list(kinds)))
    return [EdgeView(*r) for r in tx.session.execute(query)]


def weighted_ends(tx: ProfileTx) -> list[tuple[str, str, float]]:
    """Every edge of the profile as (source, target, weight), ordered by id: what the
    memory graph is built from (hundreds of thousands at 100k memories: plain rows,
    none of an EdgeView's timestamps to parse)."""
    return plain_rows(tx.session, select(E.c.source_id, E.c.target_id, E.c.weight)
                      .where(E.c.profile_id == tx.profile).order_by(E.c.id))


def association_edges_to_decay(tx: ProfileTx, idle_since: datetime) -> list[EdgeView]:
    """Association edges idle since ``idle_since`` or already decayed (index-backed),
    between memories within the horizon (an edge to a memory ingested since the run
    took the profile, or created after its 'now', is left to the next run, which
    decays it as of its own date)."""
    query = (
        select(*_EDGE_VIEW_COLUMNS)
        .where(E.c.profile_id == tx.profile)
        .where(E.c.kind == EdgeKind.ASSOCIATION)
        .where(or_(E.c.last_strengthened_at <= idle_since, E.c.weight != E.c.base_weight))
        .order_by(E.c.id)
    )
    found = [EdgeView(*r) for r in tx.session.execute(query)]
    beyond = beyond_horizon(tx)
    if not beyond:
        return found
    return [e for e in found if e.source_id not in beyond and e.target_id not in beyond]


def linked_pairs(tx: ProfileTx, memory_ids: Sequence[str]) -> set[frozenset[str]]:
    """Pairs among ``memory_ids`` already joined by an edge of any kind, either way."""
    wanted = list(memory_ids)
    rows = tx.session.execute(
        select(E.c.source_id, E.c.target_id)
        .where(E.c.profile_id == tx.profile)
        .where(E.c.source_id.in_(wanted))
        .where(E.c.target_id.in_(wanted))
    ).all()
    return {frozenset(r) for r in rows}


def update_edge_weights(
    tx: ProfileTx, weights: Sequence[tuple[EdgeView, float]], prune: Sequence[EdgeView]
) -> set[str]:
    """Set decayed weights and delete pruned edges, each only while it is as it was
    read: one strengthened since (by an ingest or a recall) keeps its new weight,
    which the next run decays from, as it would have had the strengthening come
    first. Only association edges are touched. Returns the ids left alone.

    The edges are read again in this transaction, locked on PostgreSQL (SQLite's write
    transaction holds the whole store): a few thousand rows at 100k memories."""
    if not weights and not prune:
        return set()
    s, profile = tx.session, tx.profile
    read = [*(e for e, _ in weights), *prune]
    now: dict[str, tuple[Any, ...]] = {}
    for batch in chunks(e.id for e in read):
        now.update((r[0], tuple(r[1:])) for r in s.execute(
            select(E.c.id, E.c.weight, E.c.base_weight, E.c.last_strengthened_at)
            .where(owned_by(E, profile)).where(E.c.kind == EdgeKind.ASSOCIATION)
            .where(E.c.id.in_(batch)).with_for_update()
        ))
    changed = {e.id for e in read
               if now.get(e.id) != (e.weight, e.base_weight, e.last_strengthened_at)}
    bulk_set(s, E, ["weight"], [(e.id, w) for e, w in weights if e.id not in changed],
             E.c.profile_id == profile, E.c.kind == EdgeKind.ASSOCIATION)
    for batch in chunks(e.id for e in prune if e.id not in changed):
        s.execute(
            delete(E)
            .where(E.c.profile_id == profile)
            .where(E.c.kind == EdgeKind.ASSOCIATION)
            .where(E.c.id.in_(batch))
        )
    return changed


def add_edges(
    tx: ProfileTx,
    new: Sequence[NewEdge],
    as_of: datetime,
    linked_summaries: Sequence[str] = (),
) -> None:
    """Add edges (an existing edge keeps the larger weight); mark summaries linked."""
    upsert_edges(tx.session, tx.profile, new, as_of, as_of)
    for batch in chunks(linked_summaries):
        tx.session.execute(
            update(M)
            .where(owned_by(M, tx.profile))
            .where(M.c.id.in_(batch))
            .values(linked_at=as_of)
        )


def upsert_edges(
    s: Session, profile: str, new: Sequence[NewEdge], strengthened_at: datetime,
    created_at: datetime,
) -> None:
    upsert_timed_edges(s, profile, [(e, strengthened_at, created_at) for e in new])


def upsert_timed_edges(
    s: Session, profile: str, new: Sequence[tuple[NewEdge, datetime, datetime]]
) -> None:
    """Add edges in bulk, each with the time it was last strengthened and created.
    An edge that exists already (or comes twice) keeps the larger weight, and is
    strengthened at the later time when a larger weight arrives."""
    wanted: dict[str, dict[str, Any]] = {}
    for edge, strengthened_at, created_at in new:
        source, target = edge.source_id, edge.target_id
        if edge.kind == EdgeKind.ASSOCIATION and target < source:  # undirected: one canonical row
            source, target = target, source
        eid = ids.edge_id(profile, edge.kind, source, target)
        row = wanted.get(eid)
        if row is None:
            wanted[eid] = {
                "id": eid, "profile_id": profile, "source_id": source, "target_id": target,
                "kind": edge.kind, "subkind": edge.subkind, "weight": edge.weight,
                "base_weight": edge.weight, "last_strengthened_at": strengthened_at,
                "confidence": edge.confidence, "created_at": created_at, "metadata": edge.meta,
            }
        elif edge.weight > row["weight"]:
            row["weight"] = row["base_weight"] = edge.weight
            row["last_strengthened_at"] = max(row["last_strengthened_at"], strengthened_at)
    if not wanted:
        return
    # Plain rows, not the ORM class: ORM bulk insert of 100k edges spent ~8 s in
    # SQLAlchemy's per-row bookkeeping (full consolidation at 100k). An edge that
    # exists is settled by the database in the same statement: reading them first
    # cost a second pass over the index for every edge, and nearly all are new.
    later = "max" if s.get_bind().dialect.name == "sqlite" else "GREATEST"
    table = E.name
    insert_rows(s, E, list(wanted.values()), on_conflict=(
        "ON CONFLICT (id) DO UPDATE SET weight = excluded.weight, "
        "base_weight = excluded.weight, last_strengthened_at = "
        f"{later}({table}.last_strengthened_at, excluded.last_strengthened_at) "
        f"WHERE excluded.weight > {table}.weight"))
