"""An agent session through `reverie api` on a real Prefect server and worker (every
deployment of prefect.yaml): a plain HTTP client starts a session, stores until the
50-store trigger fires a lightweight run, recalls, asks for a consolidation (a run of
its deployment, returned at once) and ends the session, which fires the full run."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from agent_server import ALICE_TOKEN, Running, api_server, bearer

from prefect_stack import Stack, new_store_url, running_stack

pytestmark = pytest.mark.store_independent(
    "the agent session through a real stack; its operations run on both in tests/test_api.py")

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


@pytest.mark.slow
def test_an_agent_session_over_mcp_drives_the_triggers(
    platform: tuple[Stack, Running],
) -> None:
    """The same session through the MCP SDK's client, over streamable HTTP (bob) and
    over stdio (bob-2, spawning `reverie mcp` against the same Prefect)."""
    import anyio
    from agent_server import BOB_TOKEN
    from test_mcp import over_http, over_stdio, tool

    stack, api = platform

    async def session(client: object, profile: str) -> None:
        await tool(client, "session_init", profile=profile)  # type: ignore[arg-type]
        for batch in range(5):
            done = await tool(client, "store", profile=profile, memories=[  # type: ignore[arg-type]
                {"content": f"{profile} noted fact {batch * 10 + i} about the boat"}
                for i in range(10)])
            assert done["stored"] == 10
        await anyio.to_thread.run_sync(lambda: stack.wait_runs(
            "lightweight-every-50-stores", profile, 1, EVENT_DEPLOYMENTS))
        found = await tool(client, "recall", profile=profile, query="boat", k=2)  # type: ignore[arg-type]
        assert len(found["hits"]) == 2
        ended = await tool(client, "session_end", profile=profile, session="s1")  # type: ignore[arg-type]
        assert ended["consolidation_follows"] is True
        await anyio.to_thread.run_sync(lambda: stack.wait_runs(
            "full-at-session-end", profile, 1, EVENT_DEPLOYMENTS))

    async def main() -> None:
        async with over_http(api, BOB_TOKEN) as client:
            await session(client, "bob")
        url = api.env["REVERIE_DATABASE_URL"]
        prefect = api.env["PREFECT_API_URL"]
        async with over_stdio(url, BOB_TOKEN, PREFECT_API_URL=prefect) as client:
            await session(client, "bob-2")

    anyio.run(main)
