from datetime import timedelta

import numpy as np

from reverie.models.config import CompressConfig
from reverie.models.tables import Lifecycle, Origin, Tier
from reverie.tasks.compress import is_candidate, plan_compression, rules_wording
from reverie.tasks.summarize import RulesSummarizer

from factories import AS_OF, at_cosine, axis, below, view

CONFIG = CompressConfig()


def fading(n: int, cos: float = 0.9, **fields):
    """A seed (oldest) and n-1 members at ``cos`` to it, all fading."""
    memories = [view(f"f{i}", relevance=0.1, content=f"fact {i}",
                     created_at=AS_OF - timedelta(days=100 - i), **fields) for i in range(n)]
    vectors = [axis(0)] + [at_cosine(cos, other=i) for i in range(1, n)]
    return memories, vectors


def plan(memories, vectors, originals=None):
    return plan_compression("p", memories, np.stack(vectors), originals or {}, CONFIG,
                            RulesSummarizer())


def test_relevance_must_be_strictly_below_020() -> None:
    assert is_candidate(view("a", relevance=0.1999), CONFIG)
    assert not is_candidate(view("a", relevance=0.20), CONFIG)
    assert not is_candidate(view("a"), CONFIG)  # never scored


def test_promoted_protected_and_cold_memories_are_not_compressed() -> None:
    assert not is_candidate(view("a", relevance=0.1, lifecycle=Lifecycle.PROMOTED), CONFIG)
    assert not is_candidate(view("a", relevance=0.1, protected=True), CONFIG)
    assert not is_candidate(view("a", relevance=0.1, tier=Tier.COLD, superseded_by="s"), CONFIG)


def test_cosine_exactly_070_joins_just_below_does_not() -> None:
    assert len(plan(*fading(5, 0.70))) == 1
    memories, vectors = fading(5, 0.70)
    vectors[4] = at_cosine(below(0.70), other=4)
    assert plan(memories, vectors) == []


def test_four_members_are_not_compressed_five_are() -> None:
    assert plan(*fading(4)) == []
    (p,) = plan(*fading(5))
    assert p.member_ids == ("f0", "f1", "f2", "f3", "f4") and p.operation == Origin.COMPRESSED


def test_a_group_stops_at_group_size() -> None:
    (p,) = plan(*fading(7))
    assert len(p.member_ids) == 5


def test_only_memories_of_the_same_kind_are_grouped() -> None:
    memories, vectors = fading(5)
    memories[4] = view("f4", relevance=0.1, kind="episodic", created_at=memories[4].created_at)
    assert plan(memories, vectors) == []


def test_summary_attributes_max_importance_mean_stability_max_access() -> None:
    memories, vectors = fading(5)
    memories = [
        view(m.id, relevance=0.1, content=m.content, created_at=m.created_at,
             importance=imp, stability=stab, access_count=acc)
        for m, imp, stab, acc in zip(memories, [0.1, 0.9, 0.3, 0.2, 0.4], [1, 2, 3, 4, 5],
                                     [0, 7, 2, 1, 3], strict=True)
    ]
    (p,) = plan(memories, vectors)
    assert (p.importance, p.stability, p.access_count) == (0.9, 3.0, 7)
    assert p.link_weight == 0.8 and p.embedding is None  # embedded afresh when written
    assert p.content == "Summary: fact 0 | fact 1 | fact 2 | fact 3 | fact 4"


def test_rules_wording_joins_in_order() -> None:
    assert rules_wording([view("a", content="x"), view("b", content="y")]) == "Summary: x | y"


def test_a_group_with_an_earlier_summary_is_built_from_its_originals() -> None:
    memories, vectors = fading(5)
    memories[0] = view("s1", relevance=0.1, origin=Origin.DEDUP_SUMMARY, content="earlier summary",
                       created_at=memories[0].created_at)
    originals = {"s1": [view("o1", tier=Tier.COLD, superseded_by="s1"),
                        view("o2", tier=Tier.COLD, superseded_by="s1"),
                        view("s0", tier=Tier.COLD, superseded_by="s1", origin=Origin.COMPRESSED)]}
    (p,) = plan(memories, vectors, originals)
    assert p.member_ids == ("f1", "f2", "f3", "f4", "o1", "o2")  # never the older summary s0
    assert p.absorbed_ids == ("s1",) and "earlier summary" not in p.content


def test_a_pass_that_compresses_nothing_says_which_knob_held_it_back() -> None:
    from reverie.models.config import CompressConfig
    from reverie.tasks.compress import nothing_to_compress_note

    config = CompressConfig(max_relevance=0.2, similarity=0.7, group_size=5)
    assert nothing_to_compress_note(4, config) == [
        "4 fading memories (relevance below 0.2); a compression group needs 5"]
    assert nothing_to_compress_note(5, config) == [
        "no 5 of the 5 fading memories are alike at cosine >= 0.7"]
