"""Backfills without a Prefect server: one local run per date, resumable."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from reverie.deployments.backfill import backfill, dates, parse_every
from reverie.deployments.cli import EXIT_ERROR, EXIT_OK, main
from reverie.flows.catalog import parse_flows
from reverie.flows.decay import decay
from reverie.models.errors import ConfigError, NotFoundError
from reverie.models.store import Store
from reverie.orchestration.replay import in_schedule_order, replay, turn_key

from factories import lease_holders, run_history

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
    monkeypatch.setattr("reverie.deployments.backfill.api_configured", lambda: False)
    first = backfill("decay", START, START + timedelta(days=6), timedelta(days=1), "maya")
    assert first.where == "local" and len(first.created) == 7 and first.skipped == []
    assert len(run_history(sample_store, profile="maya", flow="decay", limit=None)) == 7
    again = backfill("decay", START, START + timedelta(days=6), timedelta(days=1), "maya")
    assert again.created == [] and len(again.skipped) == 7
    # A longer range only fills what is missing.
    more = backfill("decay", START, START + timedelta(days=8), timedelta(days=1), "maya")
    assert more.created == [(START + timedelta(days=d)).isoformat() for d in (7, 8)]


@pytest.mark.usefixtures("prefect_api")
def test_backfill_from_the_cli(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("reverie.deployments.backfill.api_configured", lambda: False)
    args = ["backfill", "lightweight", "--from", "2025-07-01", "--to", "2025-07-03",
            "--profile", "raj"]
    assert main(args) == EXIT_OK
    assert "3 run(s) made, 0 date(s) already done" in capsys.readouterr().out
    assert main(args) == EXIT_OK
    assert "0 run(s) made, 3 date(s) already done" in capsys.readouterr().out


@pytest.mark.usefixtures("prefect_api")
def test_bad_input_is_refused_before_any_run(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("reverie.deployments.backfill.api_configured", lambda: False)
    day = timedelta(days=1)
    with pytest.raises(ConfigError, match="unknown flow 'nightly'"):
        backfill("nightly", START, START, day, "maya")
    with pytest.raises(ConfigError, match="--to must not be before --from"):
        backfill("decay", START, START - day, day, "maya")
    for step in (timedelta(0), -day):
        with pytest.raises(ConfigError, match="--every must be positive"):
            backfill("decay", START, START + day, step, "maya")
    with pytest.raises(NotFoundError, match="no profile named 'nobody'"):
        backfill("decay", START, START + day, day, ["maya", "nobody"])
    with pytest.raises(ConfigError, match="more than one backfill takes"):
        backfill("decay", START, START + timedelta(days=200), timedelta(minutes=1), "maya")
    for args in (["--from", "2025-07-02", "--to", "2025-07-01"], ["--every", "-1d"],
                 ["--every", "0h"], ["--profile", "nobody"]):
        base = {"--from": "2025-07-01", "--to": "2025-07-03", "--profile": "maya"}
        base.update(dict(zip(args[::2], args[1::2], strict=True)))
        argv = ["backfill", "decay", *[f"{k}={v}" for k, v in base.items()]]
        assert main(argv) == EXIT_ERROR
    assert main(["backfill", "weekly", "--from", "2025-07-01", "--to", "2025-07-02",
                 "--profile", "maya"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "unknown flow 'weekly'" in err and "Traceback" not in err
    assert run_history(sample_store, limit=None) == []  # nothing was run, nothing half-made


@pytest.mark.usefixtures("prefect_api")
def test_a_replay_runs_its_dates_in_order_and_resumes(sample_store: Store) -> None:
    days = [START + timedelta(days=d) for d in (2, 0, 1)]
    first = replay(flow="decay", profile="maya", dates=days)
    assert first.ran == [f"decay {d.isoformat()}" for d in sorted(days)] and first.skipped == []
    history = sorted(run_history(sample_store, profile="maya", flow="decay", limit=None),
                     key=lambda r: r.started_at)
    assert [r.as_of for r in history] == sorted(days)
    assert all(a.finished_at <= b.started_at for a, b in zip(history, history[1:], strict=False))
    more = replay(flow="decay", profile="maya", dates=[*days, START + timedelta(days=3)])
    assert more.ran == [f"decay {(START + timedelta(days=3)).isoformat()}"]
    assert len(more.skipped) == 3
    assert run_history(sample_store, profile="raj", limit=None) == []  # profiles never mix


def test_several_flows_are_planned_by_date_then_in_a_days_schedule_order() -> None:
    d1, d2 = START, START + timedelta(days=1)
    asked = [("full", d2), ("full", d1), ("decay", d2), ("decay", d1), ("full", d1)]
    assert in_schedule_order(asked, set()) == [
        ("decay", d1), ("full", d1), ("decay", d2), ("full", d2)]
    assert in_schedule_order(asked, {("decay", d1), ("full", d2)}) == [
        ("full", d1), ("decay", d2)]
    assert parse_flows(" full,decay,full ") == ("decay", "full")
    for bad in ("", "decay,nightly", ","):
        with pytest.raises(ConfigError, match="unknown flow"):
            parse_flows(bad)
    # The turn's lease key fits the store's 128 characters, whatever the profile's name.
    assert turn_key("maya") == "replay:maya"
    assert len(turn_key("p" * 128)) <= 128 and turn_key("p" * 128) != turn_key("p" * 127 + "q")


@pytest.mark.usefixtures("prefect_api")
def test_a_local_backfill_of_two_flows_runs_them_date_by_date_in_schedule_order(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("reverie.deployments.backfill.api_configured", lambda: False)
    whens = [START, START + timedelta(days=1)]
    report = backfill("lightweight,decay", START, whens[-1], timedelta(days=1), "maya")
    assert report.flow == "decay,lightweight" and len(report.created) == 2
    history = sorted(run_history(sample_store, profile="maya", limit=None),
                     key=lambda r: r.started_at)
    assert [(r.as_of, r.flow) for r in history] == [
        (w, f) for w in whens for f in ("decay", "lightweight-consolidation")]
    again = backfill("decay,lightweight", START, whens[-1], timedelta(days=1), "maya")
    assert again.created == [] and len(again.skipped) == 2


@pytest.mark.usefixtures("prefect_api")
def test_a_replay_of_two_flows_interleaves_them_by_date(sample_store: Store) -> None:
    days = [START + timedelta(days=1), START]
    report = replay(flow="lightweight,decay", profile="maya", dates=days)
    assert report.ran == [f"{f} {d.isoformat()}" for d in sorted(days)
                          for f in ("decay", "lightweight")]
    assert lease_holders(sample_store) == {}  # the turn is given back


@pytest.mark.usefixtures("prefect_api")
def test_a_backfill_into_the_past_after_a_later_run_says_it_is_out_of_order(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scheduled run has already run a later date: the dates before it run after it, as
    asked, and both the replay and the backfill say which (a replay's own dates in order
    and a profile without that history are not)."""
    later = START + timedelta(days=5)
    decay(profile="maya", as_of=later)
    days = [START + timedelta(days=d) for d in (1, 0)]
    report = replay(flow="decay", profile="maya", dates=days)
    assert report.ran == [f"decay {d.isoformat()}" for d in sorted(days)]
    assert report.out_of_order == report.ran
    # On the same date, a flow the schedules run later comes after it.
    assert replay(flow="lightweight", profile="maya", dates=[later]).out_of_order == []
    after = replay(flow="decay", profile="maya", dates=[later + timedelta(days=1)])
    assert after.out_of_order == []
    assert replay(flow="decay", profile="raj", dates=days).out_of_order == []
    monkeypatch.setattr("reverie.deployments.backfill.api_configured", lambda: False)
    capsys.readouterr()
    assert main(["backfill", "decay", "--from", (START + timedelta(days=2)).isoformat(),
                 "--to", (START + timedelta(days=3)).isoformat(), "--profile", "maya",
                 "--profile", "leo-tutor"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "2 run(s) made" in out
    assert f"out of schedule order: 2 date(s) from {(START + timedelta(days=2)).isoformat()}" in out
    local = backfill("decay", START + timedelta(days=7), START + timedelta(days=8),
                     timedelta(days=1), "maya")
    assert len(local.created) == 2 and local.out_of_order == []
