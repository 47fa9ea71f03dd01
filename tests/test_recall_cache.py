"""The recall cache of the agent servers, and the write count it trusts.

A profile's ``write_seq`` must move with every transaction that writes the profile's
rows (ingest, every consolidation step, undo, forget, decay, access, restore): a
server keeps a profile's candidates while it holds still. Checked from the database's
side: every INSERT/UPDATE/DELETE on a profile's tables is watched, with the repository
function that sent it, and its transaction must count the write before it commits.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_server import ADMIN_TOKEN, agent_store, api_server, bearer
from fastapi.encoders import jsonable_encoder
from sqlalchemy import Engine, event, select

from reverie.deployments import operations as ops
from reverie.deployments.auth import Principal
from reverie.engines import ranking
from reverie.engines.ranking import RecallCache
from reverie.flows.cluster import cluster
from reverie.flows.cold_notes import consolidate_cold
from reverie.flows.cold_tier import cold_tier
from reverie.flows.creative import creative
from reverie.flows.decay import decay
from reverie.flows.forget import forget
from reverie.flows.full_consolidation import full_consolidation
from reverie.models.backup import backup_lines, restore
from reverie.models.config import ConsolidationConfig, ForgetConfig
from reverie.models.repositories import memories as memories_repo
from reverie.models.store import Store
from reverie.models.tables import Profile, Tier
from reverie.recall import search as search_module
from reverie.recall.search import recall

from factories import (
    AS_OF,
    at_cosine,
    axis,
    end_session,
    in_read,
    ingest_records,
    stored_vector,
    undo_consolidation,
)

REPOSITORIES = Path(__file__).resolve().parents[1] / "models" / "repositories"
# The tables that hold what a profile remembers (its memories, their vectors, edges,
# blocks, audit and tombstones): a write to one must count. Run history, leases and the
# event outbox say nothing recall reads.
PROFILE_DATA = {"memory", "memoryvector", "edge", "coreblock", "consolidation", "tombstone"}
WRITE = re.compile(r"^\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+\"?(\w+)\"?", re.I)
BUMP = re.compile(r"^\s*UPDATE\s+\"?profile\"?\s+SET\s+.*write_seq", re.I | re.S)


def writing_functions() -> set[str]:
    """``module.function`` of every repository function that writes a profile's rows:
    those that call insert/update/delete or a session's add/delete themselves, and
    those that call one of them. Bulk helpers and cross-profile bookkeeping (leases,
    run records, the profile row's own counters) left out."""
    direct: dict[str, set[str]] = {}
    calls: dict[str, set[str]] = {}
    for path in sorted(REPOSITORIES.glob("*.py")):
        for fn in ast.parse(path.read_text()).body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            name = f"{path.stem}.{fn.name}"
            called = calls.setdefault(fn.name, set())
            writes = False
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                if isinstance(f, ast.Name):
                    called.add(f.id)
                    writes |= f.id in {"insert", "update", "delete"}
                elif (isinstance(f, ast.Attribute) and f.attr in {"add", "add_all", "delete"}
                      and isinstance(f.value, ast.Name) and f.value.id in {"s", "session"}):
                    writes = True
            direct[name] = {"w"} if writes else set()
    writing = {n for n, w in direct.items() if w}
    while True:  # callers of writing functions write too
        more = {n for n in direct if n not in writing
                and calls[n.split(".", 1)[1]] & {w.split(".", 1)[1] for w in writing}}
        if not more:
            break
        writing |= more
    return {n for n in writing if not n.startswith(("bulk.", "runs.", "profiles."))
            and not n.split(".", 1)[1].startswith("_")}


@dataclass
class Audit:
    """What each transaction wrote of a profile's rows, and whether it counted it."""

    violations: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # repository functions seen writing
    open_writes: dict[int, list[str]] = field(default_factory=dict)
    bumped: set[int] = field(default_factory=set)

    # Transactions are told apart by their driver connection: bulk inserts on
    # PostgreSQL go to its cursor directly (psycopg2's execute_values), past the engine.

    def begin(self, conn) -> None:  # type: ignore[no-untyped-def]
        self.open_writes[_driver(conn)] = []
        self.bumped.discard(_driver(conn))

    def execute(self, conn, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        self.statement(_driver(conn), statement)

    def statement(self, key: int, statement: str) -> None:
        if BUMP.match(statement):
            self.bumped.add(key)
            return
        match = WRITE.match(statement)
        if not match or match.group(1).lower() not in PROFILE_DATA:
            return
        where = _repository_frames()
        self.seen.update(where)
        self.open_writes.setdefault(key, []).append(
            f"{match.group(1)} by {', '.join(where) or 'a caller outside models.repositories'}")

    def commit(self, conn) -> None:  # type: ignore[no-untyped-def]
        writes = self.open_writes.pop(_driver(conn), [])
        if writes and _driver(conn) not in self.bumped:
            self.violations.append("; ".join(sorted(set(writes))))
        self.bumped.discard(_driver(conn))

    def rollback(self, conn) -> None:  # type: ignore[no-untyped-def]
        self.open_writes.pop(_driver(conn), None)
        self.bumped.discard(_driver(conn))


def _driver(conn) -> int:  # type: ignore[no-untyped-def]
    return id(conn.connection.dbapi_connection)


def _repository_frames() -> list[str]:
    out = []
    frame = sys._getframe(1)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.parent == REPOSITORIES:
            out.append(f"{path.stem}.{frame.f_code.co_name}")
        frame = frame.f_back
    return out


@pytest.fixture
def audit(monkeypatch: pytest.MonkeyPatch) -> Iterator[Audit]:
    import psycopg2.extras

    watched = Audit()
    execute_values = psycopg2.extras.execute_values

    def seen_values(cursor, statement, *args, **kwargs):  # type: ignore[no-untyped-def]
        watched.statement(id(cursor.connection), str(statement))
        return execute_values(cursor, statement, *args, **kwargs)

    monkeypatch.setattr(psycopg2.extras, "execute_values", seen_values)
    hooks = [("begin", watched.begin), ("before_cursor_execute", watched.execute),
             ("commit", watched.commit), ("rollback", watched.rollback)]
    for name, fn in hooks:
        event.listen(Engine, name, fn)
    try:
        yield watched
    finally:
        for name, fn in hooks:
            event.remove(Engine, name, fn)


def seq(store: Store, profile: str) -> int:
    with store.reading_all() as s:
        return int(s.execute(select(Profile.write_seq).where(Profile.id == profile)).scalar_one())


def iso(days: float) -> str:
    return (AS_OF - timedelta(days=days)).isoformat() + "Z"


def memories() -> list[dict]:
    """Enough of each kind for every step to write: near-duplicates (dedup), fading
    memories (compress), cold notes (consolidate_cold), clusters, and decisions,
    insights and patterns (creative)."""
    old = {"created_at": iso(300), "importance": 0.1, "kind": "episodic"}
    rows = [{**old, "id": f"f{k}", "content": f"hiked trail number {k} in spring",
             "created_at": iso(300 - k), "embedding": at_cosine(0.9, other=1 + k).tolist()}
            for k in range(6)]
    rows += [{"id": f"d{k}", "content": f"the deploy runs on friday {k}", "kind": "semantic",
              "created_at": iso(5), "embedding": at_cosine(0.97, base=40, other=41 + k).tolist()}
             for k in range(4)]
    notes = {"created_at": iso(40), "importance": 0.1, "entity": "billing",
             "layer": "implementation"}
    rows += [{**notes, "id": f"n{k}", "content": f"billing detail {k}",
              "embedding": axis(100 + k).tolist()} for k in range(3)]
    rows += [{"id": f"c{k}", "content": f"a cluster member {k}", "kind": "semantic",
              "created_at": iso(2), "importance": 0.9, "access_count": 5,
              "confidence": 0.9,
              "embedding": at_cosine(0.95, base=60, other=61 + k).tolist()} for k in range(6)]
    rows += [{"id": "x1", "content": "we chose postgres", "kind": "decision",
              "created_at": iso(1), "importance": 0.9, "embedding": axis(80).tolist()},
             {"id": "x2", "content": "we chose sqlite", "kind": "decision",
              "created_at": iso(1), "importance": 0.9, "embedding": axis(81).tolist()},
             {"id": "t1", "content": "port the importer", "status": "in_progress",
              "created_at": iso(60), "importance": 0.9, "embedding": axis(90).tolist()}]
    return [{**r, "profile": "p"} for r in rows]


@pytest.mark.usefixtures("prefect_api")
def test_every_write_transaction_counts_as_a_write_of_its_profile(
    store: Store, audit: Audit, tmp_path: Path, new_store,  # type: ignore[no-untyped-def]
) -> None:
    steps: list[tuple[str, int]] = []
    idle: set[str] = set()  # what may have found nothing to write

    def step(name: str, may_idle: bool = False) -> None:
        steps.append((name, seq(store, "p")))
        if may_idle:
            idle.add(name)

    assert not ingest_records(store, memories()).errors
    step("ingest")
    assert not ingest_records(store, [{"profile": "p", "type": "edge", "source": "x1",
                                       "target": "x2", "weight": 0.5,
                                       "last_strengthened_at": iso(60)}]).errors
    step("ingest edges")
    target = new_store("restored")
    restore(target.url, backup_lines(store.url, "p"))
    assert seq(target, "p") > 0
    decay(profile="p", as_of=AS_OF)
    step("decay")
    cluster(profile="p", as_of=AS_OF)  # before dedup merges the cluster's members
    step("cluster")
    report = full_consolidation(profile="p", as_of=AS_OF)
    step("full consolidation")
    summaries = [c.target for s in report.steps for c in s.changes
                 if c.action in ("merged", "compressed")]
    # Held by an update, not by the summary an operator undoes below, which must
    # still stand then.
    held = next(m for m in in_read(store, "p", memories_repo.memories, tiers=(Tier.COLD,))
                if m.superseded_by not in (None, *summaries) and m.external_id is not None)
    assert ingest_records(store, [{
        "profile": "p", "id": held.external_id, "content": f"{held.content}, said anew",
        "embedding": stored_vector(store, held.id).tolist()}]).released
    step("ingest releasing what held a memory")
    creative(profile="p", as_of=AS_OF)
    step("creative")
    config = ConsolidationConfig(forget=ForgetConfig(archive_threshold=0.3,
                                                     delete_threshold=0.05))
    consolidate_cold(profile="p", as_of=AS_OF + timedelta(days=400), config=config,
                     auto_approve_deletion=True)
    step("consolidate cold and its forget sweep")
    forget(profile="p", as_of=AS_OF + timedelta(days=800), config=config,
           auto_approve_deletion=True)
    step("forget", may_idle=True)  # the cold sweep above forgot what it would
    cold_tier(profile="p", as_of=AS_OF + timedelta(days=800), migrate_after_days=30)
    step("cold tier")
    summary = summaries[0]
    undo_consolidation(store, summary, "p")
    step("undo")
    end_session(store, "p", "s1")
    step("session end")
    recall(store, "p", "the deploy", k=3, track=True)
    step("recall, counted as access")
    # A summary the cold tier moved cold and an operator then undid is named by the move's
    # history only: the profile's backup, after every step, still restores whole.
    restore(new_store("restored at the end").url, backup_lines(store.url, "p"))
    moved = [(name, after > before) for (_, before), (name, after)
             in zip([("", 0), *steps], steps, strict=False)]
    assert all(up for name, up in moved if name not in idle), steps
    assert audit.violations == []
    # Every repository function that writes a profile's rows was seen writing here,
    # so each of them ran in a counted transaction.
    assert writing_functions() - audit.seen == set()


def test_recall_with_the_cache_gives_what_recall_without_it_gives_and_sees_every_write(
    store: Store, new_store, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    assert not ingest_records(store, [
        {"profile": "p", "id": f"m{k}", "content": f"the deploy runs on day {k} of the week"}
        for k in range(12)]).errors
    cache = RecallCache(64 << 20)
    queries = ["when does the deploy run", "day 3", "the week"]

    def both(**kw) -> None:  # type: ignore[no-untyped-def]
        for q in queries:
            for deep in (False, True):
                cached = recall(store, "p", q, k=5, deep=deep, cache=cache, **kw)
                plain = recall(store, "p", q, k=5, deep=deep, **kw)
                assert cached == plain

    both()
    # The second time, the cached recalls read no memory whole: their hits' memories
    # were kept with the entry. Only the uncached ones read.
    reads: list[int] = []

    def counted(*args: Any, **kw: Any) -> Any:
        reads.append(1)
        return read_whole(*args, **kw)

    read_whole = search_module.snapshot
    monkeypatch.setattr(search_module, "snapshot", counted)
    both()
    assert len(reads) == 2 * len(queries)
    monkeypatch.undo()
    assert cache.hits and len(cache) == 2
    # A write through another Store (as another process's would be: its own engine
    # and transaction) is seen by the next recall.
    other = Store(store.url)
    hits_before = cache.hits
    assert not ingest_records(other, [{"profile": "p", "id": "new", "content":
                                       "the deploy now runs on day 3 at noon"}]).errors
    [first] = recall(store, "p", "the deploy now runs on day 3 at noon", k=1, cache=cache)
    assert first.memory.external_id == "new" and cache.hits == hits_before
    both()
    undo_target = None
    with other.writing("p") as tx:  # any write at all, even one no step would make
        tx.session.execute(select(Profile.id))
        undo_target = tx.profile
    assert undo_target == "p"
    misses = cache.misses
    recall(store, "p", "day 3", k=5, cache=cache)
    assert cache.misses == misses + 1


def test_the_cache_keeps_to_its_budget_least_recently_used_out(store: Store) -> None:
    for name in ("a", "b", "c"):
        assert not ingest_records(store, [{"profile": name, "content": f"{name} note {k}"}
                                          for k in range(20)]).errors
    one = RecallCache(1 << 30)
    recall(store, "a", "note", cache=one)
    size = one.nbytes
    cache = RecallCache(2 * size + size // 2)
    for name in ("a", "b", "a", "c"):
        recall(store, name, "note", cache=cache)
    assert [k[1] for k in cache._entries] == ["a", "c"]  # noqa: SLF001
    none = RecallCache(0)
    recall(store, "a", "note", cache=none)
    assert len(none) == 0


def test_the_server_sees_a_write_made_by_another_process(tmp_path: Path) -> None:
    """``reverie api`` caches a profile after its first recall; a write through another
    process (here, this one) is in its next answer."""
    with agent_store(tmp_path) as url, api_server(url, tmp_path) as api:
        store = Store(url)
        assert not ingest_records(store, [{"profile": "p", "content": f"garden note {k}"}
                                          for k in range(5)]).errors
        with httpx.Client(base_url=api.url, headers=bearer(ADMIN_TOKEN), timeout=60) as http:
            ask = {"query": "the pond is frozen over", "k": 1}
            first = http.post("/v1/profiles/p/recall", json=ask).json()["hits"][0]
            assert http.post("/v1/profiles/p/recall", json=ask).json()["hits"][0] == first
            assert not ingest_records(store, [{"profile": "p", "id": "pond",
                                               "content": "the pond is frozen over"}]).errors
            [hit] = http.post("/v1/profiles/p/recall", json=ask).json()["hits"]
            assert hit["external_id"] == "pond"
            # The server writes its answers with orjson: the same values, scores to the
            # bit, as FastAPI's own encoding of what ``ops`` answers in this process.
            who = Principal(frozenset(), admin=True)
            for q in ("the pond is frozen over", "garden note 3", "winter"):
                for deep in (False, True):
                    served = http.post("/v1/profiles/p/recall",
                                       json={"query": q, "k": 5, "deep": deep}).json()
                    assert served == fastapi_json(ops.recall(store, who, "p", q, 5, deep))
                served = http.post("/v1/profiles/p/session-init", json={"query": q}).json()
                assert served == fastapi_json(ops.session_init(store, who, "p", q))


def fastapi_json(data: dict[str, Any]) -> Any:
    """``data`` as FastAPI's default response encoding writes it, read back."""
    return json.loads(json.dumps(jsonable_encoder(data)))


def test_memories_read_whole_for_hits_count_toward_the_budget(store: Store) -> None:
    """A cached entry keeps the memories its hits read whole; as they come, they count:
    over the budget, older entries go first, then what the entry itself remembered. The
    hits stay those of recall without a cache."""
    for name in ("a", "b"):
        assert not ingest_records(store, [
            {"profile": name, "content": f"{name} note {k}: " + "word " * (40 + k)}
            for k in range(24)]).errors
    probe = RecallCache(1 << 30)
    recall(store, "a", "note", k=1, cache=probe)
    base = probe.nbytes  # the entry of a, with the one memory its hit read
    queries = [f"note {k}" for k in range(24)]
    roomy = RecallCache(1 << 30)
    for q in queries:
        recall(store, "a", q, k=5, cache=roomy)
    grown = roomy.nbytes
    assert grown > base + 12 * ranking.SHOWN_ROW_BYTES  # it did remember many
    assert roomy.nbytes == sum(e.candidates.nbytes for e in roomy._entries.values())  # noqa: SLF001

    # Room for b's entry and a's with a few memories read whole, not all of them.
    tight = RecallCache(2 * base + (grown - base) // 2)
    recall(store, "b", "note", k=1, cache=tight)
    for q in queries:
        assert recall(store, "a", q, k=5, cache=tight) == recall(store, "a", q, k=5)
        assert tight.nbytes <= tight.budget_bytes
        assert tight.nbytes == sum(
            e.candidates.nbytes for e in tight._entries.values())  # noqa: SLF001
    assert [k[1] for k in tight._entries] == ["a"]  # noqa: SLF001  b went first
    alone = RecallCache(base + 3 * ranking.SHOWN_ROW_BYTES)
    for q in queries:
        recall(store, "a", q, k=5, cache=alone)
        assert alone.nbytes <= alone.budget_bytes and len(alone) == 1
