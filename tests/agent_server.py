"""`reverie api` started as a real process on a free loopback port, for the agent-server
tests (test_api.py, test_mcp.py): its store, tokens, and a log file to read."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reverie.benchmarks.api import wait_until_healthy

from conftest import prefect_home
from prefect_stack import new_store_url

ALICE_TOKEN = "alice-token-0123456789abcdef"
BOB_TOKEN = "bob-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789abcdef"
WRONG_TOKEN = "wrong-token-0123456789abcdef"
TOKENS = f"{ALICE_TOKEN}:alice;{BOB_TOKEN}:bob,bob-2"


@dataclass
class Running:
    url: str
    log: Path
    process: subprocess.Popen[bytes]
    env: dict[str, str]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_env(database_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REVERIE_API")}
    env.pop("PREFECT_API_URL", None)
    env.update({
        "REVERIE_DATABASE_URL": database_url,
        "REVERIE_API_TOKENS": TOKENS,
        "REVERIE_API_ADMIN_TOKEN": ADMIN_TOKEN,
        "REVERIE_API_MAX_BATCH": "20",
        "REVERIE_API_MAX_BODY_BYTES": "65536",
        "HF_HUB_OFFLINE": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        **extra,
    })
    return env


def reverie() -> str:
    return str(Path(sys.executable).with_name("reverie"))


@contextmanager
def api_server(database_url: str, folder: Path, *, command: Sequence[str] = ("api",),
               **extra: str) -> Iterator[Running]:
    """``reverie -v <command> --port P`` (``reverie api``, or e.g. ``mcp --transport
    http``) on ``database_url``, with ``extra`` in its environment."""
    port = free_port()
    log = folder / "api.log"
    # Its own Prefect home: a local server it starts for a run is this test's alone.
    env = server_env(database_url, PREFECT_HOME=str(prefect_home(folder / "prefect")), **extra)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [reverie(), "-v", *command, "--port", str(port)], stdout=out, stderr=out, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, url, log, 120)
        yield Running(url, log, process, env)
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        subprocess.run([reverie(), "server", "stop"], env=env, capture_output=True, timeout=60)


def bearer(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


@contextmanager
def agent_store(folder: Path) -> Iterator[str]:
    """A store for the agent servers, made beforehand as `reverie init` would (they
    never create one): a SQLite file in ``folder``, or a PostgreSQL database in that leg."""
    with new_store_url(folder) as url:
        yield url


def offered_names(schema: dict[str, Any], document: dict[str, Any]) -> list[str]:
    """The values a JSON schema offers: its enum, through $ref and anyOf."""
    if "$ref" in schema:
        target: Any = document
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return offered_names(target, document)
    branches = schema.get("anyOf", [])
    return [*schema.get("enum", []),
            *(name for branch in branches for name in offered_names(branch, document))]
