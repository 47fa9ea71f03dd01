"""``reverie bench updates``: does hot recall answer with the newest value of a fact?

Issue #37 (item 3): an update supersedes; it is never averaged. The bench writes, for a
number of profiles, *update chains*: two to five memories stating successive values of
one fact (an amount, an employer, a person's name, a date, a place, a count), each in
other words than the last, a month or more apart, among distractor memories that hold
other facts of the same kinds (a deposit next to the rent, a brother next to the
manager). It consolidates the store as ``bench locomo`` does (decay, then full
consolidation, ``offset_days`` after the last memory: most are fading by then, so both
merging and compression see them), then asks each chain's question of hot recall
(``engines.ranking``) and checks the answer, the best-ranked hot memory that states any
value of the chain: it must state the newest value and none of the older ones (how
often the very first hit does is reported too: a distractor ranked first is a matter
of recall, not of staleness). Each distractor's own question must still find its
value as the first hit of the hot tier.

Two cases exercise what a plain chain does not (``GAPS``): an older memory stating a
second fact besides the updated value, and an older value already inside a summary
(merged by a first consolidation, before the update is written and the store is
consolidated again). Their second facts are asked too: one of hot recall's first three
hits must still state them (the update, about the same thing, may rank first).

Reverse chains (``REVERSE_KINDS``, and the reversed gap) write the newest value first,
three times, so that the first consolidation merges it; their older values come after
it, each at its own older date (an import of history): a summary is dated by its
oldest member, so only its members' dates tell that it holds the newer value.

Summary chains (``SUMMARY_KINDS``) have every value inside a summary of its own before
any update is searched: a store consolidated by a release that searched none (the first
run of their rows has both supersede radii at 1.0; merges never join two values). Each
value is said three times and merged; the next run must point each older summary's
members at the newest value.

It also counts the chains a consolidation *joined*: one summary (merge or
compression) standing for chain members that state different values; and, of those,
the ones whose summary states an older value without the newest; and the chains with
any hot memory of their own still stating an older value without the newest.
"""

from __future__ import annotations

import string
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from reverie.engines.embedding import embedder_for
from reverie.engines.ranking import rank
from reverie.models.config import ConsolidationConfig
from reverie.models.errors import InputError
from reverie.models.ingest import ingest
from reverie.models.records import MemoryView
from reverie.models.repositories.memories import snapshot
from reverie.models.settings import using_database
from reverie.models.store import Store
from reverie.models.tables import SUMMARY_ORIGINS, Tier
from reverie.recall.search import candidates_for

_PUNCTUATION = str.maketrans({c: " " for c in string.punctuation})


def words(text: str) -> list[str]:
    return text.lower().translate(_PUNCTUATION).split()


def states(text: str, value: str) -> bool:
    """Whether ``text`` says ``value`` (its words, in order, as a run)."""
    have, want = words(text), words(value)
    return any(have[i:i + len(want)] == want for i in range(len(have) - len(want) + 1))


def said_as_replaced(text: str, value: str) -> bool:
    """Whether ``text`` says ``value`` as the one it replaces, in the bench's own
    wordings of it ("switched from the Pixel to ...", "sold the Pixel phone and ...",
    "a new manager, Anna, after Tomas retired")."""
    return states(text, f"from the {value} to") or states(text, f"sold the {value}") \
        or states(text, f"after {value} retired")


@dataclass(frozen=True)
class FactKind:
    """One kind of fact: how its memories are worded (``{v}`` is the value), the
    question that asks for it, and the values its chains go through."""

    name: str
    question: str
    templates: tuple[str, ...]
    values: tuple[str, ...]


KINDS: tuple[FactKind, ...] = (
    FactKind(
        "amount", "How much rent does the user pay each month?",
        ("The user's rent is {v} euros a month.",
         "User now pays {v} euros of rent every month.",
         "The monthly rent on the user's flat went up to {v} euros.",
         "User said the rent is {v} euros per month now.",
         "Rent for the user's apartment: {v} euros a month."),
        ("900", "950", "1000", "1080", "1150", "1200", "1275"),
    ),
    FactKind(
        "employer", "Which company does the user work for?",
        ("The user works at {v}.",
         "User now works for {v} as an engineer.",
         "The user started a new job, working at {v}.",
         "User mentioned working at {v} these days.",
         "The user has been working for {v} since last month."),
        ("Google", "Microsoft", "Stripe", "Spotify", "Siemens", "Airbus", "Zalando"),
    ),
    FactKind(
        "person", "Who is the user's manager?",
        ("The user's manager is {v}.",
         "User's new manager at work is {v}.",
         "{v} is now the user's manager.",
         "The user said their manager is {v} now.",
         "User got a new manager, {v}, after {p} retired."),
        ("Anna", "Tomas", "Priya", "Keith", "Marisol", "Jonas", "Leila"),
    ),
    FactKind(
        "date", "When is the user's dentist appointment?",
        ("The user's dentist appointment is on {v}.",
         "User moved the dentist appointment to {v}.",
         "The dentist appointment of the user is now on {v}.",
         "User rescheduled the dentist appointment for {v}.",
         "User's dentist appointment: {v}."),
        ("3 March", "10 March", "2 April", "17 April", "5 May", "21 May", "9 June"),
    ),
    FactKind(
        "place", "Which city does the user live in?",
        ("The user lives in {v}.",
         "User is now living in {v}.",
         "The user lives in {v} these days, in a small flat.",
         "User said they live in {v} now.",
         "The user has been living in {v} since the spring."),
        ("Lisbon", "Berlin", "Madrid", "Vienna", "Dublin", "Prague", "Oslo"),
    ),
    FactKind(
        "count", "How many cats does the user have?",
        ("The user has {v} cats.",
         "User now has {v} cats at home.",
         "The user said they keep {v} cats.",
         "User has {v} cats living with them now.",
         "The user's household has {v} cats."),
        ("2", "three", "4", "five", "6", "seven", "8"),
    ),
    # An age, said as a number of years or as a birthday passed.
    FactKind(
        "age", "How old is the user?",
        ("The user is {v} years old.",
         "User turned {v} this spring.",
         "The user's age is {v}.",
         "The user is now aged {v}.",
         "User said they are {v} years old now."),
        ("34", "35", "36", "37", "38", "39", "40"),
    ),
    # A new value said beside the one it replaces ("{p}": the chain's value before).
    FactKind(
        "replaced", "Which phone does the user have?",
        ("The user's phone is a {v}.",
         "User switched from the {p} to a {v} phone.",
         "The user sold the {p} phone and bought a {v}.",
         "User has a {v} phone now.",
         "The user's current phone is a {v}."),
        ("Pixel", "Galaxy", "Nokia", "Fairphone", "Xperia", "Motorola", "Huawei"),
    ),
    # One thing named in two words ("flat", "apartment").
    FactKind(
        "size", "How big is the user's flat?",
        ("The user's flat is {v} square metres.",
         "The user's apartment is {v} square metres.",
         "User's apartment has {v} square metres now.",
         "The user said the flat is {v} square metres.",
         "The user's apartment measures {v} square metres."),
        ("48", "55", "62", "70", "41", "85", "93"),
    ),
    # What someone likes best: one of a kind at a time, a value in lower case.
    FactKind(
        "taste", "What is the user's favourite food?",
        ("The user's favourite food is {v}.",
         "User said their favourite food is {v} now.",
         "These days the user's favourite food is {v}.",
         "The user's favourite food these days: {v}.",
         "User's favourite food is {v} at the moment."),
        ("sushi", "ramen", "curry", "paella", "dumplings", "lasagne", "falafel"),
    ),
    # What colour a thing is: a value in lower case, said after the thing.
    FactKind(
        "colour", "What colour is the user's car?",
        ("The user's car is {v}.",
         "User said their car is {v} now.",
         "These days the user's car is {v}.",
         "The user's car: {v}.",
         "The user's car is {v} at the moment."),
        ("red", "blue", "green", "black", "white", "grey", "yellow"),
    ),
    # A change said as one, by whoever made it ("the gym raised ... to").
    FactKind(
        "changed", "How much is the service charge on the user's flat?",
        ("The service charge on the user's flat is {v} euros a month.",
         "The user's landlord raised the service charge to {v} euros.",
         "User's service charge went up to {v} euros a month.",
         "The landlord lowered the user's service charge to {v} euros a month.",
         "The user pays {v} euros a month of service charge now."),
        ("39", "42", "45", "35", "49", "52", "29"),
    ),
)

# Other facts of the same kinds, near the chains: none of them is an update of one.
DISTRACTORS: tuple[tuple[str, str, str], ...] = (
    ("The user paid a deposit of 1800 euros for the flat.",
     "How much was the user's deposit?", "1800"),
    ("The user's brother is called Rafael.", "What is the name of the user's brother?",
     "Rafael"),
    ("User visited Porto last summer on holiday.", "Which city did the user visit on holiday?",
     "Porto"),
    ("The user's gym membership costs 45 euros a month.", "How much is the user's gym?",
     "45"),
    ("The user has 2 goldfish in a tank.", "How many goldfish does the user have?", "2"),
    ("User's sister works at Deloitte.", "Where does the user's sister work?", "Deloitte"),
    ("The user's car service is booked for 14 February.", "When is the car service?",
     "14 February"),
    ("User enjoys hiking on weekends with friends.", "What does the user do on weekends?",
     "hiking"),
    # A name of the user's own, beside the words of where the user works.
    ("The user is called Sam at work.", "What is the user called at work?", "Sam"),
)


# Two things of one kind said in the same words but one, with different values, the
# second a month after the first: neither updates the other (``tasks.supersede``'s
# ``one_word_swapped``; for a thing of the owner beside the owner, ``owned_unsaid``).
# Each thing's own question must find its own value first in the hot tier.
DIFFERENT_THINGS: tuple[tuple[tuple[str, str, str], tuple[str, str, str]], ...] = (
    (("The kitchen lamp uses a 40 watt bulb.", "Which bulb does the kitchen lamp use?", "40"),
     ("The bedroom lamp uses a 60 watt bulb.", "Which bulb does the bedroom lamp use?", "60")),
    (("The front door code is 4512.", "What is the code of the front door?", "4512"),
     ("The garage door code is 7781.", "What is the code of the garage door?", "7781")),
    (("The user's morning run is 5 km.", "How long is the user's morning run?", "5"),
     ("The user's evening run is 12 km.", "How long is the user's evening run?", "12")),
    (("The blue car needs 40 litres of fuel.", "How much fuel does the blue car need?", "40"),
     ("The red car needs 55 litres of fuel.", "How much fuel does the red car need?", "55")),
    (("The budget meeting is in room 12.", "Which room is the budget meeting in?", "12"),
     ("The design meeting is in room 31.", "Which room is the design meeting in?", "31")),
    # Two days, each with its own amount: two events, not one value updated.
    (("Maya ran 5 km on Monday.", "How far did Maya run on Monday?", "5"),
     ("Maya ran 8 km on Tuesday.", "How far did Maya run on Tuesday?", "8")),
    (("The user paid 120 euros for groceries on 3 May.",
      "How much did the user pay for groceries on 3 May?", "120"),
     ("The user paid 85 euros for groceries on 10 June.",
      "How much did the user pay for groceries on 10 June?", "85")),
    # Two kinds of one thing, each named by the word after it.
    (("The user's favourite book is Dune.", "What is the user's favourite book?", "Dune"),
     ("The user's favourite film is Alien.", "What is the user's favourite film?", "Alien")),
    (("Maya's favourite band is Radiohead.", "What is Maya's favourite band?", "Radiohead"),
     ("Maya's favourite painter is Monet.", "Who is Maya's favourite painter?", "Monet")),
    (("Maya's favourite colour is teal.", "What is Maya's favourite colour?", "teal"),
     ("Maya's favourite flower is the tulip.", "What is Maya's favourite flower?", "tulip")),
    # Two rooms of one home, each its own colour.
    (("The user's kitchen is yellow.", "What colour is the user's kitchen?", "yellow"),
     ("The user's bedroom is blue.", "What colour is the user's bedroom?", "blue")),
    # A thing of the owner, said in the owner's own words: the owner's fact stays.
    (("The user weighs 80 kg.", "How much does the user weigh?", "80"),
     ("The user's suitcase weighs 20 kg.", "How much does the user's suitcase weigh?",
      "20")),
    (("The user is called Sam.", "What is the user called?", "Sam"),
     ("The user's boat is called Seabird.", "What is the name of the user's boat?",
      "Seabird")),
    # Two things of the owner, each named by a name (``named_apart``).
    (("Lena's Zalando team had 12 people.", "How many people were in Lena's Zalando team?",
      "12"),
     ("Lena's Spotify team has 8 people.", "How many people are in Lena's Spotify team?",
      "8")),
    (("The user's Skoda is 9 years old.", "How old is the user's Skoda?", "9"),
     ("The user's Tesla is 2 years old.", "How old is the user's Tesla?", "2")),
)

# A value added beside one said a month before, in words that say it is one more
# ("also", "as well") or by a verb of things one has many of (speaks, visited): neither
# updates the other (``tasks.supersede``'s ``adds_value`` and ``MANY_VALUED``), and a
# name of a day is no new value of a place (``TIME_NAMES``). Each value must stay among
# hot recall's first ``KEPT_HITS`` hits for its question.
ADDED: tuple[tuple[tuple[str, str, str], tuple[str, str, str]], ...] = (
    (("The user translates from German into English.",
      "Which languages does the user translate from?", "German"),
     ("The user also translates from French into English.",
      "Which languages does the user translate from?", "French")),
    (("The user speaks Portuguese.", "Which languages does the user speak?", "Portuguese"),
     ("The user speaks Japanese as well.", "Which languages does the user speak?",
      "Japanese")),
    (("User visited Seville in March.", "Which Spanish cities has the user visited?",
      "Seville"),
     ("User visited Valencia in June.", "Which Spanish cities has the user visited?",
      "Valencia")),
    (("Lena visited Rome in 2023.", "Which cities has Lena visited?", "Rome"),
     ("Lena visited Paris in 2024.", "Which cities has Lena visited?", "Paris")),
    (("The user plays chess with Marco.", "Who does the user play chess with?", "Marco"),
     ("The user plays chess with Lena too.", "Who does the user play chess with?", "Lena")),
    (("The user's vet, Dr Braun, is in Altona.", "Where is the user's vet?", "Altona"),
     ("The user's vet is open on Saturdays.", "When is the user's vet open?",
      "Saturdays")),
)


@dataclass(frozen=True)
class Gap:
    """An update chain a plain chain does not exercise (#37 item 3's gaps): ``older``
    memories stating the first value (each with ``{v}``), consolidated once before the
    ``update`` (also with ``{v}``) is written; and a second fact an older memory states
    besides the value, which hot recall must still find (``kept``: its question and
    value)."""

    name: str
    question: str
    older: tuple[str, ...]
    update: str
    values: tuple[str, str]
    kept: tuple[str, str]
    # The reverse case: ``older`` state the newest value (``values[1]``), are written
    # first and consolidated; ``update`` states the older value (``values[0]``) at an
    # older date, written after the consolidation (an import of history).
    reverse: bool = False


GAPS: tuple[Gap, ...] = (
    # One memory, two facts, one of them updated: its other fact stays hot.
    Gap("two facts", "How much does the user's phone plan cost?",
        ("The user's phone plan costs {v} euros a month. The user plays the cello in an "
         "orchestra.",),
        "User's phone plan now costs {v} euros a month.", ("25", "32"),
        ("Which instrument does the user play?", "cello")),
    # The older value is inside a summary (near-duplicates merged by an earlier run,
    # one of them with a second fact) when the update comes.
    Gap("in a summary", "What is the user's bike lock code?",
        ("The user's bike lock code is {v}.", "The user's bike lock code is {v} now.",
         "User's bike lock code: {v}.",
         "The user's bike lock code is {v}, and the bike is a blue Trek."),
        "The user changed the bike lock code to {v}.", ("4812", "7730"),
        ("What brand is the user's bike?", "Trek")),
    # Two facts in one sentence, joined by "and" without a comma.
    Gap("two facts, one sentence", "How much does the user's car insurance cost?",
        ("The user's car insurance costs {v} euros a year and the user sings in a choir.",),
        "User's car insurance now costs {v} euros a year.", ("310", "342"),
        ("Where does the user sing?", "choir")),
    # The second clause goes on with the first's subject: restated, it must keep it.
    Gap("a clause without its subject", "How much does the user's parking space cost?",
        ("The user's parking space costs {v} euros a month and includes a charger for "
         "the car.",),
        "User's parking space now costs {v} euros a month.", ("60", "75"),
        ("What does the user's parking space include?", "parking space includes a charger")),
    # The reverse case: the newest value is merged before the older one is written.
    Gap("newer in a summary", "What is the user's locker number?",
        ("The user's locker number is {v}.", "The user's locker number is {v} now.",
         "User's locker number: {v}."),
        "The user's locker number is {v}, and the locker is next to the pool.",
        ("118", "245"), ("Where is the user's locker?", "next to the pool"), reverse=True),
)


def different_questions() -> frozenset[str]:
    return frozenset(q for pair in DIFFERENT_THINGS for _, q, _ in pair)


@dataclass
class Chain:
    profile: str
    kind: str
    question: str
    values: list[str]
    memory_ids: list[str]
    # The newest value is written first, the older ones after a consolidation.
    reverse: bool = False
    # Every value is in a summary of its own before updates are searched.
    summaries: bool = False


Question = tuple[str, str, str]  # profile, question, value


def build(profiles: int, start: datetime) -> tuple[dict[str, list[dict[str, Any]]], list[Chain],
                                                    list[Question], list[Question],
                                                    list[Question]]:
    """The bench's memories per profile, its chains, its distractor questions (the
    different things' among them: ``DIFFERENT_THINGS``, which ``different_questions``
    tells apart), the questions of the other facts older memories state besides an
    updated value, and those of the values added beside another (``ADDED``).
    Deterministic."""
    records: dict[str, list[dict[str, Any]]] = {}
    chains: list[Chain] = []
    distractors: list[Question] = []
    kept: list[Question] = []
    added: list[Question] = []
    for p in range(profiles):
        profile = f"updates-{p + 1}"
        rows: list[dict[str, Any]] = []
        for k, kind in enumerate(KINDS):
            length = 2 + (p + k) % 4  # 2 to 5
            values = [kind.values[(p + i) % len(kind.values)] for i in range(length)]
            ids = []
            for i, value in enumerate(values):
                template = kind.templates[(p + k + i) % len(kind.templates)]
                if i == 0 and "{p}" in template:  # nothing before the first to replace
                    template = kind.templates[0]
                at = start + timedelta(days=35 * i + 3 * k + p)
                mid = f"{kind.name}-{i}"
                ids.append(mid)
                rows.append({"id": mid, "content": template.format(
                                 v=value, p=values[i - 1] if i else value),
                             "kind": "semantic", "created_at": at.isoformat()})
            chains.append(Chain(profile, kind.name, kind.question, values, ids))
        for k, kind in enumerate(REVERSE_KINDS):
            rows += _reverse_chain(p, k, kind, start, chains, profile)
        for k, kind in enumerate(SUMMARY_KINDS):
            rows += _summary_chain(p, k, kind, start, chains, profile)
        for d, (text, question, value) in enumerate(DISTRACTORS):
            at = start + timedelta(days=11 * d + p)
            rows.append({"id": f"distractor-{d}", "content": text, "kind": "semantic",
                         "created_at": at.isoformat()})
            distractors.append((profile, question, value))
        # The second of a pair a month or more after the first.
        distractors += _pair_rows(DIFFERENT_THINGS, "different", 40, 7, p + 2, start, rows,
                                  profile)
        added += _pair_rows(ADDED, "added", 30, 5, p + 4, start, rows, profile)
        for g, gap in enumerate(GAPS):
            ids = []
            first, then = gap.values[::-1] if gap.reverse else gap.values
            for i, text in enumerate(gap.older):
                at = start + timedelta(days=5 * g + i + p + (60 if gap.reverse else 0))
                ids.append(f"gap-{g}-{i}")
                rows.append({"id": ids[-1], "content": text.format(v=first),
                             "kind": "semantic", "created_at": at.isoformat()})
            # Written after the first consolidation (``LATER``), so the older value may
            # be in a summary by then (or, reversed, the newer one is).
            ids.append(f"gap-{g}-update")
            rows.append({"id": ids[-1], "content": gap.update.format(v=then),
                         "kind": "semantic", LATER: True}
                        | ({"created_at": (start + timedelta(days=5 * g + p)).isoformat()}
                           if gap.reverse else {}))
            chains.append(Chain(profile, gap.name, gap.question, list(gap.values), ids,
                                gap.reverse))
            kept.append((profile, *gap.kept))
        records[profile] = rows
    return records, chains, distractors, kept, added


def _pair_rows(pairs: Sequence[tuple[tuple[str, str, str], tuple[str, str, str]]], name: str,
               apart: int, between: int, offset: int, start: datetime,
               rows: list[dict[str, Any]], profile: str) -> list[Question]:
    """Rows of ``pairs`` (added to ``rows``): the second of each ``apart`` days after
    the first, each pair ``between`` days after the last; and their questions."""
    questions = []
    for d, pair in enumerate(pairs):
        for i, (text, question, value) in enumerate(pair):
            at = start + timedelta(days=apart * i + between * d + offset)
            rows.append({"id": f"{name}-{d}-{i}", "content": text, "kind": "semantic",
                         "created_at": at.isoformat()})
            questions.append((profile, question, value))
    return questions


# Fact kinds of the reverse chains: another thing than the plain chains' (one fact of a
# kind per profile), worded as they are.
REVERSE_KINDS: tuple[FactKind, ...] = (
    FactKind(
        "amount", "How much is the user's electricity bill each month?",
        ("The user's electricity bill is {v} euros a month.",
         "User's electricity bill now comes to {v} euros every month.",
         "The monthly electricity bill of the user went up to {v} euros.",
         "User said the electricity bill is {v} euros per month now.",
         "The electricity bill for the user: {v} euros a month."),
        ("410", "445", "480", "520", "565", "600", "640"),
    ),
    FactKind(
        "person", "Who is the user's landlord?",
        ("The user's landlord is {v}.",
         "User's new landlord is {v}.",
         "{v} is now the user's landlord.",
         "The user said their landlord is {v} now.",
         "User has a new landlord, {v}."),
        ("Okafor", "Lindqvist", "Moreau", "Haddad", "Novak", "Castillo", "Brennan"),
    ),
    FactKind(
        "place", "Which town does the user's sister live in?",
        ("The user's sister lives in {v}.",
         "User's sister is now living in {v}.",
         "The user's sister lives in {v} these days, in a small flat.",
         "User said their sister lives in {v} now.",
         "The user's sister has been living in {v} since the spring."),
        ("Ghent", "Utrecht", "Bergen", "Graz", "Aarhus", "Turin", "Krakow"),
    ),
    FactKind(
        "count", "How many bikes does the user own?",
        ("The user owns {v} bikes.",
         "User now owns {v} bikes.",
         "The user said they own {v} bikes.",
         "User owns {v} bikes now.",
         "The user now owns {v} bikes."),
        ("2", "three", "4", "five", "6", "seven", "8"),
    ),
)
# How often the newest value of a reverse chain is said (near-duplicates a first
# consolidation merges before the older values are written).
REVERSE_NEWEST = 3


# Fact kinds of the summary chains: other things again, worded as the others are.
SUMMARY_KINDS: tuple[FactKind, ...] = (
    FactKind(
        "amount", "How much does the user pay for internet each month?",
        ("The user's internet costs {v} euros a month.",
         "User's internet now costs {v} euros every month.",
         "The user's internet went up to {v} euros a month.",
         "User said the internet is {v} euros per month now.",
         "The user's internet connection is {v} euros a month."),
        ("29", "33", "36", "39", "42", "47", "52"),
    ),
    FactKind(
        "person", "Who is the user's doctor?",
        ("The user's doctor is Dr {v}.",
         "User's new doctor is Dr {v}.",
         "Dr {v} is now the user's doctor.",
         "The user said their doctor is Dr {v} now.",
         "User has a new doctor, Dr {v}."),
        ("Ferreira", "Kowalski", "Nakamura", "Oyelaran", "Schmidt", "Varga", "Dubois"),
    ),
    FactKind(
        "place", "Which city is the user's office in?",
        ("The user's office is in {v}.",
         "User's office is now in {v}.",
         "The user's office is located in {v}.",
         "User said their office is in {v} now.",
         "The user has had an office in {v} since the spring."),
        ("Hamburg", "Munich", "Cologne", "Leipzig", "Bremen", "Dresden", "Bonn"),
    ),
    FactKind(
        "count", "How many guitars does the user own?",
        ("The user owns {v} guitars.",
         "User now owns {v} guitars.",
         "The user said they own {v} guitars.",
         "User owns {v} guitars now.",
         "The user now has {v} guitars."),
        ("2", "three", "4", "five", "6", "seven", "8"),
    ),
)
# A row of a summary chain, written and consolidated (with no update search) before the
# profile's other rows.
EARLY = "early"


def _summary_chain(p: int, k: int, kind: FactKind, start: datetime, chains: list[Chain],
                   profile: str) -> list[dict[str, Any]]:
    """A summary chain: each value said three times (near-duplicates, merged), in one of
    the kind's wordings, a month or more after the last; all written before the
    profile's other rows (``EARLY``)."""
    length = 2 + (p + k + 2) % 4  # 2 to 5
    values = [kind.values[(p + i + 2) % len(kind.values)] for i in range(length)]
    rows: list[dict[str, Any]] = []
    ids = []
    for i, value in enumerate(values):
        said = kind.templates[(p + k + i) % len(kind.templates)].format(v=value)
        texts = [said, said.rstrip(".") + " now.", said.rstrip(".") + " these days."]
        for r, text in enumerate(texts):
            at = start + timedelta(days=35 * i + 3 * k + p + r)
            ids.append(f"summaries-{kind.name}-{i}-{r}")
            rows.append({"id": ids[-1], "content": text, "kind": "semantic",
                         "created_at": at.isoformat(), EARLY: True})
    chains.append(Chain(profile, f"summaries {kind.name}", kind.question, values, ids,
                        summaries=True))
    return rows


def _reverse_chain(p: int, k: int, kind: FactKind, start: datetime, chains: list[Chain],
                   profile: str) -> list[dict[str, Any]]:
    """A reverse chain: its newest value said ``REVERSE_NEWEST`` times, written first;
    its older values, each in other words and at its own older date, written after the
    first consolidation (``LATER``), when the newest is in a summary."""
    length = 2 + (p + k + 1) % 4  # 2 to 5
    values = [kind.values[(p + i + 1) % len(kind.values)] for i in range(length)]
    rows: list[dict[str, Any]] = []
    ids = []
    for i, value in enumerate(values[:-1]):
        template = kind.templates[(p + k + i) % len(kind.templates)]
        ids.append(f"reverse-{kind.name}-{i}")
        rows.append({"id": ids[-1], "content": template.format(v=value), "kind": "semantic",
                     "created_at": (start + timedelta(days=35 * i + 3 * k + p)).isoformat(),
                     LATER: True})
    template = kind.templates[(p + k + length - 1) % len(kind.templates)]
    said = template.format(v=values[-1])
    for r, text in enumerate((said, said.rstrip(".") + " now.",
                              said.rstrip(".") + " these days.")[:REVERSE_NEWEST]):
        at = start + timedelta(days=35 * (length - 1) + 3 * k + p + r)
        ids.append(f"reverse-{kind.name}-newest-{r}")
        rows.append({"id": ids[-1], "content": text, "kind": "semantic",
                     "created_at": at.isoformat()})
    chains.append(Chain(profile, f"reverse {kind.name}", kind.question, values, ids, True))
    return rows


# How far down hot recall an updated memory's other fact must be: a question about it
# also finds the update (both name the same thing), which may rank first.
KEPT_HITS = 3
# A row written after the first consolidation of its profile, a day after it.
LATER = "later"


@dataclass
class ChainResult:
    profile: str
    kind: str
    length: int
    answer: str
    newest: bool
    joined: bool
    stale_summary: bool
    top: bool = False  # the very best-ranked hot memory states the newest value
    # A hot memory of the chain still states an older value, not the newest (whatever
    # recall ranks first, a stale text an agent may read).
    stale_hot: bool = False


@dataclass
class UpdatesResult:
    profiles: int
    offset_days: float
    summarizer: str
    chains: list[ChainResult] = field(default_factory=list)
    distractors_found: int = 0
    distractors_missed: list[str] = field(default_factory=list)
    distractors: int = 0
    # Of the distractors, those of ``DIFFERENT_THINGS``.
    different: int = 0
    different_found: int = 0
    hot_before: int = 0
    hot_after: int = 0
    # Other facts of updated memories (``GAPS``) stated among hot recall's first
    # ``KEPT_HITS`` hits.
    kept_found: int = 0
    kept: int = 0
    # Values added beside another (``ADDED``), among the first ``KEPT_HITS`` as well.
    added_found: int = 0
    added: int = 0
    # Reverse chains, and those whose newest value was inside a summary when the older
    # values were written (the case they exercise).
    reverse: int = 0
    reverse_in_summary: int = 0
    # Summary chains, those with every value in a summary of its own (none holding two)
    # when updates were first searched (the case they exercise), and the operations
    # that wrote those summaries.
    summary_chains: int = 0
    summary_chains_in_summaries: int = 0
    summary_operations: dict[str, int] = field(default_factory=dict)

    def newest_share(self) -> float:
        return round(sum(c.newest for c in self.chains) / len(self.chains), 4)

    def as_json(self) -> dict[str, Any]:
        by_kind: dict[str, list[ChainResult]] = {}
        for c in self.chains:
            by_kind.setdefault(c.kind, []).append(c)
        return {
            "profiles": self.profiles, "offset_days": self.offset_days,
            "summarizer": self.summarizer, "chains": len(self.chains),
            "newest": sum(c.newest for c in self.chains), "newest_share": self.newest_share(),
            "top_newest": sum(c.top for c in self.chains),
            "joined": sum(c.joined for c in self.chains),
            "stale_summaries": sum(c.stale_summary for c in self.chains),
            "stale_hot": sum(c.stale_hot for c in self.chains),
            "distractors": self.distractors, "distractors_found": self.distractors_found,
            "different_things": self.different,
            "different_things_found": self.different_found,
            "hot_before": self.hot_before, "hot_after": self.hot_after,
            "other_facts": self.kept, "other_facts_found": self.kept_found,
            "added_values": self.added, "added_values_found": self.added_found,
            "reverse_chains": self.reverse, "reverse_in_summary": self.reverse_in_summary,
            "summary_chains": self.summary_chains,
            "summary_chains_in_summaries": self.summary_chains_in_summaries,
            "summary_operations": dict(sorted(self.summary_operations.items())),
            "kinds": {k: {"chains": len(v), "newest": sum(c.newest for c in v),
                          "joined": sum(c.joined for c in v)} for k, v in by_kind.items()},
        }


def bench_updates(
    profiles: int = 8, offset_days: float = 90.0, config: ConsolidationConfig | None = None,
    start: datetime = datetime(2025, 1, 6, 9, 0),
) -> UpdatesResult:
    """Write the chains, consolidate each profile, ask every chain's question."""
    from reverie.engines.wording import summarizer_for
    from reverie.flows.decay import decay
    from reverie.flows.full_consolidation import full_consolidation
    from reverie.models.db import dispose

    if profiles < 1:
        raise InputError("bench updates needs at least one profile")
    config = config or ConsolidationConfig()
    records, chains, distractors, kept, added = build(profiles, start)
    different = different_questions()
    blind = config.model_copy(update={"dedup": config.dedup.model_copy(
        update={"supersede_similarity": 1.0, "supersede_frame_similarity": 1.0})})
    result = UpdatesResult(profiles, offset_days, summarizer_for(config.summarizer).mode)
    with tempfile.TemporaryDirectory(prefix="reverie-updates-") as folder:
        url = f"sqlite:///{Path(folder) / 'updates.db'}"
        store = Store(url)
        store.create()  # a scratch store of the bench's own
        try:
            with using_database(url):
                embedder = embedder_for(store.settings)
                for profile, rows in records.items():
                    mine = [c for c in chains if c.profile == profile]
                    early = [{k: v for k, v in r.items() if k != EARLY}
                             for r in rows if r.get(EARLY)]
                    if early:
                        # As a release that searched no updates consolidated them.
                        at = max(datetime.fromisoformat(r["created_at"]) for r in early) \
                            + timedelta(days=offset_days)
                        _ingest(store, embedder, profile, early)
                        decay(profile=profile, as_of=at, config=blind)
                        full_consolidation(profile=profile, as_of=at, config=blind)
                        _count_summary_chains(store, profile, [c for c in mine if c.summaries],
                                              result)
                    first = [r for r in rows if not r.get(LATER) and not r.get(EARLY)]
                    last = max(datetime.fromisoformat(r["created_at"])
                               for r in rows if not r.get(LATER))
                    as_of = last + timedelta(days=offset_days)
                    _ingest(store, embedder, profile, first)
                    decay(profile=profile, as_of=as_of, config=config)
                    full_consolidation(profile=profile, as_of=as_of, config=config)
                    result.reverse += sum(c.reverse for c in mine)
                    result.reverse_in_summary += _newest_in_summary(
                        store, profile, [c for c in mine if c.reverse])
                    later = as_of + timedelta(days=1)
                    # A later row keeps a date of its own (an import of history), or is
                    # written the day after.
                    _ingest(store, embedder, profile, [
                        {"created_at": later.isoformat()}
                        | {k: v for k, v in r.items() if k != LATER}
                        for r in rows if r.get(LATER)])
                    result.hot_before += len(rows)
                    as_of = later + timedelta(days=offset_days)
                    decay(profile=profile, as_of=as_of, config=config)
                    full_consolidation(profile=profile, as_of=as_of, config=config)
                    result.hot_after += len(candidates_for(store, profile, False).memories)
                    result.chains += [_judge(store, embedder, c) for c in mine]
                    for _, question, value in (d for d in distractors if d[0] == profile):
                        found = _hot_states(store, embedder, profile, question, value)
                        result.distractors += 1
                        result.distractors_found += found
                        if question in different:
                            result.different += 1
                            result.different_found += found
                        if not found:
                            result.distractors_missed.append(f"{profile}: {question}")
                    for _, question, value in (k for k in kept if k[0] == profile):
                        result.kept += 1
                        ranked = _ranked_hot(store, embedder, profile, question)[:KEPT_HITS]
                        result.kept_found += any(states(m.content, value) for m in ranked)
                    for _, question, value in (a for a in added if a[0] == profile):
                        result.added += 1
                        ranked = _ranked_hot(store, embedder, profile, question)[:KEPT_HITS]
                        result.added_found += any(states(m.content, value) for m in ranked)
        finally:
            dispose(url)
    return result


def _newest_in_summary(store: Store, profile: str, chains: list[Chain]) -> int:
    """How many of ``chains`` have every memory written so far that states the newest
    value cold under a summary."""
    with store.reading(profile) as tx:
        memories, _ = snapshot(tx, (Tier.HOT, Tier.COLD))
    by_id = {m.id: m for m in memories}
    count = 0
    for chain in chains:
        newest = [m for m in memories if m.external_id in chain.memory_ids
                  and states(m.content, chain.values[-1])]
        count += bool(newest) and all(
            m.superseded_by in by_id and by_id[m.superseded_by].origin in SUMMARY_ORIGINS
            for m in newest)
    return count


def _count_summary_chains(store: Store, profile: str, chains: list[Chain],
                          result: UpdatesResult) -> None:
    """Count ``chains`` and those whose every value is in a summary of its own, no
    summary holding two values; and which operations wrote those summaries."""
    with store.reading(profile) as tx:
        memories, _ = snapshot(tx, (Tier.HOT, Tier.COLD))
    by_id = {m.id: m for m in memories}
    for chain in chains:
        result.summary_chains += 1
        owners: dict[str, set[str]] = {}
        for m in memories:
            if m.external_id not in chain.memory_ids:
                continue
            value = next(v for v in chain.values if states(m.content, v))
            owner = by_id.get(m.superseded_by or "")
            owners.setdefault(value, set()).add(
                owner.id if owner is not None and owner.origin in SUMMARY_ORIGINS else "")
        held = [next(iter(o)) for o in owners.values() if len(o) == 1 and "" not in o]
        if len(held) == len(chain.values) and len(set(held)) == len(held):
            result.summary_chains_in_summaries += 1
            for sid in held:
                op = str(by_id[sid].origin)
                result.summary_operations[op] = result.summary_operations.get(op, 0) + 1


def _ingest(store: Store, embedder: Any, profile: str, rows: list[dict[str, Any]]) -> None:
    report = ingest(store, rows, embedder, profile=profile)
    if report.errors:
        raise InputError(f"{profile}: {report.errors[0]}")


def _ranked_hot(store: Store, embedder: Any, profile: str, question: str) -> list[MemoryView]:
    hot = candidates_for(store, profile, deep=False)
    [best] = rank(hot, embedder.encode([question]), len(hot.memories))
    return [hot.memories[row] for row, _ in best]


def _best_hot(store: Store, embedder: Any, profile: str, question: str) -> MemoryView | None:
    ranked = _ranked_hot(store, embedder, profile, question)
    return ranked[0] if ranked else None


def _hot_states(store: Store, embedder: Any, profile: str, question: str, value: str) -> bool:
    best = _best_hot(store, embedder, profile, question)
    return best is not None and states(best.content, value)


def _judge(store: Store, embedder: Any, chain: Chain) -> ChainResult:
    newest, older = chain.values[-1], chain.values[:-1]
    ranked = _ranked_hot(store, embedder, chain.profile, chain.question)
    # The answer: the best-ranked hot memory that states a value of the fact (a
    # distractor ranked above it is recall's matter, not staleness).
    best = next((m for m in ranked if any(states(m.content, v) for v in chain.values)), None)
    top = ranked[0].content if ranked else ""
    text = best.content if best is not None else ""
    answered = states(text, newest) and not any(
        states(text, v) and not said_as_replaced(text, v) for v in older if v != newest)
    first = states(top, newest) and not any(
        states(top, v) and not said_as_replaced(top, v) for v in older if v != newest)
    joined = stale = False
    with store.reading(chain.profile) as tx:
        memories, _ = snapshot(tx, (Tier.HOT, Tier.COLD))
    by_id = {m.id: m for m in memories}
    mine = {m.id: m for m in memories if m.external_id in chain.memory_ids} or {
        m.id: m for m in memories if any(states(m.content, v) for v in chain.values)
        and m.origin not in SUMMARY_ORIGINS
    }
    summaries: dict[str, set[str]] = {}
    for m in mine.values():
        owner = m.superseded_by
        # Follow summaries absorbed by later summaries to the one standing now.
        while owner is not None and owner in by_id and by_id[owner].origin in SUMMARY_ORIGINS \
                and by_id[owner].superseded_by is not None:
            owner = by_id[owner].superseded_by
        if owner is not None and owner in by_id and by_id[owner].origin in SUMMARY_ORIGINS:
            value = next((v for v in chain.values if states(m.content, v)), None)
            summaries.setdefault(owner, set()).add(value or "")
    for sid, said in summaries.items():
        if len(said) > 1:
            joined = True
            content = by_id[sid].content
            if not states(content, newest) and any(states(content, v) for v in older):
                stale = True
    # A hot summary standing for a chain's member counts as the chain's own.
    stale_hot = any(
        m.tier == Tier.HOT and (m.external_id in chain.memory_ids or m.id in summaries)
        and not states(m.content, newest) and any(states(m.content, v) for v in older)
        for m in memories)
    return ChainResult(chain.profile, chain.kind, len(chain.values), text, answered, joined,
                       stale, first, stale_hot)


def render_updates(result: UpdatesResult) -> str:
    data = result.as_json()
    lines = [
        f"Update chains: hot recall's best memory states the newest value (summarizer "
        f"{result.summarizer}, {result.offset_days:g} days after the last memory; "
        f"{result.profiles} profiles)",
        f"{'kind':<12} {'chains':>6} {'newest':>6} {'joined':>6}",
    ]
    for kind, v in data["kinds"].items():
        lines.append(f"{kind:<12} {v['chains']:>6} {v['newest']:>6} {v['joined']:>6}")
    lines.append(f"{'total':<12} {data['chains']:>6} {data['newest']:>6} {data['joined']:>6}")
    lines.append(
        f"newest value answered: {data['newest']}/{data['chains']} "
        f"({100 * data['newest_share']:.1f}%; by the very first hit: {data['top_newest']}); "
        f"chains joined into one summary: "
        f"{data['joined']}, of which stating an older value without the newest: "
        f"{data['stale_summaries']}; chains with a hot memory stating an older value "
        f"without the newest: {data['stale_hot']}; distractors still answered from the hot tier: "
        f"{data['distractors_found']}/{data['distractors']} (different things of one "
        f"wording: {data['different_things_found']}/{data['different_things']}); other "
        f"facts of updated "
        f"memories in hot recall's first {KEPT_HITS} hits: "
        f"{data['other_facts_found']}/{data['other_facts']}; values added beside another "
        f"there: {data['added_values_found']}/{data['added_values']}; reverse chains (the newest "
        f"value in a summary when the older came): {data['reverse_in_summary']}/"
        f"{data['reverse_chains']}; summary chains (every value in a summary of its own "
        f"when updates were first searched): {data['summary_chains_in_summaries']}/"
        f"{data['summary_chains']} (summaries by operation: {data['summary_operations']}); "
        f"hot memories "
        f"{data['hot_before']} -> {data['hot_after']}"
    )
    return "\n".join(lines)
