"""BENCHMARKS.md is what benchmarks/report.py makes of the committed JSON (written by the
one docs command, deployments/docs.py), and the report keeps each target's latest
measurement, saying where a figure was carried by hand; it reads every bench's JSON."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from reverie.benchmarks.report import (
    RESULTS,
    Bench,
    Run,
    api_table,
    api_targets,
    bench_of,
    load,
    locomo_targets,
    page,
    plan,
    start_targets,
    suite_targets,
    synthetic_targets,
    updates_targets,
)
from reverie.deployments.docs import benchmarks, check

pytestmark = pytest.mark.store_independent("reads committed JSON and markdown, no store")

RUN = Run("2026-11-27", "abc1234", "quiet", "reverie bench synthetic --sizes 100000", "s.json")


def synthetic(*rows: dict[str, Any]) -> dict[str, Any]:
    return {"command": RUN.command, "machine": {}, "results": list(rows)}


def carried(key: str, date: str, figure: str) -> dict[str, Any]:
    return {"carried": [{"bench": "synthetic", "key": key, "target": "t", "figure": figure,
                         "verdict": "met", "date": date, "commit": "0000000",
                         "machine": "quiet", "command": "c", "source": "the history"}]}


def test_benchmarks_md_is_what_the_committed_json_makes() -> None:
    assert check([benchmarks()]) == []


def test_every_results_file_is_listed_with_its_date_and_commit() -> None:
    sources = json.loads((RESULTS / "sources.json").read_text(encoding="utf-8"))
    listed = {entry["file"] for entry in sources["runs"]}
    assert listed == {p.name for p in RESULTS.glob("*.json")} - {"sources.json"}
    for entry, data in load():
        if "carried" in data:
            assert all(c["date"] and c["commit"] and c["source"] for c in data["carried"])
        else:
            assert entry["date"] and entry["commit"] and entry["machine"]
            assert data.get("command") or entry.get("command"), entry["file"]
            bench_of(data)  # a shape the report reads


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


def test_interleaved_ingest_runs_are_judged_on_the_median_pair_ratio() -> None:
    # The median rates give 88.9%; the pairs' median is 90.4%, and the row says which.
    rates = {"raw_model": 1500.0, "ingest": 1333.0, "raw_cpu_ms_per_sentence": 1.3,
             "ingest_cpu_ms_per_sentence": 1.35, "sentences": 4096, "runs": 3,
             "wall_ratio": 0.904, "wall_ratio_min": 0.872, "wall_ratio_max": 0.931,
             "cpu_ratio": 0.962, "cpu_ratio_min": 0.95, "cpu_ratio_max": 0.97,
             "judged_on": "median wall ratio"}
    data = {"command": "reverie bench api", "rows": [], "workers": 2, "ingest": rates}
    found = api_targets(data, RUN)[-1]
    assert found.key == "ingest|>= 90% of raw model" and found.verdict == "met"
    assert found.figure == ("90.4% (median wall ratio, 3 pairs of 4,096 sentences, "
                            "87.2%-93.1%); in CPU 96.2% (95.0%-97.0%); 1,333 sentences/s; "
                            "raw model 1,500")
    table = "\n".join(api_table(data))
    assert "ingest's rate is 90.4% of the model's in wall (87.2%-93.1%), 96.2% in CPU" in table
    assert "the verdict is on the median wall ratio" in table
    assert "`reverie api --workers 2`" in table


def test_a_stale_page_is_named_and_made_again_from_the_json(tmp_path: Path) -> None:
    shutil.copytree(RESULTS, tmp_path / "benchmarks" / "results")
    (tmp_path / "BENCHMARKS.md").write_text("# stale\n", encoding="utf-8")
    assert check([benchmarks(tmp_path)]) == [
        "BENCHMARKS.md is out of date: run `make docs` (python -m reverie.deployments.docs)"]
    (tmp_path / "BENCHMARKS.md").write_text(page(tmp_path / "benchmarks" / "results"),
                                            encoding="utf-8")
    assert check([benchmarks(tmp_path)]) == []


def locomo(**change: Any) -> dict[str, Any]:
    """A ``bench locomo --json`` of two conversations, every target met unless changed."""
    def conv(name: str, hot: tuple[int, int], chars: tuple[int, int]) -> dict[str, Any]:
        side = {"asked": 10, "recall_2000": 0.5, "recall_1000": 0.4, "deep_found": 5}
        return {"profile": name, "questions": 10, "lost": 0,
                "before": {**side, "hot": hot[0], "chars": chars[0]},
                "after": {**side, "hot": hot[1], "chars": chars[1]}}

    category = {"questions": 5, "recall_2000_before": 0.5, "recall_2000_after": 0.5,
                "recall_1000_before": 0.4, "recall_1000_after": 0.4}
    tally = {"summaries": 2, "members": 5, "members_kept_whole": 1.0, "members_whole": 5,
             "facts": 3, "facts_kept": 1.0, "facts_said": 3}
    data = {"hot_before": 200, "hot_after": 120, "chars_before": 20_000, "chars_after": 14_000,
            "recall_before": 0.5, "recall_after": 0.5, "recall_1000_before": 0.4,
            "recall_1000_after": 0.4, "deep_recall_before": 0.5, "deep_recall_after": 0.5,
            "lost": 0, "questions": 20, "budget": 2000, "summarizer": "rules",
            "as_of_offset_days": 90.0,
            "categories": {"multi-hop": dict(category), "single-hop": dict(category),
                           "temporal": {**category, "recall_2000_after": 0.1}},
            "fidelity": {"merge": {**tally, "members_kept_whole": 0.4, "members_whole": 2},
                         "compression": dict(tally)},
            "conversations": [conv("conv-1", (100, 60), (10_000, 7_000)),
                              conv("conv-2", (100, 60), (10_000, 7_000))]}
    data.update(change)
    return data


def verdicts(targets: list[Any]) -> dict[str, str]:
    """Each target's verdict by its name, the bench, summarizer and conversations set aside."""
    return {t.key.split("|", 3)[-1]: t.verdict for t in targets}


def test_locomo_targets_are_met_when_every_guarded_share_holds() -> None:
    found = locomo_targets(locomo(), RUN)
    assert {t.bench for t in found} == {Bench.LOCOMO}
    assert verdicts(found) == {"no answer lost": "met", "hot memories": "met",
                               "hot characters": "met", "fidelity|merge": "met",
                               "fidelity|compression": "met"}
    # Another set of conversations is another target, not a newer figure of this one.
    assert all(t.key.startswith("locomo|rules|conv-1, conv-2|") for t in found)


def test_a_locomo_miss_names_where_it_happened() -> None:
    data = locomo()
    data["categories"]["multi-hop"]["recall_1000_after"] = 0.3
    data["conversations"][1]["after"]["hot"] = 90  # -10% on conv-2 alone
    data |= {"hot_after": 150, "chars_after": 18_000, "lost": 1}
    data["fidelity"]["compression"] |= {"members_whole": 4, "members_kept_whole": 0.8}
    data["fidelity"]["merge"] |= {"facts_said": 2, "facts_kept": 0.6667}
    got = verdicts(locomo_targets(data, RUN))
    assert got["no answer lost"] == ("missed: multi-hop in 1,000 (0.400 -> 0.300), "
                                     "1 lost by deep recall")
    assert got["hot memories"] == "missed overall and on conv-2"
    assert got["hot characters"] == "missed overall"
    assert got["fidelity|compression"] == "missed: 0.800"
    assert got["fidelity|merge"] == "missed: 0.667"


def test_an_updates_run_is_met_only_with_every_chain_newest_and_nothing_else_lost() -> None:
    data = {"profiles": 8, "summarizer": "rules", "chains": 64, "newest": 64,
            "newest_share": 1.0, "top_newest": 64, "joined": 0, "stale_summaries": 0,
            "distractors": 64, "distractors_found": 64, "hot_before": 288, "hot_after": 145,
            "other_facts": 16, "other_facts_found": 16, "offset_days": 90.0,
            "kinds": {"amount": {"chains": 64, "newest": 64, "joined": 0}}}
    assert [t.verdict for t in updates_targets(data, RUN)] == ["met", "met"]
    stale = updates_targets(data | {"stale_summaries": 1, "other_facts_found": 15}, RUN)
    assert [t.verdict for t in stale] == ["missed: 100.0%", "missed"]
    assert [t.key for t in stale] == ["updates|rules|newest value",
                                      "updates|rules|nothing else lost"]


def test_the_suite_time_is_judged_against_30_minutes_and_a_failure_misses() -> None:
    def suite(seconds: int, failed: int = 0) -> dict[str, Any]:
        return {"command": "make test", "seconds": seconds, "side_by_side": True,
                "legs": [{"backend": "SQLite", "seconds": seconds - 30, "passed": 10,
                          "failed": failed},
                         {"backend": "PostgreSQL", "seconds": 900, "passed": 5}]}

    (met,) = suite_targets(suite(1573), RUN)
    assert (met.key, met.verdict) == ("suite|make test", "met")
    assert met.figure.startswith("26:13 (1,573 s); SQLite leg 25:43, 10 passed")
    assert suite_targets(suite(2160), RUN)[0].verdict == "missed by 6:00"
    assert suite_targets(suite(1200, failed=2), RUN)[0].verdict == "missed: 2 failed"


def test_every_bench_json_renders_its_run_table() -> None:
    targets, runs = plan(load())
    assert {bench_of(data) for _, data in runs} >= {Bench.SYNTHETIC, Bench.API, Bench.LOCOMO,
                                                     Bench.UPDATES, Bench.SUITE}
    assert not any(t.carried for t in targets
                   if t.bench in (Bench.LOCOMO, Bench.UPDATES, Bench.SUITE))
    with pytest.raises(ValueError, match="not a results file"):
        bench_of({"something": []})


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
