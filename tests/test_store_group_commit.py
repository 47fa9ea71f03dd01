"""Store calls written together (``models.ingest.ingest_together``, used by the agent
servers' ``store``): the same store, reports and events as the calls ingested one by
one in the same order, on SQLite and PostgreSQL; and concurrent store calls through
``deployments.operations`` each answered with their own memories."""

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from reverie.deployments import operations as ops
from reverie.deployments.auth import Principal
from reverie.models import ingest as ingest_module
from reverie.models.export import export_jsonl
from reverie.models.ingest import IngestReport, ingest, ingest_together
from reverie.models.store import Store
from reverie.models.tables import Memory, OutboxEvent, Profile

from factories import embedder_of

T0 = datetime(2026, 3, 1, 9, 0)

Call = tuple[list[dict[str, Any]], str, datetime]


def calls() -> list[Call]:
    """Store calls of three profiles (one new), with a refused record, an update of a
    stored memory, a record stored already, the same memory twice in one call, and
    store-trigger thresholds crossed (every 2 stores)."""
    at = [T0 + timedelta(minutes=n) for n in range(6)]
    return [
        ([{"content": "Alice plants tomatoes in April"},
          {"content": "Alice's sister lives in Lyon", "kind": "semantic"},
          {"importance": 0.5},  # no content: refused, the others stored
          {"content": "Alice runs on Tuesdays", "id": "run"}], "alice", at[0]),
        ([{"content": "Bob collects vinyl records"},
          {"content": "Bob moved to Porto in 2024", "entity": "bob"}], "bob", at[1]),
        ([{"content": "Alice runs on Thursdays now", "id": "stored-earlier"},
          {"content": "Alice likes green tea", "id": "tea", "importance": 0.2},
          {"content": "Alice likes green tea", "id": "tea", "importance": 0.9}], "alice", at[2]),
        ([{"content": "Carol keeps bees", "id": "bees"}], "carol", at[3]),
        ([{"content": "Alice was here before", "id": "same"}], "alice", at[4]),
        ([{"content": "Bob's cat is called Miso"}], "bob", at[5]),
    ]


def base(store: Store) -> None:
    report = ingest(store, [
        {"content": "Alice runs on Mondays", "id": "stored-earlier"},
        {"content": "Alice was here before", "id": "same"},
    ], embedder_of(store), "alice", at=T0 - timedelta(days=1))
    assert report.stored == 2


def summary(report: IngestReport) -> dict[str, Any]:
    return {"stored": report.stored, "updated": report.updated, "unchanged": report.unchanged,
            "edges": report.edges, "ids": report.stored_ids, "accepted": report.memory_ids,
            "released": report.released,
            "queued_events": report.queued_events,
            "errors": [(e.where, e.field, e.message) for e in report.errors]}


def state(store: Store) -> dict[str, Any]:
    with store.reading_all() as s:
        profiles = [(p.id, p.created_at, p.store_count, p.ingest_seq, p.write_seq)
                    for p in s.execute(select(Profile).order_by(Profile.id)).scalars()]
        events = [(e.profile_id, e.name, e.occurred_at, e.key)
                  for e in s.execute(select(OutboxEvent).order_by(OutboxEvent.seq)).scalars()]
        # Not exported: the ingest number each call's memories are stamped with.
        numbers = sorted(s.execute(select(Memory.profile_id, Memory.content,
                                          Memory.ingest_seq)).tuples().all())
    return {"profiles": profiles, "events": events, "numbers": numbers,
            "exports": {p: export_jsonl(store.url, p) for p, *_ in profiles}}


def new_only_calls() -> list[Call]:
    """Store calls that bring only new memories (what agents' calls mostly do, and
    what a group writes in one insert per table): two profiles, one of them new, a
    call of a third in between, a refused record, and store-trigger thresholds
    crossed by several calls of one profile."""
    at = [T0 + timedelta(minutes=n) for n in range(5)]
    return [
        ([{"content": f"Alice noted item {k}"} for k in range(3)], "alice", at[0]),
        ([{"content": "Dora bakes bread"}, {"importance": 2}], "dora", at[1]),
        ([{"content": f"Alice noted thing {k}", "kind": "semantic"} for k in range(2)],
         "alice", at[2]),
        ([{"content": "Bob collects vinyl records"}], "bob", at[3]),
        ([{"content": f"Dora noted step {k}"} for k in range(3)], "dora", at[4]),
    ]


@pytest.mark.parametrize("made", [calls, new_only_calls])
def test_calls_written_together_equal_the_calls_one_by_one(
        new_store: Callable[..., Store], monkeypatch: pytest.MonkeyPatch,
        made: Callable[[], list[Call]]) -> None:
    monkeypatch.setenv("REVERIE_STORE_TRIGGER_EVERY", "2")
    alone, together = new_store("alone"), new_store("together")
    base(alone)
    base(together)
    embedder = embedder_of(alone)
    expected = [summary(ingest(alone, records, embedder, profile, at=at, queue_events=True,
                               create=False)) for records, profile, at in made()]
    reports = ingest_together(together, made(), embedder, queue_events=True)
    assert reports is not None
    assert [summary(r) for r in reports] == expected
    if made is calls:
        assert expected[0]["errors"] and expected[2]["updated"] and expected[4]["unchanged"]
    else:
        assert expected[1]["errors"] and not any(r["updated"] for r in expected)
    assert sum(r["queued_events"] for r in expected) > 0
    assert state(together) == state(alone)


@pytest.mark.parametrize("second", [
    # The same memory in two calls: the later would update what the earlier stores.
    [{"content": "Alice runs on Fridays", "id": "run"}],
    # An edge: it names memories by id, resolved after they are written.
    [{"type": "edge", "source": "run", "target": "tea", "kind": "association",
      "weight": 0.5}],
])
def test_what_cannot_be_written_together_is_left_untouched(
        new_store: Callable[..., Store], second: list[dict[str, Any]]) -> None:
    store = new_store("store")
    first, *_ = calls()
    before = state(store)
    assert ingest_together(store, [first, (second, "alice", T0)], embedder_of(store)) is None
    assert state(store) == before


def test_concurrent_store_calls_are_grouped_and_each_answered_with_its_own(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    groups: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> list[IngestReport] | None:
        groups.append(len(args[1]))
        return ingest_together(*args, **kwargs)

    monkeypatch.setattr(ingest_module, "ingest_together", counted)
    who = Principal(frozenset({"ann", "ben"}))
    answers: dict[tuple[int, int], dict[str, Any]] = {}
    clients, each = 6, 5

    def client(c: int) -> None:
        for n in range(each):
            contents = [f"note {c}.{n}.{k} about the garden, row {k}" for k in range(4)]
            answers[(c, n)] = ops.store_memories(
                store, who, ("ann", "ben")[c % 2], [{"content": t} for t in contents])

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == clients * each
    assert groups and max(groups) > 1  # some calls were written together
    for (c, n), answer in answers.items():
        assert answer["stored"] == 4 and answer["rejected"] == []
        assert answer["profile"] == ("ann", "ben")[c % 2]
        got = [ops.get(store, who, answer["profile"], i)["content"] for i in answer["ids"]]
        assert sorted(got) == [f"note {c}.{n}.{k} about the garden, row {k}" for k in range(4)]


def test_concurrent_store_calls_store_the_rows_and_vectors_ingest_stores(
        new_store: Callable[..., Store], monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls through ``operations`` from 8 threads at once (written together, their
    texts embedded in shared batches) store, text for text, the rows and vector bits
    ``reverie ingest`` stores for the same texts."""
    via_api, via_ingest = new_store("api"), new_store("ingest")
    monkeypatch.setenv("REVERIE_DATABASE_URL", via_api.url)
    who = Principal(frozenset({"ann"}))
    words = ["garden", "tomatoes", "the quarterly report", "Lyon", "vinyl", "a long walk "
             "by the river after work", "bees", "green tea"]
    calls_of = [[f"Ann noted {words[(c + k) % 8]} on day {c * 16 + k}"
                 + " again" * (k % 5) for k in range(16)] for c in range(8)]
    barrier = threading.Barrier(8)

    def client(texts: list[str]) -> None:
        barrier.wait()
        ops.store_memories(via_api, who, "ann", [{"content": t} for t in texts])

    threads = [threading.Thread(target=client, args=(texts,)) for texts in calls_of]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [t for texts in calls_of for t in texts]
    assert ingest(via_ingest, [{"content": t} for t in everything], embedder_of(via_ingest),
                  "ann").stored == len(everything)

    def rows(store: Store) -> dict[str, dict[str, Any]]:
        import json

        out = {}
        for line in export_jsonl(store.url, "ann").splitlines():
            row = json.loads(line)
            if "content" in row:
                out[row["content"]] = {k: v for k, v in row.items()
                                       if k != "id" and not k.endswith(("_at", "seq"))}
        return out

    got, expected = rows(via_api), rows(via_ingest)
    assert len(got) == len(everything)
    assert got == expected
    assert all(r.get("embedding_sha256") for r in got.values())


def test_a_base_exception_while_calls_are_written_reaches_every_caller(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt-like BaseException in the thread writing a group: that thread
    gets it, every other call of the group an error (they used to get an assertion),
    nothing of the group is written, and the next calls are written."""
    from reverie.engines.group_commit import GroupAborted

    class Interrupt(BaseException):
        pass

    held, go = threading.Event(), threading.Event()
    real_ingest = ingest_module.ingest

    def slow_ingest(*args: Any, **kwargs: Any) -> IngestReport:
        held.set()
        go.wait(10)
        return real_ingest(*args, **kwargs)

    def interrupted(*args: Any, **kwargs: Any) -> list[IngestReport] | None:
        raise Interrupt

    monkeypatch.setattr(ingest_module, "ingest", slow_ingest)
    monkeypatch.setattr(ingest_module, "ingest_together", interrupted)
    who = Principal(frozenset({"ann"}))
    seen: dict[int, object] = {}

    def client(n: int) -> None:
        try:
            seen[n] = ops.store_memories(store, who, "ann", [{"content": f"note {n}"}])
        except BaseException as exc:  # noqa: BLE001 - what the caller saw
            seen[n] = exc

    first = threading.Thread(target=client, args=(0,))
    first.start()
    assert held.wait(10)
    others = [threading.Thread(target=client, args=(n,)) for n in (1, 2, 3)]
    for t in others:
        t.start()
    # Keyed by URL and whether events are queued, which the store's settings decide.
    calls = next(c for (url, _), c in ops._store_calls.items() if url == store.url)
    while sum(len(q) for q in calls._queued.values()) < 3:
        threading.Event().wait(0.005)
    go.set()
    for t in [first, *others]:
        t.join(20)
    assert isinstance(seen[0], dict) and seen[0]["stored"] == 1
    kinds = sorted(type(seen[n]).__name__ for n in (1, 2, 3))
    assert kinds == ["GroupAborted", "GroupAborted", "Interrupt"]
    assert all(isinstance(seen[n], GroupAborted | Interrupt) for n in (1, 2, 3))
    monkeypatch.setattr(ingest_module, "ingest", real_ingest)
    answer = ops.store_memories(store, who, "ann", [{"content": "note 4"}])
    assert answer["stored"] == 1
    with store.reading_all() as s:
        assert s.execute(select(Profile.store_count).where(Profile.id == "ann")).scalar() == 2


def test_the_store_calls_kept_are_bounded_by_store_url(
        new_store: Callable[..., Store], monkeypatch: pytest.MonkeyPatch) -> None:
    """One entry per store URL ever called was kept for good; now the most recent few."""
    monkeypatch.setattr(ops, "STORE_CALL_URLS", 2)
    monkeypatch.setattr(ops, "_store_calls", type(ops._store_calls)())
    stores = [new_store(f"s{n}") for n in range(4)]
    who = Principal(frozenset({"ann"}))
    for n, store in enumerate(stores * 2):
        assert ops.store_memories(store, who, "ann", [{"content": f"note {n}"}])["stored"] == 1
        assert len(ops._store_calls) <= 2
    assert [url for url, _ in ops._store_calls] == [s.url for s in stores[2:]]
