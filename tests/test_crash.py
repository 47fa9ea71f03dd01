"""A command killed with SIGKILL at any point, run again, ends as an uninterrupted run
does, and leaves no process behind.

The killed command is the real CLI in its own process, without a Prefect API (so
Prefect starts its temporary server). A small hook holds it at one point: right after
a step returns (its writes committed), or inside a step's first write transaction
(changes flushed, not committed). There it is killed, alone, as a crashed machine
would kill it; its temporary server must then go too.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from reverie.flows.catalog import FLOWS
from reverie.flows.decay import decay
from reverie.models.export import export_jsonl
from reverie.models.store import Store

from conftest import TEST_POSTGRES, clone_sample, prefect_home
from factories import at_cosine, ingest_records

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

AS_OF = datetime(2025, 7, 1)
# The CLI arguments of each flow, and the extra parameters the same run takes here.
COMMANDS: dict[str, tuple[list[str], dict[str, object]]] = {
    "full": (["consolidate", "full"], {}),
    "compress": (["run", "compress"], {}),
    "cluster": (["run", "cluster"], {}),
    "cold-notes": (["run", "cold-notes", "--min-age-days", "0"],
             {"scope": "all", "session_id": None, "min_age_days": 0.0}),
}
FULL_STEPS = ("dedup", "compress_fading", "dedup_new_summaries", "decay_edges", "promote",
              "compile_blocks", "link_summaries", "graph_importance")
# (flow, "after" a step returned | "write" inside the step's first transaction, step)
AFTER = [("full", "after", s) for s in FULL_STEPS] + [
    ("cold-notes", "after", "consolidate_cold"), ("cold-notes", "after", "forget"),
]
INSIDE = [
    ("full", "write", "dedup"), ("full", "write", "compress_fading"),
    ("full", "write", "link_summaries"), ("full", "write", "graph_importance"),
    ("compress", "write", "compress_fading"), ("cluster", "write", "cluster"),
    ("cold-notes", "write", "consolidate_cold"),
]
# Killing inside a transaction is what the back-ends differ in; the points after a
# committed step are the same on both, so PostgreSQL runs only the former (CI time).
POINTS = INSIDE if TEST_POSTGRES else AFTER + INSIDE

HELD_COMMAND = """
import os, sys, threading, time
from contextlib import contextmanager

import reverie.models.db
import reverie.tasks.step

kind, target = os.environ["HOLD"].split(":", 1)
current = threading.local()


def hold():
    open(os.environ["MARK"], "w").write(os.environ["HOLD"])
    time.sleep(600)


run_step = reverie.tasks.step.run_step


def held_run_step(name, fn, args):
    current.step = name
    report = run_step(name, fn, args)
    if kind == "after" and name == target:
        hold()
    return report


writing = reverie.models.db.writing


@contextmanager
def held_writing(*args, **kwargs):
    with writing(*args, **kwargs) as session:
        yield session
        if kind == "write" and getattr(current, "step", None) == target:
            session.flush()
            hold()


reverie.tasks.step.run_step = held_run_step
reverie.models.db.writing = held_writing
from reverie.deployments.cli import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def clean_exports() -> dict[str, dict[str, str]]:
    """Exports after an uninterrupted run, per flow (filled by the first test of each)."""
    return {}


def _run_clean(flow: str, store: Store) -> dict[str, str]:
    decay(profile=None, as_of=AS_OF)
    FLOWS[flow](profile=None, as_of=AS_OF, **COMMANDS[flow][1])
    return {p: export_jsonl(store.url, p) for p in store.profiles()}


def _cluster_ready(store: Store) -> None:
    """A profile with one cluster of six fresh, similar memories: the sample store has
    none, and the cluster flow must have something to write."""
    fresh = {"kind": "semantic", "importance": 0.8, "confidence": 0.9,
             "last_accessed_at": (AS_OF - timedelta(hours=1)).isoformat()}
    rows = [{"id": f"topic-{k}", "content": f"topic A fact number {k}",
             "created_at": (AS_OF - timedelta(days=k)).isoformat(),
             "embedding": at_cosine(0.9, other=10 + k).tolist(), **fresh} for k in range(6)]
    assert not ingest_records(store, rows, profile="clusters").errors


def _left_behind(pgid: int) -> list[str]:
    """Command lines of the processes still in the killed command's session."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) == pgid:
                out.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
        except (ProcessLookupError, OSError):
            continue
    return out


def _command_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a command run as a user runs it: no Prefect API, so Prefect
    starts its temporary server on the database in its own PREFECT_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update({"PREFECT_HOME": str(prefect_home(tmp_path / "prefect")),
                "PREFECT_LOGGING_LEVEL": "ERROR",
                # The temporary server's start, on a loaded machine: the harness's allowance.
                "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120"})
    return env


def _kill_at(flow: str, kind: str, step: str, env: dict[str, str], tmp_path: Path) -> None:
    """Run ``flow``'s command on every profile, hold it at ``kind``:``step`` and kill it
    there with SIGKILL, alone; it must leave no process behind."""
    mark = tmp_path / "held"
    args = [*COMMANDS[flow][0], "--all", "--as-of", AS_OF.isoformat()]
    errors = tmp_path / "stderr.txt"
    # Its own session, so that whatever it leaves behind can be found (and cleaned up).
    with errors.open("wb") as stderr:
        process = subprocess.Popen([sys.executable, "-c", HELD_COMMAND, *args],
                                   env={**env, "MARK": str(mark), "HOLD": f"{kind}:{step}"},
                                   cwd=Path(__file__).resolve().parent.parent,
                                   start_new_session=True, stderr=stderr)
    try:
        deadline = time.monotonic() + 180
        while not mark.exists():
            assert process.poll() is None, (
                f"the command ended before {kind}:{step} (exit {process.returncode}); its "
                f"stderr ends:\n{errors.read_text(errors='replace')[-3000:]}")
            assert time.monotonic() < deadline, f"the command never reached {kind}:{step}"
            time.sleep(0.2)
        process.send_signal(signal.SIGKILL)  # the command alone, not its children
        process.wait()
        gone_by = time.monotonic() + 20
        while _group_alive(process.pid) and time.monotonic() < gone_by:
            time.sleep(0.2)
        left = _left_behind(process.pid)
    finally:
        if _group_alive(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
    assert not left, f"the killed command left processes behind: {left}"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(("flow", "kind", "step"), POINTS, ids=lambda v: str(v))
def test_a_command_killed_at_any_point_run_again_ends_like_an_uninterrupted_one(
    flow: str, kind: str, step: str, sample_template: Path,
    new_store: Callable[[str], Store], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    clean_exports: dict[str, dict[str, str]],
) -> None:
    monkeypatch.setenv("REVERIE_LEASE_SECONDS", "3")
    if flow not in clean_exports:
        clean = clone_sample(sample_template, new_store("clean"))
        _cluster_ready(clean)
        monkeypatch.setenv("REVERIE_DATABASE_URL", clean.url)
        clean_exports[flow] = _run_clean(flow, clean)
    expected = clean_exports[flow]

    killed = clone_sample(sample_template, new_store("killed"))
    _cluster_ready(killed)
    monkeypatch.setenv("REVERIE_DATABASE_URL", killed.url)
    decay(profile=None, as_of=AS_OF)
    _kill_at(flow, kind, step, _command_env(tmp_path), tmp_path)

    FLOWS[flow](profile=None, as_of=AS_OF, **COMMANDS[flow][1])  # waits out the dead lease
    assert {p: export_jsonl(killed.url, p) for p in killed.profiles()} == expected


STATES = """
from prefect.client.orchestration import get_client

with get_client(sync_client=True) as client:
    for run in client.read_flow_runs():
        print(run.id, run.state.type.value, run.state.message, sep="|")
"""


def test_the_same_command_again_says_what_it_waits_for_and_ends_the_killed_run(
    sample_template: Path, new_store: Callable[[str], Store], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a platform engineer: after ``kill -9`` of a command, the same command
    waited silently for the dead run's lease, and the killed run stayed Running."""
    if TEST_POSTGRES:
        pytest.skip("leases and Prefect states, the same on both back-ends (CI time)")
    from sqlalchemy import update

    from reverie.models.tables import Lease

    killed = clone_sample(sample_template, new_store("killed"))
    monkeypatch.setenv("REVERIE_DATABASE_URL", killed.url)
    # A lease longer than any start of the next command, however loaded the machine:
    # it must find the profiles still held. The test then ends the wait itself.
    env = {**_command_env(tmp_path), "REVERIE_LEASE_SECONDS": "900"}
    _kill_at("full", "after", "dedup", env, tmp_path)
    errors = tmp_path / "again.txt"
    with errors.open("w") as stderr:
        again = subprocess.Popen(
            [sys.executable, "-m", "reverie.deployments.cli", "consolidate", "full", "--all",
             "--as-of", AS_OF.isoformat()], env=env, stderr=stderr, text=True,
            cwd=Path(__file__).resolve().parent.parent)
    try:
        deadline = time.monotonic() + 300
        while "busy, held by" not in errors.read_text():
            assert again.poll() is None, errors.read_text()[-3000:]
            assert time.monotonic() < deadline, "the command never said it waits"
            time.sleep(0.5)
        # Said without -v, as it began to wait: who holds what, and how long it may take.
        assert re.search(r"profile \S+ (and \d+ more )?busy, held by flow run .*: waiting "
                         r"for it, at most 1800 s \(a run killed holding a profile frees it "
                         r"within 900 s, REVERIE_LEASE_SECONDS\)", errors.read_text())
        # The dead run's leases run out now rather than in 15 minutes.
        with killed.writing_all() as s:
            s.execute(update(Lease).values(expires_at=datetime(2000, 1, 1)))
        assert again.wait(timeout=600) == 0, errors.read_text()[-3000:]
    finally:
        again.kill()
    states = subprocess.run([sys.executable, "-c", STATES], env=env, capture_output=True,
                            text=True, timeout=300, check=True).stdout.splitlines()
    runs = [line.split("|", 2) for line in states]
    assert sorted(state for _, state, _ in runs) == ["COMPLETED", "CRASHED"], states
    (message,) = [m for _, state, m in runs if state == "CRASHED"]
    assert "stopped renewing its hold on profile(s)" in message
