"""Who words a summary, a meta-memory or a Core Memory block, behind one interface.

Every step plans its texts by rules first (Mode A, deterministic, no model): a merged
group is worded as its representative, a compression joins its members' words, a
cluster and a block are described by rules. A summarizer is then asked to reword only
the plans that survived the operator's vetoes: ``rules`` declines every time, so the
rules' text stands; ``llm`` (Modes B and C, ``engines.llm``) asks a model. Steps ask
``summarizer_for(name)`` and never know which mode they got.

A summarizer declines by returning ``None``, and then the plan's rules wording stands
and the step's report says why. A summarizer never raises for a wording it could not
make: a step that failed would be retried by Prefect, and the retry would ask the
model again.
"""

from __future__ import annotations

import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol

from reverie.models.config import SummarizerName
from reverie.models.errors import ConfigError
from reverie.models.records import MemoryView
from reverie.models.settings import get_settings

_PUNCTUATION = str.maketrans({c: " " for c in string.punctuation + "’‘“”–—…"})
# Words a statement's meaning does not rest on: articles, the commonest prepositions,
# pronouns, auxiliaries and conjunctions, and the "s" a possessive leaves behind.
FUNCTION_WORDS = frozenset(
    "a an the s and or but nor so of to in on at by for with from as into about than "
    "i me my we us our you your he him his she her it its they them their this that "
    "these those is are was were be been being am has have had do does did will would "
    "can could shall should may might must not no".split()
)


def content_words(text: str) -> list[str]:
    """The words of ``text`` that carry its meaning, lower case, in order: what a
    summary is held to keep of a member (``benchmarks.fidelity``), and what a merge
    asks of a member before it leaves it unsaid (``tasks.dedup``)."""
    return [w for w in text.lower().translate(_PUNCTUATION).split() if w not in FUNCTION_WORDS]


class Summarizer(Protocol):
    mode: str
    # Why calls fell back to the rules (no memory text), for the step's report: one
    # entry per wording, "what: reason kind", so that reports can count them.
    failures: list[str]
    # Run-level events the report should carry (e.g. the circuit breaker opened).
    events: list[str]

    def merge(self, members: Sequence[MemoryView]) -> str | None:
        """Wording of one summary standing for near-duplicate ``members``."""

    def compress(self, members: Sequence[MemoryView]) -> str | None:
        """Wording of a compression of fading ``members``, oldest first."""

    def compile_block(
        self, block_type: str, facts: Sequence[MemoryView], char_limit: int
    ) -> str | None:
        """Wording of one Core Memory block from ``facts``."""

    def describe_cluster(self, members: Sequence[MemoryView], dominant_kind: str) -> str | None:
        """Wording of a meta-memory describing a cluster."""


class RulesSummarizer:
    """Mode A: declines every wording, so the plan's rules text stands."""

    mode = "rules"

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.events: list[str] = []

    def merge(self, members: Sequence[MemoryView]) -> str | None:
        return None

    def compress(self, members: Sequence[MemoryView]) -> str | None:
        return None

    def compile_block(
        self, block_type: str, facts: Sequence[MemoryView], char_limit: int
    ) -> str | None:
        return None

    def describe_cluster(self, members: Sequence[MemoryView], dominant_kind: str) -> str | None:
        return None


def _llm() -> Summarizer:
    from reverie.engines.llm import LLMSummarizer

    return LLMSummarizer()


_FACTORIES: dict[str, Callable[[], Summarizer]] = {"rules": RulesSummarizer, "llm": _llm}


def summarizer_for(name: SummarizerName) -> Summarizer:
    """The summarizer called ``name``; "auto" is "llm" when an LLM server is configured."""
    if name == "auto":
        name = "llm" if get_settings().llm_base_url else "rules"
    try:
        return _FACTORIES[name]()
    except KeyError:  # the config's type admits no other name; a caller outside it might
        raise ConfigError(
            f"unknown summarizer {name!r}; choose one of auto, {', '.join(sorted(_FACTORIES))}"
        ) from None


def fallback_notes(summarizer: Summarizer) -> list[str]:
    """Report notes when a model's wordings were replaced by the rules, grouped by
    reason with counts, then the summarizer's run-level events (the breaker opened)."""
    notes: list[str] = []
    if summarizer.failures:
        reasons = "; ".join(
            reason if n == 1 else f"{reason} x{n}"
            for reason, n in sorted(Counter(summarizer.failures).items())
        )
        notes.append(
            f"{summarizer.mode}: {len(summarizer.failures)} wording(s) fell back to rules "
            f"({reasons})"
        )
    return notes + list(summarizer.events)
