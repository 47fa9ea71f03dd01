"""Validation of records offered to the store: JSONL lines or Python dicts.

One record per line. ``type`` is ``memory`` (the default) or ``edge``. A memory
needs ``content`` and a profile (its own ``profile`` or the caller's default); every
other field is optional. Each problem is reported as a ``RecordError`` naming the
line (or record number) and the field; the caller stores the good records anyway.

Rows as the store keeps them (a backup's, before ``models.backup`` restores them) go
through the same converters: ``check_memory_row`` and ``check_edge_row``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reverie.models.errors import RecordError
from reverie.models.ids import given_id, profile_name
from reverie.models.text import clean_text, has_visible_text
from reverie.models.timestamps import in_record_range, parse_timestamp

if TYPE_CHECKING:
    import numpy as np

MAX_SHORT_TEXT = 256
# Whole-number fields land in 32-bit INTEGER columns on PostgreSQL (SQLite holds 64
# bits; one bound serves both), and recall adds one to access_count on every use:
# a billion leaves over a billion accesses of headroom before the column overflows.
MAX_COUNT = 1_000_000_000
# Summaries and meta-memories average their members' stability by summing it first;
# this bound keeps that sum finite (and exportable) for any number of members.
MAX_STABILITY = 1e9
# Metadata is stored as JSON text and decoded again, for every memory of a profile, by
# every step (pydantic-core gives up near 200 levels, psycopg2's json near 1000 and the
# standard library's encoder at Python's recursion limit). Real metadata is a few
# levels deep; 32 leaves ample room for it and a wide margin below those limits.
# Levels count objects and lists, the metadata object itself being the first.
MAX_METADATA_DEPTH = 32
# Every step decodes every memory's metadata, and summaries copy it: a cap on its
# serialized size keeps one record from making every later run of its profile slow.
MAX_METADATA_CHARS = 65_536
# Integers in metadata: what JSON readers in most languages hold as an integer (and
# far below the digit limit Python's own JSON decoding refuses past).
METADATA_INT_RANGE = (-(2**63), 2**63 - 1)
# An integer id with this many digits or more is longer than any id may be.
_LONGEST_ID_INT = 10**MAX_SHORT_TEXT


@dataclass(slots=True)
class MemoryIn:
    """A validated memory record; ``given`` lists the fields the caller set."""

    where: str
    profile: str
    content: str
    values: dict[str, Any]
    given: frozenset[str]
    embedding: np.ndarray | None = None

    @property
    def external_id(self) -> str | None:
        return self.values.get("external_id")


@dataclass(slots=True)
class EdgeIn:
    where: str
    profile: str
    source: str
    target: str
    kind: str
    weight: float
    values: dict[str, Any] = field(default_factory=dict)


# --- field converters: each returns the clean value or raises ValueError -------------


def _text(value: object, *, limit: int = MAX_SHORT_TEXT, lower: bool = False) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {_type_name(value)}")
    text = _bounded(clean_text(value).strip(), limit)
    return text.lower() if lower else text


def _bounded(text: str, limit: int) -> str:
    if not text:
        raise ValueError("must not be empty")
    if len(text) > limit:
        raise ValueError(f"is {len(text)} characters, longer than the limit of {limit}")
    return text


def _identifier(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"expected a string or an integer, got {_type_name(value)}")
    if isinstance(value, int) and abs(value) >= _LONGEST_ID_INT:
        # Checked before str(): a long enough integer would make str() itself fail.
        raise ValueError(f"is longer than the limit of {MAX_SHORT_TEXT} characters")
    return _bounded(given_id(str(value)), MAX_SHORT_TEXT)


def _label(value: object) -> str:
    """A short lower-case name from an open vocabulary (a kind, a layer, a status)."""
    return _text(value, limit=64, lower=True)


def _unit_interval(value: object) -> float:
    number = _number(value)
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"must be between 0 and 1, got {number}")
    return number


def _stability(value: object) -> float:
    number = _number(value)
    if not 0.0 <= number <= MAX_STABILITY:
        raise ValueError(f"must be between 0 and {MAX_STABILITY:g}, got {number:g}")
    return number


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {_type_name(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        raise ValueError("must be a finite number, got a number too large") from None
    if not math.isfinite(number):
        raise ValueError(f"must be a finite number, got {value}")
    return number


def _count(value: object) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a whole number, got {_type_name(value)}")
    if value < 0:
        raise ValueError("must not be negative")
    if value > MAX_COUNT:
        raise ValueError(f"must be at most {MAX_COUNT:,}")
    return value


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {_type_name(value)}")
    return value


def _mapping(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {_type_name(value)}")
    # Walked before serializing: the walk stops at the depth limit, where json.dumps
    # would recurse as deep as the value goes (or forever, on a cycle).
    _check_json_value(value, 1)
    size = len(json.dumps(value, ensure_ascii=False))
    if size > MAX_METADATA_CHARS:
        raise ValueError(
            f"is {size} characters as JSON, longer than the limit of {MAX_METADATA_CHARS}"
        )
    return value


def _check_json_value(value: object, depth: int) -> None:
    """Refuse what the store could not keep as JSON or read back: wrong types, text
    that is not valid Unicode, non-finite or oversized numbers, too deep nesting.
    Messages say what is wrong, never the offending key or value."""
    if isinstance(value, (dict, list)):
        if depth > MAX_METADATA_DEPTH:
            raise ValueError(f"is nested more than {MAX_METADATA_DEPTH} levels deep")
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ValueError(f"has a key that is {_type_name(key)}, not a string")
                _check_json_text(key, "a key")
                _check_json_value(item, depth + 1)
        else:
            for item in value:
                _check_json_value(item, depth + 1)
    elif isinstance(value, str):
        _check_json_text(value, "a value")
    elif isinstance(value, bool) or value is None:
        pass
    elif isinstance(value, int):
        low, high = METADATA_INT_RANGE
        if not low <= value <= high:
            raise ValueError("has an integer outside the signed 64-bit range")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("contains NaN or infinity")
    else:
        raise ValueError(f"has a value that is {_type_name(value)}, not a JSON value")


def _check_json_text(text: str, what: str) -> None:
    try:
        clean_text(text)
    except ValueError as exc:
        raise ValueError(f"has {what} that {exc}") from None


def _time(value: object) -> datetime:
    return in_record_range(parse_timestamp(value))


def _profile(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {_type_name(value)}")
    return profile_name(_bounded(given_id(value), 128))


def _type_name(value: object) -> str:
    return {dict: "an object", list: "a list", type(None): "null"}.get(
        type(value), type(value).__name__
    )


# Optional memory fields: JSON name -> (stored name, converter).
MEMORY_FIELDS: dict[str, tuple[str, Callable[[object], Any]]] = {
    "id": ("external_id", _identifier),
    "kind": ("kind", _label),
    "entity": ("entity", _text),
    "layer": ("layer", _label),
    "importance": ("importance", _unit_interval),
    "confidence": ("confidence", _unit_interval),
    "stability": ("stability", _stability),
    "access_count": ("access_count", _count),
    "created_at": ("created_at", _time),
    "last_accessed_at": ("last_accessed_at", _time),
    "valid_from": ("valid_from", _time),
    "valid_until": ("valid_until", _time),
    "session_id": ("session_id", _identifier),
    "status": ("status", _label),
    "protected": ("protected", _flag),
    "metadata": ("meta", _mapping),
}

EDGE_FIELDS: dict[str, tuple[str, Callable[[object], Any]]] = {
    "subkind": ("subkind", _label),
    "confidence": ("confidence", _unit_interval),
    "last_strengthened_at": ("last_strengthened_at", _time),
    "created_at": ("created_at", _time),
    "metadata": ("meta", _mapping),
}


def parse_record(
    obj: object, where: str, default_profile: str | None, max_chars: int, dimension: int
) -> MemoryIn | EdgeIn:
    """Validate one decoded record; raises RecordError naming ``where`` and the field."""
    if not isinstance(obj, dict):
        raise RecordError(where, None, f"expected a JSON object, got {_type_name(obj)}")
    kind = obj.get("type", "memory")
    if kind == "edge":
        return _parse_edge(obj, where, default_profile)
    if kind != "memory":
        raise RecordError(where, "type", f"must be 'memory' or 'edge', got {kind!r}")
    return _parse_memory(obj, where, default_profile, max_chars, dimension)


def _parse_memory(
    obj: dict[str, Any], where: str, default_profile: str | None, max_chars: int, dimension: int
) -> MemoryIn:
    known = {"type", "content", "profile", "embedding", *MEMORY_FIELDS}
    _refuse_unknown(obj, known, where)
    profile = _profile_of(obj, where, default_profile)
    content = _content(obj, where, max_chars)

    values: dict[str, Any] = {}
    for name, (column, convert) in MEMORY_FIELDS.items():
        raw = obj.get(name)
        if raw is None:
            continue
        try:
            values[column] = convert(raw)
        except ValueError as exc:
            raise RecordError(where, name, str(exc)) from None
    start, end = values.get("valid_from"), values.get("valid_until")
    if start is not None and end is not None and end <= start:
        raise RecordError(where, "valid_until", "must be later than valid_from")

    embedding = None
    if obj.get("embedding") is not None:
        # Here, not at the top: a backup's writer (`reverie export`) imports this module
        # for its checks and has no vector to check; numpy's import was about a seventh
        # of its start.
        from reverie.models.vectors import normalise

        try:
            embedding = normalise(obj["embedding"], dimension)
        except ValueError as exc:
            raise RecordError(where, "embedding", str(exc)) from None
    return MemoryIn(where, profile, content, values, frozenset(values), embedding)


def _parse_edge(obj: dict[str, Any], where: str, default_profile: str | None) -> EdgeIn:
    known = {"type", "profile", "source", "target", "kind", "weight", *EDGE_FIELDS}
    _refuse_unknown(obj, known, where)
    profile = _profile_of(obj, where, default_profile)
    ends: dict[str, str] = {}
    for name in ("source", "target"):
        if obj.get(name) is None:
            raise RecordError(where, name, "is required for an edge")
        try:
            ends[name] = _identifier(obj[name])
        except ValueError as exc:
            raise RecordError(where, name, str(exc)) from None
    if ends["source"] == ends["target"]:
        raise RecordError(where, "target", "an edge must join two different memories")
    try:
        kind = _label(obj.get("kind", "association"))
    except ValueError as exc:
        raise RecordError(where, "kind", str(exc)) from None
    try:
        weight = _unit_interval(obj.get("weight", 0.5))
    except ValueError as exc:
        raise RecordError(where, "weight", str(exc)) from None
    values: dict[str, Any] = {}
    for name, (column, convert) in EDGE_FIELDS.items():
        if obj.get(name) is None:
            continue
        try:
            values[column] = convert(obj[name])
        except ValueError as exc:
            raise RecordError(where, name, str(exc)) from None
    return EdgeIn(where, profile, ends["source"], ends["target"], kind, weight, values)


def _refuse_unknown(obj: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(obj) - known)
    if unknown:
        raise RecordError(
            where, unknown[0], "is not a known field (put extra data under 'metadata')"
        )


def _profile_of(obj: dict[str, Any], where: str, default_profile: str | None) -> str:
    raw = obj.get("profile", default_profile)
    if raw is None:
        raise RecordError(where, "profile", "is required (in the record or with --profile)")
    try:
        return _profile(raw)
    except ValueError as exc:
        raise RecordError(where, "profile", str(exc)) from None


def _content(obj: dict[str, Any], where: str, max_chars: int) -> str:
    raw = obj.get("content")
    if raw is None:
        raise RecordError(where, "content", "is required")
    if not isinstance(raw, str):
        raise RecordError(where, "content", f"expected a string, got {_type_name(raw)}")
    try:
        text = clean_text(raw).strip()
    except ValueError as exc:
        raise RecordError(where, "content", str(exc)) from None
    if not text:
        raise RecordError(where, "content", "is empty")
    if not has_visible_text(text):
        raise RecordError(
            where, "content", "is empty: it has no letter, digit, punctuation or symbol"
        )
    if len(text) > max_chars:
        raise RecordError(
            where,
            "content",
            f"is {len(text)} characters, longer than the limit of {max_chars} "
            "(REVERIE_MAX_CONTENT_CHARS)",
        )
    return text


def read_jsonl(path: Path) -> Iterator[tuple[str, object | RecordError]]:
    """Yield ``("line N", decoded object)`` or ``("line N", RecordError)`` per non-blank line."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            where = f"line {number}"
            bom = 3 if number == 1 and raw.startswith(b"\xef\xbb\xbf") else 0
            line = decode_utf8(raw[bom:], where, bom)
            if isinstance(line, RecordError):
                yield where, line
            elif line.strip():
                yield where, decode_json(line, where)


def decode_utf8(raw: bytes, where: str, skipped: int = 0) -> str | RecordError:
    """``raw`` as text, or the RecordError naming its first bad byte as an editor counts
    columns (from 1, ``skipped`` bytes before ``raw`` on its line)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return RecordError(where, None,
                           f"is not valid UTF-8 at byte {skipped + exc.start + 1}")


def decode_json(line: str, where: str) -> object | RecordError:
    """One line of JSONL decoded, or the RecordError saying why it cannot be."""
    # The line's own ending is no part of its record: left on, a line cut short was
    # reported on json's second line, "at column 1", and a string cut short as an
    # invalid control character (the newline).
    text = line.removesuffix("\n").removesuffix("\r")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        # A few of json's messages end in "at" ("Unterminated string starting at").
        return RecordError(where, None, f"is not valid JSON: {exc.msg.removesuffix(' at')} "
                           f"at column {exc.colno}")
    except RecursionError:
        return RecordError(where, None, "is nested too deeply")
    except ValueError:
        # The only other refusal of json.loads: an integer with more digits than
        # Python converts from text. Its own message speaks of Python's settings,
        # which the person fixing the file cannot and should not change.
        digits = sys.get_int_max_str_digits()
        return RecordError(
            where, None, f"is not valid JSON here: a number is too long (over {digits} digits)"
        )


# --- rows as the store keeps them (a backup's, before models.backup restores them) ------
# They pass ingest's checks through ingest's own converters, and each converter must give
# the value back unchanged: the store only ever holds what they return. Left out are the
# limits ingest puts on callers' records to keep them small (content length, metadata
# size): summaries join their members' and may exceed them.

# Stored (column) names where they differ from the record's field names.
_COLUMN_OF = {"meta": "metadata"}


def check_json_value(value: object) -> None:
    """ValueError unless ``value`` is JSON the store can keep and read back (see
    ``_check_json_value``); without the size limit of a caller's metadata."""
    _check_json_value(value, 1)


def check_memory_row(row: dict[str, Any], where: str) -> None:
    """RecordError (naming ``where`` and the column) unless a memory row as stored passes
    the checks ingest makes on a memory record."""
    _check_columns(row, MEMORY_FIELDS.values(), where)
    content = _content(row, where, sys.maxsize)
    if content != row["content"]:
        raise RecordError(where, "content", _CHANGED)
    start, end = row.get("valid_from"), row.get("valid_until")
    if start is not None and end is not None and end <= start:
        raise RecordError(where, "valid_until", "must be later than valid_from")


def check_edge_row(row: dict[str, Any], where: str) -> None:
    """RecordError unless an edge row as stored passes the checks ingest makes on an
    edge record (its ends are memory ids; models.backup checks that they exist)."""
    _check_columns(row, EDGE_FIELDS.values(), where)
    _check_columns(row, [("kind", _label), ("weight", _unit_interval),
                         ("base_weight", _unit_interval)], where)
    if row.get("source_id") == row.get("target_id"):
        raise RecordError(where, "target_id", "an edge must join two different memories")


_CHANGED = "is not as Reverie stores it (ingest would have changed it)"


def _check_columns(
    row: dict[str, Any], fields: Iterable[tuple[str, Callable[[object], Any]]], where: str
) -> None:
    for attribute, convert in fields:
        column = _COLUMN_OF.get(attribute, attribute)
        value = row.get(column)
        if value is None:
            continue
        if convert is _mapping:  # no size limit here (see above)
            convert = _json_object
        try:
            if convert(value) != value:
                raise RecordError(where, column, _CHANGED)
        except ValueError as exc:
            raise RecordError(where, column, str(exc)) from None


def _json_object(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {_type_name(value)}")
    check_json_value(value)
    return value
