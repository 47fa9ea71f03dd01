"""``reverie serve``: the whole Prefect stack on this machine, for trying Reverie out.

Starts a Prefect server on 127.0.0.1, creates the ``reverie`` process work pool,
deploys every flow from ``prefect.yaml`` (schedules and event triggers included) and
starts a worker, then waits until interrupted (Ctrl-C stops everything it started).
Prefect keeps its own database under ``--home`` (default ``.reverie/prefect``), apart
from the memory store: SQLite, or PostgreSQL when ``PREFECT_API_DATABASE_CONNECTION_URL``
names one (from the environment: the URL holds a password), which a platform should use
once runs overlap (SQLite locks up under a few concurrent runs: "database is locked",
then 503s).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from models.errors import ConfigError, ReverieError
from models.settings import DATABASE_URL_VARIABLE, get_settings, resolve_database_url

WORK_POOL = "reverie"
PREFECT_DATABASE_VARIABLE = "PREFECT_API_DATABASE_CONNECTION_URL"
READY = "Reverie is up"


def project_root() -> Path:
    """The folder holding ``prefect.yaml``: the current one or one above, else the checkout."""
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / "prefect.yaml").is_file():
            return folder
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "prefect.yaml").is_file():
        return checkout
    raise ReverieError("no prefect.yaml here or above: run `reverie serve` from the checkout")


def prefect_database_url(url: str) -> str:
    """Prefect's server reaches PostgreSQL through asyncpg and SQLite through aiosqlite:
    accept the URL in any driver's spelling (the store's psycopg2 URL included)."""
    scheme, sep, rest = url.partition("://")
    if not sep or not rest:
        raise ConfigError(f"{PREFECT_DATABASE_VARIABLE} is not a database URL")
    if scheme in ("postgres", "postgresql") or scheme.startswith("postgresql+"):
        return f"postgresql+asyncpg://{rest}"
    if scheme == "sqlite" or scheme.startswith("sqlite+"):
        return f"sqlite+aiosqlite://{rest}"
    raise ConfigError(f"{PREFECT_DATABASE_VARIABLE}: Prefect's server runs on PostgreSQL "
                      f"or SQLite, not {scheme!r}")


def stack_environment(port: int, home: Path, prefect_database: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    database = prefect_database or env.get(PREFECT_DATABASE_VARIABLE)
    if database:
        env[PREFECT_DATABASE_VARIABLE] = prefect_database_url(database)
    env.update({
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "HF_HUB_OFFLINE": "1",
        # The worker's flow runs must find the same store whatever their folder.
        DATABASE_URL_VARIABLE: resolve_database_url(get_settings().database_url),
    })
    return env


def _prefect(*args: str) -> list[str]:
    beside_python = shutil.which("prefect", path=str(Path(sys.executable).parent))
    found = beside_python or shutil.which("prefect")
    if not found:
        raise ReverieError("the prefect command is not installed")
    return [found, *args]


def wait_healthy(port: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{port}/api/health"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise ReverieError(f"the Prefect server did not answer on {url} within {timeout:.0f} s")


def start_server(
    port: int, home: Path, log: Path, prefect_database: str | None = None
) -> subprocess.Popen[bytes]:
    """A Prefect server on 127.0.0.1:``port``, answering when this returns."""
    home.mkdir(parents=True, exist_ok=True)
    env = stack_environment(port, home, prefect_database)
    server = subprocess.Popen(
        _prefect("server", "start", "--host", "127.0.0.1", "--port", str(port)),
        env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
    )
    try:
        wait_healthy(port)
    except BaseException:
        stop([server])
        raise
    return server


def start_stack(
    port: int, home: Path, log: Path, prefect_file: Path | None = None,
    prefect_database: str | None = None,
) -> list[subprocess.Popen[bytes]]:
    """Server, work pool, deployments (from ``prefect_file``, default the project's
    ``prefect.yaml``) and worker; returns the processes started."""
    root = project_root()
    env = stack_environment(port, home, prefect_database)
    # prefect.yaml's pull step reads $PWD: the checkout the worker runs flows from.
    env["PWD"] = str(root)
    out = log.open("ab")
    processes = [start_server(port, home, log, prefect_database)]
    try:
        subprocess.run(
            _prefect("work-pool", "create", WORK_POOL, "--type", "process", "--overwrite"),
            env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT, check=True,
        )
        deploy = ["--prefect-file", str(prefect_file)] if prefect_file else []
        subprocess.run(
            _prefect("--no-prompt", "deploy", "--all", *deploy),
            env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT, check=True,
        )
        processes.append(subprocess.Popen(
            _prefect("worker", "start", "--pool", WORK_POOL),
            env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT,
        ))
    except BaseException:
        stop(processes)
        raise
    return processes


def stop(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    for process in reversed(processes):
        if process.poll() is None:
            process.terminate()
    for process in reversed(processes):
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def serve(port: int = 4200, home: Path | None = None, prefect_database: str | None = None) -> int:
    home = (home or Path(".reverie") / "prefect").resolve()
    log = home / "stack.log"
    home.mkdir(parents=True, exist_ok=True)
    database = prefect_database or os.environ.get(PREFECT_DATABASE_VARIABLE)
    where = "PostgreSQL" if database and prefect_database_url(database).startswith("postgresql") \
        else "SQLite"
    print(f"starting Prefect on http://127.0.0.1:{port}, its database on {where} "
          f"(log: {log}) ...", flush=True)
    # A service manager stops us with SIGTERM: stop what we started, as on Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupt)
    processes = start_stack(port, home, log, prefect_database=prefect_database)
    print(
        f"{READY}: http://127.0.0.1:{port}\n"
        f"  Deployments: every flow and its schedule; click one, then 'Run' to start it.\n"
        f"  Runs: each run, its task graph, logs, and the Artifacts tab (summary, changes).\n"
        f"  In another shell: export PREFECT_API_URL=http://127.0.0.1:{port}/api\n"
        f"  Ctrl-C stops the server and the worker.",
        flush=True,
    )
    try:
        while all(p.poll() is None for p in processes):
            time.sleep(1)
        raise ReverieError(f"a Prefect process stopped; see {log}")
    except KeyboardInterrupt:
        return 0
    finally:
        stop(processes)
