"""A flow run's resolved parameters and the store it works on.

A dry run works on a scratch copy of the selected profiles, made afresh for the run
and deleted after it: the real steps run with their real selection code and see
each other's effects exactly as in a real run, and the real store is never written.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from reverie.models.config import ConsolidationConfig
from reverie.models.db import copy_profiles, dispose
from reverie.models.errors import WrongStoreError
from reverie.models.settings import display_url, get_settings
from reverie.models.store import Store
from reverie.models.timestamps import to_utc_naive
from reverie.models.transient import retrying
from reverie.runner.runtime import flow_run_id, scheduled_start
from reverie.tasks.step import run_logger

ProfileSelector = str | list[str] | None
# A run whose store does not answer at its start tries again after ~2, 4, 8, 16, 30,
# 30 s (jittered): about a minute and a half for a database to come back.
RUN_START_RETRIES = 6
RUN_START_FIRST_SECONDS = 2.0
RUN_START_CAP_SECONDS = 30.0


@dataclass
class RunPlan:
    flow: str
    profiles: list[str]
    as_of: datetime
    dry_run: bool
    config: ConsolidationConfig
    store_url: str
    run_id: str | None


def prepare_run(
    flow: str,
    profile: ProfileSelector,
    as_of: datetime | None,
    dry_run: bool,
    config: ConsolidationConfig | None,
    store_id: str | None = None,
) -> RunPlan:
    """Resolve a flow's parameters. ``as_of`` defaults to the run's scheduled start, so a
    scheduled or backfilled run replays its own date. A store that is not there fails
    the run at once, naming the URL (``StoreMissingError``: nothing is created); with
    ``store_id`` (a triggered run: the id of the store whose event started it), a store
    of another id fails it too (``WrongStoreError``)."""
    settings = get_settings()

    def open_store() -> tuple[Store, list[str]]:
        store = Store(settings=settings)
        expected = ((store_id, "the event that started this run is of"),
                    (settings.store_id, "REVERIE_STORE_ID says this deployment serves"))
        for wanted, said in expected:
            if wanted and wanted != store.id:
                raise WrongStoreError(
                    f"{said} store {wanted}, but the store this run would work on "
                    f"({display_url(store.url)}) is store {store.id}: refused. A "
                    "deployment's triggers match only its own store's id "
                    "(REVERIE_STORE_ID when it was deployed)")
        return store, store.resolve_profiles(profile)

    # A store that is down or restarting when the run starts is waited for here, with
    # backoff, instead of failing the run before any task: the run's own retry.
    store, profiles = retrying(
        open_store, RUN_START_RETRIES, RUN_START_FIRST_SECONDS, RUN_START_CAP_SECONDS,
        on_retry=lambda n, exc, wait: run_logger().warning(
            "the store is not answering (%s); trying again in %.0f s (%d of %d)",
            type(exc).__name__, wait, n, RUN_START_RETRIES),
    )
    return RunPlan(
        flow=flow,
        profiles=profiles,
        as_of=to_utc_naive(as_of) if as_of is not None else scheduled_start(),
        dry_run=dry_run,
        config=config or settings.consolidation_config(),
        store_url=store.url,
        run_id=flow_run_id(),
    )


@contextmanager
def working_store(plan: RunPlan) -> Iterator[str]:
    """The URL the steps write to: the real store, or for a dry run a scratch copy."""
    if not plan.dry_run:
        yield plan.store_url
        return
    folder = Path(tempfile.mkdtemp(prefix="reverie-dry-run-"))
    url = f"sqlite:///{folder / 'scratch.db'}"
    try:
        copy_profiles(plan.store_url, url, plan.profiles)
        yield url
    finally:
        dispose(url)
        shutil.rmtree(folder, ignore_errors=True)
