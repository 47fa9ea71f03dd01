"""A profile's backup: every row of it, so that an operator can restore it, or move it
to another store (SQLite to PostgreSQL and back).

``reverie export`` writes one JSON line per row of each table that holds the
profile's data (``models.db.PROFILE_TABLES``: the profile's counts, memories in every
tier, vectors, edges, Core Memory blocks, the consolidation audit, tombstones and run
history), after a header naming the format::

    {"reverie_backup": 1, "profile": "maya", "tables": [...]}
    {"table": "memory", "row": {"id": "m-...", "content": "...", ...}}

Times are ISO-8601, vectors base64. ``reverie ingest`` recognises the header and
restores the rows as they were, so a second export of the restored profile is the
same file. A restore is all or nothing: its rows refer to each other (an edge to its
memories, a summary to its originals), and half a profile would break those links.
It refuses a profile the target store already has, and names every bad line and
field before writing anything.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, DateTime, LargeBinary, Table, insert, select

from reverie.models import tables
from reverie.models.db import PROFILE_TABLES, reading, writing
from reverie.models.errors import InputError, RecordError, RefusedError
from reverie.models.ids import sought_id

FORMAT = "reverie_backup"
VERSION = 1
# Errors a refused restore lists (every one is found; the message stays readable).
LISTED_ERRORS = 20
# Keys Reverie assigns itself in the target store: a restored run history row gets a
# new id there (two stores' histories would collide on theirs).
_ASSIGNED = {"runrecord": {"id"}}


def _tables() -> dict[str, tuple[Table, str]]:
    return {table.__table__.name: (table.__table__, column)  # type: ignore[attr-defined]
            for table, column in PROFILE_TABLES}


@dataclass
class RestoreReport:
    profile: str
    rows: dict[str, int] = field(default_factory=dict)


def backup_lines(url: str, profile: str) -> Iterator[str]:
    """The profile's backup, line by line (each ends with a newline), tables in the
    order a restore inserts them, rows in a stable order."""
    known = _tables()
    yield _line({FORMAT: VERSION, "profile": profile, "tables": list(known)})
    with reading(url) as s:
        for name, (table, column) in known.items():
            query = select(table)
            if column == "memory_id":  # vectors belong to their memory's profile
                memory = tables.Memory.__table__  # type: ignore[attr-defined]
                query = query.join(memory, memory.c.id == table.c.memory_id).where(
                    memory.c.profile_id == profile)
            else:
                query = query.where(table.c[column] == profile)
            query = query.order_by(*table.primary_key.columns)
            for row in s.execute(query).mappings():
                yield _line({"table": name, "row": _encode(dict(row))})


def is_backup(path: Path) -> bool:
    """Whether ``path`` starts with a backup's header (else it is memories to ingest)."""
    with path.open("rb") as handle:
        for raw in handle:
            if raw.strip():
                try:
                    first = json.loads(raw.decode("utf-8-sig"))
                except (UnicodeDecodeError, ValueError):
                    return False
                return isinstance(first, dict) and FORMAT in first
    return False


def restore(
    url: str, lines: Iterable[tuple[str, object]], expected: str | None = None
) -> RestoreReport:
    """Restore a backup (``(where, decoded line)`` pairs, the header first) into the
    store at ``url``, in one transaction; raises InputError naming every bad line and
    field (or a profile other than ``expected``), or RefusedError if the store already
    has the profile, writing nothing. Profiles are not renamed: Reverie's ids are
    derived from the profile's name."""
    items = iter(lines)
    where, header = next(items, ("line 1", None))
    if not isinstance(header, dict) or header.get(FORMAT) != VERSION:
        raise InputError(f"{where}: not a Reverie backup of format version {VERSION}")
    profile = header.get("profile")
    if not isinstance(profile, str) or not profile:
        raise RecordError(where, "profile", "must name the profile backed up")
    if expected is not None and sought_id(expected, "profile named") != profile:
        raise InputError(f"the backup is of profile {profile!r}, not {expected!r}")
    known = _tables()
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in known}
    errors: list[RecordError] = []
    for where, item in items:
        try:
            name, row = _decode(where, item, known, profile)
            rows[name].append(row)
        except RecordError as exc:
            errors.append(exc)
    if errors:
        shown = "; ".join(str(e) for e in errors[:LISTED_ERRORS])
        more = f" and {len(errors) - LISTED_ERRORS} more" if len(errors) > LISTED_ERRORS else ""
        raise InputError(f"backup of {profile!r} not restored, nothing written: {shown}{more}")
    if len(rows["profile"]) != 1:
        raise InputError(f"backup of {profile!r} not restored: it has "
                         f"{len(rows['profile'])} profile rows, not 1")
    with writing(url) as s:
        if s.get(tables.Profile, profile) is not None:
            raise RefusedError(f"the store already has a profile named {profile!r}: restore "
                             "into a store without it")
        for name, (table, _) in known.items():
            if rows[name]:
                s.execute(insert(table), rows[name])
    return RestoreReport(profile, {name: len(r) for name, r in rows.items() if r})


def _decode(
    where: str, item: object, known: dict[str, tuple[Table, str]], profile: str
) -> tuple[str, dict[str, Any]]:
    if isinstance(item, RecordError):
        raise item
    if not isinstance(item, dict) or set(item) != {"table", "row"}:
        raise RecordError(where, None, 'must be {"table": ..., "row": {...}}')
    name, raw = item["table"], item["row"]
    if name not in known:
        raise RecordError(where, "table", f"{name!r} is not one of {', '.join(known)}")
    if not isinstance(raw, dict):
        raise RecordError(where, "row", "must be an object")
    table, column = known[name]
    columns = {c.name: c for c in table.columns}
    unknown = sorted(set(raw) - set(columns))
    if unknown:
        raise RecordError(where, unknown[0], f"is not a column of {name}")
    if column != "memory_id" and raw.get(column) != profile:
        raise RecordError(where, column, f"must be the backup's profile {profile!r}")
    row: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _ASSIGNED.get(name, ()):
            continue
        kind = columns[key].type
        if value is None or isinstance(kind, JSON):
            row[key] = value
        elif isinstance(kind, DateTime):
            try:
                row[key] = datetime.fromisoformat(value)
            except (TypeError, ValueError):
                raise RecordError(where, key, "is not an ISO-8601 date-time") from None
        elif isinstance(kind, LargeBinary):
            try:
                row[key] = base64.b64decode(value, validate=True)
            except (TypeError, ValueError, binascii.Error):
                raise RecordError(where, key, "is not base64") from None
        else:
            expected = _PYTHON_TYPES.get(_python_type(kind))
            if expected is not None and not _is(value, expected[0]):
                raise RecordError(where, key, f"must be {expected[1]}")
            row[key] = value
    return name, row


# What a plain column's JSON value must be (JSON numbers may be ints for a float).
_PYTHON_TYPES: dict[type, tuple[type | tuple[type, ...], str]] = {
    str: (str, "a string"), int: (int, "an integer"), float: ((int, float), "a number"),
    bool: (bool, "true or false"),
}


def _python_type(kind: Any) -> type | None:
    try:
        return kind.python_type  # type: ignore[no-any-return]
    except NotImplementedError:  # a type SQLAlchemy does not map: left to the database
        return None


def _is(value: object, expected: type | tuple[type, ...]) -> bool:
    # JSON's true and false are Python bools, which are ints too.
    if isinstance(value, bool):
        return expected is bool
    return isinstance(value, expected)


def _encode(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, datetime):
            out[key] = value.isoformat()
        elif isinstance(value, bytes | bytearray | memoryview):
            out[key] = base64.b64encode(bytes(value)).decode("ascii")
        else:
            out[key] = value
    return out


def _line(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"
