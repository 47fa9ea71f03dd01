from datetime import timedelta

import numpy as np

from reverie.engines.similarity import radius_neighbours
from reverie.models.config import DedupConfig
from reverie.models.tables import Lifecycle, Origin, Tier
from reverie.tasks.dedup import (
    duplicate_groups,
    find_duplicates,
    is_candidate,
    nothing_merged_note,
    plan_merges,
    representative_order,
)

from factories import AS_OF, at_cosine, axis, below, view

CONFIG = DedupConfig()


def plan(memories, vectors, originals=None, config=CONFIG):
    found = find_duplicates(memories, np.stack(vectors), AS_OF, config)
    return plan_merges("p", found, originals or {}, config)


def star(cosines):
    """A representative 'r' with many words, and members at the given cosines to it."""
    memories = [view("r", content="the representative memory with the most distinct words")]
    vectors = [axis(0)]
    for n, cos in enumerate(cosines, start=1):
        memories.append(view(f"m{n}", content=f"member {n}"))
        vectors.append(at_cosine(cos, other=n))
    return memories, vectors


def test_cosine_exactly_at_threshold_joins_the_group() -> None:
    t = CONFIG.similarity
    plans = plan(*star([t, t]))
    assert len(plans) == 1
    assert plans[0].member_ids == ("m1", "m2", "r")


def test_cosine_just_below_threshold_does_not_join() -> None:
    t = CONFIG.similarity
    assert plan(*star([t, below(t)])) == []


def test_a_pair_is_not_merged_but_three_are() -> None:
    assert plan(*star([0.9])) == []
    assert len(plan(*star([0.9, 0.9]))) == 1


def test_min_group_size_is_a_setting() -> None:
    assert plan(*star([0.9, 0.9]), config=DedupConfig(min_group_size=4)) == []
    assert len(plan(*star([0.9, 0.9, 0.9]), config=DedupConfig(min_group_size=4))) == 1


def test_a_merge_says_a_member_that_adds_words_and_its_audit_says_why() -> None:
    memories, vectors = star([0.9, 0.9])
    memories[1:] = [view("m1", content="the distinct memory"),
                    view("m2", content="the memory with distinct hues")]
    (facts_only,) = plan(memories, vectors)
    assert facts_only.content == memories[0].content
    assert "restated_share" not in facts_only.parameters
    # m1 says nothing new; m2 one content word in three ("hues"): 2/3 said.
    (kept,) = plan(memories, vectors, config=DedupConfig(restated_share=0.8))
    assert kept.content == f"{memories[0].content}. {memories[2].content}"
    assert kept.parameters["restated_share"] == 0.8
    (loose,) = plan(memories, vectors, config=DedupConfig(restated_share=0.6))
    assert loose.content == memories[0].content


def test_groups_do_not_chain_through_members() -> None:
    # a - b - c - d, each neighbour 0.85 apart, a and c, b and d, a and d far apart.
    t = np.float32(0.85)
    s = np.float32(np.sqrt(1 - 0.85**2))
    a = axis(0)
    b = (t * a + s * axis(1)).astype(np.float32)
    c = (t * b + s * axis(2)).astype(np.float32)
    d = (t * c + s * axis(3)).astype(np.float32)
    vectors = [v / np.linalg.norm(v) for v in (a, b, c, d)]
    memories = [view("a", content="a x"), view("b", content="b is the most informative one"),
                view("c", content="c x"), view("d", content="d x")]
    plans = plan(memories, vectors)
    assert [p.member_ids for p in plans] == [("a", "b", "c")]  # d is b's neighbour's neighbour


def test_a_memory_joins_only_the_first_group_that_claims_it() -> None:
    vectors = np.stack([axis(0), at_cosine(0.9, other=2), at_cosine(0.9, other=3),
                        at_cosine(0.9, base=1, other=4), at_cosine(0.9, base=1, other=5),
                        axis(1)])
    neighbours = radius_neighbours(vectors, CONFIG.similarity)
    groups = duplicate_groups(neighbours, [0, 5, 1, 2, 3, 4], CONFIG)
    assert groups == [[0, 1, 2], [5, 3, 4]]


def test_protected_expired_superseded_and_cold_memories_are_not_candidates() -> None:
    assert is_candidate(view("x"), AS_OF)
    assert is_candidate(view("x", lifecycle=Lifecycle.PROMOTED), AS_OF)
    assert not is_candidate(view("x", protected=True), AS_OF)
    assert not is_candidate(view("x", valid_until=AS_OF), AS_OF)
    assert is_candidate(view("x", valid_until=AS_OF + timedelta(seconds=1)), AS_OF)
    assert not is_candidate(view("x", valid_from=AS_OF + timedelta(days=1)), AS_OF)
    assert not is_candidate(view("x", tier=Tier.COLD), AS_OF)
    assert not is_candidate(view("x", superseded_by="s"), AS_OF)


def test_protected_member_stays_out_of_the_group() -> None:
    memories, vectors = star([0.9, 0.9])
    memories[2] = view("m2", content="member 2", protected=True)
    assert plan(memories, vectors) == []


def test_summary_takes_the_representatives_words_and_vector_and_merged_attributes() -> None:
    memories, vectors = star([0.9, 0.9])
    memories[0] = view("r", content=memories[0].content, importance=0.2, stability=1.0,
                       access_count=1, created_at=AS_OF - timedelta(days=40))
    # Members that state no number or name the representative does not: its words stand.
    memories[1] = view("m1", importance=0.9, stability=2.0, access_count=7, confidence=0.8,
                       last_accessed_at=AS_OF - timedelta(days=2),
                       content="the representative memory")
    memories[2] = view("m2", importance=0.4, stability=3.0, access_count=2,
                       content="memory with distinct words")
    (p,) = plan(memories, vectors)
    assert p.content == memories[0].content and p.representative_id == "r"
    assert np.array_equal(np.frombuffer(p.embedding, np.float32), vectors[0])
    assert (p.importance, p.stability, p.access_count, p.confidence) == (0.9, 2.0, 7, 0.8)
    assert p.created_at == AS_OF - timedelta(days=40)
    assert p.last_accessed_at == AS_OF - timedelta(days=2)
    assert p.operation == Origin.DEDUP_SUMMARY


def test_a_member_stating_a_fact_the_representative_lacks_is_said_whole() -> None:
    memories, vectors = star([0.9, 0.9])
    memories[1] = view("m1", content="Backoff is capped at 8 seconds.",
                       created_at=AS_OF - timedelta(days=3))
    memories[2] = view("m2", content="the representative memory")
    (p,) = plan(memories, vectors)
    assert p.content == (
        "the representative memory with the most distinct words. "
        "Backoff is capped at 8 seconds.")
    # The representative's vector still: the group is what lies within the threshold of
    # it, so a second pass finds nothing new near the summary.
    assert np.array_equal(np.frombuffer(p.embedding, np.float32), vectors[0])


def test_same_members_give_the_same_summary_id() -> None:
    first = plan(*star([0.9, 0.9]))[0].summary_id
    assert plan(*star([0.9, 0.9]))[0].summary_id == first
    assert plan(*star([0.9, 0.91]))[0].summary_id == first


def test_a_group_absorbing_an_earlier_summary_stands_for_its_originals() -> None:
    memories, vectors = star([0.9, 0.9])
    memories[1] = view("s1", content="member 1", origin=Origin.DEDUP_SUMMARY)
    originals = {"s1": [view("o1", tier=Tier.COLD, superseded_by="s1"),
                        view("o2", tier=Tier.COLD, superseded_by="s1")]}
    (p,) = plan(memories, vectors, originals)
    assert p.member_ids == ("m2", "o1", "o2", "r")
    assert p.absorbed_ids == ("s1",)


def test_only_the_summaries_a_group_absorbs_have_their_originals_read() -> None:
    memories, vectors = star([0.9, 0.9])
    memories[1] = view("s1", content="member 1", origin=Origin.DEDUP_SUMMARY)
    # A summary far from every group: its originals are not needed.
    memories.append(view("s2", content="elsewhere", origin=Origin.COMPRESSED))
    vectors.append(axis(7))
    found = find_duplicates(memories, np.stack(vectors), AS_OF, CONFIG)
    assert found.absorbed() == ["s1"]
    plain, plain_vectors = star([0.9, 0.9])
    assert find_duplicates(plain, np.stack(plain_vectors), AS_OF, CONFIG).absorbed() == []


def test_representatives_are_the_most_informative_first() -> None:
    memories = [view("a", content="short one"), view("b", content="a much longer memory text"),
                view("c", content="short two", importance=0.9), view("d", content="short six")]
    assert representative_order(memories) == [1, 2, 0, 3]
    assert representative_order(memories, [3, 0, 2]) == [2, 0, 3]


def test_a_pass_that_merges_nothing_says_which_knob_held_it_back() -> None:
    config = DedupConfig(similarity=0.9, min_group_size=3)
    assert nothing_merged_note(12, config) == [
        "no 3 of the 12 memories are alike at cosine >= 0.9"]
    assert nothing_merged_note(2, config) == []  # fewer than a group: nothing to explain


def test_comparisons_per_row_follow_the_search() -> None:
    from reverie.engines.similarity import comparisons_per_row
    from reverie.models.config import SearchConfig

    search = SearchConfig(exact_limit=1_000, rows_per_cell=100, cell_probes=8)
    assert comparisons_per_row(1_000, search) == 1_000  # exact: every row
    assert comparisons_per_row(1_001, search) == 8 * 101  # 10 cells of 100.1 rows, 8 probed
    assert comparisons_per_row(1_001, SearchConfig(exact_limit=1_000, cell_probes=64)) == 1_001


def test_the_new_summary_check_is_skipped_only_when_the_search_is_cheaper() -> None:
    """More new summaries than the merge's search compares each row with: "maybe",
    without comparing them; fewer: an exact answer either way."""
    from reverie.models.config import SearchConfig
    from reverie.tasks.dedup import may_have_new_duplicates

    lone = [view(f"s{k}", origin=Origin.COMPRESSED, linked_at=None) for k in range(4)]
    vectors = np.stack([axis(k) for k in range(4)])  # nothing alike
    exact = SearchConfig(exact_limit=1_000)
    assert not may_have_new_duplicates(lone, vectors, AS_OF, CONFIG, exact)
    cells = SearchConfig(exact_limit=2, rows_per_cell=10, cell_probes=1)  # 2 rows per row
    assert may_have_new_duplicates(lone, vectors, AS_OF, CONFIG, cells)
    old = [view(f"o{k}", linked_at=AS_OF) for k in range(3)]
    assert not may_have_new_duplicates([lone[0], *old], np.stack([axis(k) for k in range(4)]),
                                       AS_OF, CONFIG, cells)
