"""Shared fixtures: one Prefect test harness and one embedding model per session,
and a fresh store per test (the store Reverie's settings point at).

Stores are SQLite files, or with ``REVERIE_TEST_POSTGRES`` set to an admin URL of a
PostgreSQL server, fresh PostgreSQL databases. ``make test`` runs the whole suite on
SQLite, in parallel processes, then on PostgreSQL the tests that reach a store
(tests/legs.py says which, and checks that they run all of the store's code); side by
side, the legs share the tests that reach no store (``SHARED_TESTS``).
Test stacks keep Prefect's own database on PostgreSQL wherever the run has one
(prefect_database).
"""

from __future__ import annotations

import os

# One thread for PyTorch, BLAS and FAISS in every test process and what it starts, set
# before numpy or torch is imported (they read these once). `make test` runs four test
# processes on two cores; each computing with two threads, OpenMP's threads spun while
# waiting for a core another process held: the same 600 texts took 13-21 s of CPU to
# embed with two threads against 5-6 s with one, on a loaded machine. Results do not
# depend on it: tests/test_similarity.py and test_reproducible.py compare one thread
# with two, setting these for the process they start.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

# Before Prefect or sentence-transformers are imported anywhere.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# A command a test runs without a Prefect API gets Prefect's per-command server, which
# ends with it: a shared local server would outlive the test and its temporary folder.
# tests/test_local_server.py covers the shared one.
os.environ.setdefault("REVERIE_LOCAL_SERVER", "temporary")
# A command's temporary Prefect server starting on 2 cores shared by the suite's two
# processes and their children (and by other work): Prefect's 20 s is not enough there,
# so every command a test runs gets the harness's allowance.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
# Golden exports hash vectors: PyTorch's, bit for bit. OpenVINO's match them to cosine
# 0.999 but not bit for bit; tests/test_embedding_backends.py compares the two.
os.environ["REVERIE_EMBEDDING_BACKEND"] = "torch"
# Each test process (pytest-xdist runs two) gets a Prefect home of its own: the
# temporary servers commands start keep their database there, and two processes
# migrating one SQLite file lock each other out.
# A worker inherits the home its controller made: that one is made anew too.
if os.environ.get("PREFECT_HOME", "") == os.environ.get("REVERIE_TEST_PREFECT_HOME", ""):
    import tempfile

    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="reverie-test-prefect-")
    os.environ["REVERIE_TEST_PREFECT_HOME"] = os.environ["PREFECT_HOME"]

# What a run makes once and its processes (xdist's workers inherit this) share, made by
# the first that needs it: a migrated Prefect database (prefect_home) and, on
# PostgreSQL, an empty store to copy (_create_postgres_store). The process that chose
# the folder removes both at its end.
if "REVERIE_TEST_RUN_DIR" not in os.environ:
    import tempfile

    os.environ["REVERIE_TEST_RUN_DIR"] = tempfile.mkdtemp(prefix="reverie-test-run-")
    os.environ["REVERIE_TEST_RUN_OWNER"] = str(os.getpid())

import concurrent.futures
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

# The PostgreSQL leg notes which of the store's functions its tests call (tests/legs.py),
# in each test process, from before the store's code is first imported. Only where asked
# (make test): a run of some modules would rightly find functions it did not call.
if os.environ.get("REVERIE_TEST_POSTGRES") and os.environ.get("REVERIE_TEST_STORE_COVERAGE") == "1":
    from legs import StoreCalls

    STORE_CALLS: StoreCalls | None = StoreCalls().install()
else:
    STORE_CALLS = None

from reverie.demo.run import SAMPLE_STORE
from reverie.models.db import copy_profiles, dispose
from reverie.models.store import Store

from factories import ingest_file

TEST_POSTGRES = os.environ.get("REVERIE_TEST_POSTGRES")  # an admin URL, or unset
# The admin URL the tests make their PostgreSQL databases with: the PostgreSQL leg's, or
# on the SQLite leg of `make test` REVERIE_TEST_PREFECT_POSTGRES, where the stacks keep
# Prefect's own database (prefect_database); unset, every database is SQLite.
POSTGRES_ADMIN = TEST_POSTGRES or os.environ.get("REVERIE_TEST_PREFECT_POSTGRES")
# `make test`'s legs, side by side, share the tests that reach no store through this
# folder (tests/legs.py's ``claim``); unset, each leg runs its own, as alone.
SHARED_TESTS = os.environ.get("REVERIE_TEST_SHARED")
LEG = "PostgreSQL" if TEST_POSTGRES else "SQLite"
RUN_DIR = Path(os.environ["REVERIE_TEST_RUN_DIR"])


def pytest_configure(config: pytest.Config) -> None:
    # An xdist worker's environment says COLUMNS=80 (and LINES): commands that fit their
    # output to the terminal's width would print other lines than in a serial run,
    # whose output is no terminal (their fallback width, 120).
    if hasattr(config, "workerinput"):
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)
    # xdist hands out work in the order the workers collected it, which
    # pytest_collection_modifyitems makes longest first; its own reordering (by the
    # number of tests in a group) would send a lone long test last, the whole run
    # waiting on it with the other process idle.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_unconfigure(config: pytest.Config) -> None:
    home = os.environ.get("REVERIE_TEST_PREFECT_HOME")
    if home and home == os.environ.get("PREFECT_HOME"):
        shutil.rmtree(home, ignore_errors=True)
    for executor in _dropping:
        executor.shutdown(wait=True)
    if os.environ.get("REVERIE_TEST_RUN_OWNER") == str(os.getpid()):
        if POSTGRES_ADMIN:
            for kind in TEMPLATES:
                _drop_postgres_database(_postgres_url(_template_name(kind)))
        shutil.rmtree(RUN_DIR, ignore_errors=True)


# Prefect migrates a new database from empty, about 3.5 s of CPU, at every start of a
# server (or of a command's temporary one) in a home of its own: the suite does that
# some fifty times per leg. A copy of a database Prefect migrated is the same database.
MIGRATE_PREFECT_DB = (
    "import asyncio\n"
    "from prefect.server.database import provide_database_interface\n"
    "asyncio.run(provide_database_interface().create_db())\n"
)


def _migrate_prefect(**settings: str) -> None:
    """Prefect's own migration, in a process of its own, of the database ``settings``
    name (a home's SQLite, or PREFECT_API_DATABASE_CONNECTION_URL's); nothing of this
    process's Prefect API or database settings leaks into it."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_API_DATABASE", "PREFECT_API_URL"))}
    subprocess.run([sys.executable, "-c", MIGRATE_PREFECT_DB], check=True,
                   env={**env, **settings}, timeout=600, capture_output=True)


def prefect_home(home: Path) -> Path:
    """``home``, made a fresh Prefect home whose database Prefect has already migrated
    (once per run, by Prefect itself: ``create_db``, as a server's start does); a home
    that already has a database is left as it is."""
    from filelock import FileLock

    home.mkdir(parents=True, exist_ok=True)
    if (home / "prefect.db").exists():
        return home
    template = RUN_DIR / "prefect.db"
    with FileLock(f"{template}.lock"):
        if not template.exists():
            making = template.parent / "making"
            shutil.rmtree(making, ignore_errors=True)
            _migrate_prefect(PREFECT_HOME=str(making))
            # SQLite's backup: one consistent file, whatever the journal left beside it.
            source, copy = sqlite3.connect(making / "prefect.db"), sqlite3.connect(
                f"{template}.part")
            try:
                source.backup(copy)
            finally:
                source.close()
                copy.close()
            os.replace(f"{template}.part", template)
            shutil.rmtree(making, ignore_errors=True)
    shutil.copyfile(template, home / "prefect.db")
    return home


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if STORE_CALLS is None:
        return
    # This process's calls and, in xdist's controller, those its workers sent.
    called = STORE_CALLS.called
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its controller checks
        workeroutput["store_calls"] = sorted(called)
        return
    if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        return
    from legs import STORE_SOURCES, public_functions, unexercised

    functions = [f for p in STORE_SOURCES for f in public_functions(p, p.read_text())]
    missing = unexercised(functions, called)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if missing:
        if reporter is not None:
            reporter.write_sep("=", "store code no test ran on PostgreSQL", red=True)
            for name in missing:
                reporter.write_line(f"not run on PostgreSQL: {name}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif reporter is not None:
        reporter.write_line(f"every one of the store's {len(functions)} public functions "
                            "ran on PostgreSQL")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    output = getattr(node, "workeroutput", {}).get("store_calls")
    if STORE_CALLS is not None and output:
        STORE_CALLS.called.update(output)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``store`` the tests that reach the store under test (tests/legs.py): the
    PostgreSQL leg runs only those. Keep on one xdist process, in order, the tests
    that share what a module's fixture holds (a server, a stack, a store they change
    in turn); the rest spread over the processes one test at a time, the longest work
    handed out first (tests/legs.py's ``longest_first``)."""
    from legs import BackendReach, holds_shared, longest_first

    reaches = BackendReach()
    for item in items:
        if item.get_closest_marker("store") is None and _reaches_store(item, reaches):
            item.add_marker(pytest.mark.store)
        if item.get_closest_marker("xdist_group") is None and holds_shared(_fixture_defs(item)):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if hasattr(config, "workerinput"):
        items[:] = longest_first(items)
        if config.getvalue("loadgroup"):  # set on a worker by xdist for --dist loadgroup
            for item in items:
                _name_group(item)
    if not TEST_POSTGRES:
        return
    kept, dropped = [], []
    for item in items:
        on_postgres = (item.get_closest_marker("store") is not None
                       and item.get_closest_marker("store_independent") is None)
        (kept if on_postgres or _shared(item) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def _shared(item: pytest.Item) -> bool:
    """Whether the legs share this test: it reaches no store, so either runs it alike."""
    return SHARED_TESTS is not None and item.get_closest_marker("store") is None


@pytest.hookimpl(tryfirst=True)  # before its fixtures are set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    if SHARED_TESTS is not None and _shared(item):
        from legs import claim, unit_of

        owner = claim(Path(SHARED_TESTS), unit_of(item), LEG)
        if owner != LEG:
            pytest.skip(f"run by the {owner} leg, which came to it first")


def _name_group(item: pytest.Item) -> None:
    """Append a grouped test's xdist group to its node id, which is how the scheduler
    learns it. xdist 3.8 appends it to ``item._nodeid``, which pytest 9 no longer reads
    (a node id is ``item._id``): without this no group held, and each process set up
    its own copy of a module's stack or server. Once xdist's own suffix takes, the id
    ends in the group twice, which its scheduler reads the same."""
    marker = item.get_closest_marker("xdist_group")
    if marker is None or not hasattr(item, "_id"):
        return
    from _pytest.nodeid import coerce_node_id

    name = marker.args[0] if marker.args else marker.kwargs.get("name", "default")
    item._id = coerce_node_id(f"{item.nodeid}@{name}")


def _fixture_defs(item: pytest.Item) -> list[pytest.FixtureDef[object]]:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [d for name in info.names_closure for d in info.name2fixturedefs.get(name, ())]


def _reaches_store(item: pytest.Item, reaches: Callable[[object], bool]) -> bool:
    function = getattr(item, "function", None)
    if function is not None and reaches(function):
        return True
    return any(reaches(d.func) for d in _fixture_defs(item))


def _postgres_url(name: str) -> str:
    return POSTGRES_ADMIN.rsplit("/", 1)[0] + f"/{name}"  # type: ignore[union-attr]


def _as_admin(statement: str) -> None:
    """One statement on the admin URL, outside a transaction (as CREATE, ALTER and DROP
    DATABASE must run)."""
    admin = create_engine(POSTGRES_ADMIN, isolation_level="AUTOCOMMIT")  # type: ignore[arg-type]
    try:
        with admin.connect() as conn:
            conn.execute(text(statement))
    finally:
        admin.dispose()


def _create_postgres_database(template: str = "template0") -> str:
    name = f"reverie_test_{uuid.uuid4().hex[:12]}"
    # C collation: the database orders text as SQLite does (a copy keeps its template's).
    _as_admin(f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8' "
              "LC_COLLATE 'C' LC_CTYPE 'C'" if template == "template0"
              else f"CREATE DATABASE {name} TEMPLATE {template}")
    return _postgres_url(name)


def _template_name(kind: str) -> str:
    return f"reverie_{kind}_{RUN_DIR.name.rsplit('-', 1)[-1].lower()}"


# The kinds of database a run makes once and copies: an empty store, Prefect's own.
STORE_TEMPLATE, PREFECT_TEMPLATE = "tmpl", "prefect"
TEMPLATES = (STORE_TEMPLATE, PREFECT_TEMPLATE)


def _copy_of_template(kind: str, make: Callable[[str], None]) -> str:
    """A new PostgreSQL database copied from this run's template of ``kind``, which the
    first process to need it makes (``make`` fills a new empty database) and renames."""
    from filelock import FileLock

    template = _template_name(kind)
    with FileLock(str(RUN_DIR / f"postgres-{kind}.lock")):
        if not (RUN_DIR / f"postgres-{kind}").exists():
            made = _create_postgres_database()
            make(made)
            dispose(made)  # a database is copied only while nobody is connected to it
            _as_admin(f"ALTER DATABASE {made.rsplit('/', 1)[1]} RENAME TO {template}")
            (RUN_DIR / f"postgres-{kind}").write_text(template)
    return _create_postgres_database(template)


def _create_postgres_store() -> str:
    """A new PostgreSQL database holding an empty store, with an id of its own: a copy
    of one that ``Store.create`` made once per run. Creating the schema in each new
    database took about 1.2 s of the server's time, some 500 times per leg."""
    url = _copy_of_template(STORE_TEMPLATE, lambda made: Store(made).create())
    with Store(url).writing_all() as s:
        s.execute(text("UPDATE store_meta SET value = :id WHERE key = 'store_id'"),
                  {"id": uuid.uuid4().hex})
    return url


def _migrate_prefect_database(url: str) -> None:
    from reverie.deployments.serve import PREFECT_DATABASE_VARIABLE, prefect_database_url

    _migrate_prefect(**{PREFECT_DATABASE_VARIABLE: prefect_database_url(url)})


def prefect_database() -> str | None:
    """Prefect's own database for a test's stack: a new PostgreSQL database, as a
    platform runs it, already migrated (a copy of one Prefect migrated once per run);
    None (the server keeps SQLite in its home, serve's default) only where the run has
    no PostgreSQL (`make test-sqlite`). Under the load of `make test` (four test
    processes and their servers on two cores) Prefect's SQLite stayed locked for minutes:
    an automation's run-deployment action failed 503 "database is locked" through all
    its client's retries, and a triggered run was never made (CI of 3615453 on the
    PostgreSQL leg, of 1826de2 on the SQLite leg). Serve's default stays tested where a
    user meets it, one stack at a time: test_serve, test_cli's temporary servers, demo."""
    if not POSTGRES_ADMIN:
        return None
    return _copy_of_template(PREFECT_TEMPLATE, _migrate_prefect_database)


def _drop_postgres_database(url: str) -> None:
    dispose(url)
    _as_admin(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")


_dropping: list[concurrent.futures.ThreadPoolExecutor] = []


def _drop_postgres_database_soon(url: str) -> None:
    """Drop a test's database in this process's background thread: a drop waits about a
    second on the server's disk, which the next test need not wait for. This process's
    connections to it are closed first; whatever else holds one, the drop forces out.
    The process waits for its drops at its end (pytest_unconfigure)."""
    dispose(url)
    if not _dropping:
        _dropping.append(concurrent.futures.ThreadPoolExecutor(1, "drop-database"))
    _dropping[0].submit(_drop_postgres_database, url)


@pytest.fixture
def new_store(tmp_path: Path) -> Iterator[Callable[[str], Store]]:
    """Make further empty stores (SQLite files, or PostgreSQL databases), cleaned up
    after. Created (as `reverie init` does) unless ``create=False``: a bare SQLite URL,
    whose file a run or command would refuse to open."""
    made: list[str] = []

    def make(name: str, create: bool = True) -> Store:
        if TEST_POSTGRES:
            url = _create_postgres_store() if create else _create_postgres_database()
        else:
            url = f"sqlite:///{tmp_path / name}.db"
        made.append(url)
        store = Store(url)
        if create:
            store.create()
        return store

    yield make
    for url in made:
        if TEST_POSTGRES:
            _drop_postgres_database_soon(url)
        else:
            dispose(url)


def clone_sample(template: Path, store: Store) -> Store:
    """Fill an empty store with the ingested sample store (copied, not re-embedded)."""
    source = f"sqlite:///{template}"
    if store.url.startswith("sqlite"):
        dispose(store.url)
        shutil.copyfile(template, store.url.removeprefix("sqlite:///"))
        # A copied file keeps the template's store id: each clone is a store of its own.
        with store.writing_all() as s:
            s.execute(text("UPDATE store_meta SET value = :id WHERE key = 'store_id'"),
                      {"id": uuid.uuid4().hex})
    else:
        copy_profiles(source, store.url, Store(source).profiles())
    return store


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    """A temporary Prefect API for the whole session (starting one costs seconds)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def store(new_store: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch) -> Store:
    """An empty store that Reverie's settings (and so every flow) point at."""
    made = new_store("store")
    monkeypatch.setenv("REVERIE_DATABASE_URL", made.url)
    return made


@pytest.fixture(scope="session")
def sample_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled sample store, ingested once per session (embedding it costs seconds)."""
    path = tmp_path_factory.mktemp("sample") / "sample.db"
    url = f"sqlite:///{path}"
    report = ingest_file(Store(url), SAMPLE_STORE)
    assert not report.errors
    dispose(url)
    return path


@pytest.fixture
def sample_store(store: Store, sample_template: Path) -> Store:
    """A fresh copy of the ingested sample store, as the test's store."""
    return clone_sample(sample_template, store)


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """A chat-completions server on loopback that Reverie's settings point at."""
    from llm_server import FakeLLM

    server = FakeLLM()
    monkeypatch.setenv("REVERIE_LLM_BASE_URL", server.url)
    monkeypatch.setenv("REVERIE_LLM_MODEL", "test-model")
    monkeypatch.setenv("REVERIE_LLM_API_KEY", "sk-test-secret")
    monkeypatch.setenv("REVERIE_LLM_TIMEOUT_SECONDS", "0.5")
    monkeypatch.setenv("REVERIE_LLM_RETRIES", "2")
    yield server
    server.close()
