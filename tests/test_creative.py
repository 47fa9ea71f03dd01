from datetime import timedelta

import numpy as np

from reverie.models.config import CreativeConfig
from reverie.models.tables import EdgeKind
from reverie.tasks.creative import ALGORITHM, connection, draw_sample, is_candidate, plan_creative

from factories import AS_OF, at_cosine, axis, view

CONFIG = CreativeConfig()


def rule(a, b, sim):
    edge = connection(a, b, sim, CONFIG)
    return None if edge is None else (edge.kind, edge.subkind, edge.confidence)


def test_two_decisions_far_apart_contradict_before_any_other_rule() -> None:
    a, b = view("a", kind="decision"), view("b", kind="decision")  # same week too
    assert rule(a, b, 0.2) == (EdgeKind.CONTRADICTS, None, 0.6)
    assert rule(a, b, 0.3) != (EdgeKind.CONTRADICTS, None, 0.6)  # strictly below 0.3


def test_insight_explains_pattern_before_shared_theme() -> None:
    insight, pattern = view("z", kind="insight"), view("a", kind="pattern")
    edge = connection(pattern, insight, 0.8, CONFIG)
    assert (edge.kind, edge.subkind, edge.confidence) == (EdgeKind.DISCOVERED, "explains", 0.7)
    assert (edge.source_id, edge.target_id) == ("z", "a")
    assert rule(insight, pattern, 0.5) != (EdgeKind.DISCOVERED, "explains", 0.7)


def test_different_kinds_share_a_theme_with_their_similarity_as_confidence() -> None:
    a, b = view("a", kind="semantic"), view("b", kind="episodic")
    assert rule(a, b, 0.75) == (EdgeKind.DISCOVERED, "shares_theme", 0.75)
    assert rule(a, b, 0.7) is None  # strictly above 0.7, and too similar for parallel
    assert rule(view("a"), view("b"), 0.9) is None  # same kind


def test_parallel_context_within_seven_days() -> None:
    a = view("a", created_at=AS_OF)
    assert rule(a, view("b", created_at=AS_OF - timedelta(days=7)), 0.35) == (
        EdgeKind.DISCOVERED, "parallel_context", 0.5)
    assert rule(a, view("b", created_at=AS_OF - timedelta(days=7, seconds=1)), 0.35) is None
    assert rule(a, view("b", created_at=AS_OF), 0.4) is None  # strictly below 0.4


def test_already_linked_pairs_are_skipped() -> None:
    sample = [view("a", kind="decision"), view("b", kind="decision"), view("c", kind="decision")]
    vectors = np.stack([axis(0), axis(1), axis(2)])
    edges, skipped = plan_creative(sample, vectors, {frozenset(("a", "b"))}, AS_OF, CONFIG)
    assert skipped == 1
    assert {(e.source_id, e.target_id) for e in edges} == {("a", "c"), ("b", "c")}
    assert all(e.meta == {"discovered_at": AS_OF.isoformat(), "algorithm": ALGORITHM}
               for e in edges)


def test_similarity_comes_from_the_vectors() -> None:
    sample = [view("a", kind="semantic"), view("b", kind="episodic")]
    edges, _ = plan_creative(sample, np.stack([axis(0), at_cosine(0.8)]), set(), AS_OF, CONFIG)
    assert edges[0].subkind == "shares_theme" and abs(edges[0].confidence - 0.8) < 1e-6


def test_the_sample_is_reproducible_per_profile_and_date() -> None:
    first = draw_sample(100, 20, "p", AS_OF)
    assert draw_sample(100, 20, "p", AS_OF) == first and len(set(first)) == 20
    assert draw_sample(100, 20, "p", AS_OF + timedelta(days=7)) != first
    assert draw_sample(100, 20, "q", AS_OF) != first
    assert draw_sample(5, 20, "p", AS_OF) == [0, 1, 2, 3, 4]


def test_only_relevant_live_memories_are_candidates() -> None:
    assert is_candidate(view("a", relevance=0.31), CONFIG)
    assert not is_candidate(view("a", relevance=0.3), CONFIG)
    assert not is_candidate(view("a"), CONFIG)  # never scored
    assert not is_candidate(view("a", relevance=0.9, superseded_by="s"), CONFIG)


def test_each_rule_gives_its_configured_confidence() -> None:
    config = CreativeConfig(contradiction_confidence=0.9, explains_confidence=0.2,
                            parallel_confidence=0.35)
    decisions = view("a", kind="decision"), view("b", kind="decision")
    assert connection(*decisions, 0.2, config).confidence == 0.9
    insight, pattern = view("z", kind="insight"), view("a", kind="pattern")
    edge = connection(insight, pattern, 0.6, config)
    assert (edge.subkind, edge.confidence, edge.weight) == ("explains", 0.2, 0.2)
    edge = connection(view("a", created_at=AS_OF), view("b", created_at=AS_OF), 0.35, config)
    assert (edge.subkind, edge.confidence) == ("parallel_context", 0.35)
