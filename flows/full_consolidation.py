"""Full consolidation: SuperLocalMemory's six steps, plus compression of fading
memories (cognitive-memory), as one DAG per chunk of profiles (each task takes the
chunk's profiles one after another).

::

    dedup ──> compress_fading ──> dedup_new_summaries ──┬──> promote
                                                        ├──> compile_blocks
                                                        └──> link_summaries ──┐
    decay_edges ──────────────────────────────────────────────────────────────┴──> graph_importance

Merging comes first and compression second, because every later step should see the
consolidated store (compression also takes in what dedup left). Compression's own
summaries can be near-duplicates of each other, so merging looks once more at the new
summaries: a second run with the same as_of then finds nothing left to do. Edge decay touches
only old association edges, so it runs alongside. PageRank waits for every change
to the graph. Chunks run side by side.
"""

from __future__ import annotations

from prefect.futures import PrefectFuture

from reverie.runner.parameters import AsOf, Config, DryRun, Profile, StoreId
from reverie.runner.report import RunReport
from reverie.runner.run import run_for_profiles
from reverie.runner.runtime import reverie_flow
from reverie.tasks.blocks import compile_blocks_task
from reverie.tasks.compress import compress_fading_task
from reverie.tasks.dedup import dedup_new_summaries_task, dedup_task
from reverie.tasks.edge_decay import decay_edges_task
from reverie.tasks.importance import graph_importance_task
from reverie.tasks.linking import link_summaries_task
from reverie.tasks.promote import promote_task
from reverie.tasks.step import StepBatch, StepReport

FLOW_NAME = "full-consolidation"


@reverie_flow(FLOW_NAME)
def full_consolidation(
    profile: Profile = None,
    as_of: AsOf = None,
    dry_run: DryRun = False,
    config: Config = None,
    store_id: StoreId = None,
) -> RunReport:
    """Merge near-duplicates, recompile Core Memory, promote, decay edges, link new
    summaries and rescore the graph, for one profile, several, or all (``None``)."""
    return run_for_profiles(FLOW_NAME, profile, as_of, dry_run, config, consolidate_profiles,
                            store_id=store_id)


def consolidate_profiles(batch: StepBatch) -> list[PrefectFuture[list[StepReport]]]:
    dedup = dedup_task.submit(batch)
    compress = compress_fading_task.submit(batch, after=[dedup])
    merged = dedup_new_summaries_task.submit(batch, after=[compress])
    decay = decay_edges_task.submit(batch)
    promote = promote_task.submit(batch, after=[merged])
    blocks = compile_blocks_task.submit(batch, after=[merged])
    link = link_summaries_task.submit(batch, after=[merged])
    graph = graph_importance_task.submit(batch, after=[decay, link])
    return [dedup, compress, merged, blocks, promote, decay, link, graph]
