"""Schema migrations: from an empty database, and from the previous schema."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import numpy as np
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlmodel import SQLModel

from reverie.models import outbox
from reverie.models.db import MIGRATIONS, SCHEMA_HEAD, dispose, engine_for, reading, writing
from reverie.models.events import session_events
from reverie.models.repositories import memories as memories_repo
from reverie.models.settings import resolve_database_url
from reverie.models.store import Store
from reverie.models.tables import RunRecord
from reverie.models.vectors import DIMENSION, to_blob

from factories import acquire_leases, get_memory, in_read, record_runs, stored_vector

HEAD = "0008"


def test_the_schema_head_the_store_checks_is_the_newest_migration() -> None:
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    assert ScriptDirectory.from_config(config).get_current_head() == SCHEMA_HEAD == HEAD


def alembic(url: str, target: str) -> None:
    engine = create_engine(resolve_database_url(url))
    with engine.begin() as conn:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.attributes["connection"] = conn
        command.upgrade(config, target)
    engine.dispose()


def differences(url: str) -> list:
    with engine_for(url).connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)


def revision(url: str) -> str | None:
    with engine_for(url).connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def test_the_migrations_build_exactly_the_models_schema(new_store: Callable[[str], Store]) -> None:
    url = new_store("migrated", create=False).url
    alembic(url, "head")
    assert differences(url) == []


def test_a_new_store_is_created_current(new_store: Callable[[str], Store]) -> None:
    url = new_store("fresh").url
    assert revision(url) == HEAD and differences(url) == []


def test_a_store_on_the_previous_schema_is_upgraded_with_its_data(
    new_store: Callable[[str], Store],
) -> None:
    url = new_store("old", create=False).url
    alembic(url, "0001")
    engine = create_engine(resolve_database_url(url))
    with engine.begin() as conn:
        assert "lease" not in inspect(conn).get_table_names()
        conn.execute(text(
            "INSERT INTO profile (id, created_at, store_count, session_count) "
            "VALUES ('old', '2025-01-01 00:00:00', 1, 0)"
        ))
        conn.execute(text(
            "INSERT INTO memory (id, profile_id, content, content_hash, kind, importance, "
            "confidence, stability, access_count, created_at, protected, lifecycle, tier, origin) "
            "VALUES ('m-1', 'old', 'kept across the upgrade', 'h', 'semantic', 0.5, 0.5, 1.0, "
            "0, '2025-01-01 00:00:00', false, 'active', 'hot', 'ingest')"
        ))
    engine.dispose()
    store = Store(url)  # opening the store migrates it
    assert revision(url) == HEAD and differences(url) == []
    assert get_memory(store, "m-1").content == "kept across the upgrade"
    when = datetime(2025, 7, 1)
    record_runs(store, [RunRecord(profile_id="old", flow="decay", as_of=when, started_at=when,
                                 finished_at=when)])
    assert acquire_leases(store, ["old"], "me", 60) == ["old"]


def test_vectors_move_out_of_the_memory_rows_and_back(new_store: Callable[[str], Store]) -> None:
    url = new_store("vectors", create=False).url
    alembic(url, "0002")
    vector = np.linspace(-1.0, 1.0, DIMENSION, dtype=np.float32)
    vector /= np.linalg.norm(vector)
    engine = create_engine(resolve_database_url(url))
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO profile (id, created_at, store_count, session_count) "
            "VALUES ('old', '2025-01-01 00:00:00', 2, 0)"
        ))
        for mid, blob in (("m-1", to_blob(vector)), ("m-2", None)):
            conn.execute(text(
                "INSERT INTO memory (id, profile_id, content, content_hash, kind, importance, "
                "confidence, stability, access_count, created_at, protected, lifecycle, tier, "
                "origin, embedding, embedding_model) VALUES (:id, 'old', 'kept', 'h', "
                "'semantic', 0.5, 0.5, 1.0, 0, '2025-01-01 00:00:00', false, 'active', 'hot', "
                "'ingest', :blob, 'supplied')"
            ), {"id": mid, "blob": blob})
    engine.dispose()
    store = Store(url)  # opening the store migrates it
    assert revision(url) == HEAD and differences(url) == []
    (memory,), vectors = in_read(store, "old", memories_repo.snapshot)  # the memory without a vector has none
    assert memory.id == "m-1" and np.array_equal(vectors[0], vector)
    assert stored_vector(store, "m-2") is None and get_memory(store, "m-2").content == "kept"
    dispose(url)
    engine = create_engine(resolve_database_url(url))
    with engine.begin() as conn:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.attributes["connection"] = conn
        command.downgrade(config, "0002")
        rows = dict(conn.execute(text("SELECT id, embedding FROM memory")).all())
    engine.dispose()
    assert rows["m-2"] is None and np.array_equal(np.frombuffer(rows["m-1"], np.float32), vector)


def test_a_store_on_0003_gets_the_event_outbox_and_loses_it_downgraded(
    new_store: Callable[[str], Store],
) -> None:
    url = new_store("outbox", create=False).url
    alembic(url, "0003")
    engine = create_engine(resolve_database_url(url))
    with engine.begin() as conn:
        assert "event_outbox" not in inspect(conn).get_table_names()
    engine.dispose()
    Store(url)  # opening the store migrates it
    assert revision(url) == HEAD and differences(url) == []
    with writing(url) as s:
        outbox.add(s, session_events("old", "s1", 5, datetime(2025, 7, 1), 5))
        outbox.add(s, session_events("old", "s1", 5, datetime(2025, 7, 1), 5))  # kept once
    with reading(url) as s:
        assert [(p.profile, p.events) for p in outbox.pending(s)] == [("old", 2)]
    dispose(url)
    engine = create_engine(resolve_database_url(url))
    with engine.begin() as conn:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.attributes["connection"] = conn
        command.downgrade(config, "0003")
        assert "event_outbox" not in inspect(conn).get_table_names()
    engine.dispose()
