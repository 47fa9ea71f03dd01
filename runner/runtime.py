"""Reverie's flows inside Prefect: how a flow is declared (its name, run names and task
runner), what the run knows of itself (its id, its scheduled start, its logger),
flow runs without heartbeats on a server of the command's own, and waiting for Prefect
to have recorded a run made against a temporary server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from prefect import Flow
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from reverie.models.settings import get_settings
from reverie.models.timestamps import to_utc_naive, utcnow
from reverie.runner.event_delivery import api_configured
from reverie.runner.parameters import documented

if TYPE_CHECKING:
    from reverie.runner.report import RunReport

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")

# How long a run without a configured API waits for Prefect's temporary server to record
# its task runs before the process exits (see wait_for_run_history).
HISTORY_WAIT_SECONDS = 15.0
HISTORY_POLL_SECONDS = 0.5
HISTORY_PAGE = 200
LOOPBACK = "127.0.0.1"


@contextmanager
def without_heartbeats() -> Iterator[None]:
    """Flow runs inside the ``with`` send no Prefect heartbeats. Heartbeats let an
    automation mark a run whose process died as crashed, which nobody sets up on a
    server a command started for itself; and ending them holds up every flow run by up
    to a second (Prefect's heartbeat thread looks for the run's end once a second)."""
    import prefect.context

    # A copy of the current settings with the one value changed, entered as Prefect's
    # temporary_settings does; that function reads and validates every setting again
    # (35 ms, over 150 ms on a busy machine), for a value nothing else derives from.
    current = prefect.context.get_settings_context()
    settings = current.settings
    quiet = settings.model_copy(update={
        "flows": settings.flows.model_copy(update={"heartbeat_frequency": None})})
    with prefect.context.SettingsContext(profile=current.profile, settings=quiet):
        yield


def task_runner() -> TaskRunner[Any]:
    """The task runner flows use (``REVERIE_TASK_RUNNER``): ``REVERIE_TASK_THREADS``
    threads in the flow's process, or Dask: the scheduler at ``REVERIE_DASK_ADDRESS``, else
    a local cluster of ``REVERIE_DASK_WORKERS`` processes started for the run, on
    loopback (``REVERIE_DASK_DASHBOARD_PORT`` gives it a dashboard)."""
    settings = get_settings()
    if settings.task_runner == "dask":
        from prefect_dask import DaskTaskRunner

        if settings.dask_address:
            return DaskTaskRunner(address=settings.dask_address)
        options = local_cluster_options(settings.dask_workers, settings.dask_dashboard_port)
        return DaskTaskRunner(cluster_kwargs=options)
    return ThreadPoolTaskRunner(max_workers=settings.task_threads)


def local_cluster_options(workers: int, dashboard_port: int | None) -> dict[str, Any]:
    """``distributed.LocalCluster`` arguments for a cluster that only this machine can
    reach. Dask's defaults put an unauthenticated dashboard on every interface
    (0.0.0.0:8787), and nothing of a run needs to be reached from elsewhere."""
    # Without a dashboard the scheduler still serves health checks and metrics over HTTP,
    # by default on port 8787: on a free port instead, so that two runs at once do not
    # contend for it. Workers and nannies listen on the cluster's host.
    http = f"{LOOPBACK}:{0 if dashboard_port is None else dashboard_port}"
    return {
        "n_workers": workers,
        "threads_per_worker": 1,
        "host": LOOPBACK,
        "dashboard_address": None if dashboard_port is None else http,
        "scheduler_kwargs": {"dashboard_address": http},
    }


class ReverieFlow(Flow[P, R]):
    """Prefect's flow, its run's parameters sent to the API without FastAPI when they
    are plain values (``plain_parameters``): Prefect encodes them with FastAPI's
    ``jsonable_encoder``, and importing FastAPI for that is about 0.1 s of a local
    command. Any other value goes Prefect's way, so the API receives the same JSON."""

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        plain = plain_parameters(parameters)
        return plain if plain is not None else super().serialize_parameters(parameters)


def plain_parameters(parameters: Mapping[str, Any]) -> dict[str, Any] | None:
    """``parameters`` as FastAPI's ``jsonable_encoder`` gives them, if every value is
    None, a bool, an int, a float, a str, a datetime or a list or tuple of those (exact
    types: an enum or a str subclass encodes differently); else None."""
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        if type(value) in (list, tuple):
            if not all(type(v) in _PLAIN for v in value):
                return None
            out[key] = [_encoded(v) for v in value]
        elif type(value) in _PLAIN:
            out[key] = _encoded(value)
        else:
            return None
    return out


_PLAIN = (type(None), bool, int, float, str, datetime)


def _encoded(value: Any) -> Any:
    return value.isoformat() if type(value) is datetime else value


def reverie_flow(name: str) -> Callable[[Callable[..., RunReport]], Flow[..., RunReport]]:
    """Declare a Reverie flow: runs named by ``run_name``, prints not captured (they
    could carry memory content), tasks on the configured ``task_runner``, parameters
    described in Prefect's form (``documented``)."""
    def declare(fn: Callable[..., RunReport]) -> Flow[..., RunReport]:
        return ReverieFlow(
            documented(fn), name=name, flow_run_name=run_name(name), log_prints=False,
            task_runner=task_runner(),
        )

    return declare


def run_name(flow: str) -> Callable[[], str]:
    """A flow-run namer for Prefect: flow, profiles, as_of, and whether it is a dry run."""

    def name() -> str:
        from prefect.runtime import flow_run

        params = flow_run.parameters
        profile = params.get("profile")
        if profile is None:
            who = "all profiles"
        elif isinstance(profile, str):
            who = profile
        else:
            who = ", ".join(profile[:3]) + (f" +{len(profile) - 3}" if len(profile) > 3 else "")
        # Without an as_of the run acts as of its scheduled start: name it so.
        when = params.get("as_of") or flow_run.scheduled_start_time
        when_text = str(when)[:19]
        suffix = " (dry run)" if params.get("dry_run") else ""
        return f"{flow} | {who} | as of {when_text}{suffix}"

    return name


def scheduled_start() -> datetime:
    try:
        from prefect.runtime import flow_run

        start = flow_run.scheduled_start_time
        if not isinstance(start, datetime):
            start = datetime.fromisoformat(str(start).replace("Z", "+00:00"))
        return to_utc_naive(start)
    except Exception:
        return utcnow()


def flow_run_id() -> str | None:
    try:
        from prefect.runtime import flow_run

        return flow_run.id
    except Exception:
        return None


def wait_for_run_history(run_id: str | None, timeout: float = HISTORY_WAIT_SECONDS) -> bool:
    """Wait until Prefect's temporary server has recorded every task run of ``run_id``.

    Without a configured API a flow runs against a temporary server that lives only as
    long as this process. Task runs reach it as client events, written one at a time;
    when the process exits, the server cancels the writes still queued, which loses the
    last task runs of the history and prints a traceback. So a local run sends its
    events now and waits (at most ``timeout``) until the run's task runs are all final
    and their number has stopped growing. With a configured API it returns at once: a
    real server keeps what it has received. True when the history settled in time.
    """
    if run_id is None or api_configured():
        return True
    from prefect.client.orchestration import get_client
    from prefect.events.worker import EventsWorker

    EventsWorker.drain_all(timeout=timeout, at_exit=False)
    deadline = time.monotonic() + timeout
    seen = -1
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            runs = recorded_task_runs(client, run_id)
            if len(runs) == seen and all(r.state and r.state.is_final() for r in runs):
                return True
            seen = len(runs)
            time.sleep(HISTORY_POLL_SECONDS)
    log.warning("run %s: Prefect had not recorded all task runs after %.0f s", run_id, timeout)
    return False


def recorded_task_runs(client: Any, run_id: str) -> list[Any]:
    """Every task run Prefect has recorded so far for flow run ``run_id``, page by page
    (``client``: a sync Prefect client)."""
    from uuid import UUID

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    of_run = FlowRunFilter(id=FlowRunFilterId(any_=[UUID(run_id)]))
    runs: list[Any] = []
    while True:
        page = client.read_task_runs(flow_run_filter=of_run, limit=HISTORY_PAGE, offset=len(runs))
        runs += page
        if len(page) < HISTORY_PAGE:
            return runs
