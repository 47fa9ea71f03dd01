"""Lightweight consolidation: refresh Core Memory and decay idle edges, nothing else.

::

    compile_blocks
    decay_edges

The two steps are independent and run side by side. Cheap enough to run after
every 50 stores of a profile and whenever a session goes idle.
"""

from __future__ import annotations

from datetime import datetime

from prefect.futures import PrefectFuture

from flows.run import ProfileSelector, RunReport, reverie_flow, run_for_profiles
from models.config import ConsolidationConfig
from tasks.blocks import compile_blocks_task
from tasks.edge_decay import decay_edges_task
from tasks.step import StepBatch, StepReport

FLOW_NAME = "lightweight-consolidation"


@reverie_flow(FLOW_NAME)
def lightweight_consolidation(
    profile: ProfileSelector = None,
    as_of: datetime | None = None,
    dry_run: bool = False,
    config: ConsolidationConfig | None = None,
) -> RunReport:
    """Recompile the Core Memory blocks and decay idle association edges."""
    return run_for_profiles(FLOW_NAME, profile, as_of, dry_run, config, refresh_profiles)


def refresh_profiles(batch: StepBatch) -> list[PrefectFuture[list[StepReport]]]:
    return [compile_blocks_task.submit(batch), decay_edges_task.submit(batch)]
