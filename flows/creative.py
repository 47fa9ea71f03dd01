"""Creative associations (weekly): link a reproducible sample of relevant memories.

::

    creative

The sample is drawn by the relevance the decay flow last stored. Creative does not
rescore: the edges it adds change relationship counts, so rescoring inside the flow
would draw a different sample on a second run of the same date. Schedule decay
before it (``prefect.yaml`` does).
"""

from __future__ import annotations

from prefect.futures import PrefectFuture

from reverie.runner.parameters import AsOf, Config, DryRun, Profile
from reverie.runner.report import RunReport
from reverie.runner.run import run_for_profiles
from reverie.runner.runtime import reverie_flow
from reverie.tasks.creative import creative_task
from reverie.tasks.step import StepBatch, StepReport

FLOW_NAME = "creative"


@reverie_flow(FLOW_NAME)
def creative(
    profile: Profile = None,
    as_of: AsOf = None,
    dry_run: DryRun = False,
    config: Config = None,
) -> RunReport:
    """Discover contradictions, explanations, shared themes and parallel contexts."""
    return run_for_profiles(FLOW_NAME, profile, as_of, dry_run, config, associate_profiles)


def associate_profiles(batch: StepBatch) -> list[PrefectFuture[list[StepReport]]]:
    return [creative_task.submit(batch)]
