import math
from datetime import timedelta

import pytest

from reverie.models.config import EdgeDecayConfig
from reverie.models.records import EdgeView
from reverie.models.tables import EdgeKind
from reverie.tasks.edge_decay import decayed_weight, plan_edge_decay

from factories import AS_OF

CONFIG = EdgeDecayConfig()


def edge(days_idle: float, base: float = 0.8, weight: float | None = None,
         kind: str = EdgeKind.ASSOCIATION) -> EdgeView:
    return EdgeView("e", "a", "b", kind, base if weight is None else weight, base,
                    AS_OF - timedelta(days=days_idle))


def test_edges_idle_29_days_keep_their_weight_30_days_decay() -> None:
    assert decayed_weight(edge(29.999), AS_OF, CONFIG) == 0.8
    assert decayed_weight(edge(30), AS_OF, CONFIG) == pytest.approx(0.8 * math.exp(-0.3))


def test_decay_is_computed_from_the_base_weight_and_never_compounds() -> None:
    first, _ = plan_edge_decay([edge(60)], AS_OF, CONFIG)
    ((_, w1),) = first
    decayed = edge(60, weight=w1)
    again, prune = plan_edge_decay([decayed], AS_OF, CONFIG)
    assert again == [] and prune == []
    later, _ = plan_edge_decay([decayed], AS_OF + timedelta(days=10), CONFIG)
    assert later[0][1] == pytest.approx(0.8 * math.exp(-0.7))


def test_prune_below_005_but_keep_exactly_005() -> None:
    days = 100.0
    exact_base = 0.05 / math.exp(-0.01 * days)
    e_keep = edge(days, base=exact_base * (1 + 1e-12))
    e_prune = edge(days, base=exact_base * (1 - 1e-9))
    reweigh, prune = plan_edge_decay([e_keep, e_prune], AS_OF, CONFIG)
    assert [w for _, w in reweigh][0] >= 0.05
    assert [e.base_weight for e, _ in prune] == [e_prune.base_weight]
    assert prune[0][1] < 0.05


def test_weight_of_exactly_the_prune_bound_stays() -> None:
    reweigh, prune = plan_edge_decay([edge(0, base=0.05)], AS_OF, CONFIG)
    assert (reweigh, prune) == ([], [])


def test_provenance_edges_never_decay_or_prune() -> None:
    old = [edge(10_000, base=0.06, kind=EdgeKind.CONSOLIDATION), edge(10_000, base=0.06, kind=EdgeKind.SUMMARIZES)]
    assert plan_edge_decay(old, AS_OF, CONFIG) == ([], [])


def test_an_edge_strengthened_after_as_of_is_at_full_weight() -> None:
    e = edge(-5, base=0.5, weight=0.2)
    reweigh, _ = plan_edge_decay([e], AS_OF, CONFIG)
    assert reweigh[0][1] == 0.5
