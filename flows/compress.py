"""Compression of fading memories on its own (it is also a step of full consolidation).

::

    compress_fading

Acts on the relevance the decay flow last stored.
"""

from __future__ import annotations

from prefect.futures import PrefectFuture

from reverie.runner.parameters import AsOf, Config, DryRun, Profile
from reverie.runner.report import RunReport
from reverie.runner.run import run_for_profiles
from reverie.runner.runtime import reverie_flow
from reverie.tasks.compress import compress_fading_task
from reverie.tasks.step import StepBatch, StepReport

FLOW_NAME = "compress"


@reverie_flow(FLOW_NAME)
def compress(
    profile: Profile = None,
    as_of: AsOf = None,
    dry_run: DryRun = False,
    config: Config = None,
) -> RunReport:
    """Replace groups of similar fading memories by summaries; originals go cold."""
    return run_for_profiles(FLOW_NAME, profile, as_of, dry_run, config, compress_profiles)


def compress_profiles(batch: StepBatch) -> list[PrefectFuture[list[StepReport]]]:
    return [compress_fading_task.submit(batch)]
