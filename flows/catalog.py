"""Every flow by the short name the CLI and backfills use."""

from __future__ import annotations

from prefect import Flow

from reverie.flows.cluster import cluster
from reverie.flows.cold_tier import cold_tier
from reverie.flows.compress import compress
from reverie.flows.consolidate_cold import consolidate_cold
from reverie.flows.creative import creative
from reverie.flows.decay import decay
from reverie.flows.forget import forget
from reverie.flows.full_consolidation import full_consolidation
from reverie.flows.lightweight_consolidation import lightweight_consolidation
from reverie.flows.run import RunReport

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
