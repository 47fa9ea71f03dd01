from datetime import datetime

import pytest

from reverie.deployments.status import Status, render
from reverie.models.store import Store
from reverie.models.tables import RunRecord

from factories import axis, ingest_records

T = datetime(2025, 7, 1)


def run(profile: str, flow: str) -> RunRecord:
    return RunRecord(profile_id=profile, flow=flow, as_of=T, started_at=T, finished_at=T,
                     examined=3, changed=2, summary={flow: {"changed": 2, "notes": []}})


def test_next_run_applies_to_the_profiles_it_covers() -> None:
    status = Status(next_runs={"decay": [(T, "other"), (datetime(2025, 7, 2), ["a", "b"])],
                               "cluster": [(T, None)]})
    assert status.next_for("decay", "a") == datetime(2025, 7, 2)
    assert status.next_for("decay", "c") is None
    assert status.next_for("cluster", "anyone") == T


def test_without_a_prefect_api_status_says_so() -> None:
    status = Status(last={"a": {"decay": run("a", "decay")}}, history=[run("a", "decay")])
    text = render(status)
    assert "(no Prefect API)" in text and "decay 2" in text
    assert "a                    decay" in text


def test_a_backfill_in_progress_is_shown_with_its_runs_done() -> None:
    from reverie.deployments.status import as_json
    from reverie.orchestration.replay import ReplayProgress

    replay = ReplayProgress("0b0e6d5e", "replay decay,full | a | ...", "Running",
                            "decay,full", "a", 3, 20)
    status = Status(last={"a": {}}, backfills=[replay])
    text = render(status)
    assert "Backfills in progress (1 replay runs):" in text
    assert "decay,full" in text and "3/20 runs done" in text and "0b0e6d5e" in text
    assert as_json(status)["backfills"] == [{
        "run_id": "0b0e6d5e", "name": "replay decay,full | a | ...", "state": "Running",
        "flow": "decay,full", "profile": "a", "done": 3, "total": 20}]
    assert "Backfills" not in render(Status(last={"a": {}}, backfills=[]))


def test_runs_that_ended_badly_are_shown_with_what_they_covered() -> None:
    from reverie.deployments.status import EndedRun, as_json

    crashed = EndedRun("9f1c", "full-consolidation", "Crashed", datetime(2025, 7, 2, 3, 4, 5),
                       None, "its process is gone: it stopped renewing its hold " * 4)
    failed = EndedRun("7a2b", "decay", "Failed", None, ["a", "b"], "boom")
    text = render(Status(last={"a": {}}, failed=[crashed, failed]))
    assert "Failed or crashed runs (Prefect, newest first):" in text
    (first, second) = [line for line in text.splitlines() if line.startswith("  ")][:2]
    assert first.startswith("  2025-07-02 03:04:05  full-consolidation")
    assert "every profile" in first and "Crashed" in first and first.endswith("…")
    assert len(first.split("9f1c  ", 1)[1]) == 120
    assert second.startswith("  ?  decay") and "a, b" in second and second.endswith("boom")
    assert as_json(Status(failed=[failed]))["failed"] == [{
        "run_id": "7a2b", "flow": "decay", "state": "Failed", "ended": None,
        "profile": ["a", "b"], "message": "boom"}]
    # Nothing ended badly, or no API to ask: no section.
    assert "Failed or crashed" not in render(Status(last={"a": {}}, failed=[]))
    assert as_json(Status())["failed"] is None


@pytest.mark.usefixtures("prefect_api")
def test_status_lists_a_crashed_run_of_the_profile_from_prefect(store: Store) -> None:
    """Found by a platform engineer: a run killed mid-way records nothing in the store,
    and ``reverie status`` showed no trace of it."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Crashed, Failed

    from reverie.deployments.status import collect

    for profile in ("maya", "raj"):
        ingest_records(store, [{"content": "a fact", "embedding": axis(0).tolist()}],
                       profile=profile)

    @flow(name="decay")
    def decay_named() -> None:  # only its name: the runs are made by hand
        pass

    with get_client(sync_client=True) as client:
        for profile, state in (("maya", Crashed(message="its process is gone")),
                               ("raj", Failed(message="boom")), ("maya", Completed())):
            client.create_flow_run(decay_named, parameters={"profile": profile}, state=state)
    maya = collect(store, "maya")
    assert maya.failed is not None
    assert [(r.state, r.profile, r.message) for r in maya.failed if r.flow == "decay"] == [
        ("Crashed", "maya", "its process is gone")]
    both = collect(store)
    assert both.failed is not None
    assert {r.profile for r in both.failed if r.flow == "decay"} == {"maya", "raj"}
