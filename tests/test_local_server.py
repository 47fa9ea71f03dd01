"""Local commands share one Prefect server: the first starts it, later ones use it at
once, it records every run where the UI finds it, and it stops when unused or told to.

Each test drives the real ``reverie`` command in a subprocess, with its own
``PREFECT_HOME`` (so its own server and Prefect database), and stops what it started.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from reverie.deployments import local_server
from reverie.deployments.local_server import LocalServer, local_api, read_state, stop
from reverie.models.store import Store

from conftest import clone_sample, prefect_home

pytestmark = pytest.mark.store_independent(
    "the shared local Prefect server's life cycle")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def local(sample_template: Path, new_store: Callable[[str], Store], tmp_path: Path
          ) -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    """Run ``reverie`` as a user without PREFECT_API_URL would, in shared mode."""
    store = clone_sample(sample_template, new_store("local"))
    home = prefect_home(tmp_path / "prefect")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("PREFECT_API", "PREFECT_LOGGING"))}
    base.update({"PREFECT_HOME": str(home), "REVERIE_DATABASE_URL": store.url,
                 "REVERIE_LOCAL_SERVER": "shared"})

    def reverie(*argv: str, idle: float = 600, background: bool = False,
                env: dict[str, str] | None = None) -> object:
        command = [sys.executable, "-m", "reverie.deployments.cli", *argv]
        run_env = {**base, "REVERIE_LOCAL_SERVER_IDLE_SECONDS": str(idle), **(env or {})}
        if background:
            return subprocess.Popen(command, env=run_env, cwd=ROOT, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return subprocess.run(command, env=run_env, cwd=ROOT, capture_output=True,
                              text=True, timeout=300)

    reverie.home = home  # type: ignore[attr-defined]
    yield reverie
    stop(home)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie would still answer; the server is not our child, PID 1 reaps it.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _flow_runs(server: LocalServer) -> dict[str, str]:
    """Flow run id -> state type, as the server (and so the UI) has them."""
    response = httpx.post(f"{server.api_url}/flow_runs/filter", json={}, timeout=10)
    response.raise_for_status()
    return {run["id"]: run["state_type"] for run in response.json()}


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")
        time.sleep(0.2)


@pytest.mark.slow
def test_commands_share_one_server_that_records_their_runs_and_stops_on_request(local) -> None:
    home = local.home
    first = local("consolidate", "lightweight", "--all", "--as-of", "2025-07-01", "--json")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "started a local Prefect server" in first.stderr
    # Prefect's console logs only with -v: the report is all a user sees.
    assert "| INFO" not in first.stderr and "Traceback" not in first.stderr, first.stderr
    server = read_state(home)
    assert server is not None and _alive(server.pid)

    second = local("-v", "run", "decay", "--all", "--as-of", "2025-07-02", "--json")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "started a local Prefect server" not in second.stderr
    assert "Finished in state Completed" in second.stderr  # -v shows Prefect's logs
    assert read_state(home) == server  # the same server, not a second one

    runs = {json.loads(done.stdout)["run_id"] for done in (first, second)}
    _wait(lambda: runs <= set(_flow_runs(server)), 60, "both runs on the server")
    assert {_flow_runs(server)[r] for r in runs} == {"COMPLETED"}
    # What the UI shows of a run: its parameters as Prefect encodes them (a command sends
    # plain ones without FastAPI: tests/test_local_command.py), and its artifacts.
    first_id = json.loads(first.stdout)["run_id"]
    shown = httpx.get(f"{server.api_url}/flow_runs/{first_id}", timeout=10).json()
    assert shown["parameters"] == {"profile": None, "as_of": "2025-07-01T00:00:00",
                                   "dry_run": False, "config": None, "store_id": None}
    artifacts = httpx.post(f"{server.api_url}/artifacts/filter", timeout=10, json={
        "artifacts": {"flow_run_id": {"any_": [first_id]}}}).json()
    flow = json.loads(first.stdout)["flow"]
    assert {a["key"] for a in artifacts} >= {flow, f"{flow}-changes", f"{flow}-progress"}
    status = local("status", "--json")
    assert {r["run_id"] for r in json.loads(status.stdout)["history"]} >= runs

    said = local("server", "status")
    assert server.url in said.stdout
    stopped = local("server", "stop")
    assert server.url in stopped.stdout
    _wait(lambda: not _alive(server.pid), 30, "the stopped server to exit")
    assert read_state(home) is None
    assert "no local Prefect server runs" in local("server", "stop").stdout


@pytest.mark.slow
def test_a_killed_server_is_replaced_and_its_runs_kept(local) -> None:
    home = local.home
    first = local("run", "decay", "--all", "--as-of", "2025-07-01", "--json")
    assert first.returncode == 0, first.stderr[-3000:]
    killed = read_state(home)
    assert killed is not None
    run = json.loads(first.stdout)["run_id"]
    _wait(lambda: run in _flow_runs(killed), 60, "the first run on the server")
    os.kill(killed.pid, signal.SIGKILL)
    _wait(lambda: not _alive(killed.pid), 30, "the killed server to go")

    second = local("run", "decay", "--all", "--as-of", "2025-07-02", "--json")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "started a local Prefect server" in second.stderr
    replacement = read_state(home)
    assert replacement is not None and replacement.pid != killed.pid
    # The same Prefect database: the run recorded before the kill is still there.
    assert run in _flow_runs(replacement)


@pytest.mark.slow
def test_commands_started_together_start_one_server_which_stops_when_unused(local) -> None:
    home = local.home
    commands = [local("run", "decay", "--profile", profile, "--as-of", "2025-07-01",
                      idle=10, background=True) for profile in ("maya", "raj")]
    outputs = [command.communicate(timeout=300) for command in commands]
    assert [c.returncode for c in commands] == [0, 0], [err[-2000:] for _, err in outputs]
    assert sum("started a local Prefect server" in err for _, err in outputs) == 1
    server = read_state(home)
    assert server is not None and server.idle_seconds == 10
    # Nobody uses it any more: it stops itself and takes its state file with it.
    _wait(lambda: not _alive(server.pid), 60, "the unused server to stop")
    assert read_state(home) is None


def _heartbeat_inside_local_api(monkeypatch: pytest.MonkeyPatch, configured: bool) -> object:
    from prefect.settings import get_current_settings

    monkeypatch.setattr(local_server, "use_local_api", lambda: "http://127.0.0.1:1")
    monkeypatch.setattr("reverie.runner.event_delivery.api_configured", lambda: configured)
    with local_api() as url:
        assert url == "http://127.0.0.1:1"
        return get_current_settings().flows.heartbeat_frequency


def test_flow_runs_on_a_local_server_send_no_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.settings import get_current_settings

    default = get_current_settings().flows.heartbeat_frequency
    assert default is not None  # Prefect's default sends them
    assert _heartbeat_inside_local_api(monkeypatch, configured=False) is None
    assert get_current_settings().flows.heartbeat_frequency == default  # only inside


def test_flow_runs_on_a_configured_api_keep_their_heartbeats(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.settings import get_current_settings

    default = get_current_settings().flows.heartbeat_frequency
    assert _heartbeat_inside_local_api(monkeypatch, configured=True) == default


@pytest.mark.slow
def test_the_shared_servers_port_can_be_chosen_and_a_taken_one_is_refused(local) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        refused = local("run", "decay", "--all", "--as-of", "2025-07-01",
                        env={"REVERIE_LOCAL_SERVER_PORT": str(busy)})
    assert refused.returncode != 0
    assert f"REVERIE_LOCAL_SERVER_PORT={busy}: that port on 127.0.0.1 is in use" in refused.stderr
    assert read_state(local.home) is None

    chosen = local_server._free_port()
    done = local("run", "decay", "--all", "--as-of", "2025-07-01",
                 env={"REVERIE_LOCAL_SERVER_PORT": str(chosen)})
    assert done.returncode == 0, done.stderr[-3000:]
    server = read_state(local.home)
    assert server is not None and server.port == chosen
    assert f"http://127.0.0.1:{chosen}" in done.stderr
