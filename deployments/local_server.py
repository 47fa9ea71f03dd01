"""One local Prefect server shared by local commands, stopped once nobody uses it.

Without ``PREFECT_API_URL`` Prefect starts a temporary server for every command and stops
it at exit: 5–10 s of start-up for a command whose work often takes under a second. The
first local command starts this server instead, in its own session; later commands find
it through a state file and use it at once. It stops itself after
``REVERIE_LOCAL_SERVER_IDLE_SECONDS`` without a command using it (a command renews that
while it runs), or with ``reverie server stop``.

It keeps Prefect's own database (``PREFECT_HOME``), the one the temporary servers wrote,
so earlier runs stay in the history, and it serves the UI, so a local user can watch
their runs. Everything that identifies it lives in ``PREFECT_HOME``: two homes, two
servers, never a server recording into the wrong database.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from reverie.models.errors import ReverieError

if TYPE_CHECKING:
    import uvicorn

STATE_FILE = "reverie-local-server.json"
LOG_FILE = "reverie-local-server.log"
START_SECONDS = 90.0  # a loaded machine took over 30 s to bring Prefect's server up
STOP_SECONDS = 20.0
HEALTH_SECONDS = 2.0


@dataclass(frozen=True)
class LocalServer:
    pid: int
    port: int
    idle_seconds: float

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"


def prefect_home() -> Path:
    from prefect.settings import get_current_settings

    return Path(get_current_settings().home).expanduser()


# The servers whose lease this process renews (one thread each).
_leased: set[int] = set()


def use_local_api() -> str | None:
    """Point this process at a Prefect API before a local flow runs: the shared local
    server (started if none answers, also when this process used one that stopped) or,
    with ``REVERIE_LOCAL_SERVER=temporary``, Prefect's per-command one. Returns the
    shared server's UI address, or None."""
    from reverie.models.settings import get_settings
    from reverie.runner.event_delivery import api_configured, pointed_by_us
    from reverie.runner.temporary_server import keep_with_this_process

    # A long-lived process (``reverie api``, ``reverie mcp``) pointed at the shared server
    # before comes through again: the server may have stopped since (``reverie server
    # stop``, idle, killed), and is then started again.
    if api_configured() and not pointed_by_us():
        return None
    settings = get_settings()
    if settings.local_server == "temporary":
        keep_with_this_process()
        return None
    home = prefect_home()
    with _locked(home):
        server = running(home)
        if server is None:
            server = _start(home, settings.local_server_idle_seconds,
                            settings.local_server_port)
            print(f"reverie: started a local Prefect server at {server.url} (runs and UI); "
                  f"it stops after {_duration(server.idle_seconds)} unused, or with "
                  "`reverie server stop`", file=sys.stderr)
        _touch(home)
    if server.pid not in _leased:
        _leased.add(server.pid)
        _keep_touching(home, server)
    _point_prefect_at(server.api_url)
    return server.url


@contextmanager
def local_api() -> Iterator[str | None]:
    """``use_local_api`` for the flow runs inside the ``with``, without Prefect's flow-run
    heartbeats when the API is a local server (shared or temporary); a configured
    ``PREFECT_API_URL`` keeps them (see ``runner.runtime.without_heartbeats``)."""
    from reverie.runner.event_delivery import api_configured, pointed_by_us
    from reverie.runner.runtime import without_heartbeats

    configured = api_configured() and not pointed_by_us()
    url = use_local_api()
    if configured:
        yield url
        return
    with without_heartbeats():
        yield url


def running(home: Path) -> LocalServer | None:
    """The local server of ``home`` if it is alive and answers."""
    server = read_state(home)
    if server is None or not _alive(server.pid):
        return None
    return server if _healthy(server.api_url) else None


def stop(home: Path) -> LocalServer | None:
    """Stop the local server of ``home``; the one stopped, or None if none ran."""
    with _locked(home):
        server = read_state(home)
        if server is None:
            return None
        _end(server.pid)
        (home / STATE_FILE).unlink(missing_ok=True)
    return server


def _start(home: Path, idle_seconds: float, port: int | None = None) -> LocalServer:
    home.mkdir(parents=True, exist_ok=True)
    stale = read_state(home)
    if stale is not None and _alive(stale.pid):
        _end(stale.pid)  # alive but not answering: it would never serve a command again
    (home / STATE_FILE).unlink(missing_ok=True)
    if port is None:
        port = _free_port()
    elif not _port_free(port):
        raise ReverieError(
            f"REVERIE_LOCAL_SERVER_PORT={port}: that port on 127.0.0.1 is in use; choose "
            "another, or unset it to let the kernel pick one")
    log = open(home / LOG_FILE, "ab")  # noqa: SIM115 (the child keeps it)
    process = subprocess.Popen(
        [sys.executable, "-m", "reverie.deployments.local_server", "--port", str(port),
         "--idle-seconds", str(idle_seconds), "--home", str(home)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True,
        # Its own session: ^C in the terminal that started it, or that terminal closing,
        # must not stop a server other commands use.
        start_new_session=True,
        env={**os.environ, "PREFECT_HOME": str(home)},
    )
    log.close()
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ReverieError(
                f"the local Prefect server exited with code {process.returncode} while "
                f"starting; see {home / LOG_FILE}")
        server = read_state(home)
        if server is not None and server.pid == process.pid and _healthy(server.api_url):
            return server
        time.sleep(0.1)
    _end(process.pid)
    raise ReverieError(f"the local Prefect server did not answer within {START_SECONDS:.0f} s; "
                       f"see {home / LOG_FILE}")


def _point_prefect_at(api_url: str) -> None:
    # Through the environment, so that child processes (Dask workers) use it too, and
    # a refreshed global context, so that every thread of this process does (Prefect's
    # events worker runs in its own, outside any settings context a `with` would open).
    from reverie.runner.event_delivery import pointed_at

    # Ours before it is set: a server's request threads, running meanwhile, must never
    # take it for an operator's API (with deployments, wanting events).
    pointed_at(api_url)
    os.environ["PREFECT_API_URL"] = api_url
    # The local server speaks plain HTTP on loopback, so there is no certificate to check;
    # without this each of Prefect's clients (four in a command) still loads the whole CA
    # bundle for one, about 20 ms of CPU each.
    os.environ["PREFECT_API_TLS_INSECURE_SKIP_VERIFY"] = "true"
    if "prefect.context" in sys.modules:  # else Prefect reads it when first imported
        from prefect.context import refresh_global_settings_context

        refresh_global_settings_context()


def _keep_touching(home: Path, server: LocalServer) -> None:
    """Renew the server's lease while this process lives (a flow can run for longer than
    the idle time), from a daemon thread that dies with the process."""
    every = max(1.0, min(60.0, server.idle_seconds / 4))

    def renew() -> None:
        while True:
            time.sleep(every)
            _touch(home)

    threading.Thread(target=renew, name="reverie-local-server-lease", daemon=True).start()


def _touch(home: Path) -> None:
    try:
        os.utime(home / STATE_FILE)
    except FileNotFoundError:  # stopped meanwhile; the next command starts another
        pass


@contextmanager
def _locked(home: Path) -> Iterator[None]:
    """One command at a time decides whether to start the server, so two commands
    started together share one server rather than start two."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "reverie-local-server.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_state(home: Path) -> LocalServer | None:
    try:
        return LocalServer(**json.loads((home / STATE_FILE).read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def _write_state(home: Path, server: LocalServer) -> None:
    partial = home / f"{STATE_FILE}.{os.getpid()}"
    partial.write_text(json.dumps(asdict(server)))
    partial.replace(home / STATE_FILE)  # readers see the whole file or none


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _healthy(api_url: str) -> bool:
    import httpx

    try:
        # verify=False: plain HTTP on loopback; a verifying client would load the CA bundle.
        return httpx.get(f"{api_url}/health", timeout=HEALTH_SECONDS,
                         verify=False).status_code == 200
    except httpx.HTTPError:
        return False


def _end(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_SECONDS
    while time.monotonic() < deadline:
        if not _alive(pid) or _reaped(pid):
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reaped(pid: int) -> bool:
    """Whether ``pid`` is a child of this process that has exited (a zombie still
    answers signals until it is reaped)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return False


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


# --- the server process -------------------------------------------------------------


def _serve(home: Path, port: int, idle_seconds: float) -> None:
    # Read by Prefect when it is first imported: the UI must call this server's API.
    os.environ.update({
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    })
    import uvicorn
    from prefect.server.api.server import create_app

    server = uvicorn.Server(uvicorn.Config(
        create_app(), host="127.0.0.1", port=port, log_level="error", lifespan="on"))
    me = LocalServer(os.getpid(), port, idle_seconds)
    threading.Thread(target=_stop_when_unused, args=(server, home, me), daemon=True).start()
    server.run()
    if (current := read_state(home)) is not None and current.pid == me.pid:
        (home / STATE_FILE).unlink(missing_ok=True)


def _stop_when_unused(server: uvicorn.Server, home: Path, me: LocalServer) -> None:
    while not getattr(server, "started", False):
        if getattr(server, "should_exit", False):
            return
        time.sleep(0.05)
    _write_state(home, me)  # only now: a command that finds the file may use the server
    check = max(0.5, min(10.0, me.idle_seconds / 10))
    while True:
        time.sleep(check)
        try:
            state = home / STATE_FILE
            replaced = read_state(home) != me
            unused = time.time() - state.stat().st_mtime > me.idle_seconds
        except FileNotFoundError:
            replaced = True
        if replaced or unused:
            server.should_exit = True
            return


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Reverie's shared local Prefect server.")
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--idle-seconds", type=float, required=True)
    args = parser.parse_args(argv)
    _serve(args.home, args.port, args.idle_seconds)


if __name__ == "__main__":
    main()
