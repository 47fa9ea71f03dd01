"""An agent session through `reverie api` on a real Prefect server and worker (every
deployment of prefect.yaml): a plain HTTP client starts a session, stores until the
50-store trigger fires a lightweight run, recalls, asks for a consolidation (a run of
its deployment, returned at once) and ends the session, which fires the full run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent_server import ALICE_TOKEN, Running, api_server, bearer
from prefect_stack import Stack, new_store_url, running_stack

EVENT_DEPLOYMENTS = ("on-demand", "sessions")


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Running]]:
    folder = tmp_path_factory.mktemp("agent-platform")
    with new_store_url(folder) as url, running_stack(folder, url) as stack, api_server(
        url, folder, PREFECT_API_URL=f"http://127.0.0.1:{stack.port}/api"
    ) as api:
        yield stack, api


@pytest.mark.slow
def test_an_agent_session_over_http_drives_the_triggers(
    platform: tuple[Stack, Running],
) -> None:
    stack, api = platform
    http = httpx.Client(base_url=f"{api.url}/v1/profiles/alice", headers=bearer(ALICE_TOKEN),
                        timeout=180)
    assert http.post("/session-init", json={"query": "hello"}).json()["memories"] == []
    for batch in range(5):
        r = http.post("/memories", json={"memories": [
            {"content": f"Alice noted fact {batch * 10 + i} about her garden"}
            for i in range(10)]})
        assert r.json()["stored"] == 10, r.text
    stack.wait_runs("lightweight-every-50-stores", "alice", 1, EVENT_DEPLOYMENTS)
    assert http.post("/recall", json={"query": "garden", "k": 3}).json()["hits"]

    started = http.post("/consolidate", json={"mode": "lightweight"}).json()
    assert started["deployment"] == "lightweight-consolidation/on-demand"
    assert started["state"] == "Scheduled"
    assert stack.wait_final(started["run_id"]).state_type.value == "COMPLETED"

    ended = http.post("/session-end", json={"session": "s1"}).json()
    assert ended["consolidation_follows"] is True
    stack.wait_runs("full-at-session-end", "alice", 1, EVENT_DEPLOYMENTS)
