"""Summaries: memories that stand for originals moved to the cold tier, and undo."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import delete, or_, select, update
from sqlmodel import Session, col

from reverie.models import ids, tables
from reverie.models.errors import ConflictError, EmbeddingError, NotFoundError, RefusedError
from reverie.models.records import MemoryView, NewEdge, SummaryPlan
from reverie.models.repositories import audit
from reverie.models.repositories.blocks import requote
from reverie.models.repositories.bulk import (
    bulk_set,
    chunks,
    collector_paused,
    cursor_result,
    insert_rows,
    owned_by,
    plain_rows,
)
from reverie.models.repositories.edges import E, upsert_edges
from reverie.models.repositories.memories import (
    VIEW_COLUMNS,
    M,
    V,
    ingested_since,
    memory_defaults,
    put_vectors,
    view,
    within_horizon,
)
from reverie.models.store import ProfileTx
from reverie.models.tables import Memory, Tier


@dataclass
class UndoResult:
    consolidation_id: str
    profile: str
    operation: str
    summary_id: str | None
    restored: list[str] = field(default_factory=list)
    already_undone: bool = False


def originals_of(tx: ProfileTx, summary_ids: Sequence[str]) -> dict[str, list[MemoryView]]:
    """The memories each summary superseded, by summary id."""
    out: dict[str, list[MemoryView]] = {sid: [] for sid in summary_ids}
    with collector_paused():  # tens of thousands of rows at 100k
        for batch in chunks(summary_ids):
            query = (
                select(*VIEW_COLUMNS)
                .where(M.c.profile_id == tx.profile)
                .where(M.c.superseded_by.in_(batch))
                .order_by(M.c.id)
            )
            for row in plain_rows(tx.session, query):
                found = view(row)
                # Selected by superseded_by IN (...): never None.
                out[found.superseded_by].append(found)  # type: ignore[index]
    return out


def undone_summaries(tx: ProfileTx) -> set[str]:
    """Summaries an operator undid: consolidations never to be made again (one an
    ingest released is no veto: ``release``)."""
    return set(
        tx.session.execute(
            select(col(tables.Consolidation.summary_id))
            .where(col(tables.Consolidation.profile_id) == tx.profile)
            .where(col(tables.Consolidation.operation) != tables.Operation.SUPERSEDE)
            .where(col(tables.Consolidation.undone_at).is_not(None))
            .where(audit.standing_id())
        ).scalars()
    )


# What a summary changes in each memory it replaces, and checks first (in the order of
# ``SummaryPlan.priors``).
MOVED = ("tier", "lifecycle", "superseded_by")


def apply_summaries(
    tx: ProfileTx, plans: Sequence[SummaryPlan], as_of: datetime, run_id: str | None,
    vectors: Callable[[], Mapping[str, bytes]] | None = None,
) -> list[str]:
    """Write each summary, move what it replaces to cold with ``superseded_by``, link
    the summary to its originals with provenance edges and audit the decision: why
    (the plan's ``parameters``, its rule among them, and ``similarities``) and the prior
    state of everything it replaced (for undo). A plan already decided
    (its audit row exists: a retried step, or a merge an operator undid) is skipped.
    What a plan replaces must still be as the plan read it (``SummaryPlan.priors``)
    and within the transaction's horizon, else nothing is written (``ConflictError``:
    a fresh read and plan will see the new state). ``vectors`` gives the vectors of the
    plans that have none yet, by summary id; it is asked last, after every other row is
    written, because the model may still be embedding them. Returns the summaries
    written."""
    s, profile = tx.session, tx.profile
    audit_ids = {
        plan.summary_id: ids.consolidation_id(profile, plan.operation, plan.summary_id)
        for plan in plans
    }
    decided = audit.decided(s, audit_ids.values())
    todo: list[SummaryPlan] = []
    for plan in plans:  # a plan decided before, or twice in this batch, is skipped
        if audit_ids[plan.summary_id] not in decided:
            decided.add(audit_ids[plan.summary_id])
            todo.append(plan)
    if not todo:
        return []
    replaced = {plan.summary_id: [*plan.member_ids, *plan.absorbed_ids] for plan in todo}
    # Checked by the update itself, not by reading every replaced row first (a quarter
    # of writing a full run's summaries at 100k).
    moves = [
        (mid, Tier.COLD, tables.Lifecycle.ARCHIVED, plan.summary_id, *plan.priors[mid])
        for plan in todo for mid in replaced[plan.summary_id]
    ]
    # Plain rows, not ORM objects: constructing 10k validated objects cost more than
    # inserting them.
    defaults = memory_defaults()
    insert_rows(s, M, [defaults | _summary_row(profile, plan) for plan in todo])
    # Nor may an ingest have written them since the run took the profile (the step
    # leaves such plans out; on PostgreSQL one may commit in between).
    moved = bulk_set(s, M, MOVED, moves, M.c.profile_id == profile, within_horizon(tx),
                     expect=MOVED)
    if moved != len({move[0] for move in moves}):
        raise ConflictError(
            f"summary {_changed_since_read(tx, todo, replaced)}: members changed since "
            "they were read"
        )
    upsert_edges(s, profile, [
        NewEdge(plan.summary_id, member, tables.EdgeKind.CONSOLIDATION, plan.link_weight)
        for plan in todo for member in plan.member_ids
    ], as_of, as_of)
    insert_rows(s, tables.table_of(tables.Consolidation), [
        {
            "id": audit_ids[plan.summary_id], "profile_id": profile, "run_id": run_id,
            "operation": plan.operation, "summary_id": plan.summary_id,
            "member_ids": list(plan.member_ids),
            "parameters": {
                **plan.parameters,
                **({"similarities": dict(plan.similarities)} if plan.similarities else {}),
                "absorbed": list(plan.absorbed_ids),
                "prior": {mid: list(plan.priors[mid]) for mid in replaced[plan.summary_id]},
            },
            "created_at": as_of,
        }
        for plan in todo
    ])
    put_vectors(s, _vectors(todo, vectors), replace=False)
    return [plan.summary_id for plan in todo]


def apply_supersessions(
    tx: ProfileTx, plans: Sequence[Any], as_of: datetime, run_id: str | None
) -> list[str]:
    """Write supersessions (``tasks.supersede.SupersedePlan``): each plan's older
    members move to cold with ``superseded_by`` = its newest memory, which stays as it
    is, and the decision is audited with the rule, each member's similarity to the
    newest and its prior state (for undo). A plan already decided is skipped; members
    changed since they were read write nothing (``ConflictError``)."""
    s, profile = tx.session, tx.profile
    decided = audit.decided(s, [p.consolidation_id for p in plans])
    # A memory ingested again since the run took the profile may no longer state what
    # the plan read: its supersession waits for the next run, which plans it afresh.
    beyond = ingested_since(tx)
    todo = []
    for plan in plans:
        if beyond & {plan.newest_id, *plan.member_ids}:
            continue
        if plan.consolidation_id not in decided:
            decided.add(plan.consolidation_id)
            todo.append(plan)
    if not todo:
        return []
    moves = [
        (mid, Tier.COLD, tables.Lifecycle.ARCHIVED, plan.newest_id, *plan.priors[mid])
        for plan in todo for mid in plan.member_ids
    ]
    moved = bulk_set(s, M, MOVED, moves, M.c.profile_id == profile, within_horizon(tx),
                     expect=MOVED)
    if moved != len({move[0] for move in moves}):
        raise ConflictError("supersession: members changed since they were read")
    insert_rows(s, tables.table_of(tables.Consolidation), [
        {
            "id": plan.consolidation_id, "profile_id": profile, "run_id": run_id,
            "operation": tables.Operation.SUPERSEDE, "summary_id": plan.newest_id,
            "member_ids": list(plan.member_ids),
            "parameters": {
                **plan.parameters, "similarities": dict(plan.similarities),
                "conflicts": dict(plan.conflicts),
                "prior": {mid: list(plan.priors[mid]) for mid in plan.member_ids},
            },
            "created_at": as_of,
        }
        for plan in todo
    ])
    return [plan.consolidation_id for plan in todo]


def undone_supersessions(tx: ProfileTx) -> set[str]:
    """Supersessions an operator undid: never to be made again."""
    return set(
        tx.session.execute(
            select(col(tables.Consolidation.id))
            .where(col(tables.Consolidation.profile_id) == tx.profile)
            .where(col(tables.Consolidation.operation) == tables.Operation.SUPERSEDE)
            .where(col(tables.Consolidation.undone_at).is_not(None))
            .where(audit.standing_id())
        ).scalars()
    )


def _vectors(
    plans: Sequence[SummaryPlan], late: Callable[[], Mapping[str, bytes]] | None
) -> dict[str, bytes]:
    """Each plan's vector: its own, or the one ``late`` gives for it."""
    given = late() if late is not None and any(p.embedding is None for p in plans) else {}
    out: dict[str, bytes] = {}
    for plan in plans:
        blob = plan.embedding if plan.embedding is not None else given.get(plan.summary_id)
        if blob is None:
            raise EmbeddingError(f"summary {plan.summary_id}: no vector to store")
        out[plan.summary_id] = blob
    return out


def _changed_since_read(
    tx: ProfileTx, plans: Sequence[SummaryPlan], replaced: dict[str, list[str]]
) -> str:
    """The first plan with a replaced memory the move left alone (it no longer held
    its prior state), for the error; a failed write reads this much, once."""
    wanted = [mid for mids in replaced.values() for mid in mids]
    now = {
        mid: (tier, superseded_by)
        for batch in chunks(wanted)
        for mid, tier, superseded_by in plain_rows(tx.session,
            select(M.c.id, M.c.tier, M.c.superseded_by)
            .where(owned_by(M, tx.profile))
            .where(M.c.id.in_(batch))
        )
    }
    for plan in plans:
        if any(now.get(mid) != (Tier.COLD, plan.summary_id) for mid in replaced[plan.summary_id]):
            return plan.summary_id
    return "of this batch"


def undo(tx: ProfileTx, ident: str, at: datetime) -> UndoResult:
    """``_undo``, an operator's: the Core Memory blocks stop quoting what it took
    away (``blocks.requote``) in the same transaction."""
    result = _undo(tx, ident, at)
    if not result.already_undone:
        requote(tx, (), at)
    return result


def _undo(tx: ProfileTx, ident: str, at: datetime) -> UndoResult:
    """Undo one consolidation of the profile, by its id or its summary's id: everything
    it replaced returns to the state it was in, the summary and its edges are removed
    (the audit row keeps the summary's text), and the decision is marked undone, which
    also keeps later runs from making it again. Undoing twice changes nothing.

    Only the transaction's profile is searched: whoever holds an id of another profile's
    consolidation cannot undo it from here (and learns nothing: it is "not found")."""
    s, profile = tx.session, tx.profile
    ident = ids.sought_id(ident, "consolidation with id")
    of_profile = col(tables.Consolidation.profile_id) == profile
    # A summary made again after an ingest released it (``release``) shares its id
    # with the released decision: the one standing is meant. The released decision's
    # own id, as an artifact or an earlier listing gave it, still finds it.
    found = s.execute(
        select(tables.Consolidation).where(of_profile).where(
            or_(col(tables.Consolidation.id) == ident,
                col(tables.Consolidation.summary_id) == ident,
                col(tables.Consolidation.id).startswith(audit.released_prefix(ident),
                                                        autoescape=True))
        ).order_by(col(tables.Consolidation.undone_at).is_not(None), tables.Consolidation.id)
    ).scalars().first()
    if found is None:
        raise NotFoundError(f"no consolidation with id {ident!r} in profile {profile!r}")
    result = UndoResult(found.id, found.profile_id, found.operation, found.summary_id)
    if found.undone_at is not None:
        result.already_undone = True
        return result
    if found.operation not in audit.UNDOABLE:
        raise RefusedError(
            f"a {found.operation} cannot be undone: deleted memories are gone "
            "(their tombstones remain)"
        )
    # As it is now: a release (``release``) may have just restored it with a statement
    # the session's copy did not see.
    summary = (s.get(Memory, found.summary_id, populate_existing=True)
               if found.summary_id else None)
    if found.operation == tables.Operation.SUPERSEDE:
        summary = None  # the newest memory was never written by it: it stays
        # What it restated of its members goes first: their prior state is the one
        # before the supersession.
        for restated in found.parameters.get("restated", []):
            _undo(tx, restated, at)
    if summary is not None and summary.superseded_by is not None:
        later = ids.consolidation_id(
            found.profile_id, _origin_of(s, summary.superseded_by), summary.superseded_by
        )
        raise RefusedError(
            f"{summary.id} has since been absorbed into {summary.superseded_by}: "
            f"undo {later} first"
        )
    for mid, (tier, lifecycle, superseded_by) in found.parameters.get("prior", {}).items():
        restored = s.execute(
            update(M).where(M.c.profile_id == found.profile_id).where(M.c.id == mid)
            .values(tier=tier, lifecycle=lifecycle, superseded_by=superseded_by)
        )
        if cursor_result(restored).rowcount:  # a memory expired since is a tombstone: not back
            result.restored.append(mid)
    if summary is not None:
        s.execute(
            delete(E).where(E.c.profile_id == found.profile_id).where(
                or_(E.c.source_id == summary.id, E.c.target_id == summary.id)
            )
        )
        found.parameters = {
            **found.parameters,
            "undone_summary": {"content": summary.content, "kind": summary.kind},
        }
        s.execute(delete(V).where(V.c.memory_id == summary.id))
        s.delete(summary)
    found.undone_at = at
    return result


def release(tx: ProfileTx, former: Mapping[str, str], at: datetime, ingest_seq: int,
            ) -> list[str]:
    """Undo, in the transaction of the ingest numbered ``ingest_seq``, what holds the
    memories it gave new content (``former``: their ids, each with the content it had):
    the decision that absorbed each (a summary that states its old words, a
    supersession that judged them outdated) and any supersession it is the newest of
    (which judged others by its old words). What stands on such a decision goes first,
    from the top down (``_standing_on``), until each memory stands on its own again.

    Unlike an operator's undo this vetoes nothing: each decision is marked released and
    takes another id (``audit.released_id``), so the next run may make it again from
    what the memories say now. What the undos restore is stamped with the ingest's
    number, as the ingest's own rows are, so a run that took the profile before leaves
    it alone. A released supersession keeps the words its newest memory had then, as an
    undone summary keeps its own. Returns the ids the released decisions had."""
    wanted = sorted(former)
    released: list[str] = []
    restored: set[str] = set()
    # An undo returns a memory to where it was before: held, it may be, by an older
    # decision, which goes in the next round. Each round releases what it finds, and
    # there are only so many decisions: the rounds end.
    while holders := _holding(tx, wanted):
        for cid in holders:
            _release(tx, cid, at, ingest_seq, former, released, restored)
    for batch in chunks(sorted(restored)):
        tx.session.execute(update(M).where(M.c.profile_id == tx.profile)
                           .where(M.c.id.in_(batch)).values(ingest_seq=ingest_seq))
    return released


def _holding(tx: ProfileTx, memory_ids: Sequence[str]) -> list[str]:
    """The standing decisions that hold any of ``memory_ids``: the one that moved it
    where it is (its ``superseded_by``), and the supersessions it is the newest of."""
    s, profile = tx.session, tx.profile
    above: dict[str, list[str]] = {}
    for mid, by in _where_moved(tx, memory_ids).items():
        if by is not None:
            above.setdefault(by, []).append(mid)
    newest = set(memory_ids)
    out = set()
    for batch in chunks(sorted(above.keys() | newest)):
        for cid, operation, summary_id, parameters in s.execute(
            select(audit.C.c.id, audit.C.c.operation, audit.C.c.summary_id,
                   audit.C.c.parameters)
            .where(audit.C.c.profile_id == profile).where(audit.C.c.undone_at.is_(None))
            .where(audit.C.c.operation.in_(sorted(audit.UNDOABLE)))
            .where(audit.C.c.summary_id.in_(batch))
        ):
            prior = (parameters or {}).get("prior") or {}
            if (any(mid in prior for mid in above.get(summary_id, ()))
                    or (operation == tables.Operation.SUPERSEDE and summary_id in newest)):
                out.add(cid)
    return sorted(out)


def _where_moved(tx: ProfileTx, memory_ids: Sequence[str]) -> dict[str, str | None]:
    """Each of ``memory_ids`` the profile holds, with its ``superseded_by``."""
    return {
        mid: by
        for batch in chunks(memory_ids)
        for mid, by in tx.session.execute(
            select(M.c.id, M.c.superseded_by)
            .where(M.c.profile_id == tx.profile).where(M.c.id.in_(batch)))
    }


def _standing_on(tx: ProfileTx, found: tables.Consolidation) -> list[str]:
    """The standing decisions to release before ``found``, whose undo would otherwise
    be refused or leave them standing on what it takes away: what holds its summary
    (absorbed it, or judged others by it), what moved one of its members on since (a
    supersession of a merge's stale member: undone after it, that member would be
    hot under a supersession still standing), and, for a supersession, the summaries
    it restated (written with it: its undo undoes them)."""
    s, profile = tx.session, tx.profile
    target = found.summary_id
    moved = [mid for mid, by in _where_moved(
        tx, sorted((found.parameters or {}).get("prior") or {})).items() if by != target]
    first = set(_holding(tx, moved)) if moved else set()
    if found.operation == tables.Operation.SUPERSEDE:
        restated = sorted((found.parameters or {}).get("restated") or [])
        # A restatement's decision is a RESTATE, or a merge's or compression's own
        # operation for a summary restated without its stale members: found by its id.
        first.update(
            cid
            for batch in chunks(restated)
            for cid in s.execute(
                select(audit.C.c.id).where(audit.C.c.profile_id == profile)
                .where(audit.C.c.undone_at.is_(None))
                .where(audit.C.c.operation != tables.Operation.SUPERSEDE)
                .where(audit.C.c.summary_id.in_(batch))
            ).scalars()
        )
    elif target is not None:
        first.update(_holding(tx, [target]))
    return sorted(first - {found.id})


def _release(tx: ProfileTx, cid: str, at: datetime, ingest_seq: int,
             former: Mapping[str, str], released: list[str], restored: set[str]) -> None:
    """``release`` of one decision, after what stands on it."""
    s, profile = tx.session, tx.profile
    found = s.get(tables.Consolidation, cid)
    if found is None or found.undone_at is not None:
        return
    for first in _standing_on(tx, found):
        _release(tx, first, at, ingest_seq, former, released, restored)
    marks: dict[str, Any] = {"released": {"by": "ingest", "ingest": ingest_seq}}
    if found.operation == tables.Operation.SUPERSEDE:
        newest = found.summary_id or ""
        words = former.get(newest) or s.execute(
            select(M.c.content).where(M.c.profile_id == profile).where(M.c.id == newest)
        ).scalar()
        if words is not None:
            marks["undone_summary"] = {"content": words}
    restored.update(_undo(tx, cid, at).restored)
    found.parameters = {**found.parameters, **marks}
    s.flush()
    # Its id is the one a decision made again would take (the members name it).
    s.execute(update(audit.C).where(audit.C.c.id == cid)
              .values(id=audit.released_id(cid, ingest_seq)))
    s.expunge(found)
    released.append(cid)


def _origin_of(s: Session, memory_id: str) -> str:
    memory = s.get(Memory, memory_id)
    return memory.origin if memory is not None else ""


def _summary_row(profile: str, plan: SummaryPlan) -> dict[str, Any]:
    return {
        "id": plan.summary_id, "profile_id": profile, "content": plan.content,
        "content_hash": ids.content_hash(plan.content), "kind": plan.kind,
        "entity": plan.entity, "layer": plan.layer, "importance": plan.importance,
        "confidence": plan.confidence, "stability": plan.stability,
        "access_count": plan.access_count, "created_at": plan.created_at,
        "last_accessed_at": plan.last_accessed_at, "valid_from": plan.valid_from,
        "valid_until": plan.valid_until, "session_id": plan.session_id,
        "origin": plan.operation, "protected": plan.protected,
        "embedding_model": plan.embedding_model, "metadata": plan.meta,
    }
