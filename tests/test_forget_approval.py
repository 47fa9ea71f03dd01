"""Deletion waits for approval, on a real Prefect server with a process worker running
the ``operator`` deployment of prefect.yaml (flow ``forget``, auto_approve_deletion
false): a run that would delete pauses with its candidates published; approved, it
deletes exactly those; rejected, or left unanswered, it deletes nothing.

The stack deploys the operator deployment alone (no automations to compete for the
machine), so it starts faster than tests/test_platform.py's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployments.cli import EXIT_OK, main
from deployments.serve import project_root, start_stack, stop
from models.config import DEFAULT, ForgetConfig
from models.db import dispose
from models.store import Store
from models.tables import Tombstone
from tasks.decay import decay
from tasks.forget import DELETE, plan_forget
from tasks.step import StepArgs

from conftest import TEST_POSTGRES, _create_postgres_database, _drop_postgres_database, clone_sample
from prefect_reads import run_artifacts
from test_platform import AS_OF, Stack, free_port, wait_for

DEPLOYMENT = "forget/operator"
# Scored as of AS_OF, the sample's profiles have 19-33 unprotected memories below this.
DELETE_BELOW = 0.1


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, sample_template: Path) -> Iterator[Stack]:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    folder = tmp_path_factory.mktemp("approval")
    store_url = _create_postgres_database() if TEST_POSTGRES else f"sqlite:///{folder}/store.db"
    store = clone_sample(sample_template, Store(store_url))
    for profile in store.profiles():  # forget acts on the relevance decay stores
        decay(store, StepArgs(store_url, profile, AS_OF, DEFAULT))
    spec = yaml.safe_load((project_root() / "prefect.yaml").read_text())
    spec["deployments"] = [d for d in spec["deployments"] if d["name"] == "operator"]
    assert spec["deployments"][0]["parameters"]["auto_approve_deletion"] is False
    prefect_file = folder / "prefect.yaml"
    prefect_file.write_text(yaml.safe_dump(spec, sort_keys=False))

    port = free_port()
    saved = {k: os.environ.get(k) for k in ("REVERIE_DATABASE_URL", "PREFECT_WORKER_QUERY_SECONDS")}
    os.environ["REVERIE_DATABASE_URL"] = store_url
    os.environ["PREFECT_WORKER_QUERY_SECONDS"] = "2"
    log = folder / "stack.log"
    processes = start_stack(port, folder / "prefect-home", log, prefect_file)
    try:
        with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
            yield Stack(f"http://127.0.0.1:{port}/api", f"http://127.0.0.1:{port}", store, log)
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


def candidates(store: Store, profile: str) -> set[str]:
    """What the forget step itself selects for deletion."""
    config = ForgetConfig(delete_threshold=DELETE_BELOW)
    decisions = plan_forget(store.memories(profile), store.superseding_ids(profile), AS_OF, config)
    return {d.memory.id for d in decisions if d.action == DELETE}


def start(profile: str, **parameters: Any) -> Any:
    from prefect.deployments import run_deployment

    return run_deployment(DEPLOYMENT, timeout=0, parameters={
        "profile": profile, "as_of": AS_OF.isoformat(), "delete_threshold": DELETE_BELOW,
        **parameters})


def wait_paused(stack: Stack, run_id: Any) -> Any:
    def paused() -> Any:
        with stack.client() as client:
            run = client.read_flow_run(run_id)
        assert not (run.state and run.state.is_final()), stack.log.read_text()[-3000:]
        return run if run.state and run.state.is_paused() else None

    return wait_for(paused, 180, f"flow run {run_id} to pause for approval")


def approval_text(run_id: Any) -> str:
    versions = [a for a in run_artifacts(str(run_id)) if a.key == "forget-approval"]
    return max(versions, key=lambda a: a.created).data


def live(store: Store, profile: str) -> set[str]:
    return {m.id for m in store.memories(profile)}


def test_an_approved_deletion_deletes_exactly_what_it_listed(stack: Stack) -> None:
    doomed = candidates(stack.store, "leo-tutor")
    before = live(stack.store, "leo-tutor")
    assert len(doomed) >= 10
    run = start("leo-tutor")
    wait_paused(stack, run.id)
    text = approval_text(run.id)
    assert "**Approval:** waiting for approval" in text and f"reverie approve {run.id}" in text
    assert f"{len(doomed)} memories in 1 profile(s)" in text
    assert all(f"`{mid}`" in text for mid in doomed)
    assert live(stack.store, "leo-tutor") == before  # nothing deleted while it waits

    assert main(["approve", str(run.id), "--reason", "checked the list"]) == EXIT_OK
    final = stack.wait_final(run.id)
    assert final.state_type.value == "COMPLETED", stack.log.read_text()[-3000:]
    assert live(stack.store, "leo-tutor") == before - doomed
    assert all(isinstance(stack.store.get(mid, profile="leo-tutor"), Tombstone) for mid in doomed)
    assert "**Approval:** approved" in approval_text(run.id)


def test_a_rejected_or_unanswered_deletion_deletes_nothing(stack: Stack) -> None:
    from prefect.flow_runs import resume_flow_run

    before = {p: live(stack.store, p) for p in ("maya", "raj")}
    assert candidates(stack.store, "maya") and candidates(stack.store, "raj")
    rejected = start("maya")
    unanswered = start("raj", approval_timeout_seconds=5)
    wait_paused(stack, rejected.id)
    resume_flow_run(rejected.id, run_input={"approve": False, "reason": "not today"})
    assert stack.wait_final(rejected.id).state_type.value == "COMPLETED"
    assert stack.wait_final(unanswered.id).state_type.value == "FAILED"
    assert {p: live(stack.store, p) for p in ("maya", "raj")} == before
    assert "**Approval:** rejected" in approval_text(rejected.id)
    # The run's last artifact version may land just after the server marks it failed.
    wait_for(lambda: "**Approval:** no answer within 5 s" in approval_text(unanswered.id),
             60, "the timed-out approval artifact")
