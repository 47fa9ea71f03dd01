"""Progress bars: drawn on a terminal (a pty here), not a byte anywhere else, and never
naming memory content or profiles."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import pytest

from reverie.benchmarks import speed
from reverie.deployments.backfill import backfill
from reverie.deployments.cli import EXIT_OK, EXIT_REJECTED, main
from reverie.models.store import Store
from reverie.runner.progress import Bar, on_terminal

from factories import embedder_of, ingest_records

pytestmark = pytest.mark.store_independent(
    "progress bars and logs")

START = datetime(2025, 7, 1)
# What a bar looks like: "desc:  33%|███▎      | 1/3 [00:00<00:01, 2.0row/s]".
BAR_MARKS = ("%|", "\r")


class Terminal:
    """A pty: ``stream`` is the terminal end a program writes to; what it wrote is read
    from the other end as it arrives (a pty's buffer is small: unread, writes block)."""

    def __init__(self, columns: int = 120, rows: int = 24) -> None:
        self._master, slave = pty.openpty()
        # A pty starts 0 x 0; a real terminal says how big it is.
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        self.stream: TextIO = os.fdopen(slave, "w", encoding="utf-8")
        self._got = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # the terminal end was closed
                return
            if not chunk:
                return
            with self._lock:
                self._got += chunk

    def text(self) -> str:
        with self._lock:
            return self._got.decode("utf-8", errors="replace")

    def wait_for(self, needle: str, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text():
                return True
            time.sleep(0.02)
        return needle in self.text()

    def settle(self, quiet: float = 0.2, timeout: float = 5.0) -> str:
        """All written so far: what has arrived once nothing more came for ``quiet``."""
        deadline = time.monotonic() + timeout
        before = None
        while time.monotonic() < deadline:
            now = self.text()
            if now == before:
                return now
            before = now
            time.sleep(quiet)
        return self.text()

    def close(self) -> None:
        self.stream.close()
        self._reader.join(timeout=5)
        os.close(self._master)


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    made = Terminal()
    yield made
    made.close()


def stderr_on(terminal: Terminal, monkeypatch: pytest.MonkeyPatch) -> Terminal:
    """Make stderr the terminal; stdout stays captured by pytest, as if piped. Called in
    the test's body: pytest puts its own stderr back between a fixture and the test."""
    monkeypatch.setattr(sys, "stderr", terminal.stream)
    return terminal


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "memories.jsonl"
    path.write_text(
        '{"id": "t1", "content": "Ana prefers trains to planes", "kind": "preference"}\n'
        '\n'
        '{"id": "t2", "content": "Ana", "importance": "very"}\n'
        '{"id": "t3", "content": "Ana lives in Porto", "profile": "other"}\n',
        encoding="utf-8",
    )
    return path


def _no_bar(text: str) -> bool:
    return not any(mark in text for mark in BAR_MARKS)


# --- the module ---------------------------------------------------------------------------


def _use(bar: Bar) -> None:
    with bar:
        bar.update()
        bar.describe("1 waiting")
        bar.note("one done")
        bar.advance_to(3)
        with bar.paused():
            pass


def test_a_bar_writes_not_a_byte_to_a_pipe_or_a_captured_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    read, write = os.pipe()
    with os.fdopen(write, "w") as pipe:
        assert not on_terminal(pipe)
        _use(Bar(3, "quiet", unit="row", stream=pipe))
    with os.fdopen(read, "rb") as got:
        assert got.read() == b""
    _use(Bar(3, "quiet", unit="row"))  # stderr: pytest's capture, not a terminal
    bar = Bar(3, "quiet")
    bar.echo("a row of the report")  # the command's own output still comes out
    bar.close()
    out, err = capsys.readouterr()
    assert err == "" and out == "a row of the report\n"


def test_a_bar_is_drawn_on_a_terminal_with_lines_and_logs_above_it(
    terminal: Terminal, monkeypatch: pytest.MonkeyPatch
) -> None:
    stderr_on(terminal, monkeypatch)
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    logger = logging.getLogger("tests.progress")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        with Bar(4, "demo", unit="row", stream=terminal.stream) as bar:
            assert bar.active
            bar.update()
            bar.note("one done")
            logger.warning("a log line")
            logger.info("below the handler's level")  # printed no more than before
            # Logs go above the bar (through tqdm) while it is shown...
            assert handler not in logger.handlers
        assert logger.handlers == [handler]  # ...and the handler is as it was after
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)
    text = terminal.settle()
    assert "demo:" in text and "0/4" in text and "1/4" in text
    # The bar is cleared (its line ends in a carriage return) before each line is
    # written: neither lands after the bar's text on the same line.
    assert "\rone done" in text and "\ra log line" in text
    assert "]one done" not in text and "]a log line" not in text
    assert text.index("one done") < text.index("a log line")
    assert "below the handler's level" not in text


def test_a_terminal_of_unknown_size_still_gets_a_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal(columns=0, rows=0)
    try:
        with monkeypatch.context() as patch:
            stderr_on(terminal, patch)  # tqdm asks stderr's size, and gets 0 x 0
            with Bar(2, "unsized") as bar:
                bar.update()
        assert "unsized:" in terminal.settle()
    finally:
        terminal.close()


# --- ingest -------------------------------------------------------------------------------


def test_ingest_on_a_terminal_shows_a_bar_of_its_records_without_their_content(
    store: Store, jsonl: Path, terminal: Terminal, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stderr_on(terminal, monkeypatch)
    monkeypatch.setattr("reverie.runner.progress.MIN_INTERVAL_SECONDS", 0)  # draw every step
    assert main(["ingest", str(jsonl), "--profile", "ana"]) == EXIT_REJECTED
    text = terminal.settle()
    # Three records (the blank line is not one), counted as the ingest goes.
    assert "ingest:" in text and "0/3" in text and "3/3" in text, text
    for content in ("trains", "planes", "Porto"):
        assert content not in text
    out = capsys.readouterr().out
    assert out.startswith("stored 2") and _no_bar(out)


def test_ingest_piped_prints_its_report_and_no_bar(
    store: Store, jsonl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ingest", str(jsonl), "--profile", "ana", "--json"]) == EXIT_REJECTED
    out, err = capsys.readouterr()
    assert json.loads(out)["stored"] == 2
    assert err.splitlines() == [
        f"{jsonl}: line 3, field 'importance': expected a number, got str"]


def test_an_ingest_counts_every_record_once_as_it_goes(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("reverie.models.ingest.INGEST_CHUNK", 2)  # several chunks
    records: list[dict[str, Any]] = [
        {"id": f"m{i}", "content": f"memory number {i} about a train", "profile": "ana"}
        for i in range(5)
    ]
    records += [
        {"id": "m0", "content": "memory number 0 about a train", "profile": "ana"},  # again
        {"id": "bad", "content": "x", "importance": "very", "profile": "ana"},
        {"type": "edge", "source": "m0", "target": "m1", "profile": "ana", "weight": 0.5},
    ]
    embedder = embedder_of(store)
    original, embedding = embedder.encode, []

    def encode(texts: list[str], progress: Any = False) -> Any:
        embedding.append(True)
        try:
            return original(texts, progress)
        finally:
            embedding.pop()

    monkeypatch.setattr(embedder, "encode", encode)
    counted: list[tuple[int, bool]] = []

    def count(n: int) -> None:
        counted.append((n, bool(embedding)))

    report = ingest_records(store, records, progress=count)
    assert report.stored == 5 and report.edges == 1 and len(report.errors) == 1
    assert sum(n for n, _ in counted) == len(records)
    # Counted while the model embedded (most of an ingest's time), not only after.
    assert sum(n for n, during in counted if during) == 5
    counted.clear()
    ingest_records(store, records, progress=count)  # the same again: nothing to embed
    assert sum(n for n, _ in counted) == len(records)
    assert not any(during for _, during in counted)


LOAD_THE_MODEL = """
import transformers  # first, as a program using Reverie as a library may: before the
                     # variable that turns the loading bar off is set
from reverie.engines.embedding import get_embedder
get_embedder().encode(["a sentence"])
"""


def test_the_model_loads_without_its_own_bar_on_a_terminal(terminal: Terminal) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    done = subprocess.run([sys.executable, "-c", LOAD_THE_MODEL], stderr=terminal.stream,
                          stdout=subprocess.PIPE, env=env, timeout=300,
                          cwd=Path(__file__).parent.parent)
    text = terminal.settle()
    assert done.returncode == 0, text
    assert "Loading" not in text and _no_bar(text), text


# --- backfill -----------------------------------------------------------------------------


class _Watched:
    """A flow that, before each run, waits for the previous date's line on the terminal."""

    def __init__(self, flow: Any, terminal: Terminal) -> None:
        self.flow, self.terminal, self.name = flow, terminal, flow.name
        self.seen_before: list[bool] = []

    def __call__(self, **kwargs: Any) -> Any:
        previous = kwargs["as_of"] - timedelta(days=1)
        if previous >= START:
            self.seen_before.append(self.terminal.wait_for(f"ran {previous.isoformat()}"))
        return self.flow(**kwargs)


@pytest.mark.usefixtures("prefect_api")
def test_a_local_backfill_lists_each_date_on_the_terminal_as_it_finishes(
    sample_store: Store, terminal: Terminal, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reverie.flows.catalog import FLOWS

    stderr_on(terminal, monkeypatch)
    monkeypatch.setattr("reverie.deployments.backfill.api_configured", lambda: False)
    watched = _Watched(FLOWS["decay"], terminal)
    monkeypatch.setattr("reverie.flows.decay.decay", watched)
    report = backfill("decay", START, START + timedelta(days=2), timedelta(days=1), "maya")
    assert len(report.created) == 3
    assert watched.seen_before == [True, True]  # not all at the end
    text = terminal.settle()
    assert "backfill decay:" in text and "0/3" in text and "date/s" in text
    assert "maya" not in text


@pytest.mark.usefixtures("prefect_api")
def test_a_piped_backfill_writes_no_bar(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("reverie.deployments.backfill.api_configured", lambda: False)
    assert main(["backfill", "decay", "--from", "2025-07-01", "--to", "2025-07-02",
                 "--all", "--json"]) == EXIT_OK
    out, err = capsys.readouterr()
    assert len(json.loads(out)["created"]) == 2
    assert _no_bar(err) and "ran 2025" not in err


# --- flows run in this process ------------------------------------------------------------


@pytest.mark.usefixtures("prefect_api")
def test_a_flow_over_several_profiles_shows_them_finishing_on_the_terminal(
    sample_store: Store, terminal: Terminal, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reverie.flows.catalog import FLOWS

    stderr_on(terminal, monkeypatch)
    profiles = sample_store.profiles()
    assert len(profiles) > 1
    FLOWS["decay"](profile=None, as_of=START)
    text = terminal.settle()
    assert "decay:" in text and f"0/{len(profiles)}" in text and "profile/s" in text, text
    for name in profiles:
        assert name not in text


@pytest.mark.usefixtures("prefect_api")
def test_a_flow_with_no_terminal_or_one_profile_draws_no_bar(
    sample_store: Store, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    terminal: Terminal,
) -> None:
    from reverie.flows.catalog import FLOWS

    FLOWS["decay"](profile=None, as_of=START)
    assert _no_bar(capsys.readouterr().err)
    stderr_on(terminal, monkeypatch)
    FLOWS["decay"](profile="maya", as_of=START + timedelta(days=1))
    assert terminal.settle() == ""


# --- bench --------------------------------------------------------------------------------


def test_bench_counts_its_rows_on_the_terminal_and_prints_them_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, terminal: Terminal,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from reverie.tasks.decay import decay

    stderr_on(terminal, monkeypatch)
    monkeypatch.setattr(speed, "steps", lambda: [("decay", decay)])
    out = tmp_path / "bench.json"
    assert main(["bench", "synthetic", "--sizes", "200", "--no-flows", "--no-baseline",
                 "--ingest-sentences", "0", "--json", str(out)]) == EXIT_OK
    rows = json.loads(out.read_text())["results"]
    expected = speed.expected_rows([200], flows=False, checks=False, ingest_sentences=0)
    assert len(rows) == expected == 2
    text = terminal.settle()
    assert "bench:" in text and f"0/{expected}" in text and "row/s" in text, text
    printed = capsys.readouterr().out
    assert "decay" in printed and _no_bar(printed)


def test_expected_rows_follows_the_options() -> None:
    steps = len(speed.steps())
    assert speed.expected_rows([1000]) == 2 + 1 + 1 + steps + len(speed.FLOW_ORDER)
    assert speed.expected_rows([10, 20], embeddings="real", ingest_sentences=0,
                               flow_names=["full"], server=True) == 2 * (1 + steps + 1) + 1
    assert speed.expected_rows([10], flows=False, step_rows=False, checks=False,
                               ingest_sentences=0) == 1
