"""Statements over many rows at once: IN lists in chunks, and bulk column updates."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy import ARRAY, ColumnElement, Table, Text, bindparam, func, select, update
from sqlmodel import Session

# Ids per IN (...) clause: SQLite allows at most 32,766 bound values in a statement.
IN_CHUNK = 10_000
# Rows per bulk update statement: bounds the size of the one parameter that carries them.
BULK_SET_CHUNK = 50_000


def chunks(values: Iterable[str]) -> Iterator[list[str]]:
    """``values`` in lists of at most IN_CHUNK, for IN clauses over whole profiles."""
    batch: list[str] = []
    for value in values:
        batch.append(value)
        if len(batch) == IN_CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch


def bulk_set(
    s: Session, table: Table, columns: Sequence[str], rows: Sequence[Sequence[Any]],
    *where: ColumnElement[bool],
) -> None:
    """Set ``columns`` of many rows of ``table``: each of ``rows`` is an id followed by
    the new values, in the order of ``columns``; ``where`` narrows the rows matched.

    One statement per chunk: the rows travel as one bound parameter (a JSON array on
    SQLite, an array per column on PostgreSQL), so neither the driver nor SQLAlchemy
    handles 100k statements. Values must be JSON scalars (no datetimes)."""
    if not rows:
        return
    postgres = s.get_bind().dialect.name == "postgresql"
    keys = ["id", *columns]
    for start in range(0, len(rows), BULK_SET_CHUNK):
        chunk = rows[start:start + BULK_SET_CHUNK]
        if postgres:
            arrays = [
                bindparam(f"a{k}", [r[k] for r in chunk],
                          type_=ARRAY(table.c[name].type if k else table.c.id.type))
                for k, name in enumerate(keys)
            ]
            given = func.unnest(*arrays).table_valued(*keys).render_derived()
        else:
            data = bindparam("rows", json.dumps(list(chunk), allow_nan=False), type_=Text)
            each = func.json_each(data).table_valued("value")
            # Materialized, so that SQLite walks the given rows and looks each one up
            # by id; inlined, it may scan all given rows for every row of the profile.
            given = select(*(
                func.json_extract(each.c.value, f"$[{k}]").label(name)
                for k, name in enumerate(keys)
            )).cte("given").prefix_with("MATERIALIZED")
        s.execute(
            update(table).where(table.c.id == given.c.id, *where)
            .values({name: given.c[name] for name in columns})
        )

