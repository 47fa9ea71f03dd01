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

from typing import Annotated, Literal

from prefect.futures import PrefectFuture
from pydantic import Field

from reverie.flows.forget import AutoApprove
from reverie.models.config import ColdConfig, with_forget_thresholds
from reverie.models.errors import ConfigError
from reverie.models.settings import get_settings
from reverie.runner.parameters import ArchiveBelow, AsOf, Config, DeleteBelow, DryRun, Profile
from reverie.runner.report import RunReport
from reverie.runner.run import run_for_profiles
from reverie.runner.runtime import reverie_flow
from reverie.tasks.cold_notes import consolidate_cold_task, mark_stalled_task
from reverie.tasks.forget import forget_task
from reverie.tasks.step import StepBatch, StepReport, run_logger

FLOW_NAME = "consolidate-cold"


@reverie_flow(FLOW_NAME)
def consolidate_cold(
    profile: Profile = None,
    as_of: AsOf = None,
    dry_run: DryRun = False,
    config: Config = None,
    scope: Annotated[Literal["all", "session"], Field(description=(
        "all: every cold memory of the profile; session: only those of session_id."
    ))] = "all",
    session_id: Annotated[str | None, Field(max_length=256, description=(
        "With scope=session: the session whose memories are consolidated."
    ))] = None,
    min_age_days: Annotated[float | None, Field(ge=0.0, description=(
        "Only memories at least this many days old. Empty: config.cold.min_age_days (7); "
        "0 takes memories of any age."
    ))] = None,
    archive_threshold: ArchiveBelow = None,
    delete_threshold: DeleteBelow = None,
    auto_approve_deletion: AutoApprove = False,
) -> RunReport:
    """Fold each entity's cold context, emotion and implementation notes into one
    protected learning memory; then sweep and mark stalled work."""
    base = with_forget_thresholds(
        config or get_settings().consolidation_config(), archive_threshold, delete_threshold
    )
    # A dry run too: it reports what the real run would do.
    if base.forget.delete_threshold > 0.0 and not auto_approve_deletion:
        # Deletion is approved: this flow runs at session ends, with no one to ask, so
        # its sweep archives only; the forget flow asks before it deletes.
        run_logger().warning(
            "consolidate-cold: the sweep deletes nothing (delete_threshold %g needs "
            "approval: run the forget flow, or set auto_approve_deletion); archiving "
            "goes ahead", base.forget.delete_threshold)
        base = with_forget_thresholds(base, None, 0.0)
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
