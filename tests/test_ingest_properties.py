"""Property: no input loses another record or breaks a profile.

Batches mix records built only from values the store must accept, records with one
or more values it must refuse, and records with arbitrary generated values (either
outcome is fine). For every batch: each refused record is named by its line or record
number and by one of the fields that made it bad; every good record is stored; and
whatever was stored exports intact and goes through every consolidation step.
Vectors are supplied (a few fixed directions, so that dedup, compression and
clustering find work) to keep the embedding model out of the ingest.
"""

from __future__ import annotations

import itertools
import json
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reverie.models.config import ConsolidationConfig
from reverie.models.errors import RecordError
from reverie.models.export import export_jsonl
from reverie.models.store import Store
from reverie.models.validation import MAX_COUNT, MAX_METADATA_DEPTH, MAX_STABILITY, parse_record
from reverie.models.vectors import DIMENSION
from reverie.tasks.blocks import compile_blocks
from reverie.tasks.cluster import cluster
from reverie.tasks.cold_notes import consolidate_cold
from reverie.tasks.compress import compress_fading
from reverie.tasks.decay import decay
from reverie.tasks.dedup import dedup, dedup_new_summaries
from reverie.tasks.edge_decay import decay_edges
from reverie.tasks.importance import graph_importance
from reverie.tasks.linking import link_summaries
from reverie.tasks.promote import promote
from reverie.tasks.step import StepArgs

from factories import at_cosine, ingest_file, ingest_records

PROFILE = "prop"
AS_OF = datetime(2026, 1, 1)
# Decay first (it sets the relevance compression and clustering select on), then the
# full consolidation's order, then the monthly steps.
STEPS = (decay, dedup, compress_fading, dedup_new_summaries, decay_edges, promote,
         compile_blocks, link_summaries, graph_importance, cluster, consolidate_cold)
# Rules, never a model: the steps' own arithmetic is what is under test.
CONFIG = ConsolidationConfig(summarizer="rules")


def run_steps(store: Store, profile: str, as_of: datetime = AS_OF) -> None:
    for step in STEPS:
        step(store, StepArgs(store.url, profile, as_of, CONFIG))


# --- values -----------------------------------------------------------------------------

# Near-duplicate directions: similar enough for dedup and clustering to group them.
DIRECTIONS = [at_cosine(c).tolist() for c in (0.99, 0.985, 0.98, 0.5)]
BASE = DIRECTIONS[0]


def deep(depth: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(depth - 1):
        value = {"d": value}
    return {"d": value}


def with_element(vector: list[float], value: object) -> list[object]:
    return [value, *vector[1:]]


VALID: dict[str, list[Any]] = {
    "kind": ["decision", "semantic", "Preference"],
    "entity": ["billing", "Zoë", "🧠 brain"],
    "layer": ["implementation", "architecture"],
    "status": ["in_progress", "done"],
    "session_id": ["s1", 7, "session ü"],
    "importance": [0.0, 0.3, 1.0, 1],
    "confidence": [0.0, 0.95, 1.0],
    "stability": [0.0, 1.0, MAX_STABILITY],
    "access_count": [0, 3, 12, MAX_COUNT, 7.0],
    "created_at": ["1900-01-01T00:00:00Z", "2025-06-01T12:00:00+02:00", "2025-12-30",
                   "2200-12-31T23:59:59Z"],
    "last_accessed_at": ["1900-01-01", "2025-12-31T23:00:00Z", "2200-12-31T23:59:59Z"],
    "valid_from": ["1900-01-01", "1999-12-31T23:59:59Z"],
    "valid_until": ["2100-01-01", "2200-12-31T23:59:59Z"],
    "protected": [True, False],
    "metadata": [{}, {"source": "chat", "n": 2**63 - 1, "f": -1e308, "tags": ["a", None]},
                 deep(MAX_METADATA_DEPTH), {"ключ": {"emoji": "🧠", "": [1.5, True]}}],
    "embedding": [*DIRECTIONS, [x * 1e-310 for x in BASE], [x * 1e300 for x in BASE],
                  with_element(BASE, 2)],
}

# Each must be refused, naming its own field.
HOSTILE: dict[str, list[Any]] = {
    "content": ["\u0301", " \u200b\u0300 ", "", "nul \x00", "bad \ud800", 42, None],
    "kind": ["", "x" * 65, "\udc80", 3],
    "entity": ["a\x00b", "x" * 257, ["list"]],
    "session_id": [True, 1.5, "\ud800"],
    "importance": [1.0001, -0.1, float("nan"), float("inf"), "high", True, 10**400],
    "confidence": [2, "high", -0.5],
    "stability": [-1.0, MAX_STABILITY * 1.5, 1e308, float("-inf")],
    "access_count": [-1, MAX_COUNT + 1, 2**31, 2**63, 1180591620717411303424, 1.5, True,
                     "5", 1e300],
    "created_at": ["0001-01-01T00:00:00Z", "0001-01-01T00:00:00+05:00",
                   "9999-12-31T23:59:59-05:00", "1899-12-31T23:59:59Z", "2201-01-01",
                   "yesterday", 1_700_000_000],
    "last_accessed_at": ["0001-01-01", "9999-12-31"],
    "valid_from": ["1800-01-01"],
    "valid_until": ["3000-01-01"],
    "protected": ["yes", 1],
    "metadata": [{"a": "\ud800"}, {"\udfff": 1}, {"a": ["x", {"b": "\x00"}]},
                 {"k\x00": True}, deep(MAX_METADATA_DEPTH + 1), deep(900),
                 {"n": 2**63}, {"f": float("nan")}, {"big": "x" * 70_000}, [1, 2], "text"],
    "embedding": [[1e308] * 384, [True] + [0.0] * 383, with_element(BASE, "0.5"),
                  with_element(BASE, float("nan")), [0.0] * 384, [-1e308] * 384,
                  BASE[:100], "vector", with_element(BASE, [1.0])],
    "id": ["", "\ud800", 10**256, 1.5],
    "importnce": [0.5],  # an unknown field
}

# Only the Python API can offer these (JSON cannot spell them, or turns them into lists).
PYTHON_ONLY: dict[str, list[Any]] = {
    "access_count": [10**5000],
    "importance": [10**5000],
    "metadata": [{"n": 10**5000}, {1: "int key"}, {"t": (1, 2)}, {"s": {1, 2}}],
    "embedding": [np.ones(384, dtype=bool), tuple(with_element(BASE, True))],
    "id": [10**5000],
}

# Whole lines that are not a record at all (JSONL only): refused with no field.
BAD_LINES = [
    b'{"content": "x", "access_count": ' + b"9" * 4301 + b"}",
    b'{"content": "x", "metadata": {"n": -' + b"1" * 5000 + b"}}",
    b'{"content": "unterminated',
    b'["a", "list"]',
    b'{"content": "\xff\xfe"}',
    b"[" * 100_000 + b"]" * 100_000,
]


def _text(max_size: int = 12) -> st.SearchStrategy[str]:
    # Every category, surrogates and controls included.
    return st.text(st.characters(exclude_categories=()), max_size=max_size)


_json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), _text(),
)
_json = st.recursive(
    _json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(_text(4), inner, max_size=3)),
    max_leaves=8,
)
_when = st.builds(
    lambda moment, zone: moment.replace(tzinfo=zone).isoformat(),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    st.sampled_from([None, UTC, timezone(timedelta(hours=14)),
                     timezone(timedelta(hours=-12))]),
)

# Either outcome is fine, but a refusal must name this field and what is kept must last.
ARBITRARY: dict[str, st.SearchStrategy[Any]] = {
    "content": _text(20),
    "entity": _text(),
    "kind": _text(),
    "access_count": st.integers(),
    "importance": st.floats(),
    "stability": st.one_of(st.floats(), st.integers()),
    "created_at": _when,
    "last_accessed_at": _when,
    "metadata": st.dictionaries(_text(4), _json, max_size=4),
    "embedding": st.builds(with_element, st.just(BASE), st.floats()),
}


# --- batches ----------------------------------------------------------------------------


@dataclass
class Planned:
    """One offered record and what must become of it."""

    record: dict[str, Any] | None
    line: bytes | None = None  # a raw JSONL line instead of a record
    hostile: set[str] = field(default_factory=set)
    arbitrary: set[str] = field(default_factory=set)

    @property
    def external_id(self) -> str | None:
        return None if self.record is None else self.record.get("id")

    def __repr__(self) -> str:  # a failing example, readable: vectors cut short
        if self.record is None:
            return f"Planned(line={self.line[:80]!r})"  # type: ignore[index]
        shown = {k: _short(v) for k, v in self.record.items()}
        return f"Planned({shown!r}, hostile={sorted(self.hostile)}, arbitrary={sorted(self.arbitrary)})"


def _short(value: object) -> object:
    if isinstance(value, (list, tuple, np.ndarray)) and len(value) > 8:
        return f"<{type(value).__name__} of {len(value)}: {list(value[:3])}...>"
    text = repr(value)
    return value if len(text) <= 200 else text[:200] + "..."


@st.composite
def planned_record(draw: st.DrawFn, n: int, python: bool) -> Planned:
    record: dict[str, Any] = {
        "id": f"r{n}",
        "content": f"Fact {n}: the team settled the billing retry policy",
        "embedding": DIRECTIONS[n % len(DIRECTIONS)],
        "entity": "billing",
        "layer": "implementation",
        "created_at": "2025-01-01T00:00:00Z",
    }
    hostile = HOSTILE
    if python:
        hostile = {k: HOSTILE.get(k, []) + PYTHON_ONLY.get(k, []) for k in {*HOSTILE, *PYTHON_ONLY}}
    roles: dict[str, str] = {}  # field -> role; a later draw for the same field decides it
    for _ in range(draw(st.integers(0, 3))):
        role = draw(st.sampled_from(["valid", "valid", "hostile", "arbitrary"]))
        if role == "valid":
            name = draw(st.sampled_from(sorted(VALID)))
            record[name] = draw(st.sampled_from(VALID[name]))
        elif role == "hostile":
            name = draw(st.sampled_from(sorted(hostile)))
            record[name] = draw(st.sampled_from(hostile[name]))
        else:
            name = draw(st.sampled_from(sorted(ARBITRARY)))
            record[name] = draw(ARBITRARY[name])
        roles[name] = role
    return Planned(
        record,
        hostile={name for name, role in roles.items() if role == "hostile"},
        arbitrary={name for name, role in roles.items() if role == "arbitrary"},
    )


@st.composite
def batches(draw: st.DrawFn) -> tuple[bool, list[Planned]]:
    python = draw(st.booleans())
    size = draw(st.integers(2, 8))
    plans = [draw(planned_record(n, python)) for n in range(1, size + 1)]
    if not python:
        for _ in range(draw(st.integers(0, 2))):
            at = draw(st.integers(0, len(plans)))
            plans.insert(at, Planned(None, line=draw(st.sampled_from(BAD_LINES))))
    return python, plans


def _encode(plan: Planned) -> bytes:
    if plan.line is not None:
        return plan.line
    return json.dumps(plan.record, allow_nan=True).encode("utf-8")


def _export(store: Store) -> list[dict[str, Any]]:
    # Split on newlines only: content may hold other line separators (U+2028, \x1c),
    # which JSON leaves unescaped and str.splitlines() would split on.
    text = export_jsonl(store.url, PROFILE)
    return [json.loads(line) for line in text.split("\n") if line]


def _expected_content(record: dict[str, Any]) -> str:
    return unicodedata.normalize("NFC", record["content"]).strip()


# --- the property ---------------------------------------------------------------------

_names = itertools.count()


@settings(max_examples=30, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(batch=batches())
def test_no_input_loses_another_record_or_breaks_the_profile(
    new_store: Callable[[str], Store], tmp_path: Path, batch: tuple[bool, list[Planned]]
) -> None:
    python, plans = batch
    store = new_store(f"prop{next(_names)}")
    if python:
        report = ingest_records(store, [p.record for p in plans], profile=PROFILE)
        wheres = [f"record {n}" for n in range(1, len(plans) + 1)]
    else:
        path = tmp_path / f"batch{next(_names)}.jsonl"
        path.write_bytes(b"".join(_encode(p) + b"\n" for p in plans))
        report = ingest_file(store, path, profile=PROFILE)
        wheres = [f"line {n}" for n in range(1, len(plans) + 1)]

    errors = {e.where: e for e in report.errors}
    assert len(errors) == len(report.errors), "a record was reported twice"
    assert set(errors) <= set(wheres)
    exported = _export(store)
    by_id = {row["external_id"]: row for row in exported if row["type"] == "memory"}
    assert len(by_id) == report.stored

    for where, plan in zip(wheres, plans, strict=True):
        error = errors.get(where)
        if plan.record is None:
            assert error is not None and error.field is None, where
            continue
        if plan.hostile:
            assert error is not None, f"{where}: {sorted(plan.hostile)} was accepted"
            assert error.field in plan.hostile | plan.arbitrary, str(error)
        elif error is not None:
            assert plan.arbitrary, f"{where}: a good record was refused: {error}"
            assert error.field in plan.arbitrary, str(error)
        if error is None:
            row = by_id.get(plan.external_id)
            assert row is not None, f"{where} was neither stored nor refused"
            assert row["content"] == _expected_content(plan.record)
        else:
            assert error.where == where and str(error).startswith(where)

    run_steps(store, PROFILE)
    # Once more, as the next scheduled run would: nothing the first left behind breaks it.
    run_steps(store, PROFILE, AS_OF + timedelta(days=40))
    after = _export(store)
    kept = {row["external_id"]: row["content"] for row in after
            if row["type"] == "memory" and row["external_id"] is not None}
    assert kept == {k: row["content"] for k, row in by_id.items()}


@pytest.mark.parametrize("python", [True, False], ids=["dicts", "jsonl"])
def test_the_pools_mean_what_they_say(python: bool) -> None:
    """Alone in a record, each valid value is accepted and each hostile one refused,
    naming its field: the property's expectations rest on the rules, not on its draws."""
    base = {"content": "a plain fact", "embedding": BASE}
    hostile = HOSTILE
    if python:
        hostile = {k: HOSTILE.get(k, []) + PYTHON_ONLY.get(k, []) for k in {*HOSTILE, *PYTHON_ONLY}}
    cases = [(True, name, value) for name, values in VALID.items() for value in values]
    cases += [(False, name, value) for name, values in hostile.items() for value in values]
    for good, name, value in cases:
        record = {**base, name: value}
        if not python:
            record = json.loads(json.dumps(record, allow_nan=True))
        try:
            parse_record(record, "record 1", PROFILE, 32_000, DIMENSION)
        except RecordError as exc:
            assert not good and exc.field == name, (name, str(exc))
        else:
            assert good, f"{name}: a hostile value was accepted"
