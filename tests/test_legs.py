"""The split of ``make test`` into its two legs (tests/legs.py): which tests reach the
store under test, and the PostgreSQL leg's check that it ran all of the store's code."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import agent_server
import pytest

import conftest
import prefect_stack
from legs import (
    PACKAGE,
    QUICK_SECONDS,
    SLOW_SECONDS,
    STORE_SOURCES,
    TESTS,
    BackendReach,
    StoreCalls,
    claim,
    expected_seconds,
    holds_shared,
    longest_first,
    public_functions,
    unexercised,
    unit_of,
)

SOURCE = '''
def read(x):
    """A docstring."""
    return x


def _private():
    return 1


class Repo:
    def write(self):
        pass

    def _hidden(self):
        pass


class _Internal:
    def ignored(self):
        pass
'''


def test_public_functions_are_module_functions_and_public_methods() -> None:
    found = public_functions(Path("/x/m.py"), SOURCE)
    assert [f.name for f in found] == ["read", "Repo.write"]


def test_a_function_is_exercised_when_it_was_called() -> None:
    found = public_functions(PACKAGE / "m.py", SOURCE)
    assert unexercised(found, {"m.py:Repo.write"}) == ["m.py:read"]
    assert unexercised(found, {"m.py:read", "m.py:Repo.write", "m.py:other"}) == []
    assert len(unexercised(found, set())) == 2


# In a process of its own: this one imported the store's code long ago.
NOTING = """
import json, sys
from legs import StoreCalls
calls = StoreCalls().install()
from reverie.models.repositories.memories import snapshot  # by name, as flows take it
from reverie.models.store import Store
store = Store("sqlite:///" + sys.argv[1])
store.create()
store.profiles()
print(json.dumps(sorted(calls.called)))
print(snapshot.__name__, snapshot.__wrapped__.__module__)
"""


def test_the_store_calls_are_noted_from_their_first_import(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", NOTING, str(tmp_path / "s.db")],
                         cwd=PACKAGE, env={**os.environ, "PYTHONPATH": str(TESTS)},
                         capture_output=True, text=True, check=True).stdout.splitlines()
    called = set(json.loads(out[0]))
    assert {"models/store.py:Store.create", "models/store.py:Store.profiles"} <= called
    assert not any("snapshot" in name for name in called)  # imported, never called
    # Taken by name before any call, it is the wrapper still.
    assert out[1] == "snapshot reverie.models.repositories.memories"


def test_the_store_calls_cannot_be_noted_once_the_store_is_imported() -> None:
    with pytest.raises(RuntimeError, match="reverie.models.store"):
        StoreCalls().install()


def test_the_store_sources_hold_the_store_and_its_repositories() -> None:
    names = {p.name for p in STORE_SOURCES}
    assert {"store.py", "memories.py", "summaries.py"} <= names
    assert all(public_functions(p, p.read_text()) for p in STORE_SOURCES)


def _via_helper() -> None:
    with prefect_stack.new_store_url(Path(".")):
        pass


def _not_via_anything() -> int:
    return len(str(Path(".")))


def test_reach_follows_names_through_the_suites_helpers() -> None:
    reaches = BackendReach()
    assert reaches(conftest._create_postgres_database)
    assert reaches(conftest.new_store)  # the fixture, through its factory
    assert reaches(prefect_stack.new_store_url)
    assert reaches(agent_server.agent_store)  # the agent servers' store, through new_store_url
    assert reaches(_via_helper)  # an attribute of a helper module
    assert not reaches(_not_via_anything)
    assert not reaches(conftest.clone_sample)  # takes a store, makes none


def test_a_test_taking_the_store_fixture_is_marked_store(request: pytest.FixtureRequest,
                                                         store: object) -> None:
    assert request.node.get_closest_marker("store") is not None


def test_a_test_taking_no_store_is_not_marked(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("store") is None


class _Fixture:
    def __init__(self, scope: str, func: object) -> None:
        self.scope, self.func = scope, func


def _server() -> Iterator[int]:
    yield 1


def _cache() -> dict[str, str]:
    return {}


def test_a_module_fixture_keeps_its_tests_together() -> None:
    # A module's store that its tests change in turn is shared as much as a server.
    assert holds_shared([_Fixture("function", _server), _Fixture("module", _server)])
    assert holds_shared([_Fixture("module", _cache)])
    assert not holds_shared([_Fixture("session", _server), _Fixture("function", _cache)])


class _Test:
    """A collected test as longest_first reads it: its id and its markers."""

    def __init__(self, nodeid: str, *marks: pytest.MarkDecorator) -> None:
        self.nodeid, self._marks = nodeid, [m.mark for m in marks]

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return next((m for m in self._marks if m.name == name), None)


def test_work_is_handed_out_longest_first_each_group_whole_and_in_order() -> None:
    group = pytest.mark.xdist_group("m.py")
    quick = [_Test(f"a.py::t{i}") for i in range(3)]
    grouped = [_Test("m.py::first", group), _Test("m.py::second", group, pytest.mark.slow)]
    slow = _Test("s.py::slow", pytest.mark.slow)
    longest = _Test("z.py::longest", pytest.mark.slow(seconds=450))
    assert [expected_seconds(t) for t in (quick[0], slow, longest)] == [
        QUICK_SECONDS, SLOW_SECONDS, 450]
    # The lone long test collected last goes first; the group (61 s) before the slow
    # test (60 s), its tests kept together in their order; quick tests last, in order.
    ordered = longest_first([*quick, grouped[0], slow, grouped[1], longest])
    assert [t.nodeid for t in ordered] == [
        "z.py::longest", "m.py::first", "m.py::second", "s.py::slow",
        "a.py::t0", "a.py::t1", "a.py::t2"]


def _claims(folder: Path, leg: str, units: int) -> list[str]:
    return [claim(folder, f"test t{i}", leg) for i in range(units)]


def test_a_unit_claimed_by_legs_racing_is_run_by_exactly_one(tmp_path: Path) -> None:
    # Four processes of each leg race for the same 300 units: each unit has one owner,
    # the one every process is told, and no claim leaves a file of its own behind.
    legs = ["SQLite", "PostgreSQL"] * 4
    with ProcessPoolExecutor(len(legs)) as pool:
        answers = list(pool.map(_claims, [tmp_path] * len(legs), legs, [300] * len(legs)))
    owners = [set(column) for column in zip(*answers, strict=True)]
    assert all(len(owner) == 1 and owner <= set(legs) for owner in owners)
    assert sorted(p.name.startswith(".") for p in tmp_path.iterdir()) == [False] * 300
    # Once owned, a unit stays its owner's, whoever asks.
    first = owners[0].pop()
    assert claim(tmp_path, "test t0", "SQLite") == claim(tmp_path, "test t0", "x") == first


def test_a_group_is_claimed_whole_and_a_lone_test_by_its_id() -> None:
    group = pytest.mark.xdist_group("m.py")
    assert unit_of(_Test("m.py::first", group)) == unit_of(_Test("m.py::second", group))
    assert unit_of(_Test("a.py::t0")) != unit_of(_Test("a.py::t1"))


def test_a_test_that_reaches_no_store_is_skipped_once_the_other_leg_claimed_it(
    tmp_path: Path,
) -> None:
    # A leg as `make test` runs it, given the shared folder, in which the other leg has
    # already claimed one test: that test is skipped, saying why; a test that reaches
    # the store always runs; a test nobody claimed runs and is claimed for this leg.
    module = "tests/test_legs.py::"
    taken = module + "test_public_functions_are_module_functions_and_public_methods"
    stored = module + "test_a_test_taking_the_store_fixture_is_marked_store"
    free = module + "test_a_function_is_exercised_when_it_was_called"
    assert claim(tmp_path, f"test {taken}", "PostgreSQL") == "PostgreSQL"
    assert claim(tmp_path, f"test {stored}", "PostgreSQL") == "PostgreSQL"
    env = {k: v for k, v in os.environ.items()
           if k not in ("REVERIE_TEST_POSTGRES", "REVERIE_TEST_STORE_COVERAGE")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-rs",
         taken, stored, free],
        cwd=PACKAGE, env={**env, "REVERIE_TEST_SHARED": str(tmp_path)},
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "2 passed, 1 skipped" in done.stdout, \
        done.stdout + done.stderr
    assert f"{taken} SKIPPED" in done.stdout
    assert f"{stored} PASSED" in done.stdout and f"{free} PASSED" in done.stdout
    assert "run by the PostgreSQL leg, which came to it first" in done.stdout
    assert claim(tmp_path, f"test {free}", "PostgreSQL") == "SQLite"
