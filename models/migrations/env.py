"""Alembic's environment: migrate the store the caller's connection (or the ini's URL) is on."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine
from sqlmodel import SQLModel

import reverie.models.tables  # noqa: F401 - the tables the migrations describe

target_metadata = SQLModel.metadata


def run() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
        return
    from reverie.models.settings import get_settings, resolve_database_url

    url = context.config.get_main_option("sqlalchemy.url") or get_settings().database_url
    with create_engine(resolve_database_url(url)).connect() as conn:
        _migrate(conn)
        conn.commit()


def _migrate(connection) -> None:
    # Batch mode lets SQLite, which cannot ALTER much, take column changes too.
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


run()
