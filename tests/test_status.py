from datetime import datetime

from reverie.deployments.status import Status, render
from reverie.models.tables import RunRecord

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
