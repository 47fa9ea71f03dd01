"""The `reverie` command, run in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployments.cli import EXIT_ERROR, EXIT_OK, EXIT_REJECTED, main
from deployments.demo import SAMPLE_STORE
from models.store import Store


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "memories.jsonl"
    path.write_text(
        '{"id": "t1", "content": "Ana prefers trains to planes", "kind": "preference"}\n'
        '{"id": "t2", "content": "Ana", "importance": "very"}\n'
        '{"id": "t3", "content": "Ana lives in Porto", "profile": "other"}\n',
        encoding="utf-8",
    )
    return path


def test_ingest_reports_rejected_lines_and_stores_the_rest(
    store: Store, jsonl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ingest", str(jsonl), "--profile", "ana"]) == EXIT_REJECTED
    out, err = capsys.readouterr()
    assert "stored 2" in out and "rejected 1" in out
    assert "line 2, field 'importance': expected a number, got str" in err
    assert store.profiles() == ["ana", "other"]


def test_missing_file_and_unknown_profile_are_clear_errors(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ingest", str(tmp_path / "nope.jsonl")]) == EXIT_ERROR
    assert main(["blocks", "--profile", "ghost"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "no such file" in err and "no profile named 'ghost'" in err


def test_get_recall_export_and_blocks(
    store: Store, jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["ingest", str(jsonl), "--profile", "ana"])
    capsys.readouterr()

    assert main(["get", "t1", "--json"]) == EXIT_OK
    got = json.loads(capsys.readouterr().out)
    assert got["content"] == "Ana prefers trains to planes" and got["tier"] == "hot"

    assert main(["recall", "how does Ana like to travel", "--profile", "ana", "--json"]) == EXIT_OK
    hits = json.loads(capsys.readouterr().out)
    assert hits[0]["external_id"] == "t1" and "embedding" not in hits[0]

    out_file = tmp_path / "ana.jsonl"
    assert main(["export", "--profile", "ana", "--output", str(out_file)]) == EXIT_OK
    assert [json.loads(line)["type"] for line in out_file.read_text().splitlines()] == ["memory"]

    assert main(["blocks", "--profile", "ana"]) == EXIT_OK
    assert "no blocks yet" in capsys.readouterr().out


def test_consolidate_needs_a_profile_choice(store: Store) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["consolidate", "full"])
    assert exc.value.code == 2


@pytest.mark.usefixtures("prefect_api")
def test_consolidate_dry_run_and_real_run(
    sample_store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sample_store.counts("raj")
    args = ["consolidate", "full", "--profile", "raj", "--as-of", "2025-07-01T00:00:00Z"]
    assert main([*args, "--dry-run"]) == EXIT_OK
    assert "dry run: nothing written" in capsys.readouterr().out
    assert sample_store.counts("raj") == before
    assert main([*args, "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["as_of"] == "2025-07-01T00:00:00" and not report["dry_run"]
    assert sample_store.counts("raj")["cold"] > 0
    assert main(["blocks", "--profile", "raj"]) == EXIT_OK
    assert "## user_profile" in capsys.readouterr().out


@pytest.mark.usefixtures("prefect_api")
def test_demo_ingests_the_sample_and_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REVERIE_DATABASE_URL", "sqlite:///unused.db")  # restored afterwards
    database = tmp_path / "demo.db"
    assert main(["demo", "--database", str(database)]) == EXIT_OK
    out = capsys.readouterr().out
    records = sum(1 for line in SAMPLE_STORE.read_text().splitlines() if '"type": "edge"' not in line)
    assert f"Ingested {records} memories" in out
    assert out.count("merged:") >= 8 and "top PageRank" in out and "user_profile" in out
    # Run twice, the demo starts afresh and tells the same story.
    assert main(["demo", "--database", str(database)]) == EXIT_OK
    assert capsys.readouterr().out == out
