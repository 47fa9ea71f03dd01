"""Deletion waits for approval, on a real Prefect server with a process worker running
the ``operator`` deployment of prefect.yaml (flow ``forget``, auto_approve_deletion
false): a run that would delete pauses with its candidates published; approved, it
deletes exactly those; rejected, or left unanswered, it deletes nothing.

The stack deploys the operator deployment alone (no automations to compete for the
machine), so it starts faster than tests/test_platform.py's.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from reverie.deployments.cli import EXIT_OK, main
from reverie.models.config import DEFAULT, ForgetConfig
from reverie.models.repositories import forgetting as forgetting_repo
from reverie.models.repositories import memories as memories_repo
from reverie.models.store import Store
from reverie.models.tables import Tombstone
from reverie.tasks.decay import decay
from reverie.tasks.forget import DELETE, plan_forget
from reverie.tasks.step import StepArgs

from conftest import clone_sample
from factories import get_memory, in_read
from prefect_reads import run_artifacts
from prefect_stack import (
    EVENT_SECONDS,
    RUN_SECONDS,
    Stack,
    new_store_url,
    running_stack,
    wait_for,
    write_prefect_file,
)

AS_OF = datetime(2025, 7, 1)
DEPLOYMENT = "forget/operator"
# Scored as of AS_OF, the sample's profiles have 19-33 unprotected memories below this.
DELETE_BELOW = 0.1


def _operator_only(spec: dict[str, Any]) -> None:
    spec["deployments"] = [d for d in spec["deployments"] if d["name"] == "operator"]
    assert spec["deployments"][0]["parameters"]["auto_approve_deletion"] is False


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, sample_template: Path) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("approval")
    with new_store_url(folder) as store_url:
        store = clone_sample(sample_template, Store(store_url))
        for profile in store.profiles():  # forget acts on the relevance decay stores
            decay(store, StepArgs(store_url, profile, AS_OF, DEFAULT))
        prefect_file = write_prefect_file(folder, _operator_only)
        with running_stack(folder, store_url, prefect_file) as running:
            yield running


def candidates(store: Store, profile: str) -> set[str]:
    """What the forget step itself selects for deletion."""
    config = ForgetConfig(delete_threshold=DELETE_BELOW)
    decisions = plan_forget(in_read(store, profile, memories_repo.memories), in_read(store, profile, forgetting_repo.superseding_ids), AS_OF, config)
    return {d.memory.id for d in decisions if d.action == DELETE}


def start(profile: str, **parameters: Any) -> Any:
    from prefect.deployments import run_deployment

    return run_deployment(DEPLOYMENT, timeout=0, parameters={
        "profile": profile, "as_of": AS_OF.isoformat(), "delete_threshold": DELETE_BELOW,
        **parameters})


def wait_paused(stack: Stack, run_id: Any) -> Any:
    seen: list[Any] = []

    def paused() -> Any:
        run = stack.read_run(run_id)
        seen[:] = [run]
        assert not (run.state and run.state.is_final()), stack.log_tail()
        return run if run.state and run.state.is_paused() else None

    return wait_for(paused, RUN_SECONDS, f"flow run {run_id} to pause for approval",
                    progress=lambda: seen[0].state_type if seen else None,
                    diagnose=lambda: stack.describe_runs(seen) + "\n" + stack.log_tail())


def approval_text(run_id: Any) -> str:
    versions = [a for a in run_artifacts(str(run_id)) if a.key == "forget-approval"]
    return max(versions, key=lambda a: a.created).data


def live(store: Store, profile: str) -> set[str]:
    return {m.id for m in in_read(store, profile, memories_repo.memories)}


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
    assert final.state_type.value == "COMPLETED", stack.log_tail()
    assert live(stack.store, "leo-tutor") == before - doomed
    assert all(isinstance(get_memory(stack.store, mid, profile="leo-tutor"), Tombstone) for mid in doomed)
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
    timed_out = stack.wait_final(unanswered.id)
    assert timed_out.state_type.value == "FAILED"
    # The run's state says why it failed, not Prefect's generic pause message. The server
    # may fail the paused run first, with its own message, just before the run's own
    # Failed state replaces it: wait for that, as for the artifact below.
    wait_for(lambda: "no approval within 5 s" in (stack.read_run(unanswered.id).state.message
                                                  or ""),
             EVENT_SECONDS, "the timed-out run's own state message",
             diagnose=lambda: str(stack.read_run(unanswered.id).state.message))
    assert stack.read_run(unanswered.id).state_type.value == "FAILED"
    assert {p: live(stack.store, p) for p in ("maya", "raj")} == before
    assert "**Approval:** rejected" in approval_text(rejected.id)
    # The run's last artifact version may land just after the server marks it failed.
    wait_for(lambda: "**Approval:** no answer within 5 s" in approval_text(unanswered.id),
             EVENT_SECONDS, "the timed-out approval artifact",
             diagnose=lambda: "its latest version:\n" + approval_text(unanswered.id))
