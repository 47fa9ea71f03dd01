"""Meta-memories: memories that describe a cluster, linked to its members by
``summarizes`` edges; the members stay as they are."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlmodel import col

from reverie.models import ids, tables
from reverie.models.records import MetaPlan, NewEdge
from reverie.models.repositories.bulk import chunks
from reverie.models.repositories.edges import E, upsert_edges
from reverie.models.repositories.memories import M, put_vectors, stored_vectors
from reverie.models.store import ProfileTx
from reverie.models.tables import Memory, Operation


def meta_memories(tx: ProfileTx) -> dict[str, set[str]]:
    """Each meta-memory of the profile, with the members it summarizes."""
    s, profile = tx.session, tx.profile
    metas = s.execute(
        select(M.c.id).where(M.c.profile_id == profile)
        .where(M.c.origin == tables.Origin.META_MEMORY)
    ).scalars().all()
    out: dict[str, set[str]] = {mid: set() for mid in metas}
    for source, target in s.execute(
        select(E.c.source_id, E.c.target_id)
        .where(E.c.profile_id == profile)
        .where(E.c.kind == tables.EdgeKind.SUMMARIZES)
    ):
        if source in out:
            out[source].add(target)
    return out


def apply_meta_memories(
    tx: ProfileTx, plans: Sequence[MetaPlan], as_of: datetime, run_id: str | None
) -> list[str]:
    """Create or update each meta-memory, its ``summarizes`` edges and its audit row.
    A plan identical to what is stored writes nothing. Returns the ids changed."""
    if not plans:
        return []
    s, profile = tx.session, tx.profile
    meta_ids = [plan.meta_id for plan in plans]
    audit_ids = {mid: ids.consolidation_id(profile, Operation.CLUSTER, mid) for mid in meta_ids}
    rows = {
        row.id: row
        for batch in chunks(meta_ids)
        for row in s.execute(select(Memory).where(col(Memory.id).in_(batch))).scalars()
    }
    members: dict[str, set[str]] = defaultdict(set)
    for batch in chunks(meta_ids):
        for source, target in s.execute(
            select(E.c.source_id, E.c.target_id).where(E.c.profile_id == profile)
            .where(E.c.kind == tables.EdgeKind.SUMMARIZES).where(E.c.source_id.in_(batch))
        ):
            members[source].add(target)
    stored = stored_vectors(s, meta_ids)
    revectored: dict[str, bytes | None] = {}
    audits = {
        audit.id: audit
        for batch in chunks(audit_ids.values())
        for audit in s.execute(
            select(tables.Consolidation).where(col(tables.Consolidation.id).in_(batch))
        ).scalars()
    }
    changed: list[str] = []
    new_edges: list[NewEdge] = []
    for plan in plans:
        row = rows.get(plan.meta_id)
        had = members[plan.meta_id]
        fields: dict[str, Any] = {
            "content": plan.content, "content_hash": ids.content_hash(plan.content),
            "importance": plan.importance, "confidence": plan.confidence,
            "stability": plan.stability, "embedding_model": plan.embedding_model,
            "meta": plan.meta,
        }
        if row is None:
            s.add(Memory(
                id=plan.meta_id, profile_id=profile, kind=tables.META_KIND,
                origin=tables.Origin.META_MEMORY, created_at=as_of, **fields,
            ))
        elif (
            had == set(plan.member_ids)
            and stored.get(plan.meta_id) == plan.embedding
            and all(getattr(row, k) == v for k, v in fields.items())
        ):
            continue
        else:
            for key, value in fields.items():
                setattr(row, key, value)
        if stored.get(plan.meta_id) != plan.embedding:
            revectored[plan.meta_id] = plan.embedding
        gone = sorted(had - set(plan.member_ids))
        for batch in chunks(gone):
            s.execute(
                delete(E).where(E.c.profile_id == profile)
                .where(E.c.kind == tables.EdgeKind.SUMMARIZES)
                .where(E.c.source_id == plan.meta_id)
                .where(E.c.target_id.in_(batch))
            )
        new_edges += [
            NewEdge(plan.meta_id, member, tables.EdgeKind.SUMMARIZES, 1.0)
            for member in sorted(set(plan.member_ids) - had)
        ]
        audit = audits.get(audit_ids[plan.meta_id])
        why = {**plan.parameters, "similarities": dict(plan.similarities)}
        if audit is None:
            s.add(tables.Consolidation(
                id=audit_ids[plan.meta_id], profile_id=profile, run_id=run_id,
                operation=Operation.CLUSTER, summary_id=plan.meta_id,
                member_ids=list(plan.member_ids), parameters=why,
                created_at=as_of,
            ))
        else:
            audit.member_ids = list(plan.member_ids)
            audit.parameters = why
            audit.run_id = run_id
        changed.append(plan.meta_id)
    s.flush()
    put_vectors(s, revectored)
    upsert_edges(s, profile, new_edges, as_of, as_of)
    return changed
