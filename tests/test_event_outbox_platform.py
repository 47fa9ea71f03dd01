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

from reverie.deployments.serve import project_root
from reverie.models import outbox
from reverie.models.events import MEMORY_STORED, STORE_THRESHOLD
from reverie.runner import event_delivery

from factories import embedder_of, ingest_records
from prefect_stack import EVENT_SECONDS, Stack, new_store_url, running_stack, wait_for

pytestmark = pytest.mark.slow

VECTOR = [1.0] + [0.0] * 383  # supplied: the test needs no embedding model
THRESHOLD_AUTOMATION = "lightweight-every-50-stores"


def _threshold_runs(stack: Stack, profile: str) -> list[Any]:
    return stack.runs_by_automation(THRESHOLD_AUTOMATION, profile, ["on-demand"])


def _flush_with_the_cli(stack: Stack) -> subprocess.CompletedProcess[str]:
    """`reverie events flush`, run again while the API does not take the events within
    the send's deadline, as its message says to (a loaded machine's fresh server can be
    that slow); any other failure fails."""
    attempts: list[subprocess.CompletedProcess[str]] = []

    def flushed() -> subprocess.CompletedProcess[str] | None:
        done = subprocess.run(
            [sys.executable, "-m", "reverie.deployments.cli", "events", "flush"],
            cwd=project_root(), capture_output=True, text=True, timeout=120,
            env={**os.environ, "PREFECT_API_URL": stack.api},
        )
        attempts.append(done)
        if done.returncode == 0:
            return done
        assert "the Prefect API did not take them" in done.stderr, done.stderr
        return None

    return wait_for(flushed, EVENT_SECONDS, "`reverie events flush` to send the events",
                    diagnose=lambda: "\n".join(f"attempt: {a.stdout!r} {a.stderr[-500:]!r}"
                                               for a in attempts) + "\n" + stack.log_tail())


def test_events_kept_while_the_api_is_down_trigger_their_run_once_it_is_back(
    tmp_path: Path,
) -> None:
    from prefect.client.schemas.objects import StateType

    with new_store_url(tmp_path) as store_url, running_stack(tmp_path, store_url) as stack:
        # The worker found its pool (a worker starting without an API gives up) and the
        # triggers service has the deployments' automations: running_stack waited.
        stack.stop_server()  # the API goes away; the worker stays

        # The vectors are supplied, but an ingest still loads the model, once per process:
        # seconds on a loaded machine, which the clock below is not about.
        embedder_of(stack.store)
        started = time.monotonic()
        ingest_records(stack.store, [{"content": f"fact {i}", "embedding": VECTOR} for i in range(50)], profile="outbox-a")
        ingest_records(stack.store, [{"content": f"fact {i}", "embedding": VECTOR} for i in range(30)], profile="outbox-b")
        assert time.monotonic() - started < 2 * event_delivery.SEND_DEADLINE_SECONDS
        assert [(p.profile, p.events) for p in outbox.waiting(store_url)] == [
            ("outbox-a", 2), ("outbox-b", 1)]
        down = event_delivery.flush(store_url)  # the real send, to nobody
        assert down.outcome is event_delivery.Outcome.UNREACHABLE and down.pending == 3

        stack.start_server()  # its old database
        assert stack.worker.poll() is None, "the worker died while the server was down"
        flushed = _flush_with_the_cli(stack)
        assert flushed.stdout == "sent 3, waiting 0\n"
        assert outbox.waiting(store_url) == []

        # The server has them: a store threshold for outbox-a only (30 stores: none).
        stack.wait_profile_events("outbox-a", {MEMORY_STORED: 1, STORE_THRESHOLD: 1})
        stack.wait_profile_events("outbox-b", {MEMORY_STORED: 1, STORE_THRESHOLD: 0})
        (run,) = stack.wait_runs(THRESHOLD_AUTOMATION, "outbox-a", 1, ["on-demand"])
        run = stack.wait_final(run.id)
        assert run.state_type is StateType.COMPLETED, stack.log_tail()
        # The automation fired once, for outbox-a, and that action has ended.
        stack.wait_firings(THRESHOLD_AUTOMATION, "outbox-a", 1)
        assert stack.firings(THRESHOLD_AUTOMATION, "outbox-b") == []
        assert len(_threshold_runs(stack, "outbox-a")) == 1
        assert _threshold_runs(stack, "outbox-b") == []
