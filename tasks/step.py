"""The contract every consolidation step keeps: how it runs and what it reports.

A step is a function ``(store, StepArgs) -> StepReport`` that reads a snapshot of one
profile, plans in pure code and writes the plan in one transaction; ``step_task``
makes it a Prefect task over a chunk of profiles, with retries per profile for
transient faults; a retry starts from whatever the last attempt committed. It returns
a report of how much it examined, what it changed and why. Reports are plain data: a
dry run returns the very report the real run would, and flows turn reports into Prefect
artifacts. A step that left the process much larger hands its freed heap back to the
operating system, so a worker does not carry one large profile's peak. Memory content
appears only as a short preview, cut to ``REVERIE_ARTIFACT_CONTENT_CHARS`` (0 hides it).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from functools import lru_cache, partial
from itertools import islice
from typing import Any

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from reverie.models import events
from reverie.models.config import ConsolidationConfig
from reverie.models.repositories.bulk import collector_paused
from reverie.models.repositories.profiles import ingest_horizons
from reverie.models.settings import get_settings
from reverie.models.store import ProfileTx, Store
from reverie.models.transient import retrying

log = logging.getLogger("reverie.steps")


@dataclass(frozen=True, slots=True)
class StepArgs:
    """What a step is told: which store, which profile, the run's 'now' and knobs, and
    the run's horizon on the profile (``ProfileTx.horizon``: every step of a run sees
    the memories as they were ingested when the run took the profile; ``run_step``
    takes the profile's horizon of the moment for a step run without one)."""

    store_url: str
    profile: str
    as_of: datetime
    config: ConsolidationConfig
    run_id: str | None = None
    horizon: int | None = None

    # A step opens its profile only through these two: a read that forgot the horizon
    # or the as_of would let a backfill see memories of its future (forget's candidate
    # read once did).
    def reading(self, store: Store) -> AbstractContextManager[ProfileTx]:
        """A snapshot of the profile as this run sees it."""
        return store.reading(self.profile, self.horizon, self.as_of)

    def writing(self, store: Store) -> AbstractContextManager[ProfileTx]:
        """One transaction on the profile as this run sees it."""
        return store.writing(self.profile, self.horizon, self.as_of)


@dataclass(frozen=True, slots=True)
class Change:
    action: str
    target: str
    detail: str = ""
    preview: str | None = None


# Changes a report lists one by one; beyond this it only counts them.
LISTED_CHANGES = 1000


@dataclass(slots=True)
class StepReport:
    step: str
    profile: str
    examined: int = 0
    changed: int = 0
    changes: list[Change] = field(default_factory=list)
    skipped: int = 0
    notes: list[str] = field(default_factory=list)
    # Step-specific figures for reports (top memories, counts by kind...).
    facts: dict[str, Any] = field(default_factory=dict)
    # Named tables published as their own artifacts (e.g. a distribution).
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    seconds: float = 0.0
    # Of those seconds, the time spent embedding text the step wrote afresh.
    embedding_seconds: float = 0.0
    # Why the step failed for this profile after its retries (nothing of it was kept
    # beyond what its last attempt committed); None when it succeeded.
    error: str | None = None

    def record(self, change: Change, counts: bool = True) -> None:
        """Count a change (``counts=False``: only list it, e.g. a memory left alone and
        why); list it while the list is short enough to read."""
        self.changed += int(counts)
        if len(self.changes) < LISTED_CHANGES:
            self.changes.append(change)

    def tally(self, count: int, changes: Iterable[Change]) -> None:
        """Count ``count`` changes and list the first of ``changes`` (a lazy iterable:
        a step that rescores 100k memories formats only the lines it lists)."""
        self.changed += count
        self.changes.extend(islice(changes, max(LISTED_CHANGES - len(self.changes), 0)))

    def comparable(self) -> dict[str, Any]:
        """The report without its timing: equal for a dry run and the real run after it."""
        data = asdict(self)
        data.pop("seconds")
        data.pop("embedding_seconds")
        return data


def preview_chars() -> int:
    """How many characters of content a preview shows (0: none). A step that previews
    thousands of memories asks once: reading an unset variable costs an exception."""
    return _content_chars(os.environ.get(CONTENT_CHARS_VARIABLE))


def preview(text: str | None, chars: int | None = None) -> str | None:
    """A memory's content as artifacts may show it: cut short, or hidden entirely."""
    limit = preview_chars() if chars is None else chars
    if text is None or limit <= 0:
        return None
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: max(limit - 1, 0)] + "…"


CONTENT_CHARS_VARIABLE = "REVERIE_ARTIFACT_CONTENT_CHARS"


@lru_cache(maxsize=8)
def _content_chars(_variable: str | None) -> int:
    """The limit for the variable's value: a report previews one memory per change."""
    return get_settings().artifact_content_chars


def run_logger(
    fallback: logging.Logger = log,
) -> logging.Logger | logging.LoggerAdapter:
    """The one way to the logger of the Prefect run (flow or task) this code runs in,
    whose lines reach the run's log in the UI; ``fallback`` outside a run."""
    try:
        from prefect.logging import get_run_logger

        return get_run_logger()
    except Exception:  # outside a Prefect run
        return fallback


StepFunction = Callable[[Store, StepArgs], StepReport]


def run_step(name: str, fn: StepFunction, args: StepArgs) -> StepReport:
    """Run one step on its store, time it, and log its counts (never memory content)."""
    held = resident_bytes()
    started = time.perf_counter()
    store = Store(args.store_url)
    if args.horizon is None:
        args = replace(args, horizon=current_horizon(store, args.profile))
    try:
        # A step's snapshot and plan are plain data with no cycles to collect, yet at
        # 100k memories they set off collections that walk the whole heap again and
        # again: the step runs without the collector (dedup at 100k: 1.1 s less CPU of
        # 13, benchmarks-history). What cyclic garbage it leaves (a few sessions and
        # results) waits for the first collection after it.
        with collector_paused():
            report = fn(store, args)
    finally:
        if resident_bytes() - held >= GIVE_BACK_BYTES:
            give_back_freed_memory()
    report.seconds = round(time.perf_counter() - started, 4)
    # Per profile at DEBUG: at INFO, 10,000 profiles would send Prefect 80,000 log lines
    # a night. Each chunk logs its totals at INFO (run_batch).
    run_logger().debug(
        "step=%s profile=%s examined=%d changed=%d skipped=%d seconds=%.3f",
        name, args.profile, report.examined, report.changed, report.skipped, report.seconds,
    )
    return report


def current_horizon(store: Store, profile: str) -> int:
    """The profile's horizon now: a run takes it when it takes the profile."""
    with store.reading_all() as s:
        return ingest_horizons(s, [profile])[profile]


# glibc keeps what a large step freed (its snapshot, vectors and plan: gigabytes at a
# million memories) in its heap, and a worker would carry its largest profile's peak into
# every later one. A step that left the process this much larger hands the free pages
# back; a small profile's step leaves too little to be worth the heap walk.
GIVE_BACK_BYTES = 64 * 1024 * 1024


def resident_bytes() -> int:
    """The process's resident memory (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * mmap.PAGESIZE
    except (OSError, IndexError, ValueError):
        return 0


@lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to hand back
        return None


def give_back_freed_memory() -> None:
    """Return the heap's free pages to the operating system (glibc's malloc_trim)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


# A step that fails transiently (a dropped database connection, a lock wait that timed
# out) is tried again for its profile, after 1, 2, 4 s (each jittered): a retry starts
# from whatever the last attempt committed. Any other failure is a bug or bad data,
# and is reported at once.
STEP_RETRIES = 3
STEP_RETRY_FIRST_SECONDS = 1.0
STEP_RETRY_CAP_SECONDS = 30.0
# An error message kept in a report is cut to this: enough to act on, no dump.
ERROR_CHARS = 300


@dataclass(frozen=True, slots=True)
class StepBatch:
    """What a step's task is told: the run's store, 'now' and knobs, and the chunk of
    profiles it takes one after another. One task run per chunk, not per profile:
    Prefect's cost per task run (tens of ms) would otherwise exceed the work of a
    small profile."""

    store_url: str
    profiles: tuple[str, ...]
    as_of: datetime
    config: ConsolidationConfig
    run_id: str | None = None
    # The run's horizon on each profile, in the order of ``profiles`` (StepArgs.horizon);
    # empty: each step takes the horizon of its moment.
    horizons: tuple[int, ...] = ()

    def each(self) -> Iterator[StepArgs]:
        horizons = self.horizons or (None,) * len(self.profiles)
        for profile, horizon in zip(self.profiles, horizons, strict=True):
            yield StepArgs(self.store_url, profile, self.as_of, self.config, self.run_id,
                           horizon)

    def label(self) -> str:
        """The chunk as a task run's name shows it."""
        first, last, n = self.profiles[0], self.profiles[-1], len(self.profiles)
        return first if n == 1 else f"{first}..{last} ({n} profiles)"


def run_batch(
    name: str, fn: StepFunction, batch: StepBatch, after: Sequence[list[StepReport]] = ()
) -> list[StepReport]:
    """Run step ``fn`` for each profile of the chunk, in order. A profile whose step
    still fails after its retries gets a report carrying the error, and the chunk goes
    on: one profile's failure neither stops nor hides the others (the flow reports it
    and fails the run at the end). ``after`` holds the reports of the steps this one
    follows: a profile that failed in one of them is not run here either."""
    blocked = {r.profile: r.step for reports in after for r in reports if r.error is not None}
    reports = []
    for args in batch.each():
        if args.profile in blocked:
            reports.append(StepReport(name, args.profile,
                                      error=f"not run: {blocked[args.profile]} failed"))
            continue
        try:
            reports.append(retrying(
                partial(run_step, name, fn, args), STEP_RETRIES, STEP_RETRY_FIRST_SECONDS,
                STEP_RETRY_CAP_SECONDS, on_retry=partial(
                    announce_retry, name, args.profile, store_url=batch.store_url),
            ))
        except Exception as exc:  # noqa: BLE001 - reported per profile
            run_logger().error("step=%s profile=%s failed: %s", name, args.profile,
                            type(exc).__name__)
            reports.append(StepReport(name, args.profile, error=_error_text(exc)))
    run_logger().info(
        "step=%s profiles=%d examined=%d changed=%d skipped=%d failed=%d seconds=%.3f",
        name, len(reports), sum(r.examined for r in reports), sum(r.changed for r in reports),
        sum(r.skipped for r in reports), sum(r.error is not None for r in reports),
        sum(r.seconds for r in reports),
    )
    return reports


STEP_RETRYING = "reverie.step.retrying"


def announce_retry(step: str, profile: str, attempt: int, exc: BaseException,
                   wait: float, store_url: str | None = None) -> None:
    """Say that a step's attempt failed transiently and when the next one starts: in
    the run's log, and as a Prefect event about the profile, labelled with its store
    when the store can say which it is, and related to the flow and task run (Prefect
    adds those), so the UI and automations see retries. Only the error's class leaves
    the process, never its message (it may quote a statement or an answer)."""
    error = type(exc).__name__
    run_logger().warning("step=%s profile=%s attempt %d failed (%s, transient); "
                          "retrying in %.1f s", step, profile, attempt, error, wait)
    try:
        from prefect.context import FlowRunContext, TaskRunContext
        from prefect.events import emit_event

        if FlowRunContext.get() is None and TaskRunContext.get() is None:
            return  # not in a run: no run for the event to be about
        store = _store_id(store_url) if store_url is not None else None
        emit_event(
            event=STEP_RETRYING,
            resource=events.resource(profile, store), related=events.related(store),
            payload={"step": step, "attempt": attempt, "wait_seconds": round(wait, 3),
                     "error": error},
        )
    except Exception:  # noqa: BLE001 - telling Prefect must never fail the step
        log.debug("step=%s: the retry event was not emitted", step, exc_info=True)


def _store_id(url: str) -> str | None:
    """The store's id for a retry's event; None when the fault keeps it from being read
    (the event goes out all the same)."""
    try:
        return Store(url).id
    except Exception:  # noqa: BLE001 - the store is failing already: say what we can
        return None


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"


def step_task(name: str, fn: StepFunction) -> Task[..., list[StepReport]]:
    """The Prefect task running step ``fn`` over a chunk of profiles; never cached (it
    writes). Submitted with ``after=[futures]``, it waits for those steps and skips the
    profiles they failed. Retries happen per profile inside it, so a retry never runs
    again, and reports again as unchanged, the profiles that had already succeeded."""

    def run(batch: StepBatch, after: Sequence[list[StepReport]] = ()) -> list[StepReport]:
        return run_batch(name, fn, batch, after)

    def run_name() -> str:
        from prefect.runtime import task_run

        return f"{name}/{task_run.parameters['batch'].label()}"

    run.__doc__ = fn.__doc__
    # Any arguments: ``after`` is given futures, which Prefect resolves to the reports.
    return task(name=name, cache_policy=NO_CACHE, task_run_name=run_name)(run)
