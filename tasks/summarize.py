"""How summaries and Core Memory blocks are worded, behind one interface.

Mode A (``rules``) is deterministic and needs no model: a merged group is worded as
its representative memory, and blocks are compiled by rules. LLM modes register
here under their own name; steps ask ``summarizer_for(name)`` and never know which
mode they got. A summarizer may decline (return ``None``): the step then falls back
to the rules, and its report says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from models.errors import ConfigError
from models.records import MemoryView


class Summarizer(Protocol):
    mode: str

    def merge(self, representative: MemoryView, members: Sequence[MemoryView]) -> str | None:
        """Wording of one summary standing for ``members``; None to use the rules."""

    def compile_block(
        self, block_type: str, facts: Sequence[MemoryView], char_limit: int
    ) -> str | None:
        """Wording of one Core Memory block from ``facts``; None to use the rules."""

    def describe_cluster(self, members: Sequence[MemoryView], dominant_kind: str) -> str | None:
        """Wording of a meta-memory describing a cluster; None to use the rules."""


class RulesSummarizer:
    """Mode A: the representative's own words; blocks compiled by rules."""

    mode = "rules"

    def merge(self, representative: MemoryView, members: Sequence[MemoryView]) -> str | None:
        return representative.content

    def compile_block(
        self, block_type: str, facts: Sequence[MemoryView], char_limit: int
    ) -> str | None:
        return None

    def describe_cluster(self, members: Sequence[MemoryView], dominant_kind: str) -> str | None:
        return None


_REGISTRY: dict[str, Callable[[], Summarizer]] = {"rules": RulesSummarizer}


def register(name: str, factory: Callable[[], Summarizer]) -> None:
    _REGISTRY[name] = factory


def summarizer_for(name: str) -> Summarizer:
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ConfigError(
            f"unknown summarizer {name!r}; choose one of {', '.join(sorted(_REGISTRY))}"
        ) from None


def merged_attributes(memories: Sequence[MemoryView]) -> dict[str, object]:
    """Attributes of a summary of ``memories``: the strongest importance, trust and use,
    the mean stability, and the widest span of time and validity."""
    starts = [m.valid_from for m in memories]
    ends = [m.valid_until for m in memories]
    accessed = [m.last_accessed_at for m in memories if m.last_accessed_at is not None]
    return {
        "importance": max(m.importance for m in memories),
        "confidence": max(m.confidence for m in memories),
        "stability": sum(m.stability for m in memories) / len(memories),
        "access_count": max(m.access_count for m in memories),
        "created_at": min(m.created_at for m in memories),
        "last_accessed_at": max(accessed) if accessed else None,
        # Open-ended if any member is: the summary is valid wherever one of them was.
        "valid_from": None if any(v is None for v in starts) else min(starts),  # type: ignore[type-var]
        "valid_until": None if any(v is None for v in ends) else max(ends),  # type: ignore[type-var]
    }
