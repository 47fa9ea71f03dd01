"""Properties over generated stores: the invariants hold whatever the store holds.

Each example is a store of two profiles with a few to a dozen memories each: kinds,
entities and layers from small pools (so that cold consolidation finds notes), ages
up to two years (so that decay, compression and promotion find work), vectors in a few
near-duplicate directions (so that dedup and clustering group them; no embedding model
is needed to ingest), and links between them. Then every step runs for one profile:

- nothing is lost: every memory ingested is still there, hot or cold, with its words;
- the other profile is untouched, and no consolidation names a memory of another;
- each flow run again at the same ``as_of`` changes nothing;
- undoing every consolidation brings back exactly the memories ingested, in the tiers
  they had, and removes every summary;
- a dry run of the whole full-consolidation flow writes nothing (run through Prefect).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reverie.models.backup import backup_lines, plan_restore
from reverie.models.block_text import ELLIPSIS, SEPARATOR, fact_text
from reverie.models.config import ConsolidationConfig, DedupConfig
from reverie.models.errors import StoreError
from reverie.models.export import export_jsonl
from reverie.models.repositories import audit as audit_repo
from reverie.models.repositories import memories as memories_repo
from reverie.models.repositories.audit import UNDOABLE
from reverie.models.repositories.blocks import blocks as blocks_of
from reverie.models.repositories.summaries import undone_summaries, undone_supersessions
from reverie.models.store import Store
from reverie.models.tables import Operation, Origin, Tier
from reverie.tasks.blocks import compile_blocks
from reverie.tasks.cluster import cluster
from reverie.tasks.cold_notes import consolidate_cold
from reverie.tasks.compress import compress_fading
from reverie.tasks.decay import decay
from reverie.tasks.dedup import dedup, dedup_new_summaries
from reverie.tasks.edge_decay import decay_edges
from reverie.tasks.importance import graph_importance
from reverie.tasks.linking import link_summaries
from reverie.tasks.promote import promote
from reverie.tasks.step import StepArgs

from factories import at_cosine, in_read, ingest_records, run_history, undo_consolidation
from test_ingest_properties import CONFIG, run_steps

AS_OF = datetime(2026, 1, 1)
PROFILES = ("ada", "bo")
DIRECTIONS = [at_cosine(c, base=0, other=1).tolist() for c in (0.99, 0.985, 0.98)] + [
    at_cosine(c, base=2, other=3).tolist() for c in (0.99, 0.97)] + [
    at_cosine(0.2, base=4, other=5).tolist()]
KINDS = ["semantic", "episodic", "decision", "preference", "pattern", "insight"]
ENTITIES = [None, "billing", "onboarding"]
LAYERS = [None, "implementation", "context", "emotion"]
# The steps of each flow, in the order the flow runs them.
FLOWS_STEPS = (
    (decay,),
    (dedup, compress_fading, dedup_new_summaries, decay_edges, promote, compile_blocks,
     link_summaries, graph_importance),
    (cluster,),
    (consolidate_cold,),
)
# Each example is a new store (on PostgreSQL, a new database): a few dozen are plenty.
SETTINGS = settings(
    max_examples=40, deadline=None, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large])


@st.composite
def memory(draw: st.DrawFn, n: int) -> dict[str, Any]:
    age = draw(st.integers(0, 730))
    used = draw(st.integers(0, 6))
    return {
        "id": f"m{n}",
        "content": f"Memory {n}: {draw(st.sampled_from(['the retry policy', 'the deploy', 'a lunch', 'the schema']))}",
        "embedding": draw(st.sampled_from(DIRECTIONS)),
        "kind": draw(st.sampled_from(KINDS)),
        "entity": draw(st.sampled_from(ENTITIES)),
        "layer": draw(st.sampled_from(LAYERS)),
        "importance": draw(st.sampled_from([0.1, 0.5, 0.9])),
        "confidence": draw(st.sampled_from([0.3, 0.8])),
        "access_count": used,
        "protected": draw(st.booleans()),
        "created_at": (AS_OF - timedelta(days=age)).isoformat(),
        "last_accessed_at": (AS_OF - timedelta(days=draw(st.integers(0, age)))).isoformat()
        if used else None,
    }


@st.composite
def profile_records(draw: st.DrawFn) -> list[dict[str, Any]]:
    size = draw(st.integers(3, 12))
    memories = [draw(memory(n)) for n in range(size)]
    edges = [
        {"type": "edge", "source": f"m{a}", "target": f"m{b}",
         "weight": draw(st.sampled_from([0.3, 0.9]))}
        for a, b in draw(st.sets(st.tuples(st.integers(0, size - 1), st.integers(0, size - 1))
                                 .filter(lambda p: p[0] != p[1]), max_size=size))
    ]
    return [*memories, *edges]


stores = st.fixed_dictionaries({p: profile_records() for p in PROFILES})
_names = itertools.count()


def _ingested(new_store: Callable[[str], Store], records: dict[str, list[dict[str, Any]]]
              ) -> Store:
    store = new_store(f"inv{next(_names)}")
    for profile, rows in records.items():
        report = ingest_records(store, rows, profile=profile)
        assert not report.errors, report.errors
    return store


def _memories(store: Store, profile: str) -> dict[str, dict[str, Any]]:
    return {m.external_id or m.id: {"id": m.id, "content": m.content, "tier": m.tier,
                                    "origin": m.origin}
            for m in in_read(store, profile, memories_repo.memories, tiers=(Tier.HOT, Tier.COLD))}


def _undo_everything(store: Store, profile: str) -> None:
    """Undo every undoable consolidation, newest first; one whose summary a later one
    absorbed waits for that one (the store says so), as an operator would."""
    left = [c.id for c in in_read(store, profile, audit_repo.consolidations, limit=10_000)
            if c.operation in UNDOABLE and c.undone_at is None]
    while left:
        waiting = []
        for ident in left:
            try:
                undo_consolidation(store, ident, profile, at=AS_OF)
            except StoreError as exc:
                assert "first" in str(exc), str(exc)
                waiting.append(ident)
        assert len(waiting) < len(left), f"undo is stuck on {waiting}"
        left = waiting


@SETTINGS
@given(records=stores)
def test_steps_lose_nothing_touch_no_other_profile_and_repeat_to_nothing(
    new_store: Callable[[str], Store], records: dict[str, list[dict[str, Any]]]
) -> None:
    store = _ingested(new_store, records)
    ada, bo = PROFILES
    before = _memories(store, ada)
    other_before = export_jsonl(store.url, bo)

    run_steps(store, ada, AS_OF)

    after = _memories(store, ada)
    for external, row in before.items():  # nothing lost, words unchanged
        assert external in after, f"{external} is gone"
        assert after[external]["content"] == row["content"]
    assert export_jsonl(store.url, bo) == other_before  # the other profile is untouched
    own = {row["id"] for row in after.values()}
    for c in in_read(store, ada, audit_repo.consolidations, limit=10_000):
        named = set(c.member_ids or []) | ({c.summary_id} if c.summary_id else set())
        assert named <= own, f"{c.id} names memories of another profile"

    # Each flow's steps, run again at once, change nothing. (Different flows feed one
    # another: a meta-memory that clustering adds is new input for the next full
    # consolidation's graph scores; and decay scores the summaries made after it ran.)
    for flow in FLOWS_STEPS:
        for step in flow:
            step(store, StepArgs(store.url, ada, AS_OF, CONFIG))
        once = export_jsonl(store.url, ada)
        for step in flow:
            step(store, StepArgs(store.url, ada, AS_OF, CONFIG))
        assert export_jsonl(store.url, ada) == once, [s.__name__ for s in flow]


@SETTINGS
@given(records=stores)
def test_undoing_every_consolidation_brings_back_exactly_what_was_ingested(
    new_store: Callable[[str], Store], records: dict[str, list[dict[str, Any]]]
) -> None:
    store = _ingested(new_store, records)
    ada = PROFILES[0]
    before = _memories(store, ada)
    run_steps(store, ada, AS_OF)
    _undo_everything(store, ada)
    restored = {k: v for k, v in _memories(store, ada).items()}
    assert {k for k, v in restored.items() if v["origin"] != Origin.INGESTED} == set()
    assert {k: (v["content"], v["tier"]) for k, v in restored.items()} == {
        k: (v["content"], v["tier"]) for k, v in before.items()}
    assert all(v["tier"] == Tier.HOT for v in before.values())


def _blocks_say_what_is_true(store: Store, profile: str) -> None:
    """Every block quotes live memories only, and a rules block each one's words as
    they are now (its last fact may be cut at a word)."""
    live = {m.id: m for m in in_read(store, profile, memories_repo.memories) if m.is_live}
    for block in in_read(store, profile, blocks_of):
        assert set(block.source_ids) <= set(live), (block.block_type, block.source_ids)
        if block.mode != "rules":
            continue
        facts = block.content.split(SEPARATOR) if block.content else []
        assert len(facts) == len(block.source_ids), block.block_type
        for fact, mid in zip(facts, block.source_ids, strict=True):
            whole = fact_text(live[mid].content)
            assert fact == whole or (fact.endswith(ELLIPSIS) and whole.startswith(fact[:-1])), (
                block.block_type, fact, whole)


@SETTINGS
@given(records=stores, picks=st.sets(st.integers(0, 11), min_size=1))
def test_new_words_release_every_consolidation_that_held_them_and_lose_nothing(
    new_store: Callable[[str], Store], records: dict[str, list[dict[str, Any]]],
    picks: set[int],
) -> None:
    """Whatever the steps made of them, memories given new words stand on their own:
    nothing holds them, nothing hot still says their old words, nothing is lost; the
    other profile is untouched; the next run consolidates them anew, and undoing all
    it and the first run left standing brings back exactly what is stored now."""
    store = _ingested(new_store, records)
    ada, bo = PROFILES
    run_steps(store, ada, AS_OF)
    other_before = export_jsonl(store.url, bo)
    mine = [r for r in records[ada] if r.get("type") != "edge"]
    changed = [mine[i] for i in sorted({i % len(mine) for i in picks})]
    rewritten = [{**r, "content": f"{r['content']}, said anew"} for r in changed]
    report = ingest_records(store, rewritten, profile=ada)
    assert not report.errors and report.updated == len(rewritten)

    after = _memories(store, ada)
    expected = {r["id"]: r["content"] for r in mine} | {r["id"]: r["content"] for r in rewritten}
    assert {k: v["content"] for k, v in after.items()  # nothing lost, the new words kept
            if v["origin"] == Origin.INGESTED} == expected
    moved_by = {m.id: m.superseded_by for m in in_read(
        store, ada, memories_repo.memories, tiers=(Tier.HOT, Tier.COLD))}
    held = {after[r["id"]]["id"] for r in rewritten}
    for c in in_read(store, ada, audit_repo.consolidations, limit=10_000):
        if c.undone_at is None and c.operation in UNDOABLE:
            prior = set((c.parameters or {}).get("prior") or {})
            holds = {mid for mid in prior & held if moved_by[mid] == c.summary_id}
            assert not holds, f"{c.id} still holds {holds}"
            assert not (c.operation == Operation.SUPERSEDE and c.summary_id in held), c.id
    for row in after.values():  # no summary left saying the old words
        if row["tier"] == Tier.HOT and row["origin"] != Origin.INGESTED:
            stale = [r["content"] for r in changed
                     if r["content"] in row["content"].replace(f"{r['content']}, said anew", "")]
            assert not stale, (row, stale)
    _blocks_say_what_is_true(store, ada)
    assert export_jsonl(store.url, bo) == other_before

    run_steps(store, ada, AS_OF)
    now = _memories(store, ada)
    _undo_everything(store, ada)
    restored = _memories(store, ada)
    assert {k for k, v in restored.items() if v["origin"] != Origin.INGESTED} == set()
    assert {k: v["content"] for k, v in restored.items()} == {
        k: v["content"] for k, v in now.items() if v["origin"] == Origin.INGESTED}


# Values of facts, so that updates find work: a merge of one value made by a run that
# searched no updates, then a newer value (the stale-summary supersession, restating
# the merge for its other members), then new words for any of them.
FACTS = [("The user's bike lock code is {}.", ("4812", "7730", "1234")),
         ("The user's locker number is {} now.", ("12", "31"))]
PLAIN = ["The user has a sturdy bike lock.", "The user likes the gym by the river."]
BLIND = ConsolidationConfig(summarizer="rules", dedup=DedupConfig(
    supersede_similarity=1.0, supersede_frame_similarity=1.0))


@st.composite
def stated(draw: st.DrawFn, n: int, days: tuple[int, int]) -> dict[str, Any]:
    fact = draw(st.integers(-1, len(FACTS) - 1))
    if fact < 0:
        content, base = draw(st.sampled_from(PLAIN)) + f" ({n})", 2
    else:
        template, values = FACTS[fact]
        content, base = template.format(draw(st.sampled_from(values))), 0
    return {"id": f"v{n}", "content": content, "kind": "semantic",
            "embedding": at_cosine(draw(st.sampled_from([0.99, 0.985, 0.98])), base=base,
                                   other=3 + n).tolist(),
            "created_at": (AS_OF - timedelta(days=draw(st.integers(*days)))).isoformat()}


@st.composite
def two_rounds(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    first = draw(st.integers(3, 7))
    older = [draw(stated(n, (200, 400))) for n in range(first)]
    newer = [draw(stated(n, (0, 100))) for n in range(first, first + draw(st.integers(1, 4)))]
    return older, newer


@SETTINGS
@given(rounds=two_rounds(), other=profile_records(), picks=st.sets(st.integers(0, 11),
                                                                   min_size=1))
def test_new_words_release_merges_and_the_updates_that_restated_them(
    new_store: Callable[[str], Store], rounds: tuple[list[dict[str, Any]], ...],
    other: list[dict[str, Any]], picks: set[int],
) -> None:
    """As the test above, on merges that an update later restated: whatever is given new
    words, the release leaves nothing holding it, loses nothing, touches no other
    profile, and every pointer names a memory the profile's backup holds."""
    older, newer = rounds
    ada, bo = PROFILES
    store = _ingested(new_store, {ada: older, bo: other})
    for step in FLOWS_STEPS[1]:
        step(store, StepArgs(store.url, ada, AS_OF - timedelta(days=150), BLIND))
    assert not ingest_records(store, newer, profile=ada).errors
    run_steps(store, ada, AS_OF)
    other_before = export_jsonl(store.url, bo)
    mine = [*older, *newer]
    changed = [mine[i] for i in sorted({i % len(mine) for i in picks})]
    rewritten = [{**r, "content": f"{r['content']} Said anew."} for r in changed]
    assert not ingest_records(store, rewritten, profile=ada).errors

    after = _memories(store, ada)
    assert {k: v["content"] for k, v in after.items() if v["origin"] == Origin.INGESTED} == {
        r["id"]: r["content"] for r in mine} | {r["id"]: r["content"] for r in rewritten}
    moved_by = {m.id: m.superseded_by for m in in_read(
        store, ada, memories_repo.memories, tiers=(Tier.HOT, Tier.COLD))}
    held = {after[r["id"]]["id"] for r in rewritten}
    for c in in_read(store, ada, audit_repo.consolidations, limit=10_000):
        if c.undone_at is None and c.operation in UNDOABLE:
            holds = {mid for mid in set((c.parameters or {}).get("prior") or {}) & held
                     if moved_by[mid] == c.summary_id}
            assert not holds, f"{c.id} still holds {holds}"
            assert not (c.operation == Operation.SUPERSEDE and c.summary_id in held), c.id
        if c.undone_at is None and c.summary_id is not None:
            # What a standing decision moved cold stays moved (by it, or on since).
            back = {mid for mid in (c.parameters or {}).get("prior") or {}
                    if mid in moved_by and moved_by[mid] is None}
            assert not back, f"{c.id} stands, yet {back} are back"
    # No operator undid anything: a release is no veto.
    assert in_read(store, ada, undone_summaries) == set()
    assert in_read(store, ada, undone_supersessions) == set()
    assert set(moved_by.values()) - {None} <= set(moved_by)  # no pointer to nothing
    plan_restore(list(backup_lines(store.url, ada)))  # refused if a pointer dangles
    _blocks_say_what_is_true(store, ada)
    assert export_jsonl(store.url, bo) == other_before


@pytest.mark.usefixtures("prefect_api")
@settings(SETTINGS, max_examples=8)
@given(records=stores)
def test_a_dry_run_of_full_consolidation_writes_nothing(
    new_store: Callable[[str], Store], records: dict[str, list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from reverie.flows.full_consolidation import full_consolidation

    store = _ingested(new_store, records)
    monkeypatch.setenv("REVERIE_DATABASE_URL", store.url)
    exports = {p: export_jsonl(store.url, p, include_run_ids=True) for p in PROFILES}
    counts = {p: in_read(store, p, memories_repo.counts) for p in PROFILES}
    report = full_consolidation(profile=list(PROFILES), as_of=AS_OF, dry_run=True)
    assert report.dry_run
    assert {p: export_jsonl(store.url, p, include_run_ids=True) for p in PROFILES} == exports
    assert {p: in_read(store, p, memories_repo.counts) for p in PROFILES} == counts
    assert run_history(store, flow="full-consolidation", as_of=AS_OF, limit=None) == []
