"""``reverie status``: when each flow last ran for each profile, what it changed, when it
runs next (if a Prefect API with schedules is configured), and the recent history."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from reverie.flows.catalog import FLOW_NAMES
from reverie.models.repositories.runs import run_history
from reverie.models.store import Store
from reverie.models.tables import RunRecord
from reverie.models.timestamps import to_utc_naive
from reverie.runner.event_delivery import api_configured

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class EndedRun:
    """A flow run that ended badly, as Prefect has it."""

    run_id: str
    flow: str
    state: str  # Failed, Crashed
    ended: datetime | None  # UTC, naive as the store's times
    profile: Any  # the run's profile parameter: None for every profile
    message: str


@dataclass
class Status:
    last: dict[str, dict[str, RunRecord]] = field(default_factory=dict)  # profile -> flow -> run
    next_runs: dict[str, list[tuple[datetime, Any]]] | None = None  # flow -> (when, profile param)
    history: list[RunRecord] = field(default_factory=list)
    # Backfills still queued or running on this store; None without a Prefect API.
    backfills: list[Any] | None = None
    # Recent runs that ended Failed or Crashed, newest first; None without a Prefect API.
    # They record nothing in the store (only finished runs do): without this a run
    # killed mid-way was nowhere in ``reverie status``.
    failed: list[EndedRun] | None = None

    def next_for(self, flow: str, profile: str) -> datetime | None:
        """The next scheduled run of ``flow`` that covers ``profile``."""
        for when, selector in (self.next_runs or {}).get(flow, []):
            if covers(selector, profile):
                return when
        return None


def covers(selector: Any, profile: str) -> bool:
    """Whether a run's profile parameter (None: every profile; a name; a list of
    names) takes ``profile``."""
    return selector is None or selector == profile or (
        isinstance(selector, list) and profile in selector)


def collect(store: Store, profile: str | None = None, limit: int = 20) -> Status:
    profiles = store.resolve_profiles(profile)
    with store.reading_all() as s:
        status = Status(history=run_history(s, profile, limit=limit))
        for p in profiles:
            status.last[p] = {}
            for flow in FLOW_NAMES:
                runs = run_history(s, p, flow, limit=1)
                if runs:
                    status.last[p][flow] = runs[0]
    status.next_runs = scheduled_runs()
    status.backfills = backfills(store)
    status.failed = failed_runs(lambda selector: any(covers(selector, p) for p in profiles))
    return status


def backfills(store: Store) -> list[Any] | None:
    """This store's replay runs not finished yet, with their progress; None when no API
    is configured or it cannot be reached."""
    if not api_configured():
        return None
    from reverie.orchestration.replay import replay_progress

    try:
        return replay_progress(store)
    except Exception as exc:  # the API is down: status still shows the store's history
        log.warning("could not read backfills from the Prefect API: %s", exc)
        return None


def _runs_per_flow(states: Sequence[str], newest_first: bool, per_flow: int,
                   what: str, by_end: bool = False) -> dict[str, list[Any]] | None:
    """Each flow's runs in ``states`` (Prefect's state types) from the configured
    Prefect API: by start, soonest or ``newest_first`` (``by_end``: the last ended
    first). None when no API is configured or it cannot be reached (``what`` says what
    could not be read)."""
    if not api_configured():
        return None
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    order = FlowRunSort.END_TIME_DESC if by_end else (
        FlowRunSort.START_TIME_DESC if newest_first else FlowRunSort.EXPECTED_START_TIME_ASC)
    wanted = [StateType(s) for s in states]
    try:
        with get_client(sync_client=True) as client:
            return {flow: client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[flow])),
                flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=wanted))),
                sort=order, limit=per_flow) for flow in FLOW_NAMES}
    except Exception as exc:  # the API is down: status still shows the store's history
        log.warning("could not read %s from the Prefect API: %s", what, exc)
        return None


def scheduled_runs(per_flow: int = 20) -> dict[str, list[tuple[datetime, Any]]] | None:
    """Upcoming scheduled runs per flow from the configured Prefect API; None when no
    API is configured (an ephemeral one holds no schedules) or it cannot be reached."""
    found = _runs_per_flow(["SCHEDULED"], False, per_flow, "schedules")
    if found is None:
        return None
    return {flow: [(to_utc_naive(r.expected_start_time), r.parameters.get("profile"))
                   for r in runs if r.expected_start_time is not None]
            for flow, runs in found.items()}


# Per flow: (run id, state, when it started or is to start, profile parameter).
ActiveRuns = dict[str, list[tuple[str, str, datetime | None, Any]]]


def active_runs(per_flow: int = 20) -> ActiveRuns | None:
    """Runs started and not over, per flow, from the configured Prefect API: (run id,
    state, when it started or is to start, profile parameter), newest first. None when
    no API is configured or it cannot be reached. A run made by ``launch`` is Pending
    until its process starts it."""
    found = _runs_per_flow(["PENDING", "RUNNING", "PAUSED", "CANCELLING"], True, per_flow,
                           "runs")
    if found is None:
        return None
    out: ActiveRuns = {}
    for flow, runs in found.items():
        out[flow] = []
        for r in runs:
            since = r.start_time or r.expected_start_time
            out[flow].append((str(r.id), (r.state.name if r.state else None) or "",
                              None if since is None else to_utc_naive(since),
                              r.parameters.get("profile")))
    return out


def failed_runs(wanted: Callable[[Any], bool], per_flow: int = 5, shown: int = 10,
                read: int = 100) -> list[EndedRun] | None:
    """The ``shown`` runs that ended Failed or Crashed last, at most ``per_flow`` of each
    flow, among those whose profile parameter is ``wanted``, looked for in the ``read``
    last ended of each flow (Prefect filters no parameter); None when no API is
    configured or it cannot be reached."""
    found = _runs_per_flow(["FAILED", "CRASHED"], True, read, "failed runs", by_end=True)
    if found is None:
        return None
    out = []
    for flow, runs in found.items():
        for r in [r for r in runs if wanted(r.parameters.get("profile"))][:per_flow]:
            ended = r.end_time or (r.state.timestamp if r.state else None)
            out.append(EndedRun(
                str(r.id), flow, (r.state.name if r.state else None) or "",
                None if ended is None else to_utc_naive(ended), r.parameters.get("profile"),
                " ".join(((r.state.message if r.state else None) or "").split())))
    out.sort(key=lambda r: (r.ended or datetime.min, r.run_id), reverse=True)
    return out[:shown]


def _selector(profile: Any) -> str:
    if profile is None:
        return "every profile"
    return ", ".join(profile) if isinstance(profile, list) else str(profile)


def render(status: Status) -> str:
    lines = [f"{'profile':<20} {'flow':<26} {'last as_of':<20} {'finished (UTC)':<20} "
             f"{'changed':>7}  next run (UTC)"]
    for profile, runs in status.last.items():
        for flow in FLOW_NAMES:
            run = runs.get(flow)
            upcoming = status.next_for(flow, profile)
            if run is None and upcoming is None:
                continue
            nxt = upcoming.isoformat(" ", "minutes") if upcoming else (
                "-" if status.next_runs is not None else "(no Prefect API)")
            if run is None:
                lines.append(f"{profile:<20} {flow:<26} {'never':<20} {'':<20} {'':>7}  {nxt}")
            else:
                lines.append(
                    f"{profile:<20} {flow:<26} {run.as_of.isoformat('T', 'seconds'):<20} "
                    f"{run.finished_at.isoformat(' ', 'seconds'):<20} {run.changed:>7}  {nxt}"
                )
        if not runs:
            lines.append(f"{profile:<20} (no runs yet)")
    if status.backfills:
        lines += ["", f"Backfills in progress ({len(status.backfills)} replay runs):"]
        lines += [f"  {b.profile:<20} {b.flow:<26} {b.done}/{b.total} runs done  {b.state:<10} "
                  f"{b.run_id}" for b in status.backfills]
    if status.failed:
        lines += ["", "Failed or crashed runs (Prefect, newest first):"]
        for r in status.failed:
            ended = r.ended.isoformat(" ", "seconds") if r.ended else "?"
            message = r.message if len(r.message) <= 120 else r.message[:119] + "…"
            lines.append(f"  {ended}  {r.flow:<26} {_selector(r.profile):<20} "
                         f"{r.state:<8} {r.run_id}  {message}")
    lines += ["", f"History (last {len(status.history)} runs):"]
    for run in status.history:
        steps = ", ".join(f"{k} {v['changed']}" for k, v in run.summary.items())
        lines.append(
            f"  {run.finished_at.isoformat(' ', 'seconds')}  {run.flow:<26} {run.profile_id:<20} "
            f"as of {run.as_of.isoformat('T', 'seconds')}  examined {run.examined}, "
            f"changed {run.changed} ({steps}) in {run.seconds:.2f}s"
        )
    return "\n".join(lines)


def as_json(status: Status) -> dict[str, Any]:
    def run(r: RunRecord) -> dict[str, Any]:
        return r.model_dump(mode="json", exclude={"id"})

    return {
        "last": {p: {f: run(r) for f, r in runs.items()} for p, runs in status.last.items()},
        "next": None if status.next_runs is None else {
            flow: [{"at": w.isoformat(), "profile": sel} for w, sel in runs]
            for flow, runs in status.next_runs.items()
        },
        "history": [run(r) for r in status.history],
        "backfills": None if status.backfills is None else [
            asdict(b) for b in status.backfills],
        "failed": None if status.failed is None else [
            {**asdict(r), "ended": None if r.ended is None else r.ended.isoformat()}
            for r in status.failed],
    }
