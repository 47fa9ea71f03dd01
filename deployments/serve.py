"""``reverie serve``: the whole Prefect stack on this machine, for trying Reverie out.

Starts a Prefect server on 127.0.0.1, creates the ``reverie`` process work pool unless it
exists (an existing pool keeps what the operator set: paused or not, its concurrency
limit), deploys every flow from ``prefect.yaml`` (schedules and event triggers included)
and starts a worker, then waits. Ctrl-C, SIGTERM or a hangup stops everything it
started, the flow runs the worker spawned and their children included: each is asked
to end (SIGTERM) and killed if it has not within ``STOP_SECONDS`` in all. While it
waits, a server or worker that dies is started again, and the processes it left (a
dead worker's flow runs) are ended; the automations of ``crash_detection`` then mark
their runs Crashed. A killed ``serve`` takes its server and worker with it.
Prefect keeps its own database under ``--home`` (default ``.reverie/prefect``), apart
from the memory store: SQLite, or PostgreSQL when ``PREFECT_API_DATABASE_CONNECTION_URL``
names one (from the environment: the URL holds a password), which a platform should use
once runs overlap (SQLite locks up under a few concurrent runs: "database is locked",
then 503s).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import psutil

from reverie.models.errors import ConfigError, ReverieError
from reverie.models.settings import (
    DATABASE_URL_VARIABLE,
    environment,
    get_settings,
    resolve_database_url,
)
from reverie.models.store import Store

WORK_POOL = "reverie"
# What prefect.yaml's triggers match: the id of the store the deployments serve.
STORE_ID_VARIABLE = "REVERIE_STORE_ID"
PREFECT_DATABASE_VARIABLE = "PREFECT_API_DATABASE_CONNECTION_URL"
LEASE_STORAGE_VARIABLE = "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE"
CAUSAL_ORDERING_VARIABLE = "PREFECT_SERVER_EVENTS_CAUSAL_ORDERING"
READY = "Reverie is up"
# From the first SIGTERM to the last SIGKILL. Flow runs have ignored SIGTERM (30 of
# them, 4.1 GB, outlived a stopped `reverie serve`), so whatever is left is killed.
STOP_SECONDS = 20.0
# How often serve sends events the store kept while the API was away.
EVENT_FLUSH_SECONDS = 15.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
HEARTBEAT_VARIABLE = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"
LEGACY_HEARTBEAT_VARIABLE = "PREFECT_RUNNER_HEARTBEAT_FREQUENCY"
# A process of the stack that keeps dying is not restarted for ever: after this many
# restarts within RESTART_WINDOW_SECONDS, serve stops and says so.
RESTART_LIMIT = 5
RESTART_WINDOW_SECONDS = 600.0
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


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


class PrefectDatabase(StrEnum):
    """Where Prefect's server keeps its own database."""

    SQLITE = "SQLite"
    POSTGRESQL = "PostgreSQL"


def prefect_database_kind(url: str | None) -> PrefectDatabase:
    """Prefect's database for a connection URL (None: its default, SQLite in its home)."""
    if url and prefect_database_url(url).startswith("postgresql"):
        return PrefectDatabase.POSTGRESQL
    return PrefectDatabase.SQLITE


def prefect_database_advice(database: PrefectDatabase, profiles: int, limit: int) -> str | None:
    """The warning `reverie serve` gives at start when Prefect's database is SQLite and
    the store has more profiles than ``limit`` (REVERIE_PREFECT_SQLITE_PROFILES, 0: never):
    runs for that many profiles at once are more than SQLite holds."""
    if database is PrefectDatabase.POSTGRESQL or limit == 0 or profiles <= limit:
        return None
    return (f"warning: Prefect's database is on SQLite and the store has {profiles} profiles "
            f"(more than REVERIE_PREFECT_SQLITE_PROFILES={limit}). Runs for that many "
            "profiles at once (automations, a backfill beside them) overload SQLite: "
            "\"database is locked\", lost heartbeats, failed runs. Set "
            f"{PREFECT_DATABASE_VARIABLE} to a PostgreSQL database of its own "
            "(docs/platform.md: Prefect's own database).")


def stack_environment(port: int, home: Path, prefect_database: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    database = prefect_database or env.get(PREFECT_DATABASE_VARIABLE)
    if database:
        env[PREFECT_DATABASE_VARIABLE] = prefect_database_url(database)
    # Prefect keeps concurrency-slot leases in server memory by default: a restarted
    # server forgets them while the limit still counts their slots as taken, forever.
    # On disk (under PREFECT_HOME) they survive, and the server frees expired ones.
    env.setdefault(LEASE_STORAGE_VARIABLE, "prefect.server.concurrency.lease_storage.filesystem")
    # A restarted server would hold the state events of runs begun before the restart
    # for 15 minutes (deployments/causal_ordering.py): their crash alerts with them.
    env.setdefault(CAUSAL_ORDERING_VARIABLE, "reverie.deployments.causal_ordering")
    # Deployed runs heartbeat at Reverie's pace: the crash-detection automations
    # (deployments/crash_detection.py) expect one within REVERIE_UNRESPONSIVE_SECONDS.
    env[HEARTBEAT_VARIABLE] = str(get_settings().heartbeat_seconds)
    env.pop(LEGACY_HEARTBEAT_VARIABLE, None)
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


def wait_healthy(port: int, timeout: float = 90.0,
                 server: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    """Wait for the Prefect server on ``port`` to answer; fail at once if ``server``, its
    process, exits meanwhile (a port taken, a database it cannot open), naming ``log``."""
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{port}/api/health"
    while time.monotonic() < deadline:
        if server is not None and server.poll() is not None:
            where = f"; its log: {log}" if log is not None else ""
            raise ReverieError(
                f"the Prefect server exited with code {server.returncode} before it "
                f"answered on {url}{where}")
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
    # A session of its own: a terminal's Ctrl-C reaches only us, and we stop the
    # worker (whose flow runs report to the server) before the server.
    server = subprocess.Popen(
        _prefect("server", "start", "--host", "127.0.0.1", "--port", str(port)),
        env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=_ending_with_us(),
    )
    try:
        wait_healthy(port, server=server, log=log)
    except BaseException:
        stop([server])
        raise
    return server


def work_pool_exists(port: int) -> bool:
    url = f"http://127.0.0.1:{port}/api/work_pools/{WORK_POOL}"
    try:
        with urllib.request.urlopen(url, timeout=30):
            return True
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise ReverieError(f"reading work pool {WORK_POOL!r}: HTTP {exc.code} from {url}") from exc
    except OSError as exc:
        raise ReverieError(f"reading work pool {WORK_POOL!r} from {url}: {exc}") from exc


def start_stack(
    port: int, home: Path, log: Path, prefect_file: Path | None = None,
    prefect_database: str | None = None,
) -> list[subprocess.Popen[bytes]]:
    """Server, work pool (unless it exists), deployments (from ``prefect_file``, default
    the project's ``prefect.yaml``) and worker; returns the processes started."""
    root = project_root()
    env = stack_environment(port, home, prefect_database)
    # prefect.yaml's pull step reads $PWD: the checkout the worker runs flows from.
    env["PWD"] = str(root)
    # prefect.yaml's triggers match the events of this store only: its id, read before
    # anything starts (a store that is not there is an error naming its URL).
    env[STORE_ID_VARIABLE] = Store(env[DATABASE_URL_VARIABLE]).id
    out = log.open("ab")
    processes = [start_server(port, home, log, prefect_database)]
    try:
        # Never --overwrite: it would un-pause a pool the operator paused and reset its
        # concurrency limit.
        if not work_pool_exists(port):
            subprocess.run(
                _prefect("work-pool", "create", WORK_POOL, "--type", "process"),
                env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT, check=True,
            )
        deploy = ["--prefect-file", str(prefect_file)] if prefect_file else []
        subprocess.run(
            _prefect("--no-prompt", "deploy", "--all", *deploy),
            env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT, check=True,
        )
        processes.append(start_worker(port, home, log, prefect_database))
    except BaseException:
        stop(processes)
        raise
    return processes


def start_worker(
    port: int, home: Path, log: Path, prefect_database: str | None = None
) -> subprocess.Popen[bytes]:
    """The process worker of the ``reverie`` pool, running flows from the checkout."""
    root = project_root()
    env = stack_environment(port, home, prefect_database)
    env["PWD"] = str(root)
    env[STORE_ID_VARIABLE] = Store(env[DATABASE_URL_VARIABLE]).id
    return subprocess.Popen(
        _prefect("worker", "start", "--pool", WORK_POOL),
        env=env, cwd=root, stdout=log.open("ab"), stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=_ending_with_us(),
    )


def _ending_with_us() -> Callable[[], None] | None:
    """For Popen: the child gets SIGTERM when this process dies, even by SIGKILL, so a
    killed `reverie serve` leaves no server holding its port nor worker taking runs.
    Linux only; the request is tied to the forking thread: call from the main thread."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded before fork, not in the child
    parent = os.getpid()

    def ask() -> None:  # in the child, between fork and exec
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # we died before the request took effect
            os._exit(1)

    return ask


def become_subreaper() -> bool:
    """Processes orphaned below this one (a dead worker's flow runs) become its
    children instead of init's, so that serve can find and end them. Linux only."""
    if not sys.platform.startswith("linux"):
        return False
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def end_orphans(keep: Sequence[subprocess.Popen[bytes]], grace: float = STOP_SECONDS) -> int:
    """End every child of this process but ``keep`` (and what those spawned): as a
    subreaper, serve inherits what a dead process of the stack left, its flow runs
    included. Returns how many were found."""
    kept = {p.pid for p in keep if p.returncode is None}
    try:
        orphans = [c for c in psutil.Process().children() if c.pid not in kept]
    except psutil.Error:
        return 0
    if orphans:
        _end_processes(_with_descendants(orphans), grace)
        for orphan in orphans:  # our children now: reap them, or they stay zombies
            with suppress(psutil.Error):
                orphan.wait(timeout=5)
    return len(orphans)


@dataclass
class Supervised:
    """One process of the stack, how to start it again, and when it was restarted."""

    role: str
    start: Callable[[], subprocess.Popen[bytes]]
    restarts: list[float] = field(default_factory=list)

    def restart(self) -> subprocess.Popen[bytes]:
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < RESTART_WINDOW_SECONDS] + [now]
        if len(self.restarts) > RESTART_LIMIT:
            raise ReverieError(
                f"the Prefect {self.role} stopped {len(self.restarts)} times within "
                f"{RESTART_WINDOW_SECONDS:.0f} s; not restarting it again")
        return self.start()


def watch(processes: list[subprocess.Popen[bytes]], supervised: Sequence[Supervised],
          report: Callable[[str], None]) -> None:
    """One look at the stack: a process that ended has what it left ended (its flow
    runs then end Crashed, deployments/crash_detection.py) and is started again."""
    for n, (process, who) in enumerate(zip(processes, supervised, strict=True)):
        code = process.poll()
        if code is None:
            continue
        left = end_orphans(processes)
        report(f"the Prefect {who.role} stopped (exit code {code}); ended {left} "
               f"process(es) it left (their runs end Crashed); restarting it")
        processes[n] = who.restart()
        report(f"the Prefect {who.role} is running again")
    # A flow run's own children may be orphaned after it (its worker alive).
    end_orphans(processes)


def stop(processes: Sequence[subprocess.Popen[bytes]], timeout: float = STOP_SECONDS) -> None:
    """End ``processes`` and every process they spawned, within about ``timeout`` seconds.

    The last started goes first: the worker's flow runs can still report how they ended
    to the server. Each tree gets an equal share of ``timeout`` to end on SIGTERM; what
    is left then is killed."""
    share = timeout / max(len(processes), 1)
    for process in reversed(processes):
        _end_tree(process, share)


def _end_tree(root: subprocess.Popen[bytes], grace: float) -> None:
    if root.poll() is not None:
        return  # ended and reaped: its pid may be another process's by now
    # Taken before the root is signalled: once it dies, its children belong to init and
    # can no longer be found from it. Flow runs may sit in sessions of their own, so
    # signalling the root's process group would miss them.
    tree = _with_descendants([psutil.Process(root.pid)])  # unreaped, so still there
    _end_processes(tree, grace, reap=root.poll)
    try:
        root.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass  # SIGKILL cannot be refused: only an uninterruptible sleep holds it here


def _end_processes(tree: set[psutil.Process], grace: float,
                   reap: Callable[[], object] = lambda: None) -> None:
    """SIGTERM to ``tree`` and what it spawns meanwhile; SIGKILL to what is left after
    ``grace`` seconds."""
    _send(tree, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while True:
        reap()  # our own child would otherwise linger as a zombie
        # A process still alive may have started another since the last look.
        alive = [p for p in _with_descendants(p for p in tree if _alive(p)) if _alive(p)]
        _send([p for p in alive if p not in tree], signal.SIGTERM)
        tree.update(alive)
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    _send(alive, signal.SIGKILL)


def _with_descendants(processes: Iterable[psutil.Process]) -> set[psutil.Process]:
    tree = set()
    for process in processes:
        tree.add(process)
        try:
            tree.update(process.children(recursive=True))
        except psutil.Error:
            pass
    return tree


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _send(processes: Iterable[psutil.Process], signum: int) -> None:
    for process in processes:
        try:
            process.send_signal(signum)  # psutil checks the pid was not reused
        except psutil.Error:
            pass


def _interrupt(signum: int, frame: object) -> None:
    # Stopping is under way and bounded: a second Ctrl-C must not abandon it half-done.
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, signal.SIG_IGN)
    raise KeyboardInterrupt


def _stop_on_signals() -> None:
    # Installed explicitly: a shell starts a background job with SIGINT ignored. A
    # service manager stops us with SIGTERM; closing the terminal sends SIGHUP, which no
    # longer reaches the server and worker in their own sessions.
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, _interrupt)


class EventFlusher:
    """Sends the store's waiting events every ``EVENT_FLUSH_SECONDS``: an ingest made
    while the API was down queued them, and without this they would wait for the next
    ingest of any profile."""

    def __init__(self, store_url: str, api: str) -> None:
        self.store_url, self.api, self.due = store_url, api, 0.0

    def maybe_flush(self) -> None:
        if time.monotonic() < self.due:
            return
        self.due = time.monotonic() + EVENT_FLUSH_SECONDS
        from reverie.runner.event_delivery import flush

        try:
            flush(self.store_url, api=self.api)
        except Exception as exc:  # noqa: BLE001 - tried again next time
            print(f"could not flush the store's events ({type(exc).__name__}); "
                  "trying again shortly", file=sys.stderr, flush=True)


def failure_alerts(port: int) -> str:
    """Bring the failed-run automation in line with ``REVERIE_ALERT_BLOCK``; what to
    tell the operator about it. A wrong block name is reported, not fatal: the stack
    is still worth having."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from reverie.deployments.alerts import ensure_failure_alerts

    try:
        with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
            state = ensure_failure_alerts()
    except ReverieError as exc:
        return f"off: {exc}"
    if state.enabled:
        return f"failed and crashed runs are announced through the block {state.block}"
    return "off (REVERIE_ALERT_BLOCK names a Prefect notification block to turn them on)"


def crash_detection(port: int) -> str:
    """Create or update the automations that crash runs whose process is gone; what to
    tell the operator about them."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from reverie.deployments.crash_detection import ensure_crash_detection

    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
        found = ensure_crash_detection()
    return (f"a run whose process is gone is marked Crashed within about "
            f"{found.unresponsive_seconds} s of its last heartbeat (Pending: "
            f"{found.not_started_seconds} s)")


def serve(
    port: int = 4200, home: Path | None = None, prefect_database: str | None = None,
    prefect_file: Path | None = None,
) -> int:
    home = (home or Path(".reverie") / "prefect").resolve()
    log = home / "stack.log"
    home.mkdir(parents=True, exist_ok=True)
    where = prefect_database_kind(prefect_database or os.environ.get(PREFECT_DATABASE_VARIABLE))
    print(f"starting Prefect on http://127.0.0.1:{port}, its database on {where} "
          f"(log: {log}) ...", flush=True)
    _stop_on_signals()
    become_subreaper()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        # Interrupted while starting, start_stack stops what it had started.
        processes = start_stack(port, home, log, prefect_file, prefect_database)
        alerts = failure_alerts(port)
        crashes = crash_detection(port)
        settings = get_settings()
        advice = prefect_database_advice(
            where, len(Store(resolve_database_url(settings.database_url)).profiles()),
            settings.prefect_sqlite_profiles)
        if advice:
            print(advice, file=sys.stderr, flush=True)
        print(
            f"{READY}: http://127.0.0.1:{port}\n"
            f"  Alerts: {alerts}\n"
            f"  Crashes: {crashes}\n"
            f"  Deployments: every flow and its schedule; click one, then 'Run' to start it.\n"
            f"  Runs: each run, its task graph, logs, and the Artifacts tab (summary, changes).\n"
            f"  In another shell: export PREFECT_API_URL=http://127.0.0.1:{port}/api\n"
            f"  Ctrl-C stops the server, the worker and its flow runs.",
            flush=True,
        )
        events = EventFlusher(resolve_database_url(get_settings().database_url),
                              f"http://127.0.0.1:{port}/api")
        supervised = [
            Supervised("server", lambda: start_server(port, home, log, prefect_database)),
            Supervised("worker", lambda: start_worker(port, home, log, prefect_database)),
        ]

        def report(message: str) -> None:
            print(f"{message} (log: {log})", file=sys.stderr, flush=True)

        while True:
            events.maybe_flush()
            watch(processes, supervised, report)
            time.sleep(1)
    except KeyboardInterrupt:
        return 0
    finally:
        stop(processes)
        end_orphans(processes)


@contextmanager
def loopback_server(folder: Path) -> Iterator[Path]:
    """A real Prefect server on loopback for this process's flows, the bench's (its
    database: SQLite in ``folder``, or PREFECT_API_DATABASE_CONNECTION_URL); yields its
    log. Logs and events the flows queued are sent to it before it stops."""
    import socket

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from reverie.runner.temporary_server import bound_to_this_process

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = folder / "prefect-server.log"
    # At INFO the server logs every request with its status: server_health counts 5xx.
    with environment("PREFECT_SERVER_LOGGING_LEVEL", "INFO"):
        server = bound_to_this_process(
            lambda: start_server(port, folder / "prefect-home", log))
    api = f"http://127.0.0.1:{port}/api"
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogHandler

    try:
        with environment("PREFECT_API_URL", api), temporary_settings({PREFECT_API_URL: api}):
            try:
                yield log
            finally:
                # What the flows logged and emitted is still queued: send it to this server.
                APILogHandler().flush()
                EventsWorker.drain_all(timeout=30, at_exit=False)
    finally:
        stop([server])
