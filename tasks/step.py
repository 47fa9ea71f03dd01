"""The contract every consolidation step keeps: how it runs and what it reports.

A step is a Prefect task with retries over a function that reads a snapshot, plans
in pure code and writes the plan in one transaction; a retry therefore starts from
whatever the last attempt committed. It returns a report of how much it examined,
what it changed and why. Reports are plain data: a dry run returns the very report
the real run would, and flows turn reports into Prefect artifacts. Memory content
appears only as a short preview, cut to ``REVERIE_ARTIFACT_CONTENT_CHARS`` (0 hides it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from prefect import task
from prefect.cache_policies import NO_CACHE

from models.settings import get_settings

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("reverie.steps")


@dataclass(frozen=True, slots=True)
class Change:
    action: str
    target: str
    detail: str = ""
    preview: str | None = None


@dataclass(slots=True)
class StepReport:
    step: str
    profile: str
    examined: int = 0
    changes: list[Change] = field(default_factory=list)
    skipped: int = 0
    notes: list[str] = field(default_factory=list)
    # Step-specific figures for reports (top memories, counts by kind...).
    facts: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def changed(self) -> int:
        return len(self.changes)

    def comparable(self) -> dict[str, Any]:
        """The report without its timing: equal for a dry run and the real run after it."""
        data = asdict(self)
        data.pop("seconds")
        return data


def preview(text: str | None, chars: int | None = None) -> str | None:
    """A memory's content as artifacts may show it: cut short, or hidden entirely."""
    limit = get_settings().artifact_content_chars if chars is None else chars
    if text is None or limit <= 0:
        return None
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: max(limit - 1, 0)] + "…"


def timed(step: str, profile: str, body: Callable[[], StepReport]) -> StepReport:
    """Run a step body, time it, and log its counts (never memory content)."""
    started = time.perf_counter()
    report = body()
    report.seconds = round(time.perf_counter() - started, 4)
    _logger().info(
        "step=%s profile=%s examined=%d changed=%d skipped=%d seconds=%.3f",
        step, profile, report.examined, report.changed, report.skipped, report.seconds,
    )
    return report


def _logger() -> logging.Logger | logging.LoggerAdapter:  # type: ignore[type-arg]
    try:
        from prefect.logging import get_run_logger

        return get_run_logger()
    except Exception:  # outside a Prefect run
        return log


def step_task(name: str) -> Callable[[F], F]:
    """Make a step function a Prefect task: retried on failure, never cached (it writes)."""

    def wrap(fn: F) -> F:
        return task(  # type: ignore[return-value]
            fn,
            name=name,
            retries=2,
            retry_delay_seconds=1,
            cache_policy=NO_CACHE,
            task_run_name=f"{name}/{{profile}}",
        )

    return wrap
