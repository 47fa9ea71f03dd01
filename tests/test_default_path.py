"""The path users take most: a run with ``as_of`` unset.

Every scheduled and event-triggered run leaves ``as_of`` unset, and so does a user who
types ``reverie consolidate full --profile maya``. The run then acts as of its
scheduled start, which Prefect hands over as its own DateTime type; a driver that looks
adapters up by exact type refused it. These tests take that path on every flow: called
from Python, from the command line, and on a real server where the scheduler itself
creates the runs and a worker executes them, and where an event triggers one.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from reverie.deployments.cli import EXIT_ERROR, EXIT_OK, main
from reverie.flows.catalog import DEPLOYMENTS, FLOWS
from reverie.models.repositories import memories as memories_repo
from reverie.models.store import Store

from factories import end_session, in_read, ingest_records, run_history
from prefect_stack import Stack, environment, sample_stack

PROFILE = "maya"


def _between(start: datetime, value: datetime, end: datetime) -> bool:
    # The run's as_of is its scheduled start, taken from Prefect's clock in whole
    # microseconds; allow a second either way for the two clocks' rounding.
    return start - timedelta(seconds=1) <= value <= end + timedelta(seconds=1)


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize("name", list(FLOWS))
def test_every_flow_runs_from_python_with_as_of_unset(
    name: str, sample_store: Store
) -> None:
    started = _now()
    report = FLOWS[name](profile=PROFILE)
    ended = _now()
    assert report.failed() == {}
    (record,) = [r for r in run_history(sample_store, PROFILE) if r.flow == FLOWS[name].name]
    assert type(record.as_of) is datetime and _between(started, record.as_of, ended)
    assert datetime.fromisoformat(report.as_of) == record.as_of


@pytest.mark.usefixtures("prefect_api")
def test_a_merging_run_with_as_of_unset_merges_and_its_dry_run_foretells_it(
    sample_store: Store,
) -> None:
    """Dedup writes an edge stamped with the run's as_of: the write that failed."""
    full = FLOWS["full"]
    preview = full(profile=PROFILE, dry_run=True)
    report = full(profile=PROFILE)
    merged = [s for s in report.steps if s.step == "dedup"]
    assert merged and merged[0].changed > 0
    assert [(s.step, s.changed) for s in preview.steps] == [
        (s.step, s.changed) for s in report.steps]
    assert in_read(sample_store, PROFILE, memories_repo.counts)["cold"] > 0


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize("argv", [
    ["consolidate", "full", "--profile", PROFILE, "--dry-run"],
    ["consolidate", "full", "--profile", PROFILE],
    ["consolidate", "lightweight", "--all"],
    ["run", "cold-notes", "--profile", PROFILE],
])
def test_the_command_line_runs_with_as_of_unset(
    argv: list[str], sample_store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == EXIT_OK, capsys.readouterr().err
    assert " as of 20" in capsys.readouterr().out


@pytest.mark.usefixtures("prefect_api")
def test_the_command_session_end_suggests_runs_as_printed(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from reverie.runner import event_delivery

    # The hint is for a user without a Prefect API (with one, a trigger runs it).
    with monkeypatch.context() as patch:
        patch.setattr(event_delivery, "api_configured", lambda: False)
        assert main(["session-end", "--profile", PROFILE]) == EXIT_OK
    printed = capsys.readouterr()
    (hint,) = re.findall(r"`(reverie consolidate [^`]+)`", printed.out + printed.err)
    assert main(shlex.split(hint)[1:]) == EXIT_OK, capsys.readouterr().err
    assert sum(1 for r in run_history(sample_store, PROFILE)
               if r.flow == FLOWS["full"].name) == 1


@pytest.mark.usefixtures("prefect_api")
def test_the_not_done_advice_of_a_run_without_as_of_works_as_printed(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from reverie.tasks import step as step_module

    real = step_module.run_step

    def fail_for_raj(name, fn, args):  # type: ignore[no-untyped-def]
        if name == "dedup" and args.profile == "raj":
            raise RuntimeError("injected")
        return real(name, fn, args)

    argv = ["consolidate", "full", "--all"]
    with monkeypatch.context() as patch:
        patch.setattr(step_module, "run_step", fail_for_raj)
        assert main(argv) == EXIT_ERROR
    err = capsys.readouterr().err
    (advice,) = set(re.findall(r"CLI: (--not-done --as-of [0-9T:.-]+)\)", err))
    assert main([*argv, *shlex.split(advice), "--json"]) == EXIT_OK, capsys.readouterr().err
    assert '"profiles": [\n    "raj"\n  ]' in capsys.readouterr().out
    assert main([*argv, *shlex.split(advice)]) == EXIT_OK
    assert "every selected profile has finished" in capsys.readouterr().out


# --- on a real server: runs the scheduler creates, and a triggered one -----------------

EVERY_MINUTE = "* * * * *"


def _every_schedule_each_minute(spec: dict[str, Any]) -> None:
    """Each deployment with a schedule runs every minute (active), with the parameters
    prefect.yaml gives it: the scheduler creates its runs, as at 03:00 it would."""
    for deployment in spec["deployments"]:
        for schedule in deployment.get("schedules", []):
            schedule["cron"] = EVERY_MINUTE
            schedule["active"] = True


# What the scheduler and triggers hand a run is Prefect's; what the store makes of an
# unset as_of is covered above on both back-ends.
SCHEDULER = pytest.mark.store_independent("Prefect's scheduler and triggers")


# The scheduler makes up to 100 runs ahead per deployment (Prefect's default): every
# minute, that is six hundred rows written into Prefect's SQLite at once, on cores the
# suite loads. Three ahead hold the same first run.
SCHEDULED_AHEAD = "3"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, sample_template: Path) -> Iterator[Stack]:
    with environment(PREFECT_SERVER_SERVICES_SCHEDULER_MAX_RUNS=SCHEDULED_AHEAD), \
            sample_stack(tmp_path_factory.mktemp("default-path"), sample_template,
                         _every_schedule_each_minute) as running:
        yield running


def _scheduled(spec_file: Path) -> list[str]:
    """flow/deployment of every deployment that has a schedule."""
    import yaml

    names = {d.split("/")[1]: d for d in DEPLOYMENTS.values()}
    spec = yaml.safe_load(spec_file.read_text())
    return sorted(names[d["name"]] for d in spec["deployments"] if d.get("schedules"))


@SCHEDULER
def test_runs_the_scheduler_creates_complete_with_as_of_unset(stack: Stack) -> None:
    from prefect.deployments import run_deployment

    from prefect_stack import RUN_SECONDS, wait_for

    scheduled = _scheduled(stack.home.parent / "prefect.yaml")
    assert "full-consolidation/nightly" in scheduled

    first: dict[str, Any] = {}

    def first_of_each() -> dict[str, Any] | None:
        for name in sorted(set(scheduled) - set(first)):
            runs = sorted((r for r in stack.runs(name.split("/")[1]) if r.auto_scheduled),
                          key=lambda r: r.expected_start_time)
            if runs and runs[0].state_type.value != "SCHEDULED":
                # Paused once its first run is under way (pausing deletes the runs still
                # Scheduled, so not before): the later minutes would only add more of
                # the same, and a pile of them locked Prefect's own SQLite in CI.
                with stack.client() as client:
                    client.pause_deployment(client.read_deployment_by_name(name).id)
                first[name] = runs[0]
        return first if len(first) == len(scheduled) else None

    wait_for(first_of_each, RUN_SECONDS, f"a run the scheduler made for each of {scheduled}",
             progress=lambda: len(first), diagnose=lambda: stack.describe_runs())
    finals = {name: stack.wait_completed(run.id) for name, run in first.items()}
    # The deployments without a schedule, run as an operator would: no parameters.
    for name in sorted(set(DEPLOYMENTS.values()) - set(scheduled)):
        run = run_deployment(name, timeout=0)
        finals[name] = stack.wait_completed(run.id)
    for name, run in finals.items():
        assert run.parameters.get("as_of") is None, name
        wanted = run.expected_start_time.astimezone(UTC).replace(tzinfo=None)
        records = [r for r in run_history(stack.store, None, limit=None)
                   if r.run_id == str(run.id)]
        assert records and {r.as_of for r in records} == {wanted}, name


@SCHEDULER
def test_a_triggered_run_with_as_of_unset_completes_and_merges(stack: Stack) -> None:
    # A profile of its own: the scheduled runs above consolidated the others already.
    profile = "default-path"
    vector = [1.0] + [0.0] * 383
    texts = ("the user likes green tea", "the user enjoys green tea", "the user loves green tea")
    ingest_records(stack.store, [{"content": t, "embedding": vector} for t in texts],
                   profile=profile)
    end_session(stack.store, profile, "s1")
    stack.deliver_events()
    (run,) = stack.wait_runs("full-at-session-end", profile, 1, ("sessions",))
    run = stack.wait_completed(run.id)
    assert run.parameters.get("as_of") is None
    assert in_read(stack.store, profile, memories_repo.counts)["cold"] == 3
