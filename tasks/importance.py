"""Step 5: score every hot memory by its place in the memory graph.

Weighted PageRank and Leiden communities over the hot memories and all edges
between them (associations, provenance and typed edges alike), stored per memory.
Memories outside the hot graph have their scores cleared. The same graph always
yields the same scores and community numbers (see ``tasks.graph``).
"""

from __future__ import annotations

from reverie.engines.graph import importance
from reverie.models.repositories.edges import weighted_ends
from reverie.models.repositories.memories import memory_ids, set_graph_scores
from reverie.models.store import Store
from reverie.tasks.step import Change, StepArgs, StepReport, step_task

TOP_REPORTED = 5


def graph_importance(store: Store, args: StepArgs) -> StepReport:
    """Recompute and store PageRank and community of the profile's hot memories."""
    profile, config = args.profile, args.config
    # Edges to memories beyond the run's horizon are no edges of the graph: it has
    # only the memories the run took the profile with.
    with args.reading(store) as tx:
        nodes = memory_ids(tx)
        edges = weighted_ends(tx)
    scores = importance(nodes, edges, config.graph.damping, config.graph.community_seed)
    with args.writing(store) as tx:
        changed = set(set_graph_scores(tx, scores))
    report = StepReport("graph_importance", profile, examined=len(nodes))
    scored = [sc for sc in scores if sc.memory_id in changed]
    unscored = sorted(changed - {sc.memory_id for sc in scores})
    report.tally(len(scored), (
        Change("scored", sc.memory_id, f"pagerank {sc.pagerank:.5f}, community {sc.community}")
        for sc in scored
    ))
    report.tally(len(unscored), (Change("unscored", mid, "left the hot graph") for mid in unscored))
    top = sorted(scores, key=lambda sc: (-sc.pagerank, sc.memory_id))[:TOP_REPORTED]
    report.facts = {
        "edges": len(edges),
        "communities": len({sc.community for sc in scores}),
        "top": [sc.memory_id for sc in top],
    }
    return report


graph_importance_task = step_task("graph_importance", graph_importance)
