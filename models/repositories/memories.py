"""Memories and their vectors: reads of a profile's memories, and column updates."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic_core import from_json
from sqlalchemy import (
    ColumnElement,
    Text,
    bindparam,
    case,
    delete,
    exists,
    func,
    or_,
    select,
    true,
    type_coerce,
    update,
)
from sqlmodel import Session, col

from reverie.models.errors import AmbiguousIdError, NotFoundError
from reverie.models.ids import sought_id
from reverie.models.records import GraphScore, MemoryView, RelevanceInputs, RelevanceSpread
from reverie.models.repositories.bulk import (
    bulk_set,
    chunks,
    collector_paused,
    insert_rows,
    owned_by,
    plain_rows,
)
from reverie.models.store import ProfileTx
from reverie.models.tables import (
    Edge,
    EdgeKind,
    Lifecycle,
    Memory,
    MemoryVector,
    Tier,
    Tombstone,
    table_of,
)

if TYPE_CHECKING:
    import numpy as np

# numpy (and ``models.vectors``, which needs it) is imported by the reads that decode
# vectors or compute on columns, not at the top: `reverie get` imports this module for
# one row, and numpy's import (84 modules) was about a seventh of its start's CPU
# (issue #39 item 3).

M = table_of(Memory)
V = table_of(MemoryVector)
_E = table_of(Edge)
# Memories with their vectors: the join every vector read goes through.
WITH_VECTOR = M.join(V, V.c.memory_id == M.c.id)

VIEW_COLUMNS = [
    *(M.c[f.name] for f in dataclass_fields(MemoryView) if f.name != "meta"),
    # Raw JSON text, decoded by view: most memories carry none ("{}"), and a whole
    # profile is read per step.
    type_coerce(M.c.metadata, Text).label("meta"),
]
# MemoryView.is_live as SQL: hot, not replaced by a summary, not archived.
LIVE = (
    (M.c.tier == Tier.HOT) & M.c.superseded_by.is_(None)
    & M.c.lifecycle.in_([Lifecycle.ACTIVE, Lifecycle.PROMOTED])
)
_META_AT = len(VIEW_COLUMNS) - 1  # VIEW_COLUMNS follow MemoryView's fields, meta last


_TIMES = [k for k, f in enumerate(dataclass_fields(MemoryView)) if "datetime" in str(f.type)]
_PROTECTED = [f.name for f in dataclass_fields(MemoryView)].index("protected")


def view(row: Any) -> MemoryView:
    """A MemoryView from a row that starts with VIEW_COLUMNS (positional: a profile is
    read per step, and building 100k dicts first doubles the cost), as SQLAlchemy or
    the driver gives it (see ``plain_rows``)."""
    values = list(row[:_META_AT])
    for k in _TIMES:
        if isinstance(values[k], str):
            values[k] = datetime.fromisoformat(values[k])
    values[_PROTECTED] = bool(values[_PROTECTED])
    values.append(metadata(row[_META_AT]))
    return MemoryView(*values)


def metadata(raw: str | dict[str, Any] | None) -> dict[str, Any]:
    if isinstance(raw, dict):  # a driver that decodes JSON itself (psycopg2)
        return raw
    if not raw or raw in ("{}", "null"):
        return {}
    return from_json(raw)


def within_horizon(tx: ProfileTx) -> ColumnElement[bool]:
    """Memories the transaction's run may see and write (ProfileTx.horizon and
    ProfileTx.as_of): none an ingest wrote after the run took the profile, none created
    after the run's 'now'. The bound on ``created_at`` is a filter on the rows the
    (profile, tier) and (profile, ingest_seq) indexes find, not another index: a run
    reads the profile either way."""
    bound: ColumnElement[bool] = true()
    if tx.horizon is not None:
        bound = bound & (M.c.ingest_seq <= tx.horizon)
    if tx.as_of is not None:
        bound = bound & (M.c.created_at <= tx.as_of)
    return bound


# --- reading ---------------------------------------------------------------------------


def ingested_since(tx: ProfileTx) -> set[str]:
    """The profile's memories an ingest wrote after the horizon (none without one): what
    a write checks its plan against, since they may have changed after the plan read
    them. Read through the (profile, ingest_seq) index: a handful of rows, not the
    profile."""
    if tx.horizon is None:
        return set()
    return set(tx.session.execute(
        select(M.c.id).where(M.c.profile_id == tx.profile)
        .where(M.c.ingest_seq > tx.horizon)
    ).scalars())


def beyond_horizon(tx: ProfileTx) -> set[str]:
    """The profile's memories outside ``within_horizon``: those ``ingested_since`` and
    those created after the run's 'now'. An edge to one of them is no edge for the run
    (it came with that memory, which the run does not see). The latter are read by a
    scan of the profile's rows: a step that needs them reads the profile anyway."""
    beyond = ingested_since(tx)
    if tx.as_of is not None:
        beyond.update(tx.session.execute(
            select(M.c.id).where(M.c.profile_id == tx.profile)
            .where(M.c.created_at > tx.as_of)
        ).scalars())
    return beyond


def get(s: Session, ident: str, profile: str | None = None) -> Memory | Tombstone:
    """A memory by Reverie id or external id, in any tier; else its tombstone. Without
    ``profile``, across profiles (an external id in several of them is ambiguous)."""
    ident = sought_id(ident, "memory with id")
    profile = None if profile is None else sought_id(profile, "profile named")
    memory = s.get(Memory, ident)
    if memory is not None and (profile is None or memory.profile_id == profile):
        return memory
    query = select(Memory).where(col(Memory.external_id) == ident)
    if profile is not None:
        query = query.where(col(Memory.profile_id) == profile)
    found = list(s.execute(query).scalars())
    if len(found) > 1:
        owners = ", ".join(sorted(m.profile_id for m in found))
        raise AmbiguousIdError(
            f"id {ident!r} exists in several profiles ({owners}); name one with --profile"
        )
    if found:
        return found[0]
    tomb_query = select(Tombstone).where(
        or_(col(Tombstone.memory_id) == ident, col(Tombstone.external_id) == ident)
    )
    if profile is not None:
        tomb_query = tomb_query.where(col(Tombstone.profile_id) == profile)
    tomb = s.execute(tomb_query).scalars().first()
    if tomb is not None:
        return tomb
    raise NotFoundError(f"no memory with id {ident!r}")


def external_ids(s: Session, ids_: Sequence[str]) -> dict[str, str]:
    """The id the user gave each of ``ids_`` (Reverie ids) that has one, deleted
    memories included (their tombstones keep it): what reports show beside ours."""
    wanted = sorted(set(ids_))
    found: dict[str, str] = {}
    for start in range(0, len(wanted), 500):
        batch = wanted[start:start + 500]
        for table, key in ((Memory, col(Memory.id)), (Tombstone, col(Tombstone.memory_id))):
            found.update(s.execute(
                select(key, col(table.external_id))
                .where(key.in_(batch)).where(col(table.external_id).is_not(None))
            ).tuples().all())
    return found


def memories(
    tx: ProfileTx, tiers: Sequence[str] = (Tier.HOT,), ids_: Sequence[str] | None = None,
    relevance_below: float | None = None,
) -> list[MemoryView]:
    """The profile's memories in ``tiers``, ordered by id; only ``ids_`` if given, only
    those scored below ``relevance_below`` if given."""
    query = (
        select(*VIEW_COLUMNS)
        .where(M.c.profile_id == tx.profile)
        .where(M.c.tier.in_(list(tiers)))
        .where(within_horizon(tx))
        .order_by(M.c.id)
    )
    if ids_ is not None:
        query = query.where(M.c.id.in_(list(ids_)))
    if relevance_below is not None:
        query = query.where(M.c.relevance < relevance_below)
    return [view(r) for r in tx.session.execute(query)]


def memory_ids(tx: ProfileTx, tiers: Sequence[str] = (Tier.HOT,)) -> list[str]:
    return list(
        tx.session.execute(
            select(M.c.id).where(M.c.profile_id == tx.profile)
            .where(M.c.tier.in_(list(tiers))).where(within_horizon(tx)).order_by(M.c.id)
        ).scalars()
    )


def live_ids(tx: ProfileTx, relevance_above: float) -> list[str]:
    """Ids of the profile's live memories (MemoryView.is_live) scored above
    ``relevance_above`` and with a vector (as ``snapshot`` reads them), ordered by id: a
    step that samples draws from these and reads only what it drew."""
    query = (
        select(M.c.id).select_from(WITH_VECTOR)
        .where(M.c.profile_id == tx.profile).where(LIVE).where(within_horizon(tx))
        .where(M.c.relevance > relevance_above).order_by(M.c.id)
    )
    return list(tx.session.execute(query).scalars())


def relevance_spread(tx: ProfileTx) -> RelevanceSpread:
    """How the profile's hot memories are scored (RelevanceSpread), in one query."""
    live_score = case((LIVE, M.c.relevance), else_=None)
    query = (
        select(func.count(), func.count(M.c.relevance), func.count(live_score),
               func.max(live_score))
        .where(M.c.profile_id == tx.profile).where(M.c.tier == Tier.HOT)
        .where(within_horizon(tx))
    )
    hot, scored, live_scored, highest = tx.session.execute(query).one()
    return RelevanceSpread(hot, scored, live_scored, None if highest is None else float(highest))


def hot_count(tx: ProfileTx) -> tuple[int, bool]:
    """How many hot memories the profile holds, and whether any of them is scored: what
    a step that reports on stored relevance needs of RelevanceSpread, from the
    (profile, tier) index and the first scored row instead of every row."""
    hot = (M.c.profile_id == tx.profile) & (M.c.tier == Tier.HOT) & within_horizon(tx)
    count, scored = tx.session.execute(select(
        select(func.count()).where(hot).scalar_subquery(),
        exists().where(hot & M.c.relevance.is_not(None)),
    )).one()
    return count, bool(scored)


def snapshot(
    tx: ProfileTx, tiers: Sequence[str] = (Tier.HOT,), ids_: Sequence[str] | None = None
) -> tuple[list[MemoryView], np.ndarray]:
    """The profile's memories in ``tiers`` and their vectors, row-aligned: ordered by id,
    or only ``ids_`` in their order."""
    from reverie.models.vectors import from_blobs

    with collector_paused():
        if ids_ is None:
            query = (
                select(*VIEW_COLUMNS, V.c.embedding).select_from(WITH_VECTOR)
                .where(M.c.profile_id == tx.profile)
                .where(M.c.tier.in_(list(tiers)))
                .where(within_horizon(tx))
                .order_by(M.c.id)
            )
            rows = plain_rows(tx.session, query)
        else:
            params: dict[str, Any] = {"profile": tx.profile, "tiers": list(tiers)}
            if tx.horizon is not None:
                params["horizon"] = tx.horizon
            if tx.as_of is not None:
                params["as_of"] = tx.as_of
            by_id = _BY_ID_WITHIN[tx.horizon is not None, tx.as_of is not None]
            # In the order given, which came from the store's own ORDER BY (its collation
            # may not be Python's).
            found = {r[0]: r for batch in chunks(ids_)
                     for r in plain_rows(tx.session, by_id, {**params, "ids": batch})}
            rows = [found[i] for i in ids_ if i in found]
        views = [view(r) for r in rows]
    return views, from_blobs([r[-1] for r in rows])


# Named memories of one profile, the statement built once: a server's recall reads its
# few hits this way on every call, and building the statement each time cost more CPU
# (0.4 ms, holding the GIL) than SQLite's reading of the rows. ``owned_by``: no index
# on the profile (see there).
_BY_ID = (
    select(*VIEW_COLUMNS, V.c.embedding).select_from(WITH_VECTOR)
    .where(owned_by(M, bindparam("profile")))
    .where(M.c.tier.in_(bindparam("tiers", expanding=True)))
    .where(M.c.id.in_(bindparam("ids", expanding=True)))
    .order_by(M.c.id)
)
# within_horizon, by (has a horizon, has an as_of).
_BY_ID_WITHIN = {
    (False, False): _BY_ID,
    (True, False): _BY_ID.where(M.c.ingest_seq <= bindparam("horizon")),
    (False, True): _BY_ID.where(M.c.created_at <= bindparam("as_of")),
    (True, True): _BY_ID.where(M.c.ingest_seq <= bindparam("horizon"))
    .where(M.c.created_at <= bindparam("as_of")),
}


@dataclass(frozen=True, slots=True)
class Outline:
    """What recall plans its candidates from (``engines.ranking.plan_candidates``): a
    memory's id, tier, replacement and origin, without the rest of its row."""

    id: str
    tier: str
    superseded_by: str | None
    origin: str


def outline(tx: ProfileTx, tiers: Sequence[str]) -> tuple[list[Outline], np.ndarray]:
    """``snapshot`` narrowed to ``Outline``'s columns and the vectors, ordered by id: a
    recall reads the whole profile, but builds whole memories only for its hits."""
    from reverie.models.vectors import from_blobs

    query = (
        select(M.c.id, M.c.tier, M.c.superseded_by, M.c.origin, V.c.embedding)
        .select_from(WITH_VECTOR)
        .where(M.c.profile_id == tx.profile)
        .where(M.c.tier.in_(list(tiers)))
        .where(within_horizon(tx))
        .order_by(M.c.id)
    )
    with collector_paused():
        rows = plain_rows(tx.session, query)
        outlines = [Outline(r[0], r[1], r[2], r[3]) for r in rows]
    return outlines, from_blobs([r[4] for r in rows])


def relevance_inputs(tx: ProfileTx) -> RelevanceInputs:
    """What relevance is computed from, for the profile's live hot memories."""
    import numpy as np

    # Times as the driver gives them (SQLite: text), converted by numpy in one call
    # rather than parsed row by row.
    query = (
        select(M.c.id, type_coerce(M.c.created_at, Text),
               type_coerce(M.c.last_accessed_at, Text), M.c.importance,
               M.c.confidence, M.c.relevance)
        .where(M.c.profile_id == tx.profile)
        .where(M.c.tier == Tier.HOT)
        .where(M.c.superseded_by.is_(None))
        .where(within_horizon(tx))
        .order_by(M.c.id)
    )
    with collector_paused():
        rows = tx.session.execute(query).all()
        ends = tx.session.execute(
            select(_E.c.source_id, _E.c.target_id).where(_E.c.profile_id == tx.profile)
        ).all()
    # An edge to a memory ingested since the run took the profile (or created after its
    # 'now') came with it: the next run counts it, as it would had the ingest come
    # after this run.
    beyond = beyond_horizon(tx)
    degree: dict[str, int] = defaultdict(int)
    for source, target in ends:
        if beyond and (source in beyond or target in beyond):
            continue
        degree[source] += 1
        degree[target] += 1

    def seconds(values: Iterable[str | datetime | None]) -> np.ndarray:
        """Epoch seconds of naive UTC times (NaN for none); numpy reads ISO text
        and datetimes alike."""
        stamps = np.array(list(values), dtype="datetime64[us]")
        out = stamps.astype(np.int64) / 1e6
        out[np.isnat(stamps)] = np.nan
        return out

    def numbers(values: Iterable[float | None]) -> np.ndarray:
        return np.array([np.nan if v is None else v for v in values], dtype=np.float64)

    ids_ = [r[0] for r in rows]
    return RelevanceInputs(
        ids=ids_,
        created=seconds(r[1] for r in rows),
        accessed=seconds(r[2] for r in rows),
        importance=numbers(r[3] for r in rows),
        confidence=numbers(r[4] for r in rows),
        relationships=np.array([degree.get(i, 0) for i in ids_], dtype=np.int64),
        relevance=numbers(r[5] for r in rows),
    )


def vector(tx: ProfileTx, memory_id: str) -> np.ndarray | None:
    from reverie.models.vectors import from_blobs

    blob = tx.session.execute(
        select(V.c.embedding).select_from(WITH_VECTOR)
        .where(M.c.profile_id == tx.profile).where(V.c.memory_id == memory_id)
    ).scalar()
    return None if blob is None else from_blobs([blob])[0]


def counts(tx: ProfileTx) -> dict[str, int]:
    """How many memories of the profile are hot and cold, and how many are tombstones."""
    tiers = dict(
        tx.session.execute(
            select(M.c.tier, func.count()).where(M.c.profile_id == tx.profile)
            .group_by(M.c.tier)
        ).tuples().all()
    )
    tombs = tx.session.execute(
        select(func.count()).select_from(Tombstone).where(col(Tombstone.profile_id) == tx.profile)
    ).scalar_one()
    return {Tier.HOT: tiers.get(Tier.HOT, 0), Tier.COLD: tiers.get(Tier.COLD, 0),
            "tombstones": tombs}


# --- writing ---------------------------------------------------------------------------


def record_access(
    tx: ProfileTx, memory_ids: Sequence[str], at: datetime, co_access_bonus: float
) -> int:
    """Count one access of each memory at ``at``; association edges between memories
    accessed together gain ``co_access_bonus``. Returns how many memories were found."""
    wanted = sorted(set(memory_ids))
    if not wanted:
        return 0
    s = tx.session
    found = list(s.execute(
        select(Memory).where(col(Memory.profile_id) == tx.profile).where(col(Memory.id).in_(wanted))
    ).scalars())
    for m in found:
        m.access_count += 1
        if m.last_accessed_at is None or m.last_accessed_at < at:
            m.last_accessed_at = at
    edges = s.execute(
        select(Edge)
        .where(col(Edge.profile_id) == tx.profile)
        .where(col(Edge.kind) == EdgeKind.ASSOCIATION)
        .where(col(Edge.source_id).in_(wanted))
        .where(col(Edge.target_id).in_(wanted))
    ).scalars()
    for e in edges:
        e.weight = e.base_weight = min(1.0, e.weight + co_access_bonus)
        e.last_strengthened_at = max(e.last_strengthened_at, at)
    return len(found)


def set_relevance(tx: ProfileTx, scores: Sequence[tuple[str, float]]) -> None:
    """Write relevance scores in bulk."""
    set_column(tx, "relevance", scores)


def set_lifecycles(tx: ProfileTx, changes: Sequence[tuple[str, str]]) -> None:
    set_column(tx, "lifecycle", changes)


def set_statuses(tx: ProfileTx, changes: Sequence[tuple[str, str]]) -> None:
    set_column(tx, "status", changes)


def set_column(tx: ProfileTx, column: str, values: Sequence[tuple[str, Any]]) -> None:
    """Set one column of many memories of the profile (within the horizon)."""
    if values:
        bulk_set(tx.session, M, [column], values, M.c.profile_id == tx.profile,
                 within_horizon(tx))


def set_graph_scores(tx: ProfileTx, scores: Sequence[GraphScore]) -> list[str]:
    """Store PageRank and community per hot memory; memories outside the graph lose
    theirs. Writes only what differs; returns the ids whose scores changed. Memories
    beyond the horizon keep what they have: the graph was read without them."""
    s, profile = tx.session, tx.profile
    wanted = {sc.memory_id: (sc.pagerank, sc.community) for sc in scores}
    current = {
        mid: (pr, cm)
        for mid, pr, cm in plain_rows(
            s, select(M.c.id, M.c.pagerank, M.c.community).where(M.c.profile_id == profile)
            .where(within_horizon(tx))
        )
    }
    stale = [mid for mid, v in current.items() if mid not in wanted and v != (None, None)]
    # A scored memory not read here left the horizon since the graph was read.
    changed = {mid: v for mid, v in wanted.items() if mid in current and current[mid] != v}
    for batch in chunks(stale):
        s.execute(update(M).where(M.c.id.in_(batch)).where(within_horizon(tx))
                  .values(pagerank=None, community=None))
    bulk_set(s, M, ["pagerank", "community"],
             [(mid, pr, cm) for mid, (pr, cm) in changed.items()],
             M.c.profile_id == profile, within_horizon(tx))
    return sorted([*stale, *changed])


# --- vectors ---------------------------------------------------------------------------


def stored_vectors(s: Session, memory_ids: Sequence[str]) -> dict[str, bytes]:
    """The vectors the store holds for ``memory_ids`` (those that have one)."""
    return {
        mid: blob
        for batch in chunks(memory_ids)
        for mid, blob in s.execute(
            select(V.c.memory_id, V.c.embedding).where(V.c.memory_id.in_(batch))
        )
    }


def put_vectors(s: Session, vectors: Mapping[str, bytes | None], replace: bool = True) -> None:
    """Give memories these vectors (``None``: none). ``replace=False`` is for memories
    written in this transaction, which cannot have one yet."""
    if replace:
        for batch in chunks(vectors):
            s.execute(delete(V).where(V.c.memory_id.in_(batch)))
    rows = [{"memory_id": mid, "embedding": blob} for mid, blob in vectors.items() if blob]
    insert_rows(s, V, rows)


def memory_defaults() -> dict[str, Any]:
    """Every column of a memory row with its default, for inserts without the ORM.

    A bulk insert compiles its statement from the first row's keys, so every row must
    carry every column: a key missing from the first row would be dropped from all.
    """
    m = Memory(id="", profile_id="", content="", content_hash="", created_at=datetime.min)
    return {
        column.name: (m.meta if column.name == "metadata" else getattr(m, column.name))
        for column in M.columns
    }
