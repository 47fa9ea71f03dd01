"""Core Memory never says what its memories no longer say (``blocks.requote``): an
ingest that gives a quoted memory new words, ends it, or releases a quoted summary, and
an operator's undo of one, change the blocks in the same transaction. Before, the blocks
kept the old words until the next compile, and an agent's ``session_init`` read them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from test_release import AS_OF, SLOW, merged, record

from reverie.deployments import operations as ops
from reverie.deployments.auth import Principal
from reverie.models.block_text import SEPARATOR
from reverie.models.config import ConsolidationConfig
from reverie.models.records import BlockPlan
from reverie.models.repositories.blocks import blocks as blocks_of
from reverie.models.repositories.blocks import upsert_blocks
from reverie.models.store import Store
from reverie.tasks.blocks import USER_PROFILE, compile_blocks
from reverie.tasks.step import StepArgs

from factories import get_memory, in_read, in_write, ingest_records, undo_consolidation

FACTS = ["Ana keeps bees in her garden in Lyon",
         "Ana's favourite tea is a smoky lapsang souchong",
         "Ana plays the cello in an amateur orchestra"]


def facts(n: int = 3, **fields: Any) -> list[dict[str, Any]]:
    """Semantic facts, each on its own axis, m0 the most important (first in the block)."""
    return [record(f"m{k}", FACTS[k], 0.1, 30 - k, kind="semantic",
                   importance=0.9 - k / 10, **fields) for k in range(n)]


def compile_(store: Store, as_of: datetime = AS_OF) -> None:
    compile_blocks(store, StepArgs(store.url, "p", as_of, ConsolidationConfig()))


def ids(store: Store, *external: str, profile: str = "p") -> list[str]:
    return [get_memory(store, e, profile).id for e in external]


def block(store: Store, block_type: str = USER_PROFILE) -> Any:
    (found,) = [b for b in in_read(store, "p", blocks_of) if b.block_type == block_type]
    return found


def test_new_words_for_a_quoted_memory_are_in_the_block_at_once(store: Store) -> None:
    ingest_records(store, facts(), profile="p")
    compile_(store)
    before = block(store)
    assert before.content == SEPARATOR.join(FACTS) and before.source_ids == ids(store, "m0", "m1", "m2")

    new = "Ana switched to green tea"
    assert ingest_records(store, [record("m1", new, 0.1, 29, kind="semantic")],
                          profile="p").updated == 1
    after = block(store)
    assert after.content == SEPARATOR.join([FACTS[0], new, FACTS[2]])
    assert (after.source_ids, after.version, after.mode) == (ids(store, "m0", "m1", "m2"), 2, "rules")
    # What the agent reads at session start, the same call as over HTTP and MCP.
    read = ops.session_init(store, Principal(frozenset({"p"})), "p")
    assert [b["content"] for b in read["blocks"]] == [after.content]
    # The next compile says the same: nothing was left for it to mend.
    compile_(store)
    assert block(store).content == after.content


def test_words_that_no_longer_fit_push_the_last_facts_out(store: Store) -> None:
    ingest_records(store, facts(), profile="p")
    compile_(store)
    compiled = len(block(store).content)
    longer = "Ana switched to green tea,   sencha in the morning"
    ingest_records(store, [record("m0", longer, 0.1, 30, kind="semantic")], profile="p")
    after = block(store)
    # Never longer than compiled: both of the compile's limits still hold.
    assert len(after.content) <= compiled
    assert after.content.split(SEPARATOR) == [" ".join(longer.split()), FACTS[1]]
    assert after.source_ids == ids(store, "m0", "m1")


def test_a_fact_that_ended_leaves_the_block(store: Store) -> None:
    ingest_records(store, facts(), profile="p")
    compile_(store)
    # Ended a day ago, after the compile's date: no longer true now.
    ended = (datetime.now() - timedelta(days=1)).isoformat()
    ingest_records(store, [record("m2", FACTS[2], 0.1, 28, kind="semantic",
                                  valid_until=ended)], profile="p")
    after = block(store)
    assert after.content == SEPARATOR.join(FACTS[:2]) and after.source_ids == ids(store, "m0", "m1")


def test_a_released_summary_leaves_the_block(store: Store) -> None:
    decision = merged(store)
    compile_(store)
    episodic = [b for b in in_read(store, "p", blocks_of) if decision.summary_id in b.source_ids]
    assert episodic, "the merge's summary is quoted"
    report = ingest_records(store, [record("m1", "the deploy pipeline is fast now", 0.985, 20)],
                            profile="p")
    assert report.released == [decision.id]
    for b in in_read(store, "p", blocks_of):
        assert decision.summary_id not in b.source_ids
        assert not any(slow in b.content for slow in SLOW)
    # The next run quotes the memories as they stand now.
    compile_(store)
    assert any("fast now" in b.content for b in in_read(store, "p", blocks_of))


def test_an_operators_undo_takes_its_summary_out_of_the_blocks(store: Store) -> None:
    decision = merged(store)
    compile_(store)
    undo_consolidation(store, decision.id, "p")
    quoted = {mid for b in in_read(store, "p", blocks_of) for mid in b.source_ids}
    assert decision.summary_id not in quoted


def test_a_worded_block_becomes_the_list_of_its_facts_still_true(store: Store) -> None:
    ingest_records(store, facts(), profile="p")
    worded = "Ana, a beekeeper in Lyon who plays the cello, drinks smoky lapsang souchong." * 3
    in_write(store, "p", upsert_blocks,
             [BlockPlan(USER_PROFILE, worded, tuple(ids(store, "m0", "m1", "m2")), "llm")], AS_OF)
    ingest_records(store, [record("m1", "Ana switched to green tea", 0.1, 29,
                                  kind="semantic")], profile="p")
    after = block(store)
    # The worded text stood for every fact, the stale one too: the rules list them now,
    # within the worded text's length, until the next compile words them again.
    assert after.mode == "rules" and len(after.content) <= len(worded)
    assert after.content == SEPARATOR.join([FACTS[0], "Ana switched to green tea", FACTS[2]])
    assert after.version == 2


def test_what_a_block_does_not_quote_leaves_it_alone(store: Store) -> None:
    ingest_records(store, facts(), profile="p")
    compile_(store)
    before = block(store)
    # New memories, the same words again, and new metadata of a quoted memory.
    ingest_records(store, [*facts(), record("m9", "Ana visited Porto", 0.1, 1)], profile="p")
    ingest_records(store, [record("m0", FACTS[0], 0.1, 30, kind="semantic", importance=0.2)],
                   profile="p")
    after = block(store)
    assert (after.content, after.source_ids, after.version) == (
        before.content, before.source_ids, before.version)


def test_another_profiles_blocks_are_never_touched(store: Store) -> None:
    for profile in ("p", "q"):
        ingest_records(store, facts(), profile=profile)
        compile_blocks(store, StepArgs(store.url, profile, AS_OF, ConsolidationConfig()))
    ingest_records(store, [record("m1", "Ana switched to green tea", 0.1, 29,
                                  kind="semantic")], profile="p")
    (other,) = [b for b in in_read(store, "q", blocks_of) if b.block_type == USER_PROFILE]
    assert other.content == SEPARATOR.join(FACTS) and other.version == 1


def test_a_run_compiling_while_an_ingest_releases_a_summary_does_not_quote_it_again(
    store: Store, monkeypatch: Any
) -> None:
    """The compile reads the profile, words the blocks (an LLM may take seconds), then
    writes: a summary released in between must not come back into Core Memory."""
    import reverie.tasks.blocks as blocks_step

    decision = merged(store)
    real = blocks_step.compiled
    calls = []

    def released_meanwhile(*args: Any, **kwargs: Any) -> Any:
        planned = real(*args, **kwargs)
        if not calls:
            report = ingest_records(store, [record("m1", "the deploy pipeline is fast now",
                                                   0.985, 20)], profile="p")
            assert report.released == [decision.id]
        calls.append(planned)
        return planned

    monkeypatch.setattr(blocks_step, "compiled", released_meanwhile)
    compile_(store)
    assert any(decision.summary_id in p.source_ids for p in calls[0][0])
    for b in in_read(store, "p", blocks_of):
        assert decision.summary_id not in b.source_ids
    assert len(calls) == 2  # compiled again without it
