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

from deployments.alerts import AUTOMATION_NAME, ensure_failure_alerts
from deployments.serve import project_root, start_server, stop
from models.errors import ConfigError
from models.store import Store

from test_platform import AUTOMATION_SECONDS, free_port, wait_for


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
    server = start_server(port, tmp_path / "prefect", tmp_path / "server.log")
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
                code = ("from datetime import datetime; from flows.decay import decay; "
                        f"decay(profile={profile!r}, as_of=datetime(2025, 7, 1))")
                return subprocess.run(
                    [sys.executable, "-c", code], env=env, cwd=project_root(),
                    capture_output=True, text=True, timeout=300,
                )

            assert run("maya").returncode == 0
            assert run("nobody").returncode != 0
            (message,) = wait_for(lambda: inbox.messages, AUTOMATION_SECONDS,
                                  "the failure notification")
            assert "decay | nobody" in message["subject"] and "failed" in message["subject"]
            assert "no profile named 'nobody'" in message["body"]
            # Unset: the automation is paused, not left firing.
            assert not ensure_failure_alerts("").enabled
            with get_client(sync_client=True) as client:
                (automation,) = client.read_automations_by_name(AUTOMATION_NAME)
            assert not automation.enabled
    finally:
        stop([server])
    assert len(inbox.messages) == 1  # maya's clean run announced nothing
