"""``reverie backfill``: replay a flow over a range of dates, one run per ``as_of``.

With a Prefect API configured (``PREFECT_API_URL``), each profile gets one run of the
replay deployment (``flows/replay.py``), tagged ``backfill``: it runs the flow for its
dates one after another in as_of order, while profiles run side by side up to that
deployment's concurrency limit. Without an API, the flow runs here, date by date.
Either way a backfill is resumable: a date whose run is in the store's run history is
not run again, so re-running the same command after an interruption only fills the
gaps. Bad input (unknown flow or profile, dates out of order, a step that is not
positive) is refused before any run is made. On a terminal, a bar on stderr follows the
dates (each date run here is listed as it finishes) or the replay runs being made.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, cast

from reverie.flows.event_delivery import api_configured
from reverie.flows.progress import Bar
from reverie.models.errors import ConfigError
from reverie.models.repositories.runs import run_history
from reverie.models.store import Store
from reverie.models.timestamps import to_utc_naive

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

BACKFILL_TAG = "backfill"
REPLAY_FLOW = "replay"
REPLAY_DEPLOYMENT = "replay/backfill"
RUN_PAGE = 200
_STEP = re.compile(r"^(\d+)\s*([mhdw])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_every(text: str) -> timedelta:
    """'1d', '12h', '30m', '1w' as a timedelta."""
    match = _STEP.match(text.strip().lower())
    if not match or int(match.group(1)) == 0:
        raise ConfigError(f"--every must look like 1d, 12h, 30m or 1w, got {text!r}")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def dates(start: datetime, end: datetime, every: timedelta) -> Iterator[datetime]:
    """``start``, ``start + every``, ... up to and including ``end``."""
    if end < start:
        raise ConfigError("--to must not be before --from")
    when = to_utc_naive(start)
    while when <= to_utc_naive(end):
        yield when
        when += every


@dataclass
class BackfillReport:
    flow: str
    where: str  # the deployment, or "local"
    created: list[str] = field(default_factory=list)  # as_of of dates run (or to be run) now
    skipped: list[str] = field(default_factory=list)  # as_of of dates already done
    runs: list[str] = field(default_factory=list)  # replay flow run ids (deployment mode)
    # Profiles whose replay of this flow is still queued or running: none made for them.
    running: list[str] = field(default_factory=list)


def backfill(
    flow: str,
    start: datetime,
    end: datetime,
    every: timedelta,
    profile: str | list[str] | None,
    store: Store | None = None,
) -> BackfillReport:
    """Replay ``flow`` over the dates from ``start`` to ``end``. Everything is checked
    (flow, dates, profiles) before any run is made, so bad input creates nothing."""
    from reverie.flows.catalog import FLOWS

    if flow not in FLOWS:
        raise ConfigError(f"unknown flow {flow!r}; choose one of {', '.join(sorted(FLOWS))}")
    if every <= timedelta(0):
        raise ConfigError(f"--every must be positive, got {every}")
    store = store or Store()
    profiles = store.resolve_profiles(profile)
    whens = list(dates(start, end, every))
    from reverie.flows.replay import MAX_DATES

    if len(whens) > MAX_DATES:
        raise ConfigError(f"{len(whens)} dates is more than one backfill takes ({MAX_DATES})")
    if api_configured():
        return _through_replays(flow, whens, profiles, store)
    return _locally(flow, whens, profile, profiles, store)


def _locally(
    flow: str, whens: list[datetime], profile: str | list[str] | None, profiles: list[str],
    store: Store,
) -> BackfillReport:
    """Each date a flow run in this process. The flow is given the operator's selector
    (``profile``, None for all), as a scheduled run would be; ``profiles`` is what it
    resolved to, for telling which dates are already done."""
    from reverie.deployments.local_server import local_api
    from reverie.flows.catalog import FLOWS
    from reverie.flows.runtime import wait_for_run_history

    report = BackfillReport(flow, "local")
    wanted = set(profiles)
    flow_fn = FLOWS[flow]
    with Bar(len(whens), f"backfill {flow}", unit="date") as bar:
        for when in whens:
            with store.reading_all() as s:
                done = {r.profile_id
                        for r in run_history(s, flow=flow_fn.name, as_of=when, limit=None)}
            if wanted <= done:
                report.skipped.append(when.isoformat())
                bar.describe(f"{len(report.skipped)} already done")
                bar.update()
                continue
            with local_api():  # each date: a server killed meanwhile is replaced
                last = flow_fn(profile=profile, as_of=when)
            report.created.append(when.isoformat())
            bar.update()
            # Each date as it finishes: a backfill of many dates runs for minutes.
            bar.note(f"  ran {when.isoformat()}")
        if report.created:
            bar.describe("waiting for Prefect to record the runs")
            # Prefect records runs in order: once the last run's history is in, all are.
            wait_for_run_history(last.run_id)
    return report


def _through_replays(
    flow: str, whens: list[datetime], profiles: list[str], store: Store
) -> BackfillReport:
    """One replay run per profile (flows/replay.py) through the replay deployment; a
    profile whose replay of this flow is still queued or running gets no second one."""
    from prefect.deployments import run_deployment

    from reverie.flows.catalog import FLOWS
    from reverie.flows.replay import done_dates, replay_title

    report = BackfillReport(flow, REPLAY_DEPLOYMENT)
    busy = _live_replays(flow)
    pending: set[datetime] = set()
    # Profiles, not dates: one replay run per profile is made here, and the runs go on
    # in the deployment's processes after this command has returned.
    with Bar(len(profiles), f"backfill {flow}: replay runs", unit="profile") as bar:
        for n, profile in enumerate(profiles):
            bar.advance_to(n)
            done = done_dates(store, FLOWS[flow].name, profile)
            todo = [w for w in whens if w not in done]
            if not todo:
                continue
            pending.update(todo)
            if profile in busy:
                report.running.append(profile)
                continue
            dates = [w.isoformat() for w in todo]
            # Called from sync code, Prefect's dual sync/async function returns the run.
            run = cast("FlowRun", run_deployment(
                REPLAY_DEPLOYMENT,
                parameters={"flow": flow, "profile": profile, "dates": dates},
                flow_run_name=replay_title(flow, profile, dates),
                timeout=0, tags=[BACKFILL_TAG], as_subflow=False,
            ))
            report.runs.append(str(run.id))
            bar.describe(f"{len(report.runs)} made")
        bar.advance_to(len(profiles))
    report.created = [w.isoformat() for w in whens if w in pending]
    report.skipped = [w.isoformat() for w in whens if w not in pending]
    return report


def _live_replays(flow: str) -> set[str]:
    """Profiles with a replay of ``flow`` not finished yet, read page by page (a
    platform may have far more runs than one page holds)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    live = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[
        StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.PAUSED,
        StateType.CANCELLING,
    ])))
    of_replay = FlowFilter(name=FlowFilterName(any_=[REPLAY_FLOW]))
    busy: set[str] = set()
    with get_client(sync_client=True) as client:
        offset = 0
        while True:
            page = client.read_flow_runs(flow_filter=of_replay, flow_run_filter=live,
                                         limit=RUN_PAGE, offset=offset)
            busy.update(str(r.parameters.get("profile")) for r in page
                        if r.parameters.get("flow") == flow)
            if len(page) < RUN_PAGE:
                return busy
            offset += len(page)
