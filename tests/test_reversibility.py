"""Compression, cold consolidation and undo, through the flows and the store."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

from reverie.deployments.cli import EXIT_ERROR, EXIT_OK, main
from reverie.flows.cold_notes import consolidate_cold
from reverie.flows.compress import compress
from reverie.flows.decay import decay
from reverie.flows.full_consolidation import full_consolidation
from reverie.models.config import ConsolidationConfig, DedupConfig, ForgetConfig
from reverie.models.errors import NotFoundError
from reverie.models.export import export_rows
from reverie.models.repositories import blocks as blocks_repo
from reverie.models.store import Store
from reverie.models.tables import SUMMARY_ORIGINS, EdgeKind, Origin, Tier
from reverie.recall.search import recall

from factories import (
    AS_OF,
    at_cosine,
    axis,
    embedder_of,
    get_memory,
    in_read,
    ingest_records,
    stored_vector,
    undo_consolidation,
)

pytestmark = pytest.mark.usefixtures("prefect_api")


def iso(days: float) -> str:
    return (AS_OF - timedelta(days=days)).isoformat() + "Z"


def fading(profile: str, first: int, count: int) -> list[dict]:
    """Old, unused, unimportant memories close to axis 0 (so they compress together)."""
    return [
        {"profile": profile, "id": f"f{k}", "content": f"hiked trail number {k} in spring",
         "kind": "episodic", "created_at": iso(300 - k), "importance": 0.1,
         "embedding": at_cosine(0.9, other=1 + k).tolist()}
        for k in range(first, first + count)
    ]


def notes(profile: str) -> list[dict]:
    cold = {"profile": profile, "created_at": iso(40), "importance": 0.1}
    return [
        {**cold, "id": "n1", "content": "billing uses a nightly batch", "entity": "billing",
         "layer": "implementation", "embedding": axis(100).tolist()},
        {**cold, "id": "n2", "content": "billing retries failed charges twice",
         "entity": "billing", "layer": "implementation", "embedding": axis(101).tolist()},
        {**cold, "id": "n3", "content": "felt uneasy about the billing rewrite",
         "entity": "billing", "layer": "emotion", "embedding": axis(102).tolist()},
        {**cold, "id": "g1", "content": "ship billing v2 by June", "entity": "billing",
         "layer": "goal", "embedding": axis(103).tolist()},
        {**cold, "id": "n4", "content": "search index rebuilt weekly", "entity": "search",
         "layer": "implementation", "embedding": axis(104).tolist()},
    ]


@pytest.fixture
def fading_store(store: Store) -> Store:
    assert not ingest_records(store, fading("p", 0, 5) + notes("p") + fading("q", 0, 5)).errors
    decay(profile=None, as_of=AS_OF)
    return store


def memories(store: Store, profile: str = "p") -> dict[str, dict]:
    return {r["id"]: r for r in export_rows(store.url, profile) if r["type"] == "memory"}


def state(store: Store, profile: str = "p") -> list[dict]:
    """The export without the audit trail."""
    return [r for r in export_rows(store.url, profile) if r["type"] != "consolidation"]


def test_compression_replaces_fading_memories_by_a_summary(fading_store: Store) -> None:
    report = compress(profile="p", as_of=AS_OF)
    (step,) = report.steps
    assert step.facts == {"groups": 1, "archived": 5}
    rows = memories(fading_store)
    (summary,) = [m for m in rows.values() if m["origin"] in SUMMARY_ORIGINS]
    originals = [m for m in rows.values() if m["superseded_by"] == summary["id"]]
    assert len(originals) == 5 and all(m["tier"] == Tier.COLD for m in originals)
    first = AS_OF - timedelta(days=300)
    assert summary["content"].startswith(f"{first.day} {first:%B %Y}: hiked trail number 0 in")
    # Fresh: dated when written, its members' dates kept in its metadata.
    assert summary["created_at"].startswith(AS_OF.isoformat())
    assert summary["metadata"]["members_from"] == first.isoformat()
    assert len(summary["metadata"]["member_dates"]) == 5
    assert summary["tier"] == Tier.HOT and summary["embedding_sha256"]
    edges = [r for r in export_rows(fading_store.url, "p") if r["type"] == "edge"]
    assert sorted((e["kind"], e["weight"]) for e in edges) == [(EdgeKind.CONSOLIDATION, 0.8)] * 5
    # The summary has a vector of its own words, not one of its originals', and without
    # the dates that head its days: its members' vectors hold no date either.
    assert summary["content"].endswith("8 September: hiked trail number 4 in spring.")
    gist = " ".join(f"hiked trail number {i} in spring." for i in range(5))
    vector = stored_vector(fading_store, summary["id"])
    words, dated = embedder_of(fading_store).encode([gist, summary["content"]])
    assert float(np.dot(vector, words)) == pytest.approx(1.0, abs=1e-5)
    assert float(np.dot(vector, dated)) < 0.99


def test_deep_recall_finds_originals_and_names_their_summary(fading_store: Store) -> None:
    compress(profile="p", as_of=AS_OF)
    hot = recall(fading_store, "p", "hiked trail number 3", k=20)
    assert all(h.memory.tier == Tier.HOT for h in hot)
    deep = recall(fading_store, "p", "hiked trail number 3", k=20, deep=True)
    cold = [h for h in deep if h.memory.tier == Tier.COLD]
    summary = next(m for m in memories(fading_store).values() if m["origin"] == "compress")
    assert cold and all(h.superseded_by == summary["id"] for h in cold)


def test_compress_then_undo_restores_the_store(fading_store: Store) -> None:
    before = state(fading_store)
    report = compress(profile="p", as_of=AS_OF)
    summary_id = report.steps[0].changes[0].target
    result = undo_consolidation(fading_store, summary_id, "p")
    assert len(result.restored) == 5 and not result.already_undone
    assert state(fading_store) == before
    (audit,) = [r for r in export_rows(fading_store.url, "p") if r["type"] == "consolidation"]
    assert audit["undone_at"] and audit["parameters"]["undone_summary"]["content"].startswith(
        f"{(AS_OF - timedelta(days=300)).day} ")
    # Undoing twice is harmless, and later runs do not redo what was undone.
    assert undo_consolidation(fading_store, result.consolidation_id, "p").already_undone
    again = compress(profile="p", as_of=AS_OF)
    assert again.changed() == 0 and again.steps[0].changes[0].action == "vetoed"
    assert state(fading_store) == before


def test_undo_is_scoped_to_the_profile_named(
    fading_store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    ingest_records(fading_store, [{"id": "x", "content": "another profile's memory"}], profile="other")
    summary_id = compress(profile="p", as_of=AS_OF).steps[0].changes[0].target
    after = state(fading_store)
    consolidation_id = next(
        r["id"] for r in export_rows(fading_store.url, "p") if r["type"] == "consolidation"
    )
    for ident in (summary_id, consolidation_id):
        with pytest.raises(NotFoundError, match="in profile 'other'"):
            undo_consolidation(fading_store, ident, "other")
        assert main(["undo", ident, "--profile", "other"]) == EXIT_ERROR
    with pytest.raises(SystemExit) as refused:  # --profile is required
        main(["undo", summary_id])
    assert refused.value.code == 2
    assert state(fading_store) == after  # nothing was undone
    assert main(["undo", summary_id, "--profile", "p"]) == EXIT_OK
    assert "in p: 5 memories restored" in capsys.readouterr().out


def test_cold_consolidation_then_undo_restores_the_store(fading_store: Store) -> None:
    before = state(fading_store)
    report = consolidate_cold(profile="p", as_of=AS_OF)
    cold_step = report.steps[0]
    assert cold_step.facts == {"groups": 1, "archived": 2}  # billing/implementation only
    rows = memories(fading_store)
    (learning,) = [m for m in rows.values() if m["origin"] == "cold"]
    assert learning["layer"] == "learning" and learning["protected"] and learning["entity"] == "billing"
    assert learning["metadata"]["replaced_ids"] == ["n1", "n2"]
    undo_consolidation(fading_store, learning["id"], "p")
    assert state(fading_store) == before


def test_cold_consolidation_scope_and_min_age(fading_store: Store) -> None:
    report = consolidate_cold(profile="p", as_of=AS_OF, min_age_days=41)
    assert report.steps[0].facts["groups"] == 0
    report = consolidate_cold(profile="p", as_of=AS_OF, scope="session", session_id="nope")
    assert report.steps[0].facts["groups"] == 0


def test_stalled_work_is_marked(store: Store) -> None:
    ingest_records(store, [
        {"id": "t1", "content": "migrate the CI runners", "status": "in_progress",
         "created_at": iso(30), "embedding": axis(1).tolist()},
        {"id": "t2", "content": "write the onboarding doc", "status": "in_progress",
         "created_at": iso(29), "embedding": axis(2).tolist()},
    ], profile="p")
    report = consolidate_cold(profile="p", as_of=AS_OF)
    assert [c.action for c in report.steps[2].changes] == ["stalled"]
    assert get_memory(store, "t1").status == "stalled" and get_memory(store, "t2").status == "in_progress"


def test_the_forget_sweep_follows_the_configured_thresholds(fading_store: Store) -> None:
    config = ConsolidationConfig(forget=ForgetConfig(delete_threshold=0.05))
    # Unapproved, the sweep deletes nothing: deletion needs approval.
    report = consolidate_cold(profile="p", as_of=AS_OF, config=config)
    assert report.steps[1].step == "forget" and report.steps[1].facts.get("deleted", 0) == 0
    report = consolidate_cold(profile="p", as_of=AS_OF, config=config, auto_approve_deletion=True)
    assert report.steps[1].step == "forget" and report.steps[1].facts["deleted"] > 0


def runs(first: int, count: int) -> list[dict]:
    """Fading memories in natural words, so a summary of some (embedded by the model)
    stays similar to the others and is taken into the next compression."""
    return [
        {"id": f"r{k}", "content": f"Sam went running in the park on day {k} of the training plan",
         "kind": "episodic", "created_at": iso(300 - k), "importance": 0.1}
        for k in range(first, first + count)
    ]


def test_a_summary_is_never_compressed_again_over_three_runs(store: Store) -> None:
    """The merge treadmill: a summary dated at its oldest member was born fading and
    absorbed by the next run's group. Dated at its run, it stays as it is."""
    ingest_records(store, runs(1, 9), profile="p")
    days = [AS_OF, AS_OF + timedelta(days=1), AS_OF + timedelta(days=2)]
    for run, as_of in enumerate(days):
        if run == 2:
            ingest_records(store, runs(10, 4), profile="p")
        decay(profile="p", as_of=as_of)
        compress(profile="p", as_of=as_of)
    rows = memories(store)
    summaries = {i: m for i, m in rows.items() if m["origin"] in SUMMARY_ORIGINS}
    assert summaries and all(m["tier"] == Tier.HOT for m in summaries.values())
    assert {m["created_at"][:10] for m in summaries.values()} <= {d.date().isoformat() for d in days}
    for edge in (r for r in export_rows(store.url, "p") if r["type"] == "edge"):
        assert rows[edge["target_id"]]["origin"] == Origin.INGESTED  # provenance only to originals
    audit = {r["summary_id"]: r for r in export_rows(store.url, "p") if r["type"] == "consolidation"}
    assert all(not a["parameters"]["absorbed"] for a in audit.values())
    # Every original is in at most one summary, and each summary undoes on its own.
    members = [m for a in audit.values() for m in a["member_ids"]]
    assert len(members) == len(set(members))
    for summary_id in summaries:
        undo_consolidation(store, summary_id, "p")
    assert all(m["tier"] == Tier.HOT for m in memories(store).values()
               if m["origin"] == Origin.INGESTED)


@pytest.mark.parametrize("flow_fn", [compress, consolidate_cold], ids=["compress", "cold-notes"])
def test_dry_run_selects_what_the_real_run_does(fading_store: Store, flow_fn) -> None:
    before = state(fading_store)
    dry = flow_fn(profile="p", as_of=AS_OF, dry_run=True)
    assert state(fading_store) == before
    assert dry.comparable() == flow_fn(profile="p", as_of=AS_OF).comparable()


def test_full_consolidation_compresses_fading_memories(fading_store: Store) -> None:
    # The fading memories are 0.81 apart, near-duplicates at the default 0.80: merging
    # would take them first.
    config = ConsolidationConfig(dedup=DedupConfig(similarity=0.85))
    report = full_consolidation(profile="p", as_of=AS_OF, config=config)
    step = next(s for s in report.steps if s.step == "compress_fading")
    assert step.facts["groups"] == 1


def test_undo_through_the_cli(fading_store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    compress(profile="p", as_of=AS_OF)
    assert main(["consolidations", "--profile", "p"]) == EXIT_OK
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["id", "created", "operation"]
    listing = "\n".join(rows)
    consolidation_id = listing.split()[0]
    assert consolidation_id.startswith("c-") and "compress" in listing
    assert main(["undo", consolidation_id, "--profile", "p"]) == EXIT_OK
    assert "5 memories restored" in capsys.readouterr().out
    assert main(["undo", consolidation_id, "--profile", "p"]) == EXIT_OK
    assert "already undone" in capsys.readouterr().out
    assert main(["undo", "c-nothing", "--profile", "p"]) == EXIT_ERROR


def test_llm_compression_and_its_fallback(fading_store: Store, llm) -> None:
    config = ConsolidationConfig(summarizer="llm")
    dry = compress(profile="p", as_of=AS_OF, config=config, dry_run=True)
    first, last = AS_OF - timedelta(days=300), AS_OF - timedelta(days=296)
    span = f"{first.day} {first:%B %Y} to {last.day} {last:%B %Y}"
    # The model's words, after its members' dates (the summary itself is dated as_of).
    assert dry.steps[0].changes[0].preview.startswith(
        f"{span}: hiked trail number 0 in spring 1 2 3")
    llm.behaviour = "error"
    report = compress(profile="p", as_of=AS_OF, config=config)
    (step,) = report.steps
    assert step.changes[0].preview.startswith(f"{first.day} {first:%B %Y}: hiked trail")
    assert step.notes == ["llm: 1 wording(s) fell back to rules (compress: HTTP 500)"]
    summary = next(m for m in memories(fading_store).values() if m["origin"] == "compress")
    assert summary["content"].startswith(f"{first.day} {first:%B %Y}: hiked trail")


def test_a_model_worded_compression_is_embedded_without_its_dates(
        fading_store: Store, llm) -> None:
    compress(profile="p", as_of=AS_OF, config=ConsolidationConfig(summarizer="llm"))
    summary = next(m for m in memories(fading_store).values() if m["origin"] == "compress")
    first, last = AS_OF - timedelta(days=300), AS_OF - timedelta(days=296)
    span = f"{first.day} {first:%B %Y} to {last.day} {last:%B %Y}: "
    assert summary["content"].startswith(span)  # the model's words, not the rules'
    words, dated = embedder_of(fading_store).encode(
        [summary["content"].removeprefix(span), summary["content"]])
    vector = stored_vector(fading_store, summary["id"])
    assert float(np.dot(vector, words)) == pytest.approx(1.0, abs=1e-5)
    assert float(np.dot(vector, dated)) < 0.99


def test_llm_words_the_prose_blocks(sample_store: Store, llm) -> None:
    full_consolidation(profile="maya", as_of=AS_OF, config=ConsolidationConfig(summarizer="llm"))
    blocks = {b.block_type: b for b in in_read(sample_store, "maya", blocks_repo.blocks)}
    assert blocks["user_profile"].mode == "llm"
    # The fake model answers with its prompt's words, facts in the block's order
    # (use first, then importance).
    assert blocks["user_profile"].content.startswith(
        "Maya's team owns the shipment-tracking service Maya works mostly in Python and Go")
    assert blocks["active_decisions"].mode == "rules"
