"""A failed Reverie run is announced through the operator's notification block, by a
real Prefect server's automation, to a real HTTP endpoint on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from reverie.deployments.alerts import AUTOMATION_NAME, ensure_failure_alerts
from reverie.deployments.serve import project_root, start_server, stop
from reverie.models.errors import ConfigError
from reverie.models.store import Store

from conftest import prefect_home
from prefect_stack import EVENT_SECONDS, Stack, free_port, wait_for

pytestmark = pytest.mark.store_independent(
    "Prefect automations and notifications; the store's part runs in every flow test on both")


class Inbox:
    def __init__(self) -> None:
        self.messages: list[dict[str, str]] = []
        inbox = self

        class Hook(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                length = int(self.headers.get("Content-Length", 0))
                inbox.messages.append(json.loads(self.rfile.read(length)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    box = Inbox()
    try:
        yield box
    finally:
        box.server.shutdown()


def test_a_failed_run_notifies_the_operators_block_and_a_clean_one_does_not(
    sample_store: Store, inbox: Inbox, tmp_path: Path
) -> None:
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    home, log = prefect_home(tmp_path / "prefect"), tmp_path / "server.log"
    server = start_server(port, home, log)
    # Reads of what the server did (its automation's firings, its runs); no worker here.
    reads = Stack(port, home, log, sample_store, [server])
    env = {**os.environ, "PREFECT_API_URL": api, "REVERIE_DATABASE_URL": sample_store.url}
    try:
        with temporary_settings({PREFECT_API_URL: api}):
            # No block set: nothing is created.
            assert ensure_failure_alerts("").automation_id is None
            CustomWebhookNotificationBlock(
                name="ops", url=inbox.url,
                json_data={"subject": "{{subject}}", "body": "{{body}}"},
            ).save("ops")
            with pytest.raises(ConfigError, match="no 'custom-webhook' block named 'nobody'"):
                ensure_failure_alerts("custom-webhook/nobody")
            state = ensure_failure_alerts("custom-webhook/ops")
            assert state.enabled and state.automation_id is not None
            # Running it again updates the same automation.
            assert ensure_failure_alerts("custom-webhook/ops").automation_id == state.automation_id

            def run(profile: str) -> subprocess.CompletedProcess[str]:
                # The flow itself, as a deployment's run would call it (the CLI refuses
                # an unknown profile before any run starts).
                code = ("from datetime import datetime; from reverie.flows.decay import decay; "
                        f"decay(profile={profile!r}, as_of=datetime(2025, 7, 1))")
                return subprocess.run(
                    [sys.executable, "-c", code], env=env, cwd=project_root(),
                    capture_output=True, text=True, timeout=300,
                )

            assert run("maya").returncode == 0
            assert run("nobody").returncode != 0
            (message,) = wait_for(
                lambda: inbox.messages, EVENT_SECONDS, "the failure notification",
                progress=lambda: (len(reads.firings(AUTOMATION_NAME)),
                                  len(reads.settled_firings(AUTOMATION_NAME))),
                diagnose=lambda: "\n".join([reads.describe_automation(AUTOMATION_NAME),
                                            reads.describe_runs(), reads.log_tail()]))
            assert "decay | nobody" in message["subject"] and "failed" in message["subject"]
            assert "no profile named 'nobody'" in message["body"]
            # maya's clean run ended before nobody's started, and reached the server; the
            # automation, which had it before nobody's failure, fired for that failure only.
            (clean,) = [r for r in reads.runs() if r.name.startswith("decay | maya |")]
            (failed,) = [r for r in reads.runs() if r.name.startswith("decay | nobody |")]
            wait_for(lambda: reads.events(["prefect.flow-run.Completed"],
                                          resource=f"prefect.flow-run.{clean.id}"),
                     EVENT_SECONDS, "the server to have maya's run's Completed event")
            (fired,) = reads.wait_firings(AUTOMATION_NAME, None, 1)
            assert fired.payload["triggering_labels"] == {
                "prefect.resource.id": f"prefect.flow-run.{failed.id}"}
            # Unset: the automation is paused, not left firing.
            assert not ensure_failure_alerts("").enabled
            with get_client(sync_client=True) as client:
                (automation,) = client.read_automations_by_name(AUTOMATION_NAME)
            assert not automation.enabled
    finally:
        stop([server])
    assert len(inbox.messages) == 1  # maya's clean run announced nothing
