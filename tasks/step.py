"""The contract every consolidation step keeps: how it runs and what it reports.

A step is a function ``(store, StepArgs) -> StepReport`` that reads a snapshot of one
profile, plans in pure code and writes the plan in one transaction; ``step_task``
makes it a Prefect task with retries, and a retry starts from whatever the last
attempt committed. It returns a report of how much it examined,
what it changed and why. Reports are plain data: a dry run returns the very report
the real run would, and flows turn reports into Prefect artifacts. Memory content
appears only as a short preview, cut to ``REVERIE_ARTIFACT_CONTENT_CHARS`` (0 hides it).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import lru_cache
from itertools import islice
from typing import Any

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from models.config import ConsolidationConfig
from models.settings import get_settings
from models.store import Store

log = logging.getLogger("reverie.steps")


@dataclass(frozen=True, slots=True)
class StepArgs:
    """What a step is told: which store, which profile, the run's 'now' and knobs."""

    store_url: str
    profile: str
    as_of: datetime
    config: ConsolidationConfig
    run_id: str | None = None


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


def preview(text: str | None, chars: int | None = None) -> str | None:
    """A memory's content as artifacts may show it: cut short, or hidden entirely."""
    limit = _content_chars(os.environ.get(CONTENT_CHARS_VARIABLE)) if chars is None else chars
    if text is None or limit <= 0:
        return None
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: max(limit - 1, 0)] + "…"


CONTENT_CHARS_VARIABLE = "REVERIE_ARTIFACT_CONTENT_CHARS"


@lru_cache(maxsize=8)
def _content_chars(_variable: str | None) -> int:
    """The limit for the variable's value: a report previews one memory per change."""
    return get_settings().artifact_content_chars


def _logger() -> logging.Logger | logging.LoggerAdapter:  # type: ignore[type-arg]
    try:
        from prefect.logging import get_run_logger

        return get_run_logger()
    except Exception:  # outside a Prefect run
        return log


StepFunction = Callable[[Store, StepArgs], StepReport]


def run_step(name: str, fn: StepFunction, args: StepArgs) -> StepReport:
    """Run one step on its store, time it, and log its counts (never memory content)."""
    started = time.perf_counter()
    report = fn(Store(args.store_url), args)
    report.seconds = round(time.perf_counter() - started, 4)
    _logger().info(
        "step=%s profile=%s examined=%d changed=%d skipped=%d seconds=%.3f",
        name, args.profile, report.examined, report.changed, report.skipped, report.seconds,
    )
    return report


def step_task(name: str, fn: StepFunction) -> Task[[StepArgs], StepReport]:
    """The Prefect task running step ``fn``: retried on failure, never cached (it writes)."""

    def run(args: StepArgs) -> StepReport:
        return run_step(name, fn, args)

    def run_name() -> str:
        from prefect.runtime import task_run

        return f"{name}/{task_run.parameters['args'].profile}"

    run.__doc__ = fn.__doc__
    return task(
        run,
        name=name,
        retries=2,
        retry_delay_seconds=1,
        cache_policy=NO_CACHE,
        task_run_name=run_name,
    )
