"""What every flow does before and after its tasks: resolve its parameters, pick the
store it works on, name the run, and collect the steps' reports.

A dry run works on a scratch copy of the selected profiles, made afresh for the run
and deleted after it: the real steps run with their real selection code and see
each other's effects exactly as in a real run, and the real store is never written.
"""

from __future__ import annotations

import contextvars
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

from prefect import Flow, flow
from prefect.futures import PrefectFuture
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from models.config import ConsolidationConfig
from models.db import copy_profiles, dispose
from models.errors import StepFailedError, StoreError
from models.events import api_configured
from models.settings import Settings, get_settings
from models.store import Store
from models.tables import RunRecord
from models.timestamps import iso, to_utc_naive, utcnow
from tasks.step import StepBatch, StepReport

log = logging.getLogger(__name__)

ProfileSelector = str | list[str] | None
BUSY_POLL_SECONDS = 1.0
PROFILE_LIMIT_PREFIX = "reverie-profile-"
# Profiles a run tries to take in one go (one Prefect request, one transaction).
HOLD_CHUNK = 100
PREFECT_MIN_LEASE_SECONDS = 60.0
LIMITS_PAGE = 200
# How long a run without a configured API waits for Prefect's temporary server to record
# its task runs before the process exits (see wait_for_run_history).
HISTORY_WAIT_SECONDS = 15.0
HISTORY_POLL_SECONDS = 0.5
HISTORY_PAGE = 200


@dataclass
class RunPlan:
    flow: str
    profiles: list[str]
    as_of: datetime
    dry_run: bool
    config: ConsolidationConfig
    store_url: str
    run_id: str | None


@dataclass
class RunReport:
    flow: str
    profiles: list[str]
    as_of: str
    dry_run: bool
    run_id: str | None
    steps: list[StepReport] = field(default_factory=list)
    # Profiles another run was consolidating, skipped (REVERIE_BUSY_PROFILE=skip).
    skipped_profiles: list[str] = field(default_factory=list)

    def comparable(self) -> list[dict[str, Any]]:
        """The steps' reports without timings: what a dry run promises the real run does."""
        return [s.comparable() for s in self.steps]

    def changed(self) -> int:
        return sum(s.changed for s in self.steps)

    def failed(self) -> dict[str, list[str]]:
        """Profiles with a step that failed, and each failure ("step: error")."""
        failed: dict[str, list[str]] = {}
        for s in self.steps:
            if s.error is not None:
                failed.setdefault(s.profile, []).append(f"{s.step}: {s.error}")
        return failed


def prepare_run(
    flow: str,
    profile: ProfileSelector,
    as_of: datetime | None,
    dry_run: bool,
    config: ConsolidationConfig | None,
) -> RunPlan:
    """Resolve a flow's parameters. ``as_of`` defaults to the run's scheduled start, so a
    scheduled or backfilled run replays its own date."""
    settings = get_settings()
    store = Store(settings=settings)
    return RunPlan(
        flow=flow,
        profiles=store.resolve_profiles(profile),
        as_of=to_utc_naive(as_of) if as_of is not None else _scheduled_start(),
        dry_run=dry_run,
        config=config or settings.consolidation_config(),
        store_url=store.url,
        run_id=_flow_run_id(),
    )


@contextmanager
def working_store(plan: RunPlan) -> Iterator[str]:
    """The URL the steps write to: the real store, or for a dry run a scratch copy."""
    if not plan.dry_run:
        yield plan.store_url
        return
    folder = Path(tempfile.mkdtemp(prefix="reverie-dry-run-"))
    url = f"sqlite:///{folder / 'scratch.db'}"
    try:
        copy_profiles(plan.store_url, url, plan.profiles)
        yield url
    finally:
        dispose(url)
        shutil.rmtree(folder, ignore_errors=True)


def task_runner() -> TaskRunner:  # type: ignore[type-arg]
    """The task runner flows use (``REVERIE_TASK_RUNNER``): ``REVERIE_TASK_THREADS``
    threads in the flow's process, or Dask: the scheduler at ``REVERIE_DASK_ADDRESS``, else a local cluster of
    ``REVERIE_DASK_WORKERS`` processes started for the run."""
    settings = get_settings()
    if settings.task_runner == "dask":
        from prefect_dask import DaskTaskRunner

        if settings.dask_address:
            return DaskTaskRunner(address=settings.dask_address)
        return DaskTaskRunner(
            cluster_kwargs={"n_workers": settings.dask_workers, "threads_per_worker": 1}
        )
    return ThreadPoolTaskRunner(max_workers=settings.task_threads)


def reverie_flow(name: str) -> Callable[[Callable[..., RunReport]], Flow[..., RunReport]]:
    """Declare a Reverie flow: runs named by ``run_name``, prints not captured (they
    could carry memory content), tasks on the configured ``task_runner``."""
    return flow(
        name=name, flow_run_name=run_name(name), log_prints=False, task_runner=task_runner()
    )


def run_name(flow: str) -> Callable[[], str]:
    """A flow-run namer for Prefect: flow, profiles, as_of, and whether it is a dry run."""

    def name() -> str:
        from prefect.runtime import flow_run

        params = flow_run.parameters
        profile = params.get("profile")
        if profile is None:
            who = "all profiles"
        elif isinstance(profile, str):
            who = profile
        else:
            who = ", ".join(profile[:3]) + (f" +{len(profile) - 3}" if len(profile) > 3 else "")
        # Without an as_of the run acts as of its scheduled start: name it so.
        when = params.get("as_of") or flow_run.scheduled_start_time
        when_text = str(when)[:19]
        suffix = " (dry run)" if params.get("dry_run") else ""
        return f"{flow} | {who} | as of {when_text}{suffix}"

    return name


def _scheduled_start() -> datetime:
    try:
        from prefect.runtime import flow_run

        start = flow_run.scheduled_start_time
        if not isinstance(start, datetime):
            start = datetime.fromisoformat(str(start).replace("Z", "+00:00"))
        return to_utc_naive(start)
    except Exception:
        return utcnow()


def _flow_run_id() -> str | None:
    try:
        from prefect.runtime import flow_run

        return flow_run.id
    except Exception:
        return None


def wait_for_run_history(run_id: str | None, timeout: float = HISTORY_WAIT_SECONDS) -> bool:
    """Wait until Prefect's temporary server has recorded every task run of ``run_id``.

    Without a configured API a flow runs against a temporary server that lives only as
    long as this process. Task runs reach it as client events, written one at a time;
    when the process exits, the server cancels the writes still queued, which loses the
    last task runs of the history and prints a traceback. So a local run sends its
    events now and waits (at most ``timeout``) until the run's task runs are all final
    and their number has stopped growing. With a configured API it returns at once: a
    real server keeps what it has received. True when the history settled in time.
    """
    if run_id is None or api_configured():
        return True
    from prefect.client.orchestration import get_client
    from prefect.events.worker import EventsWorker

    EventsWorker.drain_all(timeout=timeout, at_exit=False)
    deadline = time.monotonic() + timeout
    seen = -1
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            runs = recorded_task_runs(client, run_id)
            if len(runs) == seen and all(r.state and r.state.is_final() for r in runs):
                return True
            seen = len(runs)
            time.sleep(HISTORY_POLL_SECONDS)
    log.warning("run %s: Prefect had not recorded all task runs after %.0f s", run_id, timeout)
    return False


def recorded_task_runs(client: Any, run_id: str) -> list[Any]:
    """Every task run Prefect has recorded so far for flow run ``run_id``, page by page
    (``client``: a sync Prefect client)."""
    from uuid import UUID

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    of_run = FlowRunFilter(id=FlowRunFilterId(any_=[UUID(run_id)]))
    runs: list[Any] = []
    while True:
        page = client.read_task_runs(flow_run_filter=of_run, limit=HISTORY_PAGE, offset=len(runs))
        runs += page
        if len(page) < HISTORY_PAGE:
            return runs


ProfileDag = Callable[[StepBatch], list[PrefectFuture[list[StepReport]]]]


def run_for_profiles(
    flow: str,
    profile: ProfileSelector,
    as_of: datetime | None,
    dry_run: bool,
    config: ConsolidationConfig | None,
    dag: ProfileDag,
) -> RunReport:
    """Resolve a flow's parameters, submit ``dag`` for every chunk of the selected
    profiles (chunks run side by side), collect the steps' reports and publish them as
    artifacts. Profiles whose steps all succeeded are recorded as done; if any failed,
    the run fails at the end, naming them, after the others have finished."""
    from flows.artifacts import publish

    plan = prepare_run(flow, profile, as_of, dry_run, config)
    report = RunReport(plan.flow, plan.profiles, iso(plan.as_of) or "", plan.dry_run, plan.run_id)
    with holding(plan) as profiles, working_store(plan) as url:
        started = utcnow()
        report.profiles = profiles
        report.skipped_profiles = sorted(set(plan.profiles) - set(profiles))
        batches = [
            StepBatch(url, chunk, plan.as_of, plan.config, plan.run_id)
            for chunk in chunked(profiles, get_settings().profiles_per_task)
        ]
        dags = [dag(batch) for batch in batches]
        follow_progress(report, [future for futures in dags for future in futures])
        report.steps = [
            step for batch, futures in zip(batches, dags)
            for step in by_profile(batch, [f.result() for f in futures])
        ]
        if not plan.dry_run:
            Store(plan.store_url).record_runs(history(report, plan.as_of, started, utcnow()))
    publish(report)
    failed = report.failed()
    if failed:
        raise StepFailedError(failed)
    return report


def chunked(profiles: list[str], size: int) -> list[tuple[str, ...]]:
    """Profiles in chunks of at most ``size``, spread evenly (2,001 profiles in chunks of
    50 make 41 chunks of 48-49, not 40 of 50 and one of 1)."""
    if not profiles:
        return []
    count = -(-len(profiles) // size)
    per, extra = divmod(len(profiles), count)
    chunks, start = [], 0
    for i in range(count):
        end = start + per + (1 if i < extra else 0)
        chunks.append(tuple(profiles[start:end]))
        start = end
    return chunks


def by_profile(batch: StepBatch, results: list[list[StepReport]]) -> list[StepReport]:
    """A chunk's reports in the order one profile at a time would give them: each
    profile's steps, in the order the DAG lists them."""
    return [reports[i] for i in range(len(batch.profiles)) for reports in results]


def follow_progress(
    report: RunReport, futures: list[PrefectFuture[list[StepReport]]]
) -> None:
    """Keep a progress artifact (steps finished out of all) while a Prefect run goes on."""
    if report.run_id is None or not futures:
        return
    from prefect.artifacts import create_progress_artifact, update_progress_artifact
    from prefect.futures import as_completed

    from flows.artifacts import artifact_key

    artifact_id = create_progress_artifact(
        0.0, key=artifact_key(report, "progress"),
        description=f"{report.flow}: task runs finished for {len(report.profiles)} profile(s)",
    )
    shown = 0.0
    for done, _ in enumerate(as_completed(futures), start=1):
        progress = round(100.0 * done / len(futures), 1)
        # At most ~100 updates, however many task runs: each is an API call.
        if progress - shown >= 1.0 or done == len(futures):
            update_progress_artifact(artifact_id, progress)
            shown = progress


@contextmanager
def holding(plan: RunPlan) -> Iterator[list[str]]:
    """Hold the run's profiles, so that no other run consolidates them meanwhile; yields
    the profiles held. Two guards: a Prefect global concurrency limit per profile
    (``reverie-profile-<name>``, limit 1) when a Prefect API is configured, and a lease
    in the store for runs outside Prefect. Profiles are taken one by one in name order
    (ordered locking cannot deadlock). A busy profile is waited for, or skipped, as
    ``REVERIE_BUSY_PROFILE`` says. A dry run writes nothing and holds nothing."""
    if plan.dry_run:
        yield plan.profiles
        return
    settings = get_settings()
    store = Store(plan.store_url)
    holder = plan.run_id or f"local-{uuid4()}"
    deadline = time.monotonic() + settings.busy_wait_seconds
    held: list[str] = []
    prefect_leases: list[UUID] = []
    stop = threading.Event()
    # The heartbeat runs in this context: Prefect's settings (the API it talks to) live
    # in a context variable, which a new thread would not see.
    heartbeat = threading.Thread(
        target=contextvars.copy_context().run,
        args=(_renew, store, held, prefect_leases, holder, settings.lease_seconds, stop),
        daemon=True,
    )
    with ExitStack() as slots:
        try:
            heartbeat.start()
            if api_configured():
                ensure_profile_limits(plan.profiles)
            for chunk in chunked(sorted(plan.profiles), HOLD_CHUNK):
                if _take_chunk(chunk, store, holder, slots, settings, plan.run_id, prefect_leases):
                    held.extend(chunk)
                    continue
                for profile in chunk:
                    if _take(profile, store, holder, slots, settings, deadline):
                        held.append(profile)
            yield held
        finally:
            stop.set()
            heartbeat.join()
            if held:
                store.release_leases(held, holder)


def _renew(
    store: Store, held: list[str], prefect_leases: list[UUID], holder: str, seconds: float,
    stop: threading.Event,
) -> None:
    """Keep renewing the run's leases (the store's, and Prefect's for chunks) while it
    lives: a killed run stops renewing, and its profiles come free within ``seconds``."""
    while not stop.wait(seconds / 3):
        try:
            if held:
                store.acquire_leases(list(held), holder, seconds)
            if prefect_leases:
                from prefect.client.orchestration import get_client

                with get_client(sync_client=True) as client:
                    for lease in list(prefect_leases):
                        client.renew_concurrency_lease(lease, _prefect_lease(seconds))
        except Exception as exc:  # noqa: BLE001 - a missed beat is retried
            log.warning("could not renew the profile leases: %s", exc)


def _prefect_lease(seconds: float) -> float:
    """Prefect refuses leases shorter than a minute."""
    return max(seconds, PREFECT_MIN_LEASE_SECONDS)


def _prefect_chunk_lease(
    chunk: tuple[str, ...], run_id: str | None, seconds: float
) -> UUID | None:
    """Occupy the slots of a chunk's profiles in one request, without waiting; the
    lease, or None if any is busy. Straight through the client, not Prefect's
    ``concurrency()``: that emits an event per limit naming every other limit of the
    request (a hundred profiles make ten thousand related resources), which loads the
    server more than the runs do."""
    import httpx
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import ConcurrencyLeaseHolder

    names = [f"{PROFILE_LIMIT_PREFIX}{p}" for p in chunk]
    holder = ConcurrencyLeaseHolder(type="flow_run", id=UUID(run_id)) if run_id else None
    with get_client(sync_client=True) as client:
        try:
            answer = client.increment_concurrency_slots_with_lease(
                names, 1, "concurrency", seconds, holder=holder).json()
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 423:  # some profile is busy
                return None
            raise
        lease = UUID(answer["lease_id"])
        if len(answer.get("limits", [])) < len(names):
            # A limit is missing (made meanwhile by no one): the one-by-one path makes it.
            client.release_concurrency_slots_with_lease(lease)
            return None
    return lease


def _release_prefect_lease(lease: UUID, prefect_leases: list[UUID]) -> None:
    from prefect.client.orchestration import get_client

    prefect_leases.remove(lease)
    try:
        with get_client(sync_client=True) as client:
            client.release_concurrency_slots_with_lease(lease)
    except Exception as exc:  # noqa: BLE001 - the lease expires on its own
        log.warning("could not release a chunk's Prefect slots (they free themselves "
                    "when the lease expires): %s", exc)


def _take_chunk(
    chunk: tuple[str, ...], store: Store, holder: str, slots: ExitStack, settings: Settings,
    run_id: str | None, prefect_leases: list[UUID],
) -> bool:
    """Take a whole chunk of profiles at once, without waiting: one Prefect request for
    their slots (all or none) and one transaction for their leases. False, holding
    none of them, if any is busy: the caller then takes them one by one, in order, so
    a waiting run never holds a profile after the one it waits for (no deadlock)."""
    with ExitStack() as attempt:
        if api_configured():
            lease = _prefect_chunk_lease(chunk, run_id, _prefect_lease(settings.lease_seconds))
            if lease is None:
                return False
            prefect_leases.append(lease)
            attempt.callback(_release_prefect_lease, lease, prefect_leases)
        taken = store.acquire_leases(list(chunk), holder, settings.lease_seconds)
        if len(taken) < len(chunk):
            if taken:
                store.release_leases(taken, holder)
            return False
        slots.enter_context(attempt.pop_all())
    return True


def _take(
    profile: str,
    store: Store,
    holder: str,
    slots: ExitStack,
    settings: Settings,
    deadline: float,
) -> bool:
    """Take one profile through both guards; False if busy and busy profiles are skipped.
    A profile not taken keeps nothing: its Prefect slot, if occupied, is given back."""
    skip = settings.busy_profile == "skip"
    with ExitStack() as attempt:
        if api_configured() and not _prefect_slot(profile, attempt, skip, deadline):
            return False
        while not store.acquire_leases([profile], holder, settings.lease_seconds):
            if skip:
                return False
            if time.monotonic() >= deadline:
                owner = store.lease_holders().get(profile, "another run")
                raise StoreError(
                    f"profile {profile!r} is busy ({owner}) for more than "
                    f"{settings.busy_wait_seconds:g} s (REVERIE_BUSY_WAIT_SECONDS)"
                )
            time.sleep(BUSY_POLL_SECONDS)
        slots.enter_context(attempt.pop_all())
    return True


def ensure_profile_limit(profile: str) -> str:
    """Create the profile's Prefect concurrency limit (one slot) if it is missing; returns
    its name. Prefect's upsert reads, then creates: concurrent first runs of a new
    profile race between the two, and the losers' create is refused."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectAlreadyExists

    name = f"{PROFILE_LIMIT_PREFIX}{profile}"
    with get_client(sync_client=True) as client:
        try:
            client.upsert_global_concurrency_limit_by_name(name, limit=1)
        except ObjectAlreadyExists:
            pass  # another run made it between our read and our create: same limit
    return name


def ensure_profile_limits(profiles: list[str]) -> None:
    """Create the Prefect concurrency limits missing among ``profiles``' (one read of
    the existing limits, page by page, then one request per new profile): a chunk's
    slots are then taken in one request, which would silently leave out a missing
    limit."""
    from prefect.client.orchestration import get_client

    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists

    wanted = {f"{PROFILE_LIMIT_PREFIX}{p}" for p in profiles}
    existing: set[str] = set()
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_global_concurrency_limits(limit=LIMITS_PAGE, offset=len(existing))
            existing.update(limit.name for limit in page)
            if len(page) < LIMITS_PAGE:
                break
        for name in sorted(wanted - existing):
            try:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=1))
            except ObjectAlreadyExists:
                pass  # another run made it since our read: same limit


def _prefect_slot(profile: str, slots: ExitStack, skip: bool, deadline: float) -> bool:
    """Occupy the profile's Prefect concurrency slot for the rest of the run."""
    from prefect.concurrency.asyncio import (
        AcquireConcurrencySlotTimeoutError,
        ConcurrencySlotAcquisitionError,
    )
    from prefect.concurrency.sync import concurrency

    name = ensure_profile_limit(profile)
    wait = {"max_retries": 0} if skip else {
        "timeout_seconds": max(deadline - time.monotonic(), 1.0)}
    try:
        slots.enter_context(concurrency(name, occupy=1, strict=True, **wait))
    except (ConcurrencySlotAcquisitionError, AcquireConcurrencySlotTimeoutError) as exc:
        if skip:
            return False
        raise StoreError(f"profile {profile!r} is busy in another Prefect run: {exc}") from None
    return True


def history(
    report: RunReport, as_of: datetime, started: datetime, finished: datetime
) -> list[RunRecord]:
    """One history row per profile the run finished: what ``reverie status`` shows, and
    what a backfill's resume reads. A profile with a failed step gets none, so a
    re-run or a resumed backfill takes it again."""
    by: dict[str, list[StepReport]] = {}
    for s in report.steps:
        by.setdefault(s.profile, []).append(s)
    failed = report.failed()
    return [
        RunRecord(
            profile_id=profile, flow=report.flow, run_id=report.run_id, as_of=as_of,
            started_at=started, finished_at=finished,
            examined=sum(s.examined for s in steps), changed=sum(s.changed for s in steps),
            seconds=round(sum(s.seconds for s in steps), 4),
            summary={s.step: {"changed": s.changed, "notes": s.notes} for s in steps},
        )
        for profile in report.profiles if profile not in failed
        for steps in [by.get(profile, [])]
    ]
