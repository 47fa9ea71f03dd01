"""A store knows its id, its events name it, triggered runs check it; nothing makes a
store by a typo, and a run over an empty store says so (#38 items 3 and 5).

Two stores on one Prefect stack are in tests/test_platform.py (its stack is reused).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from reverie.deployments.cli import EXIT_ERROR, EXIT_OK, EXIT_REJECTED, main
from reverie.models import outbox
from reverie.models.errors import EmptyStoreError, StoreMissingError, WrongStoreError
from reverie.models.events import related, resource, stored_events
from reverie.models.settings import display_url
from reverie.models.store import Store

from factories import ingest_records
from prefect_reads import run_artifacts

AT = datetime(2026, 3, 1, 12, 0)


def _queued(store: Store) -> list:
    with store.writing_all() as s:
        outbox.add(s, stored_events("twin", 0, 50, AT, 50))
    with store.writing_all() as s:
        claimed = outbox.claim(s, "test", AT)
    assert claimed is not None
    return claimed


def test_each_store_has_its_own_id_and_its_events_carry_it(
    new_store: Callable[[str], Store],
) -> None:
    a, b = new_store("a"), new_store("b")
    assert a.id != b.id and len(a.id) == 32
    assert a.id == Store(a.url).id  # kept, not made anew on each open
    from_a, from_b = _queued(a), _queued(b)
    # The same profile, the same counts: the same events, but of two stores.
    assert [e.key for e in from_a] == [e.key for e in from_b]
    assert {e.store for e in from_a} == {a.id} and {e.store for e in from_b} == {b.id}
    # Prefect keeps one event per id: two stores' events must not share one.
    assert not {e.id for e in from_a} & {e.id for e in from_b}
    event = from_a[0]
    assert resource(event.profile, event.store)["reverie.store"] == a.id
    assert related(event.store) == [{"prefect.resource.id": f"reverie.store.{a.id}",
                                     "prefect.resource.role": "store",
                                     "prefect.resource.name": f"store {a.id}"}]


@pytest.mark.usefixtures("prefect_api")
def test_a_run_started_by_another_stores_event_refuses_to_start(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from reverie.flows.lightweight_consolidation import lightweight_consolidation

    with pytest.raises(WrongStoreError, match=f"is store {sample_store.id}: refused"):
        lightweight_consolidation(profile="maya", store_id="0" * 32)
    # A deployment told it serves another store (REVERIE_STORE_ID) refuses any run.
    monkeypatch.setenv("REVERIE_STORE_ID", "1" * 32)
    with pytest.raises(WrongStoreError, match="REVERIE_STORE_ID says"):
        lightweight_consolidation(profile="maya")
    # Its own store's id: the run goes ahead.
    monkeypatch.setenv("REVERIE_STORE_ID", sample_store.id)
    report = lightweight_consolidation(profile="maya", store_id=sample_store.id)
    assert report.profiles == ["maya"]


@pytest.mark.usefixtures("prefect_api")
def test_an_all_profiles_run_over_an_empty_store_fails_saying_so(store: Store) -> None:
    from reverie.flows.decay import decay

    state = decay(return_state=True)
    assert state.is_failed()
    # The URL as shown: a PostgreSQL password masked.
    assert f"no profiles in store {display_url(store.url)}" in state.message
    with pytest.raises(EmptyStoreError):
        state.result()
    run_id = str(state.state_details.flow_run_id)
    summary = {a.key: a.data for a in run_artifacts(run_id)}["decay"]
    assert "Nothing done: no profiles in store" in summary
    # An empty selection is not an empty store: done, and said.
    report = decay(profile=[])
    assert report.profiles == [] and "no profiles selected" in (report.note or "")


# --- nothing is created by a typo (SQLite paths) ---------------------------------------


def _typo(tmp_path: Path) -> tuple[str, Path]:
    folder = tmp_path / "typo-dir"
    return f"sqlite:///{folder / 'x.db'}", folder


@pytest.mark.store_independent("a mistyped SQLite path, whatever the suite's back-end")
@pytest.mark.usefixtures("prefect_api")
def test_a_flow_run_on_a_mistyped_sqlite_path_fails_naming_it_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from reverie.flows.full_consolidation import full_consolidation

    url, folder = _typo(tmp_path)
    monkeypatch.setenv("REVERIE_DATABASE_URL", url)
    state = full_consolidation(return_state=True)
    assert state.is_failed() and url in state.message and "does not exist" in state.message
    with pytest.raises(StoreMissingError):
        state.result()
    assert not folder.exists()


@pytest.mark.store_independent("a mistyped SQLite path, whatever the suite's back-end")
def test_commands_on_a_mistyped_sqlite_path_fail_naming_it_and_create_nothing(
    tmp_path: Path,
) -> None:
    url, folder = _typo(tmp_path)
    env = {**os.environ, "REVERIE_DATABASE_URL": url}
    for argv in (["status"], ["consolidate", "lightweight", "--all"], ["events"],
                 ["session-end", "--profile", "maya"]):
        done = subprocess.run([sys.executable, "-m", "reverie.deployments.cli", *argv],
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == EXIT_ERROR, (argv, done.stderr)
        assert f"no store at {url}" in done.stderr, (argv, done.stderr)
        assert not folder.exists(), argv
    # An agent's store through the API is no ingest (create=False): refused too.
    with pytest.raises(StoreMissingError):
        ingest_records(Store(url), [{"content": "x", "profile": "p"}], create=False)
    assert not folder.exists()


@pytest.mark.store_independent("creating a SQLite store, whatever the suite's back-end")
def test_init_and_ingest_create_the_store_and_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"sqlite:///{tmp_path / 'new' / 'a.db'}"
    monkeypatch.setenv("REVERIE_DATABASE_URL", url)
    assert main(["init", "--json"]) == EXIT_OK
    made = json.loads(capsys.readouterr().out)
    assert made == {"store": url, "id": Store(url).id, "created": True}
    assert main(["init"]) == EXIT_OK
    assert f"a store is already at {url} (id {made['id']})" in capsys.readouterr().err
    other = f"sqlite:///{tmp_path / 'other' / 'b.db'}"
    monkeypatch.setenv("REVERIE_DATABASE_URL", other)
    memories = tmp_path / "m.jsonl"
    memories.write_text(json.dumps({"content": "tea", "profile": "p",
                                    "embedding": [1.0] + [0.0] * 383}) + "\n")
    assert main(["ingest", str(memories)]) == EXIT_OK
    said = capsys.readouterr()
    assert f"created a new store at {other}" in said.err and "stored 1" in said.out
    assert main(["ingest", str(memories)]) == EXIT_OK
    assert "created" not in capsys.readouterr().err


@pytest.mark.store_independent("creating a SQLite store, whatever the suite's back-end")
@pytest.mark.parametrize(("content", "code"), [
    ("", EXIT_OK), ("\n\n", EXIT_OK), ('{"content": ""}\n{"nothing": 1}\n', EXIT_REJECTED)])
def test_an_ingest_that_writes_nothing_creates_no_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    content: str, code: int,
) -> None:
    """An empty file, or one whose every record is refused, is likelier the wrong file
    than a store wanted empty: a store made then would be taken for the right one."""
    folder = tmp_path / "new"
    monkeypatch.setenv("REVERIE_DATABASE_URL", f"sqlite:///{folder / 'a.db'}")
    memories = tmp_path / "m.jsonl"
    memories.write_text(content)
    assert main(["ingest", str(memories), "--profile", "p"]) == code
    assert "created" not in capsys.readouterr().err
    assert not folder.exists()
