"""The memory store: every query and every write Reverie makes.

Each write method is one transaction and touches one profile only. Steps read a
snapshot (plain records and a vector matrix), plan in pure code, and hand the plan
back here to be written.
"""

from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from pydantic_core import from_json
from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Table,
    Text,
    bindparam,
    case,
    delete,
    func,
    insert,
    or_,
    select,
    type_coerce,
    update,
)
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError
from sqlmodel import Session

from reverie.engines.embedding import get_embedder
from reverie.models import events, ids, outbox, tables
from reverie.models.db import reading, writing
from reverie.models.errors import AmbiguousIdError, NotFoundError, RecordError, StoreError
from reverie.models.ingest import EdgeIn, MemoryIn, parse_record, read_jsonl
from reverie.models.records import (
    BlockPlan,
    EdgeView,
    GraphScore,
    MemoryView,
    MetaPlan,
    NewEdge,
    RelevanceInputs,
    RelevanceSpread,
    SummaryPlan,
)
from reverie.models.settings import Settings, get_settings, resolve_database_url
from reverie.models.tables import (
    CoreBlock,
    Edge,
    EdgeKind,
    Lifecycle,
    Memory,
    Profile,
    Tier,
    Tombstone,
)
from reverie.models.timestamps import utcnow
from reverie.models.vectors import DIMENSION, MODEL_NAME, from_blobs, to_blob

log = logging.getLogger(__name__)

SUPPLIED_EMBEDDING = "supplied"  # embedding_model of vectors given by the caller
INGEST_CHUNK = 1024
# An ingest's ``progress``: False; True for the embedding's own bar; or a callable told
# how many records (lines) were dealt with as the ingest goes, for a caller's bar that
# moves while the model embeds. Counts only, never content.
IngestProgress = bool | Callable[[int], None]
# Recall strengthens association edges between memories found together by this much.
CO_ACCESS_BONUS = 0.05

_M = Memory.__table__  # type: ignore[attr-defined]
_E = Edge.__table__  # type: ignore[attr-defined]
_C = tables.Consolidation.__table__  # type: ignore[attr-defined]
_V = tables.MemoryVector.__table__  # type: ignore[attr-defined]
# Memories with their vectors: the join every vector read goes through.
_WITH_VECTOR = _M.join(_V, _V.c.memory_id == _M.c.id)

_VIEW_COLUMNS = [
    *(_M.c[f.name] for f in dataclass_fields(MemoryView) if f.name != "meta"),
    # Raw JSON text, decoded by _view: most memories carry none ("{}"), and a whole
    # profile is read per step.
    type_coerce(_M.c.metadata, Text).label("meta"),
]

# MemoryView.is_live as SQL: hot, not replaced by a summary, not archived.
_LIVE = (
    (_M.c.tier == Tier.HOT) & _M.c.superseded_by.is_(None)
    & _M.c.lifecycle.in_([Lifecycle.ACTIVE, Lifecycle.PROMOTED])
)

_EDGE_VIEW_COLUMNS = [_E.c[f.name] for f in dataclass_fields(EdgeView)]


# Ids per IN (...) clause: SQLite allows at most 32,766 bound values in a statement.
IN_CHUNK = 10_000


def _chunks(values: Iterable[str]) -> Iterator[list[str]]:
    """``values`` in lists of at most IN_CHUNK, for IN clauses over whole profiles."""
    batch: list[str] = []
    for value in values:
        batch.append(value)
        if len(batch) == IN_CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch


_META_AT = len(_VIEW_COLUMNS) - 1  # _VIEW_COLUMNS follow MemoryView's fields, meta last


def _view(row: Any) -> MemoryView:
    """A MemoryView from a row that starts with _VIEW_COLUMNS (positional: a profile is
    read per step, and building 100k dicts first doubles the cost)."""
    return MemoryView(*row[:_META_AT], _metadata(row[_META_AT]))


def _metadata(raw: str | dict[str, Any] | None) -> dict[str, Any]:
    if isinstance(raw, dict):  # a driver that decodes JSON itself (psycopg2)
        return raw
    if not raw or raw in ("{}", "null"):
        return {}
    return from_json(raw)


# Operations whose effects undo can reverse (a forget deletes rows; it cannot).
UNDOABLE = frozenset({*tables.SUMMARY_ORIGINS, tables.Origin.META_MEMORY, tables.COLD_MIGRATION})
# Operations that move memories to the cold tier, and where their audit names them.
_TO_COLD = {**{op: "prior" for op in tables.SUMMARY_ORIGINS},
            "forget": "archived", tables.COLD_MIGRATION: "prior"}


@dataclass
class UndoResult:
    consolidation_id: str
    profile: str
    operation: str
    summary_id: str | None
    restored: list[str] = field(default_factory=list)
    already_undone: bool = False


@dataclass
class IngestReport:
    stored: int = 0
    updated: int = 0
    unchanged: int = 0
    edges: int = 0
    errors: list[RecordError] = field(default_factory=list)
    stored_ids: list[str] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        return self.stored + self.updated + self.unchanged


class Store:
    """One memory store, addressed by its database URL."""

    def __init__(self, url: str | None = None, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self.url = resolve_database_url(url or self.settings.database_url)
        self._queued_events = False

    # --- profiles ---------------------------------------------------------------------

    def profiles(self) -> list[str]:
        with reading(self.url) as s:
            return list(s.execute(select(Profile.id).order_by(Profile.id)).scalars())

    def resolve_profiles(self, selector: str | Sequence[str] | None) -> list[str]:
        """``None`` means every profile; a name or a list must all exist."""
        known = self.profiles()
        if selector is None:
            return known
        wanted = [selector] if isinstance(selector, str) else list(selector)
        missing = sorted(set(wanted) - set(known))
        if missing:
            raise NotFoundError(f"no profile named {', '.join(map(repr, missing))}")
        return sorted(set(wanted))

    # --- ingest -----------------------------------------------------------------------

    def ingest(
        self,
        records: Iterable[dict[str, Any]],
        profile: str | None = None,
        at: datetime | None = None,
        progress: IngestProgress = False,
    ) -> IngestReport:
        """Validate and store memory (and edge) records given as dicts."""
        return self._ingest(
            ((f"record {n}", r) for n, r in enumerate(records, start=1)), profile, at, progress
        )

    def ingest_jsonl(
        self, path: Path | str, profile: str | None = None, at: datetime | None = None,
        progress: IngestProgress = False,
    ) -> IngestReport:
        """Store every valid line of a JSONL file; bad lines are reported, not stored."""
        return self._ingest(read_jsonl(Path(path)), profile, at, progress)

    def _ingest(
        self,
        items: Iterable[tuple[str, object]],
        profile: str | None,
        at: datetime | None,
        progress: IngestProgress,
    ) -> IngestReport:
        at = at or utcnow()
        report = IngestReport()
        # Lines refused or holding edges count as dealt with when read (edges are written
        # at the end, quickly); memories as their chunk is embedded and written.
        dealt_with = progress if callable(progress) else _no_progress
        self._queued_events = False  # set by a commit that queued events
        chunk: list[MemoryIn] = []
        edges: list[EdgeIn] = []
        for where, obj in items:
            if isinstance(obj, RecordError):
                report.errors.append(obj)
                dealt_with(1)
                continue
            try:
                record = parse_record(
                    obj, where, profile, self.settings.max_content_chars, DIMENSION
                )
            except RecordError as exc:
                report.errors.append(exc)
                dealt_with(1)
                continue
            if isinstance(record, EdgeIn):
                edges.append(record)
                dealt_with(1)
                continue
            chunk.append(record)
            if len(chunk) >= INGEST_CHUNK:
                self._write_memories(chunk, at, report, progress)
                chunk = []
        if chunk:
            self._write_memories(chunk, at, report, progress)
        if edges:
            self._write_edges(edges, at, report)
        if self._queued_events:
            # One send per ingest, after its last commit: a large ingest writes many
            # chunks, and an API that is down would cost each of them a deadline.
            outbox.deliver(self.url)
        return report

    def _write_memories(
        self, records: list[MemoryIn], at: datetime, report: IngestReport,
        progress: IngestProgress,
    ) -> None:
        embedded = 0

        def embedding(n: int) -> None:
            nonlocal embedded
            embedded += n
            progress(n)  # type: ignore[operator]

        rows: dict[str, dict[str, Any]] = {}
        for rec in records:
            values = dict(rec.values)
            created = values.setdefault("created_at", at)
            sha = ids.content_hash(rec.content)
            if rec.external_id is not None:
                mid = ids.memory_id_for_external(rec.profile, rec.external_id)
            else:
                mid = ids.memory_id_for_content(rec.profile, sha, created.isoformat())
            previous = rows.get(mid)
            given = set(rec.given) | {"content", "content_hash"}
            if previous is not None:  # the same memory twice in one batch: the later wins
                values = {**previous["values"], **values}
                given |= previous["given"]
            rows[mid] = {
                "id": mid,
                "profile": rec.profile,
                "values": {**values, "content": rec.content, "content_hash": sha},
                "given": given,
                "embedding": rec.embedding,
                "where": rec.where,
            }

        with reading(self.url) as s:
            existing = {
                r.id: r
                for r in s.execute(
                    select(_M.c.id, _M.c.profile_id, _M.c.content_hash,
                           _V.c.memory_id.label("vector_id"))
                    .select_from(_M.outerjoin(_V, _V.c.memory_id == _M.c.id))
                    .where(_M.c.id.in_(list(rows)))
                )
            }
        # A caller's bar moves batch by batch while the model embeds (most of the time).
        vectors = self._embeddings_for(rows, existing, embedding if callable(progress)
                                       else progress)

        new_rows: list[dict[str, Any]] = []
        changed: list[tuple[str, dict[str, Any]]] = []
        for mid, row in rows.items():
            values = row["values"]
            old = existing.get(mid)
            if old is None:
                new_rows.append(
                    {
                        **_memory_defaults(),
                        **{("metadata" if k == "meta" else k): v for k, v in values.items()},
                        "id": mid,
                        "profile_id": row["profile"],
                        "embedding_model": vectors[mid][1],
                    }
                )
            else:
                patch = {k: values[k] for k in row["given"]}
                if mid in vectors:
                    patch["embedding_model"] = vectors[mid][1]
                changed.append((mid, patch))

        try:
            self._commit_memories(rows, new_rows, changed, vectors, at, report)
        except self._REFUSALS as exc:
            if self._refused_value(exc) is None:
                raise
            # Validation should have caught it; but one value the database refuses rolls
            # back the whole chunk, so store the chunk record by record and leave out
            # only what is refused.
            new_by_id = {r["id"]: r for r in new_rows}
            changed_by_id = dict(changed)
            for mid, row in rows.items():
                alone_new = [new_by_id[mid]] if mid in new_by_id else []
                alone_changed = [(mid, changed_by_id[mid])] if mid in changed_by_id else []
                try:
                    self._commit_memories(rows, alone_new, alone_changed, vectors, at, report)
                except self._REFUSALS as one:
                    reason = self._refused_value(one)
                    if reason is None:
                        raise
                    report.errors.append(
                        RecordError(row["where"], None, f"could not be stored: {reason}")
                    )
        if callable(progress) and len(records) > embedded:
            # Each text embedded stood for at least one record: the rest are done now.
            progress(len(records) - embedded)

    # What the database raises when it refuses a value (sqlite3 raises OverflowError
    # itself, unwrapped, for an integer beyond 64 bits); _refused_value sorts these out
    # from the errors that are not about one record (locks, lost connections).
    _REFUSALS = (DataError, StatementError, OverflowError)

    @staticmethod
    def _refused_value(exc: BaseException) -> str | None:
        """Why the database refused a value, in a few words that quote no value; None if
        ``exc`` is not such a refusal (storing the same rows again might then succeed)."""
        if isinstance(exc, OverflowError):
            return "a number is too large"
        if isinstance(exc, DataError):
            # PostgreSQL's primary message names the problem ("integer out of range");
            # where it quotes a value, the value follows a colon, so it is cut off.
            diag = getattr(exc.orig, "diag", None)
            primary = getattr(diag, "message_primary", None)
            if primary:
                return primary.split(":", 1)[0].strip() or "invalid value"
            return Store._words(type(exc.orig).__name__)
        if isinstance(exc, StatementError) and not isinstance(exc, DBAPIError):
            # A value a column type or the driver could not convert before sending.
            return Store._words(type(exc.orig).__name__)
        return None

    @staticmethod
    def _words(class_name: str) -> str:
        """``NumericValueOutOfRange`` -> ``numeric value out of range``."""
        return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", class_name).lower() or "invalid value"

    def _commit_memories(
        self,
        rows: dict[str, dict[str, Any]],
        new_rows: list[dict[str, Any]],
        changed: list[tuple[str, dict[str, Any]]],
        vectors: dict[str, tuple[bytes, str]],
        at: datetime,
        report: IngestReport,
    ) -> None:
        """Insert ``new_rows`` and apply ``changed`` in one transaction; the report and
        the store's events are queued in that transaction and sent once it has committed."""
        updated = unchanged = 0
        keep_events = events.wanted()
        with writing(self.url) as s:
            self._ensure_profiles(s, {r["profile_id"] for r in new_rows} | {
                rows[mid]["profile"] for mid, _ in changed
            }, at)
            if new_rows:
                s.execute(insert(_M), new_rows)
                _put_vectors(s, {r["id"]: vectors[r["id"]][0] for r in new_rows}, replace=False)
            stored = _stored_vectors(s, [mid for mid, _ in changed if mid in vectors])
            revectored: dict[str, bytes | None] = {}
            for mid, patch in changed:
                current = s.get(Memory, mid)
                if current is None:  # deleted between read and write: store it afresh
                    raise StoreError(f"memory {mid} vanished during ingest; retry")
                before = stored.get(mid)
                blob = vectors[mid][0] if mid in vectors else before
                if blob == before and all(getattr(current, k) == v for k, v in patch.items()):
                    unchanged += 1
                    continue
                for key, value in patch.items():
                    setattr(current, key, value)
                if blob != before:
                    revectored[mid] = blob
                updated += 1
            _put_vectors(s, revectored)
            counts: dict[str, int] = defaultdict(int)
            for r in new_rows:
                counts[r["profile_id"]] += 1
            before = dict(
                s.execute(
                    select(Profile.id, Profile.store_count).where(Profile.id.in_(list(counts)))
                ).all()
            )
            for name, n in counts.items():
                s.execute(
                    update(Profile).where(Profile.id == name)
                    .values(store_count=Profile.store_count + n)
                )
            every = self.settings.store_trigger_every
            queued = keep_events and outbox.add(s, [
                e for name, n in sorted(counts.items())
                for e in events.stored_events(name, before[name], before[name] + n, at, every)
            ])
        report.updated += updated
        report.unchanged += unchanged
        report.stored += len(new_rows)
        report.stored_ids.extend(r["id"] for r in new_rows)
        self._queued_events = self._queued_events or bool(queued)

    def _embeddings_for(
        self, rows: dict[str, dict[str, Any]], existing: dict[str, Any], progress: IngestProgress
    ) -> dict[str, tuple[bytes, str]]:
        """Vectors for new or changed content; cached by content hash in the store."""
        out: dict[str, tuple[bytes, str]] = {}
        todo: dict[str, list[str]] = defaultdict(list)  # content hash -> memory ids
        texts: dict[str, str] = {}
        for mid, row in rows.items():
            sha = row["values"]["content_hash"]
            old = existing.get(mid)
            if row["embedding"] is not None:
                out[mid] = (to_blob(row["embedding"]), SUPPLIED_EMBEDDING)
            elif old is None or old.content_hash != sha or old.vector_id is None:
                todo[sha].append(mid)
                texts[sha] = row["values"]["content"]
        if not todo:
            return out
        model_name = self.embedding_model_name()
        with reading(self.url) as s:
            cached = dict(
                s.execute(
                    select(_M.c.content_hash, _V.c.embedding).select_from(_WITH_VECTOR)
                    .where(_M.c.content_hash.in_(list(todo)))
                    .where(_M.c.embedding_model == model_name)
                ).all()
            )
        missing = [sha for sha in todo if sha not in cached]
        if missing:
            embedder = self.embedder()
            matrix = embedder.encode([texts[sha] for sha in missing], progress=progress)
            for sha, vector in zip(missing, matrix, strict=True):
                cached[sha] = to_blob(vector)
        for sha, mids in todo.items():
            for mid in mids:
                out[mid] = (cached[sha], model_name)
        return out

    def _write_edges(self, edges: list[EdgeIn], at: datetime, report: IngestReport) -> None:
        for profile, group in _group_by(edges, lambda e: e.profile).items():
            refs = {e.source for e in group} | {e.target for e in group}
            resolved = self._resolve_refs(profile, refs)
            good: list[tuple[EdgeIn, str, str]] = []
            for e in group:
                try:
                    source = _lookup(resolved, e.source, e.where, "source")
                    target = _lookup(resolved, e.target, e.where, "target")
                except RecordError as exc:
                    report.errors.append(exc)
                    continue
                good.append((e, source, target))
            timed: list[tuple[NewEdge, datetime, datetime]] = []
            for e, source, target in good:
                when = e.values.get("last_strengthened_at", at)
                edge = NewEdge(source, target, e.kind, e.weight, e.values.get("subkind"),
                               e.values.get("confidence"), e.values.get("meta", {}))
                timed.append((edge, when, e.values.get("created_at", when)))
            with writing(self.url) as s:
                _upsert_timed_edges(s, profile, timed)
            report.edges += len(timed)

    def _resolve_refs(self, profile: str, refs: set[str]) -> dict[str, str]:
        """Map external ids and Reverie ids of one profile to Reverie ids."""
        with reading(self.url) as s:
            rows = [
                row
                for batch in _chunks(sorted(refs))
                for row in s.execute(
                    select(_M.c.id, _M.c.external_id).where(_M.c.profile_id == profile).where(
                        or_(_M.c.id.in_(batch), _M.c.external_id.in_(batch))
                    )
                )
            ]
        out: dict[str, str] = {}
        for mid, ext in rows:
            out[mid] = mid
            if ext is not None:
                out[ext] = mid
        return out

    @staticmethod
    def _ensure_profiles(s: Session, names: Iterable[str], at: datetime) -> None:
        names = set(names)
        if not names:
            return
        known = set(s.execute(select(Profile.id).where(Profile.id.in_(list(names)))).scalars())
        for name in sorted(names - known):
            s.add(Profile(id=name, created_at=at))
        s.flush()

    def embedding_model_name(self) -> str:
        path = self.settings.embedding_model_path
        return Path(path).name if path else MODEL_NAME

    def embedder(self):  # type: ignore[no-untyped-def]
        return get_embedder(self.settings.embedding_model_path, self.settings.embedding_batch_size)

    # --- reading ------------------------------------------------------------------------

    def get(self, ident: str, profile: str | None = None) -> Memory | Tombstone:
        """A memory by Reverie id or external id, in any tier; else its tombstone."""
        with reading(self.url) as s:
            memory = s.get(Memory, ident)
            if memory is not None and (profile is None or memory.profile_id == profile):
                return memory
            query = select(Memory).where(Memory.external_id == ident)
            if profile is not None:
                query = query.where(Memory.profile_id == profile)
            found = list(s.execute(query).scalars())
            if len(found) > 1:
                owners = ", ".join(sorted(m.profile_id for m in found))
                raise AmbiguousIdError(
                    f"id {ident!r} exists in several profiles ({owners}); name one with --profile"
                )
            if found:
                return found[0]
            tomb_query = select(Tombstone).where(
                or_(Tombstone.memory_id == ident, Tombstone.external_id == ident)
            )
            if profile is not None:
                tomb_query = tomb_query.where(Tombstone.profile_id == profile)
            tomb = s.execute(tomb_query).scalars().first()
            if tomb is not None:
                return tomb
        raise NotFoundError(f"no memory with id {ident!r}")

    def external_ids(self, ids_: Sequence[str]) -> dict[str, str]:
        """The id the user gave each of ``ids_`` (Reverie ids) that has one, deleted
        memories included (their tombstones keep it): what reports show beside ours."""
        wanted = sorted(set(ids_))
        found: dict[str, str] = {}
        with reading(self.url) as s:
            for start in range(0, len(wanted), 500):
                batch = wanted[start:start + 500]
                for table, key in ((Memory, Memory.id), (Tombstone, Tombstone.memory_id)):
                    found.update(s.execute(
                        select(key, table.external_id)
                        .where(key.in_(batch)).where(table.external_id.is_not(None))
                    ).all())
        return found

    def memories(
        self, profile: str, tiers: Sequence[str] = (Tier.HOT,), ids_: Sequence[str] | None = None,
        relevance_below: float | None = None,
    ) -> list[MemoryView]:
        """The profile's memories in ``tiers``, ordered by id; only ``ids_`` if given,
        only those scored below ``relevance_below`` if given."""
        query = (
            select(*_VIEW_COLUMNS)
            .where(_M.c.profile_id == profile)
            .where(_M.c.tier.in_(list(tiers)))
            .order_by(_M.c.id)
        )
        if ids_ is not None:
            query = query.where(_M.c.id.in_(list(ids_)))
        if relevance_below is not None:
            query = query.where(_M.c.relevance < relevance_below)
        with reading(self.url) as s:
            return [_view(r) for r in s.execute(query)]

    def live_ids(self, profile: str, relevance_above: float) -> list[str]:
        """Ids of the profile's live memories (MemoryView.is_live) scored above
        ``relevance_above`` and with a vector (as ``snapshot`` reads them), ordered by
        id: a step that samples draws from these and reads only what it drew."""
        query = (
            select(_M.c.id).select_from(_WITH_VECTOR)
            .where(_M.c.profile_id == profile).where(_LIVE)
            .where(_M.c.relevance > relevance_above).order_by(_M.c.id)
        )
        with reading(self.url) as s:
            return list(s.execute(query).scalars())

    def relevance_spread(self, profile: str) -> RelevanceSpread:
        """How the profile's hot memories are scored (RelevanceSpread), in one query."""
        live_score = case((_LIVE, _M.c.relevance), else_=None)
        query = (
            select(func.count(), func.count(_M.c.relevance), func.count(live_score),
                   func.max(live_score))
            .where(_M.c.profile_id == profile).where(_M.c.tier == Tier.HOT)
        )
        with reading(self.url) as s:
            hot, scored, live_scored, highest = s.execute(query).one()
        return RelevanceSpread(hot, scored, live_scored,
                               None if highest is None else float(highest))

    def memory_ids(self, profile: str, tiers: Sequence[str] = (Tier.HOT,)) -> list[str]:
        with reading(self.url) as s:
            return list(
                s.execute(
                    select(_M.c.id).where(_M.c.profile_id == profile)
                    .where(_M.c.tier.in_(list(tiers))).order_by(_M.c.id)
                ).scalars()
            )

    def snapshot(
        self, profile: str, tiers: Sequence[str] = (Tier.HOT,), ids_: Sequence[str] | None = None
    ) -> tuple[list[MemoryView], np.ndarray]:
        """The profile's memories in ``tiers`` and their vectors, row-aligned: ordered by
        id, or only ``ids_`` in their order."""
        query = (
            select(*_VIEW_COLUMNS, _V.c.embedding).select_from(_WITH_VECTOR)
            .where(_M.c.profile_id == profile)
            .where(_M.c.tier.in_(list(tiers)))
            .order_by(_M.c.id)
        )
        with reading(self.url) as s:
            if ids_ is None:
                rows = s.execute(query).all()
            else:
                # In the order given, which came from the store's own ORDER BY (its
                # collation may not be Python's).
                found = {r.id: r for batch in _chunks(ids_)
                         for r in s.execute(query.where(_M.c.id.in_(batch)))}
                rows = [found[i] for i in ids_ if i in found]
        views = [_view(r) for r in rows]
        return views, from_blobs([r[-1] for r in rows])

    def originals_of(self, profile: str, summary_ids: Sequence[str]) -> dict[str, list[MemoryView]]:
        """The memories each summary superseded, by summary id."""
        out: dict[str, list[MemoryView]] = {sid: [] for sid in summary_ids}
        with reading(self.url) as s:
            for batch in _chunks(summary_ids):
                query = (
                    select(*_VIEW_COLUMNS)
                    .where(_M.c.profile_id == profile)
                    .where(_M.c.superseded_by.in_(batch))
                    .order_by(_M.c.id)
                )
                for row in s.execute(query):
                    view = _view(row)
                    out[view.superseded_by].append(view)  # type: ignore[index]
        return out

    def relevance_inputs(self, profile: str) -> RelevanceInputs:
        """What relevance is computed from, for the profile's live hot memories."""
        # Times as the driver gives them (SQLite: text), converted by numpy in one call
        # rather than parsed row by row.
        query = (
            select(_M.c.id, type_coerce(_M.c.created_at, Text),
                   type_coerce(_M.c.last_accessed_at, Text), _M.c.importance,
                   _M.c.confidence, _M.c.relevance)
            .where(_M.c.profile_id == profile)
            .where(_M.c.tier == Tier.HOT)
            .where(_M.c.superseded_by.is_(None))
            .order_by(_M.c.id)
        )
        with reading(self.url) as s:
            rows = s.execute(query).all()
            ends = s.execute(
                select(_E.c.source_id, _E.c.target_id).where(_E.c.profile_id == profile)
            ).all()
        degree: dict[str, int] = defaultdict(int)
        for source, target in ends:
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

    def set_relevance(self, profile: str, scores: Sequence[tuple[str, float]]) -> None:
        """Write relevance scores in bulk."""
        self._set_column(profile, "relevance", scores)

    def vector(self, memory_id: str) -> np.ndarray | None:
        with reading(self.url) as s:
            blob = s.execute(select(_V.c.embedding).where(_V.c.memory_id == memory_id)).scalar()
        return None if blob is None else from_blobs([blob])[0]

    def edges(self, profile: str, kinds: Sequence[str] | None = None) -> list[EdgeView]:
        query = select(*_EDGE_VIEW_COLUMNS).where(_E.c.profile_id == profile).order_by(_E.c.id)
        if kinds is not None:
            query = query.where(_E.c.kind.in_(list(kinds)))
        with reading(self.url) as s:
            return [EdgeView(*r) for r in s.execute(query)]

    def association_edges_to_decay(self, profile: str, idle_since: datetime) -> list[EdgeView]:
        """Association edges idle since ``idle_since`` or already decayed (index-backed)."""
        query = (
            select(*_EDGE_VIEW_COLUMNS)
            .where(_E.c.profile_id == profile)
            .where(_E.c.kind == EdgeKind.ASSOCIATION)
            .where(or_(_E.c.last_strengthened_at <= idle_since, _E.c.weight != _E.c.base_weight))
            .order_by(_E.c.id)
        )
        with reading(self.url) as s:
            return [EdgeView(*r) for r in s.execute(query)]

    def blocks(self, profile: str) -> list[CoreBlock]:
        with reading(self.url) as s:
            return list(
                s.execute(
                    select(CoreBlock).where(CoreBlock.profile_id == profile)
                    .order_by(CoreBlock.block_type)
                ).scalars()
            )

    def counts(self, profile: str) -> dict[str, int]:
        """How many memories of the profile are hot and cold, and how many are tombstones."""
        with reading(self.url) as s:
            tiers = dict(
                s.execute(
                    select(_M.c.tier, func.count()).where(_M.c.profile_id == profile)
                    .group_by(_M.c.tier)
                ).all()
            )
            tombs = s.execute(
                select(func.count()).select_from(Tombstone).where(Tombstone.profile_id == profile)
            ).scalar_one()
        return {Tier.HOT: tiers.get(Tier.HOT, 0), Tier.COLD: tiers.get(Tier.COLD, 0),
                "tombstones": tombs}

    # --- run history -------------------------------------------------------------------

    def record_runs(self, records: Sequence[tables.RunRecord]) -> None:
        with writing(self.url) as s:
            s.add_all(records)

    def run_history(
        self,
        profile: str | None = None,
        flow: str | None = None,
        limit: int | None = 20,
        as_of: datetime | None = None,
    ) -> list[tables.RunRecord]:
        """The most recent finished runs, newest first (all of them with ``limit=None``)."""
        query = select(tables.RunRecord).order_by(
            tables.RunRecord.finished_at.desc(), tables.RunRecord.id.desc()
        )
        if profile is not None:
            query = query.where(tables.RunRecord.profile_id == profile)
        if flow is not None:
            query = query.where(tables.RunRecord.flow == flow)
        if as_of is not None:
            query = query.where(tables.RunRecord.as_of == as_of)
        with reading(self.url) as s:
            return list(s.execute(query.limit(limit)).scalars())

    # --- leases: one run per profile at a time -------------------------------------

    def acquire_leases(
        self, profiles: Sequence[str], holder: str, seconds: float, at: datetime | None = None
    ) -> list[str]:
        """Take every free (or expired, or already ours) profile among ``profiles`` for
        ``holder``; returns the profiles taken. Safe against other processes taking the
        same profile at the same moment, on SQLite and PostgreSQL alike."""
        at = at or utcnow()
        until = at + timedelta(seconds=seconds)
        taken: list[str] = []
        with writing(self.url) as s:
            for profile in sorted(set(profiles)):
                lease = tables.Lease.__table__  # type: ignore[attr-defined]
                claimed = s.execute(
                    update(lease)
                    .where(lease.c.profile_id == profile)
                    .where(or_(lease.c.holder == holder, lease.c.expires_at <= at))
                    .values(holder=holder, acquired_at=at, expires_at=until)
                ).rowcount
                if not claimed:
                    try:
                        with s.begin_nested():
                            s.execute(insert(lease).values(
                                profile_id=profile, holder=holder, acquired_at=at, expires_at=until
                            ))
                        claimed = 1
                    except IntegrityError:  # someone holds it (or took it just now)
                        claimed = 0
                if claimed:
                    taken.append(profile)
        return taken

    def renew_leases(
        self, profiles: Sequence[str], holder: str, seconds: float, at: datetime | None = None
    ) -> list[str]:
        """Extend ``holder``'s leases among ``profiles``; never takes one it does not
        hold (a lease given back, or taken by another run after it expired). Returns
        the profiles renewed."""
        at = at or utcnow()
        lease = tables.Lease.__table__  # type: ignore[attr-defined]
        with writing(self.url) as s:
            renewed = s.execute(
                update(lease).where(lease.c.profile_id.in_(list(profiles)))
                .where(lease.c.holder == holder)
                .values(expires_at=at + timedelta(seconds=seconds))
                .returning(lease.c.profile_id)
            ).scalars().all()
        return sorted(renewed)

    def release_leases(self, profiles: Sequence[str], holder: str) -> None:
        with writing(self.url) as s:
            s.execute(
                delete(tables.Lease)
                .where(tables.Lease.profile_id.in_(list(profiles)))
                .where(tables.Lease.holder == holder)
            )

    def lease_holders(self) -> dict[str, str]:
        with reading(self.url) as s:
            return dict(s.execute(select(tables.Lease.profile_id, tables.Lease.holder)).all())

    # --- sessions ----------------------------------------------------------------------

    def end_session(
        self, profile: str, session_id: str | None = None, at: datetime | None = None
    ) -> int:
        """Count a finished session of the profile and tell Prefect (full consolidation
        follows, through the deployment triggers); returns the profile's session count."""
        self.resolve_profiles(profile)
        at = at or utcnow()
        keep_events = events.wanted()
        with writing(self.url) as s:
            row = s.get(Profile, profile)
            row.session_count += 1  # type: ignore[union-attr]
            count = row.session_count  # type: ignore[union-attr]
            if keep_events:
                outbox.add(s, events.session_events(
                    profile, session_id, count, at, self.settings.session_trigger_every
                ))
        if keep_events:
            outbox.deliver(self.url)
        return count

    # --- access tracking ---------------------------------------------------------------

    def record_access(self, memory_ids: Sequence[str], at: datetime | None = None) -> int:
        """Count one access of each memory at ``at``; memories accessed together have their
        association edges strengthened. Returns how many memories were found."""
        at = at or utcnow()
        wanted = sorted(set(memory_ids))
        if not wanted:
            return 0
        with writing(self.url) as s:
            found = list(s.execute(select(Memory).where(Memory.id.in_(wanted))).scalars())
            for m in found:
                m.access_count += 1
                if m.last_accessed_at is None or m.last_accessed_at < at:
                    m.last_accessed_at = at
            edges = s.execute(
                select(Edge)
                .where(Edge.kind == EdgeKind.ASSOCIATION)
                .where(Edge.source_id.in_(wanted))
                .where(Edge.target_id.in_(wanted))
            ).scalars()
            for e in edges:
                e.weight = e.base_weight = min(1.0, e.weight + CO_ACCESS_BONUS)
                e.last_strengthened_at = max(e.last_strengthened_at, at)
        return len(found)

    # --- writes for consolidation steps ------------------------------------------------

    def apply_summaries(
        self, profile: str, plans: Sequence[SummaryPlan], as_of: datetime, run_id: str | None
    ) -> list[str]:
        """Write each summary, move what it replaces to cold with ``superseded_by``, link
        the summary to its originals with provenance edges and audit the decision, with
        the prior state of everything it replaced (for undo). A plan already decided
        (its audit row exists: a retried step, or a merge an operator undid) is skipped.
        Returns the summaries written."""
        audit_ids = {
            plan.summary_id: ids.consolidation_id(profile, plan.operation, plan.summary_id)
            for plan in plans
        }
        with writing(self.url) as s:
            decided = {
                cid
                for batch in _chunks(audit_ids.values())
                for cid in s.execute(
                    select(_C.c.id).where(_C.c.id.in_(batch))
                ).scalars()
            }
            todo: list[SummaryPlan] = []
            for plan in plans:  # a plan decided before, or twice in this batch, is skipped
                if audit_ids[plan.summary_id] not in decided:
                    decided.add(audit_ids[plan.summary_id])
                    todo.append(plan)
            replaced_by = {
                mid: plan.summary_id for plan in todo
                for mid in (*plan.member_ids, *plan.absorbed_ids)
            }
            states = {
                r.id: [r.tier, r.lifecycle, r.superseded_by]
                for batch in _chunks(replaced_by)
                for r in s.execute(
                    select(_M.c.id, _M.c.tier, _M.c.lifecycle, _M.c.superseded_by)
                    .where(_M.c.profile_id == profile)
                    .where(_M.c.id.in_(batch))
                )
            }
            audits: list[dict[str, Any]] = []
            for plan in todo:
                replaced = [*plan.member_ids, *plan.absorbed_ids]
                absorbed = set(plan.absorbed_ids)
                if not all(
                    mid in states and _as_planned(mid, states[mid], absorbed) for mid in replaced
                ):
                    raise StoreError(
                        f"summary {plan.summary_id}: members changed since they were read"
                    )
                audits.append({
                    "id": audit_ids[plan.summary_id], "profile_id": profile, "run_id": run_id,
                    "operation": plan.operation, "summary_id": plan.summary_id,
                    "member_ids": list(plan.member_ids),
                    "parameters": {
                        **plan.parameters, "absorbed": list(plan.absorbed_ids),
                        "prior": {mid: states[mid] for mid in replaced},
                    },
                    "created_at": as_of,
                })
            if not todo:
                return []
            s.add_all([_summary_row(profile, plan) for plan in todo])
            s.flush()
            _put_vectors(s, {plan.summary_id: plan.embedding for plan in todo}, replace=False)
            _bulk_set(s, _M, ["tier", "lifecycle", "superseded_by"],
                      [(mid, Tier.COLD, tables.Lifecycle.ARCHIVED, by)
                       for mid, by in replaced_by.items()],
                      _M.c.profile_id == profile)
            _upsert_edges(s, profile, [
                NewEdge(plan.summary_id, member, tables.EdgeKind.CONSOLIDATION, plan.link_weight)
                for plan in todo for member in plan.member_ids
            ], as_of, as_of)
            s.execute(insert(tables.Consolidation), audits)
        return [plan.summary_id for plan in todo]

    def undo(self, ident: str, profile: str, at: datetime | None = None) -> UndoResult:
        """Undo one consolidation of ``profile``, by its id or its summary's id: everything
        it replaced returns to the state it was in, the summary and its edges are removed
        (the audit row keeps the summary's text), and the decision is marked undone, which
        also keeps later runs from making it again. Undoing twice changes nothing.

        The profile is required and checked: whoever holds an id of another profile's
        consolidation cannot undo it from here (and learns nothing: it is "not found")."""
        at = at or utcnow()
        of_profile = tables.Consolidation.profile_id == profile
        with writing(self.url) as s:
            audit = s.execute(
                select(tables.Consolidation).where(of_profile).where(
                    or_(tables.Consolidation.id == ident,
                        tables.Consolidation.summary_id == ident)
                ).order_by(tables.Consolidation.id)
            ).scalars().first()
            if audit is None:
                raise NotFoundError(f"no consolidation with id {ident!r} in profile {profile!r}")
            result = UndoResult(audit.id, audit.profile_id, audit.operation, audit.summary_id)
            if audit.undone_at is not None:
                result.already_undone = True
                return result
            if audit.operation not in UNDOABLE:
                raise StoreError(
                    f"a {audit.operation} cannot be undone: deleted memories are gone "
                    "(their tombstones remain)"
                )
            summary = s.get(Memory, audit.summary_id) if audit.summary_id else None
            if summary is not None and summary.superseded_by is not None:
                later = ids.consolidation_id(
                    audit.profile_id, _origin_of(s, summary.superseded_by), summary.superseded_by
                )
                raise StoreError(
                    f"{summary.id} has since been absorbed into {summary.superseded_by}: "
                    f"undo {later} first"
                )
            for mid, (tier, lifecycle, superseded_by) in audit.parameters.get("prior", {}).items():
                restored = s.execute(
                    update(_M).where(_M.c.profile_id == audit.profile_id).where(_M.c.id == mid)
                    .values(tier=tier, lifecycle=lifecycle, superseded_by=superseded_by)
                )
                if restored.rowcount:  # a memory expired since is a tombstone: not back
                    result.restored.append(mid)
            if summary is not None:
                s.execute(
                    delete(_E).where(_E.c.profile_id == audit.profile_id).where(
                        or_(_E.c.source_id == summary.id, _E.c.target_id == summary.id)
                    )
                )
                audit.parameters = {
                    **audit.parameters,
                    "undone_summary": {"content": summary.content, "kind": summary.kind},
                }
                s.execute(delete(_V).where(_V.c.memory_id == summary.id))
                s.delete(summary)
            audit.undone_at = at
        return result

    def consolidations(self, profile: str, limit: int = 50) -> list[tables.Consolidation]:
        """The profile's consolidation decisions, newest first."""
        with reading(self.url) as s:
            return list(
                s.execute(
                    select(tables.Consolidation)
                    .where(tables.Consolidation.profile_id == profile)
                    .order_by(tables.Consolidation.created_at.desc(), tables.Consolidation.id)
                    .limit(limit)
                ).scalars()
            )

    def undone_summaries(self, profile: str) -> set[str]:
        """Summaries an operator undid: consolidations never to be made again."""
        with reading(self.url) as s:
            return set(
                s.execute(
                    select(tables.Consolidation.summary_id)
                    .where(tables.Consolidation.profile_id == profile)
                    .where(tables.Consolidation.undone_at.is_not(None))
                ).scalars()
            )

    def undone_migrations(self, profile: str) -> set[str]:
        """Memories whose move to the cold tier an operator undid: never moved again."""
        with reading(self.url) as s:
            return {
                mid
                for members in s.execute(
                    select(_C.c.member_ids).where(_C.c.profile_id == profile)
                    .where(_C.c.operation == tables.COLD_MIGRATION)
                    .where(_C.c.undone_at.is_not(None))
                ).scalars()
                for mid in members or ()
            }

    def cold_since(self, profile: str) -> dict[str, datetime]:
        """When each memory last went to the cold tier (the as_of of the decision that
        moved it, undone ones aside), read from the audit; a memory never moved has none."""
        since: dict[str, datetime] = {}
        with reading(self.url) as s:
            rows = s.execute(
                select(_C.c.operation, _C.c.parameters, _C.c.created_at)
                .where(_C.c.profile_id == profile).where(_C.c.undone_at.is_(None))
                .where(_C.c.operation.in_(list(_TO_COLD)))
            )
            for operation, parameters, at in rows:
                for mid in _metadata(parameters).get(_TO_COLD[operation]) or ():
                    if mid not in since or since[mid] < at:
                        since[mid] = at
        return since

    def superseding_ids(self, profile: str) -> set[str]:
        """Memories that others are superseded by: they stand for originals in cold."""
        with reading(self.url) as s:
            return set(
                s.execute(
                    select(_M.c.superseded_by).distinct().where(_M.c.profile_id == profile)
                    .where(_M.c.superseded_by.is_not(None))
                ).scalars()
            )

    def forget(
        self,
        profile: str,
        archive: Sequence[str],
        delete_: Sequence[tuple[str, float | None, str]],
        as_of: datetime,
        run_id: str | None,
        parameters: dict[str, Any],
        blocks: Sequence[BlockPlan] = (),
        operation: str = "forget",
    ) -> list[str]:
        """Archive memories to cold, and delete others (row, edges and vector) leaving a
        tombstone with their content hash, score and reason; one audit row records both
        (as ``operation``: cold-tier expiry deletes this way too).
        ``blocks``, compiled without the forgotten memories, replace the Core Memory
        blocks in the same transaction, so no block keeps a deleted memory's text.
        Returns the block types whose content changed."""
        if not archive and not delete_:
            return []
        doomed = [mid for mid, _, _ in delete_]
        with writing(self.url) as s:
            for batch in _chunks(archive):
                s.execute(
                    update(_M).where(_M.c.profile_id == profile).where(_M.c.id.in_(batch))
                    .values(tier=Tier.COLD, lifecycle=tables.Lifecycle.ARCHIVED)
                )
            if delete_:
                known = {
                    r.id: r
                    for batch in _chunks(doomed)
                    for r in s.execute(
                        select(_M.c.id, _M.c.external_id, _M.c.content_hash)
                        .where(_M.c.profile_id == profile).where(_M.c.id.in_(batch))
                    )
                }
                for mid, score, reason in delete_:
                    row = known[mid]
                    s.add(Tombstone(
                        memory_id=mid, profile_id=profile, external_id=row.external_id,
                        content_hash=row.content_hash, reason=reason, score=score,
                        run_id=run_id, deleted_at=as_of,
                    ))
                for batch in _chunks(doomed):
                    for end in (_E.c.source_id, _E.c.target_id):
                        s.execute(
                            delete(_E).where(_E.c.profile_id == profile).where(end.in_(batch))
                        )
                    s.execute(delete(_V).where(_V.c.memory_id.in_(batch)))
                    s.execute(
                        delete(_M).where(_M.c.profile_id == profile).where(_M.c.id.in_(batch))
                    )
            s.add(tables.Consolidation(
                id=ids.consolidation_id(profile, operation, as_of.isoformat()),
                profile_id=profile, run_id=run_id, operation=operation,
                member_ids=sorted([*archive, *doomed]),
                parameters={**parameters, "archived": sorted(archive), "deleted": sorted(doomed)},
                created_at=as_of,
            ))
            return _upsert_blocks(s, profile, blocks, as_of)

    def migrate_to_cold(
        self,
        profile: str,
        memory_ids: Sequence[str],
        as_of: datetime,
        run_id: str | None,
        parameters: dict[str, Any],
        blocks: Sequence[BlockPlan] = (),
    ) -> list[str]:
        """Move live hot memories to the cold tier (archived, kept), auditing each one's
        prior state so that ``undo`` brings them back; ``blocks``, compiled without them,
        replace the Core Memory blocks in the same transaction (as forget's archiving
        does). The same move decided again (a retried step) is skipped. Returns the
        block types whose content changed."""
        if not memory_ids:
            return []
        wanted = sorted(memory_ids)
        audit_id = ids.consolidation_id(
            profile, tables.COLD_MIGRATION, f"{as_of.isoformat()}|{','.join(wanted)}")
        with writing(self.url) as s:
            if s.get(tables.Consolidation, audit_id) is not None:
                return []
            prior = {
                r.id: [r.tier, r.lifecycle, r.superseded_by]
                for batch in _chunks(wanted)
                for r in s.execute(
                    select(_M.c.id, _M.c.tier, _M.c.lifecycle, _M.c.superseded_by)
                    .where(_M.c.profile_id == profile).where(_M.c.id.in_(batch))
                )
            }
            if len(prior) != len(wanted) or any(t != Tier.HOT for t, _, _ in prior.values()):
                raise StoreError("cold migration: memories changed since they were read")
            for batch in _chunks(wanted):
                s.execute(
                    update(_M).where(_M.c.profile_id == profile).where(_M.c.id.in_(batch))
                    .values(tier=Tier.COLD, lifecycle=tables.Lifecycle.ARCHIVED)
                )
            s.add(tables.Consolidation(
                id=audit_id, profile_id=profile, run_id=run_id,
                operation=tables.COLD_MIGRATION, member_ids=wanted,
                parameters={**parameters, "prior": prior}, created_at=as_of,
            ))
            return _upsert_blocks(s, profile, blocks, as_of)

    def meta_memories(self, profile: str) -> dict[str, set[str]]:
        """Each meta-memory of the profile, with the members it summarizes."""
        with reading(self.url) as s:
            metas = s.execute(
                select(_M.c.id).where(_M.c.profile_id == profile)
                .where(_M.c.origin == tables.Origin.META_MEMORY)
            ).scalars().all()
            out: dict[str, set[str]] = {mid: set() for mid in metas}
            for source, target in s.execute(
                select(_E.c.source_id, _E.c.target_id)
                .where(_E.c.profile_id == profile)
                .where(_E.c.kind == tables.EdgeKind.SUMMARIZES)
            ):
                if source in out:
                    out[source].add(target)
        return out

    def apply_meta_memories(
        self, profile: str, plans: Sequence[MetaPlan], as_of: datetime, run_id: str | None
    ) -> list[str]:
        """Create or update each meta-memory, its ``summarizes`` edges and its audit row.
        A plan identical to what is stored writes nothing. Returns the ids changed."""
        if not plans:
            return []
        meta_ids = [plan.meta_id for plan in plans]
        audit_ids = {mid: ids.consolidation_id(profile, "cluster", mid) for mid in meta_ids}
        with writing(self.url) as s:
            rows = {
                row.id: row
                for batch in _chunks(meta_ids)
                for row in s.execute(select(Memory).where(Memory.id.in_(batch))).scalars()
            }
            members: dict[str, set[str]] = defaultdict(set)
            for batch in _chunks(meta_ids):
                for source, target in s.execute(
                    select(_E.c.source_id, _E.c.target_id).where(_E.c.profile_id == profile)
                    .where(_E.c.kind == tables.EdgeKind.SUMMARIZES).where(_E.c.source_id.in_(batch))
                ):
                    members[source].add(target)
            stored = _stored_vectors(s, meta_ids)
            revectored: dict[str, bytes | None] = {}
            audits = {
                audit.id: audit
                for batch in _chunks(audit_ids.values())
                for audit in s.execute(
                    select(tables.Consolidation).where(tables.Consolidation.id.in_(batch))
                ).scalars()
            }
            changed: list[str] = []
            new_edges: list[NewEdge] = []
            for plan in plans:
                row = rows.get(plan.meta_id)
                had = members[plan.meta_id]
                fields = {
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
                for batch in _chunks(gone):
                    s.execute(
                        delete(_E).where(_E.c.profile_id == profile)
                        .where(_E.c.kind == tables.EdgeKind.SUMMARIZES)
                        .where(_E.c.source_id == plan.meta_id)
                        .where(_E.c.target_id.in_(batch))
                    )
                new_edges += [
                    NewEdge(plan.meta_id, member, tables.EdgeKind.SUMMARIZES, 1.0)
                    for member in sorted(set(plan.member_ids) - had)
                ]
                audit = audits.get(audit_ids[plan.meta_id])
                if audit is None:
                    s.add(tables.Consolidation(
                        id=audit_ids[plan.meta_id], profile_id=profile, run_id=run_id,
                        operation="cluster", summary_id=plan.meta_id,
                        member_ids=list(plan.member_ids), parameters=plan.parameters,
                        created_at=as_of,
                    ))
                else:
                    audit.member_ids = list(plan.member_ids)
                    audit.parameters = plan.parameters
                    audit.run_id = run_id
                changed.append(plan.meta_id)
            s.flush()
            _put_vectors(s, revectored)
            _upsert_edges(s, profile, new_edges, as_of, as_of)
        return changed

    def upsert_blocks(self, profile: str, plans: Sequence[BlockPlan], as_of: datetime) -> list[str]:
        """INSERT-or-REPLACE each block; the version moves only when the content does.
        Returns the block types whose content changed."""
        with writing(self.url) as s:
            return _upsert_blocks(s, profile, plans, as_of)

    def set_lifecycles(self, profile: str, changes: Sequence[tuple[str, str]]) -> None:
        self._set_column(profile, "lifecycle", changes)

    def set_statuses(self, profile: str, changes: Sequence[tuple[str, str]]) -> None:
        self._set_column(profile, "status", changes)

    def _set_column(self, profile: str, column: str, values: Sequence[tuple[str, Any]]) -> None:
        """Set one column of many memories of a profile."""
        if not values:
            return
        with writing(self.url) as s:
            _bulk_set(s, _M, [column], values, _M.c.profile_id == profile)

    def update_edge_weights(
        self, profile: str, weights: Sequence[tuple[str, float]], prune: Sequence[str]
    ) -> None:
        """Set decayed weights and delete pruned edges; only association edges are touched."""
        if not weights and not prune:
            return
        with writing(self.url) as s:
            _bulk_set(s, _E, ["weight"], weights,
                      _E.c.profile_id == profile, _E.c.kind == EdgeKind.ASSOCIATION)
            for batch in _chunks(prune):
                s.execute(
                    delete(_E)
                    .where(_E.c.profile_id == profile)
                    .where(_E.c.kind == EdgeKind.ASSOCIATION)
                    .where(_E.c.id.in_(batch))
                )

    def set_graph_scores(self, profile: str, scores: Sequence[GraphScore]) -> list[str]:
        """Store PageRank and community per hot memory; memories outside the graph lose
        theirs. Writes only what differs; returns the ids whose scores changed."""
        wanted = {sc.memory_id: (sc.pagerank, sc.community) for sc in scores}
        with writing(self.url) as s:
            current = {
                mid: (pr, cm)
                for mid, pr, cm in s.execute(
                    select(_M.c.id, _M.c.pagerank, _M.c.community)
                    .where(_M.c.profile_id == profile)
                )
            }
            stale = [mid for mid, v in current.items() if mid not in wanted and v != (None, None)]
            changed = {mid: v for mid, v in wanted.items() if current.get(mid) != v}
            for batch in _chunks(stale):
                s.execute(
                    update(_M).where(_M.c.id.in_(batch)).values(pagerank=None, community=None)
                )
            _bulk_set(s, _M, ["pagerank", "community"],
                      [(mid, pr, cm) for mid, (pr, cm) in changed.items()],
                      _M.c.profile_id == profile)
        return sorted([*stale, *changed])

    def add_edges(
        self,
        profile: str,
        edges: Sequence[NewEdge],
        as_of: datetime,
        linked_summaries: Sequence[str] = (),
    ) -> None:
        """Add edges (an existing edge keeps the larger weight); mark summaries linked."""
        with writing(self.url) as s:
            _upsert_edges(s, profile, edges, as_of, as_of)
            for batch in _chunks(linked_summaries):
                s.execute(
                    update(_M)
                    .where(_M.c.profile_id == profile)
                    .where(_M.c.id.in_(batch))
                    .values(linked_at=as_of)
                )

    def linked_pairs(self, profile: str, memory_ids: Sequence[str]) -> set[frozenset[str]]:
        """Pairs among ``memory_ids`` already joined by an edge of any kind, either way."""
        wanted = list(memory_ids)
        with reading(self.url) as s:
            rows = s.execute(
                select(_E.c.source_id, _E.c.target_id)
                .where(_E.c.profile_id == profile)
                .where(_E.c.source_id.in_(wanted))
                .where(_E.c.target_id.in_(wanted))
            ).all()
        return {frozenset(r) for r in rows}



def _upsert_blocks(
    s: Session, profile: str, plans: Sequence[BlockPlan], as_of: datetime
) -> list[str]:
    changed: list[str] = []
    current = {
        b.block_type: b
        for b in s.execute(select(CoreBlock).where(CoreBlock.profile_id == profile)).scalars()
    }
    for plan in plans:
        block = current.get(plan.block_type)
        if block is None:
            s.add(
                CoreBlock(
                    profile_id=profile, block_type=plan.block_type, content=plan.content,
                    source_ids=list(plan.source_ids), mode=plan.mode, compiled_at=as_of,
                )
            )
            changed.append(plan.block_type)
        elif (block.content, tuple(block.source_ids), block.mode) != (
            plan.content, plan.source_ids, plan.mode
        ):
            if block.content != plan.content:
                block.version += 1
                changed.append(plan.block_type)
            block.content = plan.content
            block.source_ids = list(plan.source_ids)
            block.mode = plan.mode
            block.compiled_at = as_of
    return changed


def _upsert_edges(
    s: Session, profile: str, edges: Sequence[NewEdge], strengthened_at: datetime,
    created_at: datetime,
) -> None:
    _upsert_timed_edges(s, profile, [(e, strengthened_at, created_at) for e in edges])


def _upsert_timed_edges(
    s: Session, profile: str, edges: Sequence[tuple[NewEdge, datetime, datetime]]
) -> None:
    """Add edges in bulk, each with the time it was last strengthened and created.
    An edge that exists already (or comes twice) keeps the larger weight, and is
    strengthened at the later time when a larger weight arrives."""
    wanted: dict[str, dict[str, Any]] = {}
    for edge, strengthened_at, created_at in edges:
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
                "confidence": edge.confidence, "created_at": created_at, "meta": edge.meta,
            }
        elif edge.weight > row["weight"]:
            row["weight"] = row["base_weight"] = edge.weight
            row["last_strengthened_at"] = max(row["last_strengthened_at"], strengthened_at)
    if not wanted:
        return
    stored = {
        r.id: r
        for batch in _chunks(wanted)
        for r in s.execute(
            select(_E.c.id, _E.c.weight, _E.c.last_strengthened_at).where(_E.c.id.in_(batch))
        )
    }
    fresh = [row for eid, row in wanted.items() if eid not in stored]
    stronger = [
        {"eid": eid, "w": row["weight"],
         "at": max(stored[eid].last_strengthened_at, row["last_strengthened_at"])}
        for eid, row in wanted.items()
        if eid in stored and row["weight"] > stored[eid].weight
    ]
    if fresh:
        s.execute(insert(Edge), fresh)
    if stronger:
        s.execute(
            update(_E).where(_E.c.id == bindparam("eid"))
            .values(weight=bindparam("w"), base_weight=bindparam("w"),
                    last_strengthened_at=bindparam("at")),
            stronger,
        )


# Rows per bulk update statement: bounds the size of the one parameter that carries them.
BULK_SET_CHUNK = 50_000


def _bulk_set(
    s: Session, table: Table, columns: Sequence[str], rows: Sequence[Sequence[Any]],
    *where: ColumnElement[bool],
) -> None:
    """Set ``columns`` of many rows of ``table``: each of ``rows`` is an id followed by
    the new values, in the order of ``columns``; ``where`` narrows the rows matched.

    One statement per chunk: the rows travel as one bound parameter (a JSON array on
    SQLite, an array per column on PostgreSQL), so neither the driver nor SQLAlchemy
    handles 100k statements. Values must be JSON scalars (no datetimes)."""
    if not rows:
        return
    postgres = s.get_bind().dialect.name == "postgresql"
    keys = ["id", *columns]
    for start in range(0, len(rows), BULK_SET_CHUNK):
        chunk = rows[start:start + BULK_SET_CHUNK]
        if postgres:
            arrays = [
                bindparam(f"a{k}", [r[k] for r in chunk],
                          type_=ARRAY(table.c[name].type if k else table.c.id.type))
                for k, name in enumerate(keys)
            ]
            given = func.unnest(*arrays).table_valued(*keys).render_derived()
        else:
            data = bindparam("rows", json.dumps(list(chunk), allow_nan=False), type_=Text)
            each = func.json_each(data).table_valued("value")
            # Materialized, so that SQLite walks the given rows and looks each one up
            # by id; inlined, it may scan all given rows for every row of the profile.
            given = select(*(
                func.json_extract(each.c.value, f"$[{k}]").label(name)
                for k, name in enumerate(keys)
            )).cte("given").prefix_with("MATERIALIZED")
        s.execute(
            update(table).where(table.c.id == given.c.id, *where)
            .values({name: given.c[name] for name in columns})
        )


def _stored_vectors(s: Session, memory_ids: Sequence[str]) -> dict[str, bytes]:
    """The vectors the store holds for ``memory_ids`` (those that have one)."""
    return {
        mid: blob
        for batch in _chunks(memory_ids)
        for mid, blob in s.execute(
            select(_V.c.memory_id, _V.c.embedding).where(_V.c.memory_id.in_(batch))
        )
    }


def _put_vectors(s: Session, vectors: dict[str, bytes | None], replace: bool = True) -> None:
    """Give memories these vectors (``None``: none). ``replace=False`` is for memories
    written in this transaction, which cannot have one yet."""
    if replace:
        for batch in _chunks(vectors):
            s.execute(delete(_V).where(_V.c.memory_id.in_(batch)))
    rows = [{"memory_id": mid, "embedding": blob} for mid, blob in vectors.items() if blob]
    if rows:
        s.execute(insert(_V), rows)


def _memory_defaults() -> dict[str, Any]:
    """Every column of a memory row with its default, for inserts without the ORM.

    A bulk insert compiles its statement from the first row's keys, so every row must
    carry every column: a key missing from the first row would be dropped from all.
    """
    m = Memory(id="", profile_id="", content="", content_hash="", created_at=datetime.min)
    return {
        column.name: (m.meta if column.name == "metadata" else getattr(m, column.name))
        for column in _M.columns
    }


def _origin_of(s: Session, memory_id: str) -> str:
    memory = s.get(Memory, memory_id)
    return memory.origin if memory is not None else ""


def _as_planned(memory_id: str, prior: list[Any], absorbed: set[str]) -> bool:
    """Still as a summary plan read it: hot and live (a member, or a summary it absorbs),
    or an original of a summary it absorbs."""
    tier, _, superseded_by = prior
    if superseded_by is None:
        return tier == Tier.HOT
    return memory_id not in absorbed and superseded_by in absorbed


def _summary_row(profile: str, plan: SummaryPlan) -> Memory:
    return Memory(
        id=plan.summary_id, profile_id=profile, content=plan.content,
        content_hash=ids.content_hash(plan.content), kind=plan.kind, entity=plan.entity,
        layer=plan.layer, importance=plan.importance, confidence=plan.confidence,
        stability=plan.stability, access_count=plan.access_count, created_at=plan.created_at,
        last_accessed_at=plan.last_accessed_at, valid_from=plan.valid_from,
        valid_until=plan.valid_until, session_id=plan.session_id, origin=plan.operation,
        protected=plan.protected, embedding_model=plan.embedding_model, meta=plan.meta,
    )


def _no_progress(_: int) -> None:
    pass


def _group_by(items: Iterable[Any], key: Any) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = defaultdict(list)
    for item in items:
        out[key(item)].append(item)
    return out


def _lookup(resolved: dict[str, str], ref: str, where: str, field_name: str) -> str:
    try:
        return resolved[ref]
    except KeyError:
        raise RecordError(where, field_name, f"no memory {ref!r} in this profile") from None
