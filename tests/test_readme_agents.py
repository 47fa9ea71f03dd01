"""The README's agent examples run as written: the MCP client configuration of
`reverie mcp` (spawned by the MCP SDK's client over stdio) and the agent loop over HTTP
(against `reverie api`, a real process)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from agent_server import Running, agent_store, api_server, reverie
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client

pytestmark = pytest.mark.store_independent(
    "the README's agent snippets as written; their operations run on both in tests/test_api.py")

README = Path(__file__).parents[1] / "README.md"
AGENT_TOKEN = "agent-token-change-me-0123"
# The suite's settings of the machine, not of Reverie's configuration (conftest).
HARNESS = frozenset({"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS",
                     "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "REVERIE_EMBEDDING_BACKEND",
                     "PREFECT_SERVER_ANALYTICS_ENABLED", "PREFECT_LOGGING_LEVEL"})


def readme_block(name: str) -> str:
    """The fenced block after ``<!-- readme-test: name -->``."""
    match = re.search(rf"<!-- readme-test: {name} -->\n```\w+\n(.*?)\n```", README.read_text(),
                      re.DOTALL)
    assert match, f"README has no block {name}"
    return match.group(1)


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("readme")
    with agent_store(folder) as url:
        yield url, folder


@pytest.mark.slow
@pytest.mark.store_independent("checks the README's words; the operations it calls run on "
                                 "PostgreSQL in test_api.py and test_mcp.py")
def test_the_agent_loop_runs_as_written(database: tuple[str, Path]) -> None:
    url, folder = database
    with api_server(url, folder, REVERIE_API_TOKENS=f"{AGENT_TOKEN}:my-agent") as api:
        run(api, folder)
        second = run(api, folder)
    # The second session recalls what the first one stored.
    assert "I moved to Lyon last month" in second


def run(api: Running, folder: Path) -> str:
    script = folder / "agent_loop.py"
    script.write_text(readme_block("agent-loop"))
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300,
        env={**os.environ, "REVERIE_URL": api.url, "REVERIE_TOKEN": AGENT_TOKEN})
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow
@pytest.mark.store_independent("checks the README's words; the operations it calls run on "
                                 "PostgreSQL in test_api.py and test_mcp.py")
def test_the_mcp_client_configuration_runs_as_written(database: tuple[str, Path]) -> None:
    url, folder = database
    server = json.loads(readme_block("mcp-config"))["mcpServers"]["reverie"]
    assert server["command"] == "reverie"
    # What an MCP client passes: the SDK's few variables and the configuration's env,
    # not this process's Reverie settings (a README config once worked here only by
    # inheriting the suite's REVERIE_DATABASE_URL). The store is the test's, in the
    # variable the README names; the machine's settings of the suite (offline model,
    # its back-end, threads) and a Prefect home of its own keep it a test.
    assert "REVERIE_DATABASE_URL" in server["env"]
    machine = {k: v for k, v in os.environ.items() if k in HARNESS}
    env = {**get_default_environment(), **machine, **server["env"],
           "REVERIE_DATABASE_URL": url, "PREFECT_HOME": str(folder / "prefect-home")}

    async def main() -> None:
        params = StdioServerParameters(command=reverie(), args=server["args"], env=env)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            stored = await session.call_tool("store", {"profile": "my-agent", "memories": [
                {"content": "The user writes Rust at work"}]})
            assert not stored.is_error, stored.content
            start = await session.call_tool("session_init", {"profile": "my-agent",
                                                             "query": "programming"})
            assert not start.is_error, start.content
            assert "Rust" in json.dumps(start.structured_content)

    anyio.run(main)
