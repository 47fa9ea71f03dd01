"""Consolidation of cold notes (linksee's sleep mode), then the forget sweep and
stalled detection.

::

    consolidate_cold ──> forget ──> mark_stalled

Meant for the end of a session or on demand. ``scope`` is ``all`` or ``session``
(then ``session_id`` names it); ``min_age_days`` overrides the 7-day minimum age (0
after a bulk import). The forget sweep is the ``forget`` step with the configured
thresholds, so it forgets nothing unless the operator turned forgetting on.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from prefect.futures import PrefectFuture

from flows.run import ProfileSelector, RunReport, reverie_flow, run_for_profiles
from models.config import (
    ArchiveThreshold,
    ColdConfig,
    ConsolidationConfig,
    DeleteThreshold,
    with_forget_thresholds,
)
from models.errors import ConfigError
from models.settings import get_settings
from tasks.cold import consolidate_cold_task, mark_stalled_task
from tasks.forget import forget_task
from tasks.step import StepBatch, StepReport

FLOW_NAME = "consolidate-cold"


@reverie_flow(FLOW_NAME)
def consolidate_cold(
    profile: ProfileSelector = None,
    as_of: datetime | None = None,
    dry_run: bool = False,
    config: ConsolidationConfig | None = None,
    scope: Literal["all", "session"] = "all",
    session_id: str | None = None,
    min_age_days: float | None = None,
    archive_threshold: ArchiveThreshold | None = None,
    delete_threshold: DeleteThreshold | None = None,
) -> RunReport:
    """Fold each entity's cold context, emotion and implementation notes into one
    protected learning memory; then sweep and mark stalled work."""
    base = with_forget_thresholds(
        config or get_settings().consolidation_config(), archive_threshold, delete_threshold
    )
    cold = base.cold.model_dump() | {"scope": scope, "session_id": session_id}
    if min_age_days is not None:
        cold["min_age_days"] = min_age_days
    try:
        config = base.model_copy(update={"cold": ColdConfig(**cold)})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return run_for_profiles(FLOW_NAME, profile, as_of, dry_run, config, sleep_profiles)


def sleep_profiles(batch: StepBatch) -> list[PrefectFuture[list[StepReport]]]:
    cold = consolidate_cold_task.submit(batch)
    swept = forget_task.submit(batch, after=[cold])
    return [cold, swept, mark_stalled_task.submit(batch, after=[swept])]
