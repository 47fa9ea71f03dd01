"""Lightweight consolidation: refresh Core Memory and decay idle edges, nothing else.

::

    compile_blocks
    decay_edges

The two steps are independent and run side by side. Cheap enough to run after
every 50 stores of a profile and whenever a session goes idle.
"""

from __future__ import annotations

from datetime import datetime

from prefect import flow

from flows.artifacts import publish
from flows.run import ProfileSelector, RunReport, new_report, prepare_run, run_name, working_store
from models.config import ConsolidationConfig
from tasks.blocks import compile_blocks_task
from tasks.edge_decay import decay_edges_task

FLOW_NAME = "lightweight-consolidation"


@flow(name=FLOW_NAME, flow_run_name=run_name(FLOW_NAME), log_prints=False)
def lightweight_consolidation(
    profile: ProfileSelector = None,
    as_of: datetime | None = None,
    dry_run: bool = False,
    config: ConsolidationConfig | None = None,
) -> RunReport:
    """Recompile the Core Memory blocks and decay idle association edges."""
    plan = prepare_run(FLOW_NAME, profile, as_of, dry_run, config)
    report = new_report(plan)
    with working_store(plan) as url:
        futures = []
        for p in plan.profiles:
            args = (url, p, plan.as_of, plan.config)
            futures += [compile_blocks_task.submit(*args), decay_edges_task.submit(*args)]
        report.steps = [f.result() for f in futures]
    publish(report)
    return report
