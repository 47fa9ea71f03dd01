"""`reverie bench api` at a tiny size: a real `reverie api` process, recall and store
rows for each number of clients, store judged against ingest, JSON and markdown."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from reverie.benchmarks.api import DEFAULT_CLIENTS, DEFAULT_SIZES, percentile, store_texts
from reverie.benchmarks.synthetic import sentence
from reverie.deployments.cli import EXIT_OK, main


@pytest.mark.store_independent("the bench makes its own SQLite stores")
def test_percentiles() -> None:
    assert percentile([], 95) == 0.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile(list(map(float, range(101))), 95) == 95.0


@pytest.mark.store_independent("the bench makes its own SQLite stores")
def test_store_rows_send_sentences_drawn_as_ingests_are() -> None:
    """Store's share compares like with like: its sentences are drawn as ingest's (no
    text of the bench's own around them, which made them 41% longer in tokens), and
    none repeats within a size (a repeat would take its vector from the store's cache)."""
    for size in DEFAULT_SIZES:
        texts = store_texts(DEFAULT_CLIENTS, size, 64 * 16)
        every = [t for row in texts.values() for t in row]
        assert len(set(every)) == len(every) == 3 * 64 * 16
        rng = np.random.default_rng(1000 + 8 + size)
        assert texts[8] == [sentence(int(rng.integers(500)), int(rng.integers(5000)), k, rng)
                            for k in range(64 * 16)]


@pytest.mark.slow
@pytest.mark.store_independent("the bench makes its own SQLite stores")
def test_bench_api_runs_at_a_tiny_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, table = tmp_path / "api.json", tmp_path / "api.md"
    args = ["bench", "api", "--sizes", "40", "--clients", "1,3", "--profiles", "2",
            "--requests", "6", "--store-requests", "3", "--store-batch", "2",
            "--ingest-sentences", "16", "--ingest-runs", "2", "--json", str(out),
            "--markdown", str(table)]
    assert main(args) == EXIT_OK
    assert "| recall | 40 | 3 |" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["command"].startswith("reverie bench api --sizes 40 --clients 1,3")
    assert set(data["ingest"]) == {
        "raw_model", "ingest", "raw_cpu_ms_per_sentence", "ingest_cpu_ms_per_sentence",
        "sentences", "runs", "wall_ratio", "wall_ratio_min", "wall_ratio_max", "cpu_ratio",
        "cpu_ratio_min", "cpu_ratio_max", "judged_on", "target", "verdict"}
    assert (data["ingest"]["runs"], data["ingest"]["sentences"], data["workers"]) == (2, 16, 1)
    rows = [(r["operation"], r["clients"]) for r in data["rows"]]
    assert rows == [("recall", 1), ("recall", 3), ("store", 1), ("store", 3)]
    for row in data["rows"]:
        assert row["errors"] == 0
        assert 0 < row["p50_ms"] <= row["p95_ms"]
        assert row["calls_per_second"] > 0
    store = data["rows"][-1]
    assert store["sentences_per_second"] > 0 and "of ingest" in store["notes"][-1]
    assert store["server_cpu_ms_per_sentence"] > 0
    assert any(n.startswith("CPU per sentence") for n in store["notes"])
    assert store["target"] == ">= 80% of ingest"
    assert table.read_text().startswith("ingest (in process):")
    assert "verdict on the median wall ratio" in table.read_text().splitlines()[0]


@pytest.mark.slow
@pytest.mark.store_independent("the bench makes its own SQLite stores")
def test_bench_api_counts_the_cpu_of_every_worker(tmp_path: Path) -> None:
    """With `--workers 2` the model runs in the two worker processes, not in the
    supervisor the bench starts: the server's CPU must be theirs too."""
    out = tmp_path / "api.json"
    args = ["bench", "api", "--sizes", "40", "--clients", "2", "--profiles", "2",
            "--requests", "4", "--store-requests", "4", "--store-batch", "8",
            "--ingest-sentences", "0", "--workers", "2", "--json", str(out)]
    assert main(args) == EXIT_OK
    data = json.loads(out.read_text())
    assert data["workers"] == 2 and data["ingest"] == {}
    store = next(r for r in data["rows"] if r["operation"] == "store")
    assert store["errors"] == 0
    # The model alone takes about 1.3 ms of CPU per sentence here; the supervisor,
    # which only hands the socket over, a few microseconds per call.
    assert store["server_cpu_ms_per_sentence"] > 0.3
