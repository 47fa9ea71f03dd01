"""Runs whose process is gone end Crashed on their own, and each process of `reverie
serve` dying is contained: a real `reverie serve` (server, worker, flow runs), each of
its processes killed in turn with runs in flight, then the whole stack; nobody touches a
state, and the next run goes through."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import psutil
import pytest
from test_alerts import Inbox

from reverie.deployments.alerts import failure_automation
from reverie.deployments.crash_detection import (
    NOT_STARTED_AUTOMATION,
    RUN_TAG,
    UNRESPONSIVE_AUTOMATION,
    crash_automations,
    same_automation,
)
from reverie.deployments.serve import READY, WORK_POOL, project_root, stop
from reverie.models.store import Store

from prefect_stack import (
    EVENT_SECONDS,
    RUN_SECONDS,
    Stack,
    free_port,
    gone,
    wait_for,
    write_prefect_file,
)
from stubborn_flow import CHILD_MARKER

pytestmark = pytest.mark.store_independent(
    "the processes of `reverie serve` and Prefect's automations; no store is read")

HEARTBEAT_SECONDS = 30  # Prefect's floor
UNRESPONSIVE_SECONDS = 70
NOT_STARTED_SECONDS = 60
# Past the window: the triggers service's periodic look at proactive triggers and the
# action's state change, on 2 loaded cores.
CRASH_SLACK_SECONDS = 60
TEST_ALERT = "reverie-test-run-failed"


def test_the_automations_crash_only_reverie_runs_that_went_silent() -> None:
    unresponsive, not_started = crash_automations(50, 60)
    assert (unresponsive.name, not_started.name) == (UNRESPONSIVE_AUTOMATION,
                                                      NOT_STARTED_AUTOMATION)
    for automation in (unresponsive, not_started):
        trigger = automation.trigger
        assert trigger.posture == "Proactive" and trigger.threshold == 1
        assert trigger.for_each == {"prefect.resource.id"}
        assert trigger.match_related.model_dump() == {"prefect.resource.role": "tag",
                                               "prefect.resource.id": f"prefect.tag.{RUN_TAG}"}
        (action,) = automation.actions
        assert action.state.value == "CRASHED" and not action.force
    assert unresponsive.trigger.within.total_seconds() == 50
    assert not_started.trigger.within.total_seconds() == 60
    # A heartbeat re-arms the window; a paused run keeps its heartbeats, a suspended one
    # (its process released on purpose) is an end.
    assert "prefect.flow-run.heartbeat" in unresponsive.trigger.after & unresponsive.trigger.expect
    assert "prefect.flow-run.Suspended" in unresponsive.trigger.expect
    assert "prefect.flow-run.Paused" not in unresponsive.trigger.expect
    # Waiting for a concurrency slot is not being dead.
    assert "prefect.flow-run.AwaitingConcurrencySlot" in not_started.trigger.expect
    # serve updates an automation only when it changed: an update drops the trigger's
    # open windows, and the runs of a stack killed whole would never be crashed.
    assert same_automation(unresponsive, crash_automations(50, 60)[0])
    assert not same_automation(unresponsive, crash_automations(51, 60)[0])


def test_the_window_must_hold_a_late_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from reverie.models.settings import get_settings

    monkeypatch.setenv("REVERIE_HEARTBEAT_SECONDS", "60")
    monkeypatch.setenv("REVERIE_UNRESPONSIVE_SECONDS", "65")
    with pytest.raises(ValidationError, match="must exceed REVERIE_HEARTBEAT_SECONDS"):
        get_settings()


def _stubborn_tagged(spec: dict[str, Any]) -> None:
    spec["deployments"] = [{
        "name": "stubborn",
        "entrypoint": "tests/stubborn_flow.py:stubborn",
        "tags": [RUN_TAG],
        "work_pool": {"name": WORK_POOL, "work_queue_name": "default"},
    }]
    spec.pop("definitions", None)


class Serve:
    """`reverie serve` as an operator runs it, restartable on the same home and port."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, free_port()
        self.prefect_file = write_prefect_file(folder, _stubborn_tagged)
        self.out = folder / "serve.out"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.out.write_text("")
        self.process = subprocess.Popen(
            [sys.executable, "-c",
             "import sys; from pathlib import Path; from reverie.deployments.serve import "
             "serve; sys.exit(serve(int(sys.argv[1]), Path(sys.argv[2]), "
             "prefect_file=Path(sys.argv[3])))",
             str(self.port), str(self.folder / "home"), str(self.prefect_file)],
            cwd=project_root(), stdout=self.out.open("ab"), stderr=subprocess.STDOUT,
        )
        wait_for(lambda: self.process.poll() is not None or READY in self.output(), 180,
                 "serve to be up", diagnose=lambda: self.output()[-3000:])
        assert self.process.poll() is None, self.output()[-3000:]

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def tree(self) -> list[psutil.Process]:
        assert self.process is not None
        return psutil.Process(self.process.pid).children(recursive=True)

    def role(self, words: str) -> psutil.Process:
        (found,) = [p for p in self.tree() if words in " ".join(p.cmdline())
                    and p.parent().pid == self.process.pid]
        return found


@pytest.fixture
def serving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Serve]:
    monkeypatch.setenv("REVERIE_DATABASE_URL", f"sqlite:///{tmp_path / 'store.db'}")
    Store(f"sqlite:///{tmp_path / 'store.db'}").create()
    monkeypatch.setenv("PREFECT_WORKER_QUERY_SECONDS", "2")
    monkeypatch.setenv("REVERIE_HEARTBEAT_SECONDS", str(HEARTBEAT_SECONDS))
    monkeypatch.setenv("REVERIE_UNRESPONSIVE_SECONDS", str(UNRESPONSIVE_SECONDS))
    monkeypatch.setenv("REVERIE_NOT_STARTED_SECONDS", str(NOT_STARTED_SECONDS))
    served = Serve(tmp_path)
    try:
        yield served
    finally:
        if served.process is not None:
            left = served.tree()
            stop([served.process])
            for process in left:
                with suppress(psutil.Error):
                    process.kill()


# About 7.5 minutes, most of it waiting out five windows: handed to a process first.
@pytest.mark.slow(seconds=450)
def test_each_process_killed_in_turn_leaves_no_run_running_and_the_next_run_goes(
    serving: Serve, tmp_path: Path
) -> None:
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    inbox = Inbox()
    serving.start()
    api = f"http://127.0.0.1:{serving.port}/api"
    stack = Stack(serving.port, tmp_path / "home", tmp_path / "home" / "stack.log",
                  Store(f"sqlite:///{tmp_path / 'store.db'}"), [])
    try:
        with temporary_settings({PREFECT_API_URL: api}):
            CustomWebhookNotificationBlock(
                name="ops", url=inbox.url,
                json_data={"subject": "{{subject}}", "body": "{{body}}"},
            ).save("ops")
            # The failure alert as serve makes it, for the test's flow (not a Reverie
            # flow, so not in Reverie's own list) and under a name serve leaves alone.
            with stack.client() as client:
                block = client.read_block_document_by_name("ops", "custom-webhook")
                client.create_automation(failure_automation(block.id, ["stubborn"])
                                         .model_copy(update={"name": TEST_ALERT}))

            def in_flight() -> tuple[Any, psutil.Process]:
                """A run of the stubborn deployment, Running, and its flow-run process."""
                run = run_deployment("stubborn/stubborn", timeout=0,
                                     parameters={"stubborn": False})

                def running() -> psutil.Process | None:
                    state = stack.read_run(run.id).state_type.value
                    assert state in ("SCHEDULED", "PENDING", "RUNNING"), state
                    child = next((p for p in serving.tree() if CHILD_MARKER in p.cmdline()),
                                 None)
                    return state == "RUNNING" and child and child.parent()

                return run, wait_for(running, RUN_SECONDS, "the run and its process",
                                     diagnose=lambda: stack.describe_runs())

            def ends_crashed(run: Any, since: float) -> float:
                ended = stack.wait_final(run.id)
                assert ended.state.name == "Crashed", stack.describe_runs([ended])
                print(f"{ended.name}: Crashed {time.monotonic() - since:.0f} s after the kill",
                      flush=True)
                return time.monotonic() - since

            def processes_gone(processes: list[psutil.Process]) -> None:
                wait_for(lambda: all(gone(p) for p in processes), 60,
                         "the dead process's flow runs to be ended",
                         diagnose=lambda: serving.output()[-3000:])

            crashed: dict[str, float] = {}
            # 1. The worker, SIGKILL then SIGTERM: serve ends its flow runs and starts
            #    another worker; the server stays up.
            for signum in (signal.SIGKILL, signal.SIGTERM):
                run, flow_process = in_flight()
                doomed = [flow_process, *flow_process.children(recursive=True)]
                worker = serving.role("worker start")
                killed = time.monotonic()
                worker.send_signal(signum)
                processes_gone(doomed)
                crashed[f"worker {signum.name}"] = ends_crashed(run, killed)
                wait_for(lambda: "the Prefect worker is running again" in serving.output(),
                         60, "serve to restart the worker")
            # 2. The server, SIGKILL then SIGTERM: serve starts it again on its database;
            #    a run in flight carries on and can still be ended, and a dead flow-run
            #    process is caught by its missing heartbeats.
            for restarts, signum in enumerate((signal.SIGKILL, signal.SIGTERM), 1):
                run, flow_process = in_flight()
                server = serving.role("server start")
                server.send_signal(signum)
                wait_for(lambda n=restarts: serving.output().count(
                         "the Prefect server is running again") >= n, 180,
                         "serve to restart the server",
                         diagnose=lambda: serving.output()[-3000:])
                assert stack.read_run(run.id).state_type.value == "RUNNING"
                # Its worker would report a dead child; kill both, as a lost machine would.
                worker = serving.role("worker start")
                killed = time.monotonic()
                for process in (worker, flow_process, *flow_process.children(recursive=True)):
                    process.send_signal(signal.SIGKILL)
                crashed[f"server {signum.name}, then worker and run SIGKILL"] = ends_crashed(
                    run, killed)
            # 3. The whole stack at once, SIGKILL: nothing can report anything. serve
            #    started again on the same home finds the run Crashed within the bound.
            run, _ = in_flight()
            everything = [psutil.Process(serving.process.pid), *serving.tree()]
            killed = time.monotonic()
            for process in everything:
                with suppress(psutil.Error):
                    process.send_signal(signal.SIGKILL)
            serving.process.wait()
            processes_gone(everything)
            serving.start()
            # Timed from the kill, or from serve's return if later: nothing runs the
            # automation while the server is down.
            crashed["whole stack SIGKILL"] = ends_crashed(
                run, max(killed, time.monotonic() - UNRESPONSIVE_SECONDS))
            # Nobody touched a state: the next run goes through.
            after = run_deployment("stubborn/stubborn", timeout=0,
                                   parameters={"stubborn": False, "seconds": 1})
            assert stack.wait_final(after.id).state.name == "Completed", stack.describe_runs()
            # The failure alert fired for every crashed run.
            wait_for(lambda: len(inbox.messages) >= len(crashed), EVENT_SECONDS,
                     "an alert per crashed run",
                     diagnose=lambda: "\n".join([
                         stack.describe_automation(TEST_ALERT), stack.describe_runs(),
                         "alerts: " + repr([m["subject"] for m in inbox.messages])]))
            assert all("crashed" in m["subject"] for m in inbox.messages)
    finally:
        inbox.server.shutdown()
    print("seconds from the kill to Crashed:", {k: round(v) for k, v in crashed.items()})
    bound = UNRESPONSIVE_SECONDS + CRASH_SLACK_SECONDS
    assert all(seconds < bound for seconds in crashed.values()), crashed
