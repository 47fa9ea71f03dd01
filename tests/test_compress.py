from datetime import datetime, timedelta

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from reverie.models.config import CompressConfig
from reverie.models.tables import Lifecycle, Origin, Tier
from reverie.tasks.compress import compression_plans, is_candidate, rules_wording

from factories import AS_OF, at_cosine, axis, below, view

# The mechanism, at the groups of 2 to 8 at cosine 0.60 these tests were written for.
CONFIG = CompressConfig(similarity=0.60, min_group_size=2, max_group_size=8)


def fading(n: int, cos: float = 0.9, **fields):
    """A seed (oldest) and n-1 members at ``cos`` to it, all fading: events by default
    ("fact 1" and "fact 2" as facts would state two values of one: never compressed
    together, see test_supersede)."""
    fields = {"kind": "episodic", **fields}
    memories = [view(f"f{i}", relevance=0.1, content=f"fact {i}",
                     created_at=AS_OF - timedelta(days=100 - i), **fields) for i in range(n)]
    vectors = [axis(0)] + [at_cosine(cos, other=i) for i in range(1, n)]
    return memories, vectors


def plan(memories, vectors, config=CONFIG):
    return list(compression_plans("p", AS_OF, memories, np.stack(vectors), config))


def test_relevance_must_be_strictly_below_020() -> None:
    assert is_candidate(view("a", relevance=0.1999), CONFIG)
    assert not is_candidate(view("a", relevance=0.20), CONFIG)
    assert not is_candidate(view("a"), CONFIG)  # never scored


def test_promoted_protected_and_cold_memories_are_not_compressed() -> None:
    assert not is_candidate(view("a", relevance=0.1, lifecycle=Lifecycle.PROMOTED), CONFIG)
    assert not is_candidate(view("a", relevance=0.1, protected=True), CONFIG)
    assert not is_candidate(view("a", relevance=0.1, tier=Tier.COLD, superseded_by="s"), CONFIG)


def test_cosine_exactly_060_joins_just_below_does_not() -> None:
    assert len(plan(*fading(2, 0.60))) == 1
    memories, vectors = fading(2, 0.60)
    vectors[1] = at_cosine(below(0.60), other=1)
    assert plan(memories, vectors) == []


def test_one_member_is_not_compressed_two_are() -> None:
    assert plan(*fading(1)) == []
    (p,) = plan(*fading(2))
    assert p.member_ids == ("f0", "f1") and p.operation == Origin.COMPRESSED


def test_a_group_stops_at_eight_the_ninth_starts_no_group_alone() -> None:
    (p,) = plan(*fading(8))
    assert len(p.member_ids) == 8
    (p,) = plan(*fading(9))  # the ninth, alone, is not a group
    assert len(p.member_ids) == 8


def test_group_sizes_are_bounded_and_ordered() -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        CompressConfig(min_group_size=1)
    with pytest.raises(ValidationError):
        CompressConfig(min_group_size=5, max_group_size=4)
    (p,) = plan(*fading(3), config=CompressConfig(min_group_size=3, max_group_size=3))
    assert plan(*fading(2), config=CompressConfig(min_group_size=3)) == []


def test_only_memories_of_the_same_kind_are_grouped() -> None:
    memories, vectors = fading(2)
    memories[1] = view("f1", relevance=0.1, kind="semantic", created_at=memories[1].created_at)
    assert plan(memories, vectors) == []


def test_only_memories_about_the_same_entity_are_grouped() -> None:
    memories, vectors = fading(3, entity="Ann")
    memories[2] = view("f2", relevance=0.1, entity="Bob", created_at=memories[2].created_at)
    (p,) = plan(memories, vectors)
    assert p.member_ids == ("f0", "f1") and p.entity == "Ann"


def test_a_summary_is_never_compressed_again() -> None:
    for origin in (Origin.COMPRESSED, Origin.DEDUP_SUMMARY, Origin.COLD_LEARNING,
                   Origin.META_MEMORY):
        assert not is_candidate(view("s", relevance=0.01, origin=origin), CONFIG)
    memories, vectors = fading(3)
    memories[0] = view("s1", relevance=0.1, origin=Origin.COMPRESSED, content="earlier",
                       created_at=memories[0].created_at)
    (p,) = plan(memories, vectors)
    assert p.member_ids == ("f1", "f2") and p.absorbed_ids == ()


def test_a_summary_is_fresh_and_keeps_its_members_dates() -> None:
    memories, vectors = fading(3)
    (p,) = plan(memories, vectors)
    assert p.created_at == AS_OF  # not the oldest member's date: it would be born fading
    assert p.meta["members_from"] == memories[0].created_at.isoformat()
    assert p.meta["members_until"] == memories[2].created_at.isoformat()
    assert p.meta["member_dates"] == {m.id: m.created_at.isoformat() for m in memories}
    for m in memories:
        assert f"{m.created_at.day} {m.created_at:%B}" in p.content


def test_summary_attributes_max_importance_mean_stability_max_access() -> None:
    memories, vectors = fading(5)
    memories = [
        view(m.id, relevance=0.1, content=m.content, created_at=m.created_at, kind=m.kind,
             importance=imp, stability=stab, access_count=acc)
        for m, imp, stab, acc in zip(memories, [0.1, 0.9, 0.3, 0.2, 0.4], [1, 2, 3, 4, 5],
                                     [0, 7, 2, 1, 3], strict=True)
    ]
    (p,) = plan(memories, vectors)
    assert (p.importance, p.stability, p.access_count) == (0.9, 3.0, 7)
    assert p.link_weight == 0.8 and p.embedding is None  # embedded afresh when written
    d = memories[0].created_at
    assert p.content.startswith(f"{d.day} {d:%B %Y}: fact 0.")


def test_rules_wording_groups_by_day_says_the_year_once_and_the_subject_once() -> None:
    may8, may12, jan2 = datetime(2023, 5, 8, 13), datetime(2023, 5, 12), datetime(2024, 1, 2)
    members = [
        view("a", entity="Ann", created_at=may8, content="Ann adopted a cat named Tom."),
        view("b", entity="Ann", created_at=may8, content="Ann feeds the cat twice a day."),
        view("c", entity="Ann", created_at=may12, content="Ann ran 5 km in Oslo."),
        view("d", entity="Ann", created_at=jan2, content="Ann's race in Oslo was fun."),
    ]
    assert rules_wording(members).text == (
        "Ann - 8 May 2023: adopted a cat named Tom; feeds the cat twice a day. "
        "12 May: ran 5 km in Oslo. 2 January 2024: Ann's race in Oslo was fun.")
    # What the model embeds: the same words, the dates that head the days left out.
    assert rules_wording(members).gist == (
        "Ann - adopted a cat named Tom; feeds the cat twice a day. ran 5 km in Oslo. "
        "Ann's race in Oslo was fun.")


def test_a_plan_embeds_its_gist_and_a_rewording_without_one_embeds_its_text() -> None:
    from reverie.tasks.summaries import reworded

    (p,) = plan(*fading(3))
    assert p.content == "23 March 2025: fact 0. 24 March: fact 1. 25 March: fact 2."
    assert p.gist == "fact 0. fact 1. fact 2."
    assert reworded(p, "facts 0 to 2.", "llm").gist is None
    assert reworded(p, "D: facts 0 to 2.", "llm", gist="facts 0 to 2.").gist == "facts 0 to 2."


def test_rules_wording_says_a_statement_once_a_day_but_says_each_date() -> None:
    members = [view("a", content="Bo went to the LGBTQ support group."),
               view("b", content="Bo liked the LGBTQ support group a lot."),
               view("c", content="Bo went to the LGBTQ support group."),
               view("d", content="went to the LGBTQ support"),
               view("e", content="Bo went to the LGBTQ support group.",
                    created_at=AS_OF - timedelta(days=1))]
    wording = rules_wording(members).text
    # c and d say nothing a said that day; e says it on another day, which is a fact too.
    assert wording.count("went to the LGBTQ support group") == 2
    assert wording.count("liked the LGBTQ support group a lot") == 1
    assert "went to the LGBTQ support;" not in wording


def test_the_subject_is_said_once_only_where_it_leads_alone() -> None:
    members = [view("a", entity="Mel", content="Mel and her kids paint."),
               view("b", entity="Mel", content="Mel's son got hurt."),
               view("c", entity="Mel", content="Mel Gibson is an actor."),
               view("d", entity="Mel", content="Mel paints.")]
    assert rules_wording(members).text.endswith(
        ": Mel and her kids paint; Mel's son got hurt; Mel Gibson is an actor; paints.")
    assert rules_wording(members).text.startswith("Mel - ")
    assert not rules_wording(members[:3]).text.startswith("Mel - ")


_WORD = st.text(alphabet="abcdefghijKLMNOP0123456789'-", min_size=1, max_size=6)
_SENTENCE = st.lists(st.one_of(_WORD, st.sampled_from(["the", "Ann", "May", "2023", "3."])),
                     min_size=1, max_size=12).map(" ".join)


def _all_words(text: str) -> list[str]:
    import string

    return text.lower().translate(str.maketrans({c: " " for c in string.punctuation})).split()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_SENTENCE, st.integers(0, 800), st.sampled_from(["Ann", None])),
                min_size=1, max_size=8))
def test_rules_wording_keeps_every_member_whole_and_every_fact(rows) -> None:
    from reverie.benchmarks.fidelity import facts_kept, kept_whole, members_kept_whole
    from reverie.benchmarks.locomo import words

    members = sorted(
        (view(f"m{i}", content=text, entity=entity,
              created_at=datetime(2022, 1, 1) + timedelta(days=days))
         for i, (text, days, entity) in enumerate(rows)),
        key=lambda m: (m.created_at, m.id))
    wording, gist = rules_wording(members)
    subject = members[0].entity if len({m.entity for m in members}) == 1 else None
    contents = [m.content for m in members]
    assert members_kept_whole(contents, wording, subject) == (len(members), len(members))
    assert members_kept_whole(contents, gist, subject) == (len(members), len(members))
    said, stated = facts_kept(contents, wording)
    assert said == stated
    said_words = f" {' '.join(_all_words(wording))} "
    for m in members:
        assert kept_whole(m.content, wording, subject)
        # Whole in the strict sense too: every word, articles included, in its order
        # (a leading subject aside, when said once for all).
        own = _all_words(m.content)
        if subject and own[:1] == [subject.lower()] and f" {' '.join(own[1:])} " in said_words:
            own = own[1:]
        assert not own or f" {' '.join(own)} " in said_words
        assert words(m.content) <= words(wording)
        d = m.created_at
        assert {str(d.day), d.strftime("%B").lower(), str(d.year)} <= words(wording)


def test_a_pass_that_compresses_nothing_says_which_knob_held_it_back() -> None:
    from reverie.models.config import CompressConfig
    from reverie.tasks.compress import nothing_to_compress_note

    config = CompressConfig(max_relevance=0.2, similarity=0.7, min_group_size=5,
                            max_group_size=8)
    assert nothing_to_compress_note(4, config) == [
        "4 fading memories (relevance below 0.2); a compression group needs 5"]
    assert nothing_to_compress_note(5, config) == [
        "no 5 of the 5 fading memories are alike at cosine >= 0.7"]
