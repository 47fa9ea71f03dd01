import json
import sqlite3
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import event, insert, select
from sqlalchemy.exc import IntegrityError

from reverie.models import ids
from reverie.models.db import engine_for, reading, writing
from reverie.models.errors import IntegrityViolationError, NotFoundError
from reverie.models.export import export_jsonl
from reverie.models.ingest import SUPPLIED_EMBEDDING
from reverie.models.repositories import edges as edges_repo
from reverie.models.repositories import memories as memories_repo
from reverie.models.store import Store
from reverie.models.tables import Memory, Profile, Tier
from reverie.models.validation import (
    MAX_COUNT,
    MAX_METADATA_CHARS,
    MAX_METADATA_DEPTH,
    MAX_STABILITY,
)
from reverie.models.vectors import MODEL_NAME

from factories import (
    at_cosine,
    embedder_of,
    get_memory,
    in_read,
    ingest_file,
    ingest_records,
    record,
    stored_vector,
)


def write_jsonl(path: Path, lines: list[str | dict]) -> Path:
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines),
        encoding="utf-8",
    )
    return path


GOOD = {"profile": "alice", "content": "Alice drinks green tea every morning"}


@pytest.mark.parametrize(
    ("bad_line", "field", "message"),
    [
        ('{"profile": "alice", "content": "unterminated', None, "not valid JSON"),
        ('["a", "list"]', None, "expected a JSON object"),
        ('{"profile": "alice"}', "content", "is required"),
        ('{"profile": "alice", "content": 42}', "content", "expected a string, got int"),
        ('{"profile": "alice", "content": "   "}', "content", "is empty"),
        ('{"profile": "alice", "content": "\\u200b\\u200b"}', "content", "is empty"),
        ('{"profile": "alice", "content": "bad \\ud800 text"}', "content", "unpaired surrogate"),
        ('{"profile": "alice", "content": "nul \\u0000 byte"}', "content", "NUL"),
        ('{"profile": "alice", "content": "x", "importance": NaN}', "importance", "finite"),
        ('{"profile": "alice", "content": "x", "importance": Infinity}', "importance", "finite"),
        ('{"profile": "alice", "content": "x", "importance": "high"}', "importance", "expected a number"),
        ('{"profile": "alice", "content": "x", "importance": 1.5}', "importance", "between 0 and 1"),
        ('{"profile": "alice", "content": "x", "confidence": true}', "confidence", "expected a number"),
        ('{"profile": "alice", "content": "x", "access_count": 1.5}', "access_count", "whole number"),
        ('{"profile": "alice", "content": "x", "access_count": -1}', "access_count", "negative"),
        ('{"profile": "alice", "content": "x", "created_at": "yesterday"}', "created_at", "ISO-8601"),
        ('{"profile": "alice", "content": "x", "created_at": 1700000000}', "created_at", "ISO-8601"),
        ('{"profile": "alice", "content": "x", "protected": "yes"}', "protected", "true or false"),
        ('{"profile": "alice", "content": "x", "metadata": [1]}', "metadata", "JSON object"),
        ('{"profile": "alice", "content": "x", "importnce": 0.5}', "importnce", "not a known field"),
        ('{"profile": "al ice", "content": "x"}', "profile", "not a valid profile name"),
        ('{"content": "x"}', "profile", "is required"),
        ('{"profile": "alice", "content": "x", "valid_from": "2025-02-01", "valid_until": "2025-01-01"}',
         "valid_until", "later than valid_from"),
        ('{"profile": "alice", "content": "x", "embedding": [0.1, 0.2]}', "embedding", "384 numbers"),
        ('{"profile": "alice", "content": "x", "type": "fact"}', "type", "'memory' or 'edge'"),
    ],
)
def test_bad_line_is_named_and_good_lines_are_stored(
    store: Store, tmp_path: Path, bad_line: str, field: str | None, message: str
) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", [GOOD, bad_line, {**GOOD, "content": "Alice walks"}])
    report = ingest_file(store, path)
    assert report.stored == 2
    (error,) = report.errors
    assert error.where == "line 2" and error.field == field
    assert message in str(error) and str(error).startswith("line 2")
    assert len(in_read(store, "alice", memories_repo.memories)) == 2


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        ('{"profile": "alice", "content": "hel', "Unterminated string starting at column 33"),
        ('{"profile": "alice", "content": "hello"', "Expecting ',' delimiter at column 40"),
        ('{"profile": "alice", "content": "hello", ',
         "Expecting property name enclosed in double quotes at column 42"),
    ],
)
@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_a_line_cut_short_is_reported_at_its_own_line_and_column(
    store: Store, tmp_path: Path, cut: str, message: str, ending: str
) -> None:
    # Cut short in the middle of the file and at its very end (no line ending there):
    # the line's ending once made json report "column 1" of a line after it.
    path = tmp_path / "in.jsonl"
    path.write_text(f"{json.dumps(GOOD)}{ending}{cut}{ending}"
                    f"{json.dumps({**GOOD, 'content': 'Alice walks'})}{ending}{cut}",
                    encoding="utf-8", newline="")
    report = ingest_file(store, path)
    assert report.stored == 2
    assert [str(e) for e in report.errors] == [
        f"line 2: is not valid JSON: {message}", f"line 4: is not valid JSON: {message}"]


def test_a_megabyte_of_text_is_refused_by_length(store: Store, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", [{**GOOD, "content": "x" * 1_048_576}, GOOD])
    report = ingest_file(store, path)
    assert report.stored == 1
    assert "1048576 characters" in str(report.errors[0]) and report.errors[0].field == "content"


def test_invalid_utf8_and_blank_lines(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n\n" + b'{"content": "\xff\xfe"}\n')
    report = ingest_file(store, path)
    assert report.stored == 1
    assert report.errors[0].where == "line 3" and "UTF-8" in str(report.errors[0])


def test_odd_but_valid_unicode_is_kept_and_normalised(store: Store) -> None:
    decomposed = "Cafe\u0301 ☕ שלום 🧠"
    report = ingest_records(store, [{"content": decomposed, "id": "u1"}], profile="alice")
    assert not report.errors
    assert get_memory(store, "u1").content == "Café ☕ שלום 🧠"


def test_every_stored_record_is_complete(store: Store, tmp_path: Path) -> None:
    ingest_file(store, write_jsonl(tmp_path / "in.jsonl", [GOOD, "{oops"]))
    (m,) = in_read(store, "alice", memories_repo.memories)
    row = get_memory(store, m.id)
    assert row.embedding_model == MODEL_NAME
    assert row.content_hash == ids.content_hash(row.content)
    assert np.linalg.norm(stored_vector(store, m.id)) == pytest.approx(1.0, abs=1e-5)


def test_reingesting_an_external_id_updates_instead_of_duplicating(store: Store) -> None:
    first = ingest_records(store, [record("Bob likes jazz", id="b1", importance=0.4)], profile="bob")
    again = ingest_records(store, [record("Bob likes jazz", id="b1", importance=0.4)], profile="bob")
    changed = ingest_records(store, [record("Bob loves jazz", id="b1", importance=0.9)], profile="bob")
    assert (first.stored, again.unchanged, changed.updated) == (1, 1, 1)
    (m,) = in_read(store, "bob", memories_repo.memories)
    assert (m.content, m.importance, m.external_id) == ("Bob loves jazz", 0.9, "b1")
    assert stored_vector(store, m.id) is not None


def test_an_update_keeps_fields_it_does_not_mention(store: Store) -> None:
    ingest_records(store, [record("Bob likes jazz", id="b1", kind="preference", confidence=0.9)], profile="bob")
    ingest_records(store, [record("Bob likes jazz", id="b1", importance=0.7)], profile="bob")
    (m,) = in_read(store, "bob", memories_repo.memories)
    assert (m.kind, m.confidence, m.importance) == ("preference", 0.9, 0.7)


def test_the_same_external_id_in_two_profiles_is_two_memories(store: Store) -> None:
    ingest_records(store, [record("x one", id="1", profile="a"), record("x two", id="1", profile="b")])
    assert len(in_read(store, "a", memories_repo.memories)) == len(in_read(store, "b", memories_repo.memories)) == 1


def test_embeddings_are_cached_by_content_hash(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    ingest_records(store, [record("The sky is blue", id="1")], profile="a")
    embedder = embedder_of(store)
    calls: list[int] = []
    original = embedder.encode
    monkeypatch.setattr(embedder, "encode", lambda texts, progress=False: calls.append(len(texts)) or original(texts))
    ingest_records(store, [record("The sky is blue", id="2"), record("Grass is green", id="3")], profile="b")
    assert calls == [1]


def test_supplied_embeddings_are_used_as_given(store: Store) -> None:
    vector = at_cosine(0.85)
    ingest_records(store, [record("v", id="v", embedding=vector.tolist())], profile="a")
    row = get_memory(store, "v")
    assert row.embedding_model == SUPPLIED_EMBEDDING
    assert np.array_equal(stored_vector(store, row.id), vector)


def test_a_new_supplied_vector_updates_the_memory_and_the_same_one_changes_nothing(
    store: Store,
) -> None:
    first, second = at_cosine(0.85), at_cosine(0.5)
    ingest_records(store, [record("v", id="v", embedding=first.tolist())], profile="a")
    same = ingest_records(store, [record("v", id="v", embedding=first.tolist())], profile="a")
    moved = ingest_records(store, [record("v", id="v", embedding=second.tolist())], profile="a")
    assert (same.unchanged, moved.updated) == (1, 1)
    memory_id = get_memory(store, "v").id
    assert np.array_equal(stored_vector(store, memory_id), second)
    (memory,), vectors = in_read(store, "a", memories_repo.snapshot)
    assert memory.id == memory_id and np.array_equal(vectors[0], second)


def test_edges_refer_to_memories_by_external_id(store: Store, tmp_path: Path) -> None:
    lines = [
        {"profile": "a", "id": "x", "content": "first"},
        {"profile": "a", "id": "y", "content": "second"},
        {"type": "edge", "profile": "a", "source": "y", "target": "x", "weight": 0.4,
         "last_strengthened_at": "2025-01-01T00:00:00Z"},
        {"type": "edge", "profile": "a", "source": "x", "target": "nope"},
        {"type": "edge", "profile": "a", "source": "x", "target": "y", "weight": 2},
    ]
    report = ingest_file(store, write_jsonl(tmp_path / "in.jsonl", lines))
    assert report.edges == 1
    assert [(e.where, e.field) for e in report.errors] == [("line 5", "weight"), ("line 4", "target")]
    (e,) = in_read(store, "a", edges_repo.edges)
    assert e.source_id < e.target_id and e.weight == 0.4 == e.base_weight


def test_edges_over_more_memories_than_one_query_can_name(store: Store) -> None:
    # 17,000 distinct ends: one IN list of them all would bind 34,000 values, more than
    # SQLite allows in one statement as built by default (32,766; Debian's build allows
    # 250,000, where the 1M benchmark found this). Hold this store to the default.
    if store.url.startswith("sqlite"):
        engine = engine_for(store.url)

        @event.listens_for(engine, "connect")
        def _default_limit(connection, _record) -> None:  # type: ignore[no-untyped-def]
            connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 32_766)

        engine.dispose()  # connections made from now on have the limit
    vector = at_cosine(0.5).tolist()
    count = 17_000
    records = [{"id": f"m{k}", "content": f"fact {k}", "embedding": vector} for k in range(count)]
    records += [{"type": "edge", "source": f"m{k}", "target": f"m{k + 1}", "weight": 0.5}
                for k in range(0, count, 2)]
    report = ingest_records(store, records, profile="big")
    assert report.errors == [] and (report.stored, report.edges) == (count, count // 2)
    assert len(in_read(store, "big", edges_repo.edges)) == count // 2


def test_python_api_names_records_by_position(store: Store) -> None:
    report = ingest_records(store, [record("fine"), {"content": None}], profile="a")
    assert report.errors[0].where == "record 2" and report.errors[0].field == "content"


def test_ingest_counts_stores_per_profile_and_keeps_everything_hot(store: Store) -> None:
    report = ingest_records(store, [record("one"), record("two")], profile="a")
    ingest_records(store, [record("one")], profile="a", at=datetime(2030, 1, 1))  # a new memory
    assert in_read(store, "a", memories_repo.counts) == {Tier.HOT: 3, "cold": 0, "tombstones": 0}
    with reading(store.url) as s:
        assert s.get(Profile, "a").store_count == 3
    assert len(report.stored_ids) == 2


def test_every_given_field_is_stored_even_when_records_differ(store: Store) -> None:
    sparse = {"content": "first, with nothing else"}
    full = {
        "id": "full", "content": "second, with everything", "kind": "decision",
        "entity": "billing", "layer": "implementation", "importance": 0.9, "confidence": 0.8,
        "stability": 2.5, "access_count": 4, "created_at": "2025-01-02T03:04:05Z",
        "last_accessed_at": "2025-02-03T04:05:06+01:00", "valid_from": "2025-01-01",
        "valid_until": "2026-01-01", "session_id": 77, "status": "in_progress",
        "protected": True, "metadata": {"source": "test"},
    }
    assert not ingest_records(store, [sparse, full, sparse | {"content": "third"}], profile="p").errors
    m = get_memory(store, "full")
    assert (m.kind, m.entity, m.layer, m.importance, m.confidence, m.stability, m.access_count) == (
        "decision", "billing", "implementation", 0.9, 0.8, 2.5, 4)
    assert m.created_at == datetime(2025, 1, 2, 3, 4, 5)
    assert m.last_accessed_at == datetime(2025, 2, 3, 3, 5, 6)  # converted to UTC
    assert (m.valid_from, m.valid_until) == (datetime(2025, 1, 1), datetime(2026, 1, 1))
    assert (m.session_id, m.status, m.protected, m.meta) == (
        "77", "in_progress", True, {"source": "test"})


# --- bounds: what the store and every later step can hold ------------------------------


def nested(depth: int) -> dict:
    """A metadata object with ``depth`` levels of objects and lists (1: ``{}``)."""
    value: object = "leaf"
    for level in range(depth - 1):
        value = [value] if level % 2 else {"k": value}
    return {"k": value}


def depth_of(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    return 0


def metadata_of_size(chars: int) -> dict:
    """Metadata whose JSON text is exactly ``chars`` characters long."""
    frame = len(json.dumps({"pad": ""}, ensure_ascii=False))
    return {"pad": "x" * (chars - frame)}


UNIT = [1.0] + [0.0] * 383

ACCEPTED = [
    ("access_count", MAX_COUNT),
    ("access_count", 0),
    ("stability", MAX_STABILITY),
    ("created_at", "1900-01-01T00:00:00Z"),
    ("created_at", "2200-12-31T23:59:59.999999Z"),
    ("created_at", "1900-01-01T00:30:00+00:30"),  # 1900-01-01 00:00 in UTC
    ("last_accessed_at", "1900-01-01"),
    ("valid_until", "2200-12-31"),
    ("metadata", nested(MAX_METADATA_DEPTH)),
    ("metadata", metadata_of_size(MAX_METADATA_CHARS)),
    ("metadata", {"n": 2**63 - 1, "m": -(2**63), "f": 1e308, "b": True, "z": None, "l": []}),
    ("metadata", {"clé": "ünïcode ☕ 🧠", "": ""}),
    ("embedding", [1e300] * 384),  # its squares overflow, its length does not
    ("embedding", [1e-320] * 384),  # its squares vanish, its length does not
    ("embedding", [3] + [4] + [0] * 382),  # integers are numbers
    ("content", "é"),
    ("content", "e\u0301"),  # decomposed: a letter and its accent
    ("content", "!"),
    ("content", "🧠"),
    ("id", 10**255 - 1),
]


@pytest.mark.parametrize(("field", "value"), ACCEPTED, ids=lambda v: str(v)[:30])
def test_values_at_the_bounds_are_stored(store: Store, field: str, value: object) -> None:
    bad = {**GOOD, "content": "a fact at the bounds", "id": "edge-case", field: value}
    report = ingest_records(store, [GOOD, bad], profile="alice")
    assert report.errors == [] and report.stored == 2
    if field == "metadata":
        stored = get_memory(store, "edge-case").meta
        assert stored == value and depth_of(stored) == depth_of(value)
    if field == "embedding":  # scaled to unit length, not overflowed to zeros
        vector = stored_vector(store, get_memory(store, "edge-case").id).astype(np.float64)
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)


REJECTED = [
    ("access_count", MAX_COUNT + 1, "at most 1,000,000,000"),
    ("access_count", 2**31, "at most"),  # PostgreSQL's integer column ends at 2**31 - 1
    ("access_count", 1180591620717411303424, "at most"),  # beyond SQLite's 64 bits
    ("access_count", 1e300, "at most"),
    ("access_count", True, "whole number"),
    ("stability", MAX_STABILITY * (1 + 1e-15), "between 0 and"),
    ("stability", -1e-300, "between 0 and"),
    ("importance", 10**400, "finite"),  # float() of it overflows
    ("created_at", "1899-12-31T23:59:59Z", "between 1900 and 2200"),
    ("created_at", "2201-01-01T00:00:00Z", "between 1900 and 2200"),
    ("created_at", "1900-01-01T00:00:00+00:01", "between 1900 and 2200"),  # 1899 in UTC
    ("created_at", "0001-01-01T00:00:00Z", "between 1900 and 2200"),
    ("created_at", "0001-01-01T00:00:00+05:00", "between 1900 and 2200"),  # no year 0
    ("created_at", "9999-12-31T23:59:59-05:00", "between 1900 and 2200"),  # no year 10000
    ("last_accessed_at", "1899-12-31", "between 1900 and 2200"),
    ("valid_from", "0001-01-01", "between 1900 and 2200"),
    ("valid_until", "9999-12-31", "between 1900 and 2200"),
    ("metadata", nested(MAX_METADATA_DEPTH + 1), "nested more than 32 levels"),
    ("metadata", nested(900), "nested more than 32 levels"),
    ("metadata", metadata_of_size(MAX_METADATA_CHARS + 1), "longer than the limit of 65536"),
    ("metadata", {"a": "\ud800"}, "a value that contains an unpaired surrogate"),
    ("metadata", {"\udfff": 1}, "a key that contains an unpaired surrogate"),
    ("metadata", {"a": [{"b": ["ok", "x\ud83d"]}]}, "unpaired surrogate"),
    ("metadata", {"a": "nul\x00"}, "a value that contains a NUL"),
    ("metadata", {"nul\x00": 1}, "a key that contains a NUL"),
    ("metadata", {"n": 2**63}, "signed 64-bit range"),
    ("metadata", {"n": -(2**63) - 1}, "signed 64-bit range"),
    ("metadata", {"f": float("inf")}, "NaN or infinity"),
    ("embedding", [1e308] * 384, "too long: its length is beyond floating point"),
    ("embedding", [True] + [0.0] * 383, "list of numbers"),
    ("embedding", ["0.5"] * 384, "list of numbers"),
    ("embedding", [[1.0]] * 384, "list of numbers"),
    ("embedding", [10**400] + [0] * 383, "beyond floating point"),
    ("embedding", [float("nan")] + [0.0] * 383, "NaN or infinity"),
    ("embedding", [0.0] * 384, "all zeros"),
    ("embedding", "0.5", "list of numbers"),
    ("content", "\u0301", "no letter, digit, punctuation or symbol"),
    ("content", "\u0301\u200d\u00a0\u0300", "no letter, digit, punctuation or symbol"),
    ("id", 10**256, "longer than the limit of 256"),
]


@pytest.mark.parametrize(("field", "value", "message"), REJECTED, ids=lambda v: str(v)[:30])
def test_values_past_the_bounds_are_named_and_the_good_lines_are_stored(
    store: Store, tmp_path: Path, field: str, value: object, message: str
) -> None:
    bad = {**GOOD, "content": "a fact past the bounds", field: value}
    try:
        line = json.dumps(bad, allow_nan=True)
    except ValueError:  # not expressible in JSON (e.g. a number JSON cannot round-trip)
        line = None
    if line is not None and json.loads(line) == bad:
        path = write_jsonl(tmp_path / "in.jsonl", [GOOD, line, {**GOOD, "content": "Alice walks"}])
        report = ingest_file(store, path)
        where = "line 2"
    else:  # NaN, infinity: the Python API can offer what JSON cannot spell
        report = ingest_records(store, [GOOD, bad, {**GOOD, "content": "Alice walks"}])
        where = "record 2"
    assert report.stored == 2
    (error,) = report.errors
    assert (error.where, error.field) == (where, field)
    assert message in str(error) and str(error).startswith(f"{where}, field '{field}'")
    assert "past the bounds" not in str(error)
    assert sorted(m.content for m in in_read(store, "alice", memories_repo.memories)) == [
        "Alice drinks green tea every morning", "Alice walks"]


def test_a_number_too_long_to_read_is_a_bad_line(store: Store, tmp_path: Path) -> None:
    digits = "9" * 4301  # one past Python's limit for converting text to an integer
    bad = '{"profile": "alice", "content": "x", "access_count": ' + digits + "}"
    path = write_jsonl(tmp_path / "in.jsonl", [GOOD, bad, {**GOOD, "content": "Alice walks"}])
    report = ingest_file(store, path)
    assert report.stored == 2
    (error,) = report.errors
    assert (error.where, error.field) == ("line 2", None)
    assert "a number is too long" in str(error)
    assert len(in_read(store, "alice", memories_repo.memories)) == 2


def test_python_values_json_cannot_hold_are_refused(store: Store) -> None:
    cyclic: dict = {}
    cyclic["self"] = cyclic
    bad = [
        {"content": "x", "access_count": 10**5000},
        {"content": "x", "importance": 10**5000},
        {"content": "x", "id": 10**5000},
        {"content": "x", "metadata": {"n": 10**5000}},
        {"content": "x", "metadata": {1: "int key"}},
        {"content": "x", "metadata": {"t": (1, 2)}},
        {"content": "x", "metadata": {"s": {1}}},
        {"content": "x", "metadata": cyclic},
        {"content": "x", "embedding": np.ones(384, dtype=bool)},
        {"content": "x", "embedding": np.array(["1"] * 384)},
    ]
    report = ingest_records(store, [GOOD, *bad], profile="alice")
    assert report.stored == 1
    fields = ["access_count", "importance", "id", *["metadata"] * 5, "embedding", "embedding"]
    assert [(e.where, e.field) for e in report.errors] == [
        (f"record {n}", f) for n, f in enumerate(fields, start=2)]


def test_edge_times_and_metadata_are_bounded_too(store: Store) -> None:
    records = [
        {"id": "x", "content": "first"}, {"id": "y", "content": "second"},
        {"type": "edge", "source": "x", "target": "y", "created_at": "0001-01-01"},
        {"type": "edge", "source": "x", "target": "y", "last_strengthened_at": "2201-01-01"},
        {"type": "edge", "source": "x", "target": "y", "metadata": {"a": "\ud800"}},
        {"type": "edge", "source": "x", "target": "y", "weight": 0.3},
    ]
    report = ingest_records(store, records, profile="a")
    assert [(e.where, e.field) for e in report.errors] == [
        ("record 3", "created_at"), ("record 4", "last_strengthened_at"),
        ("record 5", "metadata")]
    assert report.edges == 1


def test_records_at_the_bounds_survive_every_step(store: Store) -> None:
    """Extreme but accepted values: exported and consolidated without a failure."""
    from test_ingest_properties import run_steps

    vector = at_cosine(0.9).tolist()
    oldest = {"created_at": "1900-01-01T00:00:00Z", "last_accessed_at": "1900-01-01",
              "access_count": MAX_COUNT, "stability": MAX_STABILITY, "entity": "e",
              "layer": "implementation", "metadata": nested(MAX_METADATA_DEPTH)}
    newest = {"created_at": "2200-12-31T23:59:59Z", "valid_until": "2200-12-31T23:59:59Z",
              "access_count": MAX_COUNT, "stability": MAX_STABILITY, "entity": "e",
              "kind": "decision", "metadata": metadata_of_size(MAX_METADATA_CHARS)}
    records = [{"content": f"extreme fact {k}", "embedding": vector, **(oldest if k % 2 else newest)}
               for k in range(8)]
    assert not ingest_records(store, records, profile="x").errors
    for as_of in (datetime(1900, 1, 2), datetime(2026, 1, 1), datetime(2200, 12, 31)):
        run_steps(store, "x", as_of)
    export_jsonl(store.url, "x")


# --- the store's own guard, and what errors may say ------------------------------------

SECRET = "my bank PIN is 4921"


def test_a_value_the_database_refuses_loses_only_its_own_record(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Validation would refuse it first; lift the bound to reach the database's refusal
    # (beyond 64 bits for SQLite, beyond 32 for PostgreSQL's integer column).
    monkeypatch.setattr("reverie.models.validation.MAX_COUNT", 2**70)
    records = [{"content": f"{SECRET} ({k})"} for k in range(3)]
    records.insert(2, {"content": "a count past every column", "access_count": 2**63})
    report = ingest_records(store, records, profile="alice")
    assert report.stored == 3
    (error,) = report.errors
    assert (error.where, error.field) == ("record 3", None)
    assert str(error).startswith("record 3: could not be stored: ")
    assert SECRET not in str(error) and "past every column" not in str(error)
    assert len(in_read(store, "alice", memories_repo.memories)) == 3
    with reading(store.url) as s:
        assert s.get(Profile, "alice").store_count == 3


def test_a_refused_update_keeps_the_other_updates(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest_records(store, [{"id": k, "content": f"fact {k}"} for k in "abc"], profile="alice")
    monkeypatch.setattr("reverie.models.validation.MAX_COUNT", 2**70)
    report = ingest_records(store, [{"id": "a", "content": "fact a", "access_count": 5},
                           {"id": "b", "content": "fact b", "access_count": 2**63},
                           {"id": "c", "content": "fact c", "access_count": 7}], profile="alice")
    assert (report.updated, [e.where for e in report.errors]) == (2, ["record 2"])
    assert [get_memory(store, k).access_count for k in "abc"] == [5, 0, 7]


def test_a_database_error_does_not_quote_record_content(store: Store) -> None:
    ingest_records(store, [{"id": "s", "content": SECRET}], profile="alice")
    memory = Memory.__table__
    with reading(store.url) as s:
        row = dict(s.execute(select(memory).where(memory.c.external_id == "s")).mappings().one())
    with pytest.raises(IntegrityViolationError) as caught:  # the same primary key again
        with writing(store.url) as s:
            s.execute(insert(memory), [row])
    cause = caught.value.__cause__
    assert isinstance(cause, IntegrityError)
    assert "4921" not in str(caught.value) and "4921" not in str(cause)
    assert "parameters hidden" in str(cause)


# --- ids in either Unicode form -----------------------------------------------------------
# One id, "café", spelled composed (NFC) and decomposed (NFD); a profile too.
CAFE, CAFE_NFD = "caf\u00e9", "cafe\u0301"
ZOE, ZOE_NFD = "zo\u00eb", "zoe\u0308"


@pytest.mark.parametrize("given", [CAFE, CAFE_NFD], ids=["stored NFC", "stored NFD"])
def test_an_id_is_found_as_given_in_either_unicode_form(store: Store, given: str) -> None:
    report = ingest_records(store, [record("Zoë orders a flat white", id=given)], profile=ZOE_NFD)
    assert not report.errors and store.profiles() == [ZOE]
    for ident in (CAFE, CAFE_NFD, f" {CAFE_NFD} "):
        for profile in (None, ZOE, ZOE_NFD):
            found = get_memory(store, ident, profile)
            assert (found.external_id, found.profile_id) == (CAFE, ZOE)
    assert [m.external_id for m in in_read(store, ZOE_NFD, memories_repo.memories)] == [CAFE]
    assert store.resolve_profiles([ZOE_NFD, ZOE]) == [ZOE]


def test_a_lookup_that_no_stored_id_can_match_is_not_found(store: Store) -> None:
    ingest_records(store, [record("x", id=CAFE)], profile="a")
    for ident in ("caf\x00e", "caf\ud800"):
        with pytest.raises(NotFoundError, match="no memory with id"):
            get_memory(store, ident)


def test_two_spellings_of_one_id_in_one_file_are_reported_and_the_rest_is_stored(
    store: Store, tmp_path: Path
) -> None:
    lines = [
        {"profile": "a", "id": CAFE, "content": "the corner café opens at seven"},
        {"profile": "a", "id": "tea", "content": "green tea after lunch"},
        {"profile": "a", "id": CAFE_NFD, "content": "a different café, by the station"},
        {"profile": "b", "id": CAFE_NFD, "content": "another profile's café"},
        {"profile": "a", "id": f" {CAFE} ", "content": "the corner café opens at half past seven"},
    ]
    report = ingest_file(store, write_jsonl(tmp_path / "in.jsonl", lines))
    (error,) = report.errors
    assert (error.where, error.field) == ("line 3", "id")
    assert "line 1" in str(error) and "Unicode form" in str(error)
    assert ascii(CAFE_NFD) in str(error) and ascii(CAFE) in str(error)
    # The first spelling stands, and its later records update it as always.
    assert report.stored == 3 and report.updated == 0
    assert get_memory(store, CAFE, "a").content == "the corner café opens at half past seven"
    assert get_memory(store, CAFE, "b").content == "another profile's café"


def test_a_stored_id_is_updated_by_a_later_file_in_its_other_spelling(store: Store) -> None:
    ingest_records(store, [record("Maya is 41", id=CAFE_NFD)], profile="a")
    report = ingest_records(store, [record("Maya is 42", id=CAFE)], profile="a")
    assert (report.stored, report.updated, report.errors) == (0, 1, [])
    (m,) = in_read(store, "a", memories_repo.memories)
    assert (m.external_id, m.content) == (CAFE, "Maya is 42")


@pytest.mark.parametrize(
    ("first", "second", "clash"),
    [
        ("K1", "\u212a1", True),  # KELVIN SIGN: its NFC form is the ASCII letter K
        ("\u212a1", "K1", True),
        ("a;b", "a\u037eb", True),  # GREEK QUESTION MARK, NFC ';'
        ("m1", "m1", False),  # one spelling twice: the later updates, as always
        ("m1", 1, False),  # an integer id is its digits
    ],
)
def test_the_spellings_that_meet_in_plain_ascii_are_reported_too(
    store: Store, first: object, second: object, clash: bool
) -> None:
    report = ingest_records(store, [{"id": first, "content": "one"}, {"id": second, "content": "two"}],
                            profile="a")
    assert [(e.where, e.field) for e in report.errors] == ([("record 2", "id")] if clash else [])


def test_edges_find_their_ends_in_either_spelling(store: Store, tmp_path: Path) -> None:
    lines = [
        {"profile": ZOE_NFD, "id": CAFE_NFD, "content": "the corner café opens at seven"},
        {"profile": ZOE, "id": "thé", "content": "green tea after lunch"},
        {"type": "edge", "profile": ZOE, "source": CAFE, "target": "the\u0301", "weight": 0.4},
        {"type": "edge", "profile": ZOE_NFD, "source": "thé", "target": CAFE_NFD, "kind": "contradicts"},
    ]
    report = ingest_file(store, write_jsonl(tmp_path / "in.jsonl", lines))
    assert report.errors == [] and report.edges == 2
    ends = {get_memory(store, CAFE).id, get_memory(store, "thé").id}
    assert [{e.source_id, e.target_id} for e in in_read(store, ZOE, edges_repo.edges)] == [ends] * 2


def test_sessions_and_restores_take_names_in_either_spelling(
    store: Store, new_store: Callable[[str], Store], tmp_path: Path
) -> None:
    from reverie.models.backup import backup_lines, restore_file
    from reverie.models.config import ColdConfig

    ingest_records(store, [record("x", id="a1", session_id=CAFE_NFD)], profile=ZOE_NFD)
    assert get_memory(store, "a1").session_id == CAFE
    # Cold consolidation of one session compares this with the stored session ids.
    assert ColdConfig(scope="session", session_id=CAFE_NFD).session_id == CAFE

    backup = tmp_path / "zoe.jsonl"
    backup.write_text("".join(backup_lines(store.url, ZOE)), encoding="utf-8")
    restored = restore_file(new_store("elsewhere").url, backup, expected=ZOE_NFD)
    assert restored.profile == ZOE
