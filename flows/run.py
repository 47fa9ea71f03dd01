"""What every flow does before and after its tasks: resolve its parameters, pick the
store it works on, name the run, and collect the steps' reports.

A dry run works on a scratch copy of the selected profiles, made afresh for the run
and deleted after it: the real steps run with their real selection code and see
each other's effects exactly as in a real run, and the real store is never written.
"""

from __future__ import annotations

import logging
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID, uuid4

from prefect import Flow, flow
from prefect.futures import PrefectFuture
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from reverie.flows.parameters import documented
from reverie.flows.profile_holds import ProfileHolds
from reverie.models.config import ConsolidationConfig
from reverie.models.db import copy_profiles, dispose
from reverie.models.errors import StepFailedError
from reverie.models.events import api_configured
from reverie.models.settings import get_settings
from reverie.models.store import Store
from reverie.models.tables import RunRecord
from reverie.models.timestamps import iso, to_utc_naive, utcnow
from reverie.models.transient import retrying
from reverie.tasks.step import (
    STEP_RETRIES,
    STEP_RETRY_CAP_SECONDS,
    STEP_RETRY_FIRST_SECONDS,
    StepBatch,
    StepReport,
)

if TYPE_CHECKING:
    from reverie.deployments.progress import Bar

log = logging.getLogger(__name__)

ProfileSelector = str | list[str] | None
BUSY_POLL_SECONDS = 1.0
# A run whose store does not answer at its start tries again after ~2, 4, 8, 16, 30,
# 30 s (jittered): about a minute and a half for a database to come back.
RUN_START_RETRIES = 6
RUN_START_FIRST_SECONDS = 2.0
RUN_START_CAP_SECONDS = 30.0
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
    # Profiles another run was consolidating, and how long this run waited for each.
    waited: dict[str, float] = field(default_factory=dict)
    # When the run took each profile and gave it back: its history row's times.
    spans: dict[str, tuple[datetime, datetime]] = field(default_factory=dict)

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

    def open_store() -> tuple[Store, list[str]]:
        store = Store(settings=settings)
        return store, store.resolve_profiles(profile)

    # A store that is down or restarting when the run starts is waited for here, with
    # backoff, instead of failing the run before any task: the run's own retry.
    store, profiles = retrying(
        open_store, RUN_START_RETRIES, RUN_START_FIRST_SECONDS, RUN_START_CAP_SECONDS,
        on_retry=lambda n, exc, wait: run_logger().warning(
            "the store is not answering (%s); trying again in %.0f s (%d of %d)",
            type(exc).__name__, wait, n, RUN_START_RETRIES),
    )
    return RunPlan(
        flow=flow,
        profiles=profiles,
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
    could carry memory content), tasks on the configured ``task_runner``, parameters
    described in Prefect's form (``documented``)."""
    def declare(fn: Callable[..., RunReport]) -> Flow[..., RunReport]:
        return flow(
            name=name, flow_run_name=run_name(name), log_prints=False,
            task_runner=task_runner(),
        )(documented(fn))

    return declare


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
    """Resolve a flow's parameters, run ``dag`` for the selected profiles chunk by
    chunk (chunks run side by side), collect the steps' reports and publish them as
    artifacts. Profiles whose steps all succeeded are recorded as done; if any failed,
    the run fails at the end, naming them, after the others have finished."""
    from reverie.flows.artifacts import publish

    plan = prepare_run(flow, profile, as_of, dry_run, config)
    report = RunReport(plan.flow, plan.profiles, iso(plan.as_of) or "", plan.dry_run, plan.run_id)
    with working_store(plan) as url:
        started = utcnow()
        ChunkScheduler(plan, url, dag, report).run()
        if not plan.dry_run:
            rows = history(report, plan.as_of, started, utcnow())
            retrying(lambda: Store(plan.store_url).record_runs(rows), STEP_RETRIES,
                     STEP_RETRY_FIRST_SECONDS, STEP_RETRY_CAP_SECONDS)
    publish(report, _user_ids(plan.store_url, report))
    failed = report.failed()
    if failed:
        raise StepFailedError(failed)
    return report


def _user_ids(store_url: str, report: RunReport) -> dict[str, str]:
    """The ids users gave the memories the run's artifacts name (read from the real
    store: a dry run's scratch copy is gone by now, and holds the same ids)."""
    from reverie.flows.artifacts import listed_targets

    if report.run_id is None:
        return {}
    try:
        return Store(store_url).external_ids(listed_targets(report))
    except Exception as exc:  # noqa: BLE001 - artifacts then show Reverie's ids alone
        log.warning("could not read the users' ids for the artifacts: %s", type(exc).__name__)
        return {}


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


class ChunkScheduler:
    """Runs a flow's DAG over its profiles, holding each profile only while its chunk
    is being worked on.

    Every chunk is taken without waiting (``ProfileHolds.take``) and submitted at once
    with the profiles that were free; its profiles are given back as soon as its steps
    are done. Busy profiles wait on their own, polled every ``BUSY_POLL_SECONDS``, and
    run as chunks of their own when they come free, so one busy profile holds up no
    other (and a run never waits while holding a profile it is not working on, so two
    runs cannot deadlock). A busy profile is skipped instead when
    ``REVERIE_BUSY_PROFILE=skip``; a profile still busy after
    ``REVERIE_BUSY_WAIT_SECONDS`` fails for this run (the rest finish). Who holds a
    busy profile, and for how long it was waited for, goes to the log, the progress
    artifact and the summary. A dry run holds nothing: it works on a scratch copy.
    """

    def __init__(self, plan: RunPlan, url: str, dag: ProfileDag, report: RunReport) -> None:
        self.plan, self.url, self.dag, self.report = plan, url, dag, report
        self.settings = get_settings()
        self.done: queue.Queue[tuple[StepBatch, list[PrefectFuture[list[StepReport]]]]] = (
            queue.Queue())
        self.in_flight = 0
        self.results: list[StepReport] = []
        self.waiting: dict[str, float] = {}  # busy profile -> when first found busy
        self.holders: dict[str, str] = {}
        self.taken_at: dict[str, datetime] = {}
        self.progress = Progress(report)

    def run(self) -> None:
        try:
            self._run()
        finally:
            # The terminal's bar goes with the run, failed or not.
            self.progress.close()

    def _run(self) -> None:
        profiles = sorted(self.plan.profiles)
        if self.plan.dry_run:
            for chunk in chunked(profiles, self.settings.profiles_per_task):
                self._submit(chunk)
            self._collect(lambda: None)
            return
        store = Store(self.plan.store_url)
        holder = self.plan.run_id or f"local-{uuid4()}"
        with ProfileHolds(store, holder, self.plan.run_id,
                          self.settings.lease_seconds) as self.holds:
            self.holds.prepare(profiles)
            for chunk in chunked(profiles, self.settings.profiles_per_task):
                taken = self.holds.take(chunk)
                self._submit(tuple(taken))
                self._busy(sorted(set(chunk) - set(taken)))
            try:
                self._collect(self._take_waiting)
            except BaseException:
                # Chunks already running keep writing: their profiles stay held until
                # they finish (or DRAIN_SECONDS pass), not handed to another run now.
                self._drain()
                raise
        self.report.profiles = sorted(set(profiles) - set(self.report.skipped_profiles))
        # Skipped profiles count as dealt with: a finished run shows 100%.
        self.progress.update(len(profiles), {})

    def _submit(self, profiles: tuple[str, ...]) -> None:
        for chunk in chunked(list(profiles), self.settings.profiles_per_task):
            batch = StepBatch(self.url, chunk, self.plan.as_of, self.plan.config, self.plan.run_id)
            taken = utcnow()
            for profile in chunk:
                self.taken_at[profile] = taken
            futures = self.dag(batch)
            self.in_flight += 1
            _when_all_done(futures, lambda b=batch, f=futures: self.done.put((b, f)))

    def _collect(self, poll: Callable[[], None]) -> None:
        """Gather finished chunks (giving their profiles back) until nothing is running
        or waiting; ``poll`` looks for waiting profiles that came free."""
        while self.in_flight or self.waiting:
            try:
                batch, futures = self.done.get(
                    timeout=BUSY_POLL_SECONDS if self.waiting else None)
            except queue.Empty:
                poll()
                continue
            self.in_flight -= 1
            self.results += chunk_reports(batch, futures)
            done = utcnow()
            for profile in batch.profiles:
                self.report.spans[profile] = (self.taken_at.get(profile, done), done)
            if not self.plan.dry_run:
                self.holds.release(batch.profiles)
            self.progress.update(len({s.profile for s in self.results}), self.holders)
            if self.waiting:
                poll()
        self.report.steps = self._in_run_order()

    def _busy(self, profiles: list[str]) -> None:
        if not profiles:
            return
        if self.settings.busy_profile == "skip":
            self.report.skipped_profiles += profiles
            for profile in profiles:
                run_logger().info("profile %s is busy (%s): skipped", profile,
                                   self.holds.holder_of(profile))
            return
        now = time.monotonic()
        for profile in profiles:
            self.waiting[profile] = now
            self.holders[profile] = self.holds.holder_of(profile)
            run_logger().info("profile %s is busy, held by %s: waiting for it (at most "
                               "%g s)", profile, self.holders[profile],
                               self.settings.busy_wait_seconds)
        self.progress.update(len({s.profile for s in self.results}), self.holders)

    def _take_waiting(self) -> None:
        taken = self.holds.take(sorted(self.waiting))
        now = time.monotonic()
        for profile in taken:
            waited = round(now - self.waiting.pop(profile), 1)
            self.report.waited[profile] = waited
            run_logger().info("profile %s came free after %.1f s (held by %s)", profile,
                               waited, self.holders.pop(profile))
        self._submit(tuple(taken))
        limit = self.settings.busy_wait_seconds
        for profile, since in sorted(self.waiting.items()):
            if now - since >= limit:
                del self.waiting[profile]
                holder = self.holders.pop(profile)
                self.report.waited[profile] = round(now - since, 1)
                error = (f"profile {profile!r} is busy ({holder}) for more than {limit:g} s "
                         f"(REVERIE_BUSY_WAIT_SECONDS)")
                run_logger().error("%s: not run", error)
                self.results.append(StepReport(WAIT_STEP, profile, error=error))
        if taken or not self.waiting:
            self.progress.update(len({s.profile for s in self.results}), self.holders)

    def _in_run_order(self) -> list[StepReport]:
        """Reports by profile name, each profile's steps in DAG order: the same report
        however the chunks happened to be taken."""
        order = {p: i for i, p in enumerate(sorted(self.plan.profiles))}
        return sorted(self.results, key=lambda s: order[s.profile])


    def _drain(self) -> None:
        deadline = time.monotonic() + DRAIN_SECONDS
        while self.in_flight and time.monotonic() < deadline:
            try:
                self.done.get(timeout=max(deadline - time.monotonic(), 0.0))
                self.in_flight -= 1
            except queue.Empty:
                break


def chunk_reports(
    batch: StepBatch, futures: list[PrefectFuture[list[StepReport]]]
) -> list[StepReport]:
    """A finished chunk's reports; if its task failed as a whole (a crashed Dask
    worker, an error outside any step), each of its profiles fails with that error and
    the run goes on with the other chunks."""
    try:
        return by_profile(batch, [f.result() for f in futures])
    except Exception as exc:  # noqa: BLE001 - reported per profile
        error = f"the chunk's task failed: {type(exc).__name__}: {exc}"[:300]
        return [StepReport(CHUNK_STEP, profile, error=error) for profile in batch.profiles]


# The pseudo-steps a profile fails in when it stayed busy, or its chunk's task failed.
WAIT_STEP = "wait"
CHUNK_STEP = "chunk"
# How long a failing run waits for its running chunks before it lets their profiles go.
DRAIN_SECONDS = 600.0


def _when_all_done(futures: list[PrefectFuture[Any]], callback: Callable[[], None]) -> None:
    remaining = [len(futures)]
    lock = threading.Lock()

    def one_done(_: object) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            callback()

    if not futures:
        callback()
    for future in futures:
        future.add_done_callback(one_done)


def run_logger() -> logging.Logger | logging.LoggerAdapter:  # type: ignore[type-arg]
    try:
        from prefect.logging import get_run_logger

        return get_run_logger()
    except Exception:  # outside a Prefect run
        return log


class Progress:
    """A progress artifact (profiles finished out of all) while a Prefect run goes on;
    its description names the profiles being waited for and who holds them.

    A run of several profiles with a terminal on stderr, which is a command running the
    flow in its own process (``reverie consolidate full --all``), also gets a bar there.
    A run on a worker or a runner has none: Prefect reads its output through a pipe.
    """

    def __init__(self, report: RunReport) -> None:
        self.report = report
        self.artifact_id: UUID | None = None
        self.shown: tuple[float, str] = (-1.0, "")
        self.bar = self._terminal_bar()
        if report.run_id is None or not report.profiles:
            return
        from prefect.artifacts import create_progress_artifact

        from reverie.flows.artifacts import artifact_key

        self.artifact_id = create_progress_artifact(
            0.0, key=artifact_key(report, "progress"), description=self._describe({}))

    def update(self, done: int, waiting: dict[str, str]) -> None:
        if self.bar is not None:
            # A count only: profiles' names stay off the terminal (the artifact has them).
            self.bar.describe(f"waiting for {len(waiting)} busy" if waiting else "")
            self.bar.advance_to(done)
        if self.artifact_id is None:
            return
        from prefect.artifacts import update_progress_artifact

        progress = round(100.0 * done / max(len(self.report.profiles), 1), 1)
        description = self._describe(waiting)
        # At most ~100 updates, however many profiles: each is an API call.
        if progress - self.shown[0] >= 1.0 or description != self.shown[1] or progress >= 100:
            update_progress_artifact(self.artifact_id, progress, description=description)
            self.shown = (progress, description)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _terminal_bar(self) -> Bar | None:
        """A bar over the run's profiles on this process's terminal, or None (for one
        profile a bar of one would only flash at the end)."""
        if len(self.report.profiles) < 2:
            return None
        from reverie.deployments.progress import Bar

        bar = Bar(len(self.report.profiles), self.report.flow, unit="profile")
        return bar if bar.active else None

    def _describe(self, waiting: dict[str, str]) -> str:
        text = f"{self.report.flow}: profiles finished, of {len(self.report.profiles)}"
        if waiting:
            shown = sorted(waiting.items())[:5]
            text += "; waiting for " + "; ".join(f"{p} (held by {h})" for p, h in shown)
            if len(waiting) > 5:
                text += f" and {len(waiting) - 5} more"
        return text


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
            # The profile's own span: runs over the same profile never overlap in it.
            started_at=report.spans.get(profile, (started, finished))[0],
            finished_at=report.spans.get(profile, (started, finished))[1],
            examined=sum(s.examined for s in steps), changed=sum(s.changed for s in steps),
            seconds=round(sum(s.seconds for s in steps), 4),
            summary={s.step: {"changed": s.changed, "notes": s.notes} for s in steps},
        )
        for profile in report.profiles if profile not in failed
        for steps in [by.get(profile, [])]
    ]
