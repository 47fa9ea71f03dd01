"""Which faults are retried, how long between tries, and a run whose database is down
when it starts."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from reverie.flows.lightweight_consolidation import lightweight_consolidation
from reverie.models.errors import ConfigError, RecordError, TransientError
from reverie.models.store import Store
from reverie.models.transient import is_transient, retrying

from conftest import TEST_POSTGRES, _create_postgres_database, _drop_postgres_database, clone_sample
from factories import run_history
from prefect_stack import free_port


def _status(code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    return httpx.HTTPStatusError("x", request=request, response=httpx.Response(code, request=request))


@pytest.mark.parametrize("fault", [
    OperationalError("SELECT 1", {}, Exception("server closed the connection unexpectedly")),
    OperationalError("UPDATE memory", {}, Exception("database is locked")),
    ConnectionResetError("reset by peer"),
    TimeoutError("no answer"),
    httpx.ConnectError("refused"),
    _status(503), _status(429),
    TransientError("the embedding service is restarting"),
])
def test_faults_that_may_pass_are_transient(fault: BaseException) -> None:
    assert is_transient(fault)


@pytest.mark.parametrize("fault", [
    ValueError("a bug in planning"),
    KeyError("m-1"),
    RecordError("line 3", "content", "must not be empty"),
    ConfigError("REVERIE_LLM_BASE_URL is not a URL"),
    IntegrityError("INSERT", {}, Exception("duplicate key")),
    _status(400), _status(401),
])
def test_faults_that_fail_the_same_way_every_time_are_not(fault: BaseException) -> None:
    assert not is_transient(fault)


def test_a_wrapped_transient_fault_is_transient() -> None:
    try:
        try:
            raise ConnectionResetError("reset")
        except ConnectionResetError as exc:
            raise RuntimeError("while writing the plan") from exc
    except RuntimeError as wrapped:
        assert is_transient(wrapped)


# The back-off's doubling, jitter and cap: test_retries.py.


def test_retrying_stops_at_the_first_lasting_fault_and_after_its_attempts() -> None:
    calls: list[int] = []

    def lasting() -> None:
        calls.append(1)
        raise ValueError("bug")

    with pytest.raises(ValueError):
        retrying(lasting, 3, 0.01, 0.01)
    assert len(calls) == 1

    calls.clear()

    def always_down() -> None:
        calls.append(1)
        raise ConnectionRefusedError("down")

    with pytest.raises(ConnectionRefusedError):
        retrying(always_down, 3, 0.01, 0.01)
    assert len(calls) == 4


class LateProxy:
    """A TCP port that refuses connections until ``after`` seconds have passed, then
    forwards them to ``target``: a database that is down when a run starts."""

    def __init__(self, port: int, target: tuple[str, int], after: float) -> None:
        self.port, self.target, self.after = port, target, after
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> LateProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        if self._stop.wait(self.after):
            return
        with socket.socket() as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", self.port))
            server.listen()
            server.settimeout(0.2)
            while not self._stop.is_set():
                try:
                    client, _ = server.accept()
                except TimeoutError:
                    continue
                self.accepted += 1
                upstream = socket.create_connection(self.target)
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture
def late_database(sample_template: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    url = _create_postgres_database()
    try:
        clone_sample(sample_template, Store(url))
        yield url
    finally:
        _drop_postgres_database(url)


@pytest.mark.skipif(not TEST_POSTGRES, reason="needs REVERIE_TEST_POSTGRES")
@pytest.mark.usefixtures("prefect_api")
def test_a_run_whose_database_is_down_at_its_start_waits_for_it(
    late_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = urlsplit(late_database)
    port = free_port()
    down_for = 4.0
    monkeypatch.setenv("REVERIE_DATABASE_URL",
                       late_database.replace(f":{real.port}/", f":{port}/"))
    with LateProxy(port, (real.hostname or "127.0.0.1", real.port or 5432), down_for) as proxy:
        started = time.monotonic()
        report = lightweight_consolidation(profile="maya", as_of=datetime(2025, 7, 1))
        took = time.monotonic() - started
    assert proxy.accepted > 0 and took >= down_for
    assert report.profiles == ["maya"] and not report.failed()
    assert [r.profile_id for r in run_history(Store(late_database))] == ["maya"]
