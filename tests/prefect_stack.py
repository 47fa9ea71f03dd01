"""A real Prefect stack for the platform tests, and waiting on what it does.

``running_stack`` starts what ``reverie serve`` starts (a Prefect server on loopback,
the work pool, the deployments of a prefect.yaml, a process worker), waits until the
stack can do what the tests ask of it (the worker polls its pool; the triggers service
evaluates the deployments' automations), and stops it all afterwards.

Every wait is on the thing itself: a flow run's state, an event the server stored, an
automation's firing, a store row. ``wait_for`` polls, and when it gives up its message
names what it waited for and what it found instead. Waits on something that advances
step by step (runs appearing one after another, a run moving through its states) time
out only when nothing advanced for their timeout: a loaded machine that is slowly
getting there is not failed, a stuck one still is.

Each automation that Prefect runs leaves events (``prefect.automation.triggered`` when
it fires, then ``prefect.automation.action.triggered`` and ``...executed`` or
``...failed``); the tests read them through the server's events API to tell "not
triggered" from "not yet".
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from reverie.deployments.serve import WORK_POOL, project_root, start_server, start_stack, stop
from reverie.models import outbox
from reverie.models.db import dispose
from reverie.models.store import Store
from reverie.runner import event_delivery

from conftest import (
    TEST_POSTGRES,
    _create_postgres_store,
    _drop_postgres_database_soon,
    clone_sample,
    prefect_database,
    prefect_home,
)

FINAL = frozenset({"COMPLETED", "FAILED", "CRASHED", "CANCELLED"})
# The crash automation's window for these stacks' runs (serve's default: 90 s). A run's
# heartbeat is one more event through the server's pipeline, and on 2 loaded cores a hop
# of it has taken over 40 s (below): a window of 90 s against heartbeats every 30 s
# leaves 60 s of lag before a live run is set Crashed, and CI (2e9e0de, on a host 2.5x
# slower) saw a backfill's replay end Crashed. tests/test_zombies.py holds the automation
# itself, on a stack of its own.
UNRESPONSIVE_SECONDS = 600
POLL_SECONDS = 0.5
# The worker polls its pool this often: runs start within seconds of being scheduled.
WORKER_QUERY_SECONDS = 2
# A stage of the stack's event handling making no progress for this long is stuck. One
# stage is one hop: the store's outbox to the server, the server storing an event it
# received (its persister flushes every 5 s), the triggers service firing an automation
# on it, the actions service creating the run. Each takes seconds on an idle machine;
# on 2 loaded cores (a parallel `make test`, and six flow-run processes importing torch)
# a hop has taken over 40 s.
EVENT_SECONDS = 180.0
# A flow run staying in one state this long is stuck: the worker picks it up within
# WORKER_QUERY_SECONDS, its process starts in seconds (a minute under load), and the
# longest single run here (a backfill's replay of ten dates) takes about a minute.
RUN_SECONDS = 300.0
# However steady the progress, a wait ends after this many of its timeouts.
MAX_TIMEOUTS = 4
# The events and the automation the stack's readiness check uses.
PROBE_EVENT = "reverie.test.probe"
PROBE_AUTOMATION = "reverie-test-probe"

AUTOMATION_TRIGGERED = "prefect.automation.triggered"
ACTION_EXECUTED = "prefect.automation.action.executed"
ACTION_FAILED = "prefect.automation.action.failed"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(
    check: Callable[[], Any],
    timeout: float,
    what: str,
    *,
    progress: Callable[[], Any] | None = None,
    diagnose: Callable[[], str] | None = None,
) -> Any:
    """Poll ``check`` until it returns something truthy, and return that.

    Without ``progress``, give up after ``timeout`` seconds. With it, give up once
    ``progress()`` has not changed for ``timeout`` seconds (or after MAX_TIMEOUTS of
    them in all). Giving up raises an AssertionError naming ``what``, the last progress
    and whatever ``diagnose()`` reports.
    """
    started = time.monotonic()
    last = progress() if progress else None
    deadline = started + timeout
    while True:
        value = check()
        if value:
            return value
        now = time.monotonic()
        if progress:
            current = progress()
            if current != last:
                last, deadline = current, now + timeout
        if now >= deadline or now - started >= MAX_TIMEOUTS * timeout:
            break
        time.sleep(POLL_SECONDS)
    message = f"timed out after {time.monotonic() - started:.0f} s waiting for {what}"
    if progress:
        message += f" (nothing changed for {timeout:.0f} s; last: {last!r})"
    if diagnose:
        try:
            message += "\n" + diagnose()
        except Exception as exc:  # noqa: BLE001 - the timeout is the failure to report
            message += f"\n(diagnosis failed: {exc!r})"
    raise AssertionError(message)


def write_prefect_file(folder: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """The project's prefect.yaml, changed by ``edit``, as ``folder``/prefect.yaml."""
    spec = yaml.safe_load((project_root() / "prefect.yaml").read_text())
    edit(spec)
    path = folder / "prefect.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@contextmanager
def new_store_url(folder: Path) -> Iterator[str]:
    """An empty store's URL (a SQLite file in ``folder``, or a fresh PostgreSQL database
    with REVERIE_TEST_POSTGRES set), dropped afterwards."""
    url = _create_postgres_store() if TEST_POSTGRES else f"sqlite:///{folder}/store.db"
    Store(url).create()
    try:
        yield url
    finally:
        if TEST_POSTGRES:
            _drop_postgres_database_soon(url)
        else:
            dispose(url)


def gone(process: psutil.Process) -> bool:
    """Whether ``process`` has ended. A zombie has: only its parent (or init) has yet to
    collect its status."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@contextmanager
def environment(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class Stack:
    """A running stack: its API, its store, its log, and reads of what it did."""

    def __init__(self, port: int, home: Path, log: Path, store: Store,
                 processes: list[Any], prefect_database: str | None = None) -> None:
        self.port, self.home, self.log, self.store = port, home, log, store
        self.prefect_database = prefect_database  # None: SQLite in its home
        self.processes = processes  # server first, then the worker
        self.api = f"http://127.0.0.1:{port}/api"
        self.ui = f"http://127.0.0.1:{port}"

    # --- the processes ---------------------------------------------------------------

    @property
    def worker(self) -> Any:
        return self.processes[1]

    def stop_server(self) -> None:
        """The API goes away; the worker stays."""
        stop([self.processes[0]])

    def start_server(self) -> None:
        """The server again: same home and database, same port; answering on return."""
        self.processes[0] = start_server(self.port, self.home, self.log, self.prefect_database)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    # --- reads -------------------------------------------------------------------------

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

    def read_run(self, run_id: Any) -> Any:
        with self.client() as client:
            return client.read_flow_run(run_id)

    def workers(self) -> list[Any]:
        with self.client() as client:
            return client.read_workers_for_work_pool(WORK_POOL)

    @contextmanager
    def pool_paused(self) -> Iterator[None]:
        """The stack's work pool paused: runs made meanwhile stay queued, none starts."""
        from prefect.client.schemas.actions import WorkPoolUpdate

        with self.client() as client:
            client.update_work_pool(WORK_POOL, WorkPoolUpdate(is_paused=True))
        try:
            yield
        finally:
            with self.client() as client:
                client.update_work_pool(WORK_POOL, WorkPoolUpdate(is_paused=False))

    def events(self, names: Sequence[str] = (), resource: str | None = None) -> list[Any]:
        """Events the server stored (it stores what it receives within seconds), oldest
        first: those named ``names`` (any, if none), about ``resource`` (any, if None)."""
        from prefect.events.filters import (
            EventFilter,
            EventNameFilter,
            EventOccurredFilter,
            EventOrder,
            EventResourceFilter,
        )

        now = datetime.now(UTC)
        wanted = EventFilter(
            # The store's events carry the store's clock: allow for a skew either way.
            occurred=EventOccurredFilter(since=now - timedelta(days=1),
                                         until=now + timedelta(hours=1)),
            event=EventNameFilter(name=list(names)) if names else None,
            resource=EventResourceFilter(id=[resource]) if resource else None,
            order=EventOrder.ASC,
        )
        with self.client() as client:
            page = client.read_events(filter=wanted, limit=50)
            found = list(page.events)
            while page.next_page:
                page = client.read_events_page(page.next_page)
                found += page.events
        return found

    def profile_events(self, profile: str, *names: str) -> list[Any]:
        """The store's events about ``profile`` that reached the server."""
        return self.events(names, resource=f"reverie.profile.{profile}")

    def automation_id(self, name: str) -> Any:
        with self.client() as client:
            (automation,) = client.read_automations_by_name(name)
        return automation.id

    def firings(self, automation: str, profile: str | None = None) -> list[Any]:
        """Each time ``automation`` fired (for ``profile``'s resource only, if given)."""
        fired = self.events([AUTOMATION_TRIGGERED],
                            resource=f"prefect.automation.{self.automation_id(automation)}")
        if profile is None:
            return fired
        key = f"reverie.profile.{profile}"
        return [e for e in fired
                if (e.payload.get("triggering_labels") or {}).get("prefect.resource.id") == key]

    def action_outcomes(self, automation: str) -> dict[str, Any]:
        """The outcome event (executed or failed) of each of ``automation``'s actions, by
        the id of the firing event it acted on."""
        outcomes = self.events([ACTION_EXECUTED, ACTION_FAILED],
                               resource=f"prefect.automation.{self.automation_id(automation)}")
        by_firing: dict[str, Any] = {}
        for event in outcomes:
            for related in event.related:
                if related.role == "automation-triggered-event":
                    by_firing[related.id.removeprefix("prefect.event.")] = event
        return by_firing

    def settled_firings(self, automation: str, profile: str | None = None) -> list[Any]:
        """The firings of ``automation`` whose actions have all ended (every action here
        runs a deployment: one action per firing)."""
        outcomes = self.action_outcomes(automation)
        return [f for f in self.firings(automation, profile) if str(f.id) in outcomes]

    def runs_by_automation(self, automation: str, profile: str,
                           deployments: Sequence[str]) -> list[Any]:
        """Flow runs of ``deployments`` that ``automation`` created for ``profile``."""
        return [r for d in deployments for r in self.runs(d)
                if r.created_by and r.created_by.display_value == automation
                and r.parameters.get("profile") == profile]

    # --- diagnostics -------------------------------------------------------------------

    def describe_runs(self, runs: Sequence[Any] | None = None) -> str:
        runs = self.runs() if runs is None else runs
        lines = [f"flow runs ({len(runs)}):"]
        for r in sorted(runs, key=lambda r: r.created or datetime.min.replace(tzinfo=UTC)):
            made_by = r.created_by.display_value if r.created_by else "-"
            state = r.state.name if r.state else "-"
            message = (r.state.message or "")[:120] if r.state else ""
            lines.append(f"  {r.name} | by {made_by} | {state} {message}".rstrip())
        return "\n".join(lines)

    def describe_automation(self, automation: str, profile: str | None = None) -> str:
        outcomes = self.action_outcomes(automation)
        fired = self.firings(automation, profile)
        lines = [f"automation {automation}: fired {len(fired)} time(s)"
                 + (f" for {profile}" if profile else "")]
        for firing in fired:
            outcome = outcomes.get(str(firing.id))
            if outcome is None:
                lines.append(f"  {firing.occurred}: action not ended yet")
            else:
                reason = outcome.payload.get("reason", "")
                lines.append(f"  {firing.occurred}: {outcome.event} {reason}".rstrip())
        return "\n".join(lines)

    def describe_profile(self, profile: str, automations: Sequence[str] = ()) -> str:
        """What happened to the profile's events on their way to runs: the store's
        outbox, the events the server has, the automations' firings, the runs."""
        waiting = [p for p in outbox.waiting(self.store.url) if p.profile == profile]
        received = self.profile_events(profile)
        names: dict[str, int] = {}
        for e in received:
            names[e.event] = names.get(e.event, 0) + 1
        parts = [
            f"events of {profile} still in the store's outbox: "
            f"{waiting[0].events if waiting else 0}",
            f"events of {profile} the server has: {names}",
            *(self.describe_automation(a, profile) for a in automations),
            self.describe_runs(),
            "stack log (end):\n" + self.log_tail(),
        ]
        return "\n".join(parts)

    # --- waits -------------------------------------------------------------------------

    def wait_final(self, run_id: Any, timeout: float = RUN_SECONDS,
                   steps: Callable[[], Any] | None = None) -> Any:
        """The run once it is COMPLETED, FAILED, CRASHED or CANCELLED; fails if it stays
        in one state for ``timeout`` seconds (and ``steps()``, the run's own progress,
        if given, does not change meanwhile either)."""
        seen: list[Any] = []

        def final() -> Any:
            run = self.read_run(run_id)
            seen[:] = [run]
            return run if run.state_type and run.state_type.value in FINAL else None

        def state() -> Any:
            return (seen[0].state_type if seen else None, steps() if steps else None)

        def diagnose() -> str:
            return self.describe_runs(seen) + "\nstack log (end):\n" + self.log_tail()

        return wait_for(final, timeout, f"flow run {run_id} to finish",
                        progress=state, diagnose=diagnose)

    def wait_completed(self, run_id: Any, timeout: float = RUN_SECONDS,
                       steps: Callable[[], Any] | None = None) -> Any:
        """The run once COMPLETED; failing, if it ended otherwise, with how it got there:
        its states with their times and whole messages, its subflow runs, the crash
        automations' firings and the stack's log (a run crashed by the unresponsive
        automation on a loaded machine, or by its process dying, reads differently)."""
        run = self.wait_final(run_id, timeout, steps)
        if run.state_type.value != "COMPLETED":
            raise AssertionError(self.describe_ending(run))
        return run

    def describe_ending(self, run: Any) -> str:
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

        from reverie.deployments.crash_detection import (
            NOT_STARTED_AUTOMATION,
            UNRESPONSIVE_AUTOMATION,
        )

        with self.client() as client:
            states = client.read_flow_run_states(run.id)
            children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])))
        lines = [f"flow run {run.name} ({run.id}) ended {run.state.name}:"]
        lines += [f"  {s.timestamp} {s.name}: {s.message or ''}".rstrip()
                  for s in sorted(states, key=lambda s: s.timestamp)]
        return "\n".join([*lines, "its subflow " + self.describe_runs(children),
                          self.describe_automation(UNRESPONSIVE_AUTOMATION),
                          self.describe_automation(NOT_STARTED_AUTOMATION),
                          "stack log (end):\n" + self.log_tail()])

    def deliver_events(self, timeout: float = EVENT_SECONDS) -> None:
        """Wait until the store's outbox is empty, sending what waits in it meanwhile, as
        `reverie serve` does every EVENT_FLUSH_SECONDS: an ingest or a session end sends
        its events once, for at most a few seconds, and on a loaded machine that send
        can time out, leaving them for the next flush."""
        def empty() -> bool:
            if not outbox.waiting(self.store.url):
                return True
            event_delivery.flush(self.store.url, api=self.api)
            return not outbox.waiting(self.store.url)

        wait_for(empty, timeout, "the store's outbox to empty",
                 progress=lambda: outbox.waiting(self.store.url),
                 diagnose=lambda: "stack log (end):\n" + self.log_tail())

    def wait_profile_events(self, profile: str, expected: dict[str, int],
                            timeout: float = EVENT_SECONDS) -> None:
        """Wait until the server has stored exactly ``expected`` (event name: how many)
        of the profile's events, and fail if it has more."""
        def counts() -> dict[str, int]:
            found = {name: 0 for name in expected}
            for e in self.profile_events(profile, *expected):
                found[e.event] += 1
            return found

        def arrived() -> bool:
            found = counts()
            assert all(found[n] <= expected[n] for n in expected), (
                f"the server has more of {profile}'s events than were sent: {found}, "
                f"expected {expected}")
            return found == expected

        wait_for(arrived, timeout, f"the server to have {profile}'s events {expected}",
                 progress=counts, diagnose=lambda: self.describe_profile(profile))

    def wait_runs(self, automation: str, profile: str, count: int,
                  deployments: Sequence[str], timeout: float = EVENT_SECONDS) -> list[Any]:
        """Wait until ``automation`` has created ``count`` runs for ``profile``, each
        firing on the way counting as progress; fails if it made more."""
        def made() -> tuple[list[Any]] | None:  # wrapped: no runs is an answer too
            runs = self.runs_by_automation(automation, profile, deployments)
            assert len(runs) <= count, (
                f"{automation} made {len(runs)} runs for {profile}, expected {count}\n"
                + self.describe_profile(profile, [automation]))
            return (runs,) if len(runs) == count else None

        def progress() -> tuple[int, int, int]:
            return (len(self.firings(automation, profile)),
                    len(self.settled_firings(automation, profile)),
                    len(self.runs_by_automation(automation, profile, deployments)))

        what = f"{count} run(s) of {automation} for {profile}"
        (runs,) = wait_for(made, timeout, what, progress=progress,
                           diagnose=lambda: self.describe_profile(profile, [automation]))
        return runs

    def wait_firings(self, automation: str, profile: str | None, count: int,
                     timeout: float = EVENT_SECONDS) -> list[Any]:
        """Wait until the server has stored ``count`` firings of ``automation`` (for
        ``profile``'s resource, if given) and the outcome of each one's action (its run
        made, its notification sent, or its failure); fails if it fired more often.
        Returns the firings."""
        def settled() -> tuple[list[Any]] | None:  # wrapped: no firings is an answer too
            fired = self.firings(automation, profile)
            assert len(fired) <= count, (
                f"{automation} fired {len(fired)} times, expected {count}\n" + diagnose())
            ended = self.action_outcomes(automation)
            return (fired,) if len(fired) == count and all(
                str(f.id) in ended for f in fired) else None

        def diagnose() -> str:
            if profile:
                return self.describe_profile(profile, [automation])
            return "\n".join([self.describe_automation(automation), self.describe_runs(),
                              "stack log (end):\n" + self.log_tail()])

        whose = f" for {profile}" if profile else ""
        (fired,) = wait_for(
            settled, timeout, f"{count} firing(s) of {automation}{whose}, their actions ended",
            progress=lambda: (len(self.firings(automation, profile)),
                              len(self.settled_firings(automation, profile))),
            diagnose=diagnose)
        return fired

    def wait_ready(self, timeout: float = EVENT_SECONDS) -> None:
        """Wait until the worker polls its pool and, if the deployments have automations,
        until the triggers service evaluates them.

        The triggers service loads automations created while it runs (by `prefect
        deploy`) only every few seconds; an event arriving before that is not evaluated
        against them, and is lost to them. A probe automation created after the
        deployments' own, answering a probe event, shows they are loaded: the service
        loads them all at once."""
        wait_for(self.workers, timeout, "the worker to poll its pool",
                 diagnose=lambda: "stack log (end):\n" + self.log_tail())
        with self.client() as client:
            if not client.read_automations():
                return
        self.probe(timeout)

    def probe(self, timeout: float = EVENT_SECONDS) -> None:
        """Send probe events until the triggers service fires the probe automation on
        one (creating the automation first, if need be)."""
        from prefect.events.actions import DoNothing
        from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

        with self.client() as client:
            if not client.read_automations_by_name(PROBE_AUTOMATION):
                client.create_automation(AutomationCore(
                    name=PROBE_AUTOMATION,
                    description="The platform tests' readiness probe.",
                    trigger=EventTrigger(expect={PROBE_EVENT}, posture=Posture.Reactive,
                                         threshold=1, within=timedelta(0)),
                    actions=[DoNothing()],
                ))
        before = len(self.firings(PROBE_AUTOMATION))
        sent: list[float] = []

        def fired() -> bool:
            # A probe arriving before the automation is loaded is ignored: send another.
            if not sent or time.monotonic() - sent[-1] >= 2:
                httpx.post(f"{self.api}/events", timeout=30, json=[{
                    "id": str(uuid.uuid4()), "event": PROBE_EVENT,
                    "occurred": datetime.now(UTC).isoformat(),
                    "resource": {"prefect.resource.id": "reverie.test.probe"},
                }]).raise_for_status()
                sent.append(time.monotonic())
            return len(self.firings(PROBE_AUTOMATION)) > before

        wait_for(fired, timeout, "the triggers service to evaluate the automations",
                 diagnose=lambda: f"{len(sent)} probe events sent\nstack log (end):\n"
                 + self.log_tail())


@contextmanager
def running_stack(
    folder: Path, store_url: str, prefect_file: Path | None = None
) -> Iterator[Stack]:
    """A stack on a free port, its Prefect home and log in ``folder``, its flow runs on
    the store at ``store_url``, deploying ``prefect_file`` (default: the project's
    prefect.yaml). Prefect's own database is ``prefect_database()``'s: SQLite in the
    home, or on the PostgreSQL leg a PostgreSQL database, dropped afterwards. This
    process's Prefect client points at the stack meanwhile."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    port = free_port()
    home, log = prefect_home(folder / "prefect-home"), folder / "stack.log"
    database = prefect_database()
    try:
        with environment(REVERIE_DATABASE_URL=store_url,
                         PREFECT_WORKER_QUERY_SECONDS=str(WORKER_QUERY_SECONDS),
                         REVERIE_UNRESPONSIVE_SECONDS=str(UNRESPONSIVE_SECONDS)):
            processes = start_stack(port, home, log, prefect_file, database)
            try:
                with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
                    stack = Stack(port, home, log, Store(store_url), processes, database)
                    stack.wait_ready()
                    yield stack
            finally:
                stop(processes)
    finally:
        if database:
            _drop_postgres_database_soon(database)


@contextmanager
def sample_stack(
    folder: Path, sample_template: Path, edit: Callable[[dict[str, Any]], None]
) -> Iterator[Stack]:
    """A stack whose store is a copy of the sample store, deploying the project's
    prefect.yaml as ``edit`` changes it."""
    with new_store_url(folder) as store_url:
        clone_sample(sample_template, Store(store_url))
        prefect_file = write_prefect_file(folder, edit)
        with running_stack(folder, store_url, prefect_file) as running:
            yield running
