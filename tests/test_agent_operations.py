"""The agent operations in-process (deployments/operations.py): tokens and their
parsing, and the events stores and recalls queue (the idle trigger's activity)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from reverie.deployments import operations as ops
from reverie.deployments.api_errors import RecordsRefused, body_of, status_of
from reverie.deployments.auth import (
    ForbiddenError,
    Principal,
    UnauthorizedError,
    load_tokens,
    parse_tokens,
)
from reverie.models.errors import ConfigError, NotFoundError, RecordError
from reverie.models.settings import Settings
from reverie.models.store import Store
from reverie.models.tables import OutboxEvent
from reverie.runner import event_delivery

from factories import axis, ingest_records

TOKEN = "token-for-ana-0123456789"


@pytest.mark.store_independent("token parsing touches no store")
def test_tokens_in_both_formats_and_an_admin_token() -> None:
    assert parse_tokens(f"{TOKEN}:ana,bo;other-token-0123456789:cy", "t") == {
        TOKEN: frozenset({"ana", "bo"}), "other-token-0123456789": frozenset({"cy"})}
    assert parse_tokens(f'{{"{TOKEN}": ["ana"]}}', "t") == {TOKEN: frozenset({"ana"})}
    tokens = load_tokens(Settings(api_tokens=f"{TOKEN}:ana",
                                  api_admin_token="admin-token-0123456789"))
    assert tokens.authenticate(TOKEN).covers("ana")
    assert not tokens.authenticate(TOKEN).covers("bo")
    assert tokens.authenticate_header("Bearer admin-token-0123456789").covers("anyone")
    assert TOKEN not in repr(tokens)
    for presented in (None, "", "nope-0123456789abcdef", TOKEN + "x"):
        with pytest.raises(UnauthorizedError):
            tokens.authenticate(presented)
    with pytest.raises(UnauthorizedError):
        tokens.authenticate_header(f"Basic {TOKEN}")


@pytest.mark.store_independent("token parsing touches no store")
@pytest.mark.parametrize("text", ["short:ana", f"{TOKEN}", f"{TOKEN}:", "{bad json",
                                  f'{{"{TOKEN}": "ana"}}'])
def test_bad_token_configuration_is_refused_without_echoing_the_token(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_tokens(text, "REVERIE_API_TOKENS")
    assert TOKEN not in str(caught.value)


@pytest.mark.store_independent("no store is configured at all")
def test_no_token_configured_is_an_error() -> None:
    with pytest.raises(ConfigError, match="no API token"):
        load_tokens(Settings())


def test_refusal_comes_before_the_store_is_read(store: Store) -> None:
    bo = Principal(frozenset({"bo"}))
    for profile in ("ana", "nobody"):
        with pytest.raises(ForbiddenError) as caught:
            ops.recall(store, bo, profile, "anything")
        assert profile not in str(caught.value)
    with pytest.raises(NotFoundError):  # an admin token: the profile is simply unknown
        ops.recall(store, Principal(frozenset(), admin=True), "nobody", "anything")
    with pytest.raises(RecordError) as bad:
        ops.recall(store, bo, "bo", "tea", k=0)
    assert bad.value.field == "k"


def test_stores_and_recalls_queue_the_events_ingest_queues(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the operations, a store counts toward the 50-store trigger as an ingest
    does, and a recall is activity for the idle trigger."""
    monkeypatch.setattr(event_delivery, "api_url", lambda: "http://127.0.0.1:9/api")
    monkeypatch.setattr(event_delivery, "deliver", lambda url: None)
    ana = Principal(frozenset({"ana"}))
    done = ops.store_memories(store, ana, "ana",
                              [{"content": f"fact number {i}"} for i in range(50)])
    assert done["stored"] == 50
    ops.recall(store, ana, "ana", "fact", k=3)
    with store.reading_all() as s:
        names = [r.name for r in s.execute(
            select(OutboxEvent).order_by(OutboxEvent.seq)).scalars()]
    assert names == ["reverie.memory.stored", "reverie.profile.store-threshold",
                     "reverie.memory.recalled"]


@pytest.mark.store_independent("reads prefect.yaml")
def test_the_idle_trigger_counts_recalls_as_activity() -> None:
    spec = yaml.safe_load((Path(__file__).parents[1] / "prefect.yaml").read_text())
    [idle] = [t for d in spec["deployments"] for t in d.get("triggers", [])
              if t["name"] == "lightweight-when-idle"]
    activity = {"reverie.memory.stored", "reverie.memory.recalled"}
    assert set(idle["after"]) == set(idle["expect"]) == activity


def test_a_profile_the_token_names_before_its_first_store_reads_as_empty(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent whose first session stored nothing can still end it and ask for its
    status; an admin token names no profile, so an unknown one stays a 404."""
    from datetime import datetime

    from reverie.deployments import status

    new = Principal(frozenset({"newcomer"}))
    assert ops.session_end(store, new, "newcomer", "s1") == {
        "profile": "newcomer", "session": "s1", "session_count": 0,
        "consolidation_follows": False, "already_ended": False,
        "why_not": "the profile holds no memory yet: nothing to consolidate"}
    at = datetime(2026, 1, 1, 3)
    monkeypatch.setattr(status, "scheduled_runs", lambda: {
        "decay": [(at, None), (at, "other"), (at, ["other", "newcomer"]), (at, "newcomer")]})
    monkeypatch.setattr(status, "failed_runs", lambda wanted: [])
    said = ops.consolidation_status(store, new, "newcomer")
    assert said["last"] == {} and said["history"] == []
    assert said["failed"] == []  # a list, as for a profile with history (it was None)
    # Only the runs that cover the profile, none naming another.
    assert said["next"] == {"decay": [
        {"at": "2026-01-01T03:00:00+00:00", "profile": None},
        {"at": "2026-01-01T03:00:00+00:00", "profile": "newcomer"},
        {"at": "2026-01-01T03:00:00+00:00", "profile": "newcomer"}]}
    assert not store.has_profile("newcomer")  # reading wrote nothing
    admin = Principal(frozenset(), admin=True)
    for operation in (ops.session_end, ops.consolidation_status):
        with pytest.raises(NotFoundError):
            operation(store, admin, "newcomer")


@pytest.mark.parametrize("query", ["", "   ", "\u200b", "\u200b \ufeff", "\u2060\u200d"])
def test_a_blank_query_is_refused_naming_it(store: Store, query: str) -> None:
    """Only spaces or zero-width characters: nothing to look for (it was embedded and
    answered with whatever lay nearest). session_init's query may be left out, not
    given blank."""
    ana = Principal(frozenset({"ana"}))
    for call in (lambda: ops.recall(store, ana, "ana", query),
                 lambda: ops.session_init(store, ana, "ana", query)):
        with pytest.raises(RecordError) as caught:
            call()
        assert caught.value.field == "query"
    assert ops.session_init(store, ana, "ana")["memories"] == []


def test_flags_and_counts_are_json_types_not_lookalikes(store: Store) -> None:
    """0, 1 or "false" for a flag and "3" for a count are refused naming the field, as
    the servers' request models refuse them: 0 read as false made a dry run real."""
    ana = Principal(frozenset({"ana"}))
    ops.store_memories(store, ana, "ana", [{"content": "ana drinks green tea"}])
    for flag, value in (("deep", 0), ("track", "false")):
        with pytest.raises(RecordError) as caught:
            ops.recall(store, ana, "ana", "tea", **{flag: value})
        assert caught.value.field == flag
    with pytest.raises(RecordError) as caught:
        ops.recall(store, ana, "ana", "tea", k="3")
    assert caught.value.field == "k"
    for value in (0, 1, "true", None):
        with pytest.raises(RecordError) as caught:
            ops.consolidate(store, ana, "ana", "lightweight", dry_run=value)
        assert caught.value.field == "dry_run"


@pytest.mark.store_independent("token parsing touches no store")
@pytest.mark.parametrize(("listed", "shown", "why"), [
    ("p" * 129, "p" * 40 + "...", "longer than 128 characters"),
    ("al\x00ice", "al\\x00ice", "contains a NUL character"),
    (" ", " ", "must not be empty"),
])
def test_a_token_for_a_profile_no_call_could_name_is_refused_at_start(
    listed: str, shown: str, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Said once, naming the setting (or Secret block) and the profile, never the
    token: not accepted silently, to be a 422 on every call."""
    from reverie.deployments import auth

    text = json.dumps({TOKEN: ["ana", listed]})
    with pytest.raises(ConfigError) as caught:
        load_tokens(Settings(api_tokens=text))
    message = str(caught.value)
    assert message.startswith(f"REVERIE_API_TOKENS: token 1: profile '{shown}': {why}")
    assert TOKEN not in message
    monkeypatch.setattr(auth, "_secret_block", lambda name: text)
    with pytest.raises(ConfigError) as caught:
        load_tokens(Settings(api_tokens_block="agents-tokens"))
    assert "REVERIE_API_TOKENS_BLOCK (the Prefect Secret block 'agents-tokens')" in str(
        caught.value) and TOKEN not in str(caught.value)
    # The other format, the same check; an empty place between commas is no name.
    if listed.strip():
        with pytest.raises(ConfigError, match=why):
            parse_tokens(f"{TOKEN}:ana,{listed}", "REVERIE_API_TOKENS")
    assert parse_tokens(f"{TOKEN}:ana,,bo,", "t") == {TOKEN: frozenset({"ana", "bo"})}


@pytest.mark.store_independent("the modes are the catalog's")
def test_old_mode_names_are_taken_but_not_offered() -> None:
    from pydantic import TypeAdapter, ValidationError

    from reverie.flows.catalog import ALIASES

    described = TypeAdapter(ops.ModeName).json_schema()
    assert set(described["enum"]) == set(ops.MODES)
    assert not set(ALIASES) & set(described["enum"])
    for old, new in ALIASES.items():
        assert TypeAdapter(ops.ModeName).validate_python(old) == old
        assert ops.MODES[new]
    with pytest.raises(ValidationError) as caught:
        TypeAdapter(ops.ModeName).validate_python("colder")
    assert not set(ALIASES) & set(caught.value.errors()[0]["msg"].split(", "))


def test_times_in_answers_carry_their_utc_offset(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store keeps naive UTC; an answer without an offset reads as the client's local
    time. ``reverie status --json`` (status.as_json) keeps its own form."""
    from datetime import datetime

    from reverie.deployments import status
    from reverie.models.tables import RunRecord

    from factories import record_runs

    ana = Principal(frozenset({"ana"}))
    ops.store_memories(store, ana, "ana", [{"id": "a1", "content": "ana drinks green tea",
                                            "created_at": "2026-03-01T09:30:00+02:00"}])
    got = ops.get(store, ana, "ana", "a1")
    assert got["created_at"] == "2026-03-01T07:30:00+00:00"
    assert got["last_accessed_at"] is None
    when = datetime(2026, 3, 2, 4)
    record_runs(store, [RunRecord(profile_id="ana", flow="decay", as_of=when,
                                  started_at=when, finished_at=when)])
    monkeypatch.setattr(status, "scheduled_runs", lambda: {"decay": [(when, None)]})
    said = ops.consolidation_status(store, ana, "ana")
    assert said["last"] == {"decay": "2026-03-02T04:00:00+00:00"}
    assert said["history"][0]["as_of"] == said["next"]["decay"][0]["at"] == (
        "2026-03-02T04:00:00+00:00")
    assert said["last_runs"]["decay"]["started_at"] == "2026-03-02T04:00:00+00:00"
    assert "id" not in said["history"][0]
    # The CLI's JSON is unchanged.
    assert status.as_json(status.collect(store, "ana"))["history"][0]["as_of"] == (
        "2026-03-02T04:00:00")


def test_status_names_the_failed_runs_that_covered_the_profile_and_no_other(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import datetime

    from reverie.deployments import status

    ana = Principal(frozenset({"ana"}))
    ingest_records(store, [{"content": "a fact", "embedding": axis(0).tolist()}],
                   profile="ana")
    at = datetime(2026, 3, 2, 4)
    monkeypatch.setattr(status, "failed_runs", lambda wanted: [
        status.EndedRun("r1", "decay", "Crashed", at, "ana", "its process is gone"),
        status.EndedRun("r2", "decay", "Failed", at, ["bo", "ana"], "bo's store: boom"),
        status.EndedRun("r3", "decay", "Failed", None, None, "cy is broken"),
        status.EndedRun("r4", "decay", "Failed", at, "bo", "bo alone")])
    said = ops.consolidation_status(store, ana, "ana")["failed"]
    assert [(r["run_id"], r["state"], r["ended"], r["profile"]) for r in said] == [
        ("r1", "Crashed", "2026-03-02T04:00:00+00:00", "ana"),
        # A run of several profiles names none of the others.
        ("r2", "Failed", "2026-03-02T04:00:00+00:00", "ana"),
        ("r3", "Failed", None, None)]
    # No message: one may name other profiles (or come from another store's run).
    assert not any("message" in r for r in said)
    assert all(r["ui_url"] is None or r["run_id"] in r["ui_url"] for r in said)


@pytest.mark.store_independent("no store is read")
def test_a_server_starts_the_local_prefect_server_in_the_background(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """At a server's start with no Prefect API configured, the shared local server is
    started without the start waiting for it (8 s and more), so the first consolidate
    waits only for what is left; not with REVERIE_LOCAL_SERVER=temporary, nor with an
    operator's API; a failure is one line in the log."""
    import threading
    import time

    from reverie.deployments import local_server
    from reverie.models.errors import ReverieError

    release = threading.Event()
    calls: list[str] = []

    def starting() -> str:
        calls.append(os.environ["REVERIE_LOCAL_SERVER"])
        release.wait(30)
        return "http://127.0.0.1:9"

    monkeypatch.setattr(local_server, "use_local_api", starting)
    monkeypatch.setattr(event_delivery, "api_configured", lambda: False)
    monkeypatch.setenv("REVERIE_LOCAL_SERVER", "shared")
    began = time.monotonic()
    thread = ops.start_local_api()
    assert thread is not None and thread.daemon
    assert time.monotonic() - began < 1.0
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls == ["shared"] and thread.is_alive()  # being started, not waited for
    release.set()
    thread.join(10)

    monkeypatch.setenv("REVERIE_LOCAL_SERVER", "temporary")
    assert ops.start_local_api() is None
    monkeypatch.setenv("REVERIE_LOCAL_SERVER", "shared")
    monkeypatch.setattr(event_delivery, "api_configured", lambda: True)
    monkeypatch.setattr(event_delivery, "pointed_by_us", lambda: False)
    operator = ops.start_local_api()
    assert operator is not None
    operator.join(10)
    assert calls == ["shared"]

    def failing() -> str:
        raise ReverieError("the local Prefect server exited with code 1\nwhile starting")

    monkeypatch.setattr(event_delivery, "api_configured", lambda: False)
    monkeypatch.setattr(local_server, "use_local_api", failing)
    with caplog.at_level("WARNING", logger=ops.__name__):
        failed = ops.start_local_api()
        assert failed is not None
        failed.join(10)
    [said] = [r.getMessage() for r in caplog.records if r.name == ops.__name__]
    assert said == ("the local Prefect server did not start: ReverieError: the local "
                    "Prefect server exited with code 1 while starting")


def test_a_store_call_that_stores_nothing_names_every_refusal(store: Store) -> None:
    """Before, only the first: a caller mended one record a round trip."""
    with pytest.raises(RecordsRefused) as refused:
        ops.store_memories(store, Principal(frozenset({"p"})), "p", [
            {"content": ""}, {"content": "fine", "importance": 2}, 7])
    body = body_of(refused.value)
    assert status_of(refused.value) == 422 and body["field"] == "content"
    assert [(r["record"], r["field"]) for r in body["rejected"]] == [
        ("record 1", "content"), ("record 2", "importance"), ("record 3", None)]


def test_session_init_reads_the_users_profile_first_and_says_nothing_twice(
    store: Store,
) -> None:
    """An agent trial: with a small budget the user's profile gave way to the
    alphabetically first block, and the memories after the blocks repeated lines the
    blocks had just said."""
    from datetime import datetime

    from reverie.models.records import BlockPlan
    from reverie.models.repositories.blocks import upsert_blocks

    ana = Principal(frozenset({"ana"}))
    texts = ["Ana works as a nurse in Lyon", "Ana prefers tea to coffee",
             "Ana plays the cello on Fridays"]
    ids = ops.store_memories(store, ana, "ana", [
        {"content": t, "importance": rank}
        for t, rank in zip(texts, (0.9, 0.5, 0.8), strict=True)])["ids"]
    patterns = f"{texts[2]}\n---\nAna walks to work"
    with store.writing("ana") as tx:
        upsert_blocks(tx, [BlockPlan("behavioral_patterns", patterns, (ids[2],)),
                           BlockPlan("user_profile", texts[0], (ids[0],))],
                      datetime(2026, 1, 1))
    whole = ops.session_init(store, ana, "ana")
    assert [b["block_type"] for b in whole["blocks"]] == ["user_profile",
                                                          "behavioral_patterns"]
    assert [m["content"] for m in whole["memories"]] == [texts[1]]
    # Room for one block: the user's profile; then a memory no given block quotes.
    small = ops.session_init(store, ana, "ana", budget_chars=len(texts[0]) + len(texts[2]))
    assert [b["block_type"] for b in small["blocks"]] == ["user_profile"]
    assert [m["content"] for m in small["memories"]] == [texts[2]]
    # k memories still, though the best hit is quoted (the pool grows by the quoted).
    recalled = ops.session_init(store, ana, "ana", query="what does Ana do for work?", k=1)
    assert [m["content"] for m in recalled["memories"]] == [texts[1]]
    # The same words stored again, under another id, are said by the block as well.
    ops.store_memories(store, ana, "ana", [{"content": texts[0], "id": "again"}])
    again = ops.session_init(store, ana, "ana", query="what does Ana do for work?")
    assert texts[0] not in [m["content"] for m in again["memories"]]


def test_a_session_end_sent_again_counts_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's retry of a session end (an agent trial sent "chat-1" twice and counted
    two sessions, each a step toward the session trigger): counted and its events queued
    once; another session, or one without an id, counts."""
    monkeypatch.setattr(event_delivery, "api_url", lambda: "http://127.0.0.1:9/api")
    delivered: list[str] = []
    monkeypatch.setattr(event_delivery, "deliver", delivered.append)
    ana = Principal(frozenset({"ana"}))
    ops.store_memories(store, ana, "ana", [{"content": "Ana plays the cello"}])
    first = ops.session_end(store, ana, "ana", "chat-1")
    delivered.clear()
    again = ops.session_end(store, ana, "ana", "chat-1")
    # The retry still sends what waits (the first call's API may have been down).
    assert delivered == [store.url]
    assert (first["session_count"], first["already_ended"]) == (1, False)
    assert (again["session_count"], again["already_ended"]) == (1, True)
    assert not again["consolidation_follows"]
    assert again["why_not"] == "this session had ended already: its end was counted then"
    assert first["consolidation_follows"] and "why_not" not in first
    monkeypatch.setattr(event_delivery, "api_url", lambda: None)
    alone = ops.session_end(store, ana, "ana", "chat-0")
    assert not alone["consolidation_follows"] and "PREFECT_API_URL" in alone["why_not"]
    monkeypatch.setattr(event_delivery, "api_url", lambda: "http://127.0.0.1:9/api")
    assert ops.session_end(store, ana, "ana", "chat-2")["session_count"] == 3
    assert ops.session_end(store, ana, "ana")["session_count"] == 4
    assert ops.session_end(store, ana, "ana")["session_count"] == 5  # no id: no retry known
    with store.reading_all() as s:
        ended = [e.name for e in s.execute(select(OutboxEvent)).scalars()
                 if e.name == "reverie.session.ended"]
    assert len(ended) == 4  # chat-0 was ended without an API: no event kept


def test_a_kind_no_seed_gives_a_meaning_is_stored_and_said_of(store: Store) -> None:
    """An agent trial stored kind "fact": taken without a word, and no block ever took
    it. Kinds are an open vocabulary (the design's), so it is stored, and said of."""
    ana = Principal(frozenset({"ana"}))
    done = ops.store_memories(store, ana, "ana", [
        {"content": "Ana plays the cello", "kind": "fact"},
        {"content": "Ana likes tea", "kind": "Preference"},
        {"content": "", "kind": "fact"},  # refused: no note for it
        {"content": "Ana met Bo at school", "kind": "episodic"},
        {"content": "Ana reads at night"}])
    assert done["stored"] == 4 and [r["record"] for r in done["rejected"]] == ["record 3"]
    assert len(done["notes"]) == 1 and done["notes"][0].startswith(
        "record 1: kind 'fact' is none the seeds give a meaning (behavioral, context, ")
