"""No event is lost while the Prefect API is down: a real Prefect server, every deployment
of prefect.yaml and a process worker; the server stops, a profile crosses its store
threshold meanwhile, the server comes back (same home, same port, same database), the
waiting events are flushed, and the lightweight run for that profile follows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from deployments.serve import WORK_POOL, project_root, start_server, start_stack, stop
from models import events, outbox
from models.db import dispose
from models.store import Store

from conftest import TEST_POSTGRES, _create_postgres_database, _drop_postgres_database
from test_platform import AUTOMATION_SECONDS, Stack, free_port, wait_for

pytestmark = pytest.mark.slow

VECTOR = [1.0] + [0.0] * 383  # supplied: the test needs no embedding model


def _threshold_runs(stack: Stack, profile: str) -> list[Any]:
    return [r for r in stack.runs("on-demand")
            if r.created_by and r.created_by.display_value == "lightweight-every-50-stores"
            and r.parameters.get("profile") == profile]


def _workers(stack: Stack) -> list[Any]:
    with stack.client() as client:
        return client.read_workers_for_work_pool(WORK_POOL)


def test_events_kept_while_the_api_is_down_trigger_their_run_once_it_is_back(
    tmp_path: Path,
) -> None:
    from prefect.client.schemas.objects import StateType
    from prefect.settings import PREFECT_API_URL, temporary_settings

    store_url = _create_postgres_database() if TEST_POSTGRES else f"sqlite:///{tmp_path}/store.db"
    port, home, log = free_port(), tmp_path / "prefect-home", tmp_path / "stack.log"
    api = f"http://127.0.0.1:{port}/api"
    saved = {k: os.environ.get(k) for k in ("REVERIE_DATABASE_URL", "PREFECT_WORKER_QUERY_SECONDS")}
    os.environ["REVERIE_DATABASE_URL"] = store_url
    os.environ["PREFECT_WORKER_QUERY_SECONDS"] = "2"  # poll often: the test waits on it
    server, worker = processes = start_stack(port, home, log)
    try:
        with temporary_settings({PREFECT_API_URL: api}):
            stack = Stack(api, f"http://127.0.0.1:{port}", Store(store_url), log)
            # A worker starting without an API gives up: let it find its pool first.
            wait_for(lambda: _workers(stack), 120, "the worker to poll its pool")
            stop([server])  # the API goes away; the worker stays

            started = time.monotonic()
            stack.store.ingest([{"content": f"fact {i}", "embedding": VECTOR} for i in range(50)],
                               profile="outbox-a")
            stack.store.ingest([{"content": f"fact {i}", "embedding": VECTOR} for i in range(30)],
                               profile="outbox-b")
            assert time.monotonic() - started < 2 * events.SEND_DEADLINE_SECONDS
            assert [(p.profile, p.events) for p in outbox.waiting(store_url)] == [
                ("outbox-a", 2), ("outbox-b", 1)]
            down = outbox.flush(store_url)  # the real send, to nobody
            assert down.outcome is outbox.Outcome.UNREACHABLE and down.pending == 3

            server = processes[0] = start_server(port, home, log)  # its old database
            assert worker.poll() is None, "the worker died while the server was down"
            flushed = subprocess.run(
                [sys.executable, "-m", "deployments.cli", "events", "flush"],
                cwd=project_root(), capture_output=True, text=True, timeout=120,
                env={**os.environ, "PREFECT_API_URL": api},
            )
            assert flushed.returncode == 0, flushed.stderr
            assert flushed.stdout == "sent 3, waiting 0\n"
            assert outbox.waiting(store_url) == []

            (run,) = wait_for(lambda: _threshold_runs(stack, "outbox-a"), AUTOMATION_SECONDS,
                              "the store-threshold run of outbox-a")
            run = stack.wait_final(run.id)
            assert run.state_type is StateType.COMPLETED, log.read_text()[-3000:]
            assert len(_threshold_runs(stack, "outbox-a")) == 1
            assert _threshold_runs(stack, "outbox-b") == []  # 30 stores: no threshold
    finally:
        stop(processes)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if TEST_POSTGRES:
            _drop_postgres_database(store_url)
        else:
            dispose(store_url)
