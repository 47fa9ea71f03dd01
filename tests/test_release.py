"""An ingest that gives a memory new words releases what consolidated it
(``summaries.release``): no summary goes on saying the memory's old words, no
supersession stands on words the memory no longer holds, and the next run decides
again, since a release, unlike an operator's undo, vetoes nothing."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from reverie.deployments import operations as ops
from reverie.deployments.auth import Principal
from reverie.deployments.cli import EXIT_OK, main
from reverie.models import ids
from reverie.models.backup import backup_lines, plan_restore
from reverie.models.config import ConsolidationConfig, DedupConfig
from reverie.models.errors import NotFoundError
from reverie.models.repositories import audit
from reverie.models.repositories import memories as memories_repo
from reverie.models.repositories.summaries import undone_summaries, undone_supersessions
from reverie.models.store import Store
from reverie.models.tables import Operation, Origin, Tier
from reverie.tasks.dedup import dedup
from reverie.tasks.step import StepArgs

from factories import at_cosine, get_memory, in_read, ingest_records, undo_consolidation

AS_OF = datetime(2026, 7, 1)
SLOW = ["the deploy pipeline is slow", "the deploy pipeline is slow again",
        "our deploy pipeline is slow"]
LATER_SLOW = ["the deploy pipeline felt slow", "deploy pipeline slow today"]
RENT_900 = "The user's rent is 900 euros a month. The user plays the cello in an orchestra."
RENT_1000 = "User now pays 1000 euros of rent every month."


def record(ident: str, content: str, cos: float, days: int, **fields: Any) -> dict[str, Any]:
    """A memory ``days`` before AS_OF, at cosine ``cos`` to axis 0 (its own other axis)."""
    return {"id": ident, "content": content,
            "created_at": (AS_OF - timedelta(days=days)).isoformat(),
            "embedding": at_cosine(cos, other=1 + sum(map(ord, ident)) % 383).tolist(), **fields}


def slow(n: int = 3) -> list[dict[str, Any]]:
    return [record(f"m{k}", SLOW[k], (0.99, 0.985, 0.98)[k], 30 - 10 * k) for k in range(n)]


def run_dedup(store: Store, profile: str = "p", config: ConsolidationConfig | None = None,
              as_of: datetime = AS_OF) -> None:
    dedup(store, StepArgs(store.url, profile, as_of, config or ConsolidationConfig()))


def decisions(store: Store, profile: str = "p") -> dict[str, Any]:
    return {c.id: c for c in in_read(store, profile, audit.consolidations, limit=None)}


def standing(store: Store, profile: str = "p") -> dict[str, Any]:
    return {cid: c for cid, c in decisions(store, profile).items() if c.undone_at is None}


def hot(store: Store, profile: str = "p") -> dict[str, str]:
    """The hot memories: external id (or id) -> content."""
    return {m.external_id or m.id: m.content
            for m in in_read(store, profile, memories_repo.memories, tiers=(Tier.HOT,))}


def merged(store: Store) -> Any:
    """m0, m1 and m2 merged into one summary: its decision."""
    assert not ingest_records(store, slow(), profile="p").errors
    run_dedup(store)
    (decision,) = standing(store).values()
    assert decision.operation == Operation.DEDUP and len(decision.member_ids) == 3
    return decision


def test_new_words_for_a_merged_memory_release_its_merge(store: Store) -> None:
    decision = merged(store)
    report = ingest_records(store, [record("m1", "the deploy pipeline is fast now", 0.985, 20)],
                            profile="p")
    assert (report.updated, report.released) == (1, [decision.id])

    # Every member stands on its own again, m1 with its new words; the summary is gone.
    assert hot(store) == {"m0": SLOW[0], "m1": "the deploy pipeline is fast now",
                          "m2": SLOW[2]}
    for ident in ("m0", "m1", "m2"):
        assert get_memory(store, ident, "p").superseded_by is None
    with pytest.raises(NotFoundError):
        get_memory(store, decision.summary_id, "p")
    # The decision is kept, undone and marked, under another id: its own is free.
    (released,) = decisions(store).values()
    assert released.id == audit.released_id(decision.id, 2)
    assert released.undone_at is not None
    assert released.parameters["released"] == {"by": "ingest", "ingest": 2}
    assert released.parameters["undone_summary"]["content"] == decision_text(store, released)
    # No veto: no later run is kept from merging these memories.
    assert in_read(store, "p", undone_summaries) == set()
    # What the undo restored waits for the next run, as the ingest's own rows do.
    assert {get_memory(store, k, "p").ingest_seq for k in ("m0", "m1", "m2")} == {2}


def decision_text(store: Store, decision: Any) -> str:
    return in_read(store, "p", audit.summary_texts, [decision])[decision.id]


def test_the_same_words_or_new_metadata_release_nothing(store: Store) -> None:
    decision = merged(store)
    again = ingest_records(store, slow(), profile="p")
    assert (again.unchanged, again.released) == (3, [])
    retagged = ingest_records(store, [record("m1", SLOW[1], 0.985, 20, importance=0.9)],
                              profile="p")
    assert (retagged.updated, retagged.released) == (1, [])
    assert list(standing(store)) == [decision.id]
    assert get_memory(store, "m1", "p").tier == Tier.COLD


def test_a_release_is_no_veto_and_an_operators_undo_still_is(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    decision = merged(store)
    ingest_records(store, [record("m1", "the deploy pipeline is fast now", 0.985, 20)],
                   profile="p")
    # The same words again, and the next run merges the same memories under the same id.
    ingest_records(store, slow(), profile="p")
    run_dedup(store)
    assert list(standing(store)) == [decision.id]
    assert set(hot(store)) == {decision.summary_id}

    assert main(["consolidations", "--profile", "p"]) == EXIT_OK
    listing = capsys.readouterr().out
    assert f"{audit.released_id(decision.id, 2)}  " in listing
    assert "[released by an ingest " in listing and "[undone " not in listing

    # By its summary's id, the standing decision is meant; the released one by its own.
    result = undo_consolidation(store, decision.summary_id, "p", at=AS_OF)
    assert (result.consolidation_id, result.already_undone) == (decision.id, False)
    assert undo_consolidation(store, decision.id, "p", at=AS_OF).already_undone
    # An operator's undo is a veto: the next run leaves the three apart.
    assert in_read(store, "p", undone_summaries) == {decision.summary_id}
    run_dedup(store)
    assert hot(store) == {f"m{k}": SLOW[k] for k in range(3)}


def test_a_merge_taken_in_by_a_later_one_is_released_from_the_top(store: Store) -> None:
    first = merged(store)
    assert not ingest_records(store, [record("m3", LATER_SLOW[0], 0.99, 5),
                                      record("m4", LATER_SLOW[1], 0.985, 4)],
                              profile="p").errors
    run_dedup(store)
    (second,) = (c for cid, c in standing(store).items() if cid != first.id)
    assert first.summary_id in second.parameters["absorbed"]

    report = ingest_records(store, [record("m0", "the deploy pipeline is fast now", 0.99, 30)],
                            profile="p")
    # The later merge first (the earlier one's summary was in it), then the earlier.
    assert report.released == [second.id, first.id]
    assert standing(store) == {}
    assert hot(store) == {"m0": "the deploy pipeline is fast now", "m1": SLOW[1],
                          "m2": SLOW[2], "m3": LATER_SLOW[0], "m4": LATER_SLOW[1]}
    # Nothing derived is left, hot or cold.
    assert {m.origin for m in in_read(store, "p", memories_repo.memories,
                                      tiers=(Tier.HOT, Tier.COLD))} == {Origin.INGESTED}


def rent(store: Store) -> Any:
    """An older rent (with a second fact) superseded by the newest: the decision."""
    assert not ingest_records(store, [record("old", RENT_900, 0.6, 90),
                                      record("new", RENT_1000, 1.0, 10)],
                              profile="p").errors
    run_dedup(store)
    (decision,) = (c for c in standing(store).values() if c.operation == Operation.SUPERSEDE)
    assert decision.parameters["restated"]
    return decision


def test_new_words_for_the_newest_give_the_older_value_back(store: Store) -> None:
    decision = rent(store)
    report = ingest_records(store, [record("new", "The user pays 40 euros a month for the gym",
                                           1.0, 10)], profile="p")
    # The supersession and the restatement written with it.
    (restated,) = decision.parameters["restated"]
    assert set(report.released) == {decision.id, ids.consolidation_id(
        "p", Operation.RESTATE, restated)} and report.released[-1] == decision.id
    assert hot(store) == {"old": RENT_900, "new": "The user pays 40 euros a month for the gym"}
    assert standing(store) == {}
    assert in_read(store, "p", undone_supersessions) == set()
    # The listing keeps the words the supersession stood on.
    released = decisions(store)[audit.released_id(decision.id, 2)]
    assert decision_text(store, released) == RENT_1000
    # The next run finds no update left to make.
    run_dedup(store)
    assert standing(store) == {}


def test_new_words_for_an_outdated_memory_release_what_judged_it(store: Store) -> None:
    decision = rent(store)
    ingest_records(store, [record("old", "The user plays the viola in a quartet.", 0.6, 90)],
                   profile="p")
    assert standing(store) == {}
    assert hot(store) == {"old": "The user plays the viola in a quartet.", "new": RENT_1000}
    assert decision.id not in decisions(store)


def test_a_store_call_releases_as_an_ingest_does(store: Store) -> None:
    decision = merged(store)
    answer = ops.store_memories(store, Principal(frozenset({"p"})), "p", [
        record("m2", "our deploy pipeline is fast now", 0.98, 10)])
    assert (answer["updated"], answer["released"]) == (1, [decision.id])
    assert standing(store) == {}
    assert get_memory(store, "m2", "p").tier == Tier.HOT


def test_a_store_calls_answer_names_every_memory_it_accepted(store: Store) -> None:
    """New, updated or unchanged, each accepted record's memory once, in the call's
    order: an agent that stores an update learns the id it updated."""
    assert not ingest_records(store, slow(2), profile="p").errors
    first, second = slow(2)
    answer = ops.store_memories(store, Principal(frozenset({"p"})), "p", [
        record("fresh", "the canary stage takes an hour", 0.2, 1),
        first,
        {"content": ""},
        {**second, "content": "the deploy pipeline is fast now"},
        first,
    ])
    assert (answer["stored"], answer["updated"], answer["unchanged"]) == (1, 1, 1)
    assert [r["record"] for r in answer["rejected"]] == ["record 3"]
    assert answer["ids"] == [ids.memory_id_for_external("p", e) for e in ("fresh", "m0", "m1")]
    assert answer["released"] == []


# --- an update of a merge's member, and what stands on it -------------------------------

LOCK = ["The user's bike lock code is 4812.", "The user's bike lock code is 4812 now.",
        "The user has a sturdy bike lock."]
NEW_CODE = "The user's bike lock code is 7730."
# A run that searched no updates (both radii at 1.0): it merged the three.
BLIND = ConsolidationConfig(dedup=DedupConfig(supersede_similarity=1.0,
                                              supersede_frame_similarity=1.0))


def lock_updated(store: Store) -> dict[str, Any]:
    """The three lock memories merged (D), then the new code: the next run outdates the
    two stale members (the update, U) and restates the merge for the third (R, a merge
    of its own that absorbs D's summary). The decisions, by letter."""
    assert not ingest_records(store, [record(f"a{k}", text, (0.99, 0.985, 0.98)[k], 300 - k)
                                      for k, text in enumerate(LOCK)], profile="p").errors
    run_dedup(store, config=BLIND, as_of=AS_OF - timedelta(days=50))
    (merge,) = standing(store).values()
    assert not ingest_records(store, [record("n", NEW_CODE, 0.97, 10)], profile="p").errors
    run_dedup(store)
    (update,) = (c for c in standing(store).values() if c.operation == Operation.SUPERSEDE)
    (restated,) = update.parameters["restated"]
    (again,) = (c for c in standing(store).values() if c.summary_id == restated)
    assert again.operation == Operation.DEDUP and merge.summary_id in again.parameters[
        "absorbed"]
    return {"D": merge, "U": update, "R": again}


def test_new_words_for_the_newest_bring_back_the_merge_it_outdated(store: Store) -> None:
    """The restated merge is no RESTATE decision: it is found by its summary's id and
    released (not left undone as an operator's veto), then the update."""
    made = lock_updated(store)
    report = ingest_records(store, [record("n", "The user pays 40 euros for the gym.", 0.97,
                                           10)], profile="p")
    assert report.released == [made["R"].id, made["U"].id]
    assert list(standing(store)) == [made["D"].id]  # the merge stands as it was made
    assert {get_memory(store, f"a{k}", "p").superseded_by for k in range(3)} == {
        made["D"].summary_id}
    assert in_read(store, "p", undone_summaries) == set()
    assert in_read(store, "p", undone_supersessions) == set()


def test_new_words_for_the_restated_member_release_the_update_standing_on_its_merge(
        store: Store) -> None:
    """Undone alone, the first merge would put its stale members back hot under an
    update still standing: the update goes first, and the next run makes it again."""
    made = lock_updated(store)
    report = ingest_records(store, [record("a2", "The user has a flimsy bike lock.", 0.98,
                                           298)], profile="p")
    assert report.released == [made["R"].id, made["U"].id, made["D"].id]
    assert standing(store) == {}
    assert hot(store) == {"a0": LOCK[0], "a1": LOCK[1], "a2": "The user has a flimsy bike lock.",
                          "n": NEW_CODE}
    # Every pointer names a memory the backup holds.
    plan_restore(list(backup_lines(store.url, "p")))  # refused otherwise
    run_dedup(store, as_of=AS_OF + timedelta(days=1))
    assert made["U"].id in standing(store)
    assert set(hot(store)) == {"a2", "n"}


def test_a_restated_merge_taken_in_by_a_later_one_is_released_first(store: Store) -> None:
    """Before, the release undid the restated merge while a later merge held it, and
    the refusal failed the whole ingest."""
    made = lock_updated(store)
    # Embedded by the model, as the restated merge's summary was.
    assert not ingest_records(store, [
        {"id": "a3", "content": LOCK[2], "created_at": AS_OF.isoformat()},
        {"id": "a4", "content": "The user owns a very sturdy bike lock.",
         "created_at": AS_OF.isoformat()}], profile="p").errors
    run_dedup(store, as_of=AS_OF + timedelta(days=1))
    (later,) = (c for c in standing(store).values()
                if made["R"].summary_id in c.parameters.get("absorbed", []))
    report = ingest_records(store, [record("n", "The user pays 40 euros for the gym.", 0.97,
                                           10)], profile="p")
    assert report.released == [later.id, made["R"].id, made["U"].id]
    assert list(standing(store)) == [made["D"].id]
    assert set(hot(store)) == {made["D"].summary_id, "a3", "a4", "n"}
