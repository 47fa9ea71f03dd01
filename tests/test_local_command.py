"""What a local command spends beyond its work: its flow's parameters reach Prefect's API
as the JSON Prefect itself makes of them (without importing FastAPI when they are plain),
and Prefect and the flow load once with the collector off and are then frozen.

The run these change, recorded on the shared local server with its parameters and
artifacts, is checked end to end in tests/test_local_server.py."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from enum import StrEnum
from typing import Any

import pytest
from fastapi.encoders import jsonable_encoder

from reverie.flows.catalog import FLOWS
from reverie.models.config import ConsolidationConfig, preset
from reverie.runner.runtime import ReverieFlow, plain_parameters

pytestmark = pytest.mark.store_independent("how a flow's parameters are sent; imports")


class Colour(StrEnum):
    RED = "red"


PLAIN: list[dict[str, Any]] = [
    {"profile": None, "as_of": datetime(2025, 7, 1), "dry_run": False, "config": None,
     "store_id": None},
    {"profile": "maya", "as_of": datetime(2025, 7, 1, 12, 30, 5, 123456, tzinfo=UTC),
     "dry_run": True},
    {"profile": ["maya", "raj"], "as_of": datetime(2024, 2, 29, 23, 59,
                                                  tzinfo=timezone(timedelta(hours=-5)))},
    {"profile": ("a", "b"), "archive_below": 0.05, "limit": 3, "flags": [True, None, 1.5]},
    {},
]


@pytest.mark.parametrize("parameters", PLAIN)
def test_plain_parameters_are_the_json_prefect_makes_with_fastapi(
        parameters: dict[str, Any]) -> None:
    expected = {k: jsonable_encoder(v) for k, v in parameters.items()}
    assert plain_parameters(parameters) == expected
    # The same types too: an int stays an int, a tuple becomes a list.
    assert repr(plain_parameters(parameters)) == repr(expected)


@pytest.mark.parametrize("value", [
    Colour.RED, ConsolidationConfig(), {"a": 1}, [Colour.RED], [[1]], b"x",
    datetime(2025, 7, 1).date(),
])
def test_any_other_value_is_not_plain(value: object) -> None:
    assert plain_parameters({"profile": "maya", "other": value}) is None


def test_a_reverie_flow_sends_what_prefect_sends_for_plain_and_other_values() -> None:
    flow = FLOWS["full"]
    assert isinstance(flow, ReverieFlow)
    for parameters in [*PLAIN, {"profile": None, "config": preset("aggressive"),
                                "as_of": datetime(2025, 7, 1), "mode": Colour.RED}]:
        sent = flow.serialize_parameters(dict(parameters))
        prefects = super(ReverieFlow, flow).serialize_parameters(dict(parameters))
        assert repr(sent) == repr(prefects)


LOAD = """
import gc, sys
from reverie.runner.loading import first_load
assert "prefect" not in sys.modules
with first_load():
    assert not gc.isenabled()
    import prefect.flow_engine
frozen = gc.get_freeze_count()
assert gc.isenabled() and frozen > 50_000, frozen
with first_load():  # Prefect is loaded: nothing to gain, nothing frozen again
    assert gc.isenabled()
assert gc.get_freeze_count() == frozen
gc.unfreeze()
gc.disable()  # a caller's pause is left alone
with first_load():
    pass
assert not gc.isenabled() and gc.get_freeze_count() == 0
print("ok")
"""


def test_the_first_load_runs_without_the_collector_and_freezes_what_it_loaded() -> None:
    done = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_bench_judges_the_median_beyond_the_work_and_the_report_reads_it() -> None:
    from reverie.benchmarks.local_command import Variant, result_of
    from reverie.benchmarks.report import Bench, Run, local_command_targets, plan

    new = Variant("local-command", None, wall=[2.0, 2.4, 2.2], cpu=[1.8, 2.0, 1.9],
                  work=[0.4, 0.5, 0.3], load=[0.5, 0.7, 0.6])
    old = Variant("main", None, wall=[2.5, 3.0, 2.75], cpu=[2.4, 2.5, 2.5],
                  work=[0.4, 0.5, 0.3], load=[0.6, 0.8, 0.7])
    data = result_of([new, old])
    assert data["variants"][0]["beyond_median"] == 1.9  # the median of 1.6, 1.9 and 1.9
    assert data["verdict"] == "met"
    assert (data["wall_ratio_median"], data["cpu_ratio_median"]) == (0.8, 0.76)
    late = result_of([Variant("x", None, wall=[3.0], cpu=[2.0], work=[0.5], load=[1.0])])
    assert late["verdict"] == "missed by 0.50 s"

    run = Run("2026-11-27", "abc1234", "quiet", data["command"], "local-command.json")
    (target,) = local_command_targets(data, run)
    assert (target.bench, target.key, target.verdict) == (
        Bench.PLATFORM, "platform|local command", "met")
    assert target.figure.startswith("2.20 s wall (2.00-2.40) for 0.40 s of work: 1.90 s")
    assert "against main, pair by pair: wall x0.80, CPU x0.76" in target.figure
    entry = {"file": "local-command.json", "date": "2026-11-27", "commit": "abc1234",
             "machine": "quiet"}
    targets, runs = plan([(entry, data)])
    assert [t.key for t in targets] == ["platform|local command"] and len(runs) == 1
