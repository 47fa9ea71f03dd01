"""Running a flow's DAG over its profiles, chunk by chunk, each profile held by this
run only while its chunk is worked on (see ``ChunkScheduler``).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any
from uuid import uuid4

from prefect.futures import PrefectFuture, PrefectWrappedFuture

from reverie.models.repositories.profiles import ingest_horizons
from reverie.models.settings import get_settings
from reverie.models.store import Store
from reverie.models.timestamps import utcnow
from reverie.models.transient import retrying
from reverie.runner.artifacts import RunProgress
from reverie.runner.profile_holds import ProfileHolds
from reverie.runner.report import CHUNK_STEP, WAIT_STEP, RunReport
from reverie.runner.waiting import CONSOLE, WaitNotice
from reverie.runner.workspace import RunPlan
from reverie.tasks.step import (
    STEP_RETRIES,
    STEP_RETRY_CAP_SECONDS,
    STEP_RETRY_FIRST_SECONDS,
    StepBatch,
    StepReport,
    run_logger,
)

ProfileDag = Callable[[StepBatch], list[PrefectFuture[list[StepReport]]]]
BUSY_POLL_SECONDS = 1.0
# How often a run with chunks in flight looks at their futures itself: a chunk is
# collected once its futures are final, even if their done callback never arrives
# (one did not, once, and the run waited forever).
SWEEP_SECONDS = 5.0
# How long a failing run waits for its running chunks before it lets their profiles go.
DRAIN_SECONDS = 600.0


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
        # Chunks submitted and not collected yet, by a key their done callback puts on
        # ``done``; a key comes at most once out of ``flying`` (a callback and a sweep
        # may both put it).
        self.flying: dict[int, tuple[StepBatch, list[PrefectFuture[list[StepReport]]]]] = {}
        self.done: queue.Queue[int] = queue.Queue()
        self.submitted = 0
        self.results: list[StepReport] = []
        self.waiting: dict[str, float] = {}  # busy profile -> when first found busy
        self.holders: dict[str, str] = {}
        self.taken_at: dict[str, datetime] = {}
        self.progress = RunProgress(report)

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
        self.notice = WaitNotice(store.id)
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
            batch = StepBatch(self.url, chunk, self.plan.as_of, self.plan.config,
                              self.plan.run_id, self._horizons(chunk))
            taken = utcnow()
            for profile in chunk:
                self.taken_at[profile] = taken
            futures = self.dag(batch)
            self.submitted += 1
            self.flying[self.submitted] = (batch, futures)
            _when_all_done(futures, partial(self.done.put, self.submitted))

    def _horizons(self, profiles: tuple[str, ...]) -> tuple[int, ...]:
        """Where each profile's ingests stand as the run takes it (once held, before any
        step reads): every step of the run works on what was ingested up to there, and
        what an ingest writes meanwhile waits for the next run (ProfileTx.horizon)."""
        def read() -> dict[str, int]:
            with Store(self.url).reading_all() as s:
                return ingest_horizons(s, profiles)

        found = retrying(read, STEP_RETRIES, STEP_RETRY_FIRST_SECONDS, STEP_RETRY_CAP_SECONDS)
        return tuple(found[p] for p in profiles)

    def _collect(self, poll: Callable[[], None]) -> None:
        """Gather finished chunks (giving their profiles back) until nothing is running
        or waiting; ``poll`` looks for waiting profiles that came free."""
        while self.flying or self.waiting:
            chunk = self._next_done(BUSY_POLL_SECONDS if self.waiting else SWEEP_SECONDS)
            if chunk is None:
                if self.waiting:
                    poll()
                continue
            batch, futures = chunk
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
        # Once per run, not per profile: a run killed holding a profile keeps it for a
        # lease, and the command would otherwise wait that long without a word.
        first = profiles[0]
        more = f" and {len(profiles) - 1} more" if len(profiles) > 1 else ""
        CONSOLE.info("profile %s%s busy, held by %s: waiting for it, at most %g s (a run "
                     "killed holding a profile frees it within %g s, REVERIE_LEASE_SECONDS)",
                     first, more, self.holders[first], self.settings.busy_wait_seconds,
                     self.settings.lease_seconds)
        self.notice.mark()
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
        # Still waiting: say so at most every NOTICE_SECONDS, not only when it began.
        self.notice.tell([(f"profile {p}", self.holders[p], now - since)
                          for p, since in self.waiting.items()])

    def _in_run_order(self) -> list[StepReport]:
        """Reports by profile name, each profile's steps in DAG order: the same report
        however the chunks happened to be taken."""
        order = {p: i for i, p in enumerate(sorted(self.plan.profiles))}
        return sorted(self.results, key=lambda s: order[s.profile])


    def _drain(self) -> None:
        deadline = time.monotonic() + DRAIN_SECONDS
        while self.flying and time.monotonic() < deadline:
            self._next_done(min(SWEEP_SECONDS, max(deadline - time.monotonic(), 0.0)))

    def _next_done(self, timeout: float) -> tuple[
            StepBatch, list[PrefectFuture[list[StepReport]]]] | None:
        """A finished chunk, taken out of ``flying``; None if none finished within
        ``timeout``. Chunks whose futures are final are put on ``done`` here too."""
        try:
            key = self.done.get(timeout=timeout)
        except queue.Empty:
            for key, (_, futures) in list(self.flying.items()):
                if all(_final(f) for f in futures):
                    self.done.put(key)
            return None
        return self.flying.pop(key, None)


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


def _final(future: PrefectFuture[Any]) -> bool:
    if isinstance(future, PrefectWrappedFuture):  # threads, Dask: no API call
        return bool(future.wrapped_future.done())
    return future.state.is_final()


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
