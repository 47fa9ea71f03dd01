from datetime import timedelta

import numpy as np
import pytest

from reverie.models.config import ClusterConfig
from reverie.models.tables import Origin
from reverie.tasks.cluster import (
    dominant_kind,
    find_clusters,
    is_candidate,
    match_existing,
    plan_clusters,
    rules_description,
    temporal_span_days,
)

from factories import AS_OF, at_cosine, axis, below, view

CONFIG = ClusterConfig()


def star(cosines):
    """A centre and members at the given cosines to it (members far from each other)."""
    return np.stack([axis(0)] + [at_cosine(c, other=k) for k, c in enumerate(cosines, start=1)])


def test_similarity_exactly_at_the_threshold_links() -> None:
    assert find_clusters(star([0.75] * 4), CONFIG) == [[0, 1, 2, 3, 4]]
    assert find_clusters(star([0.75, 0.75, 0.75, below(0.75)]), CONFIG) == []


def test_four_members_are_not_a_cluster_five_are() -> None:
    assert find_clusters(star([0.9] * 3), CONFIG) == []
    assert find_clusters(star([0.9] * 4), CONFIG) == [[0, 1, 2, 3, 4]]


def _unit(v):
    return (v / np.linalg.norm(v)).astype(np.float32)


def two_groups_and_a_bridge() -> np.ndarray:
    e = np.eye(64, dtype=np.float32)
    a = [_unit(e[0] + 0.25 * e[10 + k]) for k in range(6)]
    b = [_unit(e[1] + 0.25 * e[20 + k]) for k in range(6)]
    bridge = [_unit(e[0] + 0.6 * e[1]), _unit(0.6 * e[0] + e[1])]
    return np.stack(a + bridge + b)


def test_components_chain_through_a_bridge_leiden_cuts_it() -> None:
    vectors = two_groups_and_a_bridge()
    assert float(vectors[0] @ vectors[13]) < 0.1  # the two ends are unrelated
    assert find_clusters(vectors, CONFIG) == [list(range(14))]
    leiden = find_clusters(vectors, ClusterConfig(method="leiden"))
    assert len(leiden) == 2 and set(range(6)) <= set(leiden[0]) and set(range(8, 14)) <= set(leiden[1])


def test_dominant_kind_ties_break_alphabetically() -> None:
    members = [view("a", kind="semantic"), view("b", kind="episodic"), view("c", kind="semantic"),
               view("d", kind="episodic"), view("e", kind="pattern")]
    assert dominant_kind(members) == "episodic"


def test_temporal_span_is_the_real_number_of_days() -> None:
    members = [view("a", created_at=AS_OF), view("b", created_at=AS_OF - timedelta(days=10, hours=12)),
               view("c", created_at=AS_OF - timedelta(days=3))]
    assert temporal_span_days(members) == 10.5


def memories(n=5, **fields):
    return [view(f"m{i}", relevance=0.5, created_at=AS_OF - timedelta(days=i), **fields)
            for i in range(n)]


def test_a_plan_describes_the_cluster() -> None:
    (plan,) = plan_clusters("p", memories(), star([0.9] * 4), {}, CONFIG)
    assert plan.member_ids == ("m0", "m1", "m2", "m3", "m4")
    assert plan.meta == {"dominant_kind": "semantic", "cluster_size": 5,
                         "temporal_span_days": 4.0, "method": "components"}
    assert plan.content.startswith("Pattern of 5 related semantic memories over 4 days: ")
    centroid = np.frombuffer(plan.embedding, np.float32)
    assert np.linalg.norm(centroid) == pytest.approx(1.0, abs=1e-6)


def test_the_same_cluster_keeps_its_meta_memory() -> None:
    (first,) = plan_clusters("p", memories(), star([0.9] * 4), {}, CONFIG)
    existing = {first.meta_id: set(first.member_ids)}
    (again,) = plan_clusters("p", memories(), star([0.9] * 4), existing, CONFIG)
    assert again.meta_id == first.meta_id
    grown = plan_clusters("p", memories(6), star([0.9] * 5), existing, CONFIG)
    assert grown[0].meta_id == first.meta_id and len(grown[0].member_ids) == 6


def test_continuing_an_earlier_meta_memory_needs_enough_overlap() -> None:
    existing = {"old": {"a", "b", "c", "d"}}
    assert match_existing([["a", "b", "x", "y", "z"]], existing, 0.5) == ["old"]
    assert match_existing([["a", "x", "y", "z", "w"]], existing, 0.5) == [None]
    assert match_existing([["a", "b", "x"], ["c", "d", "a"]], existing, 0.5) == ["old", None]


def test_candidates_are_relevant_live_and_not_meta_memories() -> None:
    assert is_candidate(view("a", relevance=0.31), CONFIG)
    assert not is_candidate(view("a", relevance=0.3), CONFIG)
    assert not is_candidate(view("a", relevance=0.9, origin=Origin.META_MEMORY), CONFIG)


def test_a_rules_description_quotes_each_exemplar_up_to_its_configured_length() -> None:
    members = [view("a", content="x" * 30, importance=0.9), view("b", content="short")]
    text = rules_description(members, "semantic", ClusterConfig(exemplar_chars=20))
    assert "x" * 19 + "…" in text and "x" * 20 not in text and "short" in text
    whole = rules_description(members, "semantic", ClusterConfig(exemplar_chars=30))
    assert "x" * 30 in whole and "…" not in whole


def test_cluster_searches_with_its_own_probes() -> None:
    """Above the exact limit cluster probes as many cells as its own knob says, whatever
    the shared search section says."""
    from reverie.models.config import SearchConfig

    rng = np.random.default_rng(2)
    centres = rng.normal(size=(40, 32))
    v = centres[np.repeat(np.arange(40), 12)] + 0.35 * rng.normal(size=(480, 32))
    v = (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)
    exact = find_clusters(v, CONFIG)
    scarce = SearchConfig(exact_limit=10, rows_per_cell=10, cell_probes=1)
    config = ClusterConfig(similarity=CONFIG.similarity, cell_probes=4096)
    members = [view(f"m{i:03d}", relevance=0.9) for i in range(len(v))]
    plans = plan_clusters("p", members, v, {}, config, search=scarce)
    assert [list(p.member_ids) for p in plans] == [[f"m{i:03d}" for i in g] for g in exact]
    assert find_clusters(v, CONFIG, search=scarce) != exact  # one probe alone misses some
