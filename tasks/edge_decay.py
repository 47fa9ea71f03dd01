"""Step 4: decay association edges nobody has strengthened lately, prune the weakest.

An association edge idle for at least ``inactive_days`` (30) at ``as_of`` weighs
``base_weight * exp(-rate * days_idle)``. The weight is always computed from the
base weight recorded at the last strengthening, never from the current weight, so
running the step again with the same ``as_of`` gives the same weights (SLM's decay
compounds on every run; this does not). An edge whose weight falls below
``prune_below`` (0.05) is deleted; exactly 0.05 stays. Provenance edges (summary to
originals) never decay and are never pruned; other typed edges are left alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta

from reverie.models.config import EdgeDecayConfig
from reverie.models.records import EdgeView
from reverie.models.repositories.edges import association_edges_to_decay, update_edge_weights
from reverie.models.store import Store
from reverie.models.tables import EdgeKind
from reverie.models.timestamps import days_between
from reverie.tasks.step import Change, StepArgs, StepReport, step_task


def decayed_weight(edge: EdgeView, as_of: datetime, config: EdgeDecayConfig) -> float:
    idle_days = days_between(edge.last_strengthened_at, as_of)
    if idle_days < config.inactive_days:
        return edge.base_weight
    return edge.base_weight * math.exp(-config.rate_per_day * idle_days)


def plan_edge_decay(
    edges: Sequence[EdgeView], as_of: datetime, config: EdgeDecayConfig
) -> tuple[list[tuple[EdgeView, float]], list[tuple[EdgeView, float]]]:
    """(edges to reweigh with their new weight, edges to prune with the weight they fell to)."""
    reweigh: list[tuple[EdgeView, float]] = []
    prune: list[tuple[EdgeView, float]] = []
    for edge in edges:
        if edge.kind != EdgeKind.ASSOCIATION:
            continue
        weight = decayed_weight(edge, as_of, config)
        if weight < config.prune_below:
            prune.append((edge, weight))
        elif weight != edge.weight:
            reweigh.append((edge, weight))
    return reweigh, prune


def decay_edges(store: Store, args: StepArgs) -> StepReport:
    """Reweigh the profile's idle association edges from their base weight; prune the weakest."""
    profile, as_of, config = args.profile, args.as_of, args.config
    cutoff = as_of - timedelta(days=config.edge_decay.inactive_days)
    with args.reading(store) as tx:
        edges = association_edges_to_decay(tx, cutoff)
    reweigh, prune = plan_edge_decay(edges, as_of, config.edge_decay)
    with args.writing(store) as tx:
        strengthened = update_edge_weights(tx, reweigh, [e for e, _ in prune])
    report = StepReport("decay_edges", profile, examined=len(edges),
                        skipped=len(strengthened))
    for edge in edges:
        if edge.id in strengthened:
            report.record(Change("kept", edge.id, "strengthened during the run"),
                          counts=False)
    reweigh = [(e, w) for e, w in reweigh if e.id not in strengthened]
    prune = [(e, w) for e, w in prune if e.id not in strengthened]
    for edge, weight in reweigh:
        report.record(
            Change("decayed", edge.id, f"{edge.weight:.4f} -> {weight:.4f}")
        )
    for edge, weight in prune:
        report.record(
            Change("pruned", edge.id, f"weight {weight:.4f} < {config.edge_decay.prune_below}")
        )
    report.facts = {"decayed": len(reweigh), "pruned": len(prune)}
    return report


decay_edges_task = step_task("decay_edges", decay_edges)
