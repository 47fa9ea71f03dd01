"""`reverie bench api` at a tiny size: a real `reverie api` process, recall and store
rows for each number of clients, store judged against ingest, JSON and markdown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reverie.benchmarks.api import percentile
from reverie.deployments.cli import EXIT_OK, main


@pytest.mark.store_independent("the bench makes its own SQLite stores")
def test_percentiles() -> None:
    assert percentile([], 95) == 0.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile(list(map(float, range(101))), 95) == 95.0


@pytest.mark.slow
@pytest.mark.store_independent("the bench makes its own SQLite stores")
def test_bench_api_runs_at_a_tiny_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, table = tmp_path / "api.json", tmp_path / "api.md"
    args = ["bench", "api", "--sizes", "40", "--clients", "1,3", "--profiles", "2",
            "--requests", "6", "--store-requests", "3", "--store-batch", "2",
            "--ingest-sentences", "16", "--json", str(out), "--markdown", str(table)]
    assert main(args) == EXIT_OK
    assert "| recall | 40 | 3 |" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["command"].startswith("reverie bench api --sizes 40 --clients 1,3")
    assert set(data["ingest"]) == {"raw_model", "ingest"}
    rows = [(r["operation"], r["clients"]) for r in data["rows"]]
    assert rows == [("recall", 1), ("recall", 3), ("store", 1), ("store", 3)]
    for row in data["rows"]:
        assert row["errors"] == 0
        assert 0 < row["p50_ms"] <= row["p95_ms"]
        assert row["calls_per_second"] > 0
    store = data["rows"][-1]
    assert store["sentences_per_second"] > 0 and "of ingest" in store["notes"][-1]
    assert store["target"] == ">= 80% of ingest"
    assert table.read_text().startswith("ingest (in process):")
