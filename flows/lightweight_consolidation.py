"""Lightweight consolidation: refresh Core Memory and decay idle edges, nothing else.

::

    compile_blocks
    decay_edges

The two steps are independent and run side by side. Cheap enough to run after
every 50 stores of a profile and whenever a session goes idle.
"""

from __future__ import annotations

from prefect.futures import PrefectFuture

from reverie.runner.parameters import AsOf, Config, DryRun, Profile, StoreId
from reverie.runner.report import RunReport
from reverie.runner.run import run_for_profiles
from reverie.runner.runtime import reverie_flow
from reverie.tasks.blocks import compile_blocks_task
from reverie.tasks.edge_decay import decay_edges_task
from reverie.tasks.step import StepBatch, StepReport

FLOW_NAME = "lightweight-consolidation"


@reverie_flow(FLOW_NAME)
def lightweight_consolidation(
    profile: Profile = None,
    as_of: AsOf = None,
    dry_run: DryRun = False,
    config: Config = None,
    store_id: StoreId = None,
) -> RunReport:
    """Recompile the Core Memory blocks and decay idle association edges."""
    return run_for_profiles(FLOW_NAME, profile, as_of, dry_run, config, refresh_profiles,
                            store_id=store_id)


def refresh_profiles(batch: StepBatch) -> list[PrefectFuture[list[StepReport]]]:
    return [compile_blocks_task.submit(batch), decay_edges_task.submit(batch)]
