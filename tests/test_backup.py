"""A profile's backup (`reverie export`) restores exactly (`reverie ingest`): tiers,
vectors, edges, blocks, the audit, tombstones and run history; all or nothing. A restore
refuses what it cannot vouch for: a file cut short, edited or foreign, a row ingest
would refuse (a vector above all), a reference to a memory the backup lacks, a key
used twice or already in the store; each named by its line, table and field."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reverie.deployments.cli import EXIT_ERROR, EXIT_OK, main
from reverie.models.backup import backup_lines, plan_restore, restore, restore_file
from reverie.models.config import ConsolidationConfig, ForgetConfig
from reverie.models.db import dispose
from reverie.models.errors import InputError, RefusedError, StoreError
from reverie.models.export import export_jsonl
from reverie.models.ingest import ingest
from reverie.models.store import Store
from reverie.models.tables import CoreBlock, Memory, RunRecord
from reverie.models.vectors import DIMENSION
from reverie.recall.search import candidates_for
from reverie.tasks.blocks import compile_blocks
from reverie.tasks.decay import decay
from reverie.tasks.dedup import dedup
from reverie.tasks.forget import forget
from reverie.tasks.step import StepArgs

from conftest import TEST_POSTGRES
from factories import at_cosine, axis, ingest_records, record_runs
from test_ingest_properties import AS_OF, PROFILE, Planned, batches, run_steps

_names = itertools.count()
FORGETTING = ConsolidationConfig(summarizer="rules", forget=ForgetConfig(
    archive_threshold=0.3, delete_threshold=0.1, grace_period_days=0.0))


def lived(store: Store) -> None:
    """A profile with a history: consolidated twice, some memories archived, some
    deleted (tombstones), a run recorded."""
    run_steps(store, PROFILE)
    later = AS_OF + timedelta(days=400)
    run_steps(store, PROFILE, later)
    forget(store, StepArgs(store.url, PROFILE, later, FORGETTING, "run-1"))
    record_runs(store, [RunRecord(profile_id=PROFILE, flow="decay", run_id="run-1", as_of=later,
                                 started_at=later, finished_at=later)])


def backed_up(store: Store, path: Path) -> str:
    text = "".join(backup_lines(store.url, PROFILE))
    path.write_text(text, encoding="utf-8")
    return text


@settings(max_examples=12, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(batch=batches())
def test_a_backup_restores_the_profile_exactly(
    new_store: Callable[[str], Store], tmp_path: Path, batch: tuple[bool, list[Planned]]
) -> None:
    _, plans = batch
    source = new_store(f"source{next(_names)}")
    ingest_records(source, [p.record for p in plans if p.record is not None], profile=PROFILE)
    if PROFILE not in source.profiles():
        return  # every record was refused: nothing to back up
    lived(source)
    path = tmp_path / f"backup{next(_names)}.jsonl"
    first = backed_up(source, path)
    target = new_store(f"target{next(_names)}")
    report = restore_file(target.url, path)
    assert report.profile == PROFILE and report.rows["profile"] == 1
    assert backed_up(target, tmp_path / "again.jsonl") == first
    assert export_jsonl(target.url, PROFILE, True) == export_jsonl(source.url, PROFILE, True)


@pytest.fixture
def sample_backup(sample_store: Store, tmp_path: Path) -> Path:
    path = tmp_path / "maya.jsonl"
    path.write_text("".join(backup_lines(sample_store.url, "maya")), encoding="utf-8")
    return path


def test_a_restore_refuses_a_profile_the_store_has(
    sample_store: Store, sample_backup: Path
) -> None:
    before = export_jsonl(sample_store.url, "maya")
    with pytest.raises(StoreError, match="already has a profile named 'maya'"):
        restore_file(sample_store.url, sample_backup)
    assert export_jsonl(sample_store.url, "maya") == before


def test_a_bad_line_names_its_line_and_field_and_nothing_is_written(
    new_store: Callable[[str], Store], sample_backup: Path
) -> None:
    # Split on newlines only: content may hold other line separators (U+2028).
    lines = [f"{line}\n" for line in sample_backup.read_text(encoding="utf-8").split("\n")[:-1]]
    memory = next(i for i, line in enumerate(lines) if '"table": "memory"' in line)
    row = json.loads(lines[memory])
    row["row"]["created_at"] = "last tuesday"
    lines[memory] = json.dumps(row) + "\n"
    other = json.loads(lines[memory + 1])
    other["row"]["access_count"] = "many"
    lines[memory + 1] = json.dumps(other) + "\n"
    lines.insert(3, json.dumps({"table": "memory", "row": {"id": "m-x", "colour": "red"}}) + "\n")
    target = new_store("target")
    bad = [
        "line 4 (table memory), field 'colour': is not a column of memory",
        f"line {memory + 3} (table memory), field 'access_count': must be an integer",
        f"line {memory + 1} (table memory), field 'created_at': is not an ISO-8601 date-time",
    ]
    # As edited, the end record no longer vouches for the file; sealed again (as someone
    # who meant it could), the rows are still checked one by one.
    for text, first in ((lines, "field 'tables.memory.rows'"), (sealed(lines), bad[2])):
        with pytest.raises(InputError) as refused:
            restore(target.url, text)
        message = str(refused.value)
        assert message.startswith("backup of 'maya' not restored, nothing written: ")
        assert first in message.split("; ")[0]
        assert all(b in message for b in bad)
    assert target.profiles() == []


def test_a_restore_of_another_profile_than_named_is_refused(
    new_store: Callable[[str], Store], sample_backup: Path
) -> None:
    target = new_store("target")
    with pytest.raises(InputError, match="backup is of profile 'maya', not 'raj'"):
        restore_file(target.url, sample_backup, "raj")
    assert target.profiles() == []


@pytest.mark.skipif(not TEST_POSTGRES, reason="needs REVERIE_TEST_POSTGRES")
def test_a_profile_moves_from_sqlite_to_postgresql_and_back(
    sample_template: Path, tmp_path: Path
) -> None:
    from conftest import _create_postgres_database, _drop_postgres_database, clone_sample

    sqlite = Store(f"sqlite:///{tmp_path / 'from.db'}")
    clone_sample(sample_template, sqlite)
    postgres = _create_postgres_database()
    try:
        path = tmp_path / "maya.jsonl"
        path.write_text("".join(backup_lines(sqlite.url, "maya")), encoding="utf-8")
        restore_file(postgres, path)
        back = Store(f"sqlite:///{tmp_path / 'back.db'}")
        back.create()
        again = tmp_path / "again.jsonl"
        again.write_text("".join(backup_lines(postgres, "maya")), encoding="utf-8")
        restore_file(back.url, again)
        assert again.read_text() == path.read_text()
        assert export_jsonl(back.url, "maya", True) == export_jsonl(sqlite.url, "maya", True)
    finally:
        _drop_postgres_database(postgres)


# --- a small lived profile, built without the embedding model --------------------------


class _NoModel:
    """Every record brings its vector: nothing may ask for the model."""

    name = "none"

    def encode(self, texts: list[str], progress: object = False) -> np.ndarray:
        raise AssertionError("the model was asked for")


WHEN = datetime(2026, 1, 1)
SMALL = ConsolidationConfig(summarizer="rules", forget=ForgetConfig(
    archive_threshold=0.3, delete_threshold=0.1, grace_period_days=0.0))


def small_profile(store: Store, profile: str = "maya") -> list[str]:
    """Every table used (three near-duplicates merged, an edge, blocks, two memories
    forgotten into tombstones, a run) in a quarter of a second; its backup's lines."""
    records = [
        {"content": "Maya takes the train to work", "id": "t1", "kind": "preference",
         "embedding": at_cosine(0.99).tolist(), "created_at": "2025-01-01"},
        {"content": "Maya commutes by train", "id": "t2", "kind": "preference",
         "embedding": at_cosine(0.985).tolist(), "created_at": "2025-01-02"},
        {"content": "Maya rides the train daily", "id": "t3", "kind": "preference",
         "embedding": at_cosine(0.98).tolist(), "created_at": "2025-01-03"},
        {"content": "The billing service is written in Go", "id": "b1", "kind": "decision",
         "embedding": axis(5).tolist()},
        {"content": "An idle note nobody reads", "id": "n1", "importance": 0.0,
         "embedding": axis(7).tolist(), "created_at": "2024-01-01"},
        {"content": "Another idle note", "id": "n2", "importance": 0.0,
         "embedding": axis(8).tolist(), "created_at": "2024-01-01"},
        {"type": "edge", "source": "b1", "target": "t1", "weight": 0.6},
    ]
    report = ingest(store, records, _NoModel(), profile, at=WHEN)
    assert report.stored == 6 and report.edges == 1 and not report.errors
    for step in (decay, dedup, compile_blocks, forget):
        step(store, StepArgs(store.url, profile, WHEN, SMALL, "run-1"))
    record_runs(store, [RunRecord(profile_id=profile, flow="decay", run_id="run-1",
                                  as_of=WHEN, started_at=WHEN, finished_at=WHEN)])
    return list(backup_lines(store.url, profile))


@pytest.fixture(scope="module")
def small_lines(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    # Built once: the lines are plain data, restored into each test's own stores (on
    # the suite's back-end).
    url = f"sqlite:///{tmp_path_factory.mktemp('small') / 'small.db'}"
    try:
        return small_profile(Store(url))
    finally:
        dispose(url)


@pytest.fixture
def small(small_lines: list[str]) -> list[str]:
    return list(small_lines)


def sealed(lines: list[str]) -> list[str]:
    """``lines`` with a new end record, computed here from the format's description:
    what a file edited and then re-checksummed looks like."""
    body = [line for line in lines if not line.startswith('{"end"')]
    whole = hashlib.sha256()
    tables: dict[str, Any] = {t: [0, hashlib.sha256()] for t in json.loads(body[0])["tables"]}
    for line in body:
        whole.update(line.encode("utf-8"))
        table = json.loads(line).get("table")
        if table in tables:
            tables[table][0] += 1
            tables[table][1].update(line.encode("utf-8"))
    end = {"sha256": whole.hexdigest(),
           "tables": {t: {"rows": n, "sha256": h.hexdigest()} for t, (n, h) in tables.items()}}
    return [*body, json.dumps({"end": end}, sort_keys=True) + "\n"]


def row_line(lines: list[str], table: str, nth: int = 0) -> int:
    """The index of the ``nth`` row of ``table`` (its line number is one more)."""
    found = [i for i, line in enumerate(lines) if json.loads(line).get("table") == table]
    return found[nth]


def edited(lines: list[str], at: int, change: Callable[[dict[str, Any]], object]) -> list[str]:
    """``lines`` with the row at index ``at`` changed as the exporter would write it."""
    item = json.loads(lines[at])
    change(item["row"])
    out = list(lines)
    out[at] = json.dumps(item, sort_keys=True, ensure_ascii=False) + "\n"
    return out


def refused(store: Store, lines: list[str] | bytes, *expected: str) -> str:
    """Restore ``lines`` into ``store``: refused, every ``expected`` text in the error,
    nothing written."""
    source = [lines] if isinstance(lines, bytes) else lines
    with pytest.raises(InputError) as caught:
        restore(store.url, source)
    message = str(caught.value)
    for text in expected:
        assert text in message
    assert store.profiles() == []
    return message


def test_the_end_record_vouches_for_every_line_before_it(small: list[str]) -> None:
    header, end = json.loads(small[0]), json.loads(small[-1])["end"]
    assert header["reverie_backup"] == 2
    assert sealed(small) == small
    counts = {t: c["rows"] for t, c in end["tables"].items()}
    assert sorted(counts) == sorted(header["tables"]) and all(counts.values())  # all used
    assert sum(counts.values()) == len(small) - 2


def test_a_whole_backup_round_trips_byte_for_byte(
    new_store: Callable[[str], Store], small: list[str]
) -> None:
    target = new_store("target")
    report = restore(target.url, small)
    end = json.loads(small[-1])["end"]["tables"]
    assert report.profile == "maya" and report.rows == {t: c["rows"] for t, c in end.items()}
    assert list(backup_lines(target.url, "maya")) == small


def test_the_cli_round_trips_a_backup_byte_for_byte(
    new_store: Callable[[str], Store], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source, target = new_store("source"), new_store("target")
    small_profile(source)
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    monkeypatch.setenv("REVERIE_DATABASE_URL", source.url)
    assert main(["export", "--profile", "maya", "--output", str(first)]) == EXIT_OK
    monkeypatch.setenv("REVERIE_DATABASE_URL", target.url)
    assert main(["ingest", str(first)]) == EXIT_OK
    assert "restored profile maya: 1 profile, " in capsys.readouterr().out
    assert main(["export", "--profile", "maya", "--output", str(second)]) == EXIT_OK
    assert second.read_bytes() == first.read_bytes()


# --- a backup proves itself whole ------------------------------------------------------


def test_every_cut_at_a_line_boundary_is_refused(
    new_store: Callable[[str], Store], small: list[str]
) -> None:
    target = new_store("target")
    for n in range(1, len(small)):  # `head -n N` for every N short of the whole file
        refused(target, small[:n], f"line {n}", "without its end record: the file was cut short")
    refused(target, [*small[:-1], small[-1].rstrip("\n")], "(end record): is cut short")


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_cut_within_a_line_is_refused(small: list[str], data: st.DataObject) -> None:
    whole = "".join(small).encode("utf-8")
    cut = data.draw(st.integers(0, len(whole) - 1))
    with pytest.raises(InputError):
        plan_restore(whole[:cut].splitlines(keepends=True))


def test_an_edited_backup_is_refused_naming_the_table(
    new_store: Callable[[str], Store], small: list[str]
) -> None:
    target = new_store("target")
    memory = row_line(small, "memory")
    last = row_line(small, "memory", -1)
    changed = edited(small, memory, lambda row: row.update(importance=0.25))
    refused(target, changed, f"field 'tables.memory.sha256': table memory (lines {memory + 1}-"
            f"{last + 1}) is not as exported")
    edge = row_line(small, "edge", 1)
    edges = json.loads(small[-1])["end"]["tables"]["edge"]["rows"]
    refused(target, small[:edge] + small[edge + 1:], f"field 'tables.edge.rows': vouches for "
            f"{edges} rows of table edge; the file has {edges - 1}")
    spaced = [small[0].replace('"profile": "maya"', '"profile":  "maya"'), *small[1:]]
    refused(target, spaced, "field 'sha256': the lines before it are not as exported")
    refused(target, [*small, small[1]], f"line {len(small) + 1}: follows the end record "
            f"(line {len(small)})")
    refused(target, small + small, "follows the end record")


def test_a_foreign_file_is_refused(
    new_store: Callable[[str], Store], small: list[str]
) -> None:
    target = new_store("target")
    refused(target, b"\x00\xffPK\x03\x04 not text\n", "line 1: not a Reverie backup")
    refused(target, [], "line 1: not a Reverie backup: the file is empty")
    refused(target, ['{"content": "a memory, not a backup"}\n'], "line 1: not a Reverie backup")
    future = json.dumps({"reverie_backup": 3, "profile": "maya", "tables": []}) + "\n"
    refused(target, [future, *small[1:]], "is format 3; this Reverie reads format 2")
    # Another profile's rows under this one's header: the header is not theirs.
    raj = small_profile(new_store("raj"), "raj")
    refused(target, [small[0], *raj[1:]], "field 'sha256': the lines before it are not as "
            "exported", "line 2 (table profile), field 'id': must be the backup's profile")


def test_a_format_1_backup_is_refused_with_what_to_do(
    new_store: Callable[[str], Store], small: list[str]
) -> None:
    header = json.loads(small[0])
    header["reverie_backup"] = 1
    version_1 = [json.dumps(header) + "\n", *small[1:-1]]  # what format 1 wrote
    refused(new_store("target"), version_1, "line 1: a format 1 backup has no end record",
            "Export the profile again (format 2)")


def test_the_cli_refuses_a_backup_cut_at_a_line_boundary(
    new_store: Callable[[str], Store], small: list[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    target = new_store("target")
    cut = tmp_path / "head.jsonl"
    cut.write_text("".join(small[:row_line(small, "edge")]), encoding="utf-8")
    monkeypatch.setenv("REVERIE_DATABASE_URL", target.url)
    assert main(["ingest", str(cut)]) == EXIT_ERROR
    assert "without its end record" in capsys.readouterr().err
    assert target.profiles() == []


# --- every row passes ingest's checks ---------------------------------------------------


def _vector(row: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(row["embedding"]), dtype=np.float32).copy()


def _set_vector(row: dict[str, Any], blob: bytes) -> None:
    row["embedding"] = base64.b64encode(blob).decode("ascii")


def _scaled(factor: float) -> Callable[[dict[str, Any]], None]:
    return lambda row: _set_vector(row, (_vector(row) * np.float32(factor)).tobytes())


def _nan(row: dict[str, Any]) -> None:
    v = _vector(row)
    v[3] = np.nan
    _set_vector(row, v.tobytes())


BAD_VECTORS: dict[str, tuple[Callable[[dict[str, Any]], object], str, str]] = {
    "scaled by 1.5": (_scaled(1.5), "embedding", "embedding is not of unit length"),
    "just off unit length": (_scaled(1 + 1e-5), "embedding", "embedding is not of unit length"),
    "NaN": (_nan, "embedding", "embedding contains NaN or infinity"),
    "all zeros": (lambda row: _set_vector(row, bytes(4 * DIMENSION)), "embedding",
                  "embedding is all zeros"),
    "4 bytes short": (lambda row: _set_vector(row, base64.b64decode(row["embedding"])[:-4]),
                      "embedding", f"embedding is {4 * DIMENSION - 4} bytes, not {DIMENSION} float32"),
    "4 bytes long": (lambda row: _set_vector(row, base64.b64decode(row["embedding"]) + bytes(4)),
                     "embedding", f"embedding is {4 * DIMENSION + 4} bytes"),
    "of an unknown memory": (lambda row: row.update(memory_id="m-0000000000000000"),
                             "memory_id", "refers to no memory of this backup"),
}


@pytest.mark.parametrize("case", list(BAD_VECTORS))
def test_a_bad_vector_is_refused_naming_its_line(
    new_store: Callable[[str], Store], small: list[str], case: str
) -> None:
    change, column, reason = BAD_VECTORS[case]
    at = row_line(small, "memoryvector", 2)
    bad = edited(small, at, change)
    target = new_store("target")
    refused(target, bad, "tables.memoryvector")  # as it stands, the checksum refuses it
    refused(target, sealed(bad), f"line {at + 1} (table memoryvector), field '{column}': {reason}")


def test_a_vector_of_a_forgotten_memory_is_refused(
    new_store: Callable[[str], Store], small: list[str]
) -> None:
    tombstone = json.loads(small[row_line(small, "tombstone")])["row"]["memory_id"]
    at = row_line(small, "memoryvector")
    refused(new_store("target"), sealed(edited(small, at, lambda r: r.update(memory_id=tombstone))),
            f"line {at + 1} (table memoryvector), field 'memory_id': refers to no memory")


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.just(0) | st.integers(1, 8), extra=st.just(0) | st.integers(1, 8),
       factor=st.just(1.0) | st.floats(0.5, 2.0), element=st.integers(0, DIMENSION - 1),
       value=st.none() | st.floats(allow_nan=True, allow_infinity=True, width=32))
@example(cut=0, extra=0, factor=1.0, element=0, value=None)  # the restore goes through
def test_recall_never_meets_a_vector_it_cannot_read_after_a_restore(
    new_store: Callable[[str], Store], small: list[str], cut: int, extra: int, factor: float,
    element: int, value: float | None,
) -> None:
    """Whatever a vector line holds, a restore either refuses it or leaves vectors that
    recall's read (one (n, 384) matrix of unit rows) takes."""

    def change(row: dict[str, Any]) -> None:
        v = _vector(row) * np.float32(factor)
        if value is not None:
            v[element] = value
        blob = v.tobytes()
        _set_vector(row, blob[:len(blob) - cut] + bytes(extra))

    bad = sealed(edited(small, row_line(small, "memoryvector", 1), change))
    try:
        plan_restore(bad)
    except InputError:
        return
    target = new_store(f"recall{next(_names)}")
    restore(target.url, bad)
    candidates = candidates_for(target, "maya", deep=True)
    assert candidates.vectors.shape == (len(candidates.memories), DIMENSION)
    assert np.allclose(np.linalg.norm(candidates.vectors, axis=1), 1.0, atol=1e-5)


def test_recall_works_after_a_restore(
    new_store: Callable[[str], Store], sample_backup: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = new_store("target")
    restore_file(target.url, sample_backup)
    monkeypatch.setenv("REVERIE_DATABASE_URL", target.url)
    capsys.readouterr()
    assert main(["recall", "what does Maya prefer", "--profile", "maya", "--deep",
                 "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)


BAD_REFERENCES: dict[str, tuple[str, int, Callable[[dict[str, Any]], object], str]] = {
    "an edge from an unknown memory": (
        "edge", 0, lambda r: r.update(source_id="m-0000000000000000"), "source_id"),
    "an edge to an unknown memory": (
        "edge", 0, lambda r: r.update(target_id="m-0000000000000000"), "target_id"),
    "an audit row of an unknown summary": (
        "consolidation", 0, lambda r: r.update(summary_id="m-0000000000000000"), "summary_id"),
    "an audit row with an unknown member": (
        "consolidation", 1, lambda r: r["member_ids"].append("m-0000000000000000"),
        "member_ids"),
    "a memory superseded by an unknown one": (
        "memory", 1, lambda r: r.update(superseded_by="m-0000000000000000"), "superseded_by"),
}


@pytest.mark.parametrize("case", list(BAD_REFERENCES))
def test_a_reference_the_backup_cannot_answer_is_refused(
    new_store: Callable[[str], Store], small: list[str], case: str
) -> None:
    table, nth, change, column = BAD_REFERENCES[case]
    at = row_line(small, table, nth)
    refused(new_store("target"), sealed(edited(small, at, change)),
            f"line {at + 1} (table {table}), field '{column}': refers to no")


@pytest.mark.parametrize(("column", "value", "reason"), [
    ("importance", 1.5, "must be between 0 and 1"),
    ("entity", 5, "must be a string"),
    ("content", "a\u0000b", "contains a NUL character"),
    ("kind", "Preference", "is not as Reverie stores it"),
    ("content", "   ", "is empty"),
    ("content_hash", "0" * 64, "is not the hash of the memory's content"),
    ("tier", "lukewarm", "must be one of hot, cold"),
    ("relevance", float("nan"), "must be a finite number"),
    ("access_count", 2**40, "is beyond a 32-bit integer"),
    ("metadata", {"x": float("inf")}, "contains NaN or infinity"),
])
def test_a_memory_row_ingest_would_refuse_is_refused(
    new_store: Callable[[str], Store], small: list[str], column: str, value: object, reason: str
) -> None:
    at = row_line(small, "memory", 3)
    bad = sealed(edited(small, at, lambda r: r.update({column: value})))
    refused(new_store("target"), bad, f"line {at + 1} (table memory), field '{column}': {reason}")


def test_a_backup_from_before_ingest_stamps_restores_its_rows_as_stamped_zero(
    new_store: Callable[[str], Store], small: list[str]
) -> None:
    older = list(small)
    for table in ("profile", "memory"):
        for n in range(sum(json.loads(line).get("table") == table for line in older)):
            older = edited(older, row_line(older, table, n), lambda r: r.pop("ingest_seq"))
    target = new_store("target")
    restore(target.url, sealed(older))
    stamped = [json.loads(line) for line in backup_lines(target.url, "maya")]
    assert {item["row"]["ingest_seq"] for item in stamped
            if item.get("table") in ("profile", "memory")} == {0}


# --- keys -------------------------------------------------------------------------------


def test_a_key_used_twice_in_the_file_names_both_lines(
    new_store: Callable[[str], Store], small: list[str]
) -> None:
    target = new_store("target")
    at = row_line(small, "memory", 1)
    twice = sealed([*small[:at + 1], small[at], *small[at + 1:]])
    refused(target, twice, f"line {at + 2} (table memory), field 'id': repeats the key of "
            f"line {at + 1} (table memory)")
    other = edited(small, at, lambda r: r.update(id="m-0000000000000000"))
    first = row_line(small, "memory", 2)
    same_external = sealed(edited(other, at, lambda r: r.update(
        external_id=json.loads(small[first])["row"]["external_id"])))
    refused(target, same_external, f"line {first + 1} (table memory), field 'external_id': "
            f"repeats the key of line {at + 1}")


def test_a_key_the_store_has_is_refused_naming_the_line(
    new_store: Callable[[str], Store], small: list[str]
) -> None:
    target = new_store("target")
    at = row_line(small, "memory", 2)
    taken = json.loads(small[at])["row"]["id"]
    block = row_line(small, "coreblock", 4)
    with target.writing_all() as s:
        s.add(Memory(id=taken, profile_id="someone", content="x", content_hash="x",
                     created_at=WHEN))
        # A block left under the profile's name without its profile row: a composite key.
        s.add(CoreBlock(profile_id="maya", block_type="user_profile", content="",
                        compiled_at=WHEN))
    with pytest.raises(RefusedError) as caught:
        restore(target.url, small)
    message = str(caught.value)
    assert (f"line {at + 1} (table memory), field 'id': the store already has a row with "
            "this key") in message
    assert (f"line {block + 1} (table coreblock), field 'block_type': the store already has "
            "a row") in message
    assert target.profiles() == []
    with target.reading_all() as s:
        assert s.get(Memory, taken).profile_id == "someone"  # type: ignore[union-attr]


def test_a_backup_taken_while_memories_are_ingested_is_one_moment_of_the_store(
    sample_store: Store, new_store: Callable[[str], Store], tmp_path: Path,
) -> None:
    """Read table by table, a backup is one snapshot: memories and an edge between them
    ingested after it read the memory table, before it read the edges, are in neither
    (on PostgreSQL's default isolation the edge came without its memories, and the
    restore refused the file)."""
    before = export_jsonl(sample_store.url, "maya")
    lines = backup_lines(sample_store.url, "maya")
    taken = []
    for line in lines:  # up to the first vector: the memories have been read, not the edges
        taken.append(line)
        if '"table": "memoryvector"' in line:
            break
    else:
        pytest.fail("the sample's backup has no vector")
    report = ingest_records(sample_store, [
        *({"id": f"during-{n}", "profile": "maya", "content": f"stored while the backup ran {n}",
           "embedding": axis(n).tolist()} for n in range(3)),
        {"type": "edge", "profile": "maya", "source": "during-0", "target": "during-1",
         "weight": 0.5}])
    assert not report.errors and (report.stored, report.edges) == (3, 1)
    taken += list(lines)
    path = tmp_path / "during.jsonl"
    path.write_text("".join(taken), encoding="utf-8")
    target = new_store("during")
    restore_file(target.url, path)
    assert export_jsonl(target.url, "maya") == before
