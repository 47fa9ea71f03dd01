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
