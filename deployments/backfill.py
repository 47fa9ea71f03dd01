"""``reverie backfill``: replay a flow (or several: ``decay,full``) over a range of dates,
one run per flow and ``as_of``, in (as_of, schedule order).

With a Prefect API configured (``PREFECT_API_URL``), each profile gets one run of the
replay deployment (``orchestration/replay.py``), tagged ``backfill``: it runs the flow for its
dates one after another in as_of order, while profiles run side by side up to that
deployment's concurrency limit. Without an API, the flow runs here, date by date.
Either way a backfill is resumable: a date whose run is in the store's run history is
not run again, so re-running the same command after an interruption only fills the
gaps. Replays of one profile take turns and run each other's dates in schedule order
(``orchestration/replay.py``), so two backfills of different flows started one after the other
end as one backfill of both. Bad input (unknown flow or profile, dates out of order, a
step that is not positive) is refused before any run is made. On a terminal, a bar on
stderr follows the dates (each date run here is listed as it finishes) or the replay
runs being made.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, cast

from reverie.models.errors import ConfigError
from reverie.models.repositories.runs import run_history
from reverie.models.store import Store
from reverie.models.timestamps import to_utc_naive
from reverie.runner.event_delivery import api_configured
from reverie.runner.progress import Bar

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

BACKFILL_TAG = "backfill"
REPLAY_DEPLOYMENT = "replay/backfill"
# ``--wait`` looks at the replay runs this often.
WAIT_POLL_SECONDS = 2.0
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CRASHED", "CANCELLED"})
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
    # as_of of dates that run, for some profile, after a later date already in its
    # history: too late for schedule order (the store will not end where runs in date
    # order would have left it).
    out_of_order: list[str] = field(default_factory=list)


def backfill(
    flow: str,
    start: datetime,
    end: datetime,
    every: timedelta,
    profile: str | list[str] | None,
    store: Store | None = None,
) -> BackfillReport:
    """Replay ``flow`` (one short name, or several joined by commas) over the dates from
    ``start`` to ``end``. Everything is checked (flows, dates, profiles) before any run
    is made, so bad input creates nothing."""
    from reverie.flows.catalog import parse_flows

    flow = ",".join(parse_flows(flow))
    if every <= timedelta(0):
        raise ConfigError(f"--every must be positive, got {every}")
    store = store or Store()
    profiles = store.resolve_profiles(profile)
    whens = list(dates(start, end, every))
    from reverie.orchestration.replay import MAX_DATES

    if len(whens) > MAX_DATES:
        raise ConfigError(f"{len(whens)} dates is more than one backfill takes ({MAX_DATES})")
    if api_configured():
        return _through_replays(flow, whens, profiles, store)
    return _locally(flow, whens, profile, profiles, store)


def _locally(
    flow: str, whens: list[datetime], profile: str | list[str] | None, profiles: list[str],
    store: Store,
) -> BackfillReport:
    """Each date, each flow in schedule order, a flow run in this process. The flow is
    given the operator's selector (``profile``, None for all), as a scheduled run would
    be; ``profiles`` is what it resolved to, for telling which dates are already done."""
    from reverie.deployments.local_server import local_api
    from reverie.flows.catalog import FLOWS, parse_flows
    from reverie.orchestration.replay import comes_late, history_ends
    from reverie.runner.runtime import wait_for_run_history

    report = BackfillReport(flow, "local")
    wanted = set(profiles)
    ends = history_ends(store, profiles)
    late: set[datetime] = set()
    with Bar(len(whens), f"backfill {flow}", unit="date") as bar:
        for when in whens:
            ran = False
            for name in parse_flows(flow):
                flow_fn = FLOWS[name]
                with store.reading_all() as s:
                    done = {r.profile_id
                            for r in run_history(s, flow=flow_fn.name, as_of=when, limit=None)}
                if wanted <= done:
                    continue
                if any(comes_late(ends, p, name, when) for p in wanted - done):
                    late.add(when)
                with local_api():  # each run: a server killed meanwhile is replaced
                    last = flow_fn(profile=profile, as_of=when)
                ran = True
            if not ran:
                report.skipped.append(when.isoformat())
                bar.describe(f"{len(report.skipped)} already done")
                bar.update()
                continue
            report.created.append(when.isoformat())
            bar.update()
            # Each date as it finishes: a backfill of many dates runs for minutes.
            bar.note(f"  ran {when.isoformat()}")
        if report.created:
            bar.describe("waiting for Prefect to record the runs")
            # Prefect records runs in order: once the last run's history is in, all are.
            wait_for_run_history(last.run_id)
    report.out_of_order = [w.isoformat() for w in whens if w in late]
    return report


def _through_replays(
    flow: str, whens: list[datetime], profiles: list[str], store: Store
) -> BackfillReport:
    """One replay run per profile (orchestration/replay.py) through the replay deployment,
    tagged with the store; a profile whose replay of one of these flows is still queued
    or running gets no second one."""
    from prefect.deployments import run_deployment

    from reverie.flows.catalog import parse_flows
    from reverie.orchestration.replay import (
        comes_late,
        done_items,
        history_ends,
        replay_title,
        store_tag,
    )

    report = BackfillReport(flow, REPLAY_DEPLOYMENT)
    flows = parse_flows(flow)
    busy = _live_replays(store.id, flows)
    ends = history_ends(store, profiles)
    pending: set[datetime] = set()
    late: set[datetime] = set()
    # Profiles, not dates: one replay run per profile is made here, and the runs go on
    # in the deployment's processes after this command has returned.
    with Bar(len(profiles), f"backfill {flow}: replay runs", unit="profile") as bar:
        for n, profile in enumerate(profiles):
            bar.advance_to(n)
            done = done_items(store, flows, profile)
            todo = [w for w in whens if any((f, w) not in done for f in flows)]
            if not todo:
                continue
            pending.update(todo)
            late.update(w for w in todo if any(
                comes_late(ends, profile, f, w) for f in flows if (f, w) not in done))
            if profile in busy:
                report.running.append(profile)
                continue
            dates = [w.isoformat() for w in todo]
            # Called from sync code, Prefect's dual sync/async function returns the run.
            run = cast("FlowRun", run_deployment(
                REPLAY_DEPLOYMENT,
                parameters={"flow": flow, "profile": profile, "dates": dates},
                flow_run_name=replay_title(flow, profile, dates),
                timeout=0, tags=[BACKFILL_TAG, store_tag(store.id)], as_subflow=False,
            ))
            report.runs.append(str(run.id))
            bar.describe(f"{len(report.runs)} made")
        bar.advance_to(len(profiles))
    report.created = [w.isoformat() for w in whens if w in pending]
    report.skipped = [w.isoformat() for w in whens if w not in pending]
    report.out_of_order = [w.isoformat() for w in whens if w in late]
    return report


def _live_replays(store_id: str, flows: tuple[str, ...]) -> set[str]:
    """Profiles of this store with a replay of any of ``flows`` not finished yet."""
    from reverie.flows.catalog import parse_flows
    from reverie.orchestration.replay import live_replays

    busy: set[str] = set()
    for run in live_replays(store_id):
        try:
            theirs = parse_flows(str(run.parameters.get("flow")))
        except ConfigError:
            continue
        if set(theirs) & set(flows):
            busy.add(str(run.parameters.get("profile")))
    return busy


def replays_to_wait_for(report: BackfillReport, store: Store) -> list[str]:
    """The replay runs a backfill's outcome depends on: those it made, and those still
    going for the profiles it found busy."""
    from reverie.orchestration.replay import live_replays

    running = set(report.running)
    return report.runs + [str(r.id) for r in live_replays(store.id)
                          if str(r.parameters.get("profile")) in running]


def wait_for_replays(run_ids: list[str], poll: float = WAIT_POLL_SECONDS) -> dict[str, str]:
    """Wait until every run of ``run_ids`` has ended, a bar on a terminal following
    them; each run's final state (COMPLETED, FAILED, CRASHED, CANCELLED)."""
    import time
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    ended: dict[str, str] = {}
    with Bar(len(run_ids), "backfill: replay runs ended", unit="run") as bar:
        while len(ended) < len(run_ids):
            left = [UUID(r) for r in run_ids if r not in ended]
            with get_client(sync_client=True) as client:
                runs = client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=left)),
                    limit=len(left))
            for run in runs:
                state = run.state_type.value if run.state_type else ""
                if state in FINAL_STATES:
                    ended[str(run.id)] = state
            bar.advance_to(len(ended))
            if len(ended) < len(run_ids):
                time.sleep(poll)
    return ended
