"""Decay, creative, cluster and forget as Prefect flows, against a real store."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest

from reverie.deployments.cli import EXIT_OK, main
from reverie.deployments.status import FLOW_NAMES
from reverie.flows.cluster import cluster
from reverie.flows.creative import creative
from reverie.flows.decay import decay
from reverie.flows.forget import forget
from reverie.models.config import ConsolidationConfig, ForgetConfig
from reverie.models.export import export_jsonl, export_rows
from reverie.models.store import Store
from reverie.models.tables import EdgeKind, Origin, Tier, Tombstone

from factories import (
    AS_OF,
    at_cosine,
    axis,
    get_memory,
    ingest_records,
    run_history,
    stored_vector,
    undo_consolidation,
)
from prefect_reads import run_artifacts

pytestmark = pytest.mark.usefixtures("prefect_api")

FORGETTING = ConsolidationConfig(forget=ForgetConfig(archive_threshold=0.2, delete_threshold=0.1))


def approved(flow_fn) -> dict:
    """Deletion approved up front: a forget that deletes otherwise pauses for approval."""
    return {"auto_approve_deletion": True} if flow_fn is forget else {}


def iso(delta: timedelta) -> str:
    return (AS_OF - delta).isoformat() + "Z"


def memories_for(profile: str) -> list[dict]:
    fresh = {"last_accessed_at": iso(timedelta(hours=1)), "importance": 0.8, "confidence": 0.9}
    records = [
        {"id": f"topic-{k}", "content": f"topic A fact number {k}", "kind": "semantic",
         "created_at": iso(timedelta(days=k)), "embedding": at_cosine(0.9, other=10 + k).tolist(),
         **fresh}
        for k in range(6)
    ]
    records += [
        {"id": "dec-1", "content": "we will use Postgres", "kind": "decision",
         "created_at": iso(timedelta(days=2)), "embedding": axis(1).tolist(), **fresh},
        {"id": "dec-2", "content": "we will ship on Fridays", "kind": "decision",
         "created_at": iso(timedelta(days=40)), "embedding": axis(2).tolist(), **fresh},
        {"id": "ins", "content": "releases break on Mondays because of cron", "kind": "insight",
         "created_at": iso(timedelta(days=30)), "embedding": axis(3).tolist(), **fresh},
        {"id": "pat", "content": "incidents cluster on Mondays", "kind": "pattern",
         "created_at": iso(timedelta(days=50)),
         "embedding": at_cosine(0.6, base=3, other=4).tolist(), **fresh},
    ]
    old = {"created_at": iso(timedelta(days=200)), "importance": 0.2, "confidence": 0.5}
    records += [
        {"id": f"old-{k}", "content": f"a faded note {k}", "kind": "episodic",
         "embedding": axis(30 + k).tolist(), **old}
        for k in range(3)
    ]
    records += [
        {"id": "old-flagged", "content": "faded but flagged", "protected": True,
         "embedding": axis(40).tolist(), **old},
        {"id": "old-decision", "content": "an old decision", "kind": "decision",
         "embedding": axis(41).tolist(), **old},
        {"id": "old-important", "content": "faded but important", **old,
         "importance": 0.7, "embedding": axis(42).tolist()},
        {"id": "young", "content": "faded but young", "created_at": iso(timedelta(days=89)),
         "importance": 0.1, "embedding": axis(43).tolist()},
    ]
    records += [{"type": "edge", "source": "old-0", "target": "topic-0", "weight": 0.9,
                 "last_strengthened_at": iso(timedelta(days=1))}]
    return [{**r, "profile": profile} for r in records]


@pytest.fixture
def maintained(store: Store) -> Store:
    """Both profiles ingested; relevance not yet scored (the decay flow does that)."""
    report = ingest_records(store, memories_for("m") + memories_for("other"))
    assert not report.errors
    return store


@pytest.fixture
def scored(maintained: Store) -> Store:
    """As ``maintained``, after the decay flow scored every memory at AS_OF."""
    decay(profile=None, as_of=AS_OF)
    return maintained


def export(store: Store, profile: str = "m") -> str:
    return export_jsonl(store.url, profile)


def rows(store: Store, kind: str, profile: str = "m") -> list[dict]:
    return [r for r in export_rows(store.url, profile) if r["type"] == kind]


def by_external(store: Store, profile: str = "m") -> dict[str, dict]:
    return {m["external_id"]: m for m in rows(store, "memory", profile) if m["external_id"]}


FLOWS = [(decay, None), (creative, None), (cluster, None), (forget, FORGETTING)]


@pytest.mark.parametrize(("flow_fn", "config"), FLOWS, ids=lambda f: getattr(f, "name", ""))
def test_dry_run_writes_nothing_and_predicts_the_real_run(maintained: Store, flow_fn, config) -> None:
    if flow_fn is not decay:
        decay(profile="m", as_of=AS_OF)
    before, history = export(maintained), run_history(maintained)
    dry = flow_fn(profile="m", as_of=AS_OF, dry_run=True, config=config)
    assert export(maintained) == before and run_history(maintained) == history
    real = flow_fn(profile="m", as_of=AS_OF, config=config, **approved(flow_fn))
    assert dry.comparable() == real.comparable() and real.changed() > 0
    assert export(maintained) != before


@pytest.mark.parametrize(("flow_fn", "config"), FLOWS, ids=lambda f: getattr(f, "name", ""))
def test_a_second_run_with_the_same_as_of_changes_nothing(scored: Store, flow_fn, config) -> None:
    maintained = scored
    flow_fn(profile="m", as_of=AS_OF, config=config, **approved(flow_fn))
    once = export(maintained)
    again = flow_fn(profile="m", as_of=AS_OF, config=config, **approved(flow_fn))
    assert export(maintained) == once and again.changed() == 0


def test_decay_scores_every_live_memory_and_publishes_the_distribution(maintained: Store) -> None:
    report = decay(profile="m", as_of=AS_OF)
    memories = by_external(maintained)
    assert memories["topic-0"]["relevance"] > 0.7 and memories["old-0"]["relevance"] < 0.1
    artifacts = {a.key: a for a in run_artifacts(report.run_id)}
    table = json.loads(artifacts["decay-distribution"].data)
    assert [r["band"] for r in table] == ["high", "medium", "low", "archive"]
    assert sum(r["memories"] for r in table) == report.steps[0].examined == 17


def test_artifacts_name_the_users_ids_and_each_profile_has_its_own_key(
    maintained: Store,
) -> None:
    report = decay(profile="m", as_of=AS_OF)
    artifacts = {a.key: a for a in run_artifacts(report.run_id)}
    ours_to_theirs = {m["id"]: m["external_id"] for m in rows(maintained, "memory")}
    table = json.loads(artifacts["decay-changes"].data)
    assert table and all(r["id"] == ours_to_theirs[r["target"]] for r in table)
    assert {r["id"] for r in table} >= {"topic-0", "old-0"}
    own = artifacts["decay-profile-m"].data
    assert own.startswith("# Decay: m") and "(id `old-0`)" in own


def test_profile_keys_are_prefects_spelling_and_never_shared() -> None:
    from reverie.runner.artifacts import profile_key
    from reverie.runner.report import RunReport

    report = RunReport("full-consolidation", [], "2025-07-01", False, None)
    assert profile_key(report, "maya") == "full-consolidation-profile-maya"
    keys = {profile_key(report, p) for p in ("Bob", "bob", "bob.k", "bob-k", "b@b")}
    assert len(keys) == 5 and all(re.fullmatch(r"[a-z0-9-]+", k) for k in keys)


def test_creative_links_the_rule_matches(scored: Store) -> None:
    maintained = scored
    creative(profile="m", as_of=AS_OF, config=ConsolidationConfig.model_validate(
        {"creative": {"sample_size": 100}}))
    ids = {m["id"]: m["external_id"] for m in rows(maintained, "memory")}
    found = {(e["kind"], e["subkind"], ids[e["source_id"]], ids[e["target_id"]])
             for e in rows(maintained, "edge") if e["kind"] in (EdgeKind.CONTRADICTS, EdgeKind.DISCOVERED)}
    assert (EdgeKind.CONTRADICTS, None, "dec-1", "dec-2") in found or (EdgeKind.CONTRADICTS, None, "dec-2", "dec-1") in found
    assert (EdgeKind.DISCOVERED, "explains", "ins", "pat") in found
    edge = next(e for e in rows(maintained, "edge") if e["subkind"] == "explains")
    assert edge["confidence"] == 0.7 and edge["metadata"]["algorithm"] == "creative_association"


def test_cluster_keeps_one_meta_memory_per_cluster(scored: Store) -> None:
    maintained = scored
    cluster(profile="m", as_of=AS_OF)
    decay(profile="m", as_of=AS_OF + timedelta(days=1))
    cluster(profile="m", as_of=AS_OF + timedelta(days=1))
    metas = [m for m in rows(maintained, "memory") if m["origin"] == Origin.META_MEMORY]
    assert len(metas) == 1
    meta = metas[0]
    assert meta["tier"] == Tier.HOT and meta["metadata"]["cluster_size"] == 6
    assert meta["metadata"]["temporal_span_days"] == 5.0
    members = {e["target_id"] for e in rows(maintained, "edge") if e["kind"] == EdgeKind.SUMMARIZES}
    topic = {m["id"] for m in rows(maintained, "memory") if (m["external_id"] or "").startswith("topic")}
    assert members == topic
    assert all(m["tier"] == Tier.HOT and m["superseded_by"] is None
               for m in rows(maintained, "memory") if m["id"] in topic)


def test_forget_deletes_archives_and_protects(scored: Store) -> None:
    maintained = scored
    ingested = {m["id"] for m in rows(maintained, "memory")}
    old0 = get_memory(maintained, "old-0", profile="m").id
    report = forget(profile="m", as_of=AS_OF, config=FORGETTING, auto_approve_deletion=True)
    (step,) = report.steps
    assert step.facts == {"archived": 0, "deleted": 3, "protected": 4, "blocks_recompiled": 0}
    memories = by_external(maintained)
    for kept in ("old-flagged", "old-decision", "old-important", "young"):
        assert memories[kept]["tier"] == Tier.HOT
    tombstones = {t["memory_id"]: t for t in rows(maintained, "tombstone")}
    assert set(tombstones) == {get_memory(maintained, f"old-{k}", profile="m").memory_id for k in range(3)}
    stone = tombstones[old0]
    assert stone["external_id"] == "old-0" and stone["score"] < 0.1 and stone["content_hash"]
    assert "relevance" in stone["reason"]
    assert isinstance(get_memory(maintained, "old-0", profile="m"), Tombstone)
    assert stored_vector(maintained, old0) is None
    assert not [e for e in rows(maintained, "edge") if old0 in (e["source_id"], e["target_id"])]
    # Nothing lost: every memory ever stored is hot, cold or a tombstone.
    now = {m["id"]: m["tier"] for m in rows(maintained, "memory")}
    assert all(now.get(i) in (Tier.HOT, Tier.COLD) or i in tombstones for i in ingested)
    (audit,) = rows(maintained, "consolidation")
    assert audit["operation"] == "forget" and sorted(audit["parameters"]["deleted"]) == sorted(tombstones)


def test_forget_archives_between_the_thresholds(scored: Store) -> None:
    maintained = scored
    config = ConsolidationConfig(forget=ForgetConfig(archive_threshold=0.2))
    forget(profile="m", as_of=AS_OF, config=config)
    memories = by_external(maintained)
    assert {k for k, m in memories.items() if m["tier"] == Tier.COLD} == {"old-0", "old-1", "old-2"}
    assert rows(maintained, "tombstone") == []


def test_maintenance_never_touches_another_profile(scored: Store) -> None:
    maintained = scored
    other = export(maintained, "other")
    for flow_fn, config in FLOWS:
        flow_fn(profile="m", as_of=AS_OF, config=config, **approved(flow_fn))
    assert export(maintained, "other") == other


def test_runs_are_recorded_and_shown_by_status(
    maintained: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "decay", "--profile", "m", "--as-of", "2025-07-01"]) == EXIT_OK
    assert main(["run", "forget", "--all", "--as-of", "2025-07-01", "--dry-run"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "note: forgetting is off: both thresholds are 0.0" in out
    history = run_history(maintained)
    assert [(r.profile_id, r.flow) for r in history] == [("m", "decay")]
    assert history[0].changed == 17 and history[0].summary == {"decay": {"changed": 17, "notes": []}}

    assert main(["status"]) == EXIT_OK
    text = capsys.readouterr().out
    assert "m                    decay" in text and "2025-07-01T00:00:00" in text
    assert "History (last 1 runs)" in text
    assert main(["status", "--profile", "m", "--json"]) == EXIT_OK
    status = json.loads(capsys.readouterr().out)
    assert status["last"]["m"]["decay"]["changed"] == 17
    # The session's Prefect API holds no deployments, hence no scheduled runs.
    assert status["next"] == {flow: [] for flow in FLOW_NAMES}


def test_status_history_holds_at_least_twenty_runs(maintained: Store) -> None:
    for day in range(22):
        decay(profile="m", as_of=AS_OF + timedelta(days=day))
    history = run_history(maintained, limit=20)
    assert len(history) == 20
    assert history[0].as_of == AS_OF + timedelta(days=21)
    assert len(run_history(maintained, limit=50)) == 22


def test_artifact_of_a_forget_dry_run_says_why(scored: Store) -> None:
    report = forget(profile="m", as_of=AS_OF, dry_run=True, config=FORGETTING)
    artifacts = run_artifacts(report.run_id)
    table = json.loads(next(a for a in artifacts if a.key == "forget-dry-run-changes").data)
    actions = {r["action"] for r in table}
    assert {"deleted", "protected"} <= actions
    assert any("grace period" in r["detail"] for r in table)


def test_an_undone_meta_memory_is_not_made_again(scored: Store) -> None:
    before = [r for r in export_rows(scored.url, "m") if r["type"] != "consolidation"]
    report = cluster(profile="m", as_of=AS_OF)
    meta_id = report.steps[0].changes[0].target
    undo_consolidation(scored, meta_id, "m")
    assert [r for r in export_rows(scored.url, "m") if r["type"] != "consolidation"] == before
    again = cluster(profile="m", as_of=AS_OF)
    assert again.changed() == 0 and again.steps[0].changes[0].action == "vetoed"
    assert not [m for m in rows(scored, "memory") if m["origin"] == Origin.META_MEMORY]
