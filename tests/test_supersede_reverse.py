"""An update supersedes, whichever side of a summary it is on (issue #37, item 3):
statement splitting at its boundaries, and the reverse case, an older hot memory that
a member of a newer summary updates: the plan (pure), then through the flows, where
the older memory goes cold pointing at the newest member, what else it said stays hot,
a dry run selects what the real run does, a second run changes nothing and undo
restores it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_supersede import audits, by_external, dry_run_then_real, iso, state

from reverie.flows.cold_notes import consolidate_cold
from reverie.flows.full_consolidation import full_consolidation
from reverie.models.config import ConsolidationConfig
from reverie.models.records import MemoryView
from reverie.models.store import Store
from reverie.models.tables import Origin, Tier
from reverie.tasks import supersede
from reverie.tasks.supersede import (
    RESTATE_RULE,
    REVERSE_RULE,
    clause_conflict,
    clauses,
    conflict,
    plan_outdated_by_summaries,
    plan_summary_updates,
    without_outdated,
)

from factories import AS_OF, ingest_records, undo_consolidation, view

# --- statement splitting ------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    # an "and" that opens a clause of its own: a subject and a verb after it
    ("The user's phone plan costs 25 euros a month and the user plays the cello.",
     ("The user's phone plan costs 25 euros a month", "the user plays the cello.")),
    ("User works at Google and Anna is her manager.",
     ("User works at Google", "Anna is her manager.")),
    ("Tom and Anna went hiking and Anna got lost.", ("Tom and Anna went hiking",
                                                     "Anna got lost.")),
    # an "and" that goes on with the same subject: the clause is given it
    ("Maya lives in Lisbon and works remotely.", ("Maya lives in Lisbon",
                                                  "Maya works remotely.")),
    ("Maya lives in Lisbon, and works remotely.", ("Maya lives in Lisbon",
                                                   "Maya works remotely.")),
    ("User moved to Berlin and started a new job at Siemens.",
     ("User moved to Berlin", "User started a new job at Siemens.")),
    ("The user's rent is 900 euros and includes heating.",
     ("The user's rent is 900 euros", "The user's rent includes heating.")),
    # adverbs are not the subject's
    ("Maria recently joined a gym and is sticking to her routine.",
     ("Maria recently joined a gym", "Maria is sticking to her routine.")),
    # the verb may be another's: a clause inside the first, a participle after a copula
    ("Melanie believes that being in nature refreshes her soul and helps her reset.",
     ("Melanie believes that being in nature refreshes her soul and helps her reset.",)),
    ("John's kids were awestruck and humbled by the memorial.",
     ("John's kids were awestruck and humbled by the memorial.",)),
    ("Ann felt accepted and supported, emphasizing awareness.",
     ("Ann felt accepted and supported, emphasizing awareness.",)),
    ("Gina believes staying resilient and focused is key.",
     ("Gina believes staying resilient and focused is key.",)),
    ("When Maria was younger, her family had money problems and had to rely on help.",
     ("When Maria was younger, her family had money problems and had to rely on help.",)),
    ("John is finding it tough, but he and his family are trying to focus.",
     ("John is finding it tough, but he and his family are trying to focus.",)),
    ("The book is by Amy and her family that gave her hope.",
     ("The book is by Amy and her family that gave her hope.",)),
    ("The donations raised by John and his team helped buy a truck.",
     ("The donations raised by John and his team helped buy a truck.",)),
    ("John attended a meeting on education and the need for upgrades.",
     ("John attended a meeting on education and the need for upgrades.",)),
    # a subject is whole ("family" is no adverb), a past tense is a verb ("used to")
    ("Melanie's family has been loving during tough times and helped her through.",
     ("Melanie's family has been loving during tough times",
      "Melanie's family helped her through.")),
    ("John used to have a film camera and took plenty of pictures.",
     ("John used to have a film camera", "John took plenty of pictures.")),
    # an "and" inside one clause: two names, two numbers, a list, a fixed phrase
    ("Tom and Anna went hiking.", ("Tom and Anna went hiking.",)),
    ("The rent is between 900 and 1000 euros.", ("The rent is between 900 and 1000 euros.",)),
    ("User buys apples and oranges from the market.",
     ("User buys apples and oranges from the market.",)),
    ("The user likes rock and roll music.", ("The user likes rock and roll music.",)),
    ("The user's rent is 900 euros and the deposit 1800 euros.",
     ("The user's rent is 900 euros and the deposit 1800 euros.",)),
    ("User's sister and brother work at Siemens.", ("User's sister and brother work at Siemens.",)),
    # an "-s" verb known by its place, not by a list: an object after it, or agreeing
    # with the first clause's verb and not the second of two plurals
    ("Maya lives in Lisbon and repairs bikes on weekends.",
     ("Maya lives in Lisbon", "Maya repairs bikes on weekends.")),
    ("User grows tomatoes and sells them at the market.",
     ("User grows tomatoes", "User sells them at the market.")),
    ("The user rents a flat and the landlord repaints it every year.",
     ("The user rents a flat", "the landlord repaints it every year.")),
    ("User met Anna and friends at the park.", ("User met Anna and friends at the park.",)),
    ("User collects stamps and coins from Portugal.",
     ("User collects stamps and coins from Portugal.",)),
    # a number before a plural opens a noun phrase the "and" goes on with; a unit that
    # is no plural ends it
    ("Maya has 2 cats and dogs at home.", ("Maya has 2 cats and dogs at home.",)),
    ("The trip is 900 km and takes a day.", ("The trip is 900 km", "The trip takes a day.")),
    # "-us", "-is", "-ics" words are no plurals: the verb after ", and" has the subject
    ("User studies physics, and teaches kids.", ("User studies physics",
                                                "User teaches kids.")),
    ("The user likes the apples and the pears from Spain.",
     ("The user likes the apples and the pears from Spain.",)),
    # a clause opening with its verb has no subject to give
    ("adopted a cat named Tom and feeds it daily.", ("adopted a cat named Tom and feeds it daily.",)),
    # sentences, semicolons and a ", and" split as before
    ("The user's bike lock code is 4812, and the bike is a blue Trek.",
     ("The user's bike lock code is 4812", "the bike is a blue Trek.")),
    ("Ann - 8 May 2023: the rent is 900 euros a month; adopted a cat. 12 May: ran 5 km.",
     ("Ann - 8 May 2023: the rent is 900 euros a month;", "adopted a cat.", "12 May: ran 5 km.")),
])
def test_clauses(text: str, expected: tuple[str, ...]) -> None:
    assert clauses(text) == expected


@pytest.mark.parametrize("text, expected", [
    # a ", and" before a list's last item opens no clause ...
    ("Caroline received a necklace symbolizing love, faith, and strength.",
     ("Caroline received a necklace symbolizing love, faith, and strength.",)),
    ("Caroline recommends doing research, preparing emotionally, and gathering documents.",
     ("Caroline recommends doing research, preparing emotionally, and gathering documents.",)),
    ("The user bought apples, pears, and canned food.",
     ("The user bought apples, pears, and canned food.",)),
    # after a list of the subject's verbs, or a place's apposition, the verb goes on
    ("User lives in Oslo, works at Google, and pays 900 euros rent.",
     ("User lives in Oslo, works at Google", "User pays 900 euros rent.")),
    ("Maya lives in Lisbon, Portugal, and works remotely.",
     ("Maya lives in Lisbon, Portugal", "Maya works remotely.")),
    # ... a pronoun or a finite verb after it does
    ("Jon offered to show Gina a dance routine, and she eagerly agreed.",
     ("Jon offered to show Gina a dance routine", "she eagerly agreed.")),
    ("Maria offered to help, and both acknowledged the importance of it.",
     ("Maria offered to help", "both acknowledged the importance of it.")),
    ("Mental health is important to me, and it's made such an improvement!",
     ("Mental health is important to me", "it's made such an improvement!")),
    ("I struggled with mental health, and support I got was really helpful.",
     ("I struggled with mental health", "support I got was really helpful.")),
])
def test_a_comma_and_splits_only_before_a_clause(text: str, expected: tuple[str, ...]) -> None:
    assert clauses(text) == expected




_WORD = st.from_regex(r"[a-z]{3,8}", fullmatch=True)
_NAME = st.from_regex(r"[A-Z][a-z]{2,7}", fullmatch=True)
_PLURAL = _WORD.filter(lambda w: not w.endswith("s")).map(lambda w: w + "s").filter(
    lambda w: w not in supersede._AUXILIARIES)
_SUBJECT = st.sampled_from(["User", "The user", "Maya", "The user's sister"])
_VERB = st.sampled_from(["likes", "buys", "collects", "sold", "has", "keeps", "met"])
_TAIL = st.sampled_from(["", " from the market", " at home", " every week", " in Porto"])


@settings(max_examples=200, deadline=None, database=None)
@given(_SUBJECT, _VERB, st.lists(_PLURAL, min_size=2, max_size=4), _TAIL)
def test_a_list_of_plurals_stays_whole(subject: str, verb: str, items: list[str],
                                       tail: str) -> None:
    """"apples and oranges", "apples, pears and plums": an "-s" word after "and" that
    follows another plural is an item of a list, whatever the words are."""
    listed = ", ".join(items[:-1]) + " and " + items[-1]
    text = f"{subject} {verb} {listed}{tail}."
    assert clauses(text) == (text,)


@settings(max_examples=200, deadline=None, database=None)
@given(_NAME, _NAME, st.sampled_from(["went hiking", "work at Siemens", "are friends",
                                       "visited Porto", "own 2 cats"]),
       st.sampled_from(["", "User met ", "The user's friends "]))
# A name that ends as a past tense does (CI found "Aaed"), or that is one ("Saw").
@example("Anna", "Fred", "went hiking", "User met ")
@example("Aaa", "Aaed", "went hiking", "User met ")
@example("Aaa", "Saw", "went hiking", "User met ")
@example("Bea", "Said", "went hiking", "")
def test_two_names_joined_by_and_stay_whole(a: str, b: str, rest: str, before: str) -> None:
    """"Tom and Anna went hiking": two subjects (or objects) of one verb."""
    text = f"{before}{a} and {b} {rest}." if not before.startswith("User") else \
        f"{before}{a} and {b} at the park."
    assert clauses(text) == (text,)


@settings(max_examples=200, deadline=None, database=None)
@given(_SUBJECT, st.integers(1, 100000), st.integers(1, 100000),
       st.sampled_from(["euros", "cats", "km", "people"]),
       st.sampled_from(["is between {a} and {b}", "paid {a} and {b}", "has {a} and {b}",
                        "counted {a} and {b}"]))
def test_two_numbers_joined_by_and_stay_whole(subject: str, a: int, b: int, unit: str,
                                              verb: str) -> None:
    """"between 900 and 1000 euros": a number after "and" opens no clause."""
    text = f"{subject} {verb.format(a=a, b=b)} {unit}."
    assert clauses(text) == (text,)


@settings(max_examples=200, deadline=None, database=None)
@given(_SUBJECT, st.sampled_from(["has", "keeps", "owns", "feeds"]),
       st.one_of(st.integers(2, 1000).map(str), st.sampled_from(["two", "three", "twelve"])),
       _PLURAL, _PLURAL, _TAIL)
def test_counted_plurals_joined_by_and_stay_whole(subject: str, verb: str, number: str,
                                                  first: str, second: str, tail: str) -> None:
    """"2 cats and dogs at home": a number before a plural opens a noun phrase, and the
    "-s" word after the "and" goes on with it, whatever the words are."""
    text = f"{subject} {verb} {number} {first} and {second}{tail}."
    assert clauses(text) == (text,)


_ITEM = st.sampled_from(["love", "faith", "strength", "good food", "the kids", "music",
                         "nature walks", "resume building", "canned food", "decor",
                         "spending time with friends", "listening to music"])


@settings(max_examples=200, deadline=None, database=None)
@given(_SUBJECT, _VERB, st.lists(_ITEM, min_size=3, max_size=5, unique=True), _TAIL)
def test_a_list_with_a_serial_comma_stays_whole(subject: str, verb: str, items: list[str],
                                                tail: str) -> None:
    """"love, faith, and strength": the last item after ", and" is no clause, and a
    statement restated without an outdated one keeps the list whole."""
    listed = ", ".join(items[:-1]) + ", and " + items[-1]
    text = f"{subject} {verb} {listed}{tail}."
    assert clauses(text) == (text,)
    rent = "The user's rent is 900 euros."
    assert without_outdated(f"{rent} {text}", ["The user's rent is now 1000 euros."]) == text


def test_a_clause_restated_alone_keeps_its_subject() -> None:
    assert without_outdated("Maya lives in Lisbon and works remotely.",
                            ["Maya lives in Berlin now."]) == "Maya works remotely."
    assert without_outdated("Maya lives in Lisbon and works at Google.",
                            ["Maya now works at Stripe."]) == "Maya lives in Lisbon."
    # Nothing outdated: the text stands as written, not as its clauses rejoined.
    text = "Maya lives in Lisbon and works remotely."
    assert without_outdated(text, ["The user has 3 dogs."]) == text


def test_an_update_of_a_clause_joined_without_a_comma_is_one() -> None:
    older = "The user's phone plan costs 25 euros a month and the user plays the cello."
    assert clause_conflict(older, "User's phone plan now costs 32 euros a month.") == "number"
    assert clause_conflict(older, "The user's gym costs 45 euros a month.") is None


@pytest.mark.parametrize("a, b, kind", [
    # whose fact it is is no shared context when both say more
    ("User's sister works at Deloitte.", "User's sister is now living in Turin.", None),
    ("User's sister works at Deloitte.", "The user's sister now works at KPMG.", "name"),
    # said alone, it is the fact
    ("The user's sister is Anna.", "The user's sister is Maria now.", "name"),
    ("The user's manager is Anna.", "User's new manager at work is Tomas.", "name"),
])
def test_relations_shared_are_no_context_unless_alone(a: str, b: str, kind: str | None) -> None:
    assert conflict(a, b) == kind and conflict(b, a) == kind


# --- the reverse case: the plan -------------------------------------------------------

OLD = "The user's bike lock code is 4812, and the bike is a blue Trek."
NEW = "The user changed the bike lock code to 7730."


def _merge(members: list[MemoryView], origin: Origin = Origin.DEDUP_SUMMARY) -> MemoryView:
    """A summary as the store holds it: dated by its oldest member, its members cold."""
    return view("s", content=members[0].content, origin=origin,
                created_at=min(m.created_at for m in members),
                protected=origin == Origin.COLD_LEARNING)


def _members(days: tuple[int, ...] = (100, 99, 98), text: str = NEW) -> list[MemoryView]:
    return [view(f"m{k}", content=text, tier=Tier.COLD, superseded_by="s",
                 created_at=AS_OF - timedelta(days=d)) for k, d in enumerate(days)]


def test_an_older_memory_a_summarys_member_updates_goes_cold_pointing_at_it() -> None:
    members = _members()
    older = view("old", content=OLD, created_at=AS_OF - timedelta(days=300))
    (plan,) = plan_outdated_by_summaries("p", [(_merge(members), members)], [[(older, 0.62)]])
    assert (plan.newest_id, plan.member_ids) == ("m2", ("old",))  # the newest member
    assert plan.parameters["rule"] == REVERSE_RULE and plan.parameters["summary"] == "s"
    assert plan.similarities == {"old": 0.62} and plan.conflicts == {"old": "number"}
    assert plan.priors == {"old": (Tier.HOT, "active", None)}
    (kept,) = plan.restated  # what else it said stays hot, at its date
    assert kept.content == "The bike is a blue Trek." and kept.created_at == older.created_at
    assert kept.parameters["rule"] == RESTATE_RULE and kept.parameters["restates"] == "old"
    assert plan.parameters["restated"] == [kept.summary_id]
    # Vetoed (an operator undid it): not planned again.
    assert plan_outdated_by_summaries("p", [(_merge(members), members)], [[(older, 0.62)]],
                                      {plan.consolidation_id}) == []


@pytest.mark.parametrize("older, why", [
    # newer than every member: the forward case, not this one
    (view("old", content=OLD, created_at=AS_OF - timedelta(days=50)), "newer"),
    # the same value said again
    (view("old", content="User's bike lock code: 7730.", created_at=AS_OF - timedelta(days=300)),
     "agrees"),
    # another entity's fact, another kind of memory
    (view("old", content=OLD, entity="Sam", created_at=AS_OF - timedelta(days=300)), "entity"),
    (view("old", content=OLD, kind="preference", created_at=AS_OF - timedelta(days=300)), "kind"),
])
def test_no_reverse_update(older: MemoryView, why: str) -> None:
    members = _members()
    assert plan_outdated_by_summaries("p", [(_merge(members), members)], [[(older, 0.6)]]) == [], why


def test_a_member_a_newer_hot_memory_updates_updates_nothing() -> None:
    """old (4812) < members (7730) < newer (1111): the members are stale, not old's
    update; the forward plan makes them stale, and old is left to the plain chain."""
    members = _members()
    older = view("old", content=OLD, created_at=AS_OF - timedelta(days=300))
    newer = view("new", content="User's bike lock code is 1111 now.",
                 created_at=AS_OF - timedelta(days=10))
    pairs = [(_merge(members), members)]
    assert plan_outdated_by_summaries("p", pairs, [[(older, 0.6), (newer, 0.6)]]) == []
    (forward,) = plan_summary_updates("p", pairs, [[(older, 0.6), (newer, 0.6)]])
    assert forward.newest_id == "new" and set(forward.member_ids) == {"m0", "m1", "m2", "s"}


def test_an_outdated_memory_is_no_newer_value_for_an_older_summarys_member() -> None:
    """A summary's members at 300 and 10 days agree (7730); a hot memory between them
    says 4812: it is outdated by the newer member, and the older member is not stale."""
    members = _members((300, 10))
    between = view("old", content=OLD, created_at=AS_OF - timedelta(days=100))
    (plan,) = plan_summary_updates("p", [(_merge(members), members)], [[(between, 0.6)]])
    assert (plan.newest_id, plan.member_ids) == ("m1", ("old",))


def test_a_cold_notes_member_updates_but_the_note_is_never_rewritten() -> None:
    members = _members((100,))
    note = _merge(members, Origin.COLD_LEARNING)
    older = view("old", content=OLD, created_at=AS_OF - timedelta(days=300))
    (plan,) = plan_summary_updates("p", [(note, members)], [[(older, 0.6)]])
    assert plan.newest_id == "m0" and plan.member_ids == ("old",)
    newer = view("new", content="User's bike lock code is 1111 now.",
                 created_at=AS_OF - timedelta(days=10))
    assert plan_summary_updates("p", [(note, members)], [[(newer, 0.6)]]) == []


def test_an_event_neither_updates_nor_is_updated() -> None:
    members = [view("m0", content="User ran 10 km on Friday.", kind="episodic",
                    tier=Tier.COLD, superseded_by="s", created_at=AS_OF - timedelta(days=5))]
    older = view("old", content="User ran 5 km on Friday.", kind="episodic",
                 created_at=AS_OF - timedelta(days=30))
    assert plan_outdated_by_summaries("p", [(_merge(members), members)], [[(older, 0.8)]]) == []


# --- the reverse case, through the flows ------------------------------------------------


@pytest.mark.usefixtures("prefect_api")
def test_an_older_memory_written_after_the_newer_were_merged_is_superseded(store: Store) -> None:
    """The newer value is merged by a first run (three near-duplicates); an older
    statement of the fact arrives later with its own date (an import of history). The
    next run moves it cold, pointing at the newest member; its second fact stays hot;
    a dry run selects what the real run does, a second run changes nothing, undo
    restores it and a later run does not redo it."""
    rules = ConsolidationConfig(summarizer="rules")
    newer = [{"profile": "p", "id": f"n{k}", "content": text, "created_at": iso(100 - k)}
             for k, text in enumerate([
                 "The user's bike lock code is 7730.", "The user's bike lock code is 7730 now.",
                 "User's bike lock code: 7730."])]
    assert not ingest_records(store, newer).errors
    full_consolidation(profile="p", as_of=AS_OF - timedelta(days=50), config=rules)
    mine = by_external(store)
    summary = mine["n0"]["superseded_by"]
    assert summary is not None and mine["n2"]["superseded_by"] == summary  # merged

    assert not ingest_records(store, [{"profile": "p", "id": "old", "content": OLD,
                                       "created_at": iso(300)}]).errors
    dry_run_then_real(store, rules)

    mine = by_external(store)
    assert mine["old"]["tier"] == Tier.COLD and mine["old"]["superseded_by"] == mine["n2"]["id"]
    (audit,) = audits(store)
    assert audit["parameters"]["rule"] == REVERSE_RULE
    assert audit["parameters"]["summary"] == summary and audit["summary_id"] == mine["n2"]["id"]
    hot = [r for r in state(store) if r["type"] == "memory" and r["tier"] == Tier.HOT]
    said = " ".join(r["content"] for r in hot)
    assert "4812" not in said and "7730" in said and "blue Trek" in said
    (restated,) = [r for r in hot if r["origin"] == Origin.RESTATED]
    assert restated["created_at"] == mine["old"]["created_at"]

    after = state(store)
    full_consolidation(profile="p", as_of=AS_OF, config=rules)
    assert state(store) == after  # a second run changes nothing

    assert sorted(undo_consolidation(store, audit["id"], "p").restored) == [mine["old"]["id"]]
    mine = by_external(store)
    assert mine["old"]["tier"] == Tier.HOT and mine["old"]["superseded_by"] is None
    assert not [r for r in state(store) if r["type"] == "memory"
                and r["origin"] == Origin.RESTATED]
    full_consolidation(profile="p", as_of=AS_OF, config=rules)
    assert by_external(store)["old"]["superseded_by"] is None  # undone: not redone


@pytest.mark.usefixtures("prefect_api")
def test_a_cold_notes_newer_member_supersedes_an_older_memory(store: Store) -> None:
    """The newer value is folded into a cold note (protected, linksee's learning memory)
    before the older statement arrives: the older goes cold pointing at the note's
    newest member, and the note stands as it was."""
    newer = [{"profile": "p", "id": f"n{k}", "content": text, "created_at": iso(100 - k),
              "entity": "bike", "layer": "implementation"}
             for k, text in enumerate(["The user's bike lock code is 7730.",
                                       "User's bike lock code: 7730 now."])]
    assert not ingest_records(store, newer).errors
    consolidate_cold(profile="p", as_of=AS_OF - timedelta(days=50))
    mine = by_external(store)
    note = mine["n0"]["superseded_by"]
    assert note is not None and mine["n1"]["superseded_by"] == note
    notes = [r for r in state(store) if r["type"] == "memory" and r["id"] == note]
    assert notes[0]["origin"] == Origin.COLD_LEARNING and notes[0]["tier"] == Tier.HOT

    assert not ingest_records(store, [{"profile": "p", "id": "old", "content": OLD,
                                       "created_at": iso(300), "entity": "bike"}]).errors
    full_consolidation(profile="p", as_of=AS_OF, config=ConsolidationConfig(summarizer="rules"))
    mine = by_external(store)
    assert mine["old"]["tier"] == Tier.COLD and mine["old"]["superseded_by"] == mine["n1"]["id"]
    (audit,) = audits(store)
    assert audit["parameters"]["summary"] == note
    after = {r["id"]: r for r in state(store) if r["type"] == "memory"}
    assert after[note]["content"] == notes[0]["content"] and after[note]["tier"] == Tier.HOT
