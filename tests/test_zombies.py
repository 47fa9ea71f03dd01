"""Runs whose process is gone end Crashed on their own, and each process of `reverie
serve` dying is contained: a real `reverie serve` (server, worker, flow runs), each of
its processes killed in turn with runs in flight, then the whole stack mid-backfill;
nobody touches a state, and the next runs go through: a run, the backfill run again,
the cron schedule. A run left Pending or Cancelling with no process is crashed too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from test_alerts import Inbox

from reverie.deployments.alerts import failure_automation
from reverie.deployments.backfill import backfill
from reverie.deployments.crash_detection import (
    NOT_STARTED_AUTOMATION,
    RUN_TAG,
    UNRESPONSIVE_AUTOMATION,
    crash_automations,
    same_automation,
)
from reverie.deployments.serve import (
    PREFECT_DATABASE_VARIABLE,
    READY,
    WORK_POOL,
    project_root,
    stop,
)
from reverie.models.db import copy_profiles
from reverie.models.store import Store

from conftest import clone_sample, prefect_home
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
# The whole-stack test's window: its replay is a live run of decay flows, each importing
# the model in a process of its own, and on 2 cores loaded by `make test` 70 s dropped a
# live replay as silent (CI of c7369a9: its heartbeats came, late, through a server whose
# event hops have taken over 40 s). The first test holds the short window's bound.
BACKFILL_UNRESPONSIVE_SECONDS = 150
NOT_STARTED_SECONDS = 60
# Past the window: the triggers service's periodic look at proactive triggers and the
# action's state change, on 2 loaded cores.
CRASH_SLACK_SECONDS = 60
TEST_ALERT = "reverie-test-run-failed"
LEASE_SECONDS = 20
CANCELLING_SECONDS = 60
# The scheduler's own runs: one a minute, so one comes soon after a restart.
CRON = "* * * * *"
PROFILE = "support-bot"
BACKFILL_DAYS = 8
ADVICE = "warning: Prefect's database is on SQLite and the store has"


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


@pytest.mark.usefixtures("prefect_api")
def test_a_server_you_run_yourself_gets_the_same_crash_detection(
    capsys: pytest.CaptureFixture[str]
) -> None:
    """The scale-out path (prefect deploy --all and your own workers) has no `reverie
    serve` to keep the automations: `reverie crash-detection` keeps them, once each."""
    from prefect.client.orchestration import get_client

    from reverie.deployments.cli import EXIT_OK, main

    assert main(["crash-detection"]) == EXIT_OK
    assert main(["crash-detection"]) == EXIT_OK  # brought in line, never doubled
    said = capsys.readouterr().out
    assert "marked Crashed 90 s after its last heartbeat (Pending: after 300 s)" in said
    assert "PREFECT_FLOWS_HEARTBEAT_FREQUENCY=30" in said
    wanted = crash_automations(90, 300)
    with get_client(sync_client=True) as client:
        for automation in wanted:
            (found,) = client.read_automations_by_name(automation.name)
            assert found.enabled and same_automation(found, automation)


def test_the_window_must_hold_a_late_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from reverie.models.settings import get_settings

    monkeypatch.setenv("REVERIE_HEARTBEAT_SECONDS", "60")
    monkeypatch.setenv("REVERIE_UNRESPONSIVE_SECONDS", "65")
    with pytest.raises(ValidationError, match="must exceed REVERIE_HEARTBEAT_SECONDS"):
        get_settings()


def _deployments(*, backfill: bool) -> Callable[[dict[str, Any]], None]:
    """The test's prefect.yaml: the stubborn flow, tagged as Reverie's runs are; with
    ``backfill``, the project's backfill deployment too, and a cron schedule of its own
    (the stubborn flow again, ending at once) that the scheduler runs every minute."""
    def edit(spec: dict[str, Any]) -> None:
        pool = {"name": WORK_POOL, "work_queue_name": "default"}
        stubborn = {"entrypoint": "tests/stubborn_flow.py:stubborn", "tags": [RUN_TAG],
                    "work_pool": pool}
        deployments: list[dict[str, Any]] = [{"name": "stubborn", **stubborn}]
        if backfill:
            (replay,) = [d for d in spec["deployments"] if d["name"] == "backfill"]
            deployments += [
                {**replay, "work_pool": pool},
                {"name": "cron", **stubborn, "parameters": {"stubborn": False, "seconds": 1},
                 "schedules": [{"cron": CRON, "timezone": "UTC", "active": True}]},
            ]
        spec["deployments"] = deployments
        spec.pop("definitions", None)

    return edit


class Serve:
    """`reverie serve` as an operator runs it, restartable on the same home and port."""

    def __init__(self, folder: Path, edit: Callable[[dict[str, Any]], None],
                 unresponsive: int) -> None:
        self.folder, self.port, self.unresponsive = folder, free_port(), unresponsive
        self.prefect_file = write_prefect_file(folder, edit)
        prefect_home(folder / "home")
        self.out = folder / "serve.out"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.out.write_text("")
        env = {**os.environ, "REVERIE_UNRESPONSIVE_SECONDS": str(self.unresponsive)}
        self.process = subprocess.Popen(
            [sys.executable, "-c",
             "import sys; from pathlib import Path; from reverie.deployments.serve import "
             "serve; sys.exit(serve(int(sys.argv[1]), Path(sys.argv[2]), "
             "prefect_file=Path(sys.argv[3])))",
             str(self.port), str(self.folder / "home"), str(self.prefect_file)],
            cwd=project_root(), stdout=self.out.open("ab"), stderr=subprocess.STDOUT, env=env,
        )
        log = self.folder / "home" / "stack.log"
        # Stuck only when neither serve nor its stack log moves: on 2 cores at load 20,
        # a steadily starting stack has taken over 3 minutes.
        wait_for(lambda: self.process.poll() is not None or READY in self.output(), 180,
                 "serve to be up", diagnose=lambda: self.output()[-3000:],
                 progress=lambda: (self.output(), log.stat().st_size if log.exists() else 0))
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

    def flow_process(self, run_id: Any) -> psutil.Process | None:
        """The process running flow run ``run_id``, once its stubborn child is up."""
        for process in self.tree():
            with suppress(psutil.Error):
                parent = process.parent()
                if (CHILD_MARKER in process.cmdline() and parent is not None
                        and parent.environ().get("PREFECT__FLOW_RUN_ID") == str(run_id)):
                    return parent
        return None


@pytest.fixture
def serving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
            ) -> Iterator[Callable[[Callable[[dict[str, Any]], None]], Serve]]:
    monkeypatch.setenv("REVERIE_DATABASE_URL", f"sqlite:///{tmp_path / 'store.db'}")
    Store(f"sqlite:///{tmp_path / 'store.db'}").create()
    monkeypatch.setenv("PREFECT_WORKER_QUERY_SECONDS", "2")
    monkeypatch.setenv("REVERIE_HEARTBEAT_SECONDS", str(HEARTBEAT_SECONDS))
    monkeypatch.setenv("REVERIE_NOT_STARTED_SECONDS", str(NOT_STARTED_SECONDS))
    # The every-minute cron: three runs ahead, not Prefect's hundred rows in its SQLite.
    monkeypatch.setenv("PREFECT_SERVER_SERVICES_SCHEDULER_MAX_RUNS", "3")
    # Prefect's own end for a Cancelling run that no process acts on (300 s by default).
    monkeypatch.setenv("PREFECT_SERVER_SERVICES_CANCELLATION_CLEANUP_CANCELLING_TIMEOUT_SECONDS",
                       str(CANCELLING_SECONDS))
    # Below the sample store's 4 profiles: serve's advice on Prefect's database shows.
    monkeypatch.setenv("REVERIE_PREFECT_SQLITE_PROFILES", "3")
    # A killed run's hold on its profile lapses this soon, not after 2 minutes.
    monkeypatch.setenv("REVERIE_LEASE_SECONDS", str(LEASE_SECONDS))
    made: list[Serve] = []

    def make(edit: Callable[[dict[str, Any]], None],
             unresponsive: int = UNRESPONSIVE_SECONDS) -> Serve:
        made.append(Serve(tmp_path, edit, unresponsive))
        return made[-1]

    try:
        yield make
    finally:
        for served in made:
            if served.process is not None:
                left = served.tree()
                stop([served.process])
                for process in left:
                    with suppress(psutil.Error):
                        process.kill()


class Drill:
    """A served stack with the failure alert on the stubborn deployment, and what the
    tests do to it: start a run, kill, wait for the Crashed state and the alerts."""

    def __init__(self, serving: Serve, tmp_path: Path) -> None:
        from prefect.blocks.notifications import CustomWebhookNotificationBlock

        self.serving, self.inbox = serving, Inbox()
        self.stack = Stack(serving.port, tmp_path / "home", tmp_path / "home" / "stack.log",
                           Store(f"sqlite:///{tmp_path / 'store.db'}"), [])
        self.crashed: dict[str, float] = {}
        self.other: dict[str, float] = {}  # ended otherwise (Cancelled): no alert
        CustomWebhookNotificationBlock(
            name="ops", url=self.inbox.url,
            json_data={"subject": "{{subject}}", "body": "{{body}}"},
        ).save("ops")
        # The failure alert as serve makes it, for the test's flow (not a Reverie flow,
        # so not in Reverie's own list) and under a name serve leaves alone.
        with self.stack.client() as client:
            block = client.read_block_document_by_name("ops", "custom-webhook")
            client.create_automation(failure_automation(block.id, ["stubborn"])
                                     .model_copy(update={"name": TEST_ALERT}))

    def in_flight(self) -> tuple[Any, psutil.Process]:
        """A run of the stubborn deployment, Running, and its flow-run process."""
        from prefect.deployments import run_deployment

        run = run_deployment("stubborn/stubborn", timeout=0, parameters={"stubborn": False})

        def running() -> psutil.Process | None:
            state = self.stack.read_run(run.id).state_type.value
            assert state in ("SCHEDULED", "PENDING", "RUNNING"), state
            return self.serving.flow_process(run.id) if state == "RUNNING" else None

        return run, wait_for(running, RUN_SECONDS, "the run and its process",
                             diagnose=lambda: self.stack.describe_runs())

    def ends_crashed(self, what: str, run: Any, since: datetime, state: str = "Crashed") -> None:
        """Timed by the server's clock on the state (this machine's): a run looked at
        after another wait may have ended long before."""
        ended = self.stack.wait_final(run.id)
        assert ended.state.name == state, self.stack.describe_runs([ended])
        seconds = (ended.state.timestamp - since).total_seconds()
        (self.crashed if state == "Crashed" else self.other)[what] = seconds
        print(f"{what}: {state} {seconds:.0f} s after", flush=True)

    def processes_gone(self, processes: list[psutil.Process]) -> None:
        wait_for(lambda: all(gone(p) for p in processes), 60,
                 "the dead process's flow runs to be ended",
                 diagnose=lambda: self.serving.output()[-3000:])

    def kill_everything(self) -> datetime:
        """SIGKILL to serve and all it started at once: nothing can report anything."""
        assert self.serving.process is not None
        everything = [psutil.Process(self.serving.process.pid), *self.serving.tree()]
        killed = datetime.now(UTC)
        for process in everything:
            with suppress(psutil.Error):
                process.send_signal(signal.SIGKILL)
        self.serving.process.wait()
        self.processes_gone(everything)
        return killed

    def next_run_goes(self) -> None:
        """Nobody touched a state: the next run goes through."""
        from prefect.deployments import run_deployment

        after = run_deployment("stubborn/stubborn", timeout=0,
                               parameters={"stubborn": False, "seconds": 1})
        assert self.stack.wait_final(after.id).state.name == "Completed", \
            self.stack.describe_runs()

    def alerted_and_in_time(self) -> None:
        """The failure alert fired for every crashed run of the stubborn deployment,
        each within the bound."""
        stubborn = [k for k in self.crashed if not k.startswith("replay")]
        wait_for(lambda: len(self.inbox.messages) >= len(stubborn), EVENT_SECONDS,
                 "an alert per crashed run",
                 diagnose=lambda: "\n".join([
                     self.stack.describe_automation(TEST_ALERT), self.stack.describe_runs(),
                     "alerts: " + repr([m["subject"] for m in self.inbox.messages])]))
        assert all("crashed" in m["subject"] for m in self.inbox.messages)
        ended = {**self.crashed, **self.other}
        print("seconds to the end:", {k: round(v) for k, v in ended.items()})
        bound = max(self.serving.unresponsive, NOT_STARTED_SECONDS,
                    CANCELLING_SECONDS) + CRASH_SLACK_SECONDS
        assert all(seconds < bound for seconds in ended.values()), ended


@contextmanager
def drill(serving: Serve, tmp_path: Path) -> Iterator[Drill]:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    serving.start()
    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{serving.port}/api"}):
        drilled = Drill(serving, tmp_path)
        try:
            yield drilled
        finally:
            drilled.inbox.server.shutdown()


# Two tests, each with a stack of its own: pytest-xdist runs them side by side.
# About 7 minutes, most of it waiting out five windows: handed to a process first.
@pytest.mark.slow(seconds=430)
def test_a_dead_worker_or_server_leaves_no_run_running_and_the_next_run_goes(
    serving: Callable[[Callable[[dict[str, Any]], None]], Serve], tmp_path: Path
) -> None:
    from prefect.states import Cancelling, Pending, Scheduled

    served = serving(_deployments(backfill=False))
    with drill(served, tmp_path) as d:
        stack = d.stack
        assert ADVICE not in served.output()  # no profile: no advice on Prefect's database
        # 0. A run its worker took (Pending) and died before starting: the not-started
        #    automation crashes it while the rest goes on. Its time is a day away, so no
        #    worker takes it; forced, as the server keeps it Scheduled until its time.
        with stack.client() as client:
            deployment = client.read_deployment_by_name("stubborn/stubborn")
            stuck = client.create_flow_run_from_deployment(
                deployment.id, parameters={"stubborn": False},
                state=Scheduled(scheduled_time=datetime.now(UTC) + timedelta(days=1)))
            client.set_flow_run_state(stuck.id, Pending(), force=True)
        pending_since = time.monotonic()
        # 1. The worker, SIGKILL then SIGTERM: serve ends its flow runs and starts
        #    another worker; the server stays up. Their windows run side by side.
        doomed_runs = []
        for restarts, signum in enumerate((signal.SIGKILL, signal.SIGTERM), 1):
            run, flow_process = d.in_flight()
            doomed = [flow_process, *flow_process.children(recursive=True)]
            worker = served.role("worker start")
            doomed_runs.append((f"worker {signum.name}", run, datetime.now(UTC)))
            worker.send_signal(signum)
            d.processes_gone(doomed)
            wait_for(lambda n=restarts: served.output().count(
                     "the Prefect worker is running again") >= n, 60,
                     "serve to restart the worker")
        # Ended before the server goes down: a window across a server restart is
        # another case (2., and the whole stack in the next test).
        for what, run, killed in doomed_runs:
            d.ends_crashed(what, run, killed)
        # 2. The server, SIGKILL then SIGTERM: serve starts it again on its database; a
        #    run in flight carries on and can still be ended, and a dead flow-run process
        #    is caught by its missing heartbeats.
        for restarts, signum in enumerate((signal.SIGKILL, signal.SIGTERM), 1):
            run, flow_process = d.in_flight()
            server = served.role("server start")
            server.send_signal(signum)
            wait_for(lambda n=restarts: served.output().count(
                     "the Prefect server is running again") >= n, 180,
                     "serve to restart the server",
                     diagnose=lambda: served.output()[-3000:])
            assert stack.read_run(run.id).state_type.value == "RUNNING"
            # Its worker would report a dead child; kill both, as a lost machine would.
            worker = served.role("worker start")
            killed = datetime.now(UTC)
            for process in (worker, flow_process, *flow_process.children(recursive=True)):
                process.send_signal(signal.SIGKILL)
            what = f"server {signum.name}, then worker and run SIGKILL"
            if signum == signal.SIGKILL:
                d.ends_crashed(what, run, killed)
                continue
            # Cancelled once its process is gone (as an operator does with a run that
            # will not end): no process is left to act on Cancelling. Prefect lets a
            # Cancelling run become only Cancelled, so the crash automation's action is
            # refused; Prefect's cancellation cleanup ends it Cancelled instead.
            with stack.client() as client:
                client.set_flow_run_state(run.id, Cancelling())
            cancelled = datetime.now(UTC)
            assert stack.read_run(run.id).state.name == "Cancelling"
            d.ends_crashed(what + ", then cancelled", run, cancelled, state="Cancelled")
            assert "cancellation timed out" in stack.read_run(run.id).state.message
        ended = stack.wait_final(stuck.id)
        assert ended.state.name == "Crashed" and "Pending for" in ended.state.message, \
            stack.describe_runs([ended])
        d.crashed["Pending, its worker gone"] = (
            ended.state.timestamp - stuck.created).total_seconds()
        assert time.monotonic() - pending_since >= NOT_STARTED_SECONDS
        d.next_run_goes()
        d.alerted_and_in_time()


def _replay_children(stack: Stack, replay_id: Any) -> list[Any]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with stack.client() as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[replay_id])))


@pytest.mark.slow(seconds=370)
def test_a_stack_killed_whole_mid_backfill_resumes_it_and_its_schedule_after_a_restart(
    serving: Callable[[Callable[[dict[str, Any]], None]], Serve], tmp_path: Path,
    sample_template: Path,
) -> None:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
    from prefect.client.schemas.objects import StateType

    from reverie.models.export import export_jsonl

    store = clone_sample(sample_template, Store(f"sqlite:///{tmp_path / 'store.db'}"))
    reference = Store(f"sqlite:///{tmp_path / 'reference.db'}")
    copy_profiles(store.url, reference.url, [PROFILE])
    start = datetime(2025, 9, 1)
    whens = [start + timedelta(days=n) for n in range(BACKFILL_DAYS)]
    served = serving(_deployments(backfill=True), BACKFILL_UNRESPONSIVE_SECONDS)
    with drill(served, tmp_path) as d:
        stack = d.stack
        # 4 profiles, the limit set to 3, Prefect on SQLite: serve says what to use.
        assert ADVICE in served.output() and PREFECT_DATABASE_VARIABLE in served.output()
        run, _ = d.in_flight()
        first = backfill("decay", start, whens[-1], timedelta(days=1), PROFILE, store)
        (replay_id,) = first.runs

        def done() -> int:
            return sum(r.state_type == StateType.COMPLETED
                       for r in _replay_children(stack, replay_id))

        # Mid-run: some of its dates done, the rest to come.
        wait_for(lambda: done() >= 2, RUN_SECONDS, "the replay's first two dates",
                 progress=done, diagnose=lambda: stack.describe_runs())
        assert done() < BACKFILL_DAYS
        # The whole stack at once, SIGKILL; serve started again on the same home finds
        # the runs Crashed within the bound, timed from the kill, or from serve's return
        # if later: nothing runs the automation while the server is down.
        killed = d.kill_everything()
        served.start()
        restarted = datetime.now(UTC)
        since = max(killed, datetime.now(UTC) - timedelta(seconds=served.unresponsive))
        d.ends_crashed("whole stack SIGKILL", run, since)
        d.ends_crashed("replay, whole stack SIGKILL", stack.read_run(replay_id), since)
        # The same backfill again, nobody having touched a state: it makes one replay
        # for the dates the store's history lacks, which ends as one-at-a-time runs do.
        again = backfill("decay", start, whens[-1], timedelta(days=1), PROFILE, store)
        assert len(again.runs) == 1 and again.running == [], again
        assert 2 <= len(again.skipped) < BACKFILL_DAYS, again
        resumed = stack.wait_final(
            again.runs[0], steps=lambda: len(_replay_children(stack, again.runs[0])))
        assert resumed.state_type == StateType.COMPLETED, stack.describe_runs([resumed])
        runs = "\n".join(
            f"decay(profile={PROFILE!r}, as_of=datetime.fromisoformat({w.isoformat()!r}))"
            for w in whens)
        subprocess.run(
            [sys.executable, "-c",
             f"from datetime import datetime\nfrom reverie.flows.decay import decay\n{runs}"],
            cwd=project_root(), check=True, timeout=600,
            env={**os.environ, "REVERIE_DATABASE_URL": reference.url,
                 "PREFECT_API_URL": stack.api},
        )
        assert export_jsonl(store.url, PROFILE) == export_jsonl(reference.url, PROFILE)
        # The schedule goes on: a run the scheduler made for after the restart runs.
        def scheduled_after_restart() -> Any:
            with stack.client() as client:
                runs = client.read_flow_runs(deployment_filter=DeploymentFilter(
                    name=DeploymentFilterName(any_=["cron"])), limit=200)
            return next((r for r in runs if r.auto_scheduled and r.expected_start_time
                         and r.expected_start_time > restarted
                         and r.state_type == StateType.COMPLETED), None)

        wait_for(scheduled_after_restart, RUN_SECONDS, "a scheduled run after the restart",
                 diagnose=lambda: stack.describe_runs())
        d.alerted_and_in_time()
