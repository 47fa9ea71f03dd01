"""Controlled forgetting (off by default): archive or delete what has faded.

::

    forget

Acts on the relevance the decay flow last stored: deleting a memory removes its edges
and so changes its neighbours' scores, which a rescoring forget would act on again
in a second run of the same date. A stale score errs on the side of keeping (scores
only fall with time). Nothing is forgotten unless ``config.forget`` sets a threshold
above 0.0; a dry run lists what would be archived, deleted and protected, and why.
"""

from __future__ import annotations

from datetime import datetime

from prefect.futures import PrefectFuture

from flows.run import ProfileSelector, RunReport, reverie_flow, run_for_profiles
from models.config import (
    ArchiveThreshold,
    ConsolidationConfig,
    DeleteThreshold,
    with_forget_thresholds,
)
from models.settings import get_settings
from tasks.forget import forget_task
from tasks.step import StepBatch, StepReport

FLOW_NAME = "forget"


@reverie_flow(FLOW_NAME)
def forget(
    profile: ProfileSelector = None,
    as_of: datetime | None = None,
    dry_run: bool = False,
    config: ConsolidationConfig | None = None,
    archive_threshold: ArchiveThreshold | None = None,
    delete_threshold: DeleteThreshold | None = None,
) -> RunReport:
    """Archive or delete unprotected memories whose relevance fell below the thresholds."""
    config = with_forget_thresholds(
        config or get_settings().consolidation_config(), archive_threshold, delete_threshold
    )
    return run_for_profiles(FLOW_NAME, profile, as_of, dry_run, config, forget_profiles)


def forget_profiles(batch: StepBatch) -> list[PrefectFuture[list[StepReport]]]:
    return [forget_task.submit(batch)]
