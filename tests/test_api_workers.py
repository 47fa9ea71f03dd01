"""`reverie api --workers 2` (REVERIE_API_WORKERS): two server processes on one port,
each with its own model and recall cache, as real processes. Any process answers any
request: the MCP SDK's client stores, recalls and gets over the stateless endpoint, a
memory stored through one connection is recalled through fresh ones, and concurrent
store calls from both processes lose nothing. (The whole agent session over MCP is
test_mcp's, on one process.) `reverie mcp --transport http --workers 2` serves the same
stateless endpoint from two processes, driven here by the MCP SDK's client."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import psutil
import pytest
from agent_server import ALICE_TOKEN, BOB_TOKEN, Running, agent_store, api_server, bearer
from test_mcp import over_http, refused, tool

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    folder = tmp_path_factory.mktemp("workers")
    with agent_store(folder) as url, api_server(url, folder, REVERIE_API_WORKERS="2") as running:
        yield running


def workers(api: Running) -> list[psutil.Process]:
    """The server processes that loaded the model (the supervisor does not)."""
    tree = psutil.Process(api.process.pid).children(recursive=True)
    return [p for p in tree if p.memory_info().rss > 200 * 2**20]


def test_the_mcp_sdk_client_works_over_the_stateless_endpoint(api: Running) -> None:
    # Its requests land on either process: nothing may depend on a session in memory.
    async def main() -> None:
        async with over_http(api, ALICE_TOKEN) as session:
            stored = await tool(session, "store", profile="alice", memories=[
                {"id": "m1", "content": "The user prefers dark roast coffee"},
                {"id": "m2", "content": "The user's sister is called Ines"}])
            assert stored["stored"] == 2
            for _ in range(4):
                hits = await tool(session, "recall", profile="alice", query="sister's name",
                                  k=1)
                assert hits["hits"][0]["external_id"] == "m2"
            got = await tool(session, "get", profile="alice", id="m1")
            assert got["content"] == "The user prefers dark roast coffee"
        async with over_http(api, BOB_TOKEN) as session:
            assert (await refused(session, "recall", profile="alice", query="x")).startswith(
                "403")

    anyio.run(main)


def test_any_process_recalls_what_another_stored_and_none_loses_a_store(api: Running) -> None:
    headers = bearer(ALICE_TOKEN)
    texts = [f"Worker check {n}: the courier comes on day {n} of the month" for n in range(12)]
    answers: list[int] = []
    lock = threading.Lock()

    def store(part: list[str]) -> None:
        # A fresh connection per call: the kernel hands each to either process.
        for text in part:
            r = httpx.post(f"{api.url}/v1/profiles/bob-2/memories", headers=bearer(BOB_TOKEN),
                           json={"memories": [{"content": text}]}, timeout=120)
            with lock:
                answers.append(r.status_code)

    threads = [threading.Thread(target=store, args=(texts[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert answers == [200] * len(texts)
    # Each recall on a fresh connection: a cached profile in one process must see the
    # other's write (the caches key on the profile's write count, read per recall).
    first = httpx.post(f"{api.url}/v1/profiles/alice/memories", headers=headers, timeout=120,
                       json={"memories": [{"id": "w0", "content": "The boiler was serviced"}]})
    assert first.status_code == 200
    for n in range(8):
        r = httpx.post(f"{api.url}/v1/profiles/alice/recall", headers=headers,
                       json={"query": f"preamble {n}", "k": 1}, timeout=120)
        assert r.status_code == 200
    stored = httpx.post(f"{api.url}/v1/profiles/alice/memories", headers=headers, timeout=120,
                        json={"memories": [{"id": "w1", "content": "The spare key is under "
                                                                 "the blue flowerpot"}]})
    assert stored.status_code == 200 and stored.json()["stored"] == 1
    for _ in range(8):
        r = httpx.post(f"{api.url}/v1/profiles/alice/recall", headers=headers,
                       json={"query": "where is the spare key", "k": 1}, timeout=120)
        assert r.json()["hits"][0]["external_id"] == "w1"
    status = httpx.get(f"{api.url}/v1/profiles/bob-2/consolidate/status",
                       headers=bearer(BOB_TOKEN), timeout=120)
    assert status.status_code == 200
    found = [httpx.post(f"{api.url}/v1/profiles/bob-2/recall", headers=bearer(BOB_TOKEN),
                        json={"query": text, "k": 1}, timeout=120).json()["hits"][0]["content"]
             for text in texts]
    assert found == texts
    assert len(workers(api)) == 2  # both processes embedded (the model loads on first use)


def test_the_log_holds_no_memory_content(api: Running) -> None:
    log = Path(api.log).read_text(errors="replace")
    assert "courier" not in log and "flowerpot" not in log


@pytest.fixture(scope="module")
def mcp_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    folder = tmp_path_factory.mktemp("mcp-workers")
    with agent_store(folder) as url, api_server(
            url, folder, command=("mcp", "--transport", "http", "--workers", "2")) as running:
        yield running


def test_mcp_over_http_with_two_workers(mcp_http: Running) -> None:
    # Each session is a fresh connection, which the kernel hands to either process: a
    # memory stored in one session is found, and refused to another token, in the next.
    texts = {f"n{k}": f"Parcel {k} goes to the neighbour at number {k + 10}" for k in range(6)}

    async def main() -> None:
        for name, text in texts.items():
            async with over_http(mcp_http, ALICE_TOKEN) as session:
                stored = await tool(session, "store", profile="alice",
                                    memories=[{"id": name, "content": text}])
                assert stored["stored"] == 1
        for name, text in texts.items():
            async with over_http(mcp_http, ALICE_TOKEN) as session:
                hits = await tool(session, "recall", profile="alice", query=text, k=1)
                assert hits["hits"][0]["external_id"] == name
                got = await tool(session, "get", profile="alice", id=name)
                assert got["content"] == text
        async with over_http(mcp_http, BOB_TOKEN) as session:
            assert (await refused(session, "get", profile="alice", id="n0")).startswith("403")

    anyio.run(main)
    assert len(workers(mcp_http)) == 2
    assert "Parcel" not in Path(mcp_http.log).read_text(errors="replace")
