"""Ingest: validated records (``models.validation``) into the store, in chunks.

Each chunk of memories is embedded (by the caller's embedder; a vector already stored
for the same content and model is reused) and written in one transaction, with the
events it causes queued in the outbox of that transaction. Nothing is sent from here:
the caller delivers the queued events once the ingest returns (``report.queued_events``),
one send per ingest, since an API that is down would cost every chunk a deadline.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from sqlalchemy import insert, or_, select
from sqlalchemy.exc import DataError, DBAPIError, StatementError
from sqlmodel import Session

from reverie.models import events, ids, outbox
from reverie.models.errors import ConflictError, InvalidValueError, RecordError
from reverie.models.records import NewEdge
from reverie.models.repositories.blocks import requote
from reverie.models.repositories.bulk import chunks
from reverie.models.repositories.edges import upsert_timed_edges
from reverie.models.repositories.memories import (
    WITH_VECTOR,
    M,
    V,
    memory_defaults,
    put_vectors,
    stored_vectors,
)
from reverie.models.repositories.profiles import (
    count_stored,
    ensure_profiles,
    ensure_profiles_each,
    lock_profiles,
    next_ingest_seqs,
    take_ingest_seqs,
)
from reverie.models.repositories.summaries import release
from reverie.models.store import ProfileTx, Store
from reverie.models.tables import Memory
from reverie.models.timestamps import utcnow
from reverie.models.validation import EdgeIn, MemoryIn, parse_record, read_jsonl
from reverie.models.vectors import DIMENSION, to_blob

SUPPLIED_EMBEDDING = "supplied"  # embedding_model of vectors given by the caller
# Memories per transaction, and per call of the model. A call's batches hold texts of
# one token count, so a larger call fills them: 1,024 texts made a fifth more batches
# than 4,096, part-filled, and each call ends with its last batch on one core while the
# other waits. Ingest of 4,096 texts ran at 92.6% of the model's rate against 88.3%
# (medians of 18 interleaved pairs; docs/benchmarks-history.md, twentieth session).
INGEST_CHUNK = 4096
# An ingest's ``progress``: False; True for the embedding's own bar; or a callable told
# how many records (lines) were dealt with as the ingest goes, for a caller's bar that
# moves while the model embeds. Counts only, never content.
IngestProgress = bool | Callable[[int], None]


class Embedder(Protocol):
    """What ingest needs of an embedding model (``engines.embedding.Embedder``)."""

    name: str

    def encode(
        self, texts: list[str], progress: bool | Callable[[int], None] = False
    ) -> np.ndarray: ...


@dataclass
class IngestReport:
    stored: int = 0
    updated: int = 0
    unchanged: int = 0
    edges: int = 0
    errors: list[RecordError] = field(default_factory=list)
    stored_ids: list[str] = field(default_factory=list)
    # The id of every memory record accepted (stored, updated or unchanged), each once,
    # in the order first given.
    memory_ids: list[str] = field(default_factory=list)
    # Events this ingest queued in the outbox: the caller delivers them.
    queued_events: int = 0
    # Whether this ingest created the store (there was none at its URL).
    created: bool = False
    # The consolidations that held a memory this ingest gave new content, undone
    # (``summaries.release``), by the ids they had.
    released: list[str] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        return self.stored + self.updated + self.unchanged


def ingest(
    store: Store,
    records: Iterable[dict[str, Any]],
    embedder: Embedder,
    profile: str | None = None,
    at: datetime | None = None,
    progress: IngestProgress = False,
    queue_events: bool = False,
    create: bool = True,
) -> IngestReport:
    """Validate and store memory (and edge) records given as dicts. With
    ``queue_events``, the events the ingest causes wait in the outbox for the caller.
    With ``create`` (an ingest's default) a store missing at the URL is created when
    the first record is written (``IngestReport.created`` says so): an ingest that
    writes nothing (no record, every record refused) leaves none behind. Without, a
    missing store is an error naming the URL."""
    return _Ingest(store, embedder, at or utcnow(), progress, queue_events, create).run(
        ((f"record {n}", r) for n, r in enumerate(records, start=1)), profile
    )


def ingest_jsonl(
    store: Store,
    path: Path | str,
    embedder: Embedder,
    profile: str | None = None,
    at: datetime | None = None,
    progress: IngestProgress = False,
    queue_events: bool = False,
    create: bool = True,
) -> IngestReport:
    """Store every valid line of a JSONL file; bad lines are reported, not stored.
    ``create``: as for ``ingest``."""
    return _Ingest(store, embedder, at or utcnow(), progress, queue_events, create).run(
        read_jsonl(Path(path)), profile
    )


class _Ingest:
    """One ingest: its settings, and the report it fills in as chunks are written."""

    def __init__(
        self, store: Store, embedder: Embedder, at: datetime, progress: IngestProgress,
        queue_events: bool, create: bool,
    ) -> None:
        self.store = store
        self.create = create
        self.embedder = embedder
        self.at = at
        self.progress = progress
        self.queue_events = queue_events
        self.report = IngestReport()
        # (profile, id) -> (the id as first spelled, where), for the ids that can be
        # spelled more than one way only (see _another_spelling).
        self.spellings: dict[tuple[str, str], tuple[str, str]] = {}
        self.listed: set[str] = set()  # the ids in report.memory_ids

    def parsed(self, items: Iterable[tuple[str, object]], profile: str | None
               ) -> Iterator[MemoryIn | EdgeIn]:
        """The valid records of ``items``; the refused go to the report."""
        report = self.report
        # Lines refused or holding edges count as dealt with when read (edges are written
        # at the end, quickly); memories as their chunk is embedded and written.
        dealt_with = self.progress if callable(self.progress) else _no_progress
        for where, obj in items:
            if isinstance(obj, RecordError):
                report.errors.append(obj)
                dealt_with(1)
                continue
            try:
                record = parse_record(
                    obj, where, profile, self.store.settings.max_content_chars, DIMENSION
                )
            except RecordError as exc:
                report.errors.append(exc)
                dealt_with(1)
                continue
            if isinstance(record, EdgeIn):
                dealt_with(1)
                yield record
                continue
            clash = self._another_spelling(record, obj)
            if clash is not None:
                report.errors.append(clash)
                dealt_with(1)
                continue
            yield record

    def run(self, items: Iterable[tuple[str, object]], profile: str | None) -> IngestReport:
        report = self.report
        chunk: list[MemoryIn] = []
        edges: list[EdgeIn] = []
        for record in self.parsed(items, profile):
            if isinstance(record, EdgeIn):
                edges.append(record)
                continue
            chunk.append(record)
            if len(chunk) >= INGEST_CHUNK:
                self._write_memories(chunk)
                chunk = []
        if chunk:
            self._write_memories(chunk)
        if edges:
            self._write_edges(edges)
        return report

    def _another_spelling(self, record: MemoryIn, obj: object) -> RecordError | None:
        """The error of a record whose id is an id of an earlier record of this ingest
        spelled in another Unicode form ("café" composed, then "cafe" + a combining
        accent), else None. Both are one id (ids are compared in NFC), so the later
        record would silently update the earlier one: two spellings in one file are
        more likely two memories than one, so the later one is refused and the first
        spelling stands. (An id already stored is updated by either spelling, as any
        lookup finds it by either.)"""
        ext = record.external_id
        if ext is None or _one_spelling(ext):
            return None
        spelling = str(obj["id"]).strip()  # type: ignore[index]  # the record: a dict with an id
        first, where = self.spellings.setdefault((record.profile, ext), (spelling, record.where))
        if spelling == first:
            return None
        return RecordError(
            record.where, "id",
            f"{ascii(spelling)} is the id {ascii(first)} of {where} in another Unicode "
            "form: both would name one memory; spell the id one way to update it, or "
            "give this record its own id",
        )

    def _store_ready(self) -> None:
        """Before the first write: the store is created if asked and missing."""
        if self.create:
            self.report.created = self.store.create()
            self.create = False

    def _write_memories(self, records: list[MemoryIn]) -> None:
        self._store_ready()
        progress, report = self.progress, self.report
        embedded = 0

        def embedding(n: int) -> None:
            nonlocal embedded
            embedded += n
            progress(n)  # type: ignore[operator]  # given only when callable (below)

        rows = self._rows(records)
        with self.store.reading_all() as s:
            existing = _existing(s, rows)
        # A caller's bar moves batch by batch while the model embeds (most of the time).
        vectors = self._embeddings_for(rows, existing, embedding if callable(progress)
                                       else progress)
        new_rows, changed = _planned(rows, existing, vectors)
        try:
            self._commit_memories(rows, new_rows, changed, vectors)
        except InvalidValueError as exc:
            if _refused_value(exc.__cause__) is None:
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
                    self._commit_memories(rows, alone_new, alone_changed, vectors)
                except InvalidValueError as one:
                    reason = _refused_value(one.__cause__)
                    if reason is None:
                        raise
                    report.errors.append(
                        RecordError(row["where"], None, f"could not be stored: {reason}")
                    )
        if callable(progress) and len(records) > embedded:
            # Each text embedded stood for at least one record: the rest are done now.
            progress(len(records) - embedded)

    def _rows(self, records: list[MemoryIn]) -> dict[str, dict[str, Any]]:
        """The rows ``records`` make, by memory id (the same memory twice: the later
        wins, on top of the earlier)."""
        at = self.at
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

        return rows

    def _commit_memories(
        self,
        rows: dict[str, dict[str, Any]],
        new_rows: list[dict[str, Any]],
        changed: list[tuple[str, dict[str, Any]]],
        vectors: dict[str, tuple[bytes, str]],
    ) -> None:
        """Insert ``new_rows`` and apply ``changed`` in one transaction; the report and
        the store's events are queued in that transaction."""
        with self.store.writing_all() as s:
            done = self._commit_in(s, rows, new_rows, changed, vectors)
        self._count(rows, new_rows, changed, *done)

    def _count(self, rows: dict[str, dict[str, Any]], new_rows: list[dict[str, Any]],
               changed: list[tuple[str, Any]], updated: int, unchanged: int, queued: int,
               released: list[str]) -> None:
        report = self.report
        report.released += released
        written = {r["id"] for r in new_rows} | {mid for mid, _ in changed}
        for mid in rows:  # the order the records gave them
            if mid in written and mid not in self.listed:
                self.listed.add(mid)
                report.memory_ids.append(mid)
        report.updated += updated
        report.unchanged += unchanged
        report.stored += len(new_rows)
        report.stored_ids.extend(r["id"] for r in new_rows)
        report.queued_events += queued

    def _commit_in(
        self,
        s: Session,
        rows: dict[str, dict[str, Any]],
        new_rows: list[dict[str, Any]],
        changed: list[tuple[str, dict[str, Any]]],
        vectors: dict[str, tuple[bytes, str]],
    ) -> tuple[int, int, int, list[str]]:
        """``_commit_memories`` inside the caller's transaction ``s``: (updated,
        unchanged, events queued, consolidations released)."""
        at = self.at
        profiles = _touched(rows, new_rows, changed)
        ensure_profiles(s, profiles, at)
        # What this ingest writes is stamped, so that a run that took the profile
        # before it leaves these rows alone (models.store.ProfileTx.horizon).
        seqs = next_ingest_seqs(s, profiles)
        updated, unchanged, released = _write_rows(s, new_rows, changed, vectors, seqs, at)
        counts = _new_per_profile(new_rows)
        before_counts = count_stored(s, counts)
        queued = outbox.add(s, self._stored_events(counts, before_counts))
        return updated, unchanged, queued, released

    def _stored_events(self, counts: dict[str, int], before: Mapping[str, int]
                       ) -> list[events.ProfileEvent]:
        """The store-trigger events of ``counts`` new memories per profile, from the
        store counts ``before`` (none unless events are queued)."""
        if not self.queue_events:
            return []
        every = self.store.settings.store_trigger_every
        return [e for name, n in sorted(counts.items())
                for e in events.stored_events(name, before[name], before[name] + n,
                                              self.at, every)]

    def _embeddings_for(
        self, rows: dict[str, dict[str, Any]], existing: dict[str, Any], progress: IngestProgress
    ) -> dict[str, tuple[bytes, str]]:
        """Vectors for new or changed content; cached by content hash in the store."""
        out, todo, texts = _vector_todo(rows, existing)
        if not todo:
            return out
        with self.store.reading_all() as s:
            cached = _cached_vectors(s, self.embedder.name, todo)
        missing = [sha for sha in todo if sha not in cached]
        if missing:
            matrix = self.embedder.encode([texts[sha] for sha in missing], progress=progress)
            for sha, vector in zip(missing, matrix, strict=True):
                cached[sha] = to_blob(vector)
        return _with_vectors(out, todo, cached, self.embedder.name)

    def _write_edges(self, edges: list[EdgeIn]) -> None:
        self._store_ready()
        by_profile: dict[str, list[EdgeIn]] = defaultdict(list)
        for e in edges:
            by_profile[e.profile].append(e)
        for profile, group in by_profile.items():
            refs = {e.source for e in group} | {e.target for e in group}
            resolved = self._resolve_refs(profile, refs)
            good: list[tuple[EdgeIn, str, str]] = []
            for e in group:
                try:
                    source = _lookup(resolved, e.source, e.where, "source")
                    target = _lookup(resolved, e.target, e.where, "target")
                except RecordError as exc:
                    self.report.errors.append(exc)
                    continue
                good.append((e, source, target))
            timed: list[tuple[NewEdge, datetime, datetime]] = []
            for e, source, target in good:
                when = e.values.get("last_strengthened_at", self.at)
                edge = NewEdge(source, target, e.kind, e.weight, e.values.get("subkind"),
                               e.values.get("confidence"), e.values.get("meta", {}))
                timed.append((edge, when, e.values.get("created_at", when)))
            with self.store.writing(profile) as tx:
                upsert_timed_edges(tx.session, tx.profile, timed)
            self.report.edges += len(timed)

    def _resolve_refs(self, profile: str, refs: set[str]) -> dict[str, str]:
        """Map external ids and Reverie ids of one profile to Reverie ids."""
        with self.store.reading(profile) as tx:
            rows = [
                row
                for batch in chunks(sorted(refs))
                for row in tx.session.execute(
                    select(M.c.id, M.c.external_id).where(M.c.profile_id == profile).where(
                        or_(M.c.id.in_(batch), M.c.external_id.in_(batch))
                    )
                )
            ]
        out: dict[str, str] = {}
        for mid, ext in rows:
            out[mid] = mid
            if ext is not None:
                out[ext] = mid
        return out


def _touched(rows: dict[str, dict[str, Any]], new_rows: list[dict[str, Any]],
             changed: list[tuple[str, dict[str, Any]]]) -> set[str]:
    """The profiles a chunk writes to."""
    return {r["profile_id"] for r in new_rows} | {rows[mid]["profile"] for mid, _ in changed}


def _new_per_profile(new_rows: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for r in new_rows:
        counts[r["profile_id"]] += 1
    return counts


def _write_rows(
    s: Session,
    new_rows: list[dict[str, Any]],
    changed: list[tuple[str, dict[str, Any]]],
    vectors: dict[str, tuple[bytes, str]],
    seqs: Mapping[str, int],
    at: datetime,
) -> tuple[int, int, list[str]]:
    """Insert ``new_rows`` and apply ``changed``, stamped with their profile's ingest
    number in ``seqs``: (updated, unchanged, the consolidations released). A memory
    given new content is released from what held it (``summaries.release``): a summary
    would go on saying its old words, cold in its place, to every reader. Core Memory
    blocks are told what changed too (``blocks.requote``)."""
    updated = unchanged = 0
    rewritten: dict[str, dict[str, str]] = defaultdict(dict)  # profile -> id -> content
    patched: set[str] = set()  # profiles with a memory changed
    for r in new_rows:
        r["ingest_seq"] = seqs[r["profile_id"]]
    _insert_new(s, new_rows, vectors)
    stored = stored_vectors(s, [mid for mid, _ in changed if mid in vectors])
    revectored: dict[str, bytes | None] = {}
    for mid, patch in changed:
        current = s.get(Memory, mid)
        if current is None:  # deleted between read and write: store it afresh
            raise ConflictError(f"memory {mid} vanished during ingest; retry")
        before = stored.get(mid)
        blob = vectors[mid][0] if mid in vectors else before
        if blob == before and all(getattr(current, k) == v for k, v in patch.items()):
            unchanged += 1
            continue
        if patch.get("content_hash", current.content_hash) != current.content_hash:
            rewritten[current.profile_id][mid] = current.content
        for key, value in patch.items():
            setattr(current, key, value)
        patched.add(current.profile_id)
        current.ingest_seq = seqs[current.profile_id]
        if blob != before:
            revectored[mid] = blob
        updated += 1
    put_vectors(s, revectored)
    released: list[str] = []
    if patched:
        s.flush()  # the undos read and write the same rows without the ORM
        for profile in sorted(patched):
            tx = ProfileTx(s, profile)
            if rewritten[profile]:
                released += release(tx, rewritten[profile], at, seqs[profile])
            requote(tx, rewritten[profile], at)
    return updated, unchanged, released


def _insert_new(s: Session, new_rows: list[dict[str, Any]],
                vectors: dict[str, tuple[bytes, str]]) -> None:
    """``new_rows`` (stamped already) and their vectors, one insert per table."""
    if new_rows:
        s.execute(insert(M), new_rows)
        put_vectors(s, {r["id"]: vectors[r["id"]][0] for r in new_rows}, replace=False)


def _existing(s: Session, rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The stored memories among ``rows``' ids: id, profile, content hash, vector id."""
    return {
        r.id: r
        for r in s.execute(
            select(M.c.id, M.c.profile_id, M.c.content_hash,
                   V.c.memory_id.label("vector_id"))
            .select_from(M.outerjoin(V, V.c.memory_id == M.c.id))
            .where(M.c.id.in_(list(rows)))
        )
    }


def _planned(
    rows: dict[str, dict[str, Any]], existing: dict[str, Any],
    vectors: dict[str, tuple[bytes, str]], defaults: dict[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
    """The rows to insert, and the patches of the memories stored already."""
    new_rows: list[dict[str, Any]] = []
    changed: list[tuple[str, dict[str, Any]]] = []
    # Once per chunk (per group of store calls, given): building the defaults
    # constructs a model object, and per row that was over 40% of ingesting 100k
    # memories with their vectors.
    defaults = memory_defaults() if defaults is None else defaults
    for mid, row in rows.items():
        values = row["values"]
        old = existing.get(mid)
        if old is None:
            new_rows.append(
                {
                    **defaults,
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
    return new_rows, changed


def _vector_todo(
    rows: dict[str, dict[str, Any]], existing: dict[str, Any]
) -> tuple[dict[str, tuple[bytes, str]], dict[str, list[str]], dict[str, str]]:
    """The vectors given with the records; the memories needing one, by content hash;
    and the text of each hash."""
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
    return out, todo, texts


def _cached_vectors(s: Session, model_name: str, shas: Iterable[str]) -> dict[str, bytes]:
    """The stored vectors of ``model_name`` for these content hashes."""
    return dict(
        s.execute(
            select(M.c.content_hash, V.c.embedding).select_from(WITH_VECTOR)
            .where(M.c.content_hash.in_(list(shas)))
            .where(M.c.embedding_model == model_name)
        ).tuples().all()
    )


def _with_vectors(
    out: dict[str, tuple[bytes, str]], todo: dict[str, list[str]], cached: dict[str, bytes],
    model_name: str,
) -> dict[str, tuple[bytes, str]]:
    for sha, mids in todo.items():
        for mid in mids:
            out[mid] = (cached[sha], model_name)
    return out


def ingest_together(
    store: Store, calls: Sequence[tuple[list[dict[str, Any]], str, datetime]],
    embedder: Embedder, queue_events: bool = False,
) -> list[IngestReport] | None:
    """Several store calls (records, profile, time of the call), in their order, with
    one read, one embedding and one transaction, each reported as if it had been
    ingested alone after those before it: the same rows, counts and events (each
    call's store-trigger events from the counts the calls before it left).

    None, with nothing written, where that cannot be promised, and the caller ingests
    the calls one by one: a call with edges or more than ``INGEST_CHUNK`` memories, a
    memory named by two calls (the later would update what the earlier stores), or a
    value the database refuses (the chunk is then stored record by record)."""
    runs = [_Ingest(store, embedder, at, False, queue_events, False) for _, _, at in calls]
    rows_of: list[dict[str, dict[str, Any]]] = []
    for run, (records, profile, _) in zip(runs, calls, strict=True):
        memories: list[MemoryIn] = []
        for record in run.parsed(((f"record {n}", r) for n, r in enumerate(records, start=1)),
                                 profile):
            if isinstance(record, EdgeIn):
                return None
            memories.append(record)
        if len(memories) > INGEST_CHUNK:
            return None
        rows_of.append(run._rows(memories) if memories else {})
    named = [mid for rows in rows_of for mid in rows]
    if len(named) != len(set(named)):
        return None
    everything = {mid: row for rows in rows_of for mid, row in rows.items()}
    with store.reading_all() as s:
        existing = _existing(s, everything) if everything else {}
        out, todo, texts = _vector_todo(everything, existing)
        cached = _cached_vectors(s, embedder.name, todo) if todo else {}
    missing = [sha for sha in todo if sha not in cached]
    if missing:
        matrix = embedder.encode([texts[sha] for sha in missing])
        for sha, vector in zip(missing, matrix, strict=True):
            cached[sha] = to_blob(vector)
    vectors = _with_vectors(out, todo, cached, embedder.name)
    defaults = memory_defaults()
    plans = [(rows, *_planned(rows, existing, vectors, defaults)) for rows in rows_of]
    profiles = sorted({row["profile"] for row in everything.values()})
    try:
        with store.writing_all() as s:
            # Every profile's row locked first, in one order, as one ingest locks its
            # own: the calls' order of profiles could otherwise lock crosswise with
            # another writer. Each new profile is made at the time of its first call.
            ensure_profiles_each(s, [({row["profile"] for row in rows.values()}, run.at)
                                     for run, rows in zip(runs, rows_of, strict=True)])
            lock_profiles(s, profiles)
            done = _commit_calls(s, runs, plans, vectors)
    except InvalidValueError as exc:
        if _refused_value(exc.__cause__) is None:
            raise
        return None
    for run, (rows, new_rows, changed), counts in zip(runs, plans, done, strict=True):
        run._count(rows, new_rows, changed, *counts)
    return [run.report for run in runs]


def _commit_calls(
    s: Session, runs: list[_Ingest],
    plans: list[tuple[dict[str, dict[str, Any]], list[dict[str, Any]],
                      list[tuple[str, dict[str, Any]]]]],
    vectors: dict[str, tuple[bytes, str]],
) -> list[tuple[int, int, int, list[str]]]:
    """Each call's ``_commit_in`` in turn, in the caller's transaction ``s``, with what
    one ingest does once per chunk done once per group: the ingest numbers (each call
    its own, in order), the store counts and the outbox are read and written in one
    statement each, not one per call. The rows, numbers, counts and events are those
    of the calls ingested one after the other: (updated, unchanged, events queued,
    consolidations released) each.
    """
    touched = [_touched(rows, new_rows, changed) if rows else set()
               for rows, new_rows, changed in plans]
    seqs = take_ingest_seqs(s, Counter(p for names in touched for p in names))
    counts = [_new_per_profile(new_rows) for _, new_rows, _ in plans]
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    # Profiles in no call's new rows keep their count, and are not read.
    before = count_stored(s, {p: n for p, n in total.items() if n})
    # Only new rows (what agents' calls mostly bring): every call's rows go in one
    # insert per table, in the calls' order, as the calls' own inserts would put them.
    # An update among them keeps each call's writes apart, in turn.
    at_once = not any(changed for _, _, changed in plans)
    every_new: list[dict[str, Any]] = []
    done: list[tuple[int, int, int, list[str]]] = []
    queued: list[events.ProfileEvent] = []
    for run, names, call_counts, (rows, new_rows, changed) in zip(
            runs, touched, counts, plans, strict=True):
        if not rows:
            done.append((0, 0, 0, []))
            continue
        mine = {p: seqs[p] for p in names}
        for p in names:
            seqs[p] += 1  # the next call of the profile takes the next number
        if at_once:
            for r in new_rows:
                r["ingest_seq"] = mine[r["profile_id"]]
            every_new += new_rows
            updated = unchanged = 0
            released: list[str] = []
        else:
            updated, unchanged, released = _write_rows(s, new_rows, changed, vectors, mine,
                                                       run.at)
        call_events = run._stored_events(call_counts, before)
        for p, n in call_counts.items():
            before[p] += n
        queued += call_events
        done.append((updated, unchanged, len(call_events), released))
    _insert_new(s, every_new, vectors)
    outbox.add(s, queued)
    return done


def _refused_value(exc: BaseException | None) -> str | None:
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
        return _words(type(exc.orig).__name__)
    if isinstance(exc, StatementError) and not isinstance(exc, DBAPIError):
        # A value a column type or the driver could not convert before sending.
        return _words(type(exc.orig).__name__)
    return None


def _words(class_name: str) -> str:
    """``NumericValueOutOfRange`` -> ``numeric value out of range``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", class_name).lower() or "invalid value"


# The only characters outside ASCII whose NFC form is ASCII: KELVIN SIGN (K), GREEK
# QUESTION MARK (;) and GREEK VARIA (`).
_ASCII_IN_NFC = frozenset("K;`")


def _one_spelling(ident: str) -> bool:
    """Whether ``ident`` (an NFC id) is the NFC form of no other spelling (whitespace
    around it aside): true of an ASCII id without the three characters above, so that
    an ingest remembers the spellings of few ids, not of all."""
    return ident.isascii() and _ASCII_IN_NFC.isdisjoint(ident)


def _no_progress(_: int) -> None:
    pass


def _lookup(resolved: dict[str, str], ref: str, where: str, field_name: str) -> str:
    try:
        return resolved[ref]
    except KeyError:
        raise RecordError(where, field_name, f"no memory {ref!r} in this profile") from None
