"""BENCHMARKS.md is what benchmarks/report.py makes of the committed JSON, and the report
keeps each target's latest measurement, saying where a figure was carried by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from reverie.benchmarks.report import (
    PAGE,
    RESULTS,
    Bench,
    Run,
    api_targets,
    load,
    main,
    page,
    plan,
    start_targets,
    synthetic_targets,
)

pytestmark = pytest.mark.store_independent("reads committed JSON and markdown, no store")

RUN = Run("2026-11-27", "abc1234", "quiet", "reverie bench synthetic --sizes 100000", "s.json")


def synthetic(*rows: dict[str, Any]) -> dict[str, Any]:
    return {"command": RUN.command, "machine": {}, "results": list(rows)}


def carried(key: str, date: str, figure: str) -> dict[str, Any]:
    return {"carried": [{"bench": "synthetic", "key": key, "target": "t", "figure": figure,
                         "verdict": "met", "date": date, "commit": "0000000",
                         "machine": "quiet", "command": "c", "source": "the history"}]}


def test_benchmarks_md_is_what_the_committed_json_makes() -> None:
    assert PAGE.read_text(encoding="utf-8") == page(), \
        "BENCHMARKS.md differs from benchmarks/results/*.json: run `make docs`"


def test_every_results_file_is_listed_with_its_date_and_commit() -> None:
    sources = json.loads((RESULTS / "sources.json").read_text(encoding="utf-8"))
    listed = {entry["file"] for entry in sources["runs"]}
    assert listed == {p.name for p in RESULTS.glob("*.json")} - {"sources.json"}
    for entry, data in load():
        if "carried" in data:
            assert all(c["date"] and c["commit"] and c["source"] for c in data["carried"])
        else:
            assert entry["date"] and entry["commit"] and entry["machine"]


def test_a_row_with_two_targets_is_two_targets_each_with_its_verdict() -> None:
    row = {"task": "dedup", "n": 100_000, "seconds": 11.5, "recall": 0.995,
           "target": "<= 10 s; recall >= 0.99", "verdict": "missed by 1.50 s (1.2x); met"}
    found = synthetic_targets(synthetic(row, {"task": "promote", "n": 100_000, "seconds": 1.0}),
                              RUN)
    assert [(t.key, t.figure, t.verdict) for t in found] == [
        ("synthetic|dedup|100000|<= 10 s", "11.500 s", "missed by 1.50 s (1.2x)"),
        ("synthetic|dedup|100000|recall >= 0.99", "recall 0.9950", "met"),
    ]


def test_the_latest_measurement_of_a_target_wins_and_a_carried_one_says_so() -> None:
    row = {"task": "dedup", "n": 100_000, "seconds": 9.0, "recall": 1.0,
           "target": "<= 10 s; recall >= 0.99", "verdict": "met; met"}
    fresh = ({"file": "s.json", "date": "2026-11-27", "commit": "abc1234", "machine": "quiet"},
             synthetic(row))
    older = ({"file": "c.json"}, carried("synthetic|dedup|100000|<= 10 s", "2026-11-26", "12 s"))
    newer = ({"file": "d.json"},
             carried("synthetic|dedup|100000|recall >= 0.99", "2026-11-28", "recall 0.9"))
    targets, runs = plan([older, fresh, newer])
    by_key = {t.key: t for t in targets}
    assert by_key["synthetic|dedup|100000|<= 10 s"].figure == "9.000 s"
    assert not by_key["synthetic|dedup|100000|<= 10 s"].carried
    assert by_key["synthetic|dedup|100000|recall >= 0.99"].figure == "recall 0.9"
    assert by_key["synthetic|dedup|100000|recall >= 0.99"].carried
    assert [r.file for r, _ in runs] == ["s.json"]


def test_store_rows_are_one_target_with_the_range_of_shares() -> None:
    def row(clients: int, share: int) -> dict[str, Any]:
        return {"operation": "store", "memories_per_profile": 1000, "clients": clients,
                "calls": 64, "p50_ms": 1.0, "p95_ms": 2.0, "calls_per_second": 3.0,
                "sentences_per_second": 4.0, "errors": 0, "target": ">= 80% of ingest",
                "verdict": "met" if share >= 80 else f"missed ({share}%)",
                "notes": ["16 sentences per call", f"{share}% of ingest"]}

    data = {"command": "reverie bench api", "rows": [row(1, 32), row(8, 85)],
            "ingest": {"raw_model": 1000.0, "ingest": 880.0}}
    found = {t.key: t for t in api_targets(data, RUN)}
    store = found["api|store|>= 80% of ingest|16 sentences per call"]
    assert (store.figure, store.verdict) == ("32% to 85% of ingest with 1, 8 clients",
                                             "missed in 1 of 2 rows")
    assert found["ingest|>= 90% of raw model"].verdict == "missed: 88.0%"
    assert found["ingest|>= 600 sentences/s"].bench is Bench.EMBEDDING


def test_check_fails_on_a_drifted_page_and_write_mends_it(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    target = tmp_path / "BENCHMARKS.md"
    target.write_text("# stale\n", encoding="utf-8")
    assert main(["--results", str(results), "--write", str(target), "--check"]) == 1
    assert main(["--results", str(results), "--write", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == PAGE.read_text(encoding="utf-8")


def test_a_carried_synthetic_target_has_the_key_a_fresh_run_of_it_would_have() -> None:
    """So that the next `reverie bench synthetic --json` of that target replaces it."""
    from reverie.benchmarks.speed import RECALL_TARGET, TIME_TARGETS

    scheme = {f"synthetic|{task}|{n}|<= {limit:g} s" for (task, n), limit in TIME_TARGETS.items()}
    scheme |= {f"synthetic|{task}|{n}|recall >= {RECALL_TARGET}"
               for task, n in [*TIME_TARGETS, ("link_summaries", 100_000)]}
    (_, data), = [(e, d) for e, d in load() if "carried" in d]
    keys = [c["key"] for c in data["carried"]
            if any(f"|{n}|" in c["key"] for n in (10_000, 100_000))]
    assert keys and set(keys) <= scheme


def test_each_command_of_the_start_up_bench_is_a_target_with_its_ratios() -> None:
    from reverie.benchmarks.cli_start import TARGET, Sample, summarize

    row = summarize("status", [(Sample(0.9, 1.0), Sample(1.0, 1.0))] * 9, True)
    data = {"command": "python -m reverie.benchmarks.cli_start --pairs 9", "target": TARGET,
            "baseline": "b", "load_before": [1.0, 1.0, 1.0], "load_after": [1.0, 1.0, 1.0],
            "starts": [row.__dict__]}
    (found,) = start_targets(data, RUN)
    assert found.bench is Bench.START and found.key == "start|status" and found.met
    assert found.figure.startswith("CPU 0.90x (0.90-0.90), wall 1.00x (1.00-1.00)")
    assert "9 pairs" in found.figure and "`reverie status`" in found.target
