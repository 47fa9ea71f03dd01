"""The flow catalog and prefect.yaml agree, and no two deployments share a name."""

from __future__ import annotations

from collections import Counter

import yaml

from reverie.deployments.serve import project_root
from reverie.flows.catalog import DEPLOYMENTS, FLOWS


def _deployments() -> list[dict]:
    return yaml.safe_load((project_root() / "prefect.yaml").read_text())["deployments"]


def test_deployment_names_are_unique() -> None:
    # `prefect deploy --name X` and name filters pick every deployment called X.
    names = Counter(d["name"] for d in _deployments())
    assert [n for n, count in names.items() if count > 1] == []


def test_every_catalogued_deployment_is_in_prefect_yaml_with_its_flow() -> None:
    entrypoints = {d["name"]: d["entrypoint"] for d in _deployments()}
    for short, full in DEPLOYMENTS.items():
        flow_name, deployment = full.split("/", 1)
        assert FLOWS[short].name == flow_name
        module, function = entrypoints[deployment].split(":")
        assert FLOWS[short].fn.__name__ == function and module.startswith("flows/")
    assert entrypoints["backfill"] == "flows/replay.py:replay"
