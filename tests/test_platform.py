"""Reverie as a platform team runs it: a real Prefect server on loopback, every deployment
from prefect.yaml, a process worker, event triggers, backfills, concurrency, the UI.

One stack serves the whole module (starting one takes ~20 s). The only change to
prefect.yaml is a 10-second idle window instead of 5 minutes, so the test need not wait.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployments.backfill import backfill
from deployments.serve import project_root, start_stack, stop
from models.db import copy_profiles, dispose
from models.store import Store

from conftest import (
    TEST_POSTGRES,
    _create_postgres_database,
    _drop_postgres_database,
    clone_sample,
)

AS_OF = datetime(2025, 7, 1)
IDLE_SECONDS = 10
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
# How long an automation may take to turn an event into a flow run. Usually a few
# seconds; in a full test session on 2 cores the worker's flow-run processes compete
# with the server and it has taken over 40 s. Waits end as soon as the run appears.
AUTOMATION_SECONDS = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Stack:
    def __init__(self, api: str, ui: str, store: Store, log: Path) -> None:
        self.api, self.ui, self.store, self.log = api, ui, store, log

    def client(self):  # type: ignore[no-untyped-def]
        from prefect.client.orchestration import get_client

        return get_client(sync_client=True)

    def runs(self, deployment: str | None = None) -> list[Any]:
        from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

        deployments = None
        if deployment:
            deployments = DeploymentFilter(name=DeploymentFilterName(any_=[deployment]))
        with self.client() as client:
            return client.read_flow_runs(deployment_filter=deployments, limit=200)

    def wait_final(self, run_id: Any, timeout: float = 180) -> Any:
        def final() -> Any:
            with self.client() as client:
                run = client.read_flow_run(run_id)
            return run if run.state_type and run.state_type.value in FINAL else None

        return wait_for(final, timeout, f"flow run {run_id} to finish")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, sample_template: Path) -> Iterator[Stack]:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    folder = tmp_path_factory.mktemp("platform")
    store_url = _create_postgres_database() if TEST_POSTGRES else f"sqlite:///{folder}/store.db"
    clone_sample(sample_template, Store(store_url))
    spec = yaml.safe_load((project_root() / "prefect.yaml").read_text())
    for deployment in spec["deployments"]:
        for trigger in deployment.get("triggers", []):
            if trigger.get("posture") == "Proactive":
                trigger["within"] = IDLE_SECONDS
    prefect_file = folder / "prefect.yaml"
    prefect_file.write_text(yaml.safe_dump(spec, sort_keys=False))

    port = free_port()
    saved = {k: os.environ.get(k) for k in ("REVERIE_DATABASE_URL", "PREFECT_WORKER_QUERY_SECONDS")}
    os.environ["REVERIE_DATABASE_URL"] = store_url
    os.environ["PREFECT_WORKER_QUERY_SECONDS"] = "2"  # poll often: the test waits on it
    log = folder / "stack.log"
    processes = start_stack(port, folder / "prefect-home", log, prefect_file)
    api = f"http://127.0.0.1:{port}/api"
    try:
        with temporary_settings({PREFECT_API_URL: api}):
            yield Stack(api, f"http://127.0.0.1:{port}", Store(store_url), log)
    finally:
        stop(processes)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if TEST_POSTGRES:
            _drop_postgres_database(store_url)
        else:
            dispose(store_url)


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
    assert run.state_type.value == "COMPLETED", stack.log.read_text()[-3000:]
    assert run.name == "lightweight-consolidation | leo-tutor | as of 2025-07-01 00:00:00"
    from prefect_reads import run_artifacts

    artifacts = {a.key: a for a in run_artifacts(str(run.id))}
    assert "| leo-tutor | compile_blocks |" in artifacts["lightweight-consolidation"].data
    table = json.loads(artifacts["lightweight-consolidation-changes"].data)
    assert {r["step"] for r in table} <= {"compile_blocks", "decay_edges"} and table
    assert float(artifacts["lightweight-consolidation-progress"].data) == 100.0
    assert len(stack.store.blocks("leo-tutor")) == 5


def _by_automation(stack: Stack, automation: str, profile: str) -> list[Any]:
    return [r for r in stack.runs("on-demand") + stack.runs("sessions")
            if r.created_by and r.created_by.display_value == automation
            and r.parameters.get("profile") == profile]


def test_fifty_stores_trigger_one_lightweight_run_for_that_profile_only(stack: Stack) -> None:
    vector = [1.0] + [0.0] * 383
    stack.store.ingest([{"content": f"fact {i}", "embedding": vector} for i in range(50)],
                       profile="events-a")
    stack.store.ingest([{"content": f"fact {i}", "embedding": vector} for i in range(30)],
                       profile="events-b")
    wait_for(lambda: _by_automation(stack, "lightweight-every-50-stores", "events-a"),
             AUTOMATION_SECONDS, "the store-threshold run")
    time.sleep(3)  # a second run, or one for the other profile, would appear by now
    assert len(_by_automation(stack, "lightweight-every-50-stores", "events-a")) == 1
    assert _by_automation(stack, "lightweight-every-50-stores", "events-b") == []
    # Both profiles then went idle: one idle run each.
    for profile in ("events-a", "events-b"):
        wait_for(lambda p=profile: _by_automation(stack, "lightweight-when-idle", p),
                 IDLE_SECONDS + AUTOMATION_SECONDS, f"the idle run for {profile}")
    assert len(_by_automation(stack, "lightweight-when-idle", "events-a")) == 1


def test_session_ends_trigger_full_consolidation(stack: Stack) -> None:
    for n in range(1, 6):
        assert stack.store.end_session("raj", f"s{n}") == n
    wait_for(lambda: len(_by_automation(stack, "full-at-session-end", "raj")) == 5,
             AUTOMATION_SECONDS, "five session-end runs")
    wait_for(lambda: _by_automation(stack, "full-every-few-sessions", "raj"),
             AUTOMATION_SECONDS, "the fifth-session run")
    assert len(_by_automation(stack, "full-every-few-sessions", "raj")) == 1


def _decay_runs_of(stack: Stack, replay_id: Any) -> list[Any]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with stack.client() as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[replay_id])))


def test_a_backfill_replays_each_profile_in_order_and_ends_as_sequential_runs(
    stack: Stack, new_store: Callable[[str], Store]
) -> None:
    from prefect.client.schemas.objects import StateType

    from models.export import export_jsonl

    start, days, profiles = datetime(2025, 9, 1), 10, ["leo-tutor", "maya"]
    whens = [start + timedelta(days=d) for d in range(days)]
    # The reference: the same profiles as they are now, run one date at a time below.
    reference = new_store("reference")
    copy_profiles(stack.store.url, reference.url, profiles)
    first = backfill("decay", start, whens[-1], timedelta(days=1), profiles, stack.store)
    assert first.where == "replay/backfill" and len(first.runs) == 2
    assert first.created == [w.isoformat() for w in whens] and first.skipped == []
    # Asked again while they are queued or running: no second replay for a profile.
    again = backfill("decay", start, whens[-1], timedelta(days=1), profiles, stack.store)
    assert again.runs == [] and sorted(again.running) == profiles
    for run_id in first.runs:
        assert stack.wait_final(run_id, timeout=300).state_type == StateType.COMPLETED
    # Each profile's dates ran one after another, in as_of order.
    for run_id in first.runs:
        runs = sorted(_decay_runs_of(stack, run_id), key=lambda r: r.start_time)
        assert [r.parameters["as_of"][:10] for r in runs] == [w.date().isoformat() for w in whens]
        assert all(a.end_time <= b.start_time for a, b in zip(runs, runs[1:]))
    # The store ends as ten one-at-a-time runs through the same dates leave it. They run
    # in a process of their own: Prefect keeps one slot-acquiring service per limit name
    # per process, bound to the API it first used, and this process has used the
    # session's API for these profiles already (acquired there, released here: a leak).
    runs = "\n".join(f"decay(profile={profiles!r}, as_of=datetime.fromisoformat({w.isoformat()!r}))"
                     for w in whens)
    subprocess.run(
        [sys.executable, "-c", f"from datetime import datetime\nfrom flows.decay import decay\n{runs}"],
        cwd=project_root(), check=True, timeout=600,
        env={**os.environ, "REVERIE_DATABASE_URL": reference.url, "PREFECT_API_URL": stack.api},
    )
    for profile in profiles:
        assert export_jsonl(stack.store.url, profile) == export_jsonl(reference.url, profile)
    # Done: a third backfill finds every date in the history and makes nothing.
    done = backfill("decay", start, whens[-1], timedelta(days=1), profiles, stack.store)
    assert done.runs == [] and done.created == [] and len(done.skipped) == days


def test_a_manual_run_for_a_date_equals_the_scheduled_run_for_it(stack: Stack) -> None:
    from prefect.client.schemas.objects import StateType
    from prefect.deployments import run_deployment
    from prefect.states import Scheduled

    when = datetime(2025, 8, 15)
    manual = run_deployment("lightweight-consolidation/on-demand", timeout=0,
                            parameters={"profile": "support-bot", "as_of": when.isoformat()})
    assert stack.wait_final(manual.id).state_type == StateType.COMPLETED
    with stack.client() as client:
        deployment = client.read_deployment_by_name("lightweight-consolidation/on-demand")
        scheduled = client.create_flow_run_from_deployment(
            deployment.id, parameters={"profile": "support-bot"},
            state=Scheduled(scheduled_time=when),
        )
    assert stack.wait_final(scheduled.id).state_type == StateType.COMPLETED
    runs = [r for r in stack.store.run_history(profile="support-bot", limit=None)
            if r.flow == "lightweight-consolidation"]
    assert {r.as_of for r in runs} == {when}
    # Same date, same store: the second run finds nothing left to do.
    first, second = sorted(runs, key=lambda r: r.started_at)
    assert first.changed > 0 and second.changed == 0


def test_two_concurrent_runs_for_one_profile_never_overlap(stack: Stack) -> None:
    from prefect.client.schemas.objects import StateType
    from prefect.deployments import run_deployment

    params = {"profile": "leo-tutor", "as_of": "2025-09-01T00:00:00Z"}
    runs = [run_deployment("full-consolidation/nightly", parameters=params, timeout=0,
                           idempotency_key=f"concurrency-test-{i}") for i in range(2)]
    assert all(stack.wait_final(r.id, 300).state_type == StateType.COMPLETED for r in runs)
    history = sorted(
        (r for r in stack.store.run_history(profile="leo-tutor", limit=None)
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
