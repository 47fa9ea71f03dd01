"""Builders for test data with exactly the geometry a rule's boundary needs."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from reverie.models.records import MemoryView
from reverie.models.vectors import DIMENSION

if TYPE_CHECKING:
    from reverie.models.ingest import IngestReport
    from reverie.models.store import Store

T = TypeVar("T")
AS_OF = datetime(2025, 7, 1)


def view(mid: str, **fields: Any) -> MemoryView:
    values: dict[str, Any] = {
        "id": mid,
        "profile_id": "p",
        "content": f"memory {mid}",
        "kind": "semantic",
        "importance": 0.5,
        "confidence": 0.5,
        "stability": 1.0,
        "access_count": 0,
        "created_at": AS_OF - timedelta(days=10),
    }
    values.update(fields)
    return MemoryView(**values)


def clustered(n: int, dim: int = 48, seed: int = 5) -> np.ndarray:
    """Unit vectors in clusters of about 20: what the searches by cells are tested on."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n // 20, dim))
    v = centres[rng.integers(0, len(centres), n)] + 0.45 * rng.normal(size=(n, dim))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def axis(i: int, dim: int = DIMENSION) -> np.ndarray:
    v = np.zeros(dim, dtype=np.float32)
    v[i] = 1.0
    return v


def at_cosine(cos: float, base: int = 0, other: int = 1, dim: int = DIMENSION) -> np.ndarray:
    """A unit vector whose float32 cosine with axis ``base`` is exactly float32(cos)."""
    v = np.zeros(dim, dtype=np.float32)
    v[base] = np.float32(cos)
    v[other] = np.float32(math.sqrt(max(0.0, 1.0 - float(np.float32(cos)) ** 2)))
    return v


def below(cos: float) -> float:
    """The largest float32 strictly below ``cos``: the first value a threshold excludes."""
    return float(np.nextafter(np.float32(cos), np.float32(-1.0)))


def record(content: str, **fields: Any) -> dict[str, Any]:
    return {"content": content, **fields}


# --- the store, as the CLI and the flows use it -----------------------------------------
# Tests read and write through the repositories one call per transaction; these
# helpers open that transaction (steps open theirs in tasks/).


def embedder_of(store: Store) -> Any:
    """The embedding model the store's settings name (loaded once per process)."""
    from reverie.engines.embedding import embedder_for

    return embedder_for(store.settings)


def ingest_records(store: Store, records: Any, *args: Any, **kwargs: Any) -> IngestReport:
    """Ingest as ``reverie ingest`` does: the configured model, events queued when a
    Prefect API is configured and delivered after the ingest."""
    from reverie.models.ingest import ingest
    from reverie.runner.event_delivery import deliver, wanted

    report = ingest(store, records, embedder_of(store), *args, queue_events=wanted(), **kwargs)
    if report.queued_events:
        deliver(store.url)
    return report


def ingest_file(store: Store, path: Any, *args: Any, **kwargs: Any) -> IngestReport:
    from reverie.models.ingest import ingest_jsonl
    from reverie.runner.event_delivery import deliver, wanted

    report = ingest_jsonl(store, path, embedder_of(store), *args, queue_events=wanted(),
                          **kwargs)
    if report.queued_events:
        deliver(store.url)
    return report


def in_read(store: Store, profile: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(tx, ...)`` in a read transaction on ``profile``."""
    with store.reading(profile) as tx:
        return fn(tx, *args, **kwargs)


def in_write(store: Store, profile: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(tx, ...)`` in a write transaction on ``profile``."""
    with store.writing(profile) as tx:
        return fn(tx, *args, **kwargs)


def get_memory(store: Store, ident: str, profile: str | None = None) -> Any:
    from reverie.models.repositories.memories import get

    with store.reading_all() as s:
        return get(s, ident, profile)


def stored_vector(store: Store, memory_id: str) -> np.ndarray | None:
    from reverie.models.repositories.memories import vector

    found = get_memory(store, memory_id)
    return in_read(store, found.profile_id, vector, memory_id)


def external_ids(store: Store, ids_: Any) -> dict[str, str]:
    from reverie.models.repositories import memories

    with store.reading_all() as s:
        return memories.external_ids(s, ids_)


def record_runs(store: Store, records: Any) -> None:
    from reverie.models.repositories import runs

    with store.writing_all() as s:
        runs.record_runs(s, records)


def run_history(store: Store, *args: Any, **kwargs: Any) -> list[Any]:
    from reverie.models.repositories import runs

    with store.reading_all() as s:
        return runs.run_history(s, *args, **kwargs)


def acquire_leases(store: Store, profiles: Any, holder: str, seconds: float,
                   at: datetime | None = None) -> list[str]:
    from reverie.models.repositories import runs
    from reverie.models.timestamps import utcnow

    with store.writing_all() as s:
        return runs.acquire_leases(s, profiles, holder, seconds, at or utcnow())


def renew_leases(store: Store, profiles: Any, holder: str, seconds: float,
                 at: datetime | None = None) -> list[str]:
    from reverie.models.repositories import runs
    from reverie.models.timestamps import utcnow

    with store.writing_all() as s:
        return runs.renew_leases(s, profiles, holder, seconds, at or utcnow())


def release_leases(store: Store, profiles: Any, holder: str) -> None:
    from reverie.models.repositories import runs

    with store.writing_all() as s:
        runs.release_leases(s, profiles, holder)


def lease_holders(store: Store) -> dict[str, str]:
    from reverie.models.repositories import runs

    with store.reading_all() as s:
        return runs.lease_holders(s)


def end_session(store: Store, profile: str, session_id: str | None = None,
                at: datetime | None = None) -> int:
    """As ``reverie session end`` does: counted, and its events delivered if wanted."""
    from reverie.models.repositories.runs import end_session as end
    from reverie.models.timestamps import utcnow
    from reverie.runner.event_delivery import deliver, wanted

    store.resolve_profiles(profile)
    queue_events = wanted()
    with store.writing(profile) as tx:
        count, _ = end(tx, session_id, at or utcnow(), store.settings.session_trigger_every,
                       queue_events)
    if queue_events:
        deliver(store.url)
    return count


def undo_consolidation(store: Store, ident: str, profile: str,
                       at: datetime | None = None) -> Any:
    from reverie.models.repositories.summaries import undo
    from reverie.models.timestamps import utcnow

    with store.writing(profile) as tx:
        return undo(tx, ident, at or utcnow())


def record_access(store: Store, profile: str, memory_ids: Any,
                  at: datetime | None = None) -> int:
    """As tracked recall does, with the configured co-access bonus."""
    from reverie.models.config import RECALL_DEFAULT
    from reverie.models.repositories.memories import record_access as record
    from reverie.models.timestamps import utcnow

    with store.writing(profile) as tx:
        return record(tx, memory_ids, at or utcnow(), RECALL_DEFAULT.co_access_bonus)
