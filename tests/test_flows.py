"""The flows end to end under Prefect, and the invariants the README states."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from uuid import UUID, uuid4

import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from reverie.flows.full_consolidation import full_consolidation
from reverie.flows.lightweight_consolidation import lightweight_consolidation
from reverie.models.config import DedupConfig
from reverie.models.errors import NotFoundError, StepFailedError
from reverie.models.export import export_jsonl, export_rows
from reverie.models.repositories import memories as memories_repo
from reverie.models.repositories import summaries as summaries_module
from reverie.models.store import Store
from reverie.models.tables import EdgeKind, Origin, Tier
from reverie.runner import chunk_scheduler
from reverie.runner.chunk_scheduler import chunked
from reverie.runner.runtime import wait_for_run_history
from reverie.tasks import linking
from reverie.tasks import step as step_module
from reverie.tasks import summaries as summaries_step
from reverie.tasks.blocks import BLOCK_TYPES

from conftest import clone_sample
from factories import in_read, ingest_records, lease_holders, run_history
from prefect_reads import run_artifacts

pytestmark = pytest.mark.usefixtures("prefect_api")

AS_OF = datetime(2025, 7, 1)


def exports(store: Store) -> dict[str, str]:
    return {p: export_jsonl(store.url, p) for p in store.profiles()}


def rows(store: Store, profile: str, kind: str) -> list[dict]:
    return [r for r in export_rows(store.url, profile) if r["type"] == kind]


def use_copy(
    template: Path, new_store: Callable[[str], Store], name: str, monkeypatch: pytest.MonkeyPatch
) -> Store:
    """A copy of the sample store that the flows (through the settings) now work on."""
    store = clone_sample(template, new_store(name))
    monkeypatch.setenv("REVERIE_DATABASE_URL", store.url)
    return store


def clean_run_exports(
    template: Path, new_store: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch,
    profile: str | None,
) -> dict[str, str]:
    """The exports after an undisturbed full consolidation of a fresh copy."""
    clean = use_copy(template, new_store, "clean", monkeypatch)
    full_consolidation(profile=profile, as_of=AS_OF)
    return exports(clean)


def step(report, profile: str, name: str):
    return next(s for s in report.steps if s.profile == profile and s.step == name)


def test_full_consolidation_end_to_end(sample_store: Store) -> None:
    ingested = {p: {m["id"] for m in rows(sample_store, p, "memory")} for p in sample_store.profiles()}
    report = full_consolidation(profile=None, as_of=AS_OF)

    assert report.profiles == sorted(ingested) and report.as_of == AS_OF.isoformat()
    for profile, before in ingested.items():
        memories = {m["id"]: m for m in rows(sample_store, profile, "memory")}
        # Nothing lost: every ingested memory is still here, hot or cold.
        assert before <= set(memories)
        assert {m["tier"] for m in memories.values()} <= {Tier.HOT, Tier.COLD}
        summaries = {i for i, m in memories.items() if m["origin"] == Origin.DEDUP_SUMMARY}
        assert summaries and step(report, profile, "dedup").facts["groups"] == len(summaries)
        # Every cold original points at a hot summary joined to it by a provenance edge.
        provenance = {(e["source_id"], e["target_id"]) for e in rows(sample_store, profile, "edge")
                      if e["kind"] == EdgeKind.CONSOLIDATION}
        for mid, m in memories.items():
            if m["tier"] == Tier.COLD:
                assert memories[m["superseded_by"]]["tier"] == Tier.HOT
                assert (m["superseded_by"], mid) in provenance
                assert m["pagerank"] is None
            else:
                assert m["pagerank"] is not None and m["community"] is not None
        assert all(memories[s]["linked_at"] == AS_OF.isoformat() for s in summaries)
        audit = rows(sample_store, profile, "consolidation")
        assert {a["summary_id"] for a in audit} == summaries
        blocks = rows(sample_store, profile, "block")
        assert [b["block_type"] for b in blocks] == sorted(BLOCK_TYPES)
        assert all(len(b["content"]) <= 500 for b in blocks)
        assert sum(len(b["content"]) for b in blocks) <= 2000


def test_a_second_run_with_the_same_as_of_changes_nothing(sample_store: Store) -> None:
    full_consolidation(profile=None, as_of=AS_OF)
    first = exports(sample_store)
    again = full_consolidation(profile=None, as_of=AS_OF)
    assert exports(sample_store) == first
    assert again.changed() == 0
    lightweight_consolidation(profile=None, as_of=AS_OF)
    assert exports(sample_store) == first


def test_a_later_run_decays_further_but_never_compounds(sample_store: Store) -> None:
    full_consolidation(profile="maya", as_of=AS_OF)
    later = AS_OF + timedelta(days=45)
    lightweight_consolidation(profile="maya", as_of=later)
    once = export_jsonl(sample_store.url, "maya")
    lightweight_consolidation(profile="maya", as_of=later)
    assert export_jsonl(sample_store.url, "maya") == once
    for e in rows(sample_store, "maya", "edge"):
        if e["kind"] == EdgeKind.ASSOCIATION:
            assert e["weight"] >= 0.05 and e["weight"] <= e["base_weight"]


def test_dry_run_writes_nothing_and_reports_what_the_real_run_does(sample_store: Store) -> None:
    before = exports(sample_store)
    dry = full_consolidation(profile=["maya", "raj"], as_of=AS_OF, dry_run=True)
    assert exports(sample_store) == before
    assert dry.dry_run and dry.changed() > 0
    real = full_consolidation(profile=["maya", "raj"], as_of=AS_OF)
    assert dry.comparable() == real.comparable()
    assert exports(sample_store) != before

    dry_light = lightweight_consolidation(profile="leo-tutor", as_of=AS_OF, dry_run=True)
    assert export_jsonl(sample_store.url, "leo-tutor") == before["leo-tutor"]
    assert dry_light.comparable() == lightweight_consolidation(
        profile="leo-tutor", as_of=AS_OF).comparable()


def test_profiles_never_mix(sample_store: Store) -> None:
    before = exports(sample_store)
    full_consolidation(profile="maya", as_of=AS_OF)
    after = exports(sample_store)
    assert {p: t for p, t in after.items() if p != "maya"} == {
        p: t for p, t in before.items() if p != "maya"}
    maya_ids = {m["id"] for m in rows(sample_store, "maya", "memory")}
    for e in rows(sample_store, "maya", "edge"):
        assert e["source_id"] in maya_ids and e["target_id"] in maya_ids
    for a in rows(sample_store, "maya", "consolidation"):
        assert set(a["member_ids"]) <= maya_ids


def test_a_step_that_fails_mid_transaction_and_is_retried_ends_like_a_clean_run(
    sample_template: Path, new_store: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = clean_run_exports(sample_template, new_store, monkeypatch, None)
    flaky = use_copy(sample_template, new_store, "flaky", monkeypatch)
    failures: list[str] = []
    original = summaries_module.upsert_edges

    def fail_once(s, profile, edges, *args):  # type: ignore[no-untyped-def]
        if any(e.kind == EdgeKind.CONSOLIDATION for e in edges) and not failures:
            failures.append(profile)  # after the summary rows and the members' update
            raise OperationalError("UPDATE edge ...", {}, Exception(
                "injected: server closed the connection unexpectedly"))
        return original(s, profile, edges, *args)

    monkeypatch.setattr(summaries_module, "upsert_edges", fail_once)
    full_consolidation(profile=None, as_of=AS_OF)
    assert len(failures) == 1
    assert exports(flaky) == expected


def test_a_step_that_fails_after_committing_and_is_retried_ends_like_a_clean_run(
    sample_template: Path, new_store: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = clean_run_exports(sample_template, new_store, monkeypatch, "raj")
    flaky = use_copy(sample_template, new_store, "flaky", monkeypatch)
    failures: list[str] = []
    original = summaries_step.apply_summaries

    def commit_then_fail(tx, plans, *args, **kwargs):  # type: ignore[no-untyped-def]
        written = original(tx, plans, *args, **kwargs)
        if written and not failures:
            failures.append(tx.profile)

            @event.listens_for(tx.session, "after_commit", once=True)
            def lost_reply(session):  # type: ignore[no-untyped-def]
                raise ConnectionError("injected: the commit landed but the worker lost its reply")
        return written

    monkeypatch.setattr(summaries_step, "apply_summaries", commit_then_fail)
    full_consolidation(profile="raj", as_of=AS_OF)
    assert failures == ["raj"]
    assert exports(flaky) == expected


def test_a_run_that_stops_midway_completes_when_run_again(
    sample_template: Path, new_store: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = clean_run_exports(sample_template, new_store, monkeypatch, "maya")
    broken = use_copy(sample_template, new_store, "broken", monkeypatch)
    with monkeypatch.context() as patch:
        def down(*args, **kwargs):  # type: ignore[no-untyped-def]
            raise RuntimeError("injected: linking is down for the whole run")

        patch.setattr(linking, "plan_links", down)
        with pytest.raises(StepFailedError) as failure:
            full_consolidation(profile="maya", as_of=AS_OF)
    # Dedup committed; linking failed, and scoring, which follows it, did not run.
    assert failure.value.failed == {"maya": [
        "link_summaries: RuntimeError: injected: linking is down for the whole run",
        "graph_importance: not run: link_summaries failed",
    ]}
    assert exports(broken) != expected
    full_consolidation(profile="maya", as_of=AS_OF)
    assert exports(broken) == expected


def test_only_transient_faults_are_retried(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in planning fails at once; a lost connection is tried again."""
    calls: list[str] = []

    def planning_bug(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append("bug")
        raise ValueError("injected: a bug in planning")

    with monkeypatch.context() as patch:
        patch.setattr(linking, "plan_links", planning_bug)
        with pytest.raises(StepFailedError):
            full_consolidation(profile="maya", as_of=AS_OF)
    assert calls == ["bug"]
    calls.clear()
    real = linking.plan_links

    def connection_lost_twice(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append("lost")
        if len(calls) <= 2:
            raise OperationalError("SELECT ...", {}, Exception("injected: connection reset"))
        return real(*args, **kwargs)

    monkeypatch.setattr(linking, "plan_links", connection_lost_twice)
    full_consolidation(profile="maya", as_of=AS_OF)
    assert calls == ["lost", "lost", "lost"]


def test_a_profile_that_fails_neither_stops_nor_hides_the_others(
    sample_template: Path, new_store: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = clean_run_exports(sample_template, new_store, monkeypatch, None)
    broken = use_copy(sample_template, new_store, "broken", monkeypatch)
    real = step_module.run_step

    def fail_for_raj(name, fn, args):  # type: ignore[no-untyped-def]
        if name == "compress_fading" and args.profile == "raj":
            raise RuntimeError("injected: raj's compression fails")
        return real(name, fn, args)

    with monkeypatch.context() as patch:
        patch.setattr(step_module, "run_step", fail_for_raj)
        with pytest.raises(StepFailedError) as failure:
            full_consolidation(profile=None, as_of=AS_OF)
    # raj's later steps that need compression did not run; its others and every other
    # profile ran in full, in the same chunk.
    assert failure.value.failed == {"raj": [
        "compress_fading: RuntimeError: injected: raj's compression fails",
        "dedup_new_summaries: not run: compress_fading failed",
        "compile_blocks: not run: dedup_new_summaries failed",
        "promote: not run: dedup_new_summaries failed",
        "link_summaries: not run: dedup_new_summaries failed",
        "graph_importance: not run: link_summaries failed",
    ]}
    now = exports(broken)
    assert {p: now[p] for p in now if p != "raj"} == {p: expected[p] for p in now if p != "raj"}
    done = {r.profile_id for r in run_history(broken, flow="full-consolidation", limit=None)}
    assert done == set(now) - {"raj"}
    # A re-run of just the failed profile ends where a clean run does.
    report = full_consolidation(profile=["raj"], as_of=AS_OF)
    assert report.profiles == ["raj"] and exports(broken) == expected


def test_chunks_of_profiles_give_the_report_one_chunk_gives(
    sample_template: Path, new_store: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    whole = use_copy(sample_template, new_store, "whole", monkeypatch)
    one = full_consolidation(profile=None, as_of=AS_OF)
    in_one = exports(whole)
    chunked_store = use_copy(sample_template, new_store, "pairs", monkeypatch)
    monkeypatch.setenv("REVERIE_PROFILES_PER_TASK", "2")
    pairs = full_consolidation(profile=None, as_of=AS_OF)
    assert pairs.comparable() == one.comparable() and exports(chunked_store) == in_one
    wait_for_run_history(pairs.run_id)
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(pairs.run_id)]))
        )
    # Task runs grow with chunks, not with profiles: 8 steps per chunk of two.
    chunks = len(chunked(pairs.profiles, 2))
    assert len(pairs.profiles) > chunks and len(tasks) == 8 * chunks


@pytest.mark.parametrize("size", [1, 2, 3, 50])
@pytest.mark.parametrize("n", [0, 1, 2, 5, 49, 50, 51, 101])
def test_profiles_are_chunked_in_order_evenly_and_within_size(n: int, size: int) -> None:
    profiles = [f"p{i:03d}" for i in range(n)]
    chunks = chunked(profiles, size)
    assert [p for c in chunks for p in c] == profiles
    assert all(0 < len(c) <= size for c in chunks)
    assert len(chunks) == -(-n // size)
    assert not chunks or max(map(len, chunks)) - min(map(len, chunks)) <= 1


def test_lightweight_consolidation_only_refreshes_blocks_and_edges(sample_store: Store) -> None:
    report = lightweight_consolidation(profile="support-bot", as_of=AS_OF)
    assert {s.step for s in report.steps} == {"compile_blocks", "decay_edges"}
    memories = rows(sample_store, "support-bot", "memory")
    assert all(m["tier"] == Tier.HOT for m in memories)
    assert len(rows(sample_store, "support-bot", "block")) == 5
    assert step(report, "support-bot", "decay_edges").facts["pruned"] == 1


def test_unknown_profiles_are_refused(sample_store: Store) -> None:
    with pytest.raises(NotFoundError, match="nobody"):
        full_consolidation(profile=["maya", "nobody"], as_of=AS_OF)


def test_as_of_defaults_to_the_runs_start(sample_store: Store) -> None:
    report = lightweight_consolidation(profile="maya")
    started = datetime.fromisoformat(report.as_of)
    assert abs(datetime.utcnow() - started) < timedelta(minutes=5)


def test_each_run_publishes_a_summary_and_a_table_of_changes(sample_store: Store) -> None:
    report = full_consolidation(profile="maya", as_of=AS_OF)
    artifacts = {a.key: a for a in run_artifacts(report.run_id)}
    summary = artifacts["full-consolidation"]
    assert summary.type == "markdown" and "| maya | dedup |" in summary.data
    assert float(artifacts["full-consolidation-progress"].data) == 100.0
    table = json.loads(artifacts["full-consolidation-changes"].data)
    merged = [r for r in table if r["action"] == "merged"]
    assert merged and all(len(r["content"]) <= 80 for r in merged) and merged[0]["content"]


def test_artifacts_can_hide_memory_content(sample_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REVERIE_ARTIFACT_CONTENT_CHARS", "0")
    report = full_consolidation(profile="maya", as_of=AS_OF, dry_run=True)
    artifacts = {a.key: a for a in run_artifacts(report.run_id)}
    table = json.loads(artifacts["full-consolidation-dry-run-changes"].data)
    assert table and all(r["content"] == "" for r in table)
    contents = {m["content"] for m in rows(sample_store, "maya", "memory")}
    text = artifacts["full-consolidation-dry-run"].data
    assert not any(c in text for c in contents)


def test_the_dedup_boundary_holds_through_ingest_and_the_flow(store: Store) -> None:
    from factories import at_cosine, axis, below

    # The boundary is the default's, whatever it is: a scheduled run uses no other.
    threshold = DedupConfig().similarity

    def three(profile: str, cos: float) -> list[dict]:
        made = [
            {"profile": profile, "id": f"{profile}-rep", "content": "the one with most words here",
             "embedding": axis(0).tolist()},
            {"profile": profile, "id": f"{profile}-a", "content": "member a",
             "embedding": at_cosine(threshold, other=1).tolist()},
            {"profile": profile, "id": f"{profile}-b", "content": "member b",
             "embedding": at_cosine(cos, other=2).tolist()},
        ]
        # Stored before the run's as_of: a run dated in the past does not see later ones.
        return [{**r, "created_at": (AS_OF - timedelta(days=1)).isoformat()} for r in made]

    assert not ingest_records(store, three("at", threshold) + three("below", below(threshold))).errors
    report = full_consolidation(profile=None, as_of=AS_OF)
    assert step(report, "at", "dedup").facts["groups"] == 1
    assert step(report, "below", "dedup").facts["groups"] == 0
    assert in_read(store, "at", memories_repo.counts)["cold"] == 3 and in_read(store, "below", memories_repo.counts)["cold"] == 0


def test_runs_have_readable_names(sample_store: Store) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    report = lightweight_consolidation(profile=["maya", "raj"], as_of=AS_OF, dry_run=True)
    with get_client(sync_client=True) as client:
        name = client.read_flow_run(UUID(report.run_id)).name
        tasks = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(report.run_id)]))
        )
    assert name == "lightweight-consolidation | maya, raj | as of 2025-07-01 00:00:00 (dry run)"
    assert sorted(t.name for t in tasks) == [
        "compile_blocks/maya..raj (2 profiles)", "decay_edges/maya..raj (2 profiles)"]


def test_waiting_for_run_history_skips_with_an_api_and_gives_up_at_its_timeout(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    unknown = str(uuid4())
    # With an API configured there is nothing to wait for, even with no time to wait.
    assert wait_for_run_history(unknown, timeout=0)
    monkeypatch.setattr("reverie.runner.runtime.api_configured", lambda: False)
    assert not wait_for_run_history(unknown, timeout=0)
    assert "had not recorded all task runs" in caplog.text
    # A run with no task runs settles at the second look.
    assert wait_for_run_history(unknown, timeout=10)


def test_a_chunk_whose_done_callback_never_arrives_is_collected_all_the_same(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose chunk's futures finished without their done callback (seen once in
    CI: the run waited forever) looks at its futures itself and ends as usual."""
    monkeypatch.setenv("REVERIE_PROFILES_PER_TASK", "1")
    monkeypatch.setattr(chunk_scheduler, "SWEEP_SECONDS", 0.2)
    real = chunk_scheduler._when_all_done
    schedulers: list[chunk_scheduler.ChunkScheduler] = []
    init = chunk_scheduler.ChunkScheduler.__init__

    def remembered(self, *args):  # type: ignore[no-untyped-def]
        init(self, *args)
        schedulers.append(self)

    def lost_for_raj(futures, callback):  # type: ignore[no-untyped-def]
        batch, _ = schedulers[-1].flying[callback.args[0]]
        if batch.profiles != ("raj",):
            real(futures, callback)

    monkeypatch.setattr(chunk_scheduler.ChunkScheduler, "__init__", remembered)
    monkeypatch.setattr(chunk_scheduler, "_when_all_done", lost_for_raj)
    ended: list[object] = []
    runner = threading.Thread(
        target=lambda: ended.append(lightweight_consolidation(profile=None, as_of=AS_OF)),
        daemon=True)
    runner.start()
    runner.join(timeout=600)
    assert ended, "the run did not end"
    finished = {r.profile_id for r in run_history(sample_store)}
    assert finished == set(sample_store.profiles())
    assert lease_holders(sample_store) == {}


def test_a_chunk_whose_task_fails_as_a_whole_fails_its_profiles_only(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a step's error (those are caught per profile) but the chunk's task itself
    (say, a Dask worker that died): its profiles fail, the other chunks finish."""
    monkeypatch.setenv("REVERIE_PROFILES_PER_TASK", "1")
    real = step_module.run_batch

    def crash_for_raj(name, fn, batch, after=()):  # type: ignore[no-untyped-def]
        if "raj" in batch.profiles:
            raise RuntimeError("injected: the worker running raj's chunk died")
        return real(name, fn, batch, after)

    monkeypatch.setattr(step_module, "run_batch", crash_for_raj)
    with pytest.raises(StepFailedError) as failure:
        lightweight_consolidation(profile=None, as_of=AS_OF)
    assert set(failure.value.failed) == {"raj"}
    assert failure.value.failed["raj"][0].startswith("chunk: the chunk's task failed")
    finished = {r.profile_id for r in run_history(sample_store)}
    assert finished == set(sample_store.profiles()) - {"raj"}
    assert lease_holders(sample_store) == {}
