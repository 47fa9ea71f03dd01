"""How a Core Memory block's text is made of facts: each fact on one line, the facts
joined by a separator, the whole fitted to a length at a fact boundary.

Here rather than in ``tasks.blocks`` because two layers write blocks: the compile step,
and the store itself when an ingest or an undo changes a memory a block quotes
(``repositories.blocks.requote``)."""

from __future__ import annotations

from collections.abc import Sequence

from reverie.models.config import BlocksConfig

USER_PROFILE = "user_profile"
PROJECT_CONTEXT = "project_context"
BEHAVIORAL_PATTERNS = "behavioral_patterns"
ACTIVE_DECISIONS = "active_decisions"
LEARNED_PREFERENCES = "learned_preferences"
# Also the priority order: when the total is over budget, later blocks give way first
# among blocks of equal length; blocks are read in this order (an agent's session_init
# with a small budget gets the user's profile first).
BLOCK_TYPES = (
    USER_PROFILE, PROJECT_CONTEXT, BEHAVIORAL_PATTERNS, ACTIVE_DECISIONS, LEARNED_PREFERENCES,
)


def block_rank(block_type: str) -> int:
    """Where a block comes in ``BLOCK_TYPES``; a type it does not list comes last."""
    return BLOCK_TYPES.index(block_type) if block_type in BLOCK_TYPES else len(BLOCK_TYPES)


SEPARATOR = "\n---\n"
ELLIPSIS = "…"


def fact_text(content: str) -> str:
    """A fact on one line, so separators stay unambiguous."""
    return " ".join(content.split())


def cut_words(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, cut at a word, ending in an ellipsis."""
    if len(text) <= limit:
        return text
    if limit <= len(ELLIPSIS):
        return ""
    head = text[: limit - len(ELLIPSIS)]
    space = head.rfind(" ")
    if space > 0:
        head = head[:space]
    return head.rstrip() + ELLIPSIS


def joined_length(facts: Sequence[str]) -> int:
    return sum(map(len, facts)) + len(SEPARATOR) * max(len(facts) - 1, 0)


def fit_facts(facts: Sequence[str], limit: int) -> list[str]:
    """The leading facts that fit in ``limit`` characters once joined."""
    kept: list[str] = []
    for fact in facts:
        if joined_length([*kept, fact]) > limit:
            if not kept:  # one fact longer than the whole block
                cut = cut_words(fact, limit)
                kept = [cut] if cut else []
            break
        kept.append(fact)
    return kept


def block_rules(config: BlocksConfig) -> dict[str, str]:
    """What each block holds, as ``reverie blocks``, reports and the MCP ``store`` tool
    say it (here, not in ``tasks.blocks``: a read command imports no Prefect)."""
    top = config.facts_per_block
    return {
        USER_PROFILE: f"the {top} semantic or opinion facts used most (ties: most important)",
        PROJECT_CONTEXT: f"the {top} newest episodic facts (a summary by its newest event)",
        BEHAVIORAL_PATTERNS: f"the {top} most trusted behavioral or pattern memories",
        ACTIVE_DECISIONS: f"decisions used at least {config.decision_min_access} times "
                          "(an access is counted by recall --track or record_access)",
        LEARNED_PREFERENCES: "opinions and preferences trusted at least "
                             f"{config.preference_min_confidence:g}",
    }
