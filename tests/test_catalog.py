"""The flow catalog and prefect.yaml agree, no two deployments share a name, and a
lookup imports the flow it names alone."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import yaml

from reverie.deployments.serve import project_root
from reverie.flows.catalog import DEPLOYMENTS, FLOWS

ROOT = project_root()


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


def test_looking_up_a_flow_imports_that_flow_alone() -> None:
    # Declaring a flow costs Prefect ~80 ms of schema building; a command runs one.
    probe = (
        "import sys, reverie.flows.catalog as c; "
        "assert not [m for m in sys.modules if m.startswith('reverie.flows.') "
        "and m not in ('reverie.flows.catalog',)], 'imported at import'; "
        "flow = c.FLOWS['decay']; "
        "others = {'reverie.flows.' + m for m in ('cluster', 'creative', 'forget', "
        "'full_consolidation', 'compress', 'cold_tier', 'consolidate_cold')}; "
        "print(flow.name, sorted(others & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["decay", "[]"]
