"""Statements over many rows at once: IN lists in chunks, bulk column updates, and
the collector held off while rows are built."""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from sqlalchemy import (
    ARRAY,
    Column,
    ColumnElement,
    MetaData,
    Table,
    bindparam,
    func,
    insert,
    update,
)
from sqlalchemy.engine import CursorResult, Result
from sqlalchemy.sql import Executable
from sqlalchemy.sql.elements import BindParameter
from sqlmodel import Session


def cursor_result(result: Result[Any]) -> CursorResult[Any]:
    """A statement's result as what it is: Session.execute is typed to return a Result,
    but a statement's is a CursorResult (its row count, the driver's cursor)."""
    return cast(CursorResult[Any], result)


# Ids per IN (...) clause: SQLite allows at most 32,766 bound values in a statement.
IN_CHUNK = 10_000
# Rows per bulk update statement on PostgreSQL: bounds the size of the arrays that carry
# them.
BULK_SET_CHUNK = 50_000
# Rows per multi-row INSERT on PostgreSQL.
INSERT_PAGE = 1_000


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off while many rows are built: 100k rows
    set off collections that walk the whole heap (a quarter of decay's read at 100k),
    and rows of plain values hold no cycles for them to find."""
    if not gc.isenabled():  # paused by a caller (or another thread): theirs to resume
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


T = TypeVar("T")


def chunks(values: Iterable[T]) -> Iterator[list[T]]:
    """``values`` in lists of at most IN_CHUNK, for IN clauses over whole profiles."""
    batch: list[T] = []
    for value in values:
        batch.append(value)
        if len(batch) == IN_CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch


def owned_by(table: Table, profile: str | BindParameter[str]) -> ColumnElement[bool]:
    """``table.profile_id == profile``, for a statement that also names its rows by key
    (``id IN (...)``), written so that no index serves it: SQLite, which keeps no
    statistics, otherwise reads every row of the profile through the profile's index,
    once per batch of ids (at 100k, twice the time of looking the ids up)."""
    return table.c.profile_id.concat("") == profile


def plain_rows(
    s: Session, query: Executable, params: Mapping[str, Any] | None = None
) -> list[tuple[Any, ...]]:
    """The rows of ``query`` as the driver gives them: SQLAlchemy's Row objects and
    per-value result processing took as long as SQLite's reading itself (a profile of
    100k rows with vectors, read per step). Values keep the driver's types: on SQLite a
    timestamp is text and a boolean an integer."""
    result = s.execute(query, params)
    try:
        # The DB-API's fetchall gives a list of tuples (sqlite3, psycopg2).
        return cast(list[tuple[Any, ...]], cursor_result(result).cursor.fetchall())
    finally:
        result.close()


def insert_rows(
    s: Session, table: Table, rows: Sequence[dict[str, Any]], on_conflict: str = ""
) -> None:
    """Insert plain rows, each with the same keys (column names); ``on_conflict``: an
    ``ON CONFLICT ...`` clause (SQL both SQLite and PostgreSQL read) for rows that
    exist already.

    The rows go straight to the driver, each column's values converted for it once per
    distinct value: SQLAlchemy converts every parameter of every row on its own (a JSON
    column is json.dumps'd per row, on SQLite a datetime formatted per row), which for
    the 240k edges and 22k summaries of a full run at 100k cost more than the inserts.
    SQLite takes them by executemany, PostgreSQL as multi-row VALUES (psycopg2's
    execute_values, pages of INSERT_PAGE rows)."""
    if not rows:
        return
    connection = s.connection()
    dialect = connection.dialect
    names = list(rows[0])
    columns = {name: [row[name] for row in rows] for name in names}
    for name, values in columns.items():
        process = table.c[name].type.bind_processor(dialect)
        if process is not None:
            columns[name] = _converted(values, process)
    with collector_paused():
        if dialect.name == "postgresql":
            from psycopg2.extras import execute_values

            quote = dialect.identifier_preparer
            statement = (f"INSERT INTO {quote.format_table(table)} "
                         f"({', '.join(quote.quote(n) for n in names)}) VALUES %s "
                         f"{on_conflict}")
            values = list(zip(*columns.values(), strict=True))
            # psycopg2's connection, open (the session's), whose cursor is a context manager.
            with connection.connection.dbapi_connection.cursor() as cursor:  # type: ignore[union-attr]
                execute_values(cursor, statement, values, page_size=INSERT_PAGE)
            return
        compiled = insert(table).compile(dialect=dialect, column_keys=names)
        order = [columns[name] for name in compiled.positiontup or ()]
        connection.exec_driver_sql(f"{compiled} {on_conflict}",
                                   list(zip(*order, strict=True)))


def _converted(values: list[Any], process: Any) -> list[Any]:
    """``process`` applied to each value, once per distinct hashable value (a run's
    timestamps are one or two values over all rows)."""
    done: dict[Any, Any] = {}
    # Unhashable values (a dict for a JSON column) are converted each on its own, but
    # an empty one once per type: most edges carry no metadata.
    empty: dict[type, Any] = {}
    out = []
    for value in values:
        try:
            out.append(done[value])
        except KeyError:
            done[value] = converted = process(value)
            out.append(converted)
        except TypeError:
            if value:
                out.append(process(value))
            else:
                if type(value) not in empty:
                    empty[type(value)] = process(value)
                out.append(empty[type(value)])
    return out


def bulk_set(
    s: Session, table: Table, columns: Sequence[str], rows: Sequence[Sequence[Any]],
    *where: ColumnElement[bool], expect: Sequence[str] = (),
) -> int:
    """Set ``columns`` of many rows of ``table``: each of ``rows`` is an id followed by
    the new values, in the order of ``columns``, then the values the row must still
    hold in the columns ``expect`` names (NULL matching NULL) for it to be set;
    ``where`` narrows the rows matched. Returns how many rows were set: with
    ``expect``, fewer than given means some row changed since it was read.

    Neither the driver nor SQLAlchemy handles 100k statements: on PostgreSQL the rows
    travel as one array per column and chunk; on SQLite they go to a temporary table
    joined by one UPDATE. Values must be plain scalars (no datetimes): they reach the
    driver as given."""
    if not rows:
        return 0
    keys = ["id", *columns, *(_EXPECTED + name for name in expect)]
    types = [table.c.id.type, *(table.c[name].type for name in (*columns, *expect))]
    if s.get_bind().dialect.name == "postgresql":
        return _bulk_set_postgres(s, table, columns, expect, keys, types, rows, where)
    return _bulk_set_sqlite(s, table, columns, expect, keys, types, rows, where)


# Prefix of a column that carries a value the row must still hold.
_EXPECTED = "was_"


def _bulk_update(
    table: Table, given: Any, columns: Sequence[str], expect: Sequence[str],
    where: Sequence[ColumnElement[bool]],
) -> Any:
    still = [table.c[name].is_not_distinct_from(given.c[_EXPECTED + name]) for name in expect]
    return (
        update(table).where(table.c.id == given.c.id, *where, *still)
        .values({name: given.c[name] for name in columns})
    )


def _bulk_set_postgres(
    s: Session, table: Table, columns: Sequence[str], expect: Sequence[str],
    keys: Sequence[str], types: Sequence[Any], rows: Sequence[Sequence[Any]],
    where: Sequence[ColumnElement[bool]],
) -> int:
    done = 0
    for start in range(0, len(rows), BULK_SET_CHUNK):
        chunk = rows[start:start + BULK_SET_CHUNK]
        arrays = [
            bindparam(f"a{k}", [r[k] for r in chunk], type_=ARRAY(type_))
            for k, type_ in enumerate(types)
        ]
        given = func.unnest(*arrays).table_valued(*keys).render_derived()
        updated = s.execute(_bulk_update(table, given, columns, expect, where))
        done += cursor_result(updated).rowcount
    return done


def _bulk_set_sqlite(
    s: Session, table: Table, columns: Sequence[str], expect: Sequence[str],
    keys: Sequence[str], types: Sequence[Any], rows: Sequence[Sequence[Any]],
    where: Sequence[ColumnElement[bool]],
) -> int:
    # Keyed by id (WITHOUT ROWID: the rows live in the key's B-tree), so that the UPDATE
    # looks each of the table's rows up by key. At 100k memories this took half the time
    # of the rows as one JSON parameter read through json_each.
    given = Table(
        f"bulk_{table.name}", MetaData(), Column("id", types[0], primary_key=True),
        *(Column(name, type_) for name, type_ in zip(keys[1:], types[1:], strict=True)),
        prefixes=["TEMPORARY"], sqlite_with_rowid=False,
    )
    connection = s.connection()
    given.create(connection)
    # The driver's executemany: SQLAlchemy's handling of each row's parameters took as
    # long as the UPDATE itself. OR REPLACE: an id given twice is no error (one of its
    # values is set, as before).
    fill = insert(given).prefix_with("OR REPLACE").compile(dialect=connection.dialect)
    with collector_paused():
        connection.exec_driver_sql(str(fill), [tuple(r) for r in rows])
    done = cursor_result(s.execute(_bulk_update(table, given, columns, expect, where))).rowcount
    given.drop(connection)
    return int(done)
