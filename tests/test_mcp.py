"""`reverie mcp` driven by the MCP SDK's own client: over stdio (the client spawns
`reverie mcp`) and over streamable HTTP (the /mcp endpoint of `reverie api`, a real
process). A session: session_init, store, recall, get, status, session_end; every tool
refused for another profile's token, and the HTTP endpoint for no or a wrong token."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from agent_server import (
    ALICE_TOKEN,
    BOB_TOKEN,
    WRONG_TOKEN,
    Running,
    agent_store,
    api_server,
    offered_names,
    reverie,
    server_env,
)
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from reverie.flows.catalog import ALIASES
from reverie.models.db import create_store

from conftest import prefect_home

TOOLS = {"session_init", "store", "recall", "get", "consolidate", "consolidation_status",
         "session_end", "undo"}


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("mcp")
    with agent_store(folder) as url:
        yield url, folder


@pytest.fixture(scope="module")
def api(database: tuple[str, Path]) -> Iterator[Running]:
    with api_server(*database) as running:
        yield running


@asynccontextmanager
async def over_http(api: Running, token: str | None) -> AsyncIterator[ClientSession]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(f"{api.url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def over_stdio(url: str, token: str, **extra: str) -> AsyncIterator[ClientSession]:
    env = server_env(url, REVERIE_MCP_TOKEN=token, **extra)
    params = StdioServerParameters(command=reverie(), args=["mcp"], env=env)
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def tool(session: ClientSession, name: str, /, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(name, arguments)
    assert not result.is_error, result.content
    return result.structured_content or json.loads(result.content[0].text)  # type: ignore[union-attr]


async def refused(session: ClientSession, name: str, /, **arguments: Any) -> str:
    result = await session.call_tool(name, arguments)
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    # The SDK says which tool failed; our text follows: "<HTTP status> <JSON body>".
    return text.removeprefix(f"Error executing tool {name}: ")


async def agent_session(session: ClientSession, profile: str) -> None:
    assert TOOLS <= {t.name for t in (await session.list_tools()).tools}
    stored = await tool(session, "store", profile=profile, memories=[
        {"id": "m1", "content": "The user prefers dark roast coffee", "kind": "preference"},
        {"id": "m2", "content": "The user's sister is called Ines", "importance": 0.9},
        {"content": "bad", "created_at": "not a date"},
    ])
    assert stored["stored"] == 2
    assert stored["rejected"][0]["field"] == "created_at"
    start = await tool(session, "session_init", profile=profile, query="coffee")
    assert start["memories"][0]["content"] == "The user prefers dark roast coffee"
    hits = await tool(session, "recall", profile=profile, query="sister's name", k=1,
                      track=True)
    assert hits["hits"][0]["external_id"] == "m2"
    got = await tool(session, "get", profile=profile, id="m2")
    assert got["access_count"] == 1
    status = await tool(session, "consolidation_status", profile=profile)
    assert status["profile"] == profile
    ended = await tool(session, "session_end", profile=profile, session="s1")
    assert ended["session_count"] >= 1
    bad = await refused(session, "consolidate", profile=profile, mode="cold", scope="session")
    assert bad.startswith("422") and '"field": "session"' in bad


async def every_tool_refused(session: ClientSession, profile: str) -> None:
    arguments: dict[str, dict[str, Any]] = {
        "session_init": {}, "store": {"memories": [{"content": "x"}]},
        "recall": {"query": "x"}, "get": {"id": "m1"}, "consolidate": {"dry_run": True},
        "consolidation_status": {}, "session_end": {}, "undo": {"id": "c-1"},
    }
    for name, args in arguments.items():
        for target in (profile, "nobody"):
            text = await refused(session, name, profile=target, **args)
            assert text.startswith("403"), (name, text)
            assert target not in text


@pytest.mark.slow
def test_a_whole_session_over_streamable_http(api: Running) -> None:
    async def main() -> None:
        async with over_http(api, ALICE_TOKEN) as session:
            await agent_session(session, "alice")
        async with over_http(api, BOB_TOKEN) as session:
            await every_tool_refused(session, "alice")

    anyio.run(main)


@pytest.mark.slow
def test_tools_describe_every_argument_and_refuse_bad_ones_naming_the_field(
    api: Running
) -> None:
    """What an agent reads of a tool says what each argument is; an argument of the
    wrong type, or one no tool has, is refused as the HTTP API refuses it (422 naming
    the field), without echoing the value."""
    async def main() -> None:
        async with over_http(api, ALICE_TOKEN) as session:
            tools = (await session.list_tools()).tools
            assert {t.name for t in tools} >= TOOLS
            for t in tools:
                assert t.description and "\n" not in t.description, t.name
                for name, schema in t.input_schema["properties"].items():
                    assert schema.get("description"), (t.name, name)
            described = {t.name: t for t in tools}
            # Which memories reach the two blocks that stay empty without knowing it.
            assert "learned_preferences, opinions and preferences trusted at least 0.7" \
                in described["store"].description
            assert "recall --track" in described["store"].description
            assert described["undo"].input_schema["properties"]["id"]["description"] \
                .startswith("A consolidation's id (c-...")
            # The current modes only: an old name (ALIASES) is taken, not offered.
            [consolidate] = [t for t in tools if t.name == "consolidate"]
            modes = offered_names(consolidate.input_schema["properties"]["mode"],
                                  consolidate.input_schema)
            assert "cold-notes" in modes and not set(ALIASES) & set(modes), modes
            for name, arguments, field in (
                ("recall", {"query": ["the-secret-value"]}, "query"),
                ("recall", {"query": "tea", "k": "several"}, "k"),
                ("recall", {"query": "tea", "bogus": 1}, "bogus"),
                ("consolidate", {"mode": "everything"}, "mode"),
                # JSON's types, not lookalikes ("3" for 3, 0 for false).
                ("recall", {"query": "tea", "k": "3"}, "k"),
                ("recall", {"query": "tea", "deep": 0}, "deep"),
                ("recall", {"query": "tea", "track": "true"}, "track"),
                ("session_init", {"k": 2.0}, "k"),
                ("session_init", {"budget_chars": "100"}, "budget_chars"),
                ("consolidate", {"dry_run": 0}, "dry_run"),
                ("consolidate", {"mode": "sleep", "min_age_days": "3"}, "min_age_days"),
                ("consolidate", {"use_llm": 1}, "use_llm"),
                ("consolidation_status", {"limit": "5"}, "limit"),
                # Only spaces or zero-width characters: nothing to look for.
                ("recall", {"query": "\u200b \ufeff"}, "query"),
                ("session_init", {"query": "\u2060"}, "query"),
            ):
                text = await refused(session, name, profile="alice", **arguments)
                assert text.startswith("422 "), text
                body = json.loads(text.removeprefix("422 "))
                assert body["field"] == field and "the-secret-value" not in text, text

    anyio.run(main)
    assert "the-secret-value" not in api.log_text()


@pytest.mark.slow
@pytest.mark.store_independent("the token is refused before any tool runs")
@pytest.mark.parametrize("token", [None, WRONG_TOKEN])
def test_the_mcp_endpoint_refuses_no_token_and_a_wrong_one(api: Running, token: str | None) -> None:
    headers = {"Accept": "application/json, text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    r = httpx.post(f"{api.url}/mcp", headers=headers, json={
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}})
    assert r.status_code == 401


@pytest.mark.slow
def test_a_whole_session_over_stdio(database: tuple[str, Path]) -> None:
    url, _ = database

    async def main() -> None:
        async with over_stdio(url, BOB_TOKEN) as session:
            await agent_session(session, "bob")
            await every_tool_refused(session, "alice")

    anyio.run(main)
    # A missing or wrong token is said at start, naming the setting, never the token.
    for token in ("", WRONG_TOKEN):
        env = server_env(url, REVERIE_MCP_TOKEN=token)
        done = subprocess.run([reverie(), "mcp"], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and "REVERIE_MCP_TOKEN: not" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and (not token or token not in done.stderr)


@pytest.mark.slow
@pytest.mark.store_independent("the local Prefect server is started before any store is read")
def test_over_stdio_the_local_prefect_server_is_started_at_once(tmp_path: Path) -> None:
    """A local agent's `reverie mcp` starts the shared local Prefect server as it starts
    (session_end's full run needs it), and the protocol on stdout is not disturbed."""
    from reverie.deployments.local_server import running

    home = prefect_home(tmp_path / "prefect")
    url = f"sqlite:///{tmp_path / 'store.db'}"
    create_store(url)

    async def session() -> dict[str, Any]:
        async with over_stdio(url, BOB_TOKEN, REVERIE_LOCAL_SERVER="shared",
                              PREFECT_HOME=str(home)) as agent:
            deadline = time.monotonic() + 120
            while running(home) is None:  # no tool called: started by the start alone
                assert time.monotonic() < deadline, "no local Prefect server came up"
                await anyio.sleep(0.5)
            return await tool(agent, "recall", profile="bob", query="tea", k=3)

    try:
        assert anyio.run(session) == {"profile": "bob", "hits": []}
    finally:
        subprocess.run([reverie(), "server", "stop"], capture_output=True, timeout=60,
                       env=server_env(url, PREFECT_HOME=str(home)))
