"""Replay: one flow run that walks a backfill's dates for one profile, in schedule order.

::

    <flow> as of d1 ──> <flow> as of d2 ──> ... ──> <flow> as of dn    (subflow runs)
    decay d1 ──> full d1 ──> decay d2 ──> full d2 ──> ...             (``flow="decay,full"``)

A backfill exists to replay history, and history has an order: the store must end as
one-at-a-time runs through the same dates leave it. One run per date, all created at
once, raced for the profile's slot and ran in any order (a 7-day backfill ended on its
5th day), and each waited in a process of its own. So ``reverie backfill`` creates one
replay run per profile instead: its dates run one after another, never side by side;
profiles run side by side, as many at once as the replay deployment's concurrency
limit allows (prefect.yaml), so 1,000 dates are one process, not 1,000.

Several flows are history too: on one date, the schedules run decay before the nightly
full consolidation (``catalog.SCHEDULE_ORDER``), and a full run that sees relevance
computed for a later date ends elsewhere. So the replays of one profile take turns (a
lease in the store, ``replay:<profile>``), and the one whose turn it is runs, in
(as_of, schedule order), the dates of every replay of that profile on that store still
queued or running, its own and theirs: two backfills started one after the other (decay,
then full) interleave by date as one ``decay,full`` backfill does, whichever replay
starts first. A replay waiting for its turn says so (``runner/waiting.py``); once its
turn comes, what the others ran is in the run history and it skips it.

A date whose run is already in the store's run history for the profile is skipped, so
a replay run again after a crash or a cancel picks up where it stopped, however many
dates came before (the store is the record of what ran, not Prefect's run list).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any
from uuid import uuid4

from prefect import flow
from pydantic import Field

from reverie.flows.catalog import FLOW_ENTRIES, SCHEDULE_ORDER, names_help, parse_flows
from reverie.models.repositories.runs import latest_as_of, run_history
from reverie.models.settings import get_settings
from reverie.models.store import Store
from reverie.models.timestamps import to_utc_naive
from reverie.runner.event_delivery import api_configured
from reverie.runner.parameters import documented
from reverie.runner.profile_holds import ProfileHolds
from reverie.runner.runtime import flow_run_id
from reverie.runner.waiting import WaitNotice
from reverie.tasks.step import run_logger

FLOW_NAME = "replay"
log = logging.getLogger(__name__)

# A replay of more dates than this is refused: ten years of hourly runs, far past any
# backfill a platform means to make in one go (and the parameter stays a few MB).
MAX_DATES = 100_000
# A replay waiting for its profile's turn looks again this often.
TURN_POLL_SECONDS = 2.0
TURN_PREFIX = "replay:"
# The store's lease table keys hold 128 characters, a profile name as many.
LEASE_KEY_CHARS = 128
STORE_TAG_PREFIX = "reverie-store-"
RUN_PAGE = 200

Item = tuple[str, datetime]  # (flow's short name, as_of)


@dataclass
class ReplayReport:
    flow: str
    profile: str
    ran: list[str] = field(default_factory=list)  # "<flow> <as_of>" of each run made
    skipped: list[str] = field(default_factory=list)  # as_of of its dates already done
    # Runs made out of schedule order: asked for after a later date had run.
    out_of_order: list[str] = field(default_factory=list)


def store_tag(store_id: str) -> str:
    """The tag a replay run carries: which store's history it replays (two stores on one
    Prefect have replays of profiles of the same name)."""
    return f"{STORE_TAG_PREFIX}{store_id}"


def turn_key(profile: str) -> str:
    """The store lease that a profile's replays take turns on."""
    key = f"{TURN_PREFIX}{profile}"
    if len(key) <= LEASE_KEY_CHARS:
        return key
    return f"{TURN_PREFIX}{hashlib.sha256(profile.encode()).hexdigest()}"


def in_schedule_order(asked: Iterable[Item], done: set[Item]) -> list[Item]:
    """What is left of ``asked``, each once, by as_of and, on one as_of, in the order a
    day's schedules run the flows (the plan; ``done`` is the store's run history)."""
    return sorted(set(asked) - done, key=lambda item: (item[1], SCHEDULE_ORDER[item[0]]))


def items_of(flows: str, dates: Iterable[Any]) -> list[Item]:
    return [(f, to_utc_naive(_as_datetime(d))) for f in parse_flows(flows) for d in dates]


def _as_datetime(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def done_dates(store: Store, flow_name: str, profile: str) -> set[datetime]:
    """The as_of of every finished run of ``flow_name`` for ``profile``."""
    with store.reading_all() as s:
        return {r.as_of for r in run_history(s, profile=profile, flow=flow_name, limit=None)}


def done_items(store: Store, flows: Iterable[str], profile: str) -> set[Item]:
    from reverie.flows.catalog import FLOWS

    return {(f, when) for f in set(flows) for when in done_dates(store, FLOWS[f].name, profile)}


def history_ends(store: Store, profiles: Sequence[str]) -> dict[str, tuple[datetime, int]]:
    """Where each profile's history stands: its latest finished run of a registry flow,
    as (as_of, schedule order). A run placed before it comes too late for schedule order:
    the store will not end where runs in date order would have left it."""
    order = {e.flow_name: SCHEDULE_ORDER[e.name] for e in FLOW_ENTRIES}
    with store.reading_all() as s:
        latest = latest_as_of(s, profiles)
    ends: dict[str, tuple[datetime, int]] = {}
    for (profile, name), when in latest.items():
        if name in order:
            place = (when, order[name])
            ends[profile] = max(ends.get(profile, place), place)
    return ends


def comes_late(ends: dict[str, tuple[datetime, int]], profile: str, name: str,
               when: datetime) -> bool:
    """Whether flow ``name`` as of ``when`` comes before where ``profile``'s history
    stands (``ends``, from ``history_ends``)."""
    return profile in ends and ends[profile] > (when, SCHEDULE_ORDER[name])


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


def live_replays(store_id: str, profile: str | None = None) -> list[Any]:
    """This store's replay runs not finished yet (of one profile, or all), page by
    page: a platform may have far more runs than one page holds."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType

    live = FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[
            StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.PAUSED,
            StateType.CANCELLING,
        ])),
        tags=FlowRunFilterTags(all_=[store_tag(store_id)]),
    )
    of_replay = FlowFilter(name=FlowFilterName(any_=[FLOW_NAME]))
    runs: list[Any] = []
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_flow_runs(flow_filter=of_replay, flow_run_filter=live,
                                         limit=RUN_PAGE, offset=len(runs))
            runs += page
            if len(page) < RUN_PAGE:
                break
    return [r for r in runs if profile is None or r.parameters.get("profile") == profile]


@dataclass(frozen=True)
class ReplayProgress:
    """One replay run not finished yet, and how far its runs have got."""

    run_id: str
    name: str
    state: str
    flow: str
    profile: str
    done: int  # its runs (flow, as_of) already in the store's run history
    total: int


def replay_progress(store: Store) -> list[ReplayProgress]:
    """Every replay of this store still queued or running, with the share of its runs
    done (``reverie status``, ``reverie backfill --wait``)."""
    out = []
    for run in live_replays(store.id):
        profile = str(run.parameters.get("profile"))
        try:
            own = set(items_of(str(run.parameters.get("flow")), run.parameters.get("dates") or []))
        except Exception:  # noqa: BLE001 - not a backfill's replay: shown without counts
            own = set()
        done = len(own & done_items(store, {f for f, _ in own}, profile)) if own else 0
        out.append(ReplayProgress(str(run.id), run.name, run.state_name or "?",
                                  str(run.parameters.get("flow")), profile, done, len(own)))
    return sorted(out, key=lambda r: (r.profile, r.flow, r.run_id))


def _asked_of_others(store: Store, profile: str) -> list[Item]:
    """The dates of every other replay of ``profile`` on this store still queued or
    running: whoever has the turn runs them in order with its own."""
    if not api_configured():
        return []
    me = flow_run_id()
    asked: list[Item] = []
    for run in live_replays(store.id, profile):
        if str(run.id) == me:
            continue
        try:
            asked += items_of(str(run.parameters.get("flow")), run.parameters.get("dates") or [])
        except Exception as exc:  # noqa: BLE001 - a malformed run is its own to fail
            log.warning("replay run %s: its parameters are not a backfill's (%s)", run.id, exc)
    return asked


@flow(name=FLOW_NAME, flow_run_name=replay_name, log_prints=False)
@documented
def replay(
    flow: Annotated[str, Field(description="The flow to replay: its short name "
                               f"({names_help()}), or several joined by commas, run on "
                               "each date in the order a day's schedules run them.")],
    profile: Annotated[str, Field(description="The one profile whose history is replayed.")],
    dates: Annotated[list[datetime], Field(
        min_length=1, max_length=MAX_DATES,
        description="The as_of of each run, ISO-8601; run in ascending order.")],
) -> ReplayReport:
    """Run ``flow`` for ``profile`` once per date, in (as_of, schedule order), with the
    dates of the profile's other replays on this store, skipping what the store's run
    history already has."""
    from reverie.flows.catalog import FLOWS

    own = items_of(flow, dates)
    store = Store()
    store.resolve_profiles(profile)
    report = ReplayReport(flow, profile)
    report.skipped = sorted({when.isoformat() for f, when in
                             set(own) & done_items(store, {f for f, _ in own}, profile)})
    holder = flow_run_id() or f"local-{uuid4()}"
    key = turn_key(profile)
    logger = run_logger()
    with ProfileHolds(store, holder, None, get_settings().lease_seconds,
                      with_prefect=False) as turn:
        notice, since = WaitNotice(store.id), time.monotonic()
        while not turn.take([key]):
            notice.tell([(f"its turn to replay {profile}'s history", turn.holder_of(key),
                          time.monotonic() - since)])
            time.sleep(TURN_POLL_SECONDS)
        last: tuple[datetime, int] | None = None
        while True:
            # Asked again after each run: a backfill made meanwhile joins in order.
            asked = own + _asked_of_others(store, profile)
            todo = in_schedule_order(asked, done_items(store, {f for f, _ in asked}, profile))
            if not todo:
                break
            name, when = todo[0]
            place = (when, SCHEDULE_ORDER[name])
            # Runs in the history count, read before each run (a scheduled one may land
            # meanwhile): a backfill into the past after a later scheduled run is as late
            # as one asked for during this replay.
            ended = history_ends(store, [profile]).get(profile)
            last = max(last, ended) if last and ended else (last or ended)
            if last is not None and place < last:
                # Asked for after a later date had run: nothing can undo that order.
                report.out_of_order.append(f"{name} {when.isoformat()}")
                logger.warning("%s as of %s runs after a later date had run (as of %s): it "
                               "was asked for too late to keep schedule order", name,
                               when.isoformat(), last[0].isoformat())
            FLOWS[name](profile=profile, as_of=when)
            report.ran.append(f"{name} {when.isoformat()}")
            last = max(place, last) if last else place
    logger.info("replay of %s for %s: %d run(s), %d of its date(s) already done", flow,
                profile, len(report.ran), len(report.skipped))
    return report
