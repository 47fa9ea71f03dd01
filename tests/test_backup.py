"""A profile's backup (`reverie export`) restores exactly (`reverie ingest`): tiers,
vectors, edges, blocks, the audit, tombstones and run history; all or nothing."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from reverie.models.backup import backup_lines, restore
from reverie.models.config import ConsolidationConfig, ForgetConfig
from reverie.models.errors import InputError, StoreError
from reverie.models.export import export_jsonl
from reverie.models.store import Store
from reverie.models.tables import RunRecord
from reverie.models.validation import read_jsonl
from reverie.tasks.forget import forget
from reverie.tasks.step import StepArgs

from conftest import TEST_POSTGRES
from factories import ingest_records, record_runs
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
    report = restore(target.url, read_jsonl(path))
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
        restore(sample_store.url, read_jsonl(sample_backup))
    assert export_jsonl(sample_store.url, "maya") == before


def test_a_bad_line_names_its_line_and_field_and_nothing_is_written(
    new_store: Callable[[str], Store], sample_backup: Path, tmp_path: Path
) -> None:
    lines = sample_backup.read_text(encoding="utf-8").splitlines()
    memory = next(i for i, line in enumerate(lines) if '"table": "memory"' in line)
    row = json.loads(lines[memory])
    row["row"]["created_at"] = "last tuesday"
    lines[memory] = json.dumps(row)
    other = json.loads(lines[memory + 1])
    other["row"]["access_count"] = "many"
    lines[memory + 1] = json.dumps(other)
    lines.insert(3, json.dumps({"table": "memory", "row": {"id": "m-x", "colour": "red"}}))
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join(lines) + "\n", encoding="utf-8")
    target = new_store("target")
    with pytest.raises(InputError) as refused:
        restore(target.url, read_jsonl(broken))
    message = str(refused.value)
    assert "line 4, field 'colour': is not a column of memory" in message
    assert f"line {memory + 3}, field 'access_count': must be an integer" in message  # after line 4
    assert f"line {memory + 1}, field 'created_at': is not an ISO-8601 date-time" in message
    assert target.profiles() == []


def test_a_restore_of_another_profile_than_named_is_refused(
    new_store: Callable[[str], Store], sample_backup: Path
) -> None:
    target = new_store("target")
    with pytest.raises(InputError, match="backup is of profile 'maya', not 'raj'"):
        restore(target.url, read_jsonl(sample_backup), "raj")
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
        restore(postgres, read_jsonl(path))
        back = Store(f"sqlite:///{tmp_path / 'back.db'}")
        again = tmp_path / "again.jsonl"
        again.write_text("".join(backup_lines(postgres, "maya")), encoding="utf-8")
        restore(back.url, read_jsonl(again))
        assert again.read_text() == path.read_text()
        assert export_jsonl(back.url, "maya", True) == export_jsonl(sqlite.url, "maya", True)
    finally:
        _drop_postgres_database(postgres)
