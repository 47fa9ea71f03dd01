"""The one retry (models.transient.retrying, on stamina) behind the one transient-error
test, for each of its loops: a store step under a real SQLite lock or PostgreSQL
serialization failure (its retries seen in Prefect as events), the LLM client against a
real HTTP server saying 429/503 (`reverie events flush`: test_events.py)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from uuid import UUID

import httpx
import pytest
import stamina
from sqlalchemy import event, text, update

from reverie.engines.llm import LLMSummarizer, Refused, Transient
from reverie.models.config import ConsolidationConfig
from reverie.models.db import engine_for, store_id
from reverie.models.errors import (
    ConflictError,
    InvalidValueError,
    StoreUnavailableError,
    TransientError,
)
from reverie.models.store import Store
from reverie.models.tables import Profile
from reverie.models.transient import is_transient, retry_wait, retrying
from reverie.tasks import step as step_module
from reverie.tasks.step import STEP_RETRYING, StepArgs, StepBatch, StepReport, run_batch

from conftest import TEST_POSTGRES

T0 = datetime(2025, 7, 1)


@pytest.fixture
def no_waiting() -> Iterator[None]:
    """stamina's testing mode: every wait is zero, the attempts as configured."""
    stamina.set_testing(True, attempts=100, cap=True)
    yield
    stamina.set_testing(False)


# --- the predicate, at its boundaries ---------------------------------------------------


def _status(code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    return httpx.HTTPStatusError("x", request=request, response=httpx.Response(code, request=request))


@pytest.mark.parametrize(("fault", "transient"), [
    (_status(408), True), (_status(409), False),
    (_status(429), True), (_status(499), False),
    (_status(500), True), (_status(501), False), (_status(504), True), (_status(505), False),
    (StoreUnavailableError("database is locked"), True),
    (ConflictError("changed since read"), True),
    # The store's permanent errors stay permanent whatever their cause.
    (InvalidValueError("out of range"), False),
    (Transient("HTTP 503"), True),
    (Refused("HTTP 400"), False),
])
def test_the_one_predicate_at_its_boundaries(fault: BaseException, transient: bool) -> None:
    assert is_transient(fault) is transient


def test_a_permanent_store_error_caused_by_a_passing_fault_is_permanent() -> None:
    try:
        raise InvalidValueError("integer out of range") from TimeoutError("slow")
    except InvalidValueError as exc:
        assert not is_transient(exc)


def test_a_fault_may_ask_for_its_own_wait_up_to_the_cap() -> None:
    assert retry_wait(ValueError("bug"), 4.0) is False
    assert retry_wait(Transient("HTTP 503"), 4.0) is True  # the back-off decides
    assert retry_wait(Transient("HTTP 429", retry_after=3.0), 4.0) == 3.0
    assert retry_wait(Transient("HTTP 429", retry_after=60.0), 4.0) == 4.0
    assert retry_wait(Transient("HTTP 429", retry_after=0.0), 4.0) is True


# --- the loop itself ---------------------------------------------------------------------


def test_waits_double_with_jitter_up_to_the_cap_and_are_announced() -> None:
    told: list[tuple[int, str, float]] = []

    def down() -> None:
        raise ConnectionRefusedError("down")

    with pytest.raises(ConnectionRefusedError):
        retrying(down, 4, 0.02, 0.05,
                 on_retry=lambda n, exc, wait: told.append((n, type(exc).__name__, wait)))
    assert [(n, name) for n, name, _ in told] == [(i, "ConnectionRefusedError") for i in (1, 2, 3, 4)]
    waits = [w for *_, w in told]
    for n, wait in enumerate(waits, start=1):
        low = min(0.02 * 2 ** (n - 2), 0.05)
        assert low - 1e-6 <= wait <= min(low + 0.01, 0.05) + 1e-6


def test_in_testing_mode_nothing_waits_and_only_transient_faults_retry(no_waiting: None) -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise StoreUnavailableError("database is locked")
        return "done"

    started = time.monotonic()
    assert retrying(flaky, 3, 30.0, 30.0) == "done" and len(calls) == 3
    assert time.monotonic() - started < 1.0  # not the 30 s back-off

    calls.clear()

    def bug() -> None:
        calls.append(1)
        raise ValueError("bug")

    with pytest.raises(ValueError):
        retrying(bug, 3, 30.0, 30.0)
    assert len(calls) == 1


# --- the store's loop: a step under a real lock, seen in Prefect -------------------------


def _touch_profile(store: Store, args: StepArgs) -> StepReport:
    """A step writing one row: what a real step's write transaction meets."""
    with store.writing_all() as s:
        s.merge(Profile(id=args.profile, created_at=T0))
    return StepReport("touch", args.profile, examined=1, changed=1)


def _batch(store: Store) -> StepBatch:
    return StepBatch(store.url, ("p",), T0, ConsolidationConfig(), horizons=(0,))


def _release_after_first_announce(monkeypatch: pytest.MonkeyPatch, release) -> list[int]:  # type: ignore[no-untyped-def]
    """Let the real announcement run, then end the fault: the next attempt succeeds."""
    announced: list[int] = []
    real = step_module.announce_retry

    def announce(step: str, profile: str, attempt: int, exc: BaseException, wait: float,
                 store_url: str | None = None) -> None:
        real(step, profile, attempt, exc, wait, store_url)
        announced.append(attempt)
        release()

    monkeypatch.setattr(step_module, "announce_retry", announce)
    return announced


def _retry_events(flow_run_id: UUID) -> list:  # type: ignore[type-arg]
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter
    from prefect.events.worker import EventsWorker

    EventsWorker.drain_all(timeout=10)
    wanted = EventFilter(event=EventNameFilter(name=[STEP_RETRYING]),
                         related=EventRelatedFilter(id=[f"prefect.flow-run.{flow_run_id}"]))
    deadline = time.monotonic() + 15
    while True:
        with get_client(sync_client=True) as client:
            found = list(client.read_events(filter=wanted, limit=50).events)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.3)


@pytest.mark.skipif(bool(TEST_POSTGRES), reason="SQLite's write lock")
@pytest.mark.usefixtures("prefect_api", "no_waiting")
def test_a_step_under_a_sqlite_lock_is_retried_and_prefect_sees_the_retry(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect import flow
    from prefect.runtime import flow_run

    store.create()
    engine = engine_for(store.url)
    engine.dispose()

    @event.listens_for(engine, "connect")
    def _impatient(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
        dbapi_connection.execute("PRAGMA busy_timeout=50")  # not the store's 60 s

    holder = sqlite3.connect(store.url.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    announced = _release_after_first_announce(
        monkeypatch, lambda: holder.in_transaction and holder.execute("ROLLBACK"))

    @flow(name="retry-probe")
    def probe() -> tuple[str, list[StepReport]]:
        return flow_run.id, run_batch("touch", _touch_profile, _batch(store))

    try:
        run_id, (report,) = probe()
    finally:
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()
        event.remove(engine, "connect", _impatient)
        engine.dispose()
    assert announced == [1] and report.error is None and store.profiles() == ["p"]
    (retry,) = _retry_events(UUID(run_id))
    assert retry.resource.id == "reverie.profile.p"
    # Which store: the label automations match on (two stores may share profile names).
    assert retry.resource["reverie.store"] == store_id(store.url)
    assert f"reverie.store.{store_id(store.url)}" in [r.id for r in retry.related]
    assert retry.payload == {"step": "touch", "attempt": 1, "wait_seconds": 0.0,
                             "error": "StoreUnavailableError"}


@pytest.mark.skipif(not TEST_POSTGRES, reason="PostgreSQL's serialization failures")
@pytest.mark.usefixtures("no_waiting")
def test_a_step_meeting_a_postgres_serialization_failure_is_retried(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create()
    with store.writing_all() as s:
        s.add(Profile(id="p", created_at=T0))
    attempts: list[int] = []
    read, other_committed = threading.Event(), threading.Event()

    def other_writer() -> None:
        read.wait(10)
        with store.writing_all() as s:
            s.execute(update(Profile).where(Profile.id == "p").values(created_at=T0))
        other_committed.set()

    def serializable_step(store: Store, args: StepArgs) -> StepReport:
        attempts.append(1)
        with store.writing_all() as s:
            s.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
            s.execute(text("SELECT created_at FROM profile")).all()
            if len(attempts) == 1:  # another writer commits between our read and write
                read.set()
                other_committed.wait(10)
            s.execute(update(Profile).where(Profile.id == "p").values(created_at=T0))
        return StepReport("serial", args.profile, examined=1, changed=1)

    thread = threading.Thread(target=other_writer)
    thread.start()
    announced = _release_after_first_announce(monkeypatch, lambda: None)
    (report,) = run_batch("serial", serializable_step, _batch(store))
    thread.join()
    assert len(attempts) == 2 and announced == [1] and report.error is None


# --- the LLM client's loop: a real server saying 429 / 503, then answering ---------------


@pytest.mark.usefixtures("no_waiting")
@pytest.mark.parametrize("script", [["http-429"], ["http-503", "http-503"]])
def test_the_llm_client_retries_429_and_503_then_uses_the_answer(llm, script) -> None:  # type: ignore[no-untyped-def]
    from test_llm import FAITHFUL, MEMBERS

    llm.script = list(script)
    summarizer = LLMSummarizer()
    assert summarizer.merge(MEMBERS) == FAITHFUL
    assert len(llm.requests) == len(script) + 1 and summarizer.failures == []


@pytest.mark.usefixtures("no_waiting")
def test_the_llm_client_gives_up_after_its_retries(llm) -> None:  # type: ignore[no-untyped-def]
    from test_llm import MEMBERS

    llm.behaviour = "http-503"
    summarizer = LLMSummarizer()
    assert summarizer.compress(MEMBERS) is None
    assert summarizer.failures == ["compress: HTTP 503"]
    assert len(llm.requests) == 3  # REVERIE_LLM_RETRIES=2 in the fixture


# The command line's loop (`reverie events flush`) is exercised against a real outbox and
# a refusing, then answering, Prefect API in test_events.py.


def test_a_transient_error_class_is_what_the_loops_share() -> None:
    assert issubclass(Transient, TransientError) and not issubclass(Refused, TransientError)
