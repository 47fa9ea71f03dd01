"""Many profiles in parallel on a local Dask cluster give what a sequential run gives."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from reverie.flows.full_consolidation import full_consolidation
from reverie.models.db import copy_profiles
from reverie.models.export import export_jsonl
from reverie.models.store import Store

from factories import at_cosine, axis, ingest_records

AS_OF = datetime(2025, 7, 1)
PROFILES = 50


def profile_records(n: int) -> list[dict]:
    """A duplicate group, a pair, loners and a stale edge: every step has work."""
    day = (AS_OF - timedelta(days=60 + n)).isoformat() + "Z"
    records = [
        {"id": f"d{k}", "content": f"profile {n} fact repeated {'x' * k}", "created_at": day,
         "access_count": 3 + k, "confidence": 0.8,
         "embedding": (axis(0) if k == 2 else at_cosine(0.9, other=1 + k)).tolist()}
        for k in range(3)
    ]
    records += [
        {"id": f"l{k}", "content": f"profile {n} loner {k}", "kind": kind, "created_at": day,
         "embedding": axis(10 + k).tolist()}
        for k, kind in enumerate(["episodic", "semantic", "decision", "preference"])
    ]
    records += [{"type": "edge", "source": "l0", "target": "l1", "weight": 0.3,
                 "last_strengthened_at": day}]
    return [{**r, "profile": f"p{n:02d}"} for r in records]


@pytest.mark.usefixtures("prefect_api")
def test_fifty_profiles_on_dask_match_a_sequential_run(
    new_store: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.task_runners import ThreadPoolTaskRunner
    from prefect_dask import DaskTaskRunner

    parallel = new_store("parallel")
    report = ingest_records(parallel, [r for n in range(PROFILES) for r in profile_records(n)])
    assert not report.errors and report.edges == PROFILES
    sequential = new_store("sequential")
    copy_profiles(parallel.url, sequential.url, parallel.profiles())

    monkeypatch.setenv("REVERIE_DATABASE_URL", parallel.url)
    on_dask = full_consolidation.with_options(
        task_runner=DaskTaskRunner(cluster_kwargs={"n_workers": 2, "threads_per_worker": 1})
    )
    result = on_dask(profile=None, as_of=AS_OF)
    assert len(result.profiles) == PROFILES
    assert all(s.facts["groups"] == 1 for s in result.steps if s.step == "dedup")

    monkeypatch.setenv("REVERIE_DATABASE_URL", sequential.url)
    one_at_a_time = full_consolidation.with_options(task_runner=ThreadPoolTaskRunner(max_workers=1))
    one_at_a_time(profile=None, as_of=AS_OF)

    for profile in parallel.profiles():
        assert export_jsonl(parallel.url, profile) == export_jsonl(sequential.url, profile)
