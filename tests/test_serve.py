"""`reverie serve`'s Prefect server: its own database on SQLite or on PostgreSQL."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from deployments.serve import (
    PREFECT_DATABASE_VARIABLE,
    prefect_database_url,
    project_root,
    start_server,
    stop,
)
from models.errors import ConfigError
from models.store import Store

from conftest import TEST_POSTGRES, _create_postgres_database, _drop_postgres_database


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


@pytest.mark.skipif(not TEST_POSTGRES, reason="needs REVERIE_TEST_POSTGRES")
def test_prefects_own_database_on_postgresql_holds_the_runs(
    tmp_path: Path, sample_store: Store
) -> None:
    prefect_db = _create_postgres_database()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = start_server(port, tmp_path / "home", tmp_path / "server.log", prefect_db)
    try:
        # A run in a process of its own, as a worker's would be.
        env = {**os.environ, "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
               "REVERIE_DATABASE_URL": sample_store.url}
        done = subprocess.run(
            [sys.executable, "-m", "deployments.cli", "run", "decay", "--profile", "maya",
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
