"""An update supersedes; it is never averaged (issue #37, item 3).

Memories that state different values of the same fact ("the user's rent is 900 euros"
in January, "... 1000 euros" in June) are not near-duplicates: merging them keeps one
member's value, not necessarily the newest. Before near-duplicates are grouped, the
dedup step finds such updates and plans a *supersession*: the newest memory (by its
date) stays hot as the answer, unchanged, and the older ones move to the cold tier with
``superseded_by`` pointing at it. Nothing is written afresh, nothing is deleted; undo
puts the older ones back.

The detector (``conflict``) is a small, pure heuristic over two texts of the same
entity, on top of their cosine similarity:

- values: numbers (digits, thousands separators joined, and number words: "two" is 2),
  and names (``engines.llm.facts``: capitalised words, month and day names among them,
  so dates are covered by their numbers and month names);
- the two state different values when each has a number the other lacks, or each has
  a name the other does not say at all (in any case);
- and the rest of the statement is alike: of their content words (values and names
  left out, crudely stemmed, a few verbs of changing facts folded: ``SYNONYMS``), half
  of each text's are shared (a number hardly moves a vector: "a deposit of 1800 euros
  for the flat" is not "the rent of the flat"), or, for a name, one text only adds
  words to the other ("lives in Oslo these days, in a small flat"), unless the
  numbers count the same thing and nothing else is said ("2 cats", "3 cats"); and
  both name the same relations (``RELATIONS``: "the user's sister" is not "the user").

So "2 cats" and "two cats" agree, a memory that adds a number the other lacks is not
a conflict (it adds a fact), and "the user's sister is Anna" / "the user's brother is
Tom" share no content word and are not one fact. Memories of different entities or
kinds never conflict (two speakers may say the same thing with their own numbers; a
decision and a pattern about one service are not one fact restated).

A name moves a sentence's vector a lot ("works at Google" and "works at Stripe" are
near 0.4 with the default model), hence the low ``supersede_similarity``: the words
decide, the vectors only narrow the pairs compared.

``plan_supersessions`` takes memories newest first: each unclaimed one claims the
older unclaimed candidates within ``supersede_similarity`` of it that conflict with it,
and, from each of those, the older ones that conflict with that one (a chain 900 ->
950 -> 1000 whose ends are further apart than its steps), all superseded by the newest.
A memory that agrees with the newest (the same value said again) is not superseded: it
is a near-duplicate, left to the merge.

Only facts supersede: an episodic memory records an event ("ran 5 km on Monday"), and
a later event with another number ("ran 10 km on Friday") does not make it stale.
Merging still never joins two memories that disagree (a merge keeps one member's words
in the hot tier); compression joins events whatever their numbers (it dates each), and
never two facts that disagree.
"""

from __future__ import annotations

import re
from collections.abc import Sequence, Set
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum
from functools import lru_cache
from itertools import pairwise
from typing import NamedTuple

import numpy as np

from reverie.engines.llm import _COMMON, _OPENING_WORDS, _THOUSANDS, facts, kept_names
from reverie.engines.similarity import (
    DEFAULT_SEARCH,
    Neighbours,
    radius_neighbours,
    search_cells,
)
from reverie.models import ids
from reverie.models.config import DedupConfig, SearchConfig
from reverie.models.records import MemoryView, SummaryPlan
from reverie.models.tables import Operation, Origin

OPERATION = Operation.SUPERSEDE
# Kinds that record events, not states (the design: episodic).
EVENT_KINDS = frozenset({"episodic"})
RULE = "same fact, different value: the newest stands"

_NUMBER_WORDS = {
    w: str(n) for n, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen "
        "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split())
} | {"thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70",
     "eighty": "80", "ninety": "90", "hundred": "100", "dozen": "12", "once": "1",
     "twice": "2", "single": "1", "couple": "2", "both": "2"}
# Words (a number is "0"), and the punctuation that parts two words as a word of its own:
# "deploy plan (topic" names no kind of topic (``one_word_swapped``).
_WORDS_AND_BREAKS = re.compile(r"[a-z]+|0|[.,;:!?()\[\]\"/]")
_DIGIT_RUN = re.compile(r"[\d][\d,._]*")
_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
# The day a statement says something happened on: a weekday or a date after "on".
_ON_DAY = re.compile(
    rf"\bon (?:(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)\b"
    rf"|\d{{1,2}}(?:st|nd|rd|th)? (?:{_MONTHS})\b|(?:{_MONTHS}) \d{{1,2}}(?:st|nd|rd|th)?\b)")
# Units of a time of day: "at 10 am" on another day is the same appointment moved.
_CLOCK_UNITS = frozenset({"am", "pm", "o'clock", "oclock", "h"})
# At least this share of the shorter statement's other content words must be in the
# longer one.
CONTEXT_SHARE = 0.5
# Words that say whose fact it is: "the user's sister works at X" is not a fact about
# where the user works. Two statements of one fact name the same ones.
RELATIONS = frozenset(
    "sister brother mother father mom dad mum parent parents son daughter child children "
    "kid kids wife husband partner girlfriend boyfriend fiance fiancee friend friends "
    "colleague colleagues coworker neighbour neighbor cousin aunt uncle grandmother "
    "grandfather grandma grandpa niece nephew roommate landlord boss manager team "
    "baby babies toddler grandson granddaughter grandchild grandchildren stepson "
    "stepdaughter stepmother stepfather spouse flatmate teammate "
    "company dog cat pet".split()
)


@dataclass(frozen=True, slots=True)
class Values:
    """What a text says that can change: its numbers and names, and the rest."""

    numbers: frozenset[str]
    names: frozenset[str]
    words: frozenset[str]  # every word, lower case
    stems: frozenset[str]  # content words that are not values, crudely stemmed
    relations: frozenset[str]  # whose fact: RELATIONS named, stemmed
    units: frozenset[str] = frozenset()  # what the numbers count or measure, stemmed
    lower: frozenset[str] = frozenset()  # words written in lower case
    # ``stems`` in the text's order, as often as said, each with the words (or "0", a
    # number) just before and after it (``one_word_swapped``).
    sequence: tuple[tuple[str, str, str], ...] = ()
    days: frozenset[str] = frozenset()  # the days it happened on ("on monday", "on 3 may")
    # Who the statement opens with ("user" of "The user weighs ..."), and the thing of
    # theirs it opens with, stemmed ("suitc" of "The user's suitcase weighs ..."; ""
    # when it opens with its owner alone, or with who changed the value: ``opening``).
    owner: str = ""
    owned: str = ""
    # Names it says are no longer the value: "sold the Skoda", "quit Google", "switched
    # from Jira to Linear" (``left_behind``).
    dropped: frozenset[str] = frozenset()
    # Whether a name is said as what something is called ("is called Sam"): a name of
    # its own, not where one works or lives.
    naming: bool = False
    # What someone likes best, when the statement says it ("the user's favourite food
    # is ramen"): whose (the word before "'s", "" for "my", "their", ...), of what kind
    # of thing (stemmed), and the value's content words, stemmed (``preferred``).
    liking: tuple[str, str] = ("", "")
    preferred: frozenset[str] = frozenset()
    # The colours it says things are: (the thing, stemmed; the colour), ("car", "red") of
    # "the user's car is red" (``coloured``).
    hues: frozenset[tuple[str, str]] = frozenset()
    # Whether it denies what it says ("never", "not", "doesn't", "no longer").
    negated: bool = False
    # Whether it says its value is one more ("also", "as well", "too"): an addition,
    # not a replacement (``ADDING``).
    adds: bool = False
    # What it says is no longer so, of ``stems``: the words after its negation, to the
    # end of that part of the sentence ("no more oat milk cappuccino": oat, milk,
    # cappuccino; ``_denied``).
    denied: frozenset[str] = frozenset()
    # Whether only a verb of ending says it ("quit smoking", no "not" or "no longer"):
    # it denies what it names, not the rest of the sentence ("quit smoking and runs every
    # morning" still runs every morning).
    ended_only: bool = False


_SUFFIXES = ("ing", "ed", "es", "s")


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A crude stem: an inflection dropped, then five letters ("living", "lives" and
    "lived" are "liv"; "working", "works" are "work")."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    return word[:5].rstrip("e")


# Words that add nothing to which fact a statement is about: reporting verbs, time
# words, "new" ("User said the rent is 950 euros per month now") and the verbs that say a
# value changed ("the landlord raised the rent to 950 euros" is what the rent is now).
CHANGE_VERBS = frozenset(
    "raise raised raises increase increased increases decrease decreased decreases lowered "
    "lowers reduced reduces rose updated adjusted bumped".split())
# Verbs by which someone leaves a role, said of them (``retired``): like a change verb,
# they say the value changed, not which fact it is.
RETIRING = frozenset("retired resigned".split())
NOISE = CHANGE_VERBS | RETIRING | frozenset(
    "got get gets "
    "said says mentioned mention told tell tells reported noted now currently recently lately "
    "these days since last next this spring summer autumn fall winter started start starting "
    "keep keeps kept own owns owned "
    "new newly again still anymore changed went per every each month monthly week "
    "weekly year yearly day daily".split()
)
COMMON_WORDS = _COMMON | _OPENING_WORDS
# Words after a number that say when, not what it counts.
_NOT_UNITS = frozenset("last next this now ago again still since these".split())
# Words of a street after a house number: one unit, whatever the language or word ("4
# avenue Roger Salengro" is where "12 rue Garibaldi" was), so addresses compare as one
# value, not as numbers of different things.
STREET_WORDS = frozenset(
    "street st avenue ave road rd rue boulevard blvd bd lane ln drive dr allee allée via "
    "strasse straße str calle carrer chemin quai impasse terrace gasse weg straat".split())
STREET = "street"
# Adjectives that open statements with a capital and are no names ("Old partitions").
NOT_NAMES = frozenset("old new current previous former latest recent".split())
# A few verbs of the facts that change most, said in other words ("moved to" a city is
# where one "lives"; a "job at" a company is where one "works").
SYNONYMS = {
    "moved": "live", "move": "live", "relocated": "live", "resides": "live",
    "reside": "live", "based": "live", "home": "live", "household": "live", "living": "live",
    "lives": "live",
    "lived": "live", "live": "live",
    "job": "work", "employed": "work", "employer": "work", "employs": "work",
    "works": "work", "working": "work", "worked": "work", "work": "work", "joined": "work",
    "boss": "manager", "reports": "manager",
    # One home in two words: "the user's flat is 62 square metres" and "the user's
    # apartment is 70 square metres" are not two flats, as two lamps are two lamps.
    "apartment": "flat", "apartments": "flat",
}
# Words that pick one of a kind by liking ("favourite film", "dream job"): the word after
# names which (``one_word_swapped``).
PREFERENCES = frozenset("favourite favorite preferred best worst dream ideal".split())
_STEMMED_RELATIONS: frozenset[str] = frozenset()  # filled below, once stem is defined
# Endings of words made from a relation that name no person: "the Croix-Rousse
# neighbourhood" is no neighbour's fact, a "friendship" no friend's.
_NOT_A_PERSON = ("hood", "hoods", "ship", "ships", "ment", "ments")
# Words that are never a statement's content word (``Values.stems``).
_NOT_STEMMED = frozenset(COMMON_WORDS | _NUMBER_WORDS.keys() | NOISE)


@lru_cache(maxsize=65536)
def content_stem(word: str) -> str:
    """A content word's stem, or the verb it stands for ("moved" is "live")."""
    return SYNONYMS.get(word) or stem(word)


@lru_cache(maxsize=65536)
def values(text: str) -> Values:
    # Set operations and C-level maps where they can do: dedup works out every update
    # candidate's values (63k texts at 100k memories), and word-by-word tests in
    # generators were half the time.
    found = facts(text)
    words = found.words
    numbers = decimals(text) if _POINT.search(text) else set(found.numbers)
    parted = _WORDS_AND_BREAKS.findall(_DIGIT_RUN.sub(" 0 ", text.lower()))
    tokens = [t for t in parted if t.isalpha() or t == "0"]
    counted = _NUMBER_WORDS.keys() & tokens
    numbers.update(_NUMBER_WORDS[w] for w in counted)
    names = kept_names([found]) - NOT_NAMES
    # A code in capitals after a number is its unit, no name ("60 EUR", "16 GB"); an
    # acronym's plural is the acronym ("PDFs" of "PDF").
    coded = {c.lower() for c in _CODE_AFTER_NUMBER.findall(text)} if numbers and names \
        else set()
    plurals = {p.lower() for p in _ACRONYM_PLURAL.findall(text)} if any(
        n[-1:] == "s" for n in names) else set()
    if coded or plurals:
        names = names - coded - {f"{p}s" for p in plurals} | (plurals & {
            n[:-1] for n in names})
        words = words | plurals
    # A unit is the word after a number ("900 euros", "two cats"): it goes with the value.
    units = frozenset(map(_unit, [
        after for word, after in pairwise(tokens)
        if (word == "0" or word in counted) and after not in COMMON_WORDS
        and after not in _NOT_UNITS  # "turned 35 last week"
        and (after in found.lower  # "3 March": a date, not three of something
             or after in coded)
    ])) if counted or "0" in tokens else frozenset()
    liking, favourite = preferred(parted)
    # A favourite colour is a favourite ("Maya's favourite colour is blue"), not a thing's.
    hues = frozenset() if favourite else coloured(parted)
    stems = frozenset(map(content_stem, [
        w for w in words - _NOT_STEMMED - found.names if len(w) >= 3 and w.isalpha()
    ])) - units - {content_stem(colour) for _, colour in hues}
    if age_said(tokens):  # "is 34 years old", "turned 35", "aged 36": one fact, the age
        stems = stems - _AGE_STEMS | {_AGE}
    # Whose fact it is, but not who changed it: "the user's landlord raised the rent"
    # states the user's rent.
    relations = _STEMMED_RELATIONS.intersection(
        stem(w) for w in words if not w.endswith(_NOT_A_PERSON)) - {
        stem(word) for word, after in pairwise(tokens) if after in CHANGE_VERBS}
    if relations and "&" in text:  # "Kessler & Partner" is a firm, not the user's partner
        relations -= {stem(w.lower()) for w in _AFTER_AMPERSAND.findall(text)}
    ends = ["", *parted, ""]
    sequence = tuple(
        (s, ends[i], ends[i + 2]) for i, t in enumerate(parted)
        if len(t) >= 3 and t not in _NOT_STEMMED and t not in names
        and (s := content_stem(t)) in stems
    )
    days = frozenset(d.lower() for d in _ON_DAY.findall(text))
    dropped = left_behind(parted, names) if names else frozenset()
    if relations and names:  # only a statement of whose fact it is (``retired``)
        dropped |= retired(parted, names)
    denies = not NEGATIONS.isdisjoint(words) or (
        ("n't" in text or "n’t" in text) and any(w.endswith(("n't", "n’t")) for w in words)
    ) or ("no" in words and any(w == "no" and after in ("longer", "more")
                                for w, after in pairwise(tokens)))
    ended = not _STOPPING.isdisjoint(words) and any(map(stopped, tokens, tokens[1:]))
    negated = denies or ended
    return Values(frozenset(numbers), frozenset(names), words, stems, relations, units,
                  found.lower, sequence, days, *opening(parted), dropped,
                  bool(names) and names_something(tokens, names), liking, favourite, hues,
                  negated,
                  bool(names) and not _ADDING_CUES.isdisjoint(words)
                  and adds_value(parted, names),
                  _denied(parted, stems) if negated else frozenset(), ended and not denies)


def _unit(word: str) -> str:
    return STREET if word in STREET_WORDS else stem(word)


_POINT = re.compile(r"\d\.\d")
_AFTER_AMPERSAND = re.compile(r"&\s*([A-Z][a-z]+)")
# Runs of digits joined by points: a decimal ("0.10"), a date or version, or digits.
_DOTTED = re.compile(r"\d+(?:\.\d+)*")
_CODE_AFTER_NUMBER = re.compile(r"\d\s?([A-Z]{2,4})\b")
_ACRONYM_PLURAL = re.compile(r"\b([A-Z]{2,})s\b")


def decimals(text: str) -> set[str]:
    """The numbers of a text with a decimal point: each decimal one number, its zeros
    after the point dropped ("0.10" and "0.1" are one price; ``facts`` reads two
    numbers, 0 and 10), the rest as ``facts`` reads them."""
    if "," in text or "_" in text:
        text = _THOUSANDS.sub("", text)
    found = set()
    for run in _DOTTED.findall(text):
        parts = run.split(".")
        if len(parts) == 2:
            whole, fraction = parts[0].lstrip("0") or "0", parts[1].rstrip("0")
            found.add(f"{whole}.{fraction}" if fraction else whole)
        else:  # digits alone, or a date or version ("2025.03.10"): each run a number
            found.update(p.lstrip("0") or "0" for p in parts)
    return found


# Words that deny a statement (with any word ending in "n't", and "no longer"). Not a
# bare "no": "concise answers with no long preamble" is "without long preambles".
NEGATIONS = frozenset("not never nor cannot neither".split())


# Words that say a value is one more beside the others: "the user also translates from
# French" adds a language to German, it replaces none. Said in the part of a sentence
# that names the value: "lives in Munich and also plays in a band" still moves house.
# Words of one more, not a replacement: "adopted a second cat named Pixel" beside "has a
# cat named Miso" (an agent trial's second cat superseded the first).
ADDING = frozenset("also additionally besides another".split())
# After "a", one more of a kind ("adopted a second cat"); "the user's second car" is which.
ORDINALS = frozenset("second third fourth fifth".split())
_ADDING_CUES = ADDING | ORDINALS | {"too", "well"}  # most texts have none: asked first
# What parts a sentence for ``adds_value``: not a comma ("works at Meta, too").
_PARTS = frozenset(".;:!?()[]\"/") | {"and", "but", "while", "whereas"}


def adds_value(parted: Sequence[str], names: Set[str]) -> bool:
    """``Values.adds`` of a text's words and breaks: a part of it that says one of
    ``names`` and a word of adding. "Too" and "as well" only end one ("from French too"),
    since before a word "too" says how much ("too high")."""
    part: list[str] = []
    for word in [*parted, "."]:
        if word not in _PARTS:
            part.append(word)
            continue
        ending = part[:-1] if part[-1:] == [","] else part  # "too, and ..."
        if not names.isdisjoint(part) and (
                not ADDING.isdisjoint(part) or ending[-1:] == ["too"]
                or ending[-2:] == ["as", "well"]
                or any(a == "a" and w in ORDINALS for a, w in pairwise(part))):
            return True
        part = []
    return False


# Verbs of facts one has many of at once: one speaks, translates from or has visited
# another language or place besides the first, so a second name added by them is no
# update ("speaks Portuguese", "speaks Japanese"). Only said as leaving one behind
# ("switched from German to French") does it replace.
MANY_VALUED = frozenset(
    "speak speaks spoke speaking translate translates translated translating "
    "visit visits visited visiting".split())
# A year, as a number of a text: said of a visit, it dates one visit among many.
_YEAR = re.compile(r"(?:19|20|21)\d\d")
# Names that say when, not who or where: a weekday or a month. "The vet is in Altona" and
# "the vet is open on Saturdays" say two things of the vet; "Monday" and "Tuesday" are
# two values of one day.
TIME_NAMES = frozenset(
    day.lower() + plural for day in _MONTHS.split("|") + [
        "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
    for plural in ("", "s"))


# Verbs that give what something is called.
NAMING = frozenset("called named nicknamed".split())


def names_something(tokens: Sequence[str], names: Set[str]) -> bool:
    """``Values.naming``: one of ``names`` right after a verb of naming."""
    return not NAMING.isdisjoint(tokens) and any(
        word in NAMING and after in names for word, after in pairwise(tokens))


# Verbs after which a name is what the statement leaves behind.
LEAVING = frozenset("sold quit left ditched dropped replaced cancelled canceled".split())
# Verbs that say a value changed "from" one "to" another.
SWITCHES = frozenset(
    "moved switched changed migrated transferred upgraded relocated went".split())
_LEAVING_CUES = LEAVING | {"from"}
_DETERMINERS = frozenset("the a an my his her their our its old previous former".split())


def left_behind(parted: Sequence[str], names: Set[str]) -> frozenset[str]:
    """``Values.dropped`` of a text's words and breaks: a name right after a verb of
    leaving (an article between), or after "from" in a clause of change when "to" and
    another name follow ("moved ... from Jira to Linear"; not "an offer from Google",
    nor "flew from Berlin to Rome")."""
    if _LEAVING_CUES.isdisjoint(parted):  # most texts (dedup: 63k at 100k memories)
        return frozenset()

    def name_at(i: int) -> str | None:
        while i < len(parted) and parted[i] in _DETERMINERS:
            i += 1
        return parted[i] if i < len(parted) and parted[i] in names else None

    dropped = set()
    for i, word in enumerate(parted):
        if word in LEAVING and (name := name_at(i + 1)):
            dropped.add(name)
        elif word == "from" and (name := name_at(i + 1)) and _switched(parted[:i]):
            for j in range(i + 2, len(parted)):
                if not parted[j].isalpha():
                    break  # the clause ends
                if parted[j] == "to" and name_at(j + 1) not in (None, name):
                    dropped.add(name)
                    break
    return frozenset(dropped)


# The words that open a clause saying someone left a role, after the new value ("a new
# manager, Dr Lindqvist, after Dr Okafor retired").
_SINCE = frozenset("after since when because once as".split())


def retired(parted: Sequence[str], names: Set[str]) -> frozenset[str]:
    """The names ``parted`` says left a role, in a clause of their own opened by "after",
    "since", "when", ...: "Priya got a new manager, Dr Lindqvist, after Dr Okafor
    retired" no longer has Dr Okafor as manager. Not a name that opens its statement
    ("Dr Okafor retired" says nothing of who replaced him), and ``values`` asks only
    for statements of whose fact it is (a manager, a landlord): "Priya moved to Oslo
    after Anna retired" says nothing of where Anna lives."""
    if RETIRING.isdisjoint(parted):  # most texts, as in ``left_behind``
        return frozenset()
    out = set()
    for i, word in enumerate(parted):
        if word not in RETIRING:
            continue
        j = i - 1  # back over the name ("dr okafor") to the word before it
        while j >= 0 and parted[j] in names:
            j -= 1
        if 0 <= j < i - 1 and parted[j] in _SINCE:
            out.add(parted[i - 1])
    return frozenset(out)


# Verbs that say what a thing is, as "is" does; a colon does too ("favourite food: ramen").
_BEING = frozenset("is are was were remains became becomes :".split())
# Words before a favourite that leave its owner unsaid ("their favourite food").
_UNSAID_OWNER = frozenset("my his her their our your the".split())


def preferred(parted: Sequence[str]) -> tuple[tuple[str, str], frozenset[str]]:
    """``Values.liking`` and ``Values.preferred`` of a text's words and breaks: what
    someone likes best, said as what it is. "The user's favourite food is ramen" and
    "ramen is the user's favourite food these days" are the user's food: ramen (a value
    in lower case, which ``values`` does not see as a name). Only one thing can be
    someone's favourite of a kind, so another value of it is an update; "the user likes
    ramen" may be said of many things and states none."""
    if PREFERENCES.isdisjoint(parted):  # most texts, as in ``left_behind``
        return ("", ""), frozenset()
    for i, word in enumerate(parted):
        if word not in PREFERENCES:
            continue
        j = i + 1  # the kind of thing: the words after, up to a verb of being
        while j < len(parted) and parted[j].isalpha() and parted[j] not in _BEING:
            j += 1
        thing = [content_stem(w) for w in parted[i + 1:j] if w not in _NOT_STEMMED]
        if not thing:
            continue
        if i >= 2 and parted[i - 1] == "s":  # whose: "the user's", "Maya's"
            owner, start = parted[i - 2], i - 3
        elif i >= 1 and parted[i - 1] in _UNSAID_OWNER:
            owner, start = "", i - 2
        else:
            continue
        if start >= 0 and parted[start] == "the":
            start -= 1
        if j < len(parted) and parted[j] in _BEING:  # "... favourite food is ramen"
            # The value's words, up to the first word of no content after them: "ramen
            # at the moment" is ramen ("moment" in both of two values made them one).
            end, content = j + 1, False
            while end < len(parted) and parted[end].isalpha():
                if parted[end] not in _NOT_STEMMED:
                    content = True
                elif content:
                    break
                end += 1
            said = parted[j + 1:end]
        elif start >= 0 and parted[start] in _BEING:  # "ramen is the user's favourite food"
            first = start
            while first > 0 and parted[first - 1].isalpha():
                first -= 1
            said = parted[first:start]
        else:
            continue
        value = frozenset(content_stem(w) for w in said if w not in _NOT_STEMMED)
        if value:
            return (owner, ",".join(thing)), value
    return ("", ""), frozenset()


_SHADES = frozenset("dark light pale bright deep".split())
# Colours, a closed set of values in lower case. Not gold or silver: a "gold medal" and a
# "silver medal" are two medals as often as one medal updated.
COLOURS = frozenset(
    "red blue green black white yellow orange purple pink brown grey gray beige navy teal "
    "turquoise maroon violet".split())


def coloured(parted: Sequence[str]) -> frozenset[tuple[str, str]]:
    """``Values.hues`` of a text's words and breaks: each colour said as what a thing is,
    with that thing, the content word nearest before the verb ("the user's car is red",
    "the car is now blue": ("car", "red"), ("car", "blue")). A thing has one colour at a
    time, so the same thing in another colour is an update; another thing ("the
    kitchen", "the bedroom") is not. A colour before its thing says which one ("the
    blue car", "the red car": two cars) or what kind ("green tea"), and stays a word."""
    if COLOURS.isdisjoint(parted):  # most texts, as in ``left_behind``
        return frozenset()
    hues = set()
    for i, word in enumerate(parted):
        if word not in COLOURS:
            continue
        j = i - 1
        while j >= 0 and (parted[j] in NOISE or parted[j] in _SHADES):  # "is now dark red"
            j -= 1
        if j < 1 or parted[j] not in _BEING:
            continue
        thing = next((w for w in reversed(parted[:j]) if len(w) >= 3 and w.isalpha()
                      and w not in _NOT_STEMMED and w not in COLOURS), None)
        if thing is not None:
            hues.add((content_stem(thing), word))
    return frozenset(hues)


def _switched(before: Sequence[str]) -> bool:
    """Whether the clause that ends with ``before`` says a change: "moved sprint
    planning (from ...)", not "flew (from Berlin to Rome)"."""
    for word in reversed(before):
        if not word.isalpha():
            return False
        if word in SWITCHES:
            return True
    return False


_AGE = "ag"  # the stem of "age"
_AGE_STEMS = frozenset({"old", "turn", "aged", _AGE, "birth"})
# Words after which a number is an age ("turned 35", "aged 36").
_AGE_VERBS = frozenset({"turn", "turns", "turned", "turning", "aged"})
_AGE_CUES = _AGE_VERBS | {"age", "old", "birthday"}


def age_said(tokens: Sequence[str]) -> bool:
    """Whether words (a number is "0") state an age: "0 years old", "turned 0", "aged
    0", "age is 0", "0 th birthday"."""
    if _AGE_CUES.isdisjoint(tokens):  # most texts: dedup asks it of 63k at 100k memories
        return False

    def number(word: str) -> bool:
        return word == "0" or word in _NUMBER_WORDS

    for i, word in enumerate(tokens):
        one, two = (*tokens[i + 1:i + 3], "", "")[:2]
        if number(word) and (one in ("year", "years") and two == "old"
                             or one in ("th", "st", "nd", "rd") and two == "birthday") \
                or word in _AGE_VERBS and number(one) \
                or word == "age" and one in ("is", "of", "was") and number(two):
            return True
    return False


def opening(parted: Sequence[str]) -> tuple[str, str]:
    """``Values.owner`` and ``Values.owned`` of a text's words and breaks: "the user's
    monthly rent" is the user's rent; "the user's landlord raised ..." is the user's own
    fact, the landlord only changed it (as in ``values``' relations)."""
    start = 1 if parted[:1] in (["the"], ["a"]) else 0
    owner = parted[start] if len(parted) > start and parted[start].isalpha() else ""
    if not owner or parted[start + 1:start + 2] != ["s"]:  # "user's": "user", "s"
        return owner, ""
    rest = parted[start + 2:]
    for i, word in enumerate(rest):
        if not word.isalpha():
            break
        if len(word) >= 3 and word not in _NOT_STEMMED and word not in NOT_NAMES:
            # ("the user's current phone": "current" says which phone, not what)
            agent = rest[i + 1:i + 2] and rest[i + 1] in CHANGE_VERBS
            return owner, "" if agent else content_stem(word)
    return owner, ""


def owned_unsaid(va: Values, vb: Values) -> bool:
    """Whether ``va`` opens with a thing of the owner ``vb`` opens with, and ``vb`` does
    not say that thing: "the user's suitcase weighs 20 kg" is not what "the user weighs
    80 kg" says."""
    return bool(va.owned) and va.owner == vb.owner and va.owned not in vb.stems


def named_apart(va: Values, vb: Values) -> bool:
    """Whether both open with a thing of one owner, each named by a name the other does
    not say: two things, the names say which ("Lena's Zalando team has 12 people",
    "Lena's Spotify team has 8 people"; "the user's Skoda", "the user's Tesla"). Two
    words for one thing are no names ("the user's plan", "the user's membership")."""
    if not (va.owned and vb.owned) or va.owned == vb.owned or va.owner != vb.owner:
        return False
    named_a = {content_stem(n) for n in va.names}
    named_b = {content_stem(n) for n in vb.names}
    return va.owned in named_a - named_b and vb.owned in named_b - named_a


def conflict(a: str, b: str) -> str | None:
    """Which kind of value two texts about one fact disagree on ("number", "name",
    "preference", "colour", or "negation": one denies what the other states), or None
    when they do not (the same values, one adds a value, or not one fact)."""
    return conflicting(values(a), values(b))


def may_conflict(v: Values) -> bool:
    """Whether a text can disagree with any other: ``conflicting`` needs both to state
    a number, or both a name, or both what someone likes best, or both a colour."""
    return bool(v.numbers or v.names or v.preferred or v.hues)


def conflicting(va: Values, vb: Values) -> str | None:
    """``conflict`` of two texts' values (symmetric: ``shorter`` and ``longer`` of equal
    lengths are then compared for equality)."""
    return _values_conflict(va, vb) or _preference_conflict(va, vb) \
        or _negation_conflict(va, vb)


def _negation_conflict(va: Values, vb: Values) -> str | None:
    """One denies what the other states: "Lena never works on Sundays", "Lena works on
    Sundays". The same names, numbers and whose fact it is, and all the content words of
    one said by the other ("no longer works on Sundays"); not "does not eat meat" and
    "eats fish", which are both true."""
    if va.negated == vb.negated or va.names != vb.names or va.numbers != vb.numbers \
            or va.relations != vb.relations or not (va.stems and vb.stems):
        return None
    no, yes = (va, vb) if va.negated else (vb, va)
    if not no.ended_only and (va.stems <= vb.stems or vb.stems <= va.stems):
        return "negation"
    # Or the other says every word of what one denies ("drinks a cappuccino made with
    # oat milk every morning"; "switched to black coffee, no more oat milk cappuccino"),
    # as what is so: "prefers tea to coffee" says coffee as what is not chosen.
    return "negation" if no.denied and no.denied <= yes.stems \
        and yes.words.isdisjoint(_WEIGHING) else None


# Words that weigh one thing against another: a text of them may name what a denial
# denies as the thing not chosen ("prefers tea to coffee in the afternoon").
_WEIGHING = frozenset("prefer prefers preferred preferring rather than instead".split())


# What ends the part of a sentence a negation denies: "no more oat milk cappuccino, but
# tea on Sundays" denies the cappuccino only.
_DENIAL_ENDS = frozenset(".,;:!?()[]\"/") | {"and", "but", "while", "whereas"}


def denied(text: str) -> frozenset[str]:
    """The content stems (``Values.stems``) a text says are no longer so: those after
    its negation to the end of that part of the sentence ("switched to black coffee, no
    more oat milk cappuccino": oat, milk, cappuccino). Empty for a text that denies no
    change."""
    return values(text).denied


# Verbs that end a habit: "stopped drinking oat milk cappuccino", "quit smoking", "gave
# up coffee". With a gerund only (or "up"): "stopped by the bakery" ends nothing.
_STOP_VERBS = frozenset("stop stops stopped stopping quit quits quitting".split())
_GIVE_VERBS = frozenset("give gives gave given giving".split())
# "Instead of" ends what follows it as "no more" does: "drinks green tea every morning
# now instead of coffee" (an agent trial's coffee stayed hot and first beside it).
_STOPPING = _STOP_VERBS | _GIVE_VERBS | {"instead"}


# Words in "-ing" that are no gerund: "stopped during the storm" ended nothing.
_NOT_GERUNDS = frozenset(
    "during morning evening nothing something anything everything thing king spring "
    "string ceiling building meeting wedding".split())


def stopped(before: str, word: str) -> bool:
    """Whether ``word`` after ``before`` says a habit ended: a gerund after a verb of
    stopping, "up" after "give", or "of" after "instead"."""
    return (before in _STOP_VERBS and len(word) > 4 and word.endswith("ing")
            and word not in _NOT_GERUNDS) or (before in _GIVE_VERBS and word == "up") \
        or (before == "instead" and word == "of")


def _say(word: str, stems: frozenset[str], said: set[str], gerunds: set[str]) -> None:
    """``word`` into what a denial says: a gerund whose stem doubles its last consonant
    ("running": "runn") as its verb's ("runs": "run"), into ``gerunds``."""
    if word.endswith("ing"):
        stem_ = content_stem(word)
        if stem_ in stems and len(stem_) > 3 and stem_[-1] == stem_[-2] \
                and stem_[-1] not in "aeioulsfz":
            gerunds.add(stem_[:-1])
            return
    said.add(word)


def _denied(parted: Sequence[str], stems: frozenset[str]) -> frozenset[str]:
    """``Values.denied`` of a text's words and breaks and its ``stems``: only of a
    denial that says a change ("no longer", "no more", "anymore", "stopped drinking",
    "gave up"). A standing one may say in other words what the other says: "to cancel an
    order, it must not have left the warehouse yet" is "orders can be cancelled only
    before they have left the warehouse" (the sample store's support bot)."""
    if not any(w == "anymore" or (before in ("no", "any") and w in ("longer", "more"))
               or stopped(before, w) for before, w in pairwise(parted)):
        return frozenset()
    said: set[str] = set()
    ended: set[str] = set()  # stems of doubling gerunds, said as their verb's
    inside = False
    for before, word in pairwise(["", *parted]):
        if word in _DENIAL_ENDS:
            inside = False
        elif inside:
            _say(word, stems, said, ended)
        elif stopped(before, word):  # the gerund is what ended: "stopped drinking"
            inside = True
            if word not in ("up", "of"):
                _say(word, stems, said, ended)
        else:  # "not", "never", ...; "doesn't" ("doesn", "t"); "no more", "no longer"
            inside = word in NEGATIONS or (word == "t" and before.endswith("n")) or (
                before == "no" and word in ("more", "longer"))
    if not said and not ended:
        return frozenset()
    return stems & {content_stem(w) for w in said if len(w) >= 3} | ended


def _preference_conflict(va: Values, vb: Values) -> str | None:
    """Two values, nothing in common, of what one owner likes best of one kind of thing
    (``preferred``): "the user's favourite food is sushi", "... is ramen". The owner
    the same, and whose fact it is (a sister's favourite is hers)."""
    (owner_a, thing_a), (owner_b, thing_b) = va.liking, vb.liking
    if not (va.preferred and vb.preferred) or thing_a != thing_b \
            or va.relations != vb.relations or va.preferred & vb.preferred:
        return None
    # "their favourite food" is the favourite of whom the statement opens with.
    return "preference" if (owner_a or va.owner) == (owner_b or vb.owner) else None


def _values_conflict(va: Values, vb: Values) -> str | None:
    # One says the other's name is left behind ("Priya's car is a Skoda", "Priya sold
    # the Skoda and bought a Tesla"): the name ties them when both open with one owner
    # or share a word ("the standup is on Monday", "the team moved the standup from
    # Monday to Tuesday"); not "Anna sold the Skoda".
    if (va.dropped or vb.dropped) and va.relations == vb.relations \
            and ((va.names - va.dropped) & vb.dropped or (vb.names - vb.dropped) & va.dropped) \
            and (va.owner == vb.owner or va.stems & vb.stems):
        return "name"
    kind = None
    if va.numbers - vb.numbers and vb.numbers - va.numbers:
        kind = "number"
        # Numbers of different things ("2 goldfish", "3 cats") are not one value.
        if va.units and vb.units and not va.units & vb.units:
            return None
        # Two days, each with its own amount: two events ("Maya ran 5 km on Monday",
        # "Maya ran 8 km on Tuesday"), not a new value of one fact.
        if va.days and vb.days and va.days != vb.days and (va.units & vb.units) - _CLOCK_UNITS:
            return None
        # By a verb of things one has many of, other places or other years: two visits
        # ("visited Rome in 2023", "visited Paris in 2024", "visited Rome in 2024"), as
        # without the years. "Visited 5 countries", then 7, is still an update.
        if MANY_VALUED & va.words and MANY_VALUED & vb.words and (
                (va.names - vb.words and vb.names - va.words)
                or all(_YEAR.fullmatch(n) for n in va.numbers ^ vb.numbers)):
            return None
    elif ((va.names - _left_for(va, vb)) - vb.words
          and (vb.names - _left_for(vb, va)) - va.words
          and va.naming == vb.naming
          and _one_sort(va.names - vb.words, vb.names - va.words)
          and not (va.adds or vb.adds)
          and not (MANY_VALUED & va.words and MANY_VALUED & vb.words)):
        kind = "name"
    elif _recoloured(va.hues, vb.hues):
        kind = "colour"
    if kind is None or va.relations != vb.relations:
        return None
    # A name (the subject "Gina" opening both, "Rome" in one) is no content word; a
    # capitalised opener the other text writes in lower case ("Rent for ...") is one.
    named = {stem(n) for n in (va.names - vb.lower) | (vb.names - va.lower)}
    sa, sb = va.stems - named, vb.stems - named
    # Whose fact it is (equal on both sides by now) is no sign of one fact when both
    # say more: "the user's sister works at Deloitte" and "... lives in Turin" share
    # only "sister". Said alone ("the user's sister is Anna"), it is the fact.
    if sa - _STEMMED_RELATIONS and sb - _STEMMED_RELATIONS:
        sa, sb = sa - _STEMMED_RELATIONS, sb - _STEMMED_RELATIONS
    shorter = min(sa, sb, key=len)
    shared = len(sa & sb)
    if kind == "number" and va.units & vb.units and not shorter:
        return kind  # numbers of the same thing ("2 cats", "three cats"), nothing else said
    if not shared:
        return None
    # One says a thing of the owner the other opens with, the other says none: two
    # owners' facts. When each names its own thing unsaid by the other, they may be one
    # thing in two words ("the user's flat", "the user's apartment"): the words decide.
    if owned_unsaid(va, vb) != owned_unsaid(vb, va) or named_apart(va, vb):
        return None
    if one_word_swapped(va.sequence, vb.sequence):
        return None
    longer = max(sb, sa, key=len)
    # One only adds words to the other ("lives in Oslo these days, in a small flat"), or
    # half the words of each agree. A number must always agree on half of both: it
    # hardly moves a vector ("a deposit of 1800 euros for the flat" is not "the rent on
    # the flat"), and "Maya works mostly in Python" is not what "Maya lives in Lisbon
    # and works remotely" updates.
    adds = kind == "name" and shorter <= longer
    return kind if adds or shared >= CONTEXT_SHARE * len(longer) else None


def _left_for(va: Values, vb: Values) -> frozenset[str]:
    """The names ``va`` leaves behind for the value ``vb`` states: no values of ``va``
    then ("moved from Lyon to Grenoble" says what "lives in Grenoble" says). Not when
    ``va`` names nothing else ("sold the Nokia phone" beside "the phone is a Pixel"), nor
    beside a text that leaves names of its own behind (two histories)."""
    if not va.dropped or vb.dropped:
        return frozenset()
    kept = va.names - va.dropped - {va.owner}
    return va.dropped if kept and kept <= vb.words else frozenset()


def _one_sort(a: Set[str], b: Set[str]) -> bool:
    """Whether the names two texts do not share are of one sort: both say when (a
    weekday, a month) or neither only does."""
    return (a <= TIME_NAMES) == (b <= TIME_NAMES)


def _recoloured(a: frozenset[tuple[str, str]], b: frozenset[tuple[str, str]]) -> bool:
    """Whether a thing both texts colour has no colour in common in them ("a red car",
    "the car is blue")."""
    return any({c for t, c in a if t == thing}.isdisjoint({c for t, c in b if t == thing})
               for thing in {t for t, _ in a} & {t for t, _ in b})


def one_word_swapped(a: tuple[tuple[str, str, str], ...],
                     b: tuple[tuple[str, str, str], ...]) -> bool:
    """Whether two texts say the same content words in the same order but one, each
    its own between the same two words and naming which of a thing the next one is:
    "the kitchen lamp uses a 40 watt bulb" and "the bedroom lamp uses a 60 watt bulb"
    are two lamps, not one value updated. A paraphrase of an update words it otherwise
    around the word it does not share ("the internet costs 29 euros", "the internet
    connection is 33 euros"; "moved the appointment", "rescheduled the appointment"),
    or adds words, or orders them anew. After a word of preference the swapped word
    is which of them: "the user's favourite film is Amelie" and "... favourite band is
    Radiohead" are two favourites (after other words it may be the same thing said
    otherwise: "the deploy plan", "the deploy schedule")."""
    if len(a) != len(b) or len(a) < 2:
        return False
    swapped = [(x, y) for x, y in zip(a, b, strict=True) if x[0] != y[0]]
    if len(swapped) != 1:
        return False
    (_, before, after), (_, before_b, after_b) = swapped[0]
    return (before, after) == (before_b, after_b) and (
        len(after) >= 3 and after not in _NOT_STEMMED or before in PREFERENCES)


def same_fact_different_value(a: MemoryView, b: MemoryView) -> bool:
    """Whether two memories state different values of one fact (see ``conflict``)."""
    return (a.entity or "") == (b.entity or "") and a.kind == b.kind \
        and conflict(a.content, b.content) is not None


def newest_first(m: MemoryView) -> tuple[datetime, str]:
    return m.created_at, m.id


@dataclass(frozen=True, slots=True)
class SupersedePlan:
    """The newest memory of an update chain stays hot; ``member_ids`` move to cold,
    superseded by it. ``similarities``: each member's cosine to the newest;
    ``conflicts``: which value each member disagrees on."""

    consolidation_id: str
    newest_id: str
    member_ids: tuple[str, ...]
    similarities: dict[str, float]
    conflicts: dict[str, str]
    parameters: dict[str, object]
    priors: dict[str, tuple[str, str, str | None]] = field(default_factory=dict)
    newest: MemoryView | None = field(default=None, compare=False, repr=False)
    members: tuple[MemoryView, ...] = field(default=(), compare=False, repr=False)
    # What stays hot of the members besides the older value: an older memory's other
    # statements (``restatement``), or an older summary without its stale members
    # (``plan_stale_summaries``). Written with the supersession, undone with it.
    restated: tuple[SummaryPlan, ...] = ()


def plan_supersessions(
    profile: str, candidates: Sequence[MemoryView], vectors: np.ndarray, config: DedupConfig,
    search: SearchConfig = DEFAULT_SEARCH,
) -> list[SupersedePlan]:
    """The supersessions among ``candidates`` (row-aligned with ``vectors``): pure.

    Only pairs that may conflict are searched and compared: of one entity, kind and
    set of relations, each stating a number or a name, or a denial and what it denies
    (``fact_groups``). The others would be found by the search only to fail the word
    test, and at 100k memories finding and skipping them was most of dedup's time (#37)."""
    if len(candidates) < 2:
        return []
    with ThreadPoolExecutor(1, thread_name_prefix="cells") as pool:
        # FAISS works out the cells (k-means, a second of CPU at 100k) with the GIL let
        # go, while this thread works out the values, which hold it: on two cores the
        # one hides the other. The cells are the same wherever they are worked out.
        cells = pool.submit(search_cells, vectors, search) \
            if len(candidates) > search.exact_limit else None
        texts = [values(m.content) for m in candidates]
        groups = fact_groups(candidates, texts)
        found_cells = cells.result() if cells is not None else None
        neighbours = radius_neighbours(
            vectors, config.supersede_similarity, search=search, groups=groups,
            cells=found_cells)
        if config.supersede_frame_similarity < config.supersede_similarity:
            neighbours = with_frame_pairs(
                neighbours, radius_neighbours(
                    vectors, config.supersede_frame_similarity, search=search,
                    groups=frame_groups(candidates, texts), cells=found_cells))
    order = sorted(range(len(candidates)), key=lambda i: newest_first(candidates[i]),
                   reverse=True)
    # Position newest first: j is older than i when rank[j] > rank[i].
    rank = np.empty(len(candidates), dtype=np.int64)
    rank[order] = np.arange(len(candidates))
    claimed = np.zeros(len(candidates), dtype=bool)
    parameters = {"rule": RULE, "similarity": config.supersede_similarity,
                  "context_share": CONTEXT_SHARE,
                  "mode": "rules"}
    plans: list[SupersedePlan] = []
    # A pair is compared again from each newer memory whose search reaches it.
    known: dict[tuple[int, int], str | None] = {}

    def conflict_of(i: int, j: int) -> str | None:
        key = (i, j) if i < j else (j, i)
        if key not in known:
            known[key] = conflicting(texts[i], texts[j]) or clause_conflict(
                candidates[i].content, candidates[j].content)
        return known[key]

    for top in order:
        if claimed[top]:
            continue
        chain: list[int] = []
        kinds: dict[int, str] = {}
        frontier = [top]
        while frontier:
            at = frontier.pop()
            near = neighbours.indices[at]
            if not near.size:  # most rows at 100k: skip numpy's indexing
                continue
            # Older than the newest and not in an earlier chain, in the search's order.
            near = near[(rank[near] > rank[top]) & ~claimed[near]]
            for j in near.tolist():
                if j in kinds:
                    continue
                # The member must disagree with the one that reached it, and not say the
                # newest's value again (then it is a near-duplicate of the answer).
                kind = conflict_of(at, j)
                if kind is None or (at != top and conflict_of(top, j) is None):
                    continue
                kinds[j] = kind
                chain.append(j)
                frontier.append(j)
        if not chain:
            continue
        newest = candidates[top]
        claimed[top] = True
        claimed[chain] = True
        members = sorted((candidates[j] for j in chain), key=newest_first)
        sims = {candidates[j].id: round(float(vectors[top] @ vectors[j]), 6) for j in chain}
        member_ids = tuple(m.id for m in members)
        # A member that says more than the value the newest updates keeps the rest of
        # what it said hot, restated at its own date (#37: its other fact stays found).
        restated = tuple(r for m in members
                         if (r := restatement(profile, m, newest)) is not None)
        plans.append(SupersedePlan(
            consolidation_id=ids.consolidation_id(
                profile, OPERATION, f"{newest.id}|{','.join(sorted(member_ids))}"),
            newest_id=newest.id,
            member_ids=member_ids,
            similarities=dict(sorted(sims.items())),
            conflicts={candidates[j].id: kinds[j] for j in sorted(chain,
                       key=lambda r: candidates[r].id)},
            parameters=_with_restated(
                parameters if min(sims.values()) >= config.supersede_similarity else
                # A member only the second radius found: the audit says which.
                {**parameters, "frame_similarity": config.supersede_frame_similarity},
                restated),
            priors={m.id: (m.tier, m.lifecycle, m.superseded_by) for m in members},
            newest=newest,
            members=tuple(members),
            restated=restated,
        ))
    return plans


def _with_restated(
    parameters: dict[str, object], restated: Sequence[SummaryPlan]
) -> dict[str, object]:
    """The audit's parameters, naming what the supersession restated (undo removes it)."""
    if not restated:
        return dict(parameters)
    return {**parameters, "restated": sorted(r.summary_id for r in restated)}


def fact_groups(candidates: Sequence[MemoryView], texts: Sequence[Values]) -> np.ndarray:
    """Per candidate, a group number such that only two of one group may state two
    values of one fact: one entity, one kind, the same relations (``conflicting``);
    -1 for a text that disagrees with none: it states no number and no name, denies
    nothing, and says no word a denial of its group denies ("the user drinks black
    coffee every morning" beside "... green tea in the morning, no more coffee": neither
    names anything, and the coffee stayed hot and first)."""
    keys = [(m.entity or "", m.kind, v.relations) for m, v in zip(candidates, texts,
                                                                   strict=True)]
    denied: dict[tuple[str, str, frozenset[str]], set[str]] = {}
    for key, v in zip(keys, texts, strict=True):
        if v.negated:
            # Only what it denies: its other words would draw a whole entity in.
            denied.setdefault(key, set()).update(v.denied)
    numbered: dict[tuple[str, str, frozenset[str]], int] = {}
    return np.array([
        numbered.setdefault(key, len(numbered))
        if may_conflict(v) or v.negated or (denied and not denied.get(key, set()).isdisjoint(
            v.stems)) else -1
        for key, v in zip(keys, texts, strict=True)
    ], dtype=np.int64)


def frame(v: Values) -> str | None:
    """The fact a text states, when its words tell it exactly: the kind of its value
    (numbers of which unit: "900 euros", "three cats"; or a name) and every other
    content word it says (``Values.stems``: "works at Stripe" is work, "moved the
    dentist appointment to 17 April" is live, dentist, appointment, not where one lives).
    None without a value or without other words. Two texts of one frame say the same
    words around different values; ``conflicting`` still decides."""
    if not v.stems:
        return None
    stems = v.stems
    if v.numbers and v.units:
        kind = "number:" + ",".join(sorted(v.units))
    elif v.names:
        kind = "name"
    elif v.preferred:  # the value is a content word: the frame is the words around it
        kind, stems = "preference:" + v.liking[1], v.stems - v.preferred
    elif v.hues:
        kind = "colour:" + ",".join(sorted({thing for thing, _ in v.hues}))
    else:
        return None
    return kind + "|" + ",".join(sorted(stems))


def frame_groups(candidates: Sequence[MemoryView], texts: Sequence[Values]) -> np.ndarray:
    """``fact_groups`` split by ``frame``; -1 for a text of no frame (the second, lower
    radius of ``supersede_frame_similarity`` is only for pairs of one frame)."""
    numbered: dict[tuple[str, str, frozenset[str], str], int] = {}
    out = np.full(len(candidates), -1, dtype=np.int64)
    for row, (m, v) in enumerate(zip(candidates, texts, strict=True)):
        f = frame(v) if may_conflict(v) else None
        if f is not None:
            out[row] = numbered.setdefault((m.entity or "", m.kind, v.relations, f),
                                           len(numbered))
    return out


def with_frame_pairs(near: Neighbours, framed: Neighbours) -> Neighbours:
    """``near`` with each row's pairs of one frame it lacks after its own (they are
    below its radius, so the order stays best first)."""
    indices, similarities = list(near.indices), list(near.similarities)
    for row, extra in enumerate(framed.indices):
        if not len(extra):
            continue
        new = ~np.isin(extra, indices[row])
        if new.any():
            indices[row] = np.concatenate([indices[row], extra[new]])
            similarities[row] = np.concatenate([similarities[row],
                                                framed.similarities[row][new]])
    return Neighbours(indices, similarities)


def superseded_ids(plans: Sequence[SupersedePlan]) -> set[str]:
    return {mid for p in plans for mid in p.member_ids}


def compatible(a: MemoryView, b: MemoryView) -> bool:
    """Whether two memories may be merged together: they do not state different values
    of one fact (a merge keeps one member's words, and so one value, in the hot tier),
    and neither denies most of what the other says: "Maya no longer drinks oat milk
    cappuccino" beside "Maya always orders an oat milk cappuccino" (a merge was worded
    by the second, stating the opposite of the newest member)."""
    if same_fact_different_value(a, b):
        return False
    va, vb = values(a.content), values(b.content)
    if va.negated == vb.negated:
        return True
    no, yes = (va, vb) if va.negated else (vb, va)
    return 2 * len(no.denied & yes.stems) < len(no.denied) or not no.denied


def compressible_together(a: MemoryView, b: MemoryView) -> bool:
    """Whether two memories may be compressed together: events may (the compression
    dates each: "hiked trail 3" and "hiked trail 4" are both true), facts that state
    different values of one thing may not (a wording could state the older as current)."""
    return is_event(a) or is_event(b) or compatible(a, b)


def is_event(memory: MemoryView) -> bool:
    """A memory of something that happened: another event with another number does not
    make it stale, so it neither supersedes nor is superseded."""
    return memory.kind in EVENT_KINDS


_STEMMED_RELATIONS = frozenset(stem(w) for w in RELATIONS)


# Where one statement of a memory ends and the next begins: a sentence, a semicolon (a
# compression's members of one day); within one, an "and" that opens another clause
# (``_opens_clause``). A memory may state two facts; an update of one leaves the other true.
_SENTENCES = re.compile(r"(?<=[.!?;])\s+")
# A point after these ends no sentence: "is now Dr. Leroy" was split, and "Leroy." was
# restated as a memory of its own. Nor does one after an initial ("J. Smith") or inside
# a dotted abbreviation ("5 p.m. on Monday", "e.g. tea").
ABBREVIATIONS = frozenset(
    "dr mr mrs ms mx prof st jr sr mt ft vs approx dept fig inc ltd corp ave blvd rd "
    "gen col capt lt sgt rev hon".split())
_LAST_WORD = re.compile(r"([A-Za-z][A-Za-z.]*)\.$")
_LONGEST_ABBREVIATION = 32  # characters, its points included
_NEXT_WORD = re.compile(r"[A-Za-z]+")
# Words that open a sentence and follow no abbreviation: after "Acme Inc." or "vitamin
# D.", "The user ..." is a sentence of its own.
OPENERS = frozenset(
    "the a an i he she it we they you my his her our their its this that these those "
    "there user users".split())
# The fewest words a restated statement has: one word ("Leroy.") says nothing alone.
RESTATED_WORDS = 2
_AND = re.compile(r"(,?)\s+and\s+")
_TOKEN = re.compile(r"[A-Za-z][A-Za-z'’]*|\d[\d,.:]*")
# A compression's day header ("Ann - 8 May 2023: ", "12 May: "), which dates every
# statement after it until the next.
_HEADER = re.compile(r"^(?:[^:;.]{1,80} - )?\d{1,2} [A-Z][a-z]+(?: \d{4})?: ")
RESTATE_RULE = "an older memory's statements an update leaves true, restated"
# Finite verbs, known without a tagger or a list of verbs: auxiliaries and common
# irregular pasts (closed classes), any "-ed" word, and an "-s" word in a verb's place
# (``_s_verb``): "-s" alone is as often a plural ("buys apples and oranges").
_AUXILIARIES = frozenset(
    "is are was were has have had does did will would can could should may might must "
    "went got said made took bought began left met ran became gave came found kept lost "
    "paid sold won wrote drove taught flew saw told felt thought knew spent built led".split())
# "-s" words that are no verb form: endings of nouns and adjectives ("glass", "bonus",
# "analysis", "famous"), and adverbs and pronouns that end so.
_NOT_VERB_ENDINGS = ("ss", "us", "is", "ics")
_NOT_VERBS = frozenset(
    "always sometimes perhaps nowadays afterwards towards besides unless whereas thus news "
    "series species means lots hers ours yours theirs".split())
# Words after which a word is a noun: determiners, quantifiers and prepositions ("the
# apples", "many friends", "of her cats").
_NOUN_BEFORE = frozenset(
    "a an the my your his her its our their this that these those some many few several "
    "all both no any each every more most other such own of with for from in on at by to "
    "about into over under after before than".split())
# Words that follow a verb, not a plural noun: an object pronoun, a determiner, a
# number ("sells them", "teaches a class", "repairs the bikes", "costs 25 euros").
_VERB_AFTER = frozenset(
    "me him her us them it a an the my your his its our their this these those".split())
# Words that open a clause of its own after "and": a pronoun or a determiner (then a
# verb must follow within ``_SUBJECT_WORDS`` words), or a name.
_SUBJECTS = frozenset("he she they we i you it the my his her their our its this that "
                      "these those".split())
_SUBJECT_WORDS = 4
_PRONOUNS = frozenset("he she they we i you it".split())


def _finite(token: str, before: str = "", after: str = "", first: bool = False) -> bool:
    """Whether ``token``, between the words ``before`` and ``after``, reads as a finite
    verb (``_AUXILIARIES``, "-ed", an "-s" word in a verb's place: ``_s_verb``).
    ``first``: it opens a sentence, where a capital says nothing."""
    t = token.lower()
    # "-eed" is rather a noun or a base form ("the need for", "speed", "proceed"); within
    # a sentence, a capital is a name's ("Anna and Ted at the park", "met Aaa and Saw").
    if (first or not token[:1].isupper()) and (
            t in _AUXILIARIES
            or (t.endswith("ed") and not t.endswith("eed") and len(t) > 3 and t.isalpha())):
        return True
    return _s_form(token) and _s_verb(before, after)


def _s_form(token: str) -> bool:
    """Whether ``token`` may be a verb's "-s" form: lower case (a capital is a name's, or
    a sentence's first word), of letters, ending so, and no noun's or adverb's ending."""
    t = token.lower()
    return (token[:1].islower() and t.isalpha() and len(t) > 3 and t.endswith("s")
            and not t.endswith(_NOT_VERB_ENDINGS) and t not in _NOT_VERBS)


def _s_verb(before: str, after: str = "") -> bool:
    """Whether an "-s" word between ``before`` and ``after`` is in a verb's place: not
    after a word that opens a noun (``_NOUN_BEFORE``, a number, a possessive: "the
    apples", "2 cats", "Maya's friends")."""
    b = before.lower()
    return not (b in _NOUN_BEFORE or b in _NUMBER_WORDS or b[:1].isdigit()
                or b.endswith(("'s", "’s", "s'", "s’")))


def _plural(word: str, before: str) -> bool:
    """Whether ``word`` (after ``before``) reads as a bare plural noun: an "-s" word not
    counted by a number ("apples", not "900 euros")."""
    b = before.lower()
    return _s_form(word) and not (b[:1].isdigit() or b in _NUMBER_WORDS)


def _verb_at(text: str) -> int | None:
    """Where the first finite verb after the first word of ``text`` begins (within its
    first ``_SUBJECT_WORDS`` + 2 words), or None."""
    tokens = list(_TOKEN.finditer(text))[: _SUBJECT_WORDS + 3]
    words = [m.group(0) for m in tokens]
    for i, m in enumerate(tokens[1: _SUBJECT_WORDS + 2], start=1):
        word = words[i]
        after = words[i + 1] if i + 1 < len(words) else ""
        passive = word.lower().endswith("ed") and after.lower() == "by"  # "raised by John"
        if _finite(word, words[i - 1], after) and not passive:
            return m.start()
    return None


# Words that open a clause inside a clause: a verb after "and" may be that clause's
# ("believes that nature refreshes her soul and helps her reset": nature helps).
_SUBORDINATORS = frozenset(
    "that which who whom whose because when while where if since although though "
    "whether".split())
# Verbs that take an adjective or a participle ("were awestruck and humbled", "felt
# accepted and supported"): an "-ed" word after their "and" is no verb of its own.
_COPULAS = frozenset(
    "is are was were be been feel feels felt seem seems seemed look looks looked "
    "become becomes became get gets got remain remains remained".split())
# Adverbs between a subject and its verb ("Maria recently joined"): not the subject's.
# A list, not any "-ly" word: "Melanie's family", "Italy", "July".
_ADVERBS = frozenset(
    "also now still just often always never already then recently usually finally really "
    "actually currently previously originally eventually gradually quickly frequently "
    "regularly rarely mostly generally happily proudly officially newly lately nearly "
    "mainly only truly definitely certainly probably clearly simply".split())


def _subject(clause: str, goes_on: str) -> str | None:
    """The words before ``clause``'s verb ("Maya" of "Maya lives in Lisbon"; a day
    header and adverbs left out), for the words after an "and" that begin with
    ``goes_on``; None when it has no verb near its start, or the verb after the "and"
    may be another's (a clause inside it; "were awestruck and humbled": a participle
    after a copula)."""
    header = _HEADER.match(clause)
    body = clause[header.end():] if header else clause
    first = _TOKEN.match(body)
    if first is None or _finite(first.group(0), first=True) \
            or first.group(0).lower() in _SUBORDINATORS:
        return None  # it opens with its verb, or inside another clause ("When ...")
    at = _verb_at(body)
    if at is None:
        return None
    if _SUBORDINATORS.intersection(t.lower() for t in _TOKEN.findall(body)):
        return None
    verb = _TOKEN.match(body, at)
    if verb is not None and verb.group(0).lower() in _COPULAS \
            and goes_on.lower().endswith("ed") and goes_on.lower() not in _AUXILIARIES:
        return None
    words = body[:at].split()
    while words and words[-1].lower() in _ADVERBS:
        words.pop()
    return " ".join(words) or None


class Continuation(Enum):
    """How the words after an "and" go on (``_opens_clause``)."""

    SUBJECT = "a clause of its own"  # "and the bike is a blue Trek", "and Anna is ..."
    VERB = "the same subject"  # "and works remotely"


def _opens_clause(right: str, left: str = "", comma: bool = False) -> Continuation | None:
    """How the words after an "and" go on (``left``: the words before it); None when
    they go on with the same clause ("Tom and Anna", "900 and 1000 euros", "apples and
    oranges from the market")."""
    tokens = _TOKEN.findall(right)[: _SUBJECT_WORDS + 2]
    if len(tokens) < 2:
        return None
    first = tokens[0]
    if _finite(first, "and", tokens[1]):
        if first.lower().endswith("ed") and _finite(tokens[1]) and not _s_form(tokens[1]):
            # "staying resilient and focused is key": an "-ed" word before a verb is no verb
            return None
        return Continuation.VERB if _goes_on_as_verb(first, tokens[1], left, comma) else None
    if not (first.lower() in _SUBJECTS or (first[0].isupper() and first != "I")):
        return None
    for i, t in enumerate(tokens[1: _SUBJECT_WORDS + 1], start=1):
        if t.lower() in _PRONOUNS or t.lower() in _SUBORDINATORS:
            return None  # "the help she received", "her family that gave": a noun's clause
        if (t.lower() in _NOUN_BEFORE and not _finite(t)) or t.lower() == "and":
            # "the need to make things", "the lack of resources", "her family and ...":
            # one noun, its verb (if any) further than a subject's
            return None
        if _finite(t, tokens[i - 1], tokens[i + 1] if i + 1 < len(tokens) else ""):
            return Continuation.SUBJECT
    return None


def _goes_on_as_verb(first: str, then: str, left: str, comma: bool = False) -> bool:
    """Whether ``first``, the word after an "and" that may be a verb, is the verb of a
    second clause with the subject of ``left``. An auxiliary or an "-ed" word is. An
    "-s" word is when a verb's object follows it ("sells them", "includes a charger",
    "costs 25 euros"); it is not when a noun's clause or the list goes on ("a husband
    and kids who"), nor as the second of two plurals ("apples and oranges"); after a
    ", and" (which splits anyway) it is. Otherwise it is only where a noun could not be
    joined to the left's last word, and agreeing with the left clause's verb, itself a
    present "-s" form: after a name or a counted unit ("lives in Lisbon and works
    remotely", "is 900 euros and includes heating"; not "met Anna and friends", "his
    wife and kids recently"), or before an "-ing" word."""
    if not _s_form(first) or first.lower() in _AUXILIARIES:
        return True
    t = then.lower()
    if t in _VERB_AFTER or t[:1].isdigit():
        return True
    if t in _SUBORDINATORS or t in ("and", "or"):
        return False  # "a husband and kids who ...": a noun's clause, or a list goes on
    words = _TOKEN.findall(left)
    if len(words) >= 2 and _plural(words[-1], words[-2]):
        return False
    if comma:
        return True  # ", and" splits anyway: the second clause is given the subject
    last, before = words[-1] if words else "", words[-2] if len(words) >= 2 else ""
    # A number before a plural opens a noun phrase that may go on after the "and" ("2
    # cats and dogs at home"); a unit that is no plural ends it ("900 km and takes").
    # Counted, an "-is" word is a plural too ("2 crisis" is no English).
    counted = (before[:1].isdigit() or before.lower() in _NUMBER_WORDS) \
        and not last.lower().endswith("s")
    open_end = (len(words) >= 2 and last[:1].isupper()) or last[:1].isdigit() \
        or counted or t.endswith("ing")
    if not open_end:
        return False
    at = _verb_at(left)
    verb = _TOKEN.match(left, at) if at is not None else None
    return verb is not None and (verb.group(0).lower() in ("is", "has", "does")
                                 or _s_form(verb.group(0)))


def _a_clause(right: str) -> bool:
    """Whether the words after a ", and" that ``_opens_clause`` does not read as going
    on make a clause of their own: a pronoun opens them ("she eagerly agreed", "it's
    made"), or a verb that is no "-s" word comes within a subject's length ("both
    acknowledged", "support I got was"). Else they are a list's last item ("love,
    faith, and strength", "doing research, preparing emotionally, and gathering
    documents", "family, and nature walks": an "-s" word there is a plural)."""
    tokens = _TOKEN.findall(right)[: _SUBJECT_WORDS + 2]
    if not tokens:
        return False
    if re.split(r"['’]", tokens[0].lower())[0] in _PRONOUNS:
        return True
    return any(not _s_form(t) and _finite(t)
               for t in tokens[1: _SUBJECT_WORDS + 1])


def _ends_a_list(left: str) -> bool:
    """Whether ``left``, the words before a ", and", ends in a list of things: its part
    after its last comma opens with a word in lower case that is no verb ("bought
    apples, pears", "love, nature walks"; not "lives in Oslo, works at Google", whose
    next item is a clause of the same subject, nor "lives in Lisbon, Portugal")."""
    head, comma, tail = left.rpartition(",")
    before = _TOKEN.findall(head)[-1:]
    words = _TOKEN.findall(tail)
    if not comma or not before or not words or not words[0][:1].islower():
        return False
    if _s_form(words[0]) and _s_form(before[0]):
        return True  # the second of two plurals ("apples, pears"), never the verb
    return not _finite(words[0], before[0], words[1] if len(words) > 1 else "")


def _split_and(sentence: str) -> list[str]:
    """One sentence's clauses: split at an "and" that opens another clause; one that
    goes on with the same subject is given it ("Maya lives in Lisbon and works
    remotely": "Maya works remotely"), so a clause restated alone still says whose fact
    it is. A ", and" splits where a clause follows (``_a_clause``), not before a list's
    last item."""
    out: list[str] = []
    start, given = 0, ""
    for m in _AND.finditer(sentence):
        left = given + sentence[start:m.start()].strip()
        right = sentence[m.end():]
        how = _opens_clause(right, left, bool(m.group(1)))
        if how is Continuation.SUBJECT and _TOKEN.findall(left)[-1:] and \
                _TOKEN.findall(left)[-1].lower() in _PRONOUNS:
            how = None  # "he and his family are": two subjects of one verb
        goes_on = _TOKEN.match(right)
        subject = _subject(left, goes_on.group(0) if goes_on else "") \
            if how is Continuation.VERB else None
        if how is Continuation.VERB and subject is None and not m.group(1):
            continue  # no subject to give it: one clause
        if how is Continuation.SUBJECT and _verb_at(left) is None and not m.group(1):
            continue  # "Tom and Anna went hiking": the left has no verb of its own
        if how is None and not (m.group(1) and _a_clause(right)):
            continue  # "tomatoes, beans, and peppers": a list's last item, no clause
        if how is Continuation.VERB and m.group(1) and _ends_a_list(left):
            continue  # "apples, pears, and canned food": an "-ed" word of the last item
        out.append(left)
        start, given = m.end(), (subject + " " if subject else "")
    out.append(given + sentence[start:].strip())
    return out


@lru_cache(maxsize=65536)
def clauses(text: str) -> tuple[str, ...]:
    """The statements of ``text`` (see ``_split_and``), each stripped."""
    return tuple(c for s in sentences(text) if s.strip()
                 for c in _split_and(s.strip()) if c.strip())


def sentences(text: str) -> list[str]:
    """``text`` split where a sentence ends: after ``!?;``, or a point that ends no
    abbreviation or initial (``ABBREVIATIONS``)."""
    out, start = [], 0
    for gap in _SENTENCES.finditer(text):
        before = text[start:gap.start()]
        if before.endswith(".") and _abbreviated(before, text[gap.end():]):
            continue
        out.append(before)
        start = gap.end()
    out.append(text[start:])
    return out


def _abbreviated(before: str, after: str) -> bool:
    """Whether the point ending ``before`` is an abbreviation's or an initial's: a
    known abbreviation, one letter, or a dotted word of short parts ("p.m.", "e.g.", not
    "Node.js"), unless the next word opens a sentence."""
    # Only the end is read: an abbreviation is short, and a long text has many points.
    word = _LAST_WORD.search(before, max(len(before) - _LONGEST_ABBREVIATION, 0))
    if word is None:
        return False
    last = word.group(1)
    short = len(last) == 1 or last.lower() in ABBREVIATIONS or (
        "." in last and all(len(part) <= 2 for part in last.split(".") if part))
    following = _NEXT_WORD.match(after)
    return short and not (following and following.group(0).lower() in OPENERS)


def clause_conflict(a: str, b: str) -> str | None:
    """``conflict`` of one statement of ``a`` with one of ``b``, when either states more
    than one: "the rent is 900 euros. The user plays the cello." disagrees with "the
    rent is now 1000 euros" on the rent, though as a whole it shares too few words with
    it to be one fact."""
    ca, cb = clauses(a), clauses(b)
    if len(ca) < 2 and len(cb) < 2:
        return None
    for x in ca:
        vx = values(x)
        for y in cb:
            kind = conflicting(vx, values(y))
            if kind is not None:
                return kind
    return None


def outdated(statement: str, newer: Sequence[str]) -> bool:
    """Whether one statement states a value one of ``newer`` updates."""
    return any(conflict(statement, n) or clause_conflict(statement, n) for n in newer)


def without_outdated(text: str, newer: Sequence[str]) -> str:
    """``text`` less every statement that states a value one of ``newer`` updates; a day
    header of a statement left out goes to the next statement of its day. Empty if
    none is left."""
    kept: list[str] = []
    header = ""
    for piece in clauses(text):
        own = _HEADER.match(piece)
        if outdated(piece[own.end():] if own else piece, newer):
            header = own.group(0) if own else header
            continue
        if header and not own:
            piece = header + piece
        header = ""
        kept.append(piece if piece[-1] in ".!?;" else piece + ".")
    if len(kept) == len(clauses(text)) and not header:
        return text.strip()  # nothing outdated: the text stands as it was written
    out = " ".join(kept)
    return out[:-1] + "." if out.endswith(";") else out


def restatement(profile: str, older: MemoryView, newest: MemoryView) -> SummaryPlan | None:
    """What ``older`` said besides the value ``newest`` updates, as a memory of its own
    at ``older``'s date, when it said something the newest does not: pure."""
    if len(clauses(older.content)) < 2:
        # One statement: ``without_outdated`` leaves nothing of it, or all of it (the
        # memory itself). Most members are one, and asking cost dedup a second at 100k.
        return None
    rest = without_outdated(older.content, [newest.content])
    if not rest or rest == older.content.strip():
        return None
    # A sentence of its own now ("the bike is a blue Trek" was a second clause).
    rest = rest[0].upper() + rest[1:]
    if len(_TOKEN.findall(rest)) < RESTATED_WORDS:
        return None
    if not values(rest).stems - values(newest.content).stems:
        return None  # nothing the newest does not say
    return SummaryPlan(
        summary_id=ids.restatement_id(older.id),
        operation=Operation.RESTATE, member_ids=(), content=rest, kind=older.kind,
        importance=older.importance, confidence=older.confidence,
        stability=older.stability, access_count=older.access_count,
        created_at=older.created_at, last_accessed_at=older.last_accessed_at,
        valid_from=older.valid_from, valid_until=older.valid_until, entity=older.entity,
        layer=older.layer, session_id=older.session_id, representative_id=older.id,
        protected=older.protected, meta=dict(older.meta),
        parameters={"rule": RESTATE_RULE, "restates": older.id,
                    "updated_by": newest.id, "mode": "rules"},
    )


def summary_groups(summaries: Sequence[MemoryView], plain: Sequence[MemoryView],
                   texts: Sequence[Values] | None = None) -> np.ndarray:
    """Per row of ``[*summaries, *plain]`` (``texts``: their ``values``), a group
    number: one per entity, for the search that pairs older summaries with newer
    memories (``plan_stale_summaries``); -1 for a text that states no number and no
    name."""
    rows = (*summaries, *plain)
    texts = texts if texts is not None else [values(m.content) for m in rows]
    numbered: dict[str, int] = {}
    return np.array([
        numbered.setdefault(m.entity or "", len(numbered)) if may_conflict(v) else -1
        for m, v in zip(rows, texts, strict=True)
    ], dtype=np.int64)


def summary_frame_groups(summaries: Sequence[MemoryView], plain: Sequence[MemoryView],
                         texts: Sequence[Values]) -> np.ndarray:
    """``frame_groups`` of ``[*summaries, *plain]`` (``texts``: their ``values``), for
    the second, lower radius of the search of summaries (``supersede_frame_similarity``),
    as among plain memories; -1 too for a frame no summary states (its pairs would be
    of plain memories only, which that search drops)."""
    groups = frame_groups((*summaries, *plain), texts)
    with_summary = np.unique(groups[: len(summaries)])
    groups[~np.isin(groups, with_summary[with_summary >= 0])] = -1
    return groups


def plan_stale_summaries(
    profile: str, summaries: Sequence[tuple[MemoryView, Sequence[MemoryView]]],
    near: Sequence[Sequence[tuple[MemoryView, float]]], vetoed: Set[str] = frozenset(),
) -> list[SupersedePlan]:
    """Supersessions of the stale members of older summaries: pure.

    A summary is written after its members were said, so it takes part through them:
    each of its members (an original in the cold tier, at its own date) that states a
    value of a fact a newer hot memory (``near``: within ``supersede_similarity`` of the
    summary, one list per summary, with its cosine) states otherwise now points at the
    newest such memory, and the summary is restated without it: a summary of the same
    operation that absorbs it and stands for its other members, in its words less the
    statements of the stale values. A summary all of whose members are stale goes cold
    itself, superseded by the newest. Merges and compressions never join two members
    that disagree, so a summary has no newer member than the one updated."""
    plans: list[SupersedePlan] = []
    parameters: dict[str, object] = {"rule": RULE + " (an older summary's members)",
                                     "mode": "rules"}
    for (summary, members), found in zip(summaries, near, strict=True):
        stale: dict[str, tuple[MemoryView, str, float]] = {}  # member -> newest, kind, cos
        for m in members:
            if is_event(m):
                continue
            for other, cos in found:
                if other.created_at <= m.created_at or (other.entity or "") != (m.entity or "") \
                        or other.kind != m.kind:
                    continue
                kind = conflict(m.content, other.content) or clause_conflict(
                    m.content, other.content)
                if kind is not None and (m.id not in stale or newest_first(other) > newest_first(
                        stale[m.id][0])):
                    stale[m.id] = (other, kind, cos)
        if not stale:
            continue
        by_newest: dict[str, list[str]] = {}
        for mid, (other, _, _) in stale.items():
            by_newest.setdefault(other.id, []).append(mid)
        rest = [m for m in members if m.id not in stale]
        drop = sorted({stale[mid][0].content for mid in stale})
        # A stale member's other statements stay hot as its own restatement, as a plain
        # memory's would; the summary's other members, as the summary restated.
        restated = tuple(r for m in members if m.id in stale
                         if (r := restatement(profile, m, stale[m.id][0])) is not None)
        if rest:
            restated += (_restated_summary(profile, summary, rest, drop, stale),)
        newest_last = sorted(by_newest, key=lambda nid: newest_first(
            next(stale[m][0] for m in by_newest[nid])))
        for nid in newest_last:
            newest = stale[by_newest[nid][0]][0]
            moved = sorted(by_newest[nid])
            priors = {m.id: (m.tier, m.lifecycle, m.superseded_by)
                      for m in members if m.id in moved}
            if not rest and nid == newest_last[-1]:
                moved.append(summary.id)  # nothing of it stays true: it goes cold
                priors[summary.id] = (summary.tier, summary.lifecycle, summary.superseded_by)
            mine = restated if nid == newest_last[-1] else ()
            cid = ids.consolidation_id(profile, OPERATION, f"{nid}|{','.join(sorted(moved))}")
            if cid in vetoed:
                continue
            plans.append(SupersedePlan(
                consolidation_id=cid, newest_id=nid, member_ids=tuple(sorted(moved)),
                similarities={mid: stale[mid][2] if mid in stale else
                              stale[by_newest[nid][0]][2] for mid in sorted(moved)},
                conflicts={mid: stale[mid][1] if mid in stale else "summary"
                           for mid in sorted(moved)},
                parameters={**_with_restated(parameters, mine), "summary": summary.id},
                priors=priors, newest=newest,
                members=tuple(m for m in (*members, summary) if m.id in moved),
                restated=mine,
            ))
    return plans


def _restated_summary(
    profile: str, summary: MemoryView, rest: Sequence[MemoryView], drop: Sequence[str],
    stale: dict[str, tuple[MemoryView, str, float]],
) -> SummaryPlan:
    """``summary`` less its stale members: a summary of the same operation absorbing it,
    standing for ``rest``, in its words less the statements the newer ``drop`` update."""
    text = without_outdated(summary.content, drop) or " ".join(
        without_outdated(m.content, drop) or m.content.strip() for m in rest)
    meta = dict(summary.meta)
    if isinstance(meta.get("member_dates"), dict):
        meta["member_dates"] = {k: v for k, v in meta["member_dates"].items() if k not in stale}
    return SummaryPlan(
        summary_id=ids.summary_id(profile, summary.origin, [m.id for m in rest]),
        operation=summary.origin, member_ids=tuple(sorted(m.id for m in rest)),
        absorbed_ids=(summary.id,), content=text, kind=summary.kind,
        importance=summary.importance, confidence=summary.confidence,
        stability=summary.stability, access_count=summary.access_count,
        created_at=summary.created_at, last_accessed_at=summary.last_accessed_at,
        valid_from=summary.valid_from, valid_until=summary.valid_until,
        entity=summary.entity, layer=summary.layer, session_id=summary.session_id,
        representative_id=summary.id, protected=summary.protected, meta=meta,
        parameters={"rule": RESTATE_RULE + " (a summary less its superseded members)",
                    "restates": summary.id, "superseded": sorted(stale), "mode": "rules"},
        priors={summary.id: (summary.tier, summary.lifecycle, summary.superseded_by),
                **{m.id: (m.tier, m.lifecycle, m.superseded_by) for m in rest}},
        sources=tuple(rest),
    )


REVERSE_RULE = RULE + " (a newer summary's member)"


class _Outdated(NamedTuple):
    """An older hot memory a summary's member updates (``plan_outdated_by_summaries``)."""

    older: MemoryView
    newest: MemoryView  # the member that states the newest value
    summary: MemoryView  # the summary it stands under
    conflict: str
    cosine: float
    # The summary ``cosine`` is to: ``summary`` where it found the older memory too,
    # else the one that did.
    cosine_to: str


def plan_outdated_by_summaries(
    profile: str, summaries: Sequence[tuple[MemoryView, Sequence[MemoryView]]],
    near: Sequence[Sequence[tuple[MemoryView, float]]], vetoed: Set[str] = frozenset(),
    peers: Sequence[Sequence[tuple[int, float]]] | None = None,
) -> list[SupersedePlan]:
    """Supersessions of hot memories a member of a summary updates: pure.

    The reverse of ``plan_stale_summaries``: a summary is dated by its oldest member,
    so a hot memory (``near``: within ``supersede_similarity`` of the summary, with its
    cosine) may be older than a member that states its fact otherwise: "rent 900" in
    January next to a merge of June's "rent 1000" statements. It goes cold pointing at
    the newest such member (cold itself, standing under its summary, which states the
    value hot), and what else it said stays hot, restated. A member that a hot memory
    newer still states otherwise is no update of anything (``plan_stale_summaries``
    makes it stale), nor is an event."""
    facts_ = [[m for m in members if not is_event(m)] for _, members in summaries]
    cosines = [{m.id: cos for m, cos in found} for found in near]
    updated: dict[str, _Outdated] = {}
    for i, ((summary, _), found) in enumerate(zip(summaries, near, strict=True)):
        # The members of the other summaries near this one (``peers``: by position)
        # update what its hot neighbours said as much as its own, and outdate its own:
        # two summaries that reach one older memory, the older summary's member stale
        # by the newer's, leave it pointing at the newest value, or hot when it says
        # that value again.
        mine = [(m, i) for m in facts_[i]] + [
            (m, k) for k, _ in (peers[i] if peers else ()) if k != i for m in facts_[k]]
        newer = [*found, *((m, 0.0) for m, _ in mine)]
        for older, cos in found:
            for m, k in mine:
                by = summaries[k][0]
                if newest_first(m) <= newest_first(older) or (m.entity or "") != (
                        older.entity or "") or m.kind != older.kind:
                    continue
                kind = conflict(older.content, m.content) or clause_conflict(
                    older.content, m.content)
                if kind is None or _outdated_member(m, newer):
                    continue
                best = updated.get(older.id)
                if best is None or (newest_first(m), by.id) > (
                        newest_first(best.newest), best.summary.id):
                    to_by = cosines[k].get(older.id)
                    updated[older.id] = _Outdated(older, m, by, kind, cos, summary.id) \
                        if to_by is None else _Outdated(older, m, by, kind, to_by, by.id)
    by_member: dict[str, list[str]] = {}
    for oid, entry in updated.items():
        by_member.setdefault(entry.newest.id, []).append(oid)
    plans: list[SupersedePlan] = []
    for mid in sorted(by_member):
        moved = sorted(by_member[mid])
        newest, summary = updated[moved[0]].newest, updated[moved[0]].summary
        cid = ids.consolidation_id(profile, OPERATION, f"{mid}|{','.join(moved)}")
        if cid in vetoed:
            continue
        olds = [updated[o].older for o in moved]
        restated = tuple(r for o in olds if (r := restatement(profile, o, newest)) is not None)
        plans.append(SupersedePlan(
            consolidation_id=cid, newest_id=mid, member_ids=tuple(moved),
            similarities={o: updated[o].cosine for o in moved},
            conflicts={o: updated[o].conflict for o in moved},
            parameters={**_with_restated({"rule": REVERSE_RULE, "mode": "rules"}, restated),
                        "summary": summary.id, **_found_near(
                            {o: updated[o].cosine_to for o in moved}, summary.id)},
            priors={o.id: (o.tier, o.lifecycle, o.superseded_by) for o in olds},
            newest=newest, members=tuple(sorted(olds, key=newest_first)), restated=restated,
        ))
    return plans


def _outdated_member(member: MemoryView, near: Sequence[tuple[MemoryView, float]]) -> bool:
    """Whether a memory of ``near`` (hot, or another summary's member) newer than
    ``member`` states its fact otherwise."""
    return any(
        newest_first(other) > newest_first(member) and (other.entity or "") == (
            member.entity or "") and other.kind == member.kind
        and (conflict(member.content, other.content)
             or clause_conflict(member.content, other.content)) is not None
        for other, _ in near)


def _found_near(near: dict[str, str], summary: str) -> dict[str, dict[str, str]]:
    """The audit's note of the members whose similarity is to another summary than the
    newest value's (it did not find them: the other, whose member it outdates, did)."""
    other = {o: s for o, s in near.items() if s != summary}
    return {"similar_to": other} if other else {}


def plan_summary_updates(
    profile: str, summaries: Sequence[tuple[MemoryView, Sequence[MemoryView]]],
    near: Sequence[Sequence[tuple[MemoryView, float]]], vetoed: Set[str] = frozenset(),
    peers: Sequence[Sequence[tuple[int, float]]] | None = None,
) -> list[SupersedePlan]:
    """Both directions between summaries and hot memories near them: hot memories a
    newer member updates (``plan_outdated_by_summaries``), then members a newer hot
    memory, or a newer member of another summary (``peers``: per summary, the others
    within ``supersede_similarity`` of it, by position, with the cosine), updates
    (``plan_stale_summaries``), the first's outdated memories no longer counting as
    newer values. Cold notes take part in the first only, and as the newer side of the
    second: they are protected, never rewritten."""
    reverse = plan_outdated_by_summaries(profile, summaries, near, vetoed, peers)
    gone = superseded_ids(reverse)
    rewritable = [i for i, (s, _) in enumerate(summaries)
                  if s.origin != Origin.COLD_LEARNING and not s.protected]
    plain = [[(m, cos) for m, cos in near[i] if m.id not in gone] for i in rewritable]
    if not peers or not any(peers):
        return reverse + plan_stale_summaries(
            profile, [summaries[i] for i in rewritable], plain, vetoed)
    # Another summary's members are newer values too, each at its own date: cold under
    # their summary, which states them hot, as in the reverse case. An older member
    # points at the newest value of its fact, not at a member that is itself outdated
    # (the chain 900 -> 950 -> 1000 of three summaries: 900 reaches 950's summary only):
    # the members each plan moves, and the summaries that go cold, point on at their
    # newest, until no pointer moves (each step is to a newer date: it ends).
    others = [[(m, cos) for k, cos in peers[i] if k != i for m in summaries[k][1]
               if not is_event(m)] for i in rewritable]
    known = {m.id: m for _, members in summaries for m in members} | {
        m.id: m for found in near for m, _ in found}
    target: dict[str, str] = {}
    forward: list[SupersedePlan] = []
    for _ in range(len(summaries) + 1):
        extended = [
            [*plain[r], *others[r], *_onward(others[r], target, known)]
            for r in range(len(rewritable))]
        forward = plan_stale_summaries(
            profile, [summaries[i] for i in rewritable], extended, vetoed)
        now = {mid: p.newest_id for p in forward for mid in p.member_ids}
        if now == target:
            break
        target = now
    return reverse + forward


def with_frame_radius(plans: Sequence[SupersedePlan], config: DedupConfig) -> list[SupersedePlan]:
    """``plans`` of summaries, each with a member only the second radius found (below
    ``supersede_similarity``) audited as such, as ``plan_supersessions`` audits its own."""
    return [p if min(p.similarities.values(), default=1.0) >= config.supersede_similarity
            else replace(p, parameters={**p.parameters,
                                        "frame_similarity": config.supersede_frame_similarity})
            for p in plans]


def _onward(
    found: Sequence[tuple[MemoryView, float]], target: dict[str, str],
    known: dict[str, MemoryView],
) -> list[tuple[MemoryView, float]]:
    """The newest values ``found``'s outdated members point at (``target``, followed to
    its end), at the cosine of the member that leads to them."""
    out = []
    for m, cos in found:
        at, seen = m.id, {m.id}
        while at in target and target[at] not in seen and target[at] in known:
            at = target[at]
            seen.add(at)
        if at != m.id:
            out.append((known[at], cos))
    return out
