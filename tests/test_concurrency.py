"""At most one consolidation per profile at a time."""

from __future__ import annotations

import contextvars
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from reverie.deployments.serve import project_root, start_server, stop
from reverie.flows.lightweight_consolidation import lightweight_consolidation
from reverie.models.errors import StepFailedError
from reverie.models.store import Store
from reverie.runner.artifacts import markdown
from reverie.runner.profile_holds import (
    PREFECT_MIN_LEASE_SECONDS,
    ensure_profile_limits,
    limit_name,
)
from reverie.tasks import blocks

from conftest import prefect_home
from factories import acquire_leases, lease_holders, release_leases, renew_leases, run_history
from prefect_stack import free_port

AS_OF = datetime(2025, 7, 1)
# A store id for limits made without a store (any 32 hex digits).
STORE_ID = "0" * 32
T0 = datetime(2026, 1, 1)


def at_once(threads: int, call: Callable[[], object], timeout: float) -> list[BaseException]:
    """Run ``call`` in ``threads`` threads released together; the errors they raised."""
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def run() -> None:
        start.wait()
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            errors.append(exc)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=timeout)
    return errors


@pytest.fixture
def run_log() -> Iterator[list[str]]:
    """What flow runs log (Prefect's run loggers do not reach pytest's capture)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler, logger = Keep(logging.INFO), logging.getLogger("prefect.flow_runs")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def progress_descriptions() -> list[str]:
    """What the lightweight runs' progress artifacts say now."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["lightweight-consolidation-progress"])))
    return [a.description or "" for a in found]


def test_a_lease_is_exclusive_until_released_or_expired(store: Store) -> None:
    assert acquire_leases(store, ["a", "b"], "run-1", 60, at=T0) == ["a", "b"]
    assert acquire_leases(store, ["a"], "run-2", 60, at=T0) == []
    assert acquire_leases(store, ["a"], "run-1", 60, at=T0) == ["a"]  # already ours
    assert acquire_leases(store, ["a"], "run-2", 60, at=T0 + timedelta(seconds=61)) == ["a"]
    release_leases(store, ["a", "b"], "run-1")  # only what run-1 still holds
    assert lease_holders(store) == {"a": "run-2"}


@pytest.mark.usefixtures("prefect_api")
def test_a_busy_profile_is_skipped_when_so_configured(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REVERIE_BUSY_PROFILE", "skip")
    acquire_leases(sample_store, ["maya"], "someone-else", 600)
    report = lightweight_consolidation(profile=["maya", "raj"], as_of=AS_OF)
    assert report.skipped_profiles == ["maya"] and report.profiles == ["raj"]
    assert {s.profile for s in report.steps} == {"raj"}
    assert lease_holders(sample_store) == {"maya": "someone-else"}


@pytest.mark.usefixtures("prefect_api")
def test_a_busy_profile_is_waited_for_then_refused(
    sample_store: Store, run_log: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Long enough for several polls: on PostgreSQL under `make test`'s load, a wait of
    # 5 s once ended, refused, 7 s after it began with no poll between (the other
    # profile's chunk still running; CI of 2b96783), so no notice was said.
    monkeypatch.setenv("REVERIE_BUSY_WAIT_SECONDS", "10")
    # 30 s in production: the run must say it still waits at that pace, not once.
    monkeypatch.setattr("reverie.runner.waiting.NOTICE_SECONDS", 0.6)
    acquire_leases(sample_store, ["maya"], "someone-else", 600)
    with pytest.raises(StepFailedError, match="'maya' is busy \\(local run someone-else\\)"):
        lightweight_consolidation(profile=["maya", "raj"], as_of=AS_OF)
    # The other profile finished and is recorded; the busy one is not.
    assert [r.profile_id for r in run_history(sample_store)] == ["raj"]
    notices = [line for line in run_log if "waiting for 1 thing(s): profile maya, held by "
               "local run someone-else, for " in line]
    # Said again while it waited (first said when it began), never more than once a period.
    assert 2 <= len(notices) <= 10 / 0.6 + 1, run_log


def test_a_wait_notice_comes_at_most_once_a_period_and_names_the_longest_waits() -> None:
    from reverie.runner.waiting import WaitNotice, waiting_text

    now = [0.0]
    notice = WaitNotice("0" * 32, every=30.0, clock=lambda: now[0])
    waits = [(f"profile p{i}", "flow run x", float(i)) for i in range(7)]
    told = []
    for second in range(0, 95, 5):
        now[0] = float(second)
        told.append(notice.tell(waits))
    assert [i * 5 for i, t in enumerate(told) if t] == [0, 30, 60, 90]
    assert not notice.tell([])  # nothing waited for: nothing said
    text = waiting_text(waits)
    assert text.startswith("waiting for 7 thing(s): profile p6, held by flow run x, for 6 s")
    assert "p1," not in text and text.endswith("; and 2 more")


@pytest.mark.usefixtures("prefect_api")
def test_a_busy_profile_holds_up_no_other_and_its_wait_is_reported(
    sample_store: Store, run_log: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run works on the free profiles while it waits for a busy one, and holds each
    only while working on it: raj is given back while maya is still busy elsewhere."""
    busy_for = 6.0
    original = blocks.plan_blocks

    def slow(*args, **kwargs):  # type: ignore[no-untyped-def]
        # raj's hold must outlast a few of the watcher's samples: on a loaded machine
        # its steps took less than one sample's gap, and the test saw no hold at all.
        time.sleep(1.0)
        return original(*args, **kwargs)

    monkeypatch.setattr(blocks, "plan_blocks", slow)
    acquire_leases(sample_store, ["maya"], "someone-else", 600)
    samples: list[dict[str, str]] = []
    stop = threading.Event()

    progress: list[str] = []

    def watch() -> None:
        # The countdown starts when the run says it waits, not when the flow is called:
        # on a loaded CI host the flow took 2.5 s to get there, and the wait came out short.
        release_at: float | None = None
        released = False
        while not stop.is_set():
            if release_at is None and any("profile maya is busy" in line for line in run_log):
                release_at = time.monotonic() + busy_for
            if not released and release_at is not None and time.monotonic() >= release_at:
                progress.extend(progress_descriptions())
                release_leases(sample_store, ["maya"], "someone-else")
                released = True
            samples.append(lease_holders(sample_store))
            time.sleep(0.1)

    # Prefect's settings (the test API) are a context variable: the thread needs them.
    watcher = threading.Thread(target=contextvars.copy_context().run, args=(watch,))
    watcher.start()
    try:
        report = lightweight_consolidation(profile=["maya", "raj"], as_of=AS_OF)
    finally:
        stop.set()
        watcher.join()
    ours = {holder for s in samples for holder in s.values()} - {"someone-else"}
    raj_held = [i for i, s in enumerate(samples) if s.get("raj") in ours]
    assert raj_held, "the run never held raj"
    assert any(
        "raj" not in s and s.get("maya") == "someone-else" for s in samples[raj_held[-1]:]
    ), "raj stayed held while the run waited for maya"
    assert {s.profile for s in report.steps} == {"maya", "raj"} and not report.failed()
    assert busy_for - 1 <= report.waited["maya"] <= busy_for + 30
    assert "raj" not in report.waited
    assert any("profile maya is busy, held by local run someone-else" in line
               for line in run_log)
    assert "**Waited for busy profiles:** maya" in markdown(report)
    assert any("waiting for maya (held by local run someone-else)" in d for d in progress)
    assert lease_holders(sample_store) == {}


@pytest.mark.usefixtures("prefect_api")
def test_two_runs_for_one_profile_never_overlap(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = blocks.plan_blocks

    def slow(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(1.5)
        return original(*args, **kwargs)

    monkeypatch.setattr(blocks, "plan_blocks", slow)
    errors = at_once(2, lambda: lightweight_consolidation(profile="maya", as_of=AS_OF), 120)
    assert not errors
    first, second = sorted(run_history(sample_store), key=lambda r: r.started_at)
    assert first.finished_at <= second.started_at
    assert lease_holders(sample_store) == {}


@pytest.mark.usefixtures("prefect_api")
def test_a_skipped_profile_gives_its_prefect_slot_back(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client

    monkeypatch.setenv("REVERIE_BUSY_PROFILE", "skip")
    acquire_leases(sample_store, ["maya"], "someone-else", 600)
    lightweight_consolidation(profile="maya", as_of=AS_OF)
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(limit_name(sample_store.id, "maya"))
    assert limit.limit == 1 and limit.active_slots == 0


@pytest.mark.usefixtures("prefect_api")
def test_concurrent_first_runs_of_a_new_profile_never_fail_on_its_limit() -> None:
    """Prefect's upsert reads, then creates: first runs of a new profile racing between
    the two used to fail with ObjectAlreadyExists."""
    from prefect.client.orchestration import get_client

    for attempt in range(5):
        profile = f"newcomer-{attempt}"
        assert at_once(8, lambda p=profile: ensure_profile_limits(STORE_ID, [p]), 60) == []
        with get_client(sync_client=True) as client:
            limit = client.read_global_concurrency_limit_by_name(
                limit_name(STORE_ID, profile))
        assert limit.limit == 1


@pytest.mark.usefixtures("prefect_api")
def test_a_run_holds_its_profiles_prefect_slots_as_one_chunk_and_gives_them_back(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client

    profiles = sample_store.profiles()

    def active() -> dict[str, int]:
        with get_client(sync_client=True) as client:
            return {p: client.read_global_concurrency_limit_by_name(
                limit_name(sample_store.id, p)).active_slots for p in profiles}

    seen: list[dict[str, int]] = []
    original = blocks.plan_blocks

    def watched(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not seen:
            seen.append(active())
        return original(*args, **kwargs)

    monkeypatch.setattr(blocks, "plan_blocks", watched)
    lightweight_consolidation(profile=None, as_of=AS_OF)
    assert seen == [{p: 1 for p in profiles}]
    assert active() == {p: 0 for p in profiles}
    # While a profile is busy in Prefect, a run that skips busy profiles takes the rest.
    monkeypatch.setenv("REVERIE_BUSY_PROFILE", "skip")
    from prefect.concurrency.sync import concurrency

    with concurrency(limit_name(sample_store.id, "maya"), occupy=1, strict=True):
        report = lightweight_consolidation(profile=None, as_of=AS_OF)
    assert report.skipped_profiles == ["maya"]
    assert report.profiles == [p for p in profiles if p != "maya"]
    assert active() == {p: 0 for p in profiles}


@pytest.mark.usefixtures("prefect_api")
def test_a_long_run_renews_its_prefect_slots_against_its_own_api(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The heartbeat thread must talk to the API the run uses (a context setting, which a
    # plain new thread would not see: it tried to start a temporary server instead).
    from prefect.client.orchestration import get_client

    monkeypatch.setenv("REVERIE_LEASE_SECONDS", "1.5")
    renewed: list[object] = []
    real_renew = type(get_client(sync_client=True)).renew_concurrency_lease

    def renew(self, lease_id, lease_duration):  # type: ignore[no-untyped-def]
        renewed.append(self.api_url)
        return real_renew(self, lease_id, lease_duration)

    monkeypatch.setattr(type(get_client(sync_client=True)), "renew_concurrency_lease", renew)
    original = blocks.plan_blocks

    def slow(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(2.5)
        return original(*args, **kwargs)

    monkeypatch.setattr(blocks, "plan_blocks", slow)
    with get_client(sync_client=True) as client:
        api = client.api_url
    lightweight_consolidation(profile="maya", as_of=AS_OF)
    assert renewed and set(renewed) == {api}
    assert "could not renew" not in caplog.text


HOLD_AND_SLEEP = """
import sys, time
from reverie.runner.profile_holds import ProfileHolds
from reverie.models.store import Store
holds = ProfileHolds(Store(sys.argv[1]), "local-doomed", None, 5.0).__enter__()
holds.prepare(["maya"])
assert holds.take(["maya"]) == ["maya"]
print("held", flush=True)
time.sleep(600)
"""


def test_a_profile_held_by_a_run_killed_with_its_server_comes_free_within_a_lease(
    sample_store: Store, tmp_path: Path
) -> None:
    """A run and its Prefect server die together (SIGKILL) while the run holds maya's
    slot; the server comes back. Its limit still counts the dead run's slot, and the
    next run for maya starts once the dead run's lease has expired (Prefect's least
    lease, a minute, plus its repossessor's 15 s loop), not never."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    port, home, log = free_port(), prefect_home(tmp_path / "prefect"), tmp_path / "server.log"
    server = start_server(port, home, log)
    env = {**os.environ, "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "REVERIE_DATABASE_URL": sample_store.url, "REVERIE_LEASE_SECONDS": "5",
           "REVERIE_BUSY_WAIT_SECONDS": "300"}
    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_SLEEP, sample_store.url],
                              env=env, cwd=project_root(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        holder.kill()
        server.kill()
        killed = time.monotonic()
        holder.wait()
        server.wait()
        server = start_server(port, home, log)
        with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}), \
                get_client(sync_client=True) as client:
            assert client.read_global_concurrency_limit_by_name(
                limit_name(sample_store.id, "maya")).active_slots == 1
        done = subprocess.run(
            [sys.executable, "-m", "reverie.deployments.cli", "consolidate", "lightweight", "--profile", "maya",
             "--as-of", "2025-07-01"],
            env=env, cwd=project_root(), capture_output=True, text=True, timeout=400,
        )
        waited = time.monotonic() - killed
    finally:
        holder.kill()
        stop([server])
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r.profile_id for r in run_history(sample_store)] == ["maya"]
    # It did wait for the dead run's lease (renewed at most 5/3 s before the kill)...
    assert waited >= PREFECT_MIN_LEASE_SECONDS - 5
    # ...and no longer than the lease, the repossessor's loop and the run's own work.
    assert waited <= PREFECT_MIN_LEASE_SECONDS + 15 + 90


def test_a_lease_left_to_expire_names_its_holder_until_taken_over(store: Store) -> None:
    """What marks a killed run Crashed (runner.profile_holds.mark_crashed): a lease is
    given back as its run ends, so one left to expire was held by a run now gone."""
    from reverie.models.repositories.runs import expired_leases

    acquire_leases(store, ["a", "b"], "run-1", 60, at=T0)
    acquire_leases(store, ["c"], "run-3", 600, at=T0)
    release_leases(store, ["b"], "run-1")

    def expired(at: datetime, holder: str = "run-2") -> dict[str, str]:
        with store.reading_all() as s:
            return expired_leases(s, ["a", "b", "c", "d"], holder, at)

    assert expired(T0 + timedelta(seconds=59)) == {}
    assert expired(T0 + timedelta(seconds=60)) == {"a": "run-1"}  # as acquire takes it
    assert expired(T0 + timedelta(seconds=60), holder="run-1") == {}  # its own
    assert acquire_leases(store, ["a"], "run-2", 60, at=T0 + timedelta(seconds=60)) == ["a"]
    assert expired(T0 + timedelta(seconds=60)) == {}


def test_a_renewal_never_takes_back_a_lease_given_back(store: Store) -> None:
    assert acquire_leases(store, ["a", "b"], "run-1", 60, at=T0) == ["a", "b"]
    release_leases(store, ["a"], "run-1")
    assert renew_leases(store, ["a", "b"], "run-1", 60, at=T0) == ["b"]
    assert lease_holders(store) == {"b": "run-1"}
    assert renew_leases(store, ["b"], "run-2", 60, at=T0) == []  # not its lease


@pytest.mark.usefixtures("prefect_api")
def test_two_stores_profiles_of_one_name_never_wait_for_each_other(
    new_store: Callable[[str], Store]
) -> None:
    """Two tenants' stores on one Prefect, each with a profile called ``twin``: each
    store's run holds its own ``twin``, the other store's run is not held up by it,
    while a second run of the same store still is."""
    from prefect.client.orchestration import get_client

    from reverie.runner.profile_holds import ProfileHolds

    one, other = new_store("tenant-one"), new_store("tenant-two")
    assert one.id != other.id
    with ProfileHolds(one, "run-one", None, 60.0) as first, \
            ProfileHolds(other, "run-two", None, 60.0) as second, \
            ProfileHolds(one, "run-three", None, 60.0) as third:
        for holds in (first, second, third):
            holds.prepare(["twin"])
        assert first.take(["twin"]) == ["twin"]
        assert second.take(["twin"]) == ["twin"]
        assert third.take(["twin"]) == []  # same store, same profile: busy
        with get_client(sync_client=True) as client:
            slots = [client.read_global_concurrency_limit_by_name(
                limit_name(s.id, "twin")).active_slots for s in (one, other)]
        assert slots == [1, 1]


@pytest.mark.usefixtures("prefect_api")
def test_a_lease_taken_for_several_chunks_is_given_back_with_the_last(store: Store) -> None:
    """Profiles taken together (one Prefect lease) but worked on in two chunks: the
    slots come free once both chunks are given back, and none outlives the run."""
    from prefect.client.orchestration import get_client

    from reverie.runner.profile_holds import ProfileHolds

    profiles = [f"split-{i}" for i in range(4)]

    def active() -> list[int]:
        with get_client(sync_client=True) as client:
            return [client.read_global_concurrency_limit_by_name(
                limit_name(store.id, p)).active_slots for p in profiles]

    with ProfileHolds(store, "run-split", None, 60.0) as holds:
        holds.prepare(profiles)
        assert holds.take(profiles) == profiles
        assert active() == [1, 1, 1, 1]
        holds.release(profiles[:2])
        assert active() == [1, 1, 1, 1]  # one lease: its slots go together
        holds.release(profiles[2:])
        assert active() == [0, 0, 0, 0]
        assert holds.take(profiles[:1]) == profiles[:1]
    assert active() == [0, 0, 0, 0] and lease_holders(store) == {}


@pytest.mark.usefixtures("prefect_api")
def test_a_replay_waiting_for_its_turn_says_so_in_its_log_and_in_an_event(
    sample_store: Store, run_log: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another replay of maya has the turn (its lease): this one waits, says so at once
    and again while it waits (log line and ``reverie.run.waiting`` event on its run),
    then runs once the turn is given back."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter

    from reverie.orchestration.replay import replay, turn_key
    from reverie.runner.waiting import WAITING_EVENT

    monkeypatch.setattr("reverie.orchestration.replay.TURN_POLL_SECONDS", 0.2)
    monkeypatch.setattr("reverie.runner.waiting.NOTICE_SECONDS", 0.5)
    acquire_leases(sample_store, [turn_key("maya")], "someone-else", 600)
    since = datetime.now(tz=None).astimezone()
    done: list[object] = []
    runner = threading.Thread(target=contextvars.copy_context().run, args=(
        lambda: done.append(replay(flow="decay", profile="maya", dates=[AS_OF])),))
    runner.start()
    said = "its turn to replay maya's history, held by local run someone-else"
    deadline = time.monotonic() + 120
    while sum(said in line for line in run_log) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not done, "it ran while another replay had the turn"
    release_leases(sample_store, [turn_key("maya")], "someone-else")
    runner.join(120)
    assert done and done[0].ran == [f"decay {AS_OF.isoformat()}"]  # type: ignore[attr-defined]
    assert sum(said in line for line in run_log) >= 2
    wanted = EventFilter(occurred=EventOccurredFilter(since=since - timedelta(minutes=1)),
                         event=EventNameFilter(name=[WAITING_EVENT]))
    found: list[object] = []
    deadline = time.monotonic() + 60
    while not found and time.monotonic() < deadline:
        with get_client(sync_client=True) as client:
            found = [e for e in client.read_events(filter=wanted, limit=50).events
                     if said in e.payload.get("text", "")
                     and e.related and e.related[0].id == f"reverie.store.{sample_store.id}"]
        time.sleep(0.5)
    assert found, "no reverie.run.waiting event reached Prefect"
