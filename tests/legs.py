"""Which tests the PostgreSQL leg runs, and its check that it reaches every function of
the store.

``make test`` runs the whole suite on SQLite, then on PostgreSQL only the tests whose
outcome can depend on the back-end: those that reach the suite's store factory
(``conftest._create_postgres_database`` or ``_create_postgres_store``, or a read of
``TEST_POSTGRES``), through a fixture or a helper they call by name. A test that reaches neither does the very same
thing with ``REVERIE_TEST_POSTGRES`` set or not, so running it twice tested nothing
more. The rule follows names, so a new test that takes the ``store`` fixture, or calls
``new_store_url``, is on both legs without anyone listing it; ``@pytest.mark.store``
adds a test by hand and ``@pytest.mark.store_independent(reason)`` takes one off.

When ``make test`` runs the legs side by side, the tests that reach no store are shared
between them instead (``claim``): each runs once, on the leg that comes to it first, and
the other leg skips it. The legs then end together; before, the PostgreSQL leg ended
ten minutes before the SQLite leg, which worked through those tests alone.

A name-following rule can miss a path (a helper reached through an attribute of an
object), so the PostgreSQL leg also notes each call of the store's own code in every
test process: the run fails (conftest's ``pytest_sessionfinish``) naming each public
function of ``models/store.py`` and ``models/repositories/`` that no test called there.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent
# The store's own code: what the PostgreSQL leg must run in full.
STORE_SOURCES = (PACKAGE / "models" / "store.py", *sorted(
    p for p in (PACKAGE / "models" / "repositories").glob("*.py") if p.name != "__init__.py"))
# What a test reads or calls to get a store on the back-end under test.
# (POSTGRES_ADMIN: the admin URL the suite's PostgreSQL databases are made with.)
BACKEND_NAMES = frozenset({"TEST_POSTGRES", "POSTGRES_ADMIN", "_create_postgres_database",
                           "_create_postgres_store"})


def _names(code: types.CodeType) -> set[str]:
    """Every global or attribute name a code object and its nested functions use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _is_helper(obj: object) -> bool:
    """Defined in tests/: the suite's own code, which may reach the store factory.
    Product code never reads the suite's settings, so it is not followed."""
    code = getattr(obj, "__code__", None)
    if code is not None:
        return Path(code.co_filename).resolve().parent == TESTS
    module = getattr(obj, "__file__", None) if isinstance(obj, types.ModuleType) else None
    if module is not None:
        return Path(module).resolve().parent == TESTS
    return isinstance(obj, type) and obj.__module__ in _helper_modules()


def _helper_modules() -> set[str]:
    return {p.stem for p in TESTS.glob("*.py")}


def _functions_of(obj: object) -> list[Callable[..., object]]:
    if isinstance(obj, type):
        found = []
        for value in vars(obj).values():
            value = getattr(value, "__func__", value)
            if isinstance(value, property):
                value = value.fget
            if getattr(value, "__code__", None) is not None:
                found.append(value)
        return found
    return [obj] if getattr(obj, "__code__", None) is not None else []  # type: ignore[list-item]


class BackendReach:
    """Whether a function of the suite reaches the back-end under test, by the names it
    uses, followed through the suite's own helpers (memoized: the suite has ~1,000
    tests and a few hundred helpers)."""

    def __init__(self) -> None:
        self._known: dict[types.CodeType, bool] = {}

    def __call__(self, func: Callable[..., object]) -> bool:
        func = getattr(func, "__wrapped__", func)
        code = getattr(func, "__code__", None)
        if code is None:
            return False
        if code in self._known:
            return self._known[code]
        self._known[code] = False  # a cycle reaches nothing new
        names = _names(code)
        scope: Mapping[str, object] = getattr(func, "__globals__", {})
        reached = bool(names & BACKEND_NAMES)
        if not reached:
            modules = [scope[n] for n in names
                       if isinstance(scope.get(n), types.ModuleType) and _is_helper(scope[n])]
            candidates = [scope[n] for n in names if n in scope]
            candidates += [getattr(m, n) for m in modules for n in names if hasattr(m, n)]
            # A decorated helper (a context manager, a fixture) is its own function.
            candidates = [getattr(c, "__wrapped__", c) for c in candidates]
            reached = any(self(f) for c in candidates if _is_helper(c)
                          for f in _functions_of(c))
        self._known[code] = reached
        return reached


def holds_shared(fixtures: Iterable[object]) -> bool:
    """Whether a test's fixtures hold something for its whole module (or class): a
    non-function-scoped fixture, such as a Prefect stack, an API server or a store its
    tests read and change in turn. Such a module's tests stay on one xdist process, in
    their order, which sets it up once. Session fixtures are each process's own."""
    return any(getattr(f, "scope", "function") in ("module", "class", "package")
               for f in fixtures)


# What an unmarked test and a test marked ``slow`` without ``seconds`` are taken to
# cost, for the order work is handed out in; a rough guess is enough, since only the
# few longest units must start early.
QUICK_SECONDS = 1.0
SLOW_SECONDS = 60.0


def expected_seconds(item: Any) -> float:
    """What a test is expected to take: ``@pytest.mark.slow(seconds=...)``'s estimate,
    SLOW_SECONDS for another slow test, QUICK_SECONDS for the rest."""
    marker = item.get_closest_marker("slow")
    if marker is None:
        return QUICK_SECONDS
    return float(marker.kwargs.get("seconds", SLOW_SECONDS))


def unit_of(item: Any) -> str:
    """The unit of work a test belongs to: its xdist group, or the test alone."""
    group = item.get_closest_marker("xdist_group")
    if group is None:
        return f"test {item.nodeid}"
    return f"group {group.args[0] if group.args else group.kwargs.get('name')}"


def longest_first(items: Sequence[Any]) -> list[Any]:
    """The tests in units of work (an xdist group, or one test), the unit expected to take
    longest first, each unit's tests in their order. Handed out in this order, the
    longest unit starts at once and the many short tests fill the processes' ends (a
    long test handed out last would leave the other process idle while it runs)."""
    units: dict[str, list[Any]] = {}
    for item in items:
        units.setdefault(unit_of(item), []).append(item)
    ranked = sorted(units.values(), key=lambda unit: -sum(map(expected_seconds, unit)))
    return [item for unit in ranked for item in unit]


def claim(folder: Path, unit: str, leg: str) -> str:
    """The leg that runs ``unit``: ``leg``, unless another leg claimed it first in
    ``folder`` (a folder the legs share). A link is made whole or not at all, so
    exactly one leg's claim stands, whichever reaches it first."""
    path = folder / hashlib.sha256(unit.encode()).hexdigest()
    if not path.exists():
        mine = folder / f".{path.name}.{leg}.{os.getpid()}"
        mine.write_text(leg)
        try:
            os.link(mine, path)
        except FileExistsError:
            pass
        finally:
            mine.unlink()
    return path.read_text()


@dataclass(frozen=True)
class Function:
    """A public function of the store's code: its file and its (qualified) name."""

    path: Path
    name: str

    def __str__(self) -> str:
        where = self.path.relative_to(PACKAGE) if self.path.is_relative_to(PACKAGE) else self.path
        return f"{where.as_posix()}:{self.name}"


def public_functions(path: Path, source: str) -> list[Function]:
    """The module's public functions and its public classes' public methods."""
    tree = ast.parse(source)
    found: list[Function] = []

    def add(node: ast.AST, prefix: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
            found.append(Function(path, prefix + node.name))

    for node in tree.body:
        add(node, "")
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for member in node.body:
                add(member, node.name + ".")
    return found


def unexercised(functions: Iterable[Function], called: set[str]) -> list[str]:
    """The functions not called, by their names as ``str(Function)`` writes them."""
    return [str(f) for f in functions if str(f) not in called]


def _module_name(path: Path) -> str:
    return ".".join(("reverie", *path.relative_to(PACKAGE).with_suffix("").parts))


class StoreCalls(importlib.abc.MetaPathFinder):
    """Notes which public functions of the store's code this process calls.

    Each store module, as it is first imported, has its public functions and methods
    replaced by wrappers that note their name: code that imports one by name gets the
    wrapper. A tracer (coverage) did this by line and slowed every Python call of the
    leg by a half, store code or not; a wrapper costs only the store's own calls.
    Installed before the store's code is first imported (conftest's first lines), or a
    function taken by name before then runs unnoted, and the check names it."""

    def __init__(self) -> None:
        self.called: set[str] = set()
        self._sources = {_module_name(p): p for p in STORE_SOURCES}

    def install(self) -> StoreCalls:
        already = sorted(set(self._sources) & set(sys.modules))
        if already:
            raise RuntimeError(f"the store's code was imported before its calls could be "
                               f"noted: {', '.join(already)}")
        sys.meta_path.insert(0, self)
        return self

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._sources:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _NotingLoader(spec.loader, self._note)
        return spec

    def _note(self, module: types.ModuleType) -> None:
        source = self._sources[module.__name__]
        for function in public_functions(source, source.read_text()):
            owner_name, _, method = function.name.rpartition(".")
            owner: Any = module if not owner_name else vars(module)[owner_name]
            name = method or function.name
            setattr(owner, name, self._wrapped(vars(owner)[name], str(function)))

    def _wrapped(self, member: Any, name: str) -> Any:
        if isinstance(member, property):
            return property(self._wrapped(member.fget, name), member.fset, member.fdel,
                            member.__doc__)
        if isinstance(member, staticmethod | classmethod):
            return type(member)(self._wrapped(member.__func__, name))
        if not isinstance(member, types.FunctionType):
            raise TypeError(f"{name} is a {type(member).__name__}: its calls cannot be noted")
        called = self.called

        @functools.wraps(member)
        def noted(*args: Any, **kwargs: Any) -> Any:
            called.add(name)
            return member(*args, **kwargs)

        return noted


class _NotingLoader(importlib.abc.Loader):
    """A module's own loader, then the wrapping of its functions."""

    def __init__(self, loader: importlib.abc.Loader,
                 note: Callable[[types.ModuleType], None]) -> None:
        self._loader, self._note = loader, note

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        self._note(module)

    def __getattr__(self, name: str) -> Any:  # get_source and the like, for tracebacks
        return getattr(self._loader, name)
