"""Clustering (monthly): describe each cluster of similar memories with a meta-memory.

::

    cluster

Clusters memories by the relevance the decay flow last stored (see ``flows.creative``
for why it does not rescore itself).
"""

from __future__ import annotations

from prefect.futures import PrefectFuture

from reverie.runner.parameters import AsOf, Config, DryRun, Profile
from reverie.runner.report import RunReport
from reverie.runner.run import run_for_profiles
from reverie.runner.runtime import reverie_flow
from reverie.tasks.cluster import cluster_task
from reverie.tasks.step import StepBatch, StepReport

FLOW_NAME = "cluster"


@reverie_flow(FLOW_NAME)
def cluster(
    profile: Profile = None,
    as_of: AsOf = None,
    dry_run: DryRun = False,
    config: Config = None,
) -> RunReport:
    """Group similar relevant memories and keep one meta-memory per group."""
    return run_for_profiles(FLOW_NAME, profile, as_of, dry_run, config, cluster_profiles)


def cluster_profiles(batch: StepBatch) -> list[PrefectFuture[list[StepReport]]]:
    return [cluster_task.submit(batch)]
