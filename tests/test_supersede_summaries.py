"""An update supersedes across two summaries (issue #37, item 3): a member of an older
summary (a merge or a compression) that a member of a newer summary states otherwise
points at the newest value, the older summary is restated without it (or goes cold when
every member is stale), what else it said stays said; the plan (pure), then through the
flows: in the supersession's own transaction, audited, undone with it, a dry run
selects what the real run does and a second run changes nothing."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest
from test_supersede import audits, by_external, dry_run_then_real, iso, state

from reverie.flows.full_consolidation import full_consolidation
from reverie.models.config import ConsolidationConfig, DedupConfig
from reverie.models.records import MemoryView
from reverie.models.store import Store
from reverie.models.tables import Origin, Tier
from reverie.tasks import supersede
from reverie.tasks.dedup import stale_summary_pairs
from reverie.tasks.supersede import plan_summary_updates

from factories import AS_OF, at_cosine, axis, below, ingest_records, undo_consolidation, view

CONFIG = DedupConfig()


def _summary(sid: str, members: list[MemoryView], origin: Origin = Origin.DEDUP_SUMMARY,
             content: str | None = None) -> tuple[MemoryView, list[MemoryView]]:
    """A summary as the store holds it: dated by its oldest member, its members cold
    under it."""
    members = [replace(m, tier=Tier.COLD, superseded_by=sid) for m in members]
    summary = view(sid, content=content or " ".join(m.content for m in members),
                   entity=members[0].entity,
                   origin=origin, created_at=min(m.created_at for m in members),
                   protected=origin == Origin.COLD_LEARNING)
    return summary, members


def _said(mid: str, text: str, days: int) -> MemoryView:
    return view(mid, content=text, created_at=AS_OF - timedelta(days=days))


def test_an_older_summarys_member_points_at_a_newer_summarys_member() -> None:
    """The older summary holds the old code and a second fact: its stale member points
    at the newer summary's newest member, and it is restated for its other member."""
    old = _summary("s1", [_said("a0", "The user's bike lock code is 4812.", 300),
                          _said("a1", "The user's bike is a blue Trek.", 299)],
                   content="The user's bike lock code is 4812. The user's bike is a blue Trek.")
    new = _summary("s2", [_said("b0", "The user's bike lock code is 7730.", 100),
                          _said("b1", "User's bike lock code: 7730 now.", 99)])
    plans = plan_summary_updates("p", [old, new], [[], []], peers=[[(1, 0.5)], [(0, 0.5)]])
    (plan,) = plans
    assert (plan.newest_id, plan.member_ids) == ("b1", ("a0",))
    assert plan.parameters["summary"] == "s1" and plan.similarities == {"a0": 0.5}
    assert plan.priors == {"a0": (Tier.COLD, "active", "s1")}
    (rest,) = plan.restated  # the older summary, less its stale member
    assert rest.absorbed_ids == ("s1",) and rest.member_ids == ("a1",)
    assert "4812" not in rest.content and "blue Trek" in rest.content
    # Without the peers (the code before): nothing.
    assert plan_summary_updates("p", [old, new], [[], []]) == []


def test_an_older_summary_every_member_of_which_is_stale_goes_cold() -> None:
    old = _summary("s1", [_said("a0", "The user's rent is 900 euros a month.", 300),
                          _said("a1", "User pays 900 euros of rent every month.", 290)],
                   origin=Origin.COMPRESSED)
    new = _summary("s2", [_said("b0", "The user's rent is 1000 euros a month.", 100)])
    (plan,) = plan_summary_updates("p", [old, new], [[], []], peers=[[(1, 0.4)], [(0, 0.4)]])
    assert plan.newest_id == "b0" and plan.member_ids == ("a0", "a1", "s1")
    assert plan.conflicts["s1"] == "summary" and plan.restated == ()


def test_a_chain_of_summaries_points_every_older_member_at_the_newest() -> None:
    """900 -> 950 -> 1000, each in a summary of its own; the oldest reaches only the
    middle one: its member still points at 1000, not at the outdated 950."""
    s1 = _summary("s1", [_said("a0", "The user's rent is 900 euros a month.", 300)])
    s2 = _summary("s2", [_said("b0", "The user's rent is 950 euros a month.", 200)])
    s3 = _summary("s3", [_said("c0", "The user's rent is 1000 euros a month.", 100)])
    peers = [[(1, 0.6)], [(0, 0.6), (2, 0.6)], [(1, 0.6)]]
    plans = plan_summary_updates("p", [s1, s2, s3], [[], [], []], peers=peers)
    assert {p.newest_id for p in plans} == {"c0"}
    assert sorted(m for p in plans for m in p.member_ids) == ["a0", "b0", "s1", "s2"]
    # A second plan of the same store (its summaries as they were read) is the same.
    assert plan_summary_updates("p", [s1, s2, s3], [[], [], []], peers=peers) == plans


@pytest.mark.parametrize("newer, why", [
    # the same value said again
    ([_said("b0", "User's bike lock code: 4812.", 100)], "agrees"),
    # older than the member: the other summary is the stale one
    ([_said("b0", "The user's bike lock code is 7730.", 400)], "older"),
    # another fact, another entity, an event
    ([_said("b0", "The user's gym membership costs 7730 euros.", 100)], "other fact"),
    ([view("b0", content="The user's bike lock code is 7730.", entity="Sam",
           created_at=AS_OF - timedelta(days=100))], "entity"),
])
def test_no_update_between_summaries(newer: list[MemoryView], why: str) -> None:
    old = _summary("s1", [_said("a0", "The user's bike lock code is 4812.", 300)])
    plans = plan_summary_updates("p", [old, _summary("s2", newer)], [[], []],
                                 peers=[[(1, 0.6)], [(0, 0.6)]])
    assert all(p.parameters["summary"] != "s1" for p in plans), why


def test_a_cold_note_is_never_rewritten_but_its_members_update() -> None:
    note = _summary("n", [_said("a0", "The user's bike lock code is 4812.", 300)],
                    origin=Origin.COLD_LEARNING)
    newer_note = _summary("m", [_said("b0", "The user's bike lock code is 7730.", 100)],
                          origin=Origin.COLD_LEARNING)
    merge = _summary("s", [_said("c0", "User's bike lock code: 4812.", 250)])
    assert plan_summary_updates("p", [note, newer_note], [[], []],
                                peers=[[(1, 0.6)], [(0, 0.6)]]) == []
    (plan,) = plan_summary_updates("p", [merge, newer_note], [[], []],
                                   peers=[[(1, 0.6)], [(0, 0.6)]])
    assert plan.newest_id == "b0" and plan.member_ids == ("c0", "s")


_RENT = {900: "The user's rent is 900 euros.", 950: "The user's rent is 950 euros.",
         1000: "The user's rent is 1000 euros."}


@pytest.mark.parametrize("reaches_both", [False, True])
def test_two_summaries_race_for_one_older_memory(reaches_both: bool) -> None:
    """An older hot memory (900) near a summary of 950, itself outdated by another
    summary's 1000: the 950 member updates nothing, the older memory points at the
    newest value (reached through the peer or directly), and the 950 summary goes
    cold pointing at it too."""
    older = _said("o", _RENT[900], 400)
    s1 = _summary("s1", [_said("a0", _RENT[950], 300)])
    s2 = _summary("s2", [_said("b0", _RENT[1000], 100)])
    near = [[(older, 0.6)], [(older, 0.5)] if reaches_both else []]
    plans = plan_summary_updates("p", [s1, s2], near, peers=[[(1, 0.6)], [(0, 0.6)]])
    moved = {m: p.newest_id for p in plans for m in p.member_ids}
    assert moved == {"o": "b0", "a0": "b0", "s1": "b0"}
    (reverse,) = [p for p in plans if "o" in p.member_ids]
    assert reverse.parameters["summary"] == "s2"
    # Its similarity is to the newest value's summary where that found it too, else to
    # the summary that did, named.
    if reaches_both:
        assert reverse.similarities == {"o": 0.5} and "similar_to" not in reverse.parameters
    else:
        assert reverse.similarities == {"o": 0.6}
        assert reverse.parameters["similar_to"] == {"o": "s1"}
    # Without the peers (the code before), the older memory pointed at the stale 950.
    (alone,) = plan_summary_updates("p", [s1, s2], [[(older, 0.6)], []])
    assert alone.newest_id == "a0" and alone.member_ids == ("o",)


def test_an_older_memory_that_says_the_newest_value_stays_hot() -> None:
    """1000 in an old hot memory, 950 in a summary after it, 1000 again in a newer one:
    the 950 member is outdated, so it updates nothing; the older memory says the
    current value and is no stale fact."""
    older = _said("o", _RENT[1000], 400)
    s1 = _summary("s1", [_said("a0", _RENT[950], 300)])
    s2 = _summary("s2", [_said("b0", _RENT[1000], 100)])
    plans = plan_summary_updates("p", [s1, s2], [[(older, 0.6)], []],
                                 peers=[[(1, 0.6)], [(0, 0.6)]])
    assert {m: p.newest_id for p in plans for m in p.member_ids} == {"a0": "b0", "s1": "b0"}


_FRAMED = [
    ("The user works at Google.", "The user has been working for Stripe since last month."),
    ("The user's rent is 900 euros a month.", "Rent: 1000 euros a month now."),
]


def _found(memories: list[MemoryView], cosine: float, config: DedupConfig = CONFIG,
           ) -> tuple[list[str], list[list[str]], list[list[int]]]:
    """``stale_summary_pairs`` of ``memories`` (the first on axis 0, the others at
    ``cosine`` to it), by id."""
    vectors = np.stack([axis(0), *(at_cosine(cosine, other=1 + k)
                                   for k in range(len(memories) - 1))])
    summaries, near, peers = stale_summary_pairs(memories, vectors, AS_OF, config)
    return ([s.id for s in summaries], [[m.id for m, _ in n] for n in near],
            [[k for k, _ in p] for p in peers])


@pytest.mark.parametrize("texts", _FRAMED)
def test_a_summary_and_a_newer_memory_of_one_frame_are_found_down_to_the_frame_radius(
        texts: tuple[str, str]) -> None:
    """Summary against hot memory: the same words around two values are searched down
    to ``supersede_frame_similarity``, as among plain memories, and the word test
    still decides: the stale member points at the newer value."""
    assert supersede.frame(supersede.values(texts[0])) == supersede.frame(
        supersede.values(texts[1])) is not None
    summary, members = _summary("s1", [_said("a0", texts[0], 300),
                                       _said("a1", texts[0], 299)], content=texts[0])
    newer = _said("n0", texts[1], 10)
    at = CONFIG.supersede_frame_similarity
    assert _found([summary, newer], at) == (["s1"], [["n0"]], [[]])
    assert _found([summary, newer], below(at)) == ([], [], [])
    # At or above the first radius, no second search.
    off = DedupConfig(supersede_frame_similarity=CONFIG.supersede_similarity)
    assert _found([summary, newer], below(CONFIG.supersede_similarity), off) == ([], [], [])
    (plan,) = plan_summary_updates("p", [(summary, members)], [[(newer, at)]])
    assert plan.newest_id == "n0" and plan.member_ids == ("a0", "a1", "s1")
    # The audit says the second radius found it; a pair the first found says nothing.
    (audited,) = supersede.with_frame_radius([plan], CONFIG)
    assert audited.parameters == {**plan.parameters, "frame_similarity": at}
    (first,) = plan_summary_updates("p", [(summary, members)],
                                    [[(newer, CONFIG.supersede_similarity)]])
    assert supersede.with_frame_radius([first], CONFIG) == [first]


@pytest.mark.parametrize("texts", _FRAMED)
def test_two_summaries_of_one_frame_are_found_down_to_the_frame_radius(
        texts: tuple[str, str]) -> None:
    old = _summary("s1", [_said("a0", texts[0], 300)], content=texts[0])
    new = _summary("s2", [_said("b0", texts[1], 100)], content=texts[1])
    at = CONFIG.supersede_frame_similarity
    assert _found([old[0], new[0]], at) == (["s1", "s2"], [[], []], [[1], [0]])
    assert _found([old[0], new[0]], below(at)) == ([], [], [])


def test_other_frames_are_not_searched_below_the_first_radius() -> None:
    """"moved" is no frame of where one lives: between the radii the pair is not found."""
    summary, _ = _summary("s1", [_said("a0", "User is now living in Madrid.", 300)])
    newer = _said("n0", "User moved the dentist appointment to 17 April.", 10)
    assert _found([summary, newer], 0.3) == ([], [], [])
    assert _found([summary, newer], CONFIG.supersede_similarity) == (["s1"], [["n0"]], [[]])


# --- through the flows ------------------------------------------------------------------


@pytest.mark.usefixtures("prefect_api")
def test_an_older_summary_updated_by_a_newer_summary(store: Store) -> None:
    """Both values were merged into summaries of their own by a run that searched no
    updates (a release before them: both radii at 1.0). The next run points
    the older members at the newest, the older summary goes cold; a dry run selects what
    the real run does, a second run changes nothing, undo restores it."""
    rows = [{"profile": "p", "id": f"o{k}", "content": text, "created_at": iso(300 - k)}
            for k, text in enumerate(["The user's bike lock code is 4812.",
                                      "The user's bike lock code is 4812 now.",
                                      "User's bike lock code: 4812."])]
    rows += [{"profile": "p", "id": f"n{k}", "content": text, "created_at": iso(100 - k)}
             for k, text in enumerate(["The user's bike lock code is 7730.",
                                       "The user's bike lock code is 7730 now.",
                                       "User's bike lock code: 7730."])]
    assert not ingest_records(store, rows).errors
    blind = ConsolidationConfig(summarizer="rules", dedup=DedupConfig(
        supersede_similarity=1.0, supersede_frame_similarity=1.0))
    full_consolidation(profile="p", as_of=AS_OF - timedelta(days=50), config=blind)
    mine = by_external(store)
    older, newer = mine["o0"]["superseded_by"], mine["n0"]["superseded_by"]
    assert older and newer and older != newer  # two summaries, one value each

    rules = ConsolidationConfig(summarizer="rules")
    dry_run_then_real(store, rules)
    mine = by_external(store)
    assert {mine[f"o{k}"]["superseded_by"] for k in range(3)} == {mine["n2"]["id"]}
    (audit,) = audits(store)
    assert audit["parameters"]["summary"] == older
    memories = {r["id"]: r for r in state(store) if r["type"] == "memory"}
    assert memories[older]["tier"] == Tier.COLD and memories[newer]["tier"] == Tier.HOT
    hot = " ".join(r["content"] for r in memories.values() if r["tier"] == Tier.HOT)
    assert "4812" not in hot and "7730" in hot

    after = state(store)
    full_consolidation(profile="p", as_of=AS_OF, config=rules)
    assert state(store) == after  # a second run changes nothing

    undo_consolidation(store, audit["id"], "p")
    memories = {r["id"]: r for r in state(store) if r["type"] == "memory"}
    assert memories[older]["tier"] == Tier.HOT
    assert {by_external(store)[f"o{k}"]["superseded_by"] for k in range(3)} == {older}


# --- a negation outdates what says every word it denies ---------------------------------

_CAPPUCCINO = ["Lena drinks a cappuccino made with oat milk every morning",
               "Every morning Lena has an oat milk cappuccino",
               "Lena's morning drink is a cappuccino with oat milk"]
_SWITCHED = "Lena has switched to black coffee every morning, no more oat milk cappuccino"


def _cappuccinos(*texts: str, origin: Origin = Origin.DEDUP_SUMMARY
                 ) -> tuple[MemoryView, list[MemoryView]]:
    return _summary("s1", [_said(f"a{k}", t, 300 - 10 * k) for k, t in enumerate(texts)],
                    origin=origin)


@pytest.mark.store_independent("plans on plain data")
@pytest.mark.parametrize(("text", "denies"), [
    (_SWITCHED, {"oat", "milk", "cappu"}),
    ("Lena never works on Sundays", set()),  # a standing denial: said of no change
    ("Lena does not work on Sundays anymore", {"work"}),
    ("The user doesn't eat meat anymore, but loves fish", {"eat", "meat"}),
    ("Lena no longer lives in Berlin", {"live"}),
    ("Lena has no more time", {"tim"}),  # crudely stemmed, as ``Values.stems``
    ("concise answers with no long preamble", set()),  # a bare "no" is "without"
    (_CAPPUCCINO[0], set()),
])
def test_what_a_negation_denies_ends_with_its_part_of_the_sentence(
        text: str, denies: set[str]) -> None:
    assert supersede.denied(text) == denies


@pytest.mark.store_independent("plans on plain data")
def test_a_negation_outdates_every_merged_member_that_says_what_it_denies() -> None:
    """Only the second member holds no word the update lacks; the other two say
    "drink" and "made" too, but every word it denies as well: all three are outdated,
    and nothing of the merge stays true. (Before, only the second: the merge, restated
    for the other two, stayed hot and first in recall.)"""
    merged = _cappuccinos(*_CAPPUCCINO)
    switched = _said("n", _SWITCHED, 10)
    (plan,) = plan_summary_updates("p", [merged], [[(switched, 0.84)]])
    assert plan.newest_id == "n" and plan.member_ids == ("a0", "a1", "a2", "s1")
    assert plan.conflicts == {"a0": "negation", "a1": "negation", "a2": "negation",
                              "s1": "summary"}
    assert plan.restated == ()


@pytest.mark.store_independent("plans on plain data")
@pytest.mark.parametrize(("other", "why"), [
    ("Lena's morning drink is a cappuccino", "says one denied word fewer"),
    ("Lena never has an oat milk cappuccino at night", "denies too"),
    ("Lena and Jonas share an oat milk cappuccino every morning", "names someone else"),
])
def test_a_member_that_does_not_say_what_is_denied_stays(other: str, why: str) -> None:
    merged = _cappuccinos(_CAPPUCCINO[1], other)
    (plan,) = plan_summary_updates("p", [merged], [[(_said("n", _SWITCHED, 10), 0.84)]])
    assert plan.member_ids == ("a0",), why
    (rest,) = plan.restated
    assert rest.member_ids == ("a1",)


@pytest.mark.usefixtures("prefect_api")
def test_a_negation_takes_the_whole_merge_it_denies_out_of_the_hot_tier(store: Store) -> None:
    """A newcomer's case, through the flow with the model: three oat milk cappuccinos
    merged, then "switched to black coffee, no more oat milk cappuccino". Before, one
    member was outdated and the summary restated for the other two, hot and first in
    recall. Undo brings the merge back."""
    rows = [{"profile": "p", "id": f"c{k}", "content": text, "created_at": iso(200 - 30 * k)}
            for k, text in enumerate(_CAPPUCCINO)]
    rows.append({"profile": "p", "id": "job", "content": "Lena works as a nurse at the city "
                 "hospital", "created_at": iso(100)})
    assert not ingest_records(store, rows).errors
    rules = ConsolidationConfig(summarizer="rules")
    full_consolidation(profile="p", as_of=AS_OF - timedelta(days=50), config=rules)
    merged = by_external(store)["c0"]["superseded_by"]
    assert merged and {by_external(store)[f"c{k}"]["superseded_by"] for k in range(3)} == {
        merged}

    assert not ingest_records(store, [{"profile": "p", "id": "now", "content": _SWITCHED,
                                       "created_at": iso(10)}]).errors
    dry_run_then_real(store, rules)
    memories = [r for r in state(store) if r["type"] == "memory"]
    assert sorted(r["content"] for r in memories if r["tier"] == Tier.HOT) == sorted(
        [_SWITCHED, rows[-1]["content"]])
    (audit,) = audits(store)
    assert set(audit["member_ids"]) == {by_external(store)[f"c{k}"]["id"] for k in range(3)
                                        } | {merged}

    undo_consolidation(store, audit["id"], "p")
    assert {r["id"] for r in state(store) if r["type"] == "memory" and r["tier"] == Tier.HOT
            } == {merged, by_external(store)["job"]["id"], by_external(store)["now"]["id"]}


@pytest.mark.usefixtures("prefect_api")
def test_a_habit_ended_in_other_words_takes_it_out_of_the_hot_tier(store: Store) -> None:
    """A platform engineer's case, through the flow with the model: "stopped drinking"
    said no "no longer", and the cappuccino stayed hot and first in recall."""
    habit = "Maya drinks an oat milk cappuccino every morning"
    ended = "Maya stopped drinking oat milk cappuccino"
    rows = [{"profile": "p", "id": "habit", "content": habit, "created_at": iso(200)},
            {"profile": "p", "id": "job", "content": "Maya works as a nurse at the city "
             "hospital", "created_at": iso(100)},
            {"profile": "p", "id": "ended", "content": ended, "created_at": iso(10)}]
    assert not ingest_records(store, rows).errors
    dry_run_then_real(store, ConsolidationConfig(summarizer="rules"))
    hot = sorted(r["content"] for r in state(store)
                 if r["type"] == "memory" and r["tier"] == Tier.HOT)
    assert hot == sorted([ended, rows[1]["content"]])
    (audit,) = audits(store)
    assert audit["parameters"]["conflicts"] == {by_external(store)["habit"]["id"]: "negation"}
