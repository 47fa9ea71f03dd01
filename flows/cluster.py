"""Clustering (monthly): describe each cluster of similar memories with a meta-memory.

::

    cluster

Clusters memories by the relevance the decay flow last stored (see ``flows.creative``
for why it does not rescore itself).
"""

from __future__ import annotations

from datetime import datetime

from prefect.futures import PrefectFuture

from flows.run import ProfileSelector, RunReport, reverie_flow, run_for_profiles
from models.config import ConsolidationConfig
from tasks.cluster import cluster_task
from tasks.step import StepBatch, StepReport

FLOW_NAME = "cluster"


@reverie_flow(FLOW_NAME)
def cluster(
    profile: ProfileSelector = None,
    as_of: datetime | None = None,
    dry_run: bool = False,
    config: ConsolidationConfig | None = None,
) -> RunReport:
    """Group similar relevant memories and keep one meta-memory per group."""
    return run_for_profiles(FLOW_NAME, profile, as_of, dry_run, config, cluster_profiles)


def cluster_profiles(batch: StepBatch) -> list[PrefectFuture[list[StepReport]]]:
    return [cluster_task.submit(batch)]
