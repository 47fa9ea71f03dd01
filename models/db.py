"""Engines and transactions for the memory store (SQLite by default, PostgreSQL alike).

Every transaction lets the database's failures out as the errors of ``models.errors``
(``translated``): a caller retries ``StoreRetryableError`` and reports the rest, whether
it came through the store's repositories, a backup, an export or a dry run's copy.

Two kinds of transaction: ``reading`` and ``writing``. On SQLite a writing
transaction starts with ``BEGIN IMMEDIATE`` so that two steps running concurrently
queue for the write lock instead of both reading, both trying to upgrade, and one
failing with "database is locked". Each step writes in one ``writing`` block, so a
step's changes land completely or not at all.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event, insert, inspect, select, text
from sqlalchemy import exc as db
from sqlmodel import Session, SQLModel, col

from reverie.models import tables
from reverie.models.errors import (
    IntegrityViolationError,
    InvalidValueError,
    StoreError,
    StoreMissingError,
    StoreUnavailableError,
)
from reverie.models.repositories.profiles import bump_write_seqs
from reverie.models.settings import display_url, get_settings, resolve_database_url
from reverie.models.transient import TRANSIENT_DB_ERRORS

_BEGIN_OPTION = "reverie_sqlite_begin"
STORE_ID_KEY = "store_id"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# The newest revision under migrations/versions (a test holds them equal): a store
# already there is used at once, without loading Alembic and every migration script
# (a tenth of a second of each command).
SCHEMA_HEAD = "0008"

# Every table that holds a profile's data, with the column naming the profile.
PROFILE_TABLES: tuple[tuple[type[SQLModel], str], ...] = (
    (tables.Profile, "id"),
    (tables.Memory, "profile_id"),
    (tables.MemoryVector, "memory_id"),  # a vector belongs to its memory's profile
    (tables.Edge, "profile_id"),
    (tables.CoreBlock, "profile_id"),
    (tables.Consolidation, "profile_id"),
    (tables.Tombstone, "profile_id"),
    # Steps read when decay last ran (tasks/decay.relevance_notes): a dry run must too.
    (tables.RunRecord, "profile_id"),
)


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite store; None for another back-end or an in-memory database."""
    if not is_sqlite(url) or "sqlite:///" not in url:
        return None
    path = url.split("sqlite:///", 1)[-1].split("?", 1)[0]
    if not path or path == ":memory:" or "mode=memory" in url:
        return None
    return Path(path)


def store_exists(url: str) -> bool:
    """Whether a store is there to open. Only a SQLite file can be missing: a
    PostgreSQL database is made by its operator, and a wrong one fails to connect."""
    url = resolve_database_url(url)
    path = sqlite_path(url)
    return path is None or path.is_file()


def _missing(url: str) -> StoreMissingError:
    path = sqlite_path(url)
    where = "its folder" if path is not None and not path.parent.is_dir() else "the file"
    return StoreMissingError(
        f"no store at {display_url(url)}: {where} does not exist. Check "
        "REVERIE_DATABASE_URL; `reverie init` (or `reverie ingest`) creates a new store")


def _create_engine(url: str, create: bool = False) -> Engine:
    # hide_parameters: SQLAlchemy would otherwise quote a failed statement's bound values
    # in the exception text, and those are other records' content (for a batch insert,
    # the whole batch's); errors end up on stderr, in logs and in Prefect's run state.
    if is_sqlite(url):
        path = sqlite_path(url)
        if path is not None and not path.is_file():
            # SQLite would make the file on connect: a typo in the URL would become a
            # new, empty store that runs then "complete" on. Only creating commands
            # (ingest, demo, init) make one.
            if not create:
                raise _missing(url)
            path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, connect_args={"timeout": 60, "check_same_thread": False},
            hide_parameters=True,
        )
        cache_kib = get_settings().sqlite_cache_mib * 1024

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection, _record) -> None:
            # Let SQLAlchemy's begin event, not the driver, open transactions.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA busy_timeout=60000")
            # Negative: a size in KiB, not in pages.
            cursor.execute(f"PRAGMA cache_size=-{cache_kib}")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn) -> None:
            mode = conn.get_execution_options().get(_BEGIN_OPTION, "DEFERRED")
            conn.exec_driver_sql(f"BEGIN {mode}")
    elif url.startswith("postgresql+psycopg2"):
        # Batch executemany UPDATEs too (psycopg2 would otherwise send them one by one).
        engine = create_engine(
            url, pool_pre_ping=True, executemany_mode="values_plus_batch", hide_parameters=True
        )
    else:
        engine = create_engine(url, pool_pre_ping=True, hide_parameters=True)
    migrate(engine)
    return engine


def migrate(engine: Engine) -> None:
    """Bring the store's schema to the latest revision. A new store gets the tables at
    once (and is marked current); an older one is upgraded revision by revision."""
    with engine.begin() as conn:
        current = _revision(conn)
        if current == SCHEMA_HEAD:
            return
        from alembic import command
        from alembic.config import Config

        present = set(inspect(conn).get_table_names())
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.attributes["connection"] = conn
        if current is None and "memory" not in present:
            SQLModel.metadata.create_all(conn)
            conn.execute(insert(tables.table_of(tables.StoreMeta)),
                         [{"key": STORE_ID_KEY, "value": uuid.uuid4().hex}])
            command.stamp(config, "head")
            return
        if current is None:  # made before migrations existed: find which schema it has
            command.stamp(config, "0002" if {"runrecord", "lease"} <= present else "0001")
        command.upgrade(config, "head")


def _revision(conn: Connection) -> str | None:
    if not inspect(conn).has_table("alembic_version"):
        return None
    return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def engine_for(url: str, create: bool = False) -> Engine:
    """The process-wide engine for a database URL, with the schema created. A SQLite
    store whose file does not exist is an error (``StoreMissingError``, naming the URL)
    unless ``create``: then the file (and its folder) is made."""
    url = resolve_database_url(url)
    with _engines_lock:
        if url in _engines and not store_exists(url):
            # Deleted since (a test's folder, an operator's rm): not opened again blindly.
            _engines.pop(url).dispose()
        if url not in _engines:
            _engines[url] = _create_engine(url, create)
        return _engines[url]


def create_store(url: str) -> bool:
    """Open the store at ``url``, creating it (file, folder, schema) if it is not there;
    True when it was created. Only commands that mean to create a store call this."""
    existed = store_exists(url)
    engine_for(url, create=True)
    return not existed


def read_store_id(s: Session) -> str | None:
    """The store's id, read in the caller's transaction."""
    return s.execute(
        select(col(tables.StoreMeta.value)).where(col(tables.StoreMeta.key) == STORE_ID_KEY)
    ).scalar()


def store_id(url: str) -> str:
    """The store's own id (``store_meta``): what its events name and its deployments'
    automations match."""
    with reading(url) as s:
        found = read_store_id(s)
    if found is None:  # pragma: no cover - every migrated store has one
        raise StoreError(f"the store at {display_url(url)} has no id; run `reverie init`")
    return found


def dispose(url: str) -> None:
    """Close the pooled connections of a store this process will not use again."""
    with _engines_lock:
        engine = _engines.pop(resolve_database_url(url), None)
    if engine is not None:
        engine.dispose()


@contextmanager
def reading(url: str) -> Iterator[Session]:
    """A session for reads, never committed. One block is one snapshot: REPEATABLE READ
    on PostgreSQL, whose default would let each statement see a newer state (a backup
    read table by table while a flow writes would hold its tables at different
    moments), as a SQLite read transaction is already. Reached through
    ``Store.reading_all`` / ``Store.reading``; ``copy_profiles`` below is its only other
    user."""
    with translated():
        engine = engine_for(url)
        if engine.dialect.name == "postgresql":
            engine = engine.execution_options(isolation_level="REPEATABLE READ")
        with Session(engine, expire_on_commit=False) as session:
            yield session


@contextmanager
def writing(url: str) -> Iterator[Session]:
    """One atomic transaction: committed on success, rolled back on any error."""
    with translated():
        engine = engine_for(url)
        if is_sqlite(str(engine.url)):
            engine = engine.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})
        with Session(engine, expire_on_commit=False) as session, session.begin():
            yield session


@contextmanager
def translated() -> Iterator[None]:
    """The driver's failures as the store's errors, the original kept as the cause."""
    try:
        yield
    except StoreError:
        raise
    except db.IntegrityError as exc:
        raise IntegrityViolationError(_reason(exc)) from exc
    except db.DataError as exc:
        raise InvalidValueError(_reason(exc)) from exc
    except TRANSIENT_DB_ERRORS as exc:
        raise StoreUnavailableError(_reason(exc)) from exc
    except db.DBAPIError as exc:
        if exc.connection_invalidated:
            raise StoreUnavailableError(_reason(exc)) from exc
        raise
    except db.StatementError as exc:
        # Not sent: a value a column type or the driver could not convert.
        raise InvalidValueError(_reason(exc)) from exc
    except OverflowError as exc:  # sqlite3 raises it itself for an integer beyond 64 bits
        raise InvalidValueError("a number is too large") from exc


def _reason(exc: Exception) -> str:
    """The driver's first line, without the statement (parameters are hidden already)."""
    # A pool's timeout or a disconnection carries no driver error: its class is the reason.
    orig = getattr(exc, "orig", None)
    said = str(orig).strip() if orig is not None else ""
    return said.splitlines()[0] if said else type(exc).__name__


def copy_profiles(source_url: str, target_url: str, profiles: Sequence[str]) -> None:
    """Copy every row of ``profiles`` from one store into another (empty) store.

    Dry runs execute the real steps against such a copy: the same selection code,
    and the chained effect of earlier steps, without touching the real store.
    """
    wanted = list(profiles)
    create_store(target_url)
    with reading(source_url) as src, writing(target_url) as dst:
        for table, column in PROFILE_TABLES:
            t = tables.table_of(table)
            query = select(t)
            if column == "memory_id":
                m = tables.table_of(tables.Memory)
                query = query.join(m, m.c.id == t.c.memory_id).where(m.c.profile_id.in_(wanted))
            else:
                query = query.where(t.c[column].in_(wanted))
            rows = [dict(r) for r in src.execute(query).mappings()]
            if table is tables.RunRecord:
                # The target numbers its own history: a copied id would clash with the
                # ids PostgreSQL's sequence hands out next.
                for row in rows:
                    row.pop("id", None)
            if rows:
                dst.execute(insert(t), rows)
        bump_write_seqs(dst, wanted)
