"""A run killed with SIGKILL midway, run again, ends as an uninterrupted run does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from flows.decay import decay
from flows.full_consolidation import full_consolidation
from models.export import export_jsonl
from models.store import Store

from conftest import clone_sample

# Runs full consolidation, but holds it after merging (dedup committed, the rest not).
KILLED_RUN = """
import os, sys, time
from datetime import datetime
import tasks.compress as compress

def held(*args, **kwargs):
    open(os.environ["MARK"], "w").write("merged")
    time.sleep(600)

compress.plan_compression = held
from flows.full_consolidation import full_consolidation
full_consolidation(profile=None, as_of=datetime(2025, 7, 1))
"""


@pytest.mark.usefixtures("prefect_api")
def test_a_killed_run_run_again_ends_like_an_uninterrupted_one(
    sample_template: Path, new_store: Callable[[str], Store], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from datetime import datetime

    as_of = datetime(2025, 7, 1)
    monkeypatch.setenv("REVERIE_LEASE_SECONDS", "3")

    clean = clone_sample(sample_template, new_store("clean"))
    monkeypatch.setenv("REVERIE_DATABASE_URL", clean.url)
    decay(profile=None, as_of=as_of)
    full_consolidation(profile=None, as_of=as_of)
    expected = {p: export_jsonl(clean.url, p) for p in clean.profiles()}

    killed = clone_sample(sample_template, new_store("killed"))
    monkeypatch.setenv("REVERIE_DATABASE_URL", killed.url)
    decay(profile=None, as_of=as_of)
    mark = tmp_path / "merged"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update({"MARK": str(mark), "PREFECT_HOME": str(tmp_path / "prefect"),
                "PREFECT_LOGGING_LEVEL": "ERROR"})
    # Its own process group, killed whole as a crashed machine would be: the run's
    # ephemeral Prefect server is a child process, which would outlive a lone kill.
    process = subprocess.Popen([sys.executable, "-c", KILLED_RUN], env=env,
                               cwd=Path(__file__).resolve().parent.parent,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not mark.exists():
            assert process.poll() is None, "the run ended before it was killed"
            assert time.monotonic() < deadline, "the run never got past merging"
            time.sleep(0.2)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    halfway = {p: export_jsonl(killed.url, p) for p in killed.profiles()}
    assert halfway != expected  # merged, but not compressed, linked or scored
    assert killed.lease_holders()  # the dead run's hold is still there, for now

    full_consolidation(profile=None, as_of=as_of)  # waits out the dead run's lease
    assert {p: export_jsonl(killed.url, p) for p in killed.profiles()} == expected
