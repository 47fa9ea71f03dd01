"""Backfills without a Prefect server: one local run per date, resumable."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from deployments.backfill import backfill, dates, parse_every
from deployments.cli import EXIT_OK, main
from models.errors import ConfigError
from models.store import Store

START = datetime(2025, 7, 1)


def test_every() -> None:
    assert parse_every("1d") == timedelta(days=1)
    assert parse_every("12h") == timedelta(hours=12)
    assert parse_every(" 2w ") == timedelta(weeks=2)
    for bad in ("0d", "day", "1y", ""):
        with pytest.raises(ConfigError):
            parse_every(bad)


def test_dates_include_both_ends() -> None:
    got = list(dates(START, START + timedelta(days=6), timedelta(days=1)))
    assert len(got) == 7 and got[0] == START and got[-1] == START + timedelta(days=6)
    with pytest.raises(ConfigError):
        list(dates(START, START - timedelta(days=1), timedelta(days=1)))


@pytest.mark.usefixtures("prefect_api")
def test_a_local_backfill_of_seven_days_runs_seven_times_then_none(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("deployments.backfill.api_configured", lambda: False)
    first = backfill("decay", START, START + timedelta(days=6), timedelta(days=1), "maya")
    assert first.where == "local" and len(first.created) == 7 and first.skipped == []
    assert len(sample_store.run_history(profile="maya", flow="decay", limit=None)) == 7
    again = backfill("decay", START, START + timedelta(days=6), timedelta(days=1), "maya")
    assert again.created == [] and len(again.skipped) == 7
    # A longer range only fills what is missing.
    more = backfill("decay", START, START + timedelta(days=8), timedelta(days=1), "maya")
    assert more.created == [(START + timedelta(days=d)).isoformat() for d in (7, 8)]


@pytest.mark.usefixtures("prefect_api")
def test_backfill_from_the_cli(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("deployments.backfill.api_configured", lambda: False)
    args = ["backfill", "lightweight", "--from", "2025-07-01", "--to", "2025-07-03",
            "--profile", "raj"]
    assert main(args) == EXIT_OK
    assert "3 run(s) made, 0 date(s) already done" in capsys.readouterr().out
    assert main(args) == EXIT_OK
    assert "0 run(s) made, 3 date(s) already done" in capsys.readouterr().out
