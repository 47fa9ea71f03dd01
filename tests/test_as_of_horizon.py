"""A run dated in the past acts on the store as it was then: a memory created after the
run's as_of does not exist yet for it (``ProfileTx.as_of``), and waits for a run dated
at or after its ``created_at``; a backfill of a store imported at once replays history
exactly."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reverie.deployments.cli import EXIT_OK, main
from reverie.models.export import export_jsonl
from reverie.models.repositories import memories as memories_repo
from reverie.models.store import Store

from factories import get_memory, ingest_records

RENT = [
    ("r1", "Ana's rent is 900 euros a month", "2024-01-05"),
    ("r2", "Ana's rent is 950 euros a month", "2024-02-05"),
    ("r3", "Ana's rent is 1000 euros a month", "2025-01-05"),
]


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _rent(ids: tuple[str, ...] = ("r1", "r2", "r3")) -> list[dict[str, Any]]:
    return [{"id": i, "content": c, "created_at": d} for i, c, d in RENT if i in ids]


def _row(store: Store, ident: str) -> dict[str, Any]:
    memory = get_memory(store, ident, "ana")
    return {k: getattr(memory, k) for k in ("tier", "lifecycle", "superseded_by", "relevance",
                                             "pagerank", "community", "status")}


@pytest.mark.usefixtures("prefect_api")
def test_a_run_in_the_past_leaves_later_memories_for_a_later_run(
    store: Store, tmp_path: Path
) -> None:
    """The user's case: rents imported with their dates; the run dated 2024-03-01
    supersedes the January rent by the February one and never sees the 2025 rent, which
    supersedes them only in a run dated after it."""
    path = _write(tmp_path / "rent.jsonl", _rent())
    assert main(["ingest", str(path), "--profile", "ana"]) == EXIT_OK
    later_before = _row(store, "r3")
    assert main(["consolidate", "full", "--profile", "ana", "--as-of", "2024-03-01"]) == EXIT_OK
    r1, r2 = get_memory(store, "r1", "ana"), get_memory(store, "r2", "ana")
    assert r1.tier == "cold" and r1.superseded_by == r2.id
    assert r2.tier == "hot" and r2.superseded_by is None
    assert _row(store, "r3") == later_before  # untouched: not even scored

    assert main(["consolidate", "full", "--profile", "ana", "--as-of", "2025-06-01"]) == EXIT_OK
    r2, r3 = get_memory(store, "r2", "ana"), get_memory(store, "r3", "ana")
    assert r2.tier == "cold" and r2.superseded_by == r3.id
    assert r3.tier == "hot" and r3.superseded_by is None


HISTORY = [
    *_rent(),
    {"id": "t1", "content": "Ana prefers trains to planes", "kind": "preference",
     "created_at": "2024-01-10"},
    {"id": "t2", "content": "Ana prefers trains over planes", "kind": "preference",
     "created_at": "2024-06-10"},
    {"id": "c1", "content": "Ana adopted a cat called Miso", "created_at": "2024-04-02"},
    {"id": "c2", "content": "Ana's cat Miso is three years old", "created_at": "2025-02-01"},
    {"id": "j1", "content": "Ana works as a nurse in Lyon", "importance": 0.8,
     "created_at": "2023-11-20"},
    {"id": "j2", "content": "Ana started a new job as a teacher in Lyon",
     "created_at": "2025-03-15"},
    {"id": "j3", "content": "Ana teaches at a school in Lyon", "created_at": "2025-05-20"},
]
START, EVERY, END = datetime(2024, 1, 1), timedelta(days=120), datetime(2025, 6, 1)


@pytest.mark.usefixtures("prefect_api")
def test_a_backfill_of_a_store_imported_at_once_replays_history_exactly(
    new_store: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Importing everything, then backfilling, ends as importing each date's memories
    and running that date, date after date (and the memories after the last date
    last)."""
    monkeypatch.setattr("reverie.deployments.backfill.api_configured", lambda: False)
    at_once, by_date = new_store("at_once"), new_store("by_date")

    monkeypatch.setenv("REVERIE_DATABASE_URL", at_once.url)
    assert main(["ingest", str(_write(tmp_path / "all.jsonl", HISTORY)),
                 "--profile", "ana"]) == EXIT_OK
    assert main(["backfill", "full", "--from", START.date().isoformat(),
                 "--to", END.date().isoformat(), "--every", "120d",
                 "--profile", "ana"]) == EXIT_OK

    monkeypatch.setenv("REVERIE_DATABASE_URL", by_date.url)
    when, stored = START, 0
    while when <= END:
        due = sorted((r for r in HISTORY if datetime.fromisoformat(r["created_at"]) <= when),
                     key=lambda r: r["created_at"])
        if len(due) > stored:
            fresh = _write(tmp_path / f"{when.date()}.jsonl", due[stored:])
            assert main(["ingest", str(fresh), "--profile", "ana"]) == EXIT_OK
            stored = len(due)
        assert main(["consolidate", "full", "--profile", "ana",
                     "--as-of", when.isoformat()]) == EXIT_OK
        when += EVERY
    # The last memories came after the last date: imported after its run, untouched.
    assert stored < len(HISTORY)
    rest = sorted(HISTORY, key=lambda r: r["created_at"])[stored:]
    assert main(["ingest", str(_write(tmp_path / "rest.jsonl", rest)),
                 "--profile", "ana"]) == EXIT_OK

    replayed = export_jsonl(at_once.url, "ana")
    assert "supersede" in replayed  # the history did something to compare
    expected = export_jsonl(by_date.url, "ana")
    assert replayed.splitlines() == expected.splitlines()


AS_OF = datetime(2024, 3, 1)
MICRO = timedelta(microseconds=1)
# Around the boundary, given in several zones: each is stored as naive UTC.
STAMPS = {
    "early": "2024-02-29T23:59:59.999999Z",
    "at": "2024-03-01T00:00:00Z",
    "after": "2024-03-01T00:00:00.000001Z",
    "zoned_at": "2024-03-01T02:00:00+02:00",
    "zoned_after": "2024-02-29T19:00:00.000001-05:00",
    "late": "2024-03-02T00:00:00Z",
}


@pytest.fixture
def boundary(store: Store) -> dict[str, datetime]:
    """Memories created around AS_OF; their Reverie id by external id."""
    report = ingest_records(store, [
        {"id": k, "content": f"Ana noted fact number {n} about her garden", "created_at": v}
        for n, (k, v) in enumerate(STAMPS.items())], "ana")
    assert not report.errors
    with store.reading("ana") as tx:
        return {m.external_id: m.created_at for m in memories_repo.memories(tx)}


def _seen(store: Store, as_of: datetime) -> dict[str, set[str]]:
    """What each bounded read of the profile finds, as external ids."""
    every = boundary_ids(store)
    with store.reading("ana", None, as_of) as tx:
        views = memories_repo.memories(tx)
        name = {m.id: m.external_id for m in views}
        return {
            "memories": set(name.values()),
            "snapshot": {m.external_id for m in memories_repo.snapshot(tx)[0]},
            "by_id": {m.external_id for m in memories_repo.snapshot(tx, ids_=every)[0]},
            "ids": {name.get(i, i) for i in memories_repo.memory_ids(tx)},
            "relevance": {name.get(i, i) for i in memories_repo.relevance_inputs(tx).ids},
            "count": {str(memories_repo.relevance_spread(tx).hot),
                      str(memories_repo.hot_count(tx)[0])},
        }


def test_a_memory_created_at_as_of_is_seen_and_one_a_microsecond_after_is_not(
    store: Store, boundary: dict[str, datetime]
) -> None:
    assert boundary["at"] == AS_OF and boundary["after"] == AS_OF + MICRO
    assert boundary["zoned_at"] == AS_OF and boundary["zoned_after"] == AS_OF + MICRO
    expected = {"early", "at", "zoned_at"}
    for as_of in (AS_OF, datetime(2024, 3, 1, 1, tzinfo=timezone(timedelta(hours=1)))):
        seen = _seen(store, as_of)
        assert seen.pop("count") == {str(len(expected))}
        assert all(found == expected for found in seen.values()), seen
    # Outside a run (no as_of): everything.
    with store.reading("ana") as tx:
        assert len(memories_repo.memories(tx)) == len(STAMPS)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(near=st.sampled_from(sorted(STAMPS)), nudge=st.sampled_from([-1, 0, 1]),
       far=st.integers(min_value=-3 * 86_400_000_000, max_value=3 * 86_400_000_000),
       exact=st.booleans())
def test_a_run_sees_exactly_the_memories_created_by_its_as_of(
    store: Store, boundary: dict[str, datetime], near: str, nudge: int, far: int,
    exact: bool,
) -> None:
    """On either side of each memory's time, or anywhere around them."""
    as_of = boundary[near] + nudge * MICRO if exact else AS_OF + far * MICRO
    expected = {k for k, created in boundary.items() if created <= as_of}
    with store.reading("ana", None, as_of) as tx:
        views = memories_repo.memories(tx)
        assert {m.external_id for m in views} == expected
        by_id, _ = memories_repo.snapshot(tx, ids_=boundary_ids(store))
        assert {m.external_id for m in by_id} == expected


def boundary_ids(store: Store) -> list[str]:
    with store.reading("ana") as tx:
        return memories_repo.memory_ids(tx)
