"""`reverie serve`'s Prefect server: its own database on SQLite or on PostgreSQL; what a
signal to `reverie serve` ends (everything it started, flow runs included, within a bound);
and the work pool an operator paused staying paused across restarts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlalchemy import create_engine, text

from reverie.deployments.serve import (
    LEASE_STORAGE_VARIABLE,
    PREFECT_DATABASE_VARIABLE,
    READY,
    STOP_SECONDS,
    WORK_POOL,
    PrefectDatabase,
    prefect_database_advice,
    prefect_database_kind,
    prefect_database_url,
    project_root,
    stack_environment,
    start_server,
    start_stack,
    stop,
)
from reverie.models.errors import ConfigError
from reverie.models.store import Store

from conftest import TEST_POSTGRES, _create_postgres_database, _drop_postgres_database
from prefect_stack import RUN_SECONDS, free_port, gone, wait_for, write_prefect_file
from stubborn_flow import CHILD_MARKER

pytestmark = pytest.mark.store_independent(
    "the processes of `reverie serve`; the store's part runs in every flow test on both")

# Past the stop's own bound: Python's start-up and the last SIGKILLs landing.
STOP_SLACK_SECONDS = 10


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("postgresql://u:p@db:5432/prefect", "postgresql+asyncpg://u:p@db:5432/prefect"),
        ("postgres://u:p@db/prefect", "postgresql+asyncpg://u:p@db/prefect"),
        ("postgresql+psycopg2://u:p@db/prefect", "postgresql+asyncpg://u:p@db/prefect"),
        ("postgresql+asyncpg://u:p@db/prefect", "postgresql+asyncpg://u:p@db/prefect"),
        ("sqlite:////var/prefect.db", "sqlite+aiosqlite:////var/prefect.db"),
    ],
)
def test_prefects_database_url_takes_any_drivers_spelling(given: str, used: str) -> None:
    assert prefect_database_url(given) == used


@pytest.mark.parametrize("bad", ["mysql://u:secret@db/prefect", "not a url", "postgresql://"])
def test_a_database_prefect_cannot_use_is_refused_without_echoing_the_url(bad: str) -> None:
    with pytest.raises(ConfigError, match=PREFECT_DATABASE_VARIABLE) as refused:
        prefect_database_url(bad)
    assert "secret" not in str(refused.value)


def test_serve_warns_of_sqlite_for_prefect_only_past_the_measured_number_of_profiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from reverie.models.settings import get_settings

    sqlite, postgres = prefect_database_kind(None), prefect_database_kind("postgres://u:p@db/p")
    assert (sqlite, postgres) == (PrefectDatabase.SQLITE, PrefectDatabase.POSTGRESQL)
    assert prefect_database_kind("sqlite:////var/prefect.db") is PrefectDatabase.SQLITE
    limit = get_settings().prefect_sqlite_profiles
    assert prefect_database_advice(sqlite, limit, limit) is None
    assert prefect_database_advice(postgres, 10 * limit, limit) is None
    assert prefect_database_advice(sqlite, 10 * limit, 0) is None  # 0: never warn
    advice = prefect_database_advice(sqlite, limit + 1, limit)
    assert advice is not None and advice.startswith("warning:")
    # It names what to set, and the setting that silences it.
    assert PREFECT_DATABASE_VARIABLE in advice and "REVERIE_PREFECT_SQLITE_PROFILES" in advice
    monkeypatch.setenv("REVERIE_PREFECT_SQLITE_PROFILES", "-1")
    with pytest.raises(ValueError, match="prefect_sqlite_profiles"):
        get_settings()


@pytest.mark.skipif(not TEST_POSTGRES, reason="needs REVERIE_TEST_POSTGRES")
def test_prefects_own_database_on_postgresql_holds_the_runs(
    tmp_path: Path, sample_store: Store
) -> None:
    prefect_db = _create_postgres_database()
    port = free_port()
    server = start_server(port, tmp_path / "home", tmp_path / "server.log", prefect_db)
    try:
        # A run in a process of its own, as a worker's would be.
        env = {**os.environ, "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
               "REVERIE_DATABASE_URL": sample_store.url}
        done = subprocess.run(
            [sys.executable, "-m", "reverie.deployments.cli", "run", "decay", "--profile", "maya",
             "--as-of", "2025-07-01"],
            env=env, cwd=project_root(), capture_output=True, text=True, timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        stop([server])
    engine = create_engine(prefect_db)
    try:
        with engine.connect() as conn:
            names = [n for (n,) in conn.execute(text("SELECT name FROM flow_run"))]
    finally:
        engine.dispose()
        _drop_postgres_database(prefect_db)
    assert any(n.startswith("decay | maya |") for n in names)
    assert "database is locked" not in (tmp_path / "server.log").read_text()


def _stubborn_only(spec: dict[str, Any]) -> None:
    spec["deployments"] = [{
        "name": "stubborn",
        "entrypoint": "tests/stubborn_flow.py:stubborn",
        "work_pool": {"name": WORK_POOL, "work_queue_name": "default"},
    }]
    spec.pop("definitions", None)


def _stubborn_prefect_file(folder: Path) -> Path:
    """A prefect.yaml deploying tests/stubborn_flow.py alone: quick to deploy."""
    return write_prefect_file(folder, _stubborn_only)


@pytest.fixture
def stack_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REVERIE_DATABASE_URL", f"sqlite:///{tmp_path / 'store.db'}")
    Store(f"sqlite:///{tmp_path / 'store.db'}").create()  # serve needs its store's id
    monkeypatch.setenv("PREFECT_WORKER_QUERY_SECONDS", "2")  # the tests wait on the worker


def test_the_stack_keeps_concurrency_leases_on_disk_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(LEASE_STORAGE_VARIABLE, raising=False)
    assert stack_environment(4200, tmp_path)[LEASE_STORAGE_VARIABLE].endswith(".filesystem")
    monkeypatch.setenv(LEASE_STORAGE_VARIABLE, "my.lease.storage")
    assert stack_environment(4200, tmp_path)[LEASE_STORAGE_VARIABLE] == "my.lease.storage"


@contextmanager
def _api(port: int) -> Iterator[Any]:
    """A Prefect client of the stack on ``port``."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
        with get_client(sync_client=True) as client:
            yield client


def _ignores_sigterm(process: psutil.Process) -> bool:
    status = Path(f"/proc/{process.pid}/status").read_text()
    ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:"))
                  .split()[1], 16)
    return bool(ignored & (1 << (signal.SIGTERM - 1)))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "stubborn"),
    [(signal.SIGTERM, True), (signal.SIGINT, False)],
    ids=["sigterm-to-a-run-ignoring-it", "sigint-while-backgrounded"],
)
def test_a_signal_to_serve_ends_everything_it_started_within_the_bound(
    tmp_path: Path, stack_env: None, signum: int, stubborn: bool
) -> None:
    from prefect.deployments import run_deployment

    port = free_port()
    log = tmp_path / "serve.out"
    # As a shell starts a background job: with SIGINT ignored, which serve must undo.
    serve = subprocess.Popen(
        ["sh", "-c", 'trap "" INT; exec "$@"', "sh", sys.executable, "-c",
         "import sys; from pathlib import Path; from reverie.deployments.serve import serve; "
         "sys.exit(serve(int(sys.argv[1]), Path(sys.argv[2]), prefect_file=Path(sys.argv[3])))",
         str(port), str(tmp_path / "home"), str(_stubborn_prefect_file(tmp_path))],
        cwd=project_root(), stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )
    tree: list[psutil.Process] = []
    try:
        wait_for(lambda: serve.poll() is not None or READY in log.read_text(), 180,
                 "serve to be up", diagnose=lambda: log.read_text()[-3000:])
        assert serve.poll() is None, log.read_text()[-3000:]
        with _api(port) as client:
            run = run_deployment("stubborn/stubborn", timeout=0, parameters={"stubborn": stubborn})

            states: list[Any] = []

            def running_with_child() -> psutil.Process | None:
                state = client.read_flow_run(run.id).state_type
                states[:] = [state]
                assert state.value in ("SCHEDULED", "PENDING", "RUNNING"), state
                children = psutil.Process(serve.pid).children(recursive=True)
                return state.value == "RUNNING" and next(
                    (p for p in children if CHILD_MARKER in p.cmdline()), None)

            child = wait_for(running_with_child, RUN_SECONDS, "the flow run and its child",
                             progress=lambda: states[:],
                             diagnose=lambda: log.read_text()[-3000:])
        flow_run = child.parent()
        tree = psutil.Process(serve.pid).children(recursive=True)
        commands = [" ".join(p.cmdline()) for p in tree]
        assert any("server start" in c for c in commands), commands
        assert any("worker start" in c for c in commands), commands
        assert flow_run in tree and child in tree
        assert _ignores_sigterm(flow_run) is _ignores_sigterm(child) is stubborn

        signalled = time.monotonic()
        serve.send_signal(signum)
        assert serve.wait(timeout=STOP_SECONDS + STOP_SLACK_SECONDS) == 0
        wait_for(lambda: all(gone(p) for p in tree), 2, "the killed processes to end")
        assert time.monotonic() - signalled < STOP_SECONDS + STOP_SLACK_SECONDS
    finally:
        stop([serve])
        for process in tree:
            with suppress(psutil.Error):
                process.kill()


@pytest.mark.slow
def test_a_restart_keeps_the_pool_paused_with_its_concurrency_limit(
    tmp_path: Path, stack_env: None
) -> None:
    from prefect.client.schemas.actions import WorkPoolUpdate

    home, log, prefect_file = tmp_path / "home", tmp_path / "stack.log", _stubborn_prefect_file(
        tmp_path)
    port = free_port()
    processes = start_stack(port, home, log, prefect_file)
    try:
        with _api(port) as client:
            assert client.read_work_pool(WORK_POOL).type == "process"
            client.update_work_pool(WORK_POOL, WorkPoolUpdate(is_paused=True, concurrency_limit=3))
    finally:
        stop(processes)
    port = free_port()
    processes = start_stack(port, home, log, prefect_file)
    try:
        with _api(port) as client:
            pool = client.read_work_pool(WORK_POOL)
    finally:
        stop(processes)
    assert (pool.is_paused, pool.concurrency_limit) == (True, 3)


def test_a_server_that_cannot_start_is_reported_at_once_with_its_log(tmp_path: Path) -> None:
    import socket

    from reverie.models.errors import ReverieError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        log = tmp_path / "server.log"
        with pytest.raises(ReverieError, match=r"exited with code \d+ before it answered") as err:
            start_server(port, tmp_path / "home", log)
    assert str(log) in str(err.value)
