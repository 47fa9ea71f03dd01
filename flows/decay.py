"""Decay (daily): recompute the relevance of every live hot memory at ``as_of``.

::

    decay

The relevance distribution (high / medium / low / archive) is published as a table.
"""

from __future__ import annotations

from prefect.futures import PrefectFuture

from reverie.runner.parameters import AsOf, Config, DryRun, Profile
from reverie.runner.report import RunReport
from reverie.runner.run import run_for_profiles
from reverie.runner.runtime import reverie_flow
from reverie.tasks.decay import decay_task
from reverie.tasks.step import StepBatch, StepReport

FLOW_NAME = "decay"


@reverie_flow(FLOW_NAME)
def decay(
    profile: Profile = None,
    as_of: AsOf = None,
    dry_run: DryRun = False,
    config: Config = None,
) -> RunReport:
    """Score every live hot memory's relevance from its age, use, links, importance
    and confidence."""
    return run_for_profiles(FLOW_NAME, profile, as_of, dry_run, config, decay_profiles)


def decay_profiles(batch: StepBatch) -> list[PrefectFuture[list[StepReport]]]:
    return [decay_task.submit(batch)]
