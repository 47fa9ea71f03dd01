"""On a local Dask cluster, many profiles in parallel give what a sequential run gives;
the cluster a run starts for itself listens on loopback only."""

from __future__ import annotations

import os
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


def listening(pids: set[int]) -> set[tuple[int, str, int]]:
    """(pid, host, port) of every listening TCP socket of these processes."""
    import psutil

    found = set()
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.Error:  # the process ended between listing and asking
            continue
        found |= {(pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}
    return found


def process_tree() -> set[int]:
    import psutil

    me = psutil.Process()
    return {me.pid} | {child.pid for child in me.children(recursive=True)}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize("dashboard", [False, True], ids=["no dashboard", "dashboard asked for"])
def test_a_local_cluster_listens_on_loopback_only(
    store: Store, monkeypatch: pytest.MonkeyPatch, dashboard: bool
) -> None:
    """The cluster a run starts for itself is reachable from this machine only: its
    scheduler, workers and the dashboard (unauthenticated) if asked for listen on
    loopback."""
    import threading

    from reverie.flows.decay import decay
    from reverie.runner.runtime import task_runner

    ingest_records(store, [{**r, "profile": "p00"} for r in profile_records(0)])
    monkeypatch.setenv("REVERIE_TASK_RUNNER", "dask")
    monkeypatch.delenv("REVERIE_DASK_ADDRESS", raising=False)
    monkeypatch.setenv("REVERIE_DASK_WORKERS", "1")
    port = free_port()
    if dashboard:
        monkeypatch.setenv("REVERIE_DASK_DASHBOARD_PORT", str(port))
    else:
        monkeypatch.delenv("REVERIE_DASK_DASHBOARD_PORT", raising=False)
    before = listening(process_tree())

    # The sockets exist only while the run's cluster does: look from beside the run.
    seen: set[tuple[int, str, int]] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(listening(process_tree()))
            done.wait(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        decay.with_options(task_runner=task_runner())(profile="p00", as_of=AS_OF)
    finally:
        done.set()
        watcher.join()

    # The watch saw the cluster: its scheduler (in this process), its worker and nanny
    # (in child processes).
    opened = {pid for pid, _, _ in seen - before}
    assert os.getpid() in opened and opened - {os.getpid()}, sorted(seen)
    assert {host for _, host, _ in seen} <= {"127.0.0.1", "::1"}, sorted(seen)
    assert ((os.getpid(), "127.0.0.1", port) in seen) == dashboard
