"""Reverie as a platform team runs it: a real Prefect server on loopback, every deployment
from prefect.yaml, a process worker, event triggers, backfills, concurrency, the UI.

One stack serves the whole module (starting one takes ~20 s). The only change to
prefect.yaml is a 10-second idle window instead of 5 minutes, so the test need not wait.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from reverie.deployments.backfill import backfill
from reverie.deployments.cli import EXIT_OK, main
from reverie.deployments.serve import project_root
from reverie.deployments.status import collect
from reverie.models.db import copy_profiles
from reverie.models.events import MEMORY_STORED, SESSION_ENDED, SESSION_THRESHOLD, STORE_THRESHOLD
from reverie.models.repositories import blocks as blocks_repo
from reverie.models.store import Store
from reverie.runner import event_delivery

from factories import end_session, in_read, ingest_records, run_history
from prefect_stack import Stack, sample_stack

IDLE_SECONDS = 10
# The deployments event-triggered runs belong to.
EVENT_DEPLOYMENTS = ("on-demand", "sessions")


def _shorten_idle_window(spec: dict[str, Any]) -> None:
    for deployment in spec["deployments"]:
        for trigger in deployment.get("triggers", []):
            if trigger.get("posture") == "Proactive":
                trigger["within"] = IDLE_SECONDS


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, sample_template: Path) -> Iterator[Stack]:
    with sample_stack(tmp_path_factory.mktemp("platform"), sample_template, _shorten_idle_window) as running:
        yield running


def test_every_deployment_is_there_with_its_schedule(stack: Stack) -> None:
    with stack.client() as client:
        deployments = {f"{client.read_flow(d.flow_id).name}/{d.name}": d
                       for d in client.read_deployments()}
    assert set(deployments) == {
        "decay/daily", "creative/weekly", "cluster/monthly", "forget/operator",
        "full-consolidation/nightly", "full-consolidation/sessions",
        "lightweight-consolidation/on-demand", "consolidate-cold/sleep", "replay/backfill",
        "cold-tier/tiering",
    }
    assert deployments["replay/backfill"].global_concurrency_limit.limit == 4
    crons = {name: [(s.schedule.cron, s.active) for s in d.schedules]
             for name, d in deployments.items() if d.schedules}
    assert crons == {
        "decay/daily": [("0 2 * * *", True)],
        "creative/weekly": [("0 4 * * 0", True)],
        "cluster/monthly": [("0 5 1 * *", True)],
        "forget/operator": [("0 6 1 * *", False)],
        "cold-tier/tiering": [("0 6 * * *", False)],
        "full-consolidation/nightly": [("0 3 * * *", True)],
    }
    # The server keeps them in the leg's database for Prefect: PostgreSQL on the
    # PostgreSQL leg, as a platform runs it; SQLite in its home otherwise.
    if stack.prefect_database:
        engine = create_engine(stack.prefect_database)
        try:
            with engine.connect() as conn:
                stored = {n for (n,) in conn.execute(text("SELECT name FROM deployment"))}
        finally:
            engine.dispose()
    else:
        with closing(sqlite3.connect(stack.home / "prefect.db")) as conn:
            stored = {n for (n,) in conn.execute("SELECT name FROM deployment")}
    assert stored == {d.name for d in deployments.values()}


def test_every_deployment_describes_its_parameters_and_refuses_malformed_runs(
    stack: Stack,
) -> None:
    from prefect.exceptions import PrefectHTTPStatusError

    with stack.client() as client:
        deployments = client.read_deployments()
        for d in deployments:
            schema = d.parameter_openapi_schema
            assert d.enforce_parameter_schema, d.name
            undescribed = [name for name, p in schema["properties"].items()
                           if not p.get("description")]
            assert undescribed == [], d.name
        daily = client.read_deployment_by_name("decay/daily")
        knobs = daily.parameter_openapi_schema["definitions"]["DedupConfig"]["properties"]
        assert knobs["similarity"].get("description")
        for bad in ({"as_of": "not-a-date"}, {"as_of": "yesterday"},
                    {"profile": "no spaces please"}, {"profile": ["maya", "a/b"]}):
            with pytest.raises(PrefectHTTPStatusError) as refused:
                client.create_flow_run_from_deployment(daily.id, parameters=bad)
            assert refused.value.response.status_code in (409, 422), bad
    assert not any(r.parameters.get("as_of") in ("not-a-date", "yesterday")
                   for r in stack.runs("daily"))


def test_a_triggered_run_completes_and_its_artifacts_are_readable(stack: Stack) -> None:
    from prefect.deployments import run_deployment

    run = run_deployment("lightweight-consolidation/on-demand", timeout=0,
                         parameters={"profile": "leo-tutor", "as_of": "2025-07-01T00:00:00Z"})
    run = stack.wait_final(run.id)
    assert run.state_type.value == "COMPLETED", stack.log_tail()
    assert run.name == "lightweight-consolidation | leo-tutor | as of 2025-07-01 00:00:00"
    from prefect_reads import run_artifacts

    artifacts = {a.key: a for a in run_artifacts(str(run.id))}
    assert "| leo-tutor | compile_blocks |" in artifacts["lightweight-consolidation"].data
    table = json.loads(artifacts["lightweight-consolidation-changes"].data)
    assert {r["step"] for r in table} <= {"compile_blocks", "decay_edges"} and table
    assert float(artifacts["lightweight-consolidation-progress"].data) == 100.0
    assert len(in_read(stack.store, "leo-tutor", blocks_repo.blocks)) == 5


def _by_automation(stack: Stack, automation: str, profile: str) -> list[Any]:
    return stack.runs_by_automation(automation, profile, EVENT_DEPLOYMENTS)


def test_fifty_stores_trigger_one_lightweight_run_for_that_profile_only(stack: Stack) -> None:
    vector = [1.0] + [0.0] * 383
    ingest_records(stack.store, [{"content": f"fact {i}", "embedding": vector} for i in range(50)], profile="events-a")
    ingest_records(stack.store, [{"content": f"fact {i}", "embedding": vector} for i in range(30)], profile="events-b")
    stack.deliver_events()
    # A store threshold for events-a; for events-b (30 stores) only the stores.
    stack.wait_profile_events("events-a", {MEMORY_STORED: 1, STORE_THRESHOLD: 1})
    stack.wait_profile_events("events-b", {MEMORY_STORED: 1, STORE_THRESHOLD: 0})
    stack.wait_runs("lightweight-every-50-stores", "events-a", 1, EVENT_DEPLOYMENTS)
    # Both profiles then went idle: one idle run each.
    for profile in ("events-a", "events-b"):
        stack.wait_runs("lightweight-when-idle", profile, 1, EVENT_DEPLOYMENTS)
    # The idle window has passed since the triggers service took in these events: the
    # threshold automation had its chance at each. It fired once, for events-a, and that
    # firing's action has ended, so no other run of it is on its way.
    stack.wait_firings("lightweight-every-50-stores", "events-a", 1)
    assert stack.firings("lightweight-every-50-stores", "events-b") == []
    assert len(_by_automation(stack, "lightweight-every-50-stores", "events-a")) == 1
    assert _by_automation(stack, "lightweight-every-50-stores", "events-b") == []
    assert len(_by_automation(stack, "lightweight-when-idle", "events-a")) == 1


def test_another_stores_events_never_start_this_stacks_runs(
    stack: Stack, new_store: Callable[[str], Store]
) -> None:
    # Two tenants with a profile of the same name on one Prefect API: the stack serves
    # its own store; another store's ingest reaches the same server. Both cross 50.
    other = new_store("tenant-b")
    vector = [1.0] + [0.0] * 383
    for store in (other, stack.store):
        ingest_records(store, [{"content": f"twin fact {i}", "embedding": vector}
                               for i in range(50)], profile="twin")
    event_delivery.flush(other.url, api=stack.api)
    stack.deliver_events()
    # The server has both stores' events (their ids differ), each naming its store.
    stack.wait_profile_events("twin", {MEMORY_STORED: 2, STORE_THRESHOLD: 2})
    events = stack.profile_events("twin", MEMORY_STORED, STORE_THRESHOLD)
    assert sorted(e.resource["reverie.store"] for e in events) == sorted(
        [stack.store.id, stack.store.id, other.id, other.id])
    for e in events:
        (store_related,) = [r for r in e.related if r.role == "store"]
        assert store_related.id == f"reverie.store.{e.resource['reverie.store']}"
    # Only the stack's own store's events start its runs: one threshold run, one idle
    # run, each told which store it serves.
    for automation in ("lightweight-every-50-stores", "lightweight-when-idle"):
        (run,) = stack.wait_runs(automation, "twin", 1, EVENT_DEPLOYMENTS)
        assert run.parameters["store_id"] == stack.store.id
        stack.wait_firings(automation, "twin", 1)
        stack.wait_completed(run.id)


def test_session_ends_trigger_full_consolidation(stack: Stack) -> None:
    for n in range(1, 6):
        assert end_session(stack.store, "raj", f"s{n}") == n
    # Each session end sends its events once, briefly; what a loaded machine did not get
    # across in time waits in the store, as `reverie serve` would send it.
    stack.deliver_events()
    stack.wait_profile_events("raj", {SESSION_ENDED: 5, SESSION_THRESHOLD: 1})
    stack.wait_runs("full-at-session-end", "raj", 5, EVENT_DEPLOYMENTS)
    stack.wait_runs("full-every-few-sessions", "raj", 1, EVENT_DEPLOYMENTS)
    # One fifth session, one firing, its action ended: no second run on its way.
    stack.wait_firings("full-every-few-sessions", "raj", 1)
    assert len(_by_automation(stack, "full-every-few-sessions", "raj")) == 1


def _decay_runs_of(stack: Stack, replay_id: Any) -> list[Any]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with stack.client() as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[replay_id])))


def test_a_backfill_replays_each_profile_in_order_and_ends_as_sequential_runs(
    stack: Stack, new_store: Callable[[str], Store]
) -> None:
    from reverie.models.export import export_jsonl

    start, days, profiles = datetime(2025, 9, 1), 10, ["leo-tutor", "maya"]
    whens = [start + timedelta(days=d) for d in range(days)]
    # The reference: the same profiles as they are now, run one date at a time below.
    reference = new_store("reference")
    copy_profiles(stack.store.url, reference.url, profiles)
    # Asked again while they are queued: no second replay for a profile. Held queued (the
    # pool paused) until then: on loaded cores a replay once ended before the second ask
    # looked (CI of f913e7d), and a profile with nothing left to do is no case of this.
    with stack.pool_paused():
        first = backfill("decay", start, whens[-1], timedelta(days=1), profiles, stack.store)
        assert first.where == "replay/backfill" and len(first.runs) == 2
        assert first.created == [w.isoformat() for w in whens] and first.skipped == []
        again = backfill("decay", start, whens[-1], timedelta(days=1), profiles, stack.store)
    assert again.runs == [] and sorted(again.running) == profiles
    for run_id in first.runs:
        stack.wait_completed(run_id, steps=lambda r=run_id: len(_decay_runs_of(stack, r)))
    # Each profile's dates ran one after another, in as_of order.
    for run_id in first.runs:
        runs = sorted(_decay_runs_of(stack, run_id), key=lambda r: r.start_time)
        assert [r.parameters["as_of"][:10] for r in runs] == [w.date().isoformat() for w in whens]
        assert all(a.end_time <= b.start_time for a, b in zip(runs, runs[1:], strict=False))
    # The store ends as ten one-at-a-time runs through the same dates leave it. They run
    # in a process of their own: Prefect keeps one slot-acquiring service per limit name
    # per process, bound to the API it first used, and this process has used the
    # session's API for these profiles already (acquired there, released here: a leak).
    runs = "\n".join(f"decay(profile={profiles!r}, as_of=datetime.fromisoformat({w.isoformat()!r}))"
                     for w in whens)
    subprocess.run(
        [sys.executable, "-c", f"from datetime import datetime\nfrom reverie.flows.decay import decay\n{runs}"],
        cwd=project_root(), check=True, timeout=600,
        env={**os.environ, "REVERIE_DATABASE_URL": reference.url, "PREFECT_API_URL": stack.api},
    )
    for profile in profiles:
        assert export_jsonl(stack.store.url, profile) == export_jsonl(reference.url, profile)
    # Done: a third backfill finds every date in the history and runs only the day before
    # them, which comes too late for schedule order and says so.
    before = start - timedelta(days=1)
    done = backfill("decay", before, whens[-1], timedelta(days=1), profiles, stack.store)
    assert done.created == done.out_of_order == [before.isoformat()]
    assert len(done.runs) == 2 and len(done.skipped) == days
    for run_id in done.runs:
        stack.wait_completed(run_id)


def test_backfills_of_two_flows_replay_in_schedule_order_whichever_is_asked_first(
    stack: Stack, new_store: Callable[[str], Store], capsys: pytest.CaptureFixture[str]
) -> None:
    """A full-consolidation backfill, then a decay backfill over the same dates and
    profile (#38 item 4): the store ends as decay then full, date by date, run one at a
    time, leave it. Asked in this order, the full replay is made first: without the
    replays' turns it ran full on a date before that date's decay."""
    from reverie.models.export import export_jsonl

    start, days, profile = datetime(2025, 10, 1), 3, "support-bot"
    whens = [start + timedelta(days=d) for d in range(days)]
    reference = new_store("reference-order")
    copy_profiles(stack.store.url, reference.url, [profile])
    full = backfill("full", start, whens[-1], timedelta(days=1), profile, stack.store)
    assert len(full.runs) == 1
    # `reverie status` shows the backfill in progress (its process takes seconds to start).
    shown = collect(stack.store, profile).backfills
    assert [(b.run_id, b.flow, b.profile, b.total) for b in shown or []] == [
        (full.runs[0], "full", profile, days)]
    # The second command from the CLI, waiting until its replay has ended.
    capsys.readouterr()
    assert main(["backfill", "decay", "--from", start.isoformat(), "--to",
                 whens[-1].isoformat(), "--profile", profile, "--wait", "--json"]) == EXIT_OK
    decay = json.loads(capsys.readouterr().out)
    assert len(decay["runs"]) == 1 and decay["ended"] == {decay["runs"][0]: "COMPLETED"}
    stack.wait_completed(full.runs[0])
    history = sorted((r for r in run_history(stack.store, profile=profile, limit=None)
                      if r.as_of in whens), key=lambda r: r.started_at)
    assert [(r.as_of, r.flow) for r in history] == [
        (w, f) for w in whens for f in ("decay", "full-consolidation")]
    assert all(a.finished_at <= b.started_at for a, b in zip(history, history[1:], strict=False))
    runs = "\n".join(f"decay(profile={profile!r}, as_of=datetime.fromisoformat({w.isoformat()!r}))\n"
                     f"full_consolidation(profile={profile!r}, as_of=datetime.fromisoformat({w.isoformat()!r}))"
                     for w in whens)
    subprocess.run(
        [sys.executable, "-c", "from datetime import datetime\nfrom reverie.flows.decay import decay\n"
         f"from reverie.flows.full_consolidation import full_consolidation\n{runs}"],
        cwd=project_root(), check=True, timeout=600,
        env={**os.environ, "REVERIE_DATABASE_URL": reference.url, "PREFECT_API_URL": stack.api},
    )
    assert export_jsonl(stack.store.url, profile) == export_jsonl(reference.url, profile)
    # Asked again as one command of both flows: every date is in the history.
    again = backfill("full,decay", start, whens[-1], timedelta(days=1), profile, stack.store)
    assert again.runs == [] and len(again.skipped) == days


def test_a_manual_run_for_a_date_equals_the_scheduled_run_for_it(stack: Stack) -> None:
    from prefect.deployments import run_deployment
    from prefect.states import Scheduled

    when = datetime(2025, 8, 15)
    manual = run_deployment("lightweight-consolidation/on-demand", timeout=0,
                            parameters={"profile": "support-bot", "as_of": when.isoformat()})
    stack.wait_completed(manual.id)
    with stack.client() as client:
        deployment = client.read_deployment_by_name("lightweight-consolidation/on-demand")
        scheduled = client.create_flow_run_from_deployment(
            deployment.id, parameters={"profile": "support-bot"},
            state=Scheduled(scheduled_time=when),
        )
    stack.wait_completed(scheduled.id)
    runs = [r for r in run_history(stack.store, profile="support-bot", limit=None)
            if r.flow == "lightweight-consolidation"]
    assert {r.as_of for r in runs} == {when}
    # Same date, same store: the second run finds nothing left to do.
    first, second = sorted(runs, key=lambda r: r.started_at)
    assert first.changed > 0 and second.changed == 0


def test_two_concurrent_runs_for_one_profile_never_overlap(stack: Stack) -> None:
    from prefect.deployments import run_deployment

    params = {"profile": "leo-tutor", "as_of": "2025-09-01T00:00:00Z"}
    runs = [run_deployment("full-consolidation/nightly", parameters=params, timeout=0,
                           idempotency_key=f"concurrency-test-{i}") for i in range(2)]
    for r in runs:
        stack.wait_completed(r.id)
    history = sorted(
        (r for r in run_history(stack.store, profile="leo-tutor", limit=None)
         if r.flow == "full-consolidation"),
        key=lambda r: r.started_at,
    )
    assert len(history) == 2
    assert history[0].finished_at <= history[1].started_at


def test_the_ui_shows_the_run_and_its_artifact(stack: Stack) -> None:
    from prefect.deployments import run_deployment

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium is missing: `make test` installs it"
    run = run_deployment("lightweight-consolidation/on-demand", timeout=0,
                         parameters={"profile": "maya", "as_of": "2025-07-02T00:00:00Z"})
    run = stack.wait_final(run.id)
    url = f"{stack.ui}/v2/runs/flow-run/{run.id}?tab=Artifacts"
    dom = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--disable-background-networking", "--no-first-run", "--disable-component-update",
         "--disable-sync", "--virtual-time-budget=15000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    ).stdout
    assert run.name in dom
    assert "lightweight-consolidation-changes" in dom
