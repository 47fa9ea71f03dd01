"""Recall keys: a hot summary is found by its cold originals; deep recall ranks the
originals themselves and leaves out a summary whose originals are all there."""

import numpy as np

from reverie.engines.ranking import plan_candidates, rank, tiers_for
from reverie.models.tables import Origin, Tier

from factories import axis, view


def store():
    """A hot summary s of two cold originals (about axes 1 and 2), an unrelated hot memory
    h (axis 3), and a summary t absorbed by s (cold)."""
    memories = [
        view("h"),
        view("o1", tier=Tier.COLD, superseded_by="s"),
        view("o2", tier=Tier.COLD, superseded_by="s"),
        view("s", origin=Origin.COMPRESSED),
        view("t", origin=Origin.DEDUP_SUMMARY, tier=Tier.COLD, superseded_by="s"),
    ]
    vectors = np.stack([axis(3), axis(1), axis(2), axis(0), axis(4)])
    return memories, vectors


def ids(candidates, best):
    return [candidates.memories[row].id for row, _ in best]


def test_a_hot_summary_scores_as_its_best_original_not_itself() -> None:
    candidates = plan_candidates(*store(), tiers_for(deep=False))
    assert [m.id for m in candidates.memories] == ["h", "s"]
    assert sorted(candidates.key_owners.tolist()) == [1, 1]  # o1 and o2, never t
    [best] = rank(candidates, axis(2)[None, :], 2)
    assert ids(candidates, best) == ["s", "h"] and best[0][1] == 1.0
    [best] = rank(candidates, axis(0)[None, :], 2)
    assert best[0][1] == 0.0  # its own vector is not a key
    [best] = rank(candidates, axis(3)[None, :], 1)
    assert ids(candidates, best) == ["h"]  # keys never crowd out the k asked for


def test_without_keys_the_summary_is_ranked_by_its_own_vector() -> None:
    memories, vectors = store()
    candidates = plan_candidates(memories[:1] + memories[3:4], vectors[[0, 3]], (Tier.HOT,))
    [best] = rank(candidates, axis(0)[None, :], 5)
    assert ids(candidates, best) == ["s", "h"] and len(candidates.key_owners) == 0


def test_deep_recall_ranks_originals_not_their_summaries() -> None:
    candidates = plan_candidates(*store(), tiers_for(deep=True))
    assert [m.id for m in candidates.memories] == ["h", "o1", "o2"]
    assert len(candidates.key_owners) == 0  # no original counted twice
    [best] = rank(candidates, axis(1)[None, :], 1)
    assert ids(candidates, best) == ["o1"]


def test_a_summary_without_originals_is_a_memory_like_any_other() -> None:
    memories, vectors = store()
    lone = plan_candidates([memories[3]], vectors[[3]], tiers_for(deep=True))
    assert [m.id for m in lone.memories] == ["s"]


def by_id(candidates) -> dict:
    """The whole views recall would read for the hits: here, the candidates themselves."""
    return {m.id: m for m in (*candidates.memories, *candidates.key_memories)}


def test_a_summary_recalled_for_one_member_shows_that_member_whole_and_dated() -> None:
    from datetime import datetime

    from reverie.engines.ranking import dated, hits_from, passages

    memories, vectors = store()
    memories[1] = view("o1", tier=Tier.COLD, superseded_by="s", content="Ann adopted a cat",
                       created_at=datetime(2023, 5, 8))
    memories[2] = view("o2", tier=Tier.COLD, superseded_by="s", content="Ann ran 5 km",
                       created_at=datetime(2023, 5, 12))
    memories[3] = view("s", origin=Origin.COMPRESSED,
                       content="Ann - 8 May 2023: adopted a cat. 12 May: ran 5 km.")
    candidates = plan_candidates(memories, vectors, tiers_for(deep=False))
    [found] = passages(candidates, axis(2)[None, :], 1)
    [hit] = hits_from(candidates, found, by_id(candidates))
    assert hit.memory.id == "s" and [m.id for m in hit.members] == ["o2"]
    assert hit.text == "Ann ran 5 km (12 May 2023)" == dated(memories[2])
    # Both members match a query between them: both show, oldest first, not the summary.
    both = (axis(1) + axis(2)) / np.sqrt(2)
    [found] = passages(candidates, both[None, :], 1)
    [hit] = hits_from(candidates, found, by_id(candidates))
    assert [m.id for m in hit.members] == ["o1", "o2"]
    assert hit.text == "Ann adopted a cat (8 May 2023)\nAnn ran 5 km (12 May 2023)"
    assert "adopted a cat." not in hit.text  # the members' own words, not the summary's


def test_an_update_found_by_its_older_value_shows_the_newest_only() -> None:
    from reverie.engines.ranking import hits_from, passages

    memories = [view("new", content="Ann lives in Oslo"),
                view("old", tier=Tier.COLD, superseded_by="new", content="Ann lives in Rome")]
    candidates = plan_candidates(memories, np.stack([axis(0), axis(1)]), tiers_for(deep=False))
    [found] = passages(candidates, axis(1)[None, :], 1)
    [hit] = hits_from(candidates, found, by_id(candidates))
    assert hit.memory.id == "new" and hit.members == () and hit.text == "Ann lives in Oslo"


def test_an_update_is_found_by_its_own_words_too() -> None:
    """The newest value is a memory like any other: its own vector finds it, not only
    the older values it replaced (a newcomer's "Frau Okafor" found the old accountant's
    statement's key at 0.59 and the current one's own sentence nowhere)."""
    from reverie.engines.ranking import hits_from, passages

    memories = [view("new", content="Ann lives in Oslo"),
                view("old", tier=Tier.COLD, superseded_by="new", content="Ann lives in Rome"),
                view("h", content="Ann has a cat")]
    vectors = np.stack([axis(0), axis(1), axis(2)])
    candidates = plan_candidates(memories, vectors, tiers_for(deep=False))
    [best] = rank(candidates, axis(0)[None, :], 1)
    assert ids(candidates, best) == ["new"] and best[0][1] == 1.0
    [found] = passages(candidates, axis(0)[None, :], 2)
    assert [h.memory.id for h in hits_from(candidates, found, by_id(candidates))] == [
        "new", "h"]
    # Found by both, it is one hit.
    both = (axis(0) + axis(1)) / np.sqrt(2)
    [found] = passages(candidates, both[None, :], 2)
    assert [h.memory.id for h in hits_from(candidates, found, by_id(candidates))] == [
        "new", "h"]


def test_passages_and_rank_agree_on_the_rows_and_their_order() -> None:
    from reverie.engines.ranking import hits_from, passages

    candidates = plan_candidates(*store(), tiers_for(deep=False))
    for q in (axis(0), axis(1), axis(2), axis(3), (axis(1) + axis(3)) / np.sqrt(2)):
        for k in (1, 2, 5):
            [best] = rank(candidates, q[None, :], k)
            [found] = passages(candidates, q[None, :], k)
            assert [h.memory.id for h in hits_from(candidates, found, by_id(candidates))] == ids(candidates, best)
