"""Every flow by the short name the CLI and backfills use."""

from __future__ import annotations

from prefect import Flow

from flows.cluster import cluster
from flows.cold_tier import cold_tier
from flows.compress import compress
from flows.consolidate_cold import consolidate_cold
from flows.creative import creative
from flows.decay import decay
from flows.forget import forget
from flows.full_consolidation import full_consolidation
from flows.lightweight_consolidation import lightweight_consolidation
from flows.run import RunReport

FLOWS: dict[str, Flow[..., RunReport]] = {
    "full": full_consolidation,
    "lightweight": lightweight_consolidation,
    "decay": decay,
    "creative": creative,
    "cluster": cluster,
    "forget": forget,
    "compress": compress,
    "cold": consolidate_cold,
    "cold-tier": cold_tier,
}
MAINTENANCE = ("decay", "creative", "cluster", "forget")
# The deployment (in prefect.yaml) that runs each flow on a work pool.
DEPLOYMENTS: dict[str, str] = {
    "full": "full-consolidation/nightly",
    "lightweight": "lightweight-consolidation/on-demand",
    "decay": "decay/daily",
    "creative": "creative/weekly",
    "cluster": "cluster/monthly",
    "forget": "forget/operator",
    "cold": "consolidate-cold/sleep",
    "cold-tier": "cold-tier/tiering",
}
