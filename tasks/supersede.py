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
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache

import numpy as np

from reverie.engines.llm import _COMMON, _OPENING_WORDS, facts, kept_names
from reverie.engines.similarity import DEFAULT_SEARCH, radius_neighbours
from reverie.models import ids
from reverie.models.config import DedupConfig, SearchConfig
from reverie.models.records import MemoryView
from reverie.models.tables import Operation

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
_WORDS = re.compile(r"[a-z]+|0")
_DIGIT_RUN = re.compile(r"[\d][\d,._]*")
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
# words and "new" ("User said the rent is 950 euros per month now").
NOISE = frozenset(
    "said says mentioned mention told tell tells reported noted now currently recently lately "
    "these days since last next this spring summer autumn fall winter started start starting "
    "keep keeps kept own owns owned "
    "new newly again still anymore changed went per every each month monthly week "
    "weekly year yearly day daily".split()
)
COMMON_WORDS = _COMMON | _OPENING_WORDS
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
}
_STEMMED_RELATIONS: frozenset[str] = frozenset()  # filled below, once stem is defined


@lru_cache(maxsize=65536)
def values(text: str) -> Values:
    found = facts(text)
    words = frozenset(found.words)
    numbers = set(found.numbers)
    tokens = _WORDS.findall(_DIGIT_RUN.sub(" 0 ", text.lower()))
    numbers |= {_NUMBER_WORDS[w] for w in tokens if w in _NUMBER_WORDS}
    names = kept_names([found]) - NOT_NAMES
    # A unit is the word after a number ("900 euros", "two cats"): it goes with the value.
    units = frozenset(
        stem(tokens[i + 1]) for i, w in enumerate(tokens[:-1])
        if (w == "0" or w in _NUMBER_WORDS) and tokens[i + 1] not in COMMON_WORDS
        and tokens[i + 1] in found.lower  # "3 March": a date, not three of something
    )
    stems = frozenset(
        SYNONYMS.get(w) or stem(w) for w in words
        if len(w) >= 3 and w.isalpha() and w not in COMMON_WORDS and w not in found.names
        and w not in _NUMBER_WORDS and w not in NOISE
    ) - units
    relations = frozenset(stem(w) for w in words if stem(w) in _STEMMED_RELATIONS)
    return Values(frozenset(numbers), frozenset(names), words, stems, relations, units,
                  frozenset(found.lower))


def conflict(a: str, b: str) -> str | None:
    """Which kind of value two texts about one fact disagree on ("number", "name"),
    or None when they do not (the same values, one adds a value, or not one fact)."""
    return conflicting(values(a), values(b))


def may_conflict(v: Values) -> bool:
    """Whether a text can disagree with any other: ``conflicting`` needs both to state
    a number, or both a name."""
    return bool(v.numbers or v.names)


def conflicting(va: Values, vb: Values) -> str | None:
    """``conflict`` of two texts' values (symmetric: ``shorter`` and ``longer`` of equal
    lengths are then compared for equality)."""
    kind = None
    if va.numbers - vb.numbers and vb.numbers - va.numbers:
        kind = "number"
        # Numbers of different things ("2 goldfish", "3 cats") are not one value.
        if va.units and vb.units and not va.units & vb.units:
            return None
    elif va.names - vb.words and vb.names - va.words:
        kind = "name"
    if kind is None or va.relations != vb.relations:
        return None
    # A name (the subject "Gina" opening both, "Rome" in one) is no content word; a
    # capitalised opener the other text writes in lower case ("Rent for ...") is one.
    named = {stem(n) for n in (va.names - vb.lower) | (vb.names - va.lower)}
    sa, sb = va.stems - named, vb.stems - named
    shorter = min(sa, sb, key=len)
    shared = len(sa & sb)
    if kind == "number" and va.units & vb.units and not shorter:
        return kind  # numbers of the same thing ("2 cats", "three cats"), nothing else said
    if not shared:
        return None
    longer = max(sb, sa, key=len)
    # One only adds words to the other ("lives in Oslo these days, in a small flat"), or
    # half the words of each agree. A number must always agree on half of both: it
    # hardly moves a vector ("a deposit of 1800 euros for the flat" is not "the rent on
    # the flat"), and "Maya works mostly in Python" is not what "Maya lives in Lisbon
    # and works remotely" updates.
    adds = kind == "name" and shorter <= longer
    return kind if adds or shared >= CONTEXT_SHARE * len(longer) else None


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


def plan_supersessions(
    profile: str, candidates: Sequence[MemoryView], vectors: np.ndarray, config: DedupConfig,
    search: SearchConfig = DEFAULT_SEARCH,
) -> list[SupersedePlan]:
    """The supersessions among ``candidates`` (row-aligned with ``vectors``): pure.

    Only pairs that may conflict are searched and compared: of one entity, kind and
    set of relations, each stating a number or a name (``fact_groups``). The others
    would be found by the search only to fail the word test, and at 100k memories
    finding and skipping them was most of dedup's time (#37)."""
    if len(candidates) < 2:
        return []
    texts = [values(m.content) for m in candidates]
    neighbours = radius_neighbours(vectors, config.supersede_similarity, search=search,
                                   groups=fact_groups(candidates, texts))
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
            known[key] = conflicting(texts[i], texts[j])
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
        plans.append(SupersedePlan(
            consolidation_id=ids.consolidation_id(
                profile, OPERATION, f"{newest.id}|{','.join(sorted(member_ids))}"),
            newest_id=newest.id,
            member_ids=member_ids,
            similarities=dict(sorted(sims.items())),
            conflicts={candidates[j].id: kinds[j] for j in sorted(chain,
                       key=lambda r: candidates[r].id)},
            parameters=dict(parameters),
            priors={m.id: (m.tier, m.lifecycle, m.superseded_by) for m in members},
            newest=newest,
            members=tuple(members),
        ))
    return plans


def fact_groups(candidates: Sequence[MemoryView], texts: Sequence[Values]) -> np.ndarray:
    """Per candidate, a group number such that only two of one group may state two
    values of one fact: one entity, one kind, the same relations (``conflicting``);
    -1 for a text that states no number and no name, which disagrees with none."""
    numbered: dict[tuple[str, str, frozenset[str]], int] = {}
    return np.array([
        numbered.setdefault((m.entity or "", m.kind, v.relations), len(numbered))
        if may_conflict(v) else -1
        for m, v in zip(candidates, texts, strict=True)
    ], dtype=np.int64)


def superseded_ids(plans: Sequence[SupersedePlan]) -> set[str]:
    return {mid for p in plans for mid in p.member_ids}


def compatible(a: MemoryView, b: MemoryView) -> bool:
    """Whether two memories may be merged together: they do not state different values
    of one fact (a merge keeps one member's words, and so one value, in the hot tier)."""
    return not same_fact_different_value(a, b)


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
