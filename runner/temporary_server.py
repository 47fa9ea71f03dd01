"""Prefect's temporary API server, made to end with the process that started it.

Without ``PREFECT_API_URL``, Prefect runs a flow against a temporary server: a uvicorn
child process it stops from an exit handler. A command killed with SIGKILL (or by the
out-of-memory killer) never runs its exit handlers, so the server lived on under PID 1,
about 230 MB each, one per killed command. On Linux a child can ask the kernel for a
signal when its parent dies (``PR_SET_PDEATHSIG``); Reverie starts the temporary server
itself, with that request, before any flow runs, and Prefect then reuses it.

The signal is tied to the thread that forked the child, not to the process, so the
server must be started from a thread that lives as long as the process: the main
thread of a command. Prefect would otherwise start it from whichever thread first needs
an API, its events worker included.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from reverie.models.errors import ServerStartError
from reverie.runner.event_delivery import api_configured

T = TypeVar("T")
_PR_SET_PDEATHSIG = 1
# SIGKILL: uvicorn's graceful shutdown on SIGTERM waits for open connections and
# Prefect's services, and took over 20 s on a loaded machine. Its database is SQLite
# in WAL mode, which a kill leaves consistent; the dead command's history is partial
# whatever the server does.
_SIGNAL_ON_PARENT_DEATH = signal.SIGKILL
_lock = threading.Lock()


def keep_with_this_process() -> None:
    """Start Prefect's temporary server now, from this thread, bound to this process.

    Does nothing when a Prefect API is configured (a real server outlives commands on
    purpose), off Linux, or when the server already runs."""
    if api_configured() or not sys.platform.startswith("linux"):
        return
    if threading.current_thread() is not threading.main_thread():
        # A server forked from a short-lived thread would die with that thread.
        return
    from prefect.server.api.server import SubprocessASGIServer

    with _lock:
        server = SubprocessASGIServer()
        if server.running:
            return
        try:
            _bind_children_to(os.getpid(), lambda: server.start())
        except (httpx.HTTPError, RuntimeError) as exc:
            # Prefect waits for the server's health check, and gives up with a
            # RuntimeError (no answer in PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)
            # or, on a loaded machine, with the check's own read timeout: a traceback
            # either way, where the command owes one line saying what to do.
            reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            raise ServerStartError(
                f"Prefect's temporary server did not answer in time ({reason}); "
                "nothing ran. Run the command again, raise "
                "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, or point PREFECT_API_URL "
                "at a running server (`reverie serve`)") from exc


def bound_to_this_process(start: Callable[[], T]) -> T:
    """``start()``, with every process it spawns killed when this process dies (so a
    killed benchmark leaves no server behind)."""
    if not sys.platform.startswith("linux"):
        return start()
    started: list[T] = []
    _bind_children_to(os.getpid(), lambda: started.append(start()))
    return started[0]


def _bind_children_to(parent: int, start: Callable[[], Any]) -> None:
    """Run ``start`` with every process it spawns asking to die with ``parent``."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded before fork, not in the child

    def die_with_parent() -> None:  # runs in the child, between fork and exec
        prctl(_PR_SET_PDEATHSIG, int(_SIGNAL_ON_PARENT_DEATH))
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    real = subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        kwargs.setdefault("preexec_fn", die_with_parent)
        return real(*args, **kwargs)

    # Prefect builds the server's command line itself; only its Popen call is wrapped,
    # and only while the server starts.
    subprocess.Popen = popen  # type: ignore[misc, assignment]  # a function for the class
    try:
        start()
    finally:
        subprocess.Popen = real  # type: ignore[misc]  # the class back
