"""Replay: one flow run that walks a backfill's dates for one profile, in as_of order.

::

    <flow> as of d1 ──> <flow> as of d2 ──> ... ──> <flow> as of dn    (subflow runs)

A backfill exists to replay history, and history has an order: the store must end as
one-at-a-time runs through the same dates leave it. One run per date, all created at
once, raced for the profile's slot and ran in any order (a 7-day backfill ended on its
5th day), and each waited in a process of its own. So ``reverie backfill`` creates one
replay run per profile instead: its dates run one after another, never side by side;
profiles run side by side, as many at once as the replay deployment's concurrency
limit allows (prefect.yaml), so 1,000 dates are one process, not 1,000.

A date whose run is already in the store's run history for the profile is skipped, so
a replay run again after a crash or a cancel picks up where it stopped, however many
dates came before (the store is the record of what ran, not Prefect's run list).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated

from prefect import flow
from pydantic import Field

from reverie.flows.catalog import names_help
from reverie.flows.parameters import documented
from reverie.models.errors import ConfigError
from reverie.models.repositories.runs import run_history
from reverie.models.store import Store
from reverie.models.timestamps import to_utc_naive

FLOW_NAME = "replay"
log = logging.getLogger(__name__)

# A replay of more dates than this is refused: ten years of hourly runs, far past any
# backfill a platform means to make in one go (and the parameter stays a few MB).
MAX_DATES = 100_000


@dataclass
class ReplayReport:
    flow: str
    profile: str
    ran: list[str] = field(default_factory=list)  # as_of of each run made
    skipped: list[str] = field(default_factory=list)  # as_of of dates already in history


def done_dates(store: Store, flow_name: str, profile: str) -> set[datetime]:
    """The as_of of every finished run of ``flow_name`` for ``profile``."""
    with store.reading_all() as s:
        return {r.as_of for r in run_history(s, profile=profile, flow=flow_name, limit=None)}


def replay_title(flow: object, profile: object, dates: Sequence[object]) -> str:
    """A replay run's name: the one ``reverie backfill`` gives it when creating it, and
    the one the run gives itself when started any other way."""
    shown = sorted(str(d).replace("T", " ")[:19] for d in dates)
    span = f"{shown[0]} .. {shown[-1]}" if shown else "no dates"
    return f"replay {flow} | {profile} | {span} ({len(shown)})"


def replay_name() -> str:
    from prefect.runtime import flow_run

    params = flow_run.parameters
    return replay_title(params.get("flow"), params.get("profile"), params.get("dates") or [])


@flow(name=FLOW_NAME, flow_run_name=replay_name, log_prints=False)
@documented
def replay(
    flow: Annotated[str, Field(description="The flow to replay: its short name "
                               f"({names_help()}).")],
    profile: Annotated[str, Field(description="The one profile whose history is replayed.")],
    dates: Annotated[list[datetime], Field(
        min_length=1, max_length=MAX_DATES,
        description="The as_of of each run, ISO-8601; run in ascending order.")],
) -> ReplayReport:
    """Run ``flow`` for ``profile`` once per date, one date after another in as_of order,
    skipping the dates the store's run history already has."""
    from reverie.flows.catalog import FLOWS

    if flow not in FLOWS:
        raise ConfigError(f"unknown flow {flow!r}; choose one of {', '.join(sorted(FLOWS))}")
    store = Store()
    store.resolve_profiles(profile)
    flow_fn = FLOWS[flow]
    report = ReplayReport(flow, profile)
    for when in sorted({to_utc_naive(d) for d in dates}):
        # Asked date by date: another replay of the same profile may have run it since.
        with store.reading_all() as s:
            done = run_history(s, profile=profile, flow=flow_fn.name, as_of=when, limit=1)
        if done:
            report.skipped.append(when.isoformat())
            continue
        flow_fn(profile=profile, as_of=when)
        report.ran.append(when.isoformat())
    log.info("replay of %s for %s: %d run(s), %d date(s) already done",
             flow, profile, len(report.ran), len(report.skipped))
    return report
