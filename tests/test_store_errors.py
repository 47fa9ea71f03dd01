"""The store's failures arrive grouped by what the caller can do: retry
(StoreRetryableError: unavailable, conflict) or report (StorePermanentError: integrity,
invalid value, refused). Each group is provoked for real here, on the back-end the
suite runs on, and retries follow the class alone."""

from __future__ import annotations

import sqlite3
import threading
from datetime import datetime, timedelta

import pytest
from sqlalchemy import event, text, update

from reverie.models.backup import backup_lines, restore
from reverie.models.config import DedupConfig
from reverie.models.db import engine_for
from reverie.models.errors import (
    ConflictError,
    IntegrityViolationError,
    InvalidValueError,
    RefusedError,
    StoreError,
    StorePermanentError,
    StoreRetryableError,
    StoreUnavailableError,
    TransientError,
)
from reverie.models.records import SummaryPlan
from reverie.models.repositories import audit, forgetting, summaries
from reverie.models.repositories.memories import snapshot
from reverie.models.store import Store
from reverie.models.tables import Memory, Operation, Profile
from reverie.models.transient import is_transient, retrying
from reverie.tasks.dedup import find_duplicates, plan_merges

from conftest import TEST_POSTGRES
from factories import AS_OF, at_cosine, axis, get_memory, ingest_records, record

T0 = datetime(2025, 7, 1)


def retryable(exc: BaseException) -> bool:
    """What the steps' and flows' retries decide (models.transient)."""
    return isinstance(exc, StoreRetryableError) and is_transient(exc)


def permanent(exc: BaseException) -> bool:
    return isinstance(exc, StorePermanentError) and not is_transient(exc)


def test_the_two_groups_share_the_store_base_and_only_one_is_transient() -> None:
    assert issubclass(StoreRetryableError, StoreError)
    assert issubclass(StoreRetryableError, TransientError)
    assert issubclass(StorePermanentError, StoreError)
    assert not issubclass(StorePermanentError, TransientError)


def _add_profile(store: Store, backup: list[str]) -> None:
    with store.writing_all() as s:
        s.add(Profile(id="p", created_at=T0))


def _restore_backup(store: Store, backup: list[str]) -> None:
    """A backup restore writes through models.db, not the repositories."""
    restore(store.url, backup)


@pytest.mark.skipif(bool(TEST_POSTGRES), reason="SQLite's write lock")
@pytest.mark.parametrize("write", [_add_profile, _restore_backup], ids=["store", "restore"])
def test_a_locked_sqlite_store_is_unavailable_and_retried(
    store: Store, new_store, write  # type: ignore[no-untyped-def]
) -> None:
    source = new_store("source")
    ingest_records(source, [record("a")], profile="p")
    backup = list(backup_lines(source.url, "p"))
    engine = engine_for(store.url)
    engine.dispose()

    @event.listens_for(engine, "connect")
    def _impatient(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
        # Give up on the lock in 50 ms instead of the store's 60 s.
        dbapi_connection.execute("PRAGMA busy_timeout=50")

    holder = sqlite3.connect(store.url.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            write(store, backup)
        assert "locked" in str(caught.value)
        assert retryable(caught.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        event.remove(engine, "connect", _impatient)
        engine.dispose()
    # Once the lock is gone, the same call goes through: what a retry counts on.
    write(store, backup)
    assert store.profiles() == ["p"]


@pytest.mark.skipif(not TEST_POSTGRES, reason="PostgreSQL's serialization failures")
def test_a_postgres_serialization_failure_is_unavailable_and_retried(store: Store) -> None:
    ingest_records(store, [record("a fact", id="a")], profile="p")
    mid = get_memory(store, "a").id
    read, other_committed = threading.Event(), threading.Event()

    def other_writer() -> None:
        read.wait(10)
        with store.writing_all() as s:
            s.execute(update(Memory).where(Memory.id == mid).values(access_count=5))
        other_committed.set()

    thread = threading.Thread(target=other_writer)
    thread.start()
    with pytest.raises(StoreUnavailableError) as caught:
        # Not through store.writing(profile): it takes the profile's row first (its write
        # count), so two writers of one profile queue there and never meet this failure.
        with store.writing_all() as s:
            s.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
            s.execute(text("SELECT access_count FROM memory")).all()
            read.set()
            other_committed.wait(10)
            s.execute(update(Memory).where(Memory.id == mid).values(access_count=7))
    thread.join()
    assert "serialize" in str(caught.value)
    assert retryable(caught.value)


def test_members_changed_since_they_were_read_is_a_conflict(store: Store) -> None:
    ingest_records(store, [record("a fact", id="a")], profile="p")
    mid = get_memory(store, "a").id
    with store.writing("p") as tx:
        forgetting.migrate_to_cold(tx, [mid], T0, None, {})
    # A plan made from the earlier read: the memory is not hot any more.
    with pytest.raises(ConflictError) as caught:
        with store.writing("p") as tx:
            forgetting.migrate_to_cold(tx, [mid], T0 + timedelta(days=1), None, {})
    assert retryable(caught.value)


def _three_alike(store: Store) -> list[SummaryPlan]:
    """One dedup plan over three near-duplicates of profile p, read before any change."""
    made = (AS_OF - timedelta(days=1)).isoformat()
    ingest_records(store, [
        record("the representative of the group", id="r", created_at=made,
               embedding=axis(0).tolist()),
        # Members that state no number or name the representative lacks: the plan keeps
        # the representative's words and vector.
        *(record(text, id=f"m{k}", created_at=made,
                 embedding=at_cosine(0.9, other=1 + k).tolist())
          for k, text in enumerate(["group member", "member of group"])),
    ], profile="p")
    with store.reading("p") as tx:
        memories, vectors = snapshot(tx)
    config = DedupConfig()
    (plan,) = plan_merges("p", find_duplicates(memories, vectors, AS_OF, config), {}, config)
    return [plan]


def test_a_summary_whose_member_changed_since_the_plan_is_a_conflict_that_writes_nothing(
    store: Store,
) -> None:
    plans = _three_alike(store)
    moved = get_memory(store, "m1").id
    # Between the step's read and its write, something else sends a member cold.
    with store.writing("p") as tx:
        forgetting.migrate_to_cold(tx, [moved], AS_OF, None, {})
    with pytest.raises(ConflictError) as caught:
        with store.writing("p") as tx:
            summaries.apply_summaries(tx, plans, AS_OF, None)
    assert retryable(caught.value)
    assert plans[0].summary_id in str(caught.value)
    with store.reading_all() as s:
        assert s.get(Memory, plans[0].summary_id) is None
        rest = [get_memory(store, ident) for ident in ("r", "m0")]
        assert [(m.tier, m.superseded_by) for m in rest] == [("hot", None)] * 2
        assert get_memory(store, "m1").tier == "cold"  # the other writer's change stands
    with store.reading("p") as tx:
        assert not [c for c in audit.consolidations(tx) if c.summary_id == plans[0].summary_id]


def test_a_member_still_hot_but_promoted_since_the_plan_is_a_conflict_too(store: Store) -> None:
    # The audit keeps the lifecycle for undo: a lifecycle other than the one read
    # would be restored wrongly, so it must hold as well, not only tier and supersession.
    plans = _three_alike(store)
    promoted = get_memory(store, "m0").id
    with store.writing("p") as tx:
        tx.session.execute(update(Memory).where(Memory.id == promoted)
                           .values(lifecycle="promoted"))
    with pytest.raises(ConflictError):
        with store.writing("p") as tx:
            summaries.apply_summaries(tx, plans, AS_OF, None)
    with store.reading_all() as s:
        assert s.get(Memory, plans[0].summary_id) is None


def test_a_summary_whose_members_held_still_is_written_with_their_priors(store: Store) -> None:
    (plan,) = _three_alike(store)
    with store.writing("p") as tx:
        assert summaries.apply_summaries(tx, [plan], AS_OF, None) == [plan.summary_id]
    with store.reading("p") as tx:
        (decision,) = [c for c in audit.consolidations(tx) if c.summary_id == plan.summary_id]
    assert decision.parameters["prior"] == {
        mid: ["hot", "active", None] for mid in plan.member_ids}
    with store.reading_all() as s:
        assert {s.get(Memory, mid).superseded_by for mid in plan.member_ids} == {
            plan.summary_id}


def test_a_constraint_refusal_is_an_integrity_violation(store: Store) -> None:
    with store.writing_all() as s:
        s.add(Profile(id="p", created_at=T0))
    with pytest.raises(IntegrityViolationError) as caught:
        with store.writing_all() as s:
            s.add(Profile(id="p", created_at=T0))
    assert permanent(caught.value)


def test_a_value_the_database_refuses_is_invalid(store: Store) -> None:
    ingest_records(store, [record("a fact", id="a")], profile="p")
    with pytest.raises(InvalidValueError) as caught:
        with store.writing("p") as tx:
            # Beyond SQLite's 64 bits, beyond PostgreSQL's 32-bit INTEGER.
            tx.session.execute(update(Memory).values(access_count=2**70))
    assert permanent(caught.value)


def test_undoing_a_deletion_is_refused(store: Store) -> None:
    ingest_records(store, [record("a fact", id="a"), record("another", id="b")], profile="p")
    mid = get_memory(store, "a").id
    with store.writing("p") as tx:
        forgetting.forget(tx, [], [(mid, 0.0, "test")], T0, None, {})
    with store.reading("p") as tx:
        (decision,) = [c for c in audit.consolidations(tx) if c.operation == Operation.FORGET]
    with pytest.raises(RefusedError) as caught:
        with store.writing("p") as tx:
            summaries.undo(tx, decision.id, T0)
    assert permanent(caught.value)


def test_retries_follow_the_class() -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise StoreUnavailableError("database is locked")
        return "done"

    assert retrying(flaky, attempts=3, first=0.0, cap=0.0) == "done" and len(calls) == 2

    def refused() -> None:
        calls.append(1)
        # Permanent even when its cause looks like a passing fault.
        raise InvalidValueError("integer out of range") from TimeoutError("slow")

    calls.clear()
    with pytest.raises(InvalidValueError):
        retrying(refused, attempts=3, first=0.0, cap=0.0)
    assert len(calls) == 1
