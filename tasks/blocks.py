"""Step 2: compile the five Core Memory blocks, the always-in-context summary.

Sources (Mode A rules, from SuperLocalMemory):

===================  ==================================================  ==========
block                memories (hot, live, valid at ``as_of``)            order
===================  ==================================================  ==========
user_profile         semantic and opinion facts, top 5                   most used
project_context      episodic facts, top 5                               newest
behavioral_patterns  behavioral and pattern memories, top 5              most trusted
active_decisions     decisions used at least 3 times                     most used
learned_preferences  opinions and preferences trusted at least 0.7       most trusted
===================  ==================================================  ==========

Importance breaks ties in each order (SuperLocalMemory leaves them open): right after
an import, when no fact has been used yet, the important ones are kept.

Facts are joined with ``---`` separators. Both limits are enforced: each block at
most ``block_char_limit`` characters, all blocks together at most
``core_memory_char_limit``. Blocks are cut at a fact boundary; only a single fact
longer than the whole allowance is cut inside, at a word, with an ellipsis.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from reverie.engines.wording import Summarizer, fallback_notes, summarizer_for
from reverie.models.block_text import (
    ACTIVE_DECISIONS,
    BEHAVIORAL_PATTERNS,
    BLOCK_TYPES,
    LEARNED_PREFERENCES,
    PROJECT_CONTEXT,
    SEPARATOR,
    USER_PROFILE,
    block_rank,
    block_rules,
    cut_words,
    fact_text,
    fit_facts,
    joined_length,
)
from reverie.models.config import BlocksConfig
from reverie.models.records import BlockPlan, MemoryView
from reverie.models.repositories.blocks import upsert_blocks
from reverie.models.repositories.memories import memories as memories_of
from reverie.models.store import Store
from reverie.tasks.step import Change, StepArgs, StepReport, preview, step_task

# Blocks an LLM summarizer may word (the other three are structured lists).
PROSE_BLOCKS = frozenset({USER_PROFILE, PROJECT_CONTEXT})


def _live(memory: MemoryView, as_of: datetime) -> bool:
    return memory.is_live and memory.valid_at(as_of)


def _newest_first(m: MemoryView) -> tuple[float, str]:
    return (-m.created_at.timestamp(), m.id)


def happened(m: MemoryView) -> datetime:
    """When what an episodic memory tells happened: its day, or for a compression of
    events (dated when it was written) its newest member's. Ranked by the day it was
    written, a summary of last year's jobs crowded this month's events out of
    ``project_context``."""
    until = m.meta.get("members_until") if m.meta else None
    if isinstance(until, str):
        try:
            return datetime.fromisoformat(until)
        except ValueError:
            pass
    return m.created_at


def _important_then_newest(m: MemoryView) -> tuple[float, float, str]:
    """SuperLocalMemory orders each block by one measure and says nothing of ties:
    importance breaks them (then the newest), so among facts used equally often (all of
    them, right after an import) the important ones are kept."""
    return (-m.importance, *_newest_first(m))


def block_sources(
    memories: Sequence[MemoryView], as_of: datetime, config: BlocksConfig
) -> dict[str, list[MemoryView]]:
    """The memories feeding each block, best first."""
    live = [m for m in memories if _live(m, as_of)]
    top = config.facts_per_block

    def pick(
        keep: Callable[[MemoryView], bool],
        key: Callable[[MemoryView], tuple],
        limit: int | None,
    ) -> list[MemoryView]:
        chosen: list[MemoryView] = []
        said: set[str] = set()
        for m in sorted((m for m in live if keep(m)), key=key):
            # The same words stored twice (no dedup run since): one fact, said once.
            text = fact_text(m.content).casefold()
            if text in said:
                continue
            said.add(text)
            chosen.append(m)
            if limit is not None and len(chosen) == limit:
                break
        return chosen

    return {
        USER_PROFILE: pick(
            lambda m: m.kind in ("semantic", "opinion"),
            lambda m: (-m.access_count, *_important_then_newest(m)), top,
        ),
        PROJECT_CONTEXT: pick(
            lambda m: m.kind == "episodic",
            lambda m: (-happened(m).timestamp(), -m.importance, m.id), top,
        ),
        BEHAVIORAL_PATTERNS: pick(
            lambda m: m.kind in ("behavioral", "pattern"),
            lambda m: (-m.confidence, *_important_then_newest(m)), top,
        ),
        ACTIVE_DECISIONS: pick(
            lambda m: m.kind == "decision" and m.access_count >= config.decision_min_access,
            lambda m: (-m.access_count, *_important_then_newest(m)), None,
        ),
        LEARNED_PREFERENCES: pick(
            lambda m: m.kind in ("opinion", "preference")
            and m.confidence >= config.preference_min_confidence,
            lambda m: (-m.confidence, -m.access_count, *_important_then_newest(m)), None,
        ),
    }


def enforce_total(blocks: dict[str, list[str]], limit: int) -> dict[str, list[str]]:
    """Shrink blocks until all of them together fit in ``limit`` characters: the longest
    block drops its last fact (a lone fact is cut at a word) until the total fits."""
    out = {name: list(facts) for name, facts in blocks.items()}
    while (total := sum(joined_length(f) for f in out.values())) > limit:
        name = max(out, key=lambda n: (joined_length(out[n]), block_rank(n)))
        facts = out[name]
        if len(facts) > 1:
            facts.pop()
        else:
            cut = cut_words(facts[0], len(facts[0]) - (total - limit))
            out[name] = [cut] if cut else []
    return out


def word_blocks(
    sources: Mapping[str, Sequence[MemoryView]], config: BlocksConfig, summarizer: Summarizer
) -> dict[str, str]:
    """The prose blocks the summarizer words from their facts (a block it declines, or
    with no fact, is left to the rules)."""
    worded: dict[str, str] = {}
    for name in BLOCK_TYPES:
        facts = sources[name]
        if name in PROSE_BLOCKS and facts:
            text = summarizer.compile_block(name, facts, config.block_char_limit)
            if text:
                worded[name] = text
    return worded


def plan_blocks(
    sources: Mapping[str, Sequence[MemoryView]],
    config: BlocksConfig,
    worded: Mapping[str, str] | None = None,
    mode: str = "rules",
) -> tuple[list[BlockPlan], list[str]]:
    """Plans for all five blocks from their sources, fitted to both limits: the rules
    list the facts, a block in ``worded`` takes that text (worded in ``mode``)."""
    worded = worded or {}
    texts: dict[str, list[str]] = {}
    for name in BLOCK_TYPES:
        facts = [worded[name]] if name in worded else [m.content for m in sources[name]]
        texts[name] = fit_facts([fact_text(f) for f in facts], config.block_char_limit)
    rules = block_rules(config)
    # An empty block is the question users ask first ("I told it three decisions"):
    # the report says which rule no memory meets yet.
    notes = [f"{name} is empty: no memory meets its rule yet ({rules[name]})"
             for name in BLOCK_TYPES if not sources[name]]
    texts = enforce_total(texts, config.core_memory_char_limit)
    plans = []
    for name in BLOCK_TYPES:
        kept = texts[name]
        # Rules blocks list their facts in order; a worded block stands for all of them.
        used = sources[name] if name in worded else sources[name][: len(kept)]
        plans.append(BlockPlan(name, SEPARATOR.join(kept), tuple(m.id for m in used),
                               mode if name in worded else "rules"))
    return plans, notes


def compiled(
    memories: Sequence[MemoryView], as_of: datetime, config: BlocksConfig,
    summarizer: Summarizer,
) -> tuple[list[BlockPlan], list[str]]:
    """The five blocks of ``memories``: sources by rule, the prose ones worded by the
    summarizer, all fitted to the limits; and the report's notes."""
    sources = block_sources(memories, as_of, config)
    worded = word_blocks(sources, config, summarizer)
    plans, notes = plan_blocks(sources, config, worded, summarizer.mode)
    return plans, fallback_notes(summarizer) + notes


def compile_blocks(store: Store, args: StepArgs) -> StepReport:
    """Recompile the profile's five blocks; a block's version moves when its text does."""
    profile, as_of, config = args.profile, args.as_of, args.config
    with args.reading(store) as tx:
        memories = memories_of(tx)
    summarizer = summarizer_for(config.summarizer)
    while True:
        plans, notes = compiled(memories, as_of, config.blocks, summarizer)
        with args.writing(store) as tx:
            quoted = sorted({mid for p in plans for mid in p.source_ids})
            # Read again as they stand now: one an ingest changed since the run took the
            # profile is beyond its horizon, and one released or undone since is gone.
            stale = set(quoted) - {m.id for m in memories_of(tx, ids_=quoted) if m.is_live}
            if not stale:
                changed = set(upsert_blocks(tx, plans, as_of))
                break
        # A block would state what a memory said before an ingest changed it, or quote a
        # summary an ingest or an operator took away (``blocks.requote`` took it out):
        # compiled again without it (it waits for the next run), as a read now would give
        # the blocks. Each turn leaves out at least one.
        memories = [m for m in memories if m.id not in stale]
    report = StepReport("compile_blocks", profile, examined=len(memories), notes=notes)
    for plan in plans:
        if plan.block_type in changed:
            report.record(
                Change(
                    "compiled", plan.block_type,
                    f"{len(plan.content)} chars from {len(plan.source_ids)} memories "
                    f"({plan.mode})",
                    preview(plan.content),
                )
            )
    report.facts = {
        "chars": {p.block_type: len(p.content) for p in plans},
        "total_chars": sum(len(p.content) for p in plans),
    }
    return report


compile_blocks_task = step_task("compile_blocks", compile_blocks)
