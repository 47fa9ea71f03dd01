"""Step 6: connect new summaries to the memories around them.

Every hot summary not yet linked gets an association edge (weight = similarity) to
each of its ``max_links`` nearest hot memories at cosine >= ``similarity`` (0.7),
and is then marked linked. Linking is keyed on that mark, not on "created in this
run", so a run that stopped after merging links its summaries when run again.

Above ``search.exact_limit`` hot memories the nearest are those in the
``cell_probes`` cells each summary probes (``engines.similarity``): at 1M, an eighth of
the time of comparing every summary with every memory, at a recall BENCHMARKS.md
measures.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reverie.engines.similarity import DEFAULT_SEARCH, nearest_within
from reverie.models.config import LinkConfig, SearchConfig
from reverie.models.records import MemoryView, NewEdge
from reverie.models.repositories.edges import add_edges
from reverie.models.repositories.memories import ingested_since, snapshot
from reverie.models.store import Store
from reverie.models.tables import SUMMARY_ORIGINS, EdgeKind
from reverie.tasks.step import Change, StepArgs, StepReport, step_task


def needs_link(memory: MemoryView) -> bool:
    return memory.origin in SUMMARY_ORIGINS and memory.linked_at is None


def link_rows(memories: Sequence[MemoryView]) -> list[int]:
    """The rows of ``memories`` that are summaries not linked yet: those linking gives
    neighbours to, and the new summaries the second merge pass checks."""
    return [i for i, m in enumerate(memories) if needs_link(m)]


def plan_links(
    memories: Sequence[MemoryView], vectors: np.ndarray, config: LinkConfig,
    search: SearchConfig = DEFAULT_SEARCH,
) -> tuple[list[str], list[NewEdge]]:
    """(summaries to mark linked, association edges to add); rows are aligned."""
    rows = link_rows(memories)
    if not rows:
        return [], []
    neighbours = nearest_within(vectors, rows, config.similarity, config.max_links,
                                search.with_probes(config.cell_probes))
    edges: list[NewEdge] = []
    for row, found, sims in zip(rows, neighbours.indices, neighbours.similarities, strict=True):
        for j, sim in zip(found, sims, strict=True):
            edges.append(
                NewEdge(memories[row].id, memories[int(j)].id, EdgeKind.ASSOCIATION,
                        round(float(sim), 6))
            )
    return [memories[i].id for i in rows], edges


def without_reingested(
    linked: list[str], edges: list[NewEdge], reingested: set[str]
) -> tuple[list[str], list[NewEdge], list[str]]:
    """(summaries, edges) of a plan without the summaries that would link a memory an
    ingest wrote since the run took the profile (``reingested``: its neighbours were
    found with its old vector); and those summaries. They stay unlinked, and the next
    run links them to their neighbours as they are then."""
    if not reingested:
        return linked, edges, []
    waiting = {e.source_id for e in edges if e.target_id in reingested}
    waiting.update(sid for sid in linked if sid in reingested)
    return ([sid for sid in linked if sid not in waiting],
            [e for e in edges if e.source_id not in waiting],
            [sid for sid in linked if sid in waiting])


def link_summaries(store: Store, args: StepArgs) -> StepReport:
    """Add association edges from each unlinked summary of the profile to its neighbours."""
    profile, as_of, config = args.profile, args.as_of, args.config
    with args.reading(store) as tx:
        memories, vectors = snapshot(tx)
    linked, edges = plan_links(memories, vectors, config.linking, config.search)
    with args.writing(store) as tx:
        linked, edges, waiting = without_reingested(linked, edges, ingested_since(tx))
        add_edges(tx, edges, as_of, linked_summaries=linked)
    report = StepReport("link_summaries", profile, examined=len(linked) + len(waiting))
    for sid in waiting:
        report.skipped += 1
        report.record(Change("deferred", sid, "a neighbour was ingested again during the "
                             "run: left for the next run"), counts=False)
    per_summary: dict[str, int] = {sid: 0 for sid in linked}
    for e in edges:
        per_summary[e.source_id] += 1
    for sid, n in per_summary.items():
        detail = f"{n} neighbours at cosine >= {config.linking.similarity}"
        report.record(Change("linked", sid, detail))
    report.facts = {"edges": len(edges)}
    return report


link_summaries_task = step_task("link_summaries", link_summaries)
