"""A profile's backup: every row of it, so that an operator can restore it, or move it
to another store (SQLite to PostgreSQL and back).

``reverie export`` writes one JSON line per row of each table that holds the
profile's data (``models.db.PROFILE_TABLES``: the profile's counts, memories in every
tier, vectors, edges, Core Memory blocks, the consolidation audit, tombstones and run
history), between a header naming the format and an end record that vouches for the
lines before it::

    {"profile": "maya", "reverie_backup": 2, "tables": [...]}
    {"row": {"id": "m-...", "content": "...", ...}, "table": "memory"}
    ...
    {"end": {"sha256": "...", "tables": {"memory": {"rows": 95, "sha256": "..."}, ...}}}

Times are ISO-8601, vectors base64. The end record holds the SHA-256 of every line
before it (the header included, exactly as written) and each table's row count and
SHA-256 of its lines. ``reverie ingest`` recognises the header and restores the rows as
they were, so a second export of the restored profile is the same file.

A restore is all or nothing, and refuses what it cannot vouch for, naming the line,
the table and the field, before writing anything:

- a file cut short (no end record: ``head -n`` of a backup), one that goes on after its
  end record, or one whose lines do not match the end record's counts and checksums
  (edited, damaged, spliced from another backup);
- a row that fails the checks ingest makes (``models.validation``; a vector must be
  what ingest stores: 384 float32 numbers, finite, not zero, unit length, see
  ``models.vectors.check_stored``), or that refers to a memory the backup does not
  hold (a vector, an edge, an audit row, a superseded memory; the audit and
  ``superseded_by`` may name a tombstone of the backup instead, and an undone
  consolidation's summary is gone by design);
- two rows with the same key, or a row whose key the target store already has (its
  own profile of that name included).

The checksums prove a backup whole against accidents, not against someone who
rewrites them: that is why every row is checked as well.

Format version 1 (before the end record) is refused, with no flag to let it through: a
cut v1 file cannot be told from a whole one, and restoring half a profile as if whole
is the failure this format exists to prevent. Export the profile again (format 2); if
the v1 file is all that is left, restore it with the release that wrote it and export
it from there.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, DateTime, LargeBinary, Table, UniqueConstraint, insert, select, tuple_
from sqlalchemy.types import TypeDecorator
from sqlmodel import Session

from reverie.models import ids, tables
from reverie.models.db import PROFILE_TABLES
from reverie.models.errors import InputError, RecordError, RefusedError
from reverie.models.ids import PROFILE_NAME
from reverie.models.repositories.bulk import chunks
from reverie.models.repositories.profiles import bump_write_seqs
from reverie.models.store import Store
from reverie.models.text import clean_text
from reverie.models.timestamps import in_record_range
from reverie.models.validation import (
    check_edge_row,
    check_json_value,
    check_memory_row,
    decode_json,
    decode_utf8,
)

FORMAT = "reverie_backup"
VERSION = 2
END = "end"  # the end record's one key
# Errors a refused restore lists (every one is found; the message stays readable).
LISTED_ERRORS = 20
# Keys Reverie assigns itself in the target store: a restored run history row gets a
# new id there (two stores' histories would collide on theirs).
_ASSIGNED = {"runrecord": {"id"}}
# Every whole-number column is an INTEGER, 32 bits on PostgreSQL: a larger value only
# SQLite keeps would make the backup move one way only.
_INT_RANGE = (-(2**31), 2**31 - 1)


# Counts of one store's writes, not what the profile holds: a restore starts them afresh
# (the column's default, then the restore's own write), and a backup of the restored
# profile is the same bytes as the one it came from.
_UNSAVED = {"profile": ("write_seq",)}


def _tables() -> dict[str, tuple[Table, str]]:
    return {tables.table_of(table).name: (tables.table_of(table), column)
            for table, column in PROFILE_TABLES}


@dataclass
class RestoreReport:
    profile: str
    rows: dict[str, int] = field(default_factory=dict)


@dataclass
class RestorePlan:
    """A backup that passed every check that needs no store: its rows by table, each
    with the place it came from ("line N (table T)")."""

    profile: str
    rows: dict[str, list[tuple[str, dict[str, Any]]]]


class _Digest:
    """What an end record vouches for: the SHA-256 of every line before it, and each
    table's row count and SHA-256 of its lines. The writer and the reader both keep
    one, so they cannot disagree on what is hashed."""

    def __init__(self, names: Iterable[str]) -> None:
        self.whole = hashlib.sha256()
        self.tables = {name: (0, hashlib.sha256()) for name in names}
        self.spans: dict[str, tuple[int, int]] = {}  # first and last line, for messages

    def add(self, data: bytes, table: str | None = None, number: int = 0) -> None:
        self.whole.update(data)
        if table in self.tables:
            rows, digest = self.tables[table]
            digest.update(data)
            self.tables[table] = (rows + 1, digest)
            self.spans[table] = (self.spans.get(table, (number, number))[0], number)

    def record(self) -> dict[str, Any]:
        return {"sha256": self.whole.hexdigest(),
                "tables": {name: {"rows": rows, "sha256": digest.hexdigest()}
                           for name, (rows, digest) in self.tables.items()}}


def backup_lines(url: str, profile: str) -> Iterator[str]:
    """The profile's backup, line by line (each ends with a newline), tables in the
    order a restore inserts them, rows in a stable order, the end record last."""
    known = _tables()
    digest = _Digest(known)
    header = _line({FORMAT: VERSION, "profile": profile, "tables": list(known)})
    digest.add(header.encode("utf-8"))
    yield header
    with Store(url).reading_all() as s:
        for name, (table, column) in known.items():
            query = select(table)
            if column == "memory_id":  # vectors belong to their memory's profile
                memory = tables.table_of(tables.Memory)
                query = query.join(memory, memory.c.id == table.c.memory_id).where(
                    memory.c.profile_id == profile)
            else:
                query = query.where(table.c[column] == profile)
            query = query.order_by(*table.primary_key.columns)
            for found in s.execute(query).mappings():
                row = {k: v for k, v in found.items() if k not in _UNSAVED.get(name, ())}
                line = _line({"table": name, "row": _encode(row)})
                digest.add(line.encode("utf-8"), name)
                yield line
    yield _line({END: digest.record()})


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


def restore_file(url: str, path: Path, expected: str | None = None) -> RestoreReport:
    """Restore the backup in ``path``: see ``restore``."""
    with path.open("rb") as handle:
        return restore(url, handle, expected)


def restore(
    url: str, lines: Iterable[bytes | str], expected: str | None = None
) -> RestoreReport:
    """Restore a backup, given as its lines exactly as written (bytes from a file opened
    in binary, or ``backup_lines``' strings; newlines kept), into the store at ``url``
    in one transaction. Raises InputError naming every bad line, table and field (or a
    profile other than ``expected``), or RefusedError if the store already has the
    profile or a row's key, writing nothing. Profiles are not renamed: Reverie's ids are
    derived from the profile's name."""
    return _write(url, plan_restore(lines, expected))


def plan_restore(lines: Iterable[bytes | str], expected: str | None = None) -> RestorePlan:
    """Every check of a restore that needs no store (see the module's docstring);
    raises InputError listing what is wrong."""
    known = _tables()
    numbered = enumerate(lines, start=1)
    first = next(numbered, None)
    if first is None:
        raise InputError("line 1: not a Reverie backup: the file is empty")
    header_raw = _bytes(first[1])
    profile = _header(header_raw, known, expected)
    digest = _Digest(known)
    digest.add(header_raw)

    items: list[tuple[str, object]] = []
    end: tuple[str, object, bytes] | None = None
    after_end: str | None = None
    last = 1
    for number, line in numbered:
        where, last = f"line {number}", number
        if end is not None:
            after_end = after_end or where
            continue
        raw = _bytes(line)
        text = decode_utf8(raw, where)
        item = text if isinstance(text, RecordError) else (
            decode_json(text, where) if text.strip() else None)
        if isinstance(item, dict) and set(item) == {END}:
            end = (where, item[END], raw)
            continue
        table = item.get("table") if isinstance(item, dict) else None
        digest.add(raw, table if isinstance(table, str) else None, number)
        if item is not None:
            items.append((where, item))

    errors = _unvouched(digest, end, after_end, last)
    rows: dict[str, list[tuple[str, dict[str, Any]]]] = {name: [] for name in known}
    for where, item in items:
        try:
            name, at, row = _decode(where, item, known, profile)
            rows[name].append((at, row))
        except RecordError as exc:
            errors.append(exc)
    # Across rows only once the file is whole and each row sound: a missing line would
    # otherwise show up as dangling references everywhere after it.
    if not errors:
        errors = _across_rows(rows, known)
    if errors:
        raise InputError(_refusal(profile, errors))
    return RestorePlan(profile, rows)


def _header(raw: bytes, known: dict[str, tuple[Table, str]], expected: str | None) -> str:
    decoded = decode_utf8(raw, "line 1")
    header = decoded if isinstance(decoded, RecordError) else decode_json(decoded, "line 1")
    if not isinstance(header, dict) or FORMAT not in header:
        raise InputError("line 1: not a Reverie backup (its first line is not a backup header)")
    version = header[FORMAT]
    if version == 1:
        raise InputError(
            "line 1: a format 1 backup has no end record, so a copy cut short or edited "
            "cannot be told from a whole one: it is refused. Export the profile again "
            f"(format {VERSION}), or restore the file with the release that wrote it and "
            "export it from there")
    if version != VERSION:
        said = f"is format {version}" if isinstance(version, int) else "is not a format number"
        raise RecordError("line 1", FORMAT, f"{said}; this Reverie reads format {VERSION}")
    profile = header.get("profile")
    if not isinstance(profile, str) or not PROFILE_NAME.match(profile):
        raise RecordError("line 1", "profile", "must name the profile backed up")
    if header.get("tables") != list(known):
        raise RecordError("line 1", "tables", f"must be {', '.join(known)}, the tables "
                          "this Reverie backs up")
    if expected is not None and ids.sought_id(expected, "profile named") != profile:
        raise InputError(f"the backup is of profile {profile!r}, not {expected!r}")
    return profile


def _unvouched(
    digest: _Digest, end: tuple[str, object, bytes] | None, after_end: str | None, last: int
) -> list[RecordError]:
    """Whatever the end record does not vouch for: its absence, lines after it, tables
    whose counts or checksums differ from the lines read."""
    if end is None:
        return [RecordError(f"line {last}", None, "the backup ends here without its end "
                            "record: the file was cut short or not written whole")]
    at, record, raw = end
    where = f"{at} (end record)"
    errors = []
    if after_end is not None:
        errors.append(RecordError(after_end, None, f"follows the end record ({at}): the file "
                                  "goes on after the backup ends"))
    if not raw.endswith(b"\n"):
        errors.append(RecordError(where, None, "is cut short (no newline ends it)"))
    if not (isinstance(record, dict) and isinstance(record.get("sha256"), str)
            and isinstance(record.get("tables"), dict)):
        return [*errors, RecordError(where, END, 'must be {"sha256": ..., "tables": {...}}')]
    vouched = record["tables"]
    for name, (rows, table_digest) in digest.tables.items():
        claim = vouched.get(name)
        if not isinstance(claim, dict):
            errors.append(RecordError(where, f"tables.{name}", "is missing"))
            continue
        first, final = digest.spans.get(name, (0, 0))
        lines = f"lines {first}-{final}" if first else "no lines"
        if claim.get("rows") != rows:
            errors.append(RecordError(
                where, f"tables.{name}.rows", f"vouches for {claim.get('rows')!r} rows of "
                f"table {name}; the file has {rows} ({lines}): lines were removed or added"))
        elif claim.get("sha256") != table_digest.hexdigest():
            errors.append(RecordError(
                where, f"tables.{name}.sha256", f"table {name} ({lines}) is not as exported: "
                "edited, damaged or from another backup"))
    if not errors and record["sha256"] != digest.whole.hexdigest():
        # Each table is whole, so what changed is the header or a line of no table.
        errors.append(RecordError(where, "sha256", "the lines before it are not as "
                                  "exported: the header or a line outside the tables changed"))
    return errors


def _across_rows(
    rows: dict[str, list[tuple[str, dict[str, Any]]]], known: dict[str, tuple[Table, str]]
) -> list[RecordError]:
    """Keys unique within the file; every reference to a memory answered by the backup."""
    errors: list[RecordError] = []
    if len(rows["profile"]) != 1:
        errors.append(RecordError("the backup", "profile", f"has {len(rows['profile'])} "
                                  "profile rows, not 1"))
    for name, (table, _) in known.items():
        for columns in _keys(name, table):
            seen: dict[tuple[Any, ...], str] = {}
            for at, row in rows[name]:
                key = tuple(row.get(c) for c in columns)
                if None in key:  # NULLs never clash in a UNIQUE constraint
                    continue
                if key in seen:
                    errors.append(RecordError(at, _key_field(columns), f"repeats the key of "
                                              f"{seen[key]}"))
                else:
                    seen[key] = at
    memories = {row["id"] for _, row in rows["memory"]}
    known_ids = memories | {row["memory_id"] for _, row in rows["tombstone"]}

    def refer(at: str, column: str, value: object, allowed: set[str], what: str) -> None:
        if value is not None and value not in allowed:
            errors.append(RecordError(at, column, f"refers to no {what} of this backup"))

    for at, row in rows["memory"]:
        refer(at, "superseded_by", row.get("superseded_by"), known_ids,
              "memory or tombstone")
    for at, row in rows["memoryvector"]:
        refer(at, "memory_id", row["memory_id"], memories, "memory")
    for at, row in rows["edge"]:
        refer(at, "source_id", row["source_id"], memories, "memory")
        refer(at, "target_id", row["target_id"], memories, "memory")
    # Undoing deletes the summary, tombstone-less; a later consolidation that took that
    # summary as a member (the cold tier moving it cold) still names it in its history.
    undone = {row["summary_id"] for _, row in rows["consolidation"]
              if row.get("undone_at") is not None and isinstance(row.get("summary_id"), str)}
    for at, row in rows["consolidation"]:
        if row.get("undone_at") is None:
            refer(at, "summary_id", row.get("summary_id"), known_ids, "memory or tombstone")
        members = row.get("member_ids") or []
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            errors.append(RecordError(at, "member_ids", "must be a list of memory ids"))
        elif not set(members) <= known_ids | undone:
            errors.append(RecordError(at, "member_ids", "refers to no memory or tombstone of "
                                      "this backup"))
    return errors


def _keys(name: str, table: Table) -> list[tuple[str, ...]]:
    """The column sets a row's values must be unique on: the primary key (unless the
    target assigns it) and every UNIQUE constraint."""
    keys = [tuple(c.name for c in table.primary_key.columns)]
    keys += [tuple(c.name for c in u.columns) for u in table.constraints
             if isinstance(u, UniqueConstraint)]
    assigned = _ASSIGNED.get(name, set())
    return [k for k in keys if not assigned & set(k)]


def _key_field(columns: tuple[str, ...]) -> str:
    # The profile column is the same on every row: the other columns make the key.
    return ", ".join(c for c in columns if c != "profile_id") or columns[0]


def _write(url: str, plan: RestorePlan) -> RestoreReport:
    """The plan's rows in one transaction, once no key of theirs is in the store."""
    known = _tables()
    with Store(url).writing_all() as s:
        clashes = _clashes(s, plan, known)
        if clashes:
            raise RefusedError(_refusal(plan.profile, clashes))
        for name, (table, _) in known.items():
            if plan.rows[name]:
                s.execute(insert(table), [row for _, row in plan.rows[name]])
        # The backup's count may be one a server saw before, for other rows.
        bump_write_seqs(s, [plan.profile])
    return RestoreReport(plan.profile, {n: len(r) for n, r in plan.rows.items() if r})


def _clashes(
    s: Session, plan: RestorePlan, known: dict[str, tuple[Table, str]]
) -> list[RecordError]:
    # Checked in the writing transaction, so that what it finds still holds for the
    # insert; a clash is named here rather than by the database's bare constraint.
    if s.get(tables.Profile, plan.profile) is not None:
        at = plan.rows["profile"][0][0]
        return [RecordError(at, "id", f"the store already has a profile named "
                            f"{plan.profile!r}: restore into a store without it")]
    clashes: list[RecordError] = []
    for name, (table, _) in known.items():
        for columns in _keys(name, table):
            at_key = {tuple(row[c] for c in columns): at for at, row in plan.rows[name]
                      if all(row.get(c) is not None for c in columns)}
            cols = [table.c[c] for c in columns]
            probe = cols[0] if len(cols) == 1 else tuple_(*cols)
            values = [k[0] if len(cols) == 1 else k for k in at_key]
            for batch in chunks(values):
                for found in s.execute(select(*cols).where(probe.in_(batch))):
                    clashes.append(RecordError(
                        at_key[tuple(found)], _key_field(columns),
                        "the store already has a row with this key"))
    return sorted(clashes, key=lambda e: _line_number(e.where))


def _refusal(profile: str, errors: list[RecordError]) -> str:
    shown = "; ".join(str(e) for e in errors[:LISTED_ERRORS])
    more = f" and {len(errors) - LISTED_ERRORS} more" if len(errors) > LISTED_ERRORS else ""
    return f"backup of {profile!r} not restored, nothing written: {shown}{more}"


def _line_number(where: str) -> int:
    number = where.removeprefix("line ").split(" ", 1)[0]
    return int(number) if number.isdigit() else 0


def _bytes(line: bytes | str) -> bytes:
    # surrogatepass: a string that is not valid Unicode still becomes bytes, which the
    # UTF-8 check then names, rather than an exception here.
    return line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")


def _decode(
    where: str, item: object, known: dict[str, tuple[Table, str]], profile: str
) -> tuple[str, str, dict[str, Any]]:
    """A row line's table, its place ("line N (table T)") and its row as the store
    keeps it; RecordError if it is not one the store could have written."""
    if isinstance(item, RecordError):
        raise item
    if not isinstance(item, dict) or set(item) != {"table", "row"}:
        raise RecordError(where, None, 'must be {"table": ..., "row": {...}}')
    name, raw = item["table"], item["row"]
    if name not in known:
        raise RecordError(where, "table", f"{name!r} is not one of {', '.join(known)}")
    at = f"{where} (table {name})"
    if not isinstance(raw, dict):
        raise RecordError(at, "row", "must be an object")
    table, column = known[name]
    columns = {c.name: c for c in table.columns}
    unknown = sorted(set(raw) - set(columns))
    if unknown:
        raise RecordError(at, unknown[0], f"is not a column of {name}")
    if column != "memory_id" and raw.get(column) != profile:
        raise RecordError(at, column, f"must be the backup's profile {profile!r}")
    assigned = _ASSIGNED.get(name, set())
    for key, col in columns.items():
        # A column with a default in the store may be missing (a backup from before it
        # was added: memories' and profiles' ingest_seq): the row takes the default.
        optional = key not in raw and col.server_default is not None
        if key not in assigned and not col.nullable and not optional and raw.get(key) is None:
            raise RecordError(at, key, "is required")
    row: dict[str, Any] = {}
    for key, value in raw.items():
        if key in assigned:
            continue
        try:
            row[key] = None if value is None else _value(columns[key].type, value)
        except ValueError as exc:
            raise RecordError(at, key, str(exc)) from None
    if name == "memory":
        _check_memory(row, at)
    elif name == "edge":
        check_edge_row(row, at)
    elif name == "memoryvector":
        # Imported by the restore that checks a vector: the backup's writer (`reverie
        # export`) would otherwise import numpy for nothing.
        from reverie.models.vectors import check_stored

        try:
            check_stored(row["embedding"])
        except ValueError as exc:
            raise RecordError(at, "embedding", str(exc)) from None
    return name, at, row


def _value(kind: Any, value: object) -> object:
    """A JSON value as the column keeps it; ValueError if no stored row could hold it."""
    if isinstance(kind, JSON):
        check_json_value(value)  # NaN, bad Unicode, depth: what the store cannot keep
        return value
    if isinstance(kind, DateTime):
        try:
            # A value of another type than str raises the TypeError caught here.
            return in_record_range(datetime.fromisoformat(value))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError("is not an ISO-8601 date-time in Reverie's range") from None
    if isinstance(kind, LargeBinary):
        try:
            return base64.b64decode(value, validate=True)  # type: ignore[arg-type]  # as above
        except (TypeError, ValueError, binascii.Error):
            raise ValueError("is not base64") from None
    expected = _PYTHON_TYPES.get(_python_type(kind))
    if expected is None:
        return value
    if not _is(value, expected[0]):
        raise ValueError(f"must be {expected[1]}")
    if isinstance(value, str):
        clean_text(value)  # a NUL or an unpaired surrogate: no back-end keeps it
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite number")  # json reads NaN; nothing writes it
    elif isinstance(value, int) and not isinstance(value, bool):
        if expected[0] is int and not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            raise ValueError("is beyond a 32-bit integer")
        if expected[0] is not int and not _fits_float(value):
            raise ValueError("must be a finite number")
    return value


def _fits_float(value: int) -> bool:
    try:
        float(value)
    except OverflowError:
        return False
    return True


def _check_memory(row: dict[str, Any], at: str) -> None:
    """Ingest's checks, and what the store itself keeps true of every memory."""
    check_memory_row(row, at)
    if row["content_hash"] != ids.content_hash(row["content"]):
        raise RecordError(at, "content_hash", "is not the hash of the memory's content")
    for column, vocabulary in (("tier", tables.Tier), ("lifecycle", tables.Lifecycle),
                               ("origin", tables.Origin)):
        if row[column] not in set(vocabulary):
            raise RecordError(at, column, f"must be one of {', '.join(vocabulary)}")


# What a plain column's JSON value must be (JSON numbers may be ints for a float).
_PYTHON_TYPES: dict[type | None, tuple[type | tuple[type, ...], str]] = {
    str: (str, "a string"), int: (int, "an integer"), float: ((int, float), "a number"),
    bool: (bool, "true or false"),
}


def _python_type(kind: Any) -> type | None:
    if isinstance(kind, TypeDecorator):  # sqlmodel's AutoString: a String underneath
        kind = kind.impl_instance
    try:
        return kind.python_type
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
