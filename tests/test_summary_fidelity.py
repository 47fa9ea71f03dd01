"""Every summary says what its members said (#37): the rules' wordings on the cases that
once lost words, and the bench's two measures at their boundaries."""

from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from reverie.benchmarks.fidelity import (
    content_words,
    facts_kept,
    fidelity,
    kept_whole,
    member_facts,
    members_kept_whole,
)
from reverie.models.config import ColdConfig
from reverie.tasks.cold_notes import plan_cold
from reverie.tasks.compress import rules_wording
from reverie.tasks.dedup import merge_wording

from factories import AS_OF, view


def on(day: str, mid: str, content: str, **fields):
    return view(mid, content=content, created_at=datetime.strptime(day, "%Y-%m-%d"), **fields)


# -- the four summaries -----------------------------------------------------------

HIVE = [
    on("2025-04-12", "h1", "Inspected hive 1 and saw fresh eggs on 6 frames"),
    on("2025-05-20", "h2", "Added a second honey super to hive 1"),
    on("2025-08-03", "h3", "Harvested 14 kg of honey from hive 1"),
]
TOOLS = [
    on("2025-01-22", "t1", "Maya's team uses Jira for sprint planning"),
    on("2025-04-01", "t2", "Maya's team moved sprint planning from Jira to Linear"),
]
FLAGS = [
    on("2025-03-02", "f1", "Maya thinks feature flags should be cleaned up within a month"),
    on("2025-04-15", "f2", "Maya thinks feature flags should be removed within a month"),
]
GEOCODER = [
    on("2025-04-20", "g1", "geocoder-client caches results for 30 seconds",
       entity="geocoder-client", layer="implementation"),
    on("2025-05-04", "g2",
       "The geocoder client retries with exponential backoff capped at 8 seconds",
       entity="geocoder-client", layer="implementation"),
]


def test_the_hive_diary_keeps_the_hive_and_the_honey() -> None:
    text = rules_wording(HIVE).text
    assert text == ("12 April 2025: Inspected hive 1 and saw fresh eggs on 6 frames. "
                    "20 May: Added a second honey super to hive 1. "
                    "3 August: Harvested 14 kg of honey from hive 1.")
    # What "no word said twice" wrote: the measures see what it lost.
    old = ("12 April 2025: Inspected hive 1 and saw fresh eggs on 6 frames. "
           "20 May: Added a second honey super to 1. 3 August: harvested 14 kg of from.")
    contents = [m.content for m in HIVE]
    assert members_kept_whole(contents, text) == (3, 3)
    assert members_kept_whole(contents, old) == (1, 3)


def test_the_move_to_linear_says_from_what() -> None:
    text = rules_wording(TOOLS).text
    assert "1 April: Maya's team moved sprint planning from Jira to Linear." in text
    assert not kept_whole(TOOLS[1].content, "22 January 2025: Maya's team uses Jira for "
                          "sprint planning. 1 April: moved from to Linear.")


def test_the_flags_say_what_should_be_removed() -> None:
    text = rules_wording(FLAGS).text
    assert text.endswith("15 April: Maya thinks feature flags should be removed within a month.")
    assert not kept_whole(FLAGS[1].content, "2 March 2025: Maya thinks feature flags should "
                          "be cleaned up within a month. 15 April: removed.")


def test_the_backoff_keeps_its_unit_in_a_cold_note_and_a_compression() -> None:
    (note,) = plan_cold("p", GEOCODER, AS_OF, ColdConfig())
    assert note.content == (
        "2 implementation notes on geocoder-client from 2025-04-20 to 2025-05-04: "
        "20 April 2025: caches results for 30 seconds. "
        "4 May: The geocoder client retries with exponential backoff capped at 8 seconds.")
    compressed = rules_wording(GEOCODER).text
    assert compressed.startswith("geocoder-client - 20 April 2025: caches results")
    for text in (note.content, compressed):
        assert members_kept_whole([m.content for m in GEOCODER], text,
                                  "geocoder-client") == (2, 2)
    assert not kept_whole(GEOCODER[1].content, "retries with exponential backoff capped at 8.")


# -- merges keep every fact ---------------------------------------------------------------


def test_a_merge_adds_the_member_that_names_what_the_representative_does_not() -> None:
    rep = on("2025-04-03", "r", "Maya's team moved its sprint planning to a new tool this spring")
    same = on("2025-04-02", "s", "Maya's team moved sprint planning to a new tool")
    named = on("2025-04-01", "n", "Maya's team moved sprint planning from Jira to Linear")
    text = merge_wording(rep, [rep, same, named])
    assert text == (
        "Maya's team moved its sprint planning to a new tool this spring. "
        "Maya's team moved sprint planning from Jira to Linear")
    assert facts_kept([m.content for m in (rep, same, named)], text) == (3, 3)
    assert merge_wording(rep, [rep, same]) == rep.content


SHELTER = [
    on("2023-03-01", "v1", "Maria volunteers at a homeless shelter, which she started a year ago"),
    on("2023-04-01", "v2", "Maria has been volunteering at the homeless shelter"),
    on("2023-05-01", "v3", "Maria volunteered at the shelter last week and received a medal"),
]


def test_a_merge_says_whole_the_member_that_says_more_than_its_representative() -> None:
    rep, said, more = SHELTER
    # At 0 (facts only) the medal goes unsaid: it is no number, name or date.
    assert merge_wording(rep, SHELTER) == rep.content
    text = merge_wording(rep, SHELTER, restated_share=0.6)
    assert text == f"{rep.content}. {more.content}"
    assert members_kept_whole([said.content], text) == (0, 1)  # said by the rep already
    assert kept_whole(more.content, text)
    # 1: only a member said entirely is left unsaid ("been" is no content word, and
    # "volunteering" is "volunteers" to the test).
    assert merge_wording(rep, SHELTER, restated_share=1.0) == text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["hive", "honey", "moved", "team", "frames", "eggs", "of"]),
                min_size=1, max_size=8).map(" ".join),
       st.lists(st.sampled_from(["hive", "honey", "moved", "team", "frames", "eggs", "of"]),
                min_size=1, max_size=8).map(" ".join))
def test_a_merge_at_share_1_leaves_unsaid_only_what_it_says(first: str, second: str) -> None:
    rep = on("2025-01-01", "a", first)
    other = on("2025-01-02", "b", second)
    text = merge_wording(rep, [rep, other], restated_share=1.0)
    assert set(content_words(second)) <= set(content_words(text))


_WORD = st.sampled_from(["hive", "honey", "moved", "team", "the", "of", "capped", "at"])
_FACT = st.one_of(st.integers(0, 99).map(str),
                  st.sampled_from(["Jira", "Linear", "Oslo", "May", "Maya", "2023"]))
_MEMBER = st.lists(st.one_of(_WORD, _FACT), min_size=1, max_size=10).map(" ".join)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_MEMBER, st.integers(0, 400)), min_size=2, max_size=8),
       st.integers(0, 7))
def test_a_merge_keeps_every_number_name_and_date_and_its_representative(rows, pick) -> None:
    members = [view(f"m{i}", content=text, created_at=datetime(2023, 1, 1) + timedelta(days=d))
               for i, (text, d) in enumerate(rows)]
    rep = members[pick % len(members)]
    text = merge_wording(rep, members)
    said, stated = facts_kept([m.content for m in members], text)
    assert said == stated
    assert text.startswith(rep.content)
    assert kept_whole(rep.content, text)


# -- the measures at their boundaries -----------------------------------------------------


def test_one_word_dropped_inside_a_member_is_not_whole() -> None:
    member = "Caroline passed the adoption agency interviews last Friday"
    assert members_kept_whole([member], member) == (1, 1)
    assert members_kept_whole([member], "Caroline passed the agency interviews last Friday") \
        == (0, 1)
    # Out of order, or split by another statement, is not whole either.
    assert not kept_whole(member, "Caroline passed the interviews adoption agency last Friday")
    assert not kept_whole(member, "Caroline passed the adoption; Bo ran; agency interviews "
                          "last Friday")
    # Function words and punctuation are not what a statement rests on.
    assert kept_whole(member, "Caroline passed adoption-agency interviews, last Friday.")


def test_the_subject_may_be_said_once_for_all_but_must_be_said() -> None:
    members = ["Ann adopted a cat named Tom.", "Ann ran 5 km in Oslo."]
    summary = "Ann - 8 May 2023: adopted a cat named Tom. 12 May: ran 5 km in Oslo."
    assert members_kept_whole(members, summary, "Ann") == (2, 2)
    assert members_kept_whole(members, summary) == (0, 2)  # no shared subject: say it
    assert members_kept_whole(members, "adopted a cat named Tom. ran 5 km in Oslo.",
                              "Ann") == (0, 2)


def test_facts_kept_counts_numbers_names_and_dates() -> None:
    members = ["Harvested 14 kg of honey from hive 1 on 3 August", "Sold it in Oslo"]
    # As a model's merge is held to them: a capitalised word that opens a sentence and
    # is never written in lower case counts as a name ("Harvested", "Sold").
    assert member_facts(members) == {"14", "1", "3", "august", "oslo", "harvested", "sold"}
    assert facts_kept(members, " ".join(members)) == (7, 7)
    said, stated = facts_kept(members, "Harvested 14 kg of honey on 3 August. Sold it in Oslo.")
    assert (said, stated) == (6, 7)  # hive 1 is gone
    assert facts_kept(["the cat sleeps"], "the cat sleeps") == (0, 0)


def test_the_measures_add_up_per_operation() -> None:
    tallies = fidelity([
        ("compression", "Ann - adopted a cat. ran 5 km.",
         [("Ann adopted a cat.", "Ann"), ("Ann ran 5 km.", "Ann")]),
        ("compression", "ran km.", [("Bo ran 5 km.", "Bo"), ("Bo swam.", "Bo")]),
        ("merge", "Bo ran 5 km.", [("Bo ran 5 km.", None), ("Bo ran 5 km in Oslo.", None)]),
    ])
    assert (tallies["compression"].whole, tallies["compression"].members) == (2, 4)
    assert tallies["compression"].whole_share == 0.5
    assert tallies["merge"].facts_share == 0.6667  # Bo and 5, not Oslo
    assert tallies["merge"].as_json()["summaries"] == 1
    assert content_words("Ann's cat, the 5 km!") == ["ann", "cat", "5", "km"]


def test_the_bench_reads_each_live_summary_with_the_originals_it_stands_for() -> None:
    from reverie.benchmarks.locomo import render_fidelity, summaries_with_members
    from reverie.models.tables import Origin, Tier

    old = view("s0", origin=Origin.COMPRESSED, tier=Tier.COLD, superseded_by="s1",
               content="Ann - ran.")
    top = view("s1", origin=Origin.DEDUP_SUMMARY, content="Ann ran 5 km.")
    members = [view("a", tier=Tier.COLD, superseded_by="s0", content="Ann ran."),
               view("b", tier=Tier.COLD, superseded_by="s1", content="Ann ran 5 km.",
                    created_at=AS_OF - timedelta(days=20))]
    loose = view("c", content="Bo swam.")
    found = summaries_with_members([old, top, *members, loose])
    assert [(s.id, [m.id for m in ms]) for s, ms in found] == [("s1", ["b", "a"])]
    tallies = fidelity([("merge", s.content, [(m.content, m.entity) for m in ms])
                        for s, ms in found])
    lines = render_fidelity(tallies, "rules")
    assert lines[-2].split() == ["merge", "1", "2", "1.000", "2", "1.000"]
    assert lines[-1] == "members a summary does not say whole: 0 of 2"
    both = {**tallies, "compression": fidelity([
        ("compression", "Bo - swam.", [("Bo swam.", "Bo"), ("Bo ran 5 km.", "Bo")])])["compression"]}
    lines = render_fidelity(both, "rules")
    assert lines[-2].split() == ["all", "2", "4", "0.750", "4", "0.750"]
    assert lines[-1] == "members a summary does not say whole: 1 of 4"
    assert render_fidelity({}, "rules")[-1] == "(no summary in the hot tier)"
