"""Every flow by the short name the CLI and backfills use.

A flow is imported when it is first looked up: declaring one makes Prefect build the
JSON schema of its parameters (about 80 ms each), and a command runs one flow, not
nine.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefect import Flow

    from reverie.flows.report import RunReport


class FlowCatalog(Mapping[str, "Flow[..., RunReport]"]):
    """Short name → flow, each imported on lookup (the module's attribute is read every
    time, so a test that replaces it is seen)."""

    def __init__(self, where: dict[str, str]) -> None:
        self._where = where

    def __getitem__(self, name: str) -> Flow[..., RunReport]:
        module, _, attribute = self._where[name].partition(":")
        flow: Flow[..., RunReport] = getattr(importlib.import_module(module), attribute)
        return flow

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


FLOWS = FlowCatalog({
    "full": "reverie.flows.full_consolidation:full_consolidation",
    "lightweight": "reverie.flows.lightweight_consolidation:lightweight_consolidation",
    "decay": "reverie.flows.decay:decay",
    "creative": "reverie.flows.creative:creative",
    "cluster": "reverie.flows.cluster:cluster",
    "forget": "reverie.flows.forget:forget",
    "compress": "reverie.flows.compress:compress",
    "cold": "reverie.flows.consolidate_cold:consolidate_cold",
    "cold-tier": "reverie.flows.cold_tier:cold_tier",
})
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
