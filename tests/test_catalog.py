"""The flow catalog and prefect.yaml agree, no two deployments share a name, and a
lookup imports the flow it names alone."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import Counter

import pytest
import yaml
from typer._click.exceptions import UsageError
from typer.core import TyperGroup

from reverie.deployments.serve import project_root
from reverie.flows.catalog import (
    DEPLOYMENTS,
    ENTRIES,
    FLOW_ENTRIES,
    FLOWS,
    FlowOption,
    flow_table,
)

ROOT = project_root()
pytestmark = pytest.mark.store_independent("the registry of flows and prefect.yaml")


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
    assert entrypoints["backfill"] == "orchestration/replay.py:replay"


def test_looking_up_a_flow_imports_that_flow_alone() -> None:
    # Declaring a flow costs Prefect ~80 ms of schema building; a command runs one.
    probe = (
        "import sys, reverie.flows.catalog as c; "
        "assert not [m for m in sys.modules if m.startswith('reverie.flows.') "
        "and m not in ('reverie.flows.catalog',)], 'imported at import'; "
        "flow = c.FLOWS['decay']; "
        "others = {'reverie.flows.' + m for m in ('cluster', 'creative', 'forget', "
        "'full_consolidation', 'compress', 'cold_tier', 'cold_notes')}; "
        "print(flow.name, sorted(others & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["decay", "[]"]


# --- one registry of flows: every list of flows is made from it -----------------------------


def test_every_flow_module_is_registered_under_its_prefect_name() -> None:
    defined = {path.stem for path in (ROOT / "flows").glob("*.py")
               if "@reverie_flow(" in path.read_text(encoding="utf-8")}
    registered = {e.target.split(":")[0].rsplit(".", 1)[1] for e in FLOW_ENTRIES}
    assert registered == defined
    for entry in FLOW_ENTRIES:
        flow = FLOWS[entry.name]
        assert flow.name == entry.flow_name
        assert f"{flow.fn.__module__}:{flow.fn.__name__}" == entry.target


def test_the_cli_offers_every_flow_and_says_what_each_does() -> None:
    from reverie.deployments.cli import command

    root = command()
    consolidate, run = root.commands["consolidate"], root.commands["run"]
    assert isinstance(consolidate, TyperGroup) and isinstance(run, TyperGroup)
    assert sorted([*consolidate.commands, *run.commands]) == sorted(ENTRIES)
    for group in (consolidate, run):
        for name, flow in group.commands.items():
            entry = ENTRIES[name]
            assert flow.help == entry.summary and entry.command == group.name
            # Each flow has the options every run takes and its own, no other flow's.
            own = {f"--{use.option}" for use in entry.options}
            others = {f"--{o}" for o in FlowOption} - own
            options = {o for p in flow.params for o in p.opts}
            assert own <= options and not others & options, name
            assert {"--profile", "--all", "--as-of", "--dry-run", "--json"} <= options
    backfill = next(p for p in root.commands["backfill"].params if p.name == "flow")
    assert backfill.help is not None
    assert backfill.help.startswith(", ".join(ENTRIES) + "; or several joined by commas")


def test_replay_status_and_the_bench_name_every_flow() -> None:
    from reverie.benchmarks import speed
    from reverie.deployments.status import FLOW_NAMES
    from reverie.orchestration.replay import replay

    described = replay.parameters.properties["flow"]["description"]
    assert all(name in described for name in ENTRIES)
    assert FLOW_NAMES == tuple(e.flow_name for e in FLOW_ENTRIES)
    assert speed.FLOW_ORDER == tuple(ENTRIES)
    assert speed.FLOW_STEPS == {e.name: e.steps for e in FLOW_ENTRIES}
    assert {s for e in FLOW_ENTRIES for s in e.steps} <= {name for name, _ in speed.steps()}


def test_every_deployment_runs_a_registered_flow() -> None:
    targets = {e.target.split(":")[0].rsplit(".", 1)[1]: e for e in FLOW_ENTRIES}
    for deployment in _deployments():
        entrypoint = deployment["entrypoint"]
        module = entrypoint.split(":")[0].removeprefix("flows/").removesuffix(".py")
        assert module in targets or entrypoint == "orchestration/replay.py:replay", (
            deployment["name"])


def test_the_readme_table_is_the_registrys() -> None:
    assert flow_table() in (ROOT / "README.md").read_text(encoding="utf-8")


def test_no_module_keeps_its_own_list_of_flows() -> None:
    """A literal list, tuple or set naming three or more flows outside the registry is a
    copy that drifts (the CLI's help once left out compress, replay cold-tier)."""
    names = set(ENTRIES) | {e.flow_name for e in FLOW_ENTRIES}
    copies = []
    for folder in ("flows", "deployments", "benchmarks", "models", "tasks", "engines"):
        for path in sorted((ROOT / folder).glob("*.py")):
            if path.name == "catalog.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
                    named = {e.value for e in node.elts
                             if isinstance(e, ast.Constant) and e.value in names}
                    if len(named) >= 3:
                        copies.append(f"{folder}/{path.name}:{node.lineno}")
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    listed = {w.strip(" ()") for w in node.value.split(",")}
                    if len(listed & names) >= 3:
                        copies.append(f"{folder}/{path.name}:{node.lineno}")
    assert copies == []


# --- old names: accepted for one release --------------------------------------------------


def test_the_old_name_cold_still_runs_the_cold_notes_everywhere() -> None:
    from pydantic import TypeAdapter

    from reverie.deployments.operations import MODES, Mode, ModeName
    from reverie.flows.catalog import ALIASES, parse_flows
    from reverie.orchestration.replay import items_of

    assert ALIASES == {"cold": "cold-notes"}
    assert FLOWS["cold"] is FLOWS["cold-notes"]
    # backfill and replay read flow lists through parse_flows: a replay queued with the
    # old name before the upgrade runs, and skips, as one queued with the new.
    assert parse_flows("cold") == parse_flows("cold,cold-notes") == ("cold-notes",)
    assert parse_flows("cold,full,decay") == ("decay", "full", "cold-notes")
    assert items_of("cold", ["2025-01-01"]) == items_of("cold-notes", ["2025-01-01"])
    from reverie.deployments.cli import command

    run = command().commands["run"]
    assert isinstance(run, TyperGroup)
    for name in ("cold", "cold-notes"):
        ctx = run.make_context("run", [name, "--all", "--min-age-days", "0"])
        found, flow, rest = run.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        assert found == "cold-notes" and flow is not None
        assert flow.make_context(found, rest, parent=ctx).params["min_age_days"] == 0
    with pytest.raises(UsageError, match="invalid choice: 'colder'"):  # still refused
        run.resolve_command(ctx, ["colder", "--all"])
    assert run.help is not None and "cold: old name of cold-notes" in run.help
    backfill = next(p for p in command().commands["backfill"].params if p.name == "flow")
    assert backfill.help is not None and "cold: old name of cold-notes" in backfill.help
    # The agents' consolidate mode (API and MCP): taken, but only the new name offered.
    assert MODES[ALIASES["cold"]] == MODES["sleep"] == MODES["cold-notes"] == "cold-notes"
    assert TypeAdapter(ModeName).validate_python("cold") == "cold"
    assert "cold-notes" in {m.value for m in Mode} and "cold" not in {m.value for m in Mode}


def test_the_cold_notes_keep_the_deployment_and_flow_names_users_have() -> None:
    # Renaming the short name leaves what Prefect and the run history know untouched:
    # `prefect deployment run consolidate-cold/sleep` and past runs' flow names still hold.
    assert DEPLOYMENTS["cold-notes"] == "consolidate-cold/sleep"
    assert FLOWS["cold"].name == FLOWS["cold-notes"].name == "consolidate-cold"
    sleep = {d["name"]: d for d in _deployments()}["sleep"]
    assert sleep["entrypoint"] == "flows/cold_notes.py:consolidate_cold"
    assert DEPLOYMENTS["cold-tier"] == "cold-tier/tiering"
