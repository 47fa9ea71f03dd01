"""At most one consolidation per profile at a time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from flows.lightweight_consolidation import lightweight_consolidation
from flows.run import ensure_profile_limit
from models.errors import StoreError
from models.store import Store
from tasks import blocks

AS_OF = datetime(2025, 7, 1)
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


def test_a_lease_is_exclusive_until_released_or_expired(store: Store) -> None:
    assert store.acquire_leases(["a", "b"], "run-1", 60, at=T0) == ["a", "b"]
    assert store.acquire_leases(["a"], "run-2", 60, at=T0) == []
    assert store.acquire_leases(["a"], "run-1", 60, at=T0) == ["a"]  # already ours
    assert store.acquire_leases(["a"], "run-2", 60, at=T0 + timedelta(seconds=61)) == ["a"]
    store.release_leases(["a", "b"], "run-1")  # only what run-1 still holds
    assert store.lease_holders() == {"a": "run-2"}


@pytest.mark.usefixtures("prefect_api")
def test_a_busy_profile_is_skipped_when_so_configured(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REVERIE_BUSY_PROFILE", "skip")
    sample_store.acquire_leases(["maya"], "someone-else", 600)
    report = lightweight_consolidation(profile=["maya", "raj"], as_of=AS_OF)
    assert report.skipped_profiles == ["maya"] and report.profiles == ["raj"]
    assert {s.profile for s in report.steps} == {"raj"}
    assert sample_store.lease_holders() == {"maya": "someone-else"}


@pytest.mark.usefixtures("prefect_api")
def test_a_busy_profile_is_waited_for_then_refused(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REVERIE_BUSY_WAIT_SECONDS", "1.5")
    sample_store.acquire_leases(["maya"], "someone-else", 600)
    with pytest.raises(StoreError, match="'maya' is busy \\(someone-else\\)"):
        lightweight_consolidation(profile="maya", as_of=AS_OF)
    assert sample_store.run_history() == []


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
    first, second = sorted(sample_store.run_history(), key=lambda r: r.started_at)
    assert first.finished_at <= second.started_at
    assert sample_store.lease_holders() == {}


@pytest.mark.usefixtures("prefect_api")
def test_a_skipped_profile_gives_its_prefect_slot_back(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client

    monkeypatch.setenv("REVERIE_BUSY_PROFILE", "skip")
    sample_store.acquire_leases(["maya"], "someone-else", 600)
    lightweight_consolidation(profile="maya", as_of=AS_OF)
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name("reverie-profile-maya")
    assert limit.limit == 1 and limit.active_slots == 0


@pytest.mark.usefixtures("prefect_api")
def test_concurrent_first_runs_of_a_new_profile_never_fail_on_its_limit() -> None:
    """Prefect's upsert reads, then creates: first runs of a new profile racing between
    the two used to fail with ObjectAlreadyExists."""
    from prefect.client.orchestration import get_client

    for attempt in range(5):
        profile = f"newcomer-{attempt}"
        assert at_once(8, lambda p=profile: ensure_profile_limit(p), 60) == []
        with get_client(sync_client=True) as client:
            limit = client.read_global_concurrency_limit_by_name(f"reverie-profile-{profile}")
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
                f"reverie-profile-{p}").active_slots for p in profiles}

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

    with concurrency("reverie-profile-maya", occupy=1, strict=True):
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
