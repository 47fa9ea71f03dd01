"""Does a summary say what its members said? Two measures, pure functions of text.

**Members kept whole**: a member's statement survives in a summary when its content
words (lower case, punctuation and the commonest function words left out) run in the
summary's content words in its own order, without a gap. What a summary states once for
all may be left out of a member first: a leading subject shared by every member ("Ann
adopted a cat" in "Ann - 8 May 2023: adopted a cat; ..."). Day headers need no such
allowance: a member's date is metadata, not its words, and a header sits between
members, never inside one.

**Facts kept**: the numbers and names (a date's day, month and year among them) that
any member states, as the model's merges are held to them (``engines.llm``'s
``facts`` and ``kept_names``), that the summary states too.

A compression or a cold note must keep every member whole; a merge of near-duplicates
must keep every fact (its members say nearly the same thing, and it says it once). The
LoCoMo bench (``benchmarks.locomo``) reports both, per operation, for every summary a
consolidation leaves in the hot tier.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from reverie.engines.llm import facts, kept_names
from reverie.engines.wording import content_words


def subject_of(entities: Iterable[str | None]) -> str | None:
    """The subject every member is about, when they agree on one."""
    found = set(entities)
    return found.pop() if len(found) == 1 and None not in found else None


def statement_words(member: str, subject: str | None = None) -> list[str]:
    """The content words of ``member`` a summary must keep: all of them, bar a leading
    ``subject`` (said once for all)."""
    said = content_words(member)
    lead = content_words(subject) if subject else []
    if lead and said[: len(lead)] == lead and len(said) > len(lead):
        said = said[len(lead):]
    return said


def _runs_in(needle: Sequence[str], haystack: Sequence[str]) -> bool:
    if not needle:
        return True
    n = len(needle)
    first = needle[0]
    return any(
        haystack[i] == first and list(haystack[i: i + n]) == list(needle)
        for i in range(len(haystack) - n + 1)
    )


def kept_whole(member: str, summary: str, subject: str | None = None) -> bool:
    """Whether ``summary`` keeps ``member``'s statement whole (see the module)."""
    return members_kept_whole([member], summary, subject)[0] == 1


def members_kept_whole(
    members: Sequence[str], summary: str, subject: str | None = None
) -> tuple[int, int]:
    """(members ``summary`` keeps whole, members)."""
    said = content_words(summary)
    if subject and not _runs_in(content_words(subject), said):
        subject = None  # not stated once for all: each member must say it
    return sum(_runs_in(statement_words(m, subject), said) for m in members), len(members)


def member_facts(members: Sequence[str]) -> frozenset[str]:
    """The numbers and names (dates' parts among them) ``members`` state."""
    known = [facts(m) for m in members]
    return frozenset().union(*(k.numbers for k in known)) | kept_names(known)


def facts_kept(members: Sequence[str], summary: str) -> tuple[int, int]:
    """(the members' numbers and names ``summary`` states, the members' numbers and
    names)."""
    wanted = member_facts(members)
    said = facts(summary)
    return len(wanted & (said.numbers | said.words)), len(wanted)


@dataclass
class Tally:
    """Both measures over the summaries of one operation."""

    summaries: int = 0
    members: int = 0
    whole: int = 0
    facts: int = 0
    facts_said: int = 0
    # Summaries that drop something, for a reader to look at: (summary, member) pairs.
    examples: list[tuple[str, str]] = field(default_factory=list)

    def add(self, summary: str, members: Sequence[str], subject: str | None) -> None:
        self.summaries += 1
        whole, n = members_kept_whole(members, summary, subject)
        self.whole += whole
        self.members += n
        said, stated = facts_kept(members, summary)
        self.facts_said += said
        self.facts += stated
        if len(self.examples) < 3:
            broken = [m for m in members if not kept_whole(m, summary, subject)]
            if broken:
                self.examples.append((summary, broken[0]))

    @property
    def whole_share(self) -> float | None:
        return round(self.whole / self.members, 4) if self.members else None

    @property
    def facts_share(self) -> float | None:
        return round(self.facts_said / self.facts, 4) if self.facts else None

    def as_json(self) -> dict[str, object]:
        return {"summaries": self.summaries, "members": self.members,
                "members_kept_whole": self.whole_share, "members_whole": self.whole,
                "facts": self.facts, "facts_kept": self.facts_share,
                "facts_said": self.facts_said}

    def merged(self, other: Tally) -> Tally:
        return Tally(self.summaries + other.summaries, self.members + other.members,
                     self.whole + other.whole, self.facts + other.facts,
                     self.facts_said + other.facts_said,
                     (self.examples + other.examples)[:3])


def fidelity(
    summaries: Iterable[tuple[str, str, Sequence[tuple[str, str | None]]]],
) -> dict[str, Tally]:
    """Both measures per operation, from (operation, summary text, [(member text,
    member entity)]) triples."""
    out: dict[str, Tally] = {}
    for operation, text, members in summaries:
        subject = subject_of(e for _, e in members)
        out.setdefault(operation, Tally()).add(text, [c for c, _ in members], subject)
    return out


def combined(per_run: Iterable[Mapping[str, Tally]]) -> dict[str, Tally]:
    """Tallies of several stores, summed per operation."""
    out: dict[str, Tally] = {}
    for tallies in per_run:
        for op, tally in tallies.items():
            out[op] = out[op].merged(tally) if op in out else tally
    return out
