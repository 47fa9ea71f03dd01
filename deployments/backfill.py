"""``reverie backfill``: replay a flow over a range of dates, one run per ``as_of``.

With a Prefect API configured (``PREFECT_API_URL``), each date becomes a flow run of the
flow's deployment, tagged ``backfill`` and carrying its ``profile`` and ``as_of``; a
worker runs them. Without one, the flow runs here, date by date. Either way a backfill
is resumable: a date that already has a run (completed, or still scheduled or
running) is not run again, so re-running the same command after an interruption only
fills the gaps. Failed dates are run again.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from models.errors import ConfigError
from models.events import api_configured
from models.store import Store
from models.timestamps import to_utc_naive

BACKFILL_TAG = "backfill"
_STEP = re.compile(r"^(\d+)\s*([mhdw])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
# Prefect states after which a date counts as done or on its way.
_LIVE_STATES = {"SCHEDULED", "PENDING", "RUNNING", "COMPLETED", "PAUSED", "CANCELLING"}


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
    created: list[str] = field(default_factory=list)  # as_of of each run made now
    skipped: list[str] = field(default_factory=list)  # as_of of dates already done
    runs: list[str] = field(default_factory=list)  # flow run ids (deployment mode)


def backfill(
    flow: str,
    start: datetime,
    end: datetime,
    every: timedelta,
    profile: str | list[str] | None,
    store: Store | None = None,
) -> BackfillReport:
    from flows.catalog import DEPLOYMENTS, FLOWS

    if flow not in FLOWS:
        raise ConfigError(f"unknown flow {flow!r}; choose one of {', '.join(sorted(FLOWS))}")
    store = store or Store()
    store.resolve_profiles(profile)
    whens = list(dates(start, end, every))
    if api_configured() and flow in DEPLOYMENTS:
        return _through_deployment(flow, DEPLOYMENTS[flow], whens, profile)
    return _locally(flow, whens, profile, store)


def _locally(
    flow: str, whens: list[datetime], profile: str | list[str] | None, store: Store
) -> BackfillReport:
    from flows.catalog import FLOWS
    from flows.run import wait_for_run_history
    from flows.temporary_server import keep_with_this_process

    report = BackfillReport(flow, "local")
    profiles = set(store.resolve_profiles(profile))
    flow_fn = FLOWS[flow]
    for when in whens:
        done = {r.profile_id for r in store.run_history(flow=flow_fn.name, as_of=when, limit=None)}
        if profiles <= done:
            report.skipped.append(when.isoformat())
            continue
        keep_with_this_process()
        last = flow_fn(profile=profile, as_of=when)
        report.created.append(when.isoformat())
    if report.created:
        # Prefect records runs in order: once the last run's history is in, all are.
        wait_for_run_history(last.run_id)
    return report


def _through_deployment(
    flow: str, deployment: str, whens: list[datetime], profile: str | list[str] | None
) -> BackfillReport:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterName,
        FlowRunFilter,
        FlowRunFilterTags,
    )
    from prefect.deployments import run_deployment

    report = BackfillReport(flow, deployment)
    deployment_name = deployment.split("/", 1)[1]
    with get_client(sync_client=True) as client:
        existing = client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[deployment_name])),
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[BACKFILL_TAG])),
        )
    previous: dict[str, list[Any]] = {}
    for run in existing:
        if run.parameters.get("profile") == profile:
            previous.setdefault(_as_of_key(run.parameters.get("as_of")), []).append(run)
    for when in whens:
        key = when.isoformat()
        runs = previous.get(key, [])
        if any(r.state_type is not None and r.state_type.value in _LIVE_STATES for r in runs):
            report.skipped.append(key)
            continue
        run = run_deployment(
            deployment,
            parameters={"profile": profile, "as_of": key},
            timeout=0,
            tags=[BACKFILL_TAG],
            idempotency_key=f"reverie-backfill:{deployment}:{profile}:{key}:{len(runs)}",
            as_subflow=False,
        )
        report.created.append(key)
        report.runs.append(str(run.id))
    return report


def _as_of_key(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return to_utc_naive(value).isoformat()
    try:
        return to_utc_naive(datetime.fromisoformat(str(value).replace("Z", "+00:00"))).isoformat()
    except ValueError:
        return str(value)
