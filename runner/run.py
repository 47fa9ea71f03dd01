"""The skeleton every flow's body is: resolve the parameters, run the flow's DAG over
the selected profiles on the store it works on, record the finished profiles, publish
the artifacts, and fail the run (after the others finished) if a profile failed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from reverie.models.config import ConsolidationConfig
from reverie.models.errors import EmptyStoreError, StepFailedError
from reverie.models.repositories.memories import external_ids
from reverie.models.repositories.runs import record_runs
from reverie.models.settings import display_url
from reverie.models.store import Store
from reverie.models.tables import RunRecord
from reverie.models.timestamps import iso, utcnow
from reverie.models.transient import retrying
from reverie.runner.artifacts import listed_targets, publish
from reverie.runner.chunk_scheduler import ChunkScheduler, ProfileDag
from reverie.runner.report import RunReport, history
from reverie.runner.workspace import ProfileSelector, prepare_run, working_store
from reverie.tasks.step import (
    STEP_RETRIES,
    STEP_RETRY_CAP_SECONDS,
    STEP_RETRY_FIRST_SECONDS,
    run_logger,
)

log = logging.getLogger(__name__)


def run_for_profiles(
    flow: str,
    profile: ProfileSelector,
    as_of: datetime | None,
    dry_run: bool,
    config: ConsolidationConfig | None,
    dag: ProfileDag,
    store_id: str | None = None,
    annotate: Callable[[RunReport], None] | None = None,
) -> RunReport:
    """Resolve a flow's parameters, run ``dag`` for the selected profiles chunk by
    chunk (chunks run side by side), collect the steps' reports and publish them as
    artifacts. Profiles whose steps all succeeded are recorded as done; if any failed,
    the run fails at the end, naming them, after the others have finished. ``annotate``
    adds what the flow concludes from the steps' reports before the artifacts show it.

    A run over every profile (``profile`` None) of a store that has none fails, saying
    so in its state and artifact: on a schedule that is a store just made empty or a
    mistyped URL, which the platform's failure alert should report. An empty list of
    profiles completes, saying that none was selected."""
    plan = prepare_run(flow, profile, as_of, dry_run, config, store_id)
    report = RunReport(plan.flow, plan.profiles, iso(plan.as_of) or "", plan.dry_run, plan.run_id)
    if not plan.profiles:
        where = display_url(plan.store_url)
        if profile is None:
            report.note = (f"no profiles in store {where}: nothing to do. A new store gets "
                           "profiles by ingest; a mistyped REVERIE_DATABASE_URL is another "
                           "store")
            publish(report)
            raise EmptyStoreError(report.note)
        report.note = f"no profiles selected (store {where}): nothing to do"
        publish(report)
        run_logger(log).info(report.note)
        return report
    with working_store(plan) as url:
        started = utcnow()
        ChunkScheduler(plan, url, dag, report).run()
        if not plan.dry_run:
            rows = history(report, plan.as_of, started, utcnow())
            retrying(lambda: _record_runs(plan.store_url, rows), STEP_RETRIES,
                     STEP_RETRY_FIRST_SECONDS, STEP_RETRY_CAP_SECONDS)
    if annotate is not None:
        annotate(report)
    publish(report, _user_ids(plan.store_url, report))
    failed = report.failed()
    if failed:
        raise StepFailedError(failed, report.as_of)
    return report


def _record_runs(store_url: str, rows: list[RunRecord]) -> None:
    with Store(store_url).writing_all() as s:
        record_runs(s, rows)


def _user_ids(store_url: str, report: RunReport) -> dict[str, str]:
    """The ids users gave the memories the run's artifacts name (read from the real
    store: a dry run's scratch copy is gone by now, and holds the same ids)."""
    if report.run_id is None:
        return {}
    try:
        with Store(store_url).reading_all() as s:
            return external_ids(s, listed_targets(report))
    except Exception as exc:  # noqa: BLE001 - artifacts then show Reverie's ids alone
        log.warning("could not read the users' ids for the artifacts: %s", type(exc).__name__)
        return {}
