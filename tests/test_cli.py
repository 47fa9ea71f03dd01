"""The `reverie` command, run in-process."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from reverie.demo.run import SAMPLE_STORE
from reverie.deployments.cli import EXIT_ERROR, EXIT_OK, EXIT_REJECTED, main
from reverie.models.repositories import memories as memories_repo
from reverie.models.store import Store

from conftest import clone_sample, prefect_home
from factories import in_read, ingest_file


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "memories.jsonl"
    path.write_text(
        '{"id": "t1", "content": "Ana prefers trains to planes", "kind": "preference"}\n'
        '{"id": "t2", "content": "Ana", "importance": "very"}\n'
        '{"id": "t3", "content": "Ana lives in Porto", "profile": "other"}\n',
        encoding="utf-8",
    )
    return path


def test_ingest_reports_rejected_lines_and_stores_the_rest(
    store: Store, jsonl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ingest", str(jsonl), "--profile", "ana"]) == EXIT_REJECTED
    out, err = capsys.readouterr()
    assert "stored 2" in out and "rejected 1" in out
    assert "line 2, field 'importance': expected a number, got str" in err
    assert "holds no memories" not in err
    assert store.profiles() == ["ana", "other"]


@pytest.mark.parametrize("content", [b"", b"\n  \n\r\n"])
def test_ingest_of_a_file_without_records_says_so(
    store: Store, tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    # Nothing to do, as `events` with none waiting: exit 0.
    assert main(["ingest", str(path), "--profile", "ana"]) == EXIT_OK
    out, err = capsys.readouterr()
    assert err == f"{path} holds no memories\n"
    assert out == "stored 0, updated 0, unchanged 0, edges 0, rejected 0\n"


def test_ingest_of_a_directory_says_it_is_one(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ingest", str(tmp_path)]) == EXIT_ERROR
    assert capsys.readouterr().err == f"reverie: {tmp_path} is a directory, not a JSONL file\n"


def test_ingest_of_an_unreadable_or_non_utf8_file_is_one_line_each(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes('{"content": "café"}\n{"content": "tea"}\n'.encode("latin-1"))
    assert main(["ingest", str(latin1), "--profile", "ana"]) == EXIT_REJECTED
    out, err = capsys.readouterr()
    # Counted as an editor counts columns: the "é" is the 17th character of its line,
    # after a byte-order mark too.
    assert err == f"{latin1}: line 1: is not valid UTF-8 at byte 17\n" and "stored 1" in out
    marked = tmp_path / "marked.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + '{"content": "café"}\n'.encode("latin-1"))
    assert main(["ingest", str(marked), "--profile", "ana"]) == EXIT_REJECTED
    assert capsys.readouterr().err == f"{marked}: line 1: is not valid UTF-8 at byte 20\n"
    # The suite may run as root, who reads any file: the permission is what is refused.
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **k: (
        False if str(path) == str(latin1) else access(path, mode, *a, **k)))
    with pytest.raises(SystemExit) as exc:
        main(["ingest", str(latin1)])
    assert exc.value.code == EXIT_ERROR
    assert capsys.readouterr().err == (
        f"reverie ingest: Invalid value for 'FILE': path {str(latin1)!r} is not readable. "
        "(--help for usage)\n")


def test_missing_file_and_unknown_profile_are_clear_errors(
    sample_store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ingest", str(tmp_path / "nope.jsonl")]) == EXIT_ERROR
    assert main(["blocks", "--profile", "ghost"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "no such file" in err and "no profile named 'ghost'" in err


def test_get_in_an_unknown_profile_names_the_profile(
    store: Store, jsonl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["ingest", str(jsonl), "--profile", "ana"])
    capsys.readouterr()
    assert main(["get", "t1", "--profile", "ghost"]) == EXIT_ERROR
    assert capsys.readouterr().err == "reverie: no profile named 'ghost'\n"
    # A profile the store holds, without the memory: the memory is what is missing.
    assert main(["get", "t1", "--profile", "other"]) == EXIT_ERROR
    assert capsys.readouterr().err == "reverie: no memory with id 't1'\n"


def test_get_recall_export_and_blocks(
    store: Store, jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["ingest", str(jsonl), "--profile", "ana"])
    capsys.readouterr()

    assert main(["get", "t1", "--json"]) == EXIT_OK
    got = json.loads(capsys.readouterr().out)
    assert got["content"] == "Ana prefers trains to planes" and got["tier"] == "hot"

    assert main(["recall", "how does Ana like to travel", "--profile", "ana", "--json"]) == EXIT_OK
    hits = json.loads(capsys.readouterr().out)
    assert hits[0]["external_id"] == "t1" and "embedding" not in hits[0]
    # The text shows the day a memory was stored, so two statements of one fact read in
    # order.
    assert main(["recall", "how does Ana like to travel", "--profile", "ana"]) == EXIT_OK
    at = datetime.fromisoformat(hits[0]["created_at"])
    assert f"preference [hot] {at.day} {at:%B %Y}\n       Ana prefers trains to planes" in (
        capsys.readouterr().out)

    out_file = tmp_path / "ana.jsonl"
    assert main(["export", "--profile", "ana", "--canonical", "--output", str(out_file)]) == EXIT_OK
    assert [json.loads(line)["type"] for line in out_file.read_text().splitlines()] == ["memory"]
    backup = tmp_path / "ana-backup.jsonl"
    assert main(["export", "--profile", "ana", "--output", str(backup)]) == EXIT_OK
    header, *rows, end = [json.loads(line) for line in backup.read_text().splitlines()]
    assert header["reverie_backup"] == 2 and header["profile"] == "ana"
    assert [r["table"] for r in rows] == ["profile", "memory", "memoryvector"]
    assert end["end"]["tables"]["memory"]["rows"] == 1
    # The backup goes back in through ingest, into a store without the profile.
    elsewhere = Store(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    os.environ["REVERIE_DATABASE_URL"], before = elsewhere.url, os.environ["REVERIE_DATABASE_URL"]
    try:
        assert main(["ingest", str(backup)]) == EXIT_OK
        assert "restored profile ana: 1 profile, 1 memory, 1 memoryvector" in capsys.readouterr().out
        assert main(["ingest", str(backup)]) == EXIT_ERROR
        assert "already has a profile named 'ana'" in capsys.readouterr().err
    finally:
        os.environ["REVERIE_DATABASE_URL"] = before

    assert main(["blocks", "--profile", "ana"]) == EXIT_OK
    assert "no blocks yet" in capsys.readouterr().out


def test_consolidate_needs_a_profile_choice(store: Store) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["consolidate", "full"])
    assert exc.value.code == 2


@pytest.mark.usefixtures("prefect_api")
def test_consolidate_dry_run_and_real_run(
    sample_store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    before = in_read(sample_store, "raj", memories_repo.counts)
    args = ["consolidate", "full", "--profile", "raj", "--as-of", "2025-07-01T00:00:00Z"]
    assert main([*args, "--dry-run"]) == EXIT_OK
    assert "dry run: nothing written" in capsys.readouterr().out
    assert in_read(sample_store, "raj", memories_repo.counts) == before
    assert main([*args, "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["as_of"] == "2025-07-01T00:00:00" and not report["dry_run"]
    assert in_read(sample_store, "raj", memories_repo.counts)["cold"] > 0
    assert main(["blocks", "--profile", "raj"]) == EXIT_OK
    assert "## user_profile" in capsys.readouterr().out


@pytest.mark.usefixtures("prefect_api")
def test_undoing_a_supersession_says_the_newest_stays(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A supersession's summary id is the newest memory, which undo leaves hot: the
    message must not say it was removed."""
    path = tmp_path / "rent.jsonl"
    path.write_text(
        '{"id": "r1", "content": "Ana\'s rent is 900 euros a month", "created_at": "2025-01-05"}\n'
        '{"id": "r2", "content": "Ana\'s rent is 950 euros a month", "created_at": "2025-06-05"}\n',
        encoding="utf-8")
    assert main(["ingest", str(path), "--profile", "ana"]) == EXIT_OK
    assert main(["consolidate", "full", "--profile", "ana", "--as-of", "2025-07-01"]) == EXIT_OK
    capsys.readouterr()
    assert main(["consolidations", "--profile", "ana", "--json"]) == EXIT_OK
    listed = json.loads(capsys.readouterr().out)
    done = listed if isinstance(listed, list) else listed["consolidations"]
    [update] = [c for c in done if c["operation"] == "supersede"]
    assert main(["undo", update["id"], "--profile", "ana"]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"{update['summary_id']} stays hot as it was" in out and "removed" not in out
    assert main(["get", "r2", "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["tier"] == "hot"


@pytest.mark.usefixtures("prefect_api")
def test_a_rerun_with_not_done_takes_only_the_profiles_that_failed(
    sample_store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from reverie.tasks import step as step_module

    real = step_module.run_step

    def fail_for_raj(name, fn, args):  # type: ignore[no-untyped-def]
        if name == "decay_edges" and args.profile == "raj":
            raise RuntimeError("injected")
        return real(name, fn, args)

    args = ["consolidate", "lightweight", "--all", "--as-of", "2025-07-01T00:00:00Z"]
    with monkeypatch.context() as patch:
        patch.setattr(step_module, "run_step", fail_for_raj)
        assert main(args) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "1 profile(s) failed (raj)" in err and "--not-done" in err
    assert main([*args, "--not-done", "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["profiles"] == ["raj"]
    assert main([*args, "--not-done"]) == EXIT_OK
    assert "every selected profile has finished" in capsys.readouterr().out
    assert main(["consolidate", "lightweight", "--all", "--not-done"]) == EXIT_ERROR
    assert "--not-done needs --as-of" in capsys.readouterr().err


@pytest.mark.usefixtures("prefect_api")
def test_demo_ingests_the_sample_and_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REVERIE_DATABASE_URL", "sqlite:///unused.db")  # restored afterwards
    # As `make demo` runs it (tests/test_readme.py holds the two to the same command).
    monkeypatch.chdir(tmp_path)
    assert main(["demo"]) == EXIT_OK
    out = capsys.readouterr().out
    records = sum(1 for line in SAMPLE_STORE.read_text().splitlines() if '"type": "edge"' not in line)
    assert f"Ingested {records} memories" in out
    assert out.count("merged:") >= 8 and "top PageRank" in out and "user_profile" in out
    # Run twice, the demo starts afresh and tells the same story.
    database = tmp_path / ".reverie" / "demo.db"
    assert main(["demo", "--database", str(database)]) == EXIT_OK
    assert capsys.readouterr().out == out


def test_a_run_without_a_prefect_api_leaves_its_whole_history_and_no_traceback(
    sample_template: Path, new_store: Callable[[str], Store], tmp_path: Path
) -> None:
    """The temporary server lives as long as the command: the command waits until it has
    recorded every task run, rather than exit while the last ones are being written."""
    store = clone_sample(sample_template, new_store("local"))
    home = prefect_home(tmp_path / "prefect")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update({"PREFECT_HOME": str(home), "REVERIE_DATABASE_URL": store.url})
    done = subprocess.run(
        [sys.executable, "-m", "reverie.deployments.cli", "consolidate", "full", "--all",
         "--as-of", "2025-07-01", "--json"],
        env=env, cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True,
        timeout=300,
    )
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    report = json.loads(done.stdout)
    with sqlite3.connect(home / "prefect.db") as prefect_db:
        states = [state for (state,) in prefect_db.execute(
            "SELECT state_type FROM task_run WHERE flow_run_id = ?", (report["run_id"],)
        )]
    # One task run per step of the (single) chunk of profiles, all recorded.
    assert len(states) == len({s["step"] for s in report["steps"]}) == 8
    assert set(states) == {"COMPLETED"}


def test_a_temporary_server_that_does_not_answer_in_time_is_one_line_and_runs_nothing(
    sample_template: Path, new_store: Callable[[str], Store], tmp_path: Path
) -> None:
    """Prefect gives up on its temporary server with a RuntimeError (or, loaded, the
    health check's read timeout): the command says so in one line, exit 2, and the store
    is as it was. An allowance of 0 s is one no server meets."""
    from reverie.models.export import export_jsonl

    store = clone_sample(sample_template, new_store("unanswered"))
    before = {p: export_jsonl(store.url, p) for p in store.profiles()}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update({"PREFECT_HOME": str(prefect_home(tmp_path / "prefect")),
                "REVERIE_DATABASE_URL": store.url, "REVERIE_LOCAL_SERVER": "temporary",
                "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "0"})
    done = subprocess.run(
        [sys.executable, "-m", "reverie.deployments.cli", "consolidate", "full", "--all",
         "--as-of", "2025-07-01"],
        env=env, cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True,
        timeout=300,
    )
    assert done.returncode == EXIT_ERROR, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    (said,) = [line for line in done.stderr.splitlines() if line.startswith("reverie: ")]
    assert "temporary server did not answer in time" in said and "nothing ran" in said
    assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in said
    assert {p: export_jsonl(store.url, p) for p in store.profiles()} == before


def test_the_demo_module_leaves_prefect_unimported_so_its_log_level_applies() -> None:
    # The demo sets Prefect's console level before Prefect is first imported; an import
    # of Prefect at the top of the module would print every task run at INFO.
    probe = "import sys, reverie.demo.run; print('prefect' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert done.stdout.strip() == "False", done.stderr[-2000:]


@pytest.mark.parametrize("argv, says", [
    (["run", "decay", "--all", "--as-of", "yesterday"], "'yesterday' is not an ISO-8601 date"),
    (["backfill", "decay", "--from", "2025-07-01", "--to", "soon", "--all"], "'soon' is not"),
    (["consolidate", "full", "--profile", "nobody"], "no profile named 'nobody'"),
    # A name no profile can have says so, not that no such profile is stored.
    (["blocks", "--profile", "bad name"], "'bad name' is not a valid profile name (letters,"),
    (["consolidate", "full", "--profile", "maya", "--profile", "a/b"],
     "'a/b' is not a valid profile name"),
    (["run", "sharpen", "--all"], "invalid choice: 'sharpen'"),
    (["run", "decay", "--all", "--bogus"], "unrecognized arguments: --bogus"),
    (["status"], "no store at"),
])
def test_every_user_error_is_one_line_and_exit_code_2(
    sample_store: Store, tmp_path: Path, argv: list[str], says: str
) -> None:
    env = {**os.environ, "REVERIE_DATABASE_URL": sample_store.url}
    if argv == ["status"]:
        env["REVERIE_DATABASE_URL"] = f"sqlite:///{tmp_path / 'elsewhere' / 'reverie.db'}"
    done = subprocess.run([sys.executable, "-m", "reverie.deployments.cli", *argv], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == EXIT_ERROR
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "elsewhere").exists()


def test_the_default_store_is_the_same_from_any_folder_and_status_names_it(
    tmp_path: Path, jsonl: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REVERIE_DATABASE_URL"}
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()

    def reverie(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "reverie.deployments.cli", *argv], env=env,
                              cwd=cwd, capture_output=True, text=True, timeout=300)

    missing = reverie("status", cwd=there)
    assert missing.returncode == EXIT_ERROR and "data/reverie/reverie.db" in missing.stderr
    assert reverie("ingest", str(jsonl), "--profile", "ana", cwd=here).returncode == EXIT_REJECTED
    shown = reverie("status", cwd=there)
    assert shown.returncode == EXIT_OK, shown.stderr
    assert shown.stdout.startswith(f"store: sqlite:///{tmp_path / 'data' / 'reverie' / 'reverie.db'}")
    assert not (here / ".reverie").exists() and not (there / ".reverie").exists()


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    # `reverie consolidations | head -1`: the rest of the output has nowhere to go.
    store = Store(f"sqlite:///{tmp_path / 'pipe.db'}")
    ingest_file(store, SAMPLE_STORE)
    env = {**os.environ, "REVERIE_DATABASE_URL": store.url}
    command = [sys.executable, "-m", "reverie.deployments.cli", "export", "--profile", "maya"]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.readline()
        process.stdout.close()
        error = process.stderr.read().decode()
        code = process.wait(timeout=120)
    assert "Traceback" not in error and "BrokenPipe" not in error, error
    assert code == 1


@pytest.mark.usefixtures("prefect_api")
def test_ids_and_profiles_are_found_in_either_unicode_form(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from factories import at_cosine, axis

    cafe, cafe_nfd = "caf\u00e9", "cafe\u0301"
    zoe, zoe_nfd = "zo\u00eb", "zoe\u0308"
    path = tmp_path / "zoe.jsonl"
    records = [  # three near-duplicates (a merge to undo) and one loner
        {"id": f"d{k}", "content": f"Zoë orders a flat white{'!' * k}",
         "created_at": "2025-04-01T00:00:00Z", "access_count": 3 + k, "confidence": 0.8,
         "embedding": (axis(0) if k == 2 else at_cosine(0.9, other=1 + k)).tolist()}
        for k in range(3)
    ] + [{"id": cafe_nfd, "content": "the corner café opens at seven",
          "embedding": axis(10).tolist()}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert main(["ingest", str(path), "--profile", zoe_nfd]) == EXIT_OK
    capsys.readouterr()
    for ident, profile in [(cafe_nfd, zoe_nfd), (cafe, zoe_nfd), (cafe_nfd, zoe)]:
        assert main(["get", ident, "--profile", profile, "--json"]) == EXIT_OK
        got = json.loads(capsys.readouterr().out)
        assert (got["external_id"], got["profile_id"]) == (cafe, zoe)

    assert main(["consolidate", "full", "--profile", zoe_nfd,
                 "--as-of", "2025-07-01T00:00:00Z"]) == EXIT_OK
    capsys.readouterr()
    assert main(["consolidations", "--profile", zoe_nfd, "--json"]) == EXIT_OK
    (merge,) = json.loads(capsys.readouterr().out)["consolidations"]
    assert main(["undo", merge["id"], "--profile", zoe_nfd]) == EXIT_OK
    assert "3 memories restored" in capsys.readouterr().out
    assert main(["undo", merge["summary_id"], "--profile", zoe]) == EXIT_OK
    assert "already undone" in capsys.readouterr().out


@pytest.mark.parametrize("query", ["", "   ", "\u200b \ufeff"])
def test_recall_of_a_blank_query_is_refused(
    sample_store: Store, query: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Embedded, a blank query was answered with whatever lay nearest to nothing."""
    assert main(["recall", query, "--profile", "raj"]) == EXIT_ERROR
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "reverie: the query shows no text: give the words to look for\n"


@pytest.mark.usefixtures("prefect_api")
def test_recall_shows_a_summary_by_the_member_that_matched_whole_and_dated(
    sample_store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    from reverie.models.tables import SUMMARY_ORIGINS, Tier

    when = ["--profile", "raj", "--as-of", "2025-10-01T00:00:00Z"]
    assert main(["run", "decay", *when]) == EXIT_OK
    assert main(["consolidate", "full", *when]) == EXIT_OK
    capsys.readouterr()
    everything = in_read(sample_store, "raj",
                         lambda tx: memories_repo.memories(tx, tiers=(Tier.HOT, Tier.COLD)))
    # Merges and compressions alike (the sample store has merges at the seed's groups).
    summaries = [m for m in everything if m.origin in SUMMARY_ORIGINS and m.is_live
                 and any(o.superseded_by == m.id for o in everything)]
    assert summaries
    for summary in summaries:
        members = [m for m in everything if m.superseded_by == summary.id]
        for member in members:
            assert main(["recall", member.content, "--profile", "raj", "-k", "1",
                         "--json"]) == EXIT_OK
            [hit] = json.loads(capsys.readouterr().out)
            assert hit["id"] == summary.id and hit["content"] == summary.content  # for get
            matched = [m["id"] for m in hit["matched"]]
            d = member.created_at
            line = f"{member.content} ({d.day} {d:%B %Y})"
            assert member.id in matched
            assert line in hit["text"].splitlines()
            assert main(["recall", member.content, "--profile", "raj", "-k", "1"]) == EXIT_OK
            out = capsys.readouterr().out
            assert line in out
            # A merge's words are one member's; any other summary's never show whole.
            assert summary.content not in out or any(summary.content == m.content
                                                     for m in members)
            assert f"reverie get {summary.id}" in out
    # Groups of five close memories: a member's own words may bring all five; one member
    # alone is covered by tests/test_recall_keys.py. The summary's own words never show.


def test_session_end_of_a_session_that_ended_says_so_and_counts_nothing(
    sample_store: Store, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from reverie.runner import event_delivery

    monkeypatch.setattr(event_delivery, "api_configured", lambda: False)
    assert main(["session-end", "--profile", "maya", "--session", "chat-1"]) == EXIT_OK
    assert "maya: session 1 ended" in capsys.readouterr().out
    assert main(["session-end", "--profile", "maya", "--session", "chat-1"]) == EXIT_OK
    assert "maya: session chat-1 had ended already (session 1): not counted again" in \
        capsys.readouterr().out
