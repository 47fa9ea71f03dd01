"""Every step plans in pure code on plain data: no ``plan_*`` function of tasks/ is
handed a store, a transaction, a session or a summarizer, so a plan can neither read
nor write nor ask a model; wording comes after the vetoes (tasks/summaries.py)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import typing

import reverie.tasks as tasks

# What planning must not be given: whatever reads, writes or words.
IMPURE = ("Store", "ProfileTx", "Session", "Summarizer", "Embedder")


def plan_functions() -> list[tuple[str, typing.Callable[..., object]]]:
    found = []
    for info in pkgutil.iter_modules(tasks.__path__, "reverie.tasks."):
        module = importlib.import_module(info.name)
        found += [(f"{info.name}.{name}", fn) for name, fn in vars(module).items()
                  if name.startswith("plan_") and inspect.isfunction(fn)
                  and fn.__module__ == module.__name__]
    return found


def test_every_step_has_plans_and_none_is_handed_anything_that_reads_writes_or_words() -> None:
    plans = plan_functions()
    assert len(plans) >= 12  # one or more per step
    impure = [
        f"{name}({parameter})"
        for name, fn in plans
        for parameter, annotation in inspect.signature(fn).parameters.items()
        if any(word in str(annotation.annotation) for word in IMPURE)
    ]
    assert impure == []


def test_steps_open_their_profile_only_as_their_run_sees_it() -> None:
    """A read without the run's horizon and as_of lets a backfill see memories of its
    future (forget's candidate read once did): steps open the store only through
    ``StepArgs.reading`` / ``StepArgs.writing``."""
    opened = []
    for info in pkgutil.iter_modules(tasks.__path__, "reverie.tasks."):
        if info.name == "reverie.tasks.step":
            continue  # where StepArgs opens it
        module = importlib.import_module(info.name)
        tree = ast.parse(inspect.getsource(module))
        opened += [
            f"{info.name}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"reading", "writing", "reading_all", "writing_all"}
            and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "args")
        ]
    assert opened == []
