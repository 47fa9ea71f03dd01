"""`reverie api` as a real process: every operation with its own token, another
profile's, none and a wrong one; bad input is a 4xx naming the field; a schemathesis
fuzz of /openapi.json finds no 5xx; the log holds no memory content."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_server import (
    ADMIN_TOKEN,
    ALICE_TOKEN,
    BOB_TOKEN,
    WRONG_TOKEN,
    Running,
    api_server,
    bearer,
    offered_names,
    reverie,
)

from reverie.models.db import create_store
from reverie.models.store import Store

from conftest import TEST_POSTGRES, _create_postgres_database, _drop_postgres_database

SECRET = "the-vault-combination-is-4471-zebra"  # memory content the log must never hold


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    folder = tmp_path_factory.mktemp("api")
    url = _create_postgres_database() if TEST_POSTGRES else f"sqlite:///{folder / 'store.db'}"
    Store(url).create()  # the API never creates a store: `reverie init` did
    with api_server(url, folder) as running:
        for profile, token in (("alice", ALICE_TOKEN), ("bob", BOB_TOKEN)):
            r = httpx.post(f"{running.url}/v1/profiles/{profile}/memories",
                           headers=bearer(token), timeout=120, json={"memories": [
                               {"id": f"{profile}-1", "content": f"{profile} likes green tea",
                                "kind": "preference"},
                               {"id": f"{profile}-2", "content": f"{profile} lives in Lyon",
                                "kind": "semantic", "importance": 0.9},
                           ]})
            assert r.status_code == 200, r.text
        yield running
    if TEST_POSTGRES:
        _drop_postgres_database(url)


def call(api: Running, method: str, path: str, token: str | None,
         body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.request(method, f"{api.url}{path}", headers=bearer(token), json=body,
                         timeout=180)


# Every operation on profile {p}: (method, path, body).
OPERATIONS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/v1/profiles/{p}/session-init", {"query": "what does she drink?"}),
    ("POST", "/v1/profiles/{p}/memories", {"memories": [{"content": "likes hiking"}]}),
    ("POST", "/v1/profiles/{p}/recall", {"query": "tea", "k": 2}),
    ("GET", "/v1/profiles/{p}/memories/{p}-1", None),
    ("POST", "/v1/profiles/{p}/consolidate", {"mode": "lightweight", "dry_run": True}),
    ("GET", "/v1/profiles/{p}/consolidate/status", None),
    ("POST", "/v1/profiles/{p}/session-end", {"session": "s1"}),
    ("POST", "/v1/profiles/{p}/undo", {"id": "c-does-not-exist"}),
    ("POST", "/consolidate", {"profile": "{p}", "task": "lightweight", "dry_run": True}),
    ("GET", "/consolidate/status?profile={p}", None),
]
IDS = [f"{m} {p.split('{p}')[-1] or p}" for m, p, _ in OPERATIONS]


def _fill(value: Any, profile: str) -> Any:
    if isinstance(value, str):
        return value.replace("{p}", profile)
    if isinstance(value, dict):
        return {k: _fill(v, profile) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, profile) for v in value]
    return value


@pytest.mark.slow
@pytest.mark.parametrize(("method", "path", "body"), OPERATIONS, ids=IDS)
def test_every_operation_is_limited_to_the_tokens_profiles(
    api: Running, method: str, path: str, body: dict[str, Any] | None
) -> None:
    own = call(api, method, _fill(path, "alice"), ALICE_TOKEN, _fill(body, "alice"))
    # Past the token: the operation's own answer (undo of an unknown id is a 404).
    assert own.status_code in (200, 404), own.text
    if "undo" not in path:
        assert own.status_code == 200, own.text

    # Bob's token for Alice's profile, and for a profile that does not exist: one answer.
    other = call(api, method, _fill(path, "alice"), BOB_TOKEN, _fill(body, "alice"))
    ghost = call(api, method, _fill(path, "nobody"), BOB_TOKEN, _fill(body, "nobody"))
    assert other.status_code == ghost.status_code == 403
    assert other.json() == ghost.json()
    assert "alice" not in other.text and "nobody" not in ghost.text

    for token in (None, WRONG_TOKEN):
        refused = call(api, method, _fill(path, "alice"), token, _fill(body, "alice"))
        assert refused.status_code == 401, refused.text
        assert refused.headers.get("www-authenticate") == "Bearer"


@pytest.mark.slow
def test_the_admin_token_covers_every_profile_and_unknown_ones_are_not_found(
    api: Running,
) -> None:
    assert call(api, "POST", "/v1/profiles/bob/recall", ADMIN_TOKEN,
                {"query": "tea"}).status_code == 200
    missing = call(api, "POST", "/v1/profiles/nobody/recall", ADMIN_TOKEN, {"query": "tea"})
    assert missing.status_code == 404
    assert "nobody" in missing.json()["message"]


@pytest.mark.slow
@pytest.mark.parametrize(("path", "body", "status", "field"), [
    ("/v1/profiles/alice/recall", {"query": "tea", "k": 0}, 422, "k"),
    ("/v1/profiles/alice/recall", {"query": ""}, 422, "query"),
    ("/v1/profiles/alice/recall", {"query": "tea", "colour": 1}, 422, "colour"),
    ("/v1/profiles/alice/consolidate", {"mode": "everything"}, 422, "mode"),
    ("/v1/profiles/alice/consolidate", {"mode": "full", "min_age_days": 3}, 422,
     "min_age_days"),
    ("/v1/profiles/alice/consolidate", {"mode": "cold", "scope": "session"}, 422, "session"),
    ("/v1/profiles/alice/consolidate", {"mode": "cold", "min_age_days": -1}, 422,
     "min_age_days"),
    ("/v1/profiles/alice/memories", {"memories": [{"content": "x"}] * 21}, 422, "memories"),
    ("/v1/profiles/alice/memories", {"memories": []}, 422, "memories"),
    ("/v1/profiles/alice/memories",
     {"memories": [{"content": "dated", "created_at": "2025-13-45"}]}, 422, "created_at"),
    ("/v1/profiles/alice/memories",
     {"memories": [{"content": "tea", "importance": 7}]}, 422, "importance"),
    ("/v1/profiles/alice/memories",
     {"memories": [{"content": "tea", "profile": "bob"}]}, 422, "profile"),
    ("/v1/profiles/alice/session-init", {"k": "many"}, 422, "k"),
    ("/v1/profiles/alice/undo", {}, 422, "id"),
    # JSON's types, not lookalikes pydantic's lax mode took ("3" for 3, 0 for false).
    ("/v1/profiles/alice/recall", {"query": "tea", "k": "3"}, 422, "k"),
    ("/v1/profiles/alice/recall", {"query": "tea", "k": 3.0}, 422, "k"),
    ("/v1/profiles/alice/recall", {"query": "tea", "deep": 1}, 422, "deep"),
    ("/v1/profiles/alice/recall", {"query": "tea", "track": "true"}, 422, "track"),
    ("/v1/profiles/alice/session-init", {"k": "3"}, 422, "k"),
    ("/v1/profiles/alice/session-init", {"budget_chars": "100"}, 422, "budget_chars"),
    ("/v1/profiles/alice/consolidate", {"mode": "lightweight", "dry_run": 0}, 422, "dry_run"),
    ("/v1/profiles/alice/consolidate", {"use_llm": 1}, 422, "use_llm"),
    ("/v1/profiles/alice/consolidate", {"mode": "sleep", "min_age_days": "3"}, 422,
     "min_age_days"),
    ("/consolidate", {"profile": "alice", "task": "colder"}, 422, "task"),
    ("/consolidate", {"profile": "alice", "dry_run": "yes"}, 422, "dry_run"),
    # Only spaces or zero-width characters: nothing to look for.
    ("/v1/profiles/alice/recall", {"query": "\u200b"}, 422, "query"),
    ("/v1/profiles/alice/recall", {"query": "\u200b \ufeff"}, 422, "query"),
    ("/v1/profiles/alice/session-init", {"query": " \u2060 "}, 422, "query"),
])
def test_bad_input_is_a_4xx_naming_the_field(
    api: Running, path: str, body: dict[str, Any], status: int, field: str
) -> None:
    r = call(api, "POST", path, ALICE_TOKEN, body)
    assert r.status_code == status, r.text
    assert r.json()["field"] == field, r.text


@pytest.mark.slow
@pytest.mark.parametrize(("limit", "status"), [("3", 200), ("3.5", 422), ("abc", 422),
                                               ("0", 422)])
def test_a_query_strings_number_is_read_from_its_text(
    api: Running, limit: str, status: int
) -> None:
    """A query string holds text only: "3" is 3, but "3.5" and "abc" are refused."""
    for path in ("/v1/profiles/alice/consolidate/status?limit=",
                 "/consolidate/status?profile=alice&limit="):
        r = call(api, "GET", path + limit, ALICE_TOKEN)
        assert r.status_code == status, r.text
        if status == 422:
            assert r.json()["field"] == "limit", r.text


@pytest.mark.slow
def test_good_records_are_kept_when_others_in_the_batch_are_refused(api: Running) -> None:
    r = call(api, "POST", "/v1/profiles/alice/memories", ALICE_TOKEN, {"memories": [
        {"content": "alice plays the cello"}, {"content": "bad date", "valid_from": "yesterday"},
    ]})
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["stored"] == 1
    assert [(e["record"], e["field"]) for e in data["rejected"]] == [("record 2", "valid_from")]


@pytest.mark.slow
@pytest.mark.store_independent("the body is refused before any handler runs")
def test_an_oversized_body_is_a_413(api: Running) -> None:
    big = {"memories": [{"content": "x" * 70_000}]}
    r = call(api, "POST", "/v1/profiles/alice/memories", ALICE_TOKEN, big)
    assert r.status_code == 413
    assert r.json()["field"] == "body"
    # Sent in chunks, with no Content-Length to refuse it by.
    chunks = iter([b'{"memories": [{"content": "', b"x" * 70_000, b'"}]}'])
    r = httpx.post(f"{api.url}/v1/profiles/alice/memories", headers=bearer(ALICE_TOKEN),
                   content=chunks, timeout=60)
    assert "content-length" not in r.request.headers
    assert r.status_code == 413 and r.json()["field"] == "body", r.text


@pytest.mark.slow
def test_the_description_names_the_bearer_scheme_and_the_refusals(api: Running) -> None:
    """So that /docs sends the token (its Authorize button), and a client generated from
    the description knows the refusals' shape."""
    described = httpx.get(f"{api.url}/openapi.json", timeout=60).json()
    assert described["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path, item in described["paths"].items():
        for operation in item.values():
            if path == "/health":
                assert "security" not in operation
                continue
            assert operation["security"] == [{"bearer": []}], path
            assert {"401", "403", "413", "422"} <= set(operation["responses"]), path
            if path != "/mcp":
                assert operation.get("description"), path  # what the MCP tool says
    # Every field of a session's start and end, and of a consolidation, has a default:
    # no body at all is one (a consolidation's is not sent here: it would start a run).
    consolidate = described["paths"]["/v1/profiles/{profile}/consolidate"]["post"]
    assert not consolidate.get("requestBody", {}).get("required")
    for path in ("session-init", "session-end"):
        r = httpx.post(f"{api.url}/v1/profiles/alice/{path}", headers=bearer(ALICE_TOKEN),
                       timeout=60)
        assert r.status_code == 200, r.text


@pytest.mark.slow
def test_the_description_states_the_limits_the_server_applies(api: Running) -> None:
    """REVERIE_API_MAX_K (100 by default) and REVERIE_API_MAX_BATCH (20 for this
    server), as the calls refuse them: a client reading the description sends what is
    taken."""
    bodies = httpx.get(f"{api.url}/openapi.json", timeout=60).json()["components"]["schemas"]
    assert bodies["RecallBody"]["properties"]["k"]["maximum"] == 100
    assert bodies["SessionInit"]["properties"]["k"]["maximum"] == 100
    assert bodies["StoreBody"]["properties"]["memories"]["maxItems"] == 20
    for k, status in ((100, 200), (101, 422)):
        r = call(api, "POST", "/v1/profiles/alice/recall", ALICE_TOKEN, {"query": "tea", "k": k})
        assert r.status_code == status, r.text
    for n, status in ((21, 422), (20, 200)):  # a profile of its own: others count theirs
        r = call(api, "POST", "/v1/profiles/limits/memories", ADMIN_TOKEN,
                 {"memories": [{"content": f"read book {i}"} for i in range(n)]})
        assert r.status_code == status, r.text


@pytest.mark.slow
def test_an_id_with_a_slash_is_found(api: Running) -> None:
    """Any text up to 256 characters is an id, "/" too: the path takes it, encoded."""
    stored = call(api, "POST", "/v1/profiles/alice/memories", ALICE_TOKEN,
                  {"memories": [{"id": "notes/2025/ü", "content": "alice keeps notes"}]})
    assert stored.status_code == 200, stored.text
    r = call(api, "GET", "/v1/profiles/alice/memories/notes%2F2025%2F%C3%BC", ALICE_TOKEN)
    assert r.status_code == 200, r.text
    assert r.json()["content"] == "alice keeps notes"
    assert call(api, "GET", "/v1/profiles/alice/memories/notes%2F2026",
                ALICE_TOKEN).status_code == 404


@pytest.mark.slow
@pytest.mark.parametrize(("headers", "raw", "status", "field"), [
    # Good JSON said to be a form (curl -d) or text: the content type is at fault.
    ({"content-type": "application/x-www-form-urlencoded"}, b'{"query": "tea"}', 415,
     "content-type"),
    ({"content-type": "text/plain"}, b'{"query": "tea"}', 415, "content-type"),
    ({"content-type": "application/json"}, None, 422, "body"),  # none at all
    ({"content-type": "application/json"}, b"[]", 422, "body"),  # not an object
    ({"content-type": "application/json; charset=utf-8"}, b'{"query": "tea"}', 200, None),
])
def test_a_body_is_refused_naming_what_is_wrong_with_it(
    api: Running, headers: dict[str, str], raw: bytes | None, status: int, field: str | None
) -> None:
    r = httpx.post(f"{api.url}/v1/profiles/alice/recall", content=raw, timeout=60,
                   headers={**bearer(ALICE_TOKEN), **headers})
    assert r.status_code == status, r.text
    if field is not None:
        assert r.json()["field"] == field, r.text


@pytest.mark.slow
@pytest.mark.parametrize("token", [ADMIN_TOKEN, ALICE_TOKEN])
def test_a_profile_name_no_store_can_hold_is_a_422(api: Running, token: str) -> None:
    """Not "not found" (404) for one token and "not yours" (403) for another: no profile
    can have that name, which says nothing of the profiles that exist."""
    for method, path, body in OPERATIONS:
        r = call(api, method, path.replace("{p}", "bad%20name!"), token,
                 _fill(body, "bad name!"))
        assert r.status_code == 422, (path, r.text)
        assert r.json()["field"] == "profile", (path, r.text)


@pytest.mark.slow
@pytest.mark.parametrize(("method", "path", "raw", "status", "field"), [
    ("POST", "/v1/profiles/alice/recall", b'{"query": "tea",', 422, "body"),
    ("POST", "/v1/profiles/alice/recall", b'{"query": "t\xff"}',
     400, "body"),
    ("POST", "/v1/profiles/alice/recall", b'{"query": "tea", "k": ' + b"9" * 5000 + b"}",
     400, "body"),
    ("POST", "/v1/profiles/alice/nowhere", b"{}", 404, None),
    ("GET", "/v1/profiles/alice/recall", None, 405, None),
])
def test_a_body_or_path_the_api_cannot_take_is_refused_in_its_shape(
    api: Running, method: str, path: str, raw: bytes | None, status: int, field: str | None
) -> None:
    """Not JSON, not UTF-8, a number too long to read, no such path or method: the
    same {"error", "field", "message"} as every other refusal."""
    r = httpx.request(method, f"{api.url}{path}", headers={
        **bearer(ALICE_TOKEN), "content-type": "application/json"}, content=raw, timeout=60)
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) >= {"error", "field", "message"} and body["field"] == field, body
    assert "detail" not in body


@pytest.mark.slow
def test_the_log_holds_no_memory_content_and_no_token(api: Running) -> None:
    stored = call(api, "POST", "/v1/profiles/alice/memories", ALICE_TOKEN,
                  {"memories": [{"content": SECRET}, {"content": SECRET, "importance": 9}]})
    assert stored.status_code == 200
    assert call(api, "POST", "/v1/profiles/alice/recall", ALICE_TOKEN,
                {"query": SECRET}).json()["hits"][0]["content"] == SECRET
    call(api, "POST", "/v1/profiles/alice/recall", ALICE_TOKEN, {"query": SECRET, "k": -1})
    call(api, "POST", "/v1/profiles/alice/recall", WRONG_TOKEN, {"query": SECRET})
    log = api.log_text()
    assert SECRET not in log
    for token in (ALICE_TOKEN, BOB_TOKEN, ADMIN_TOKEN, WRONG_TOKEN):
        assert token not in log


def _times(value: Any) -> list[str]:
    """Every string of an answer that reads as a date and time."""
    if isinstance(value, dict):
        return [t for v in value.values() for t in _times(v)]
    if isinstance(value, list):
        return [t for v in value for t in _times(v)]
    dated = isinstance(value, str) and re.match(r"\d{4}-\d\d-\d\dT\d\d:", value)
    return [value] if dated else []


@pytest.mark.slow
def test_every_time_in_an_answer_carries_its_utc_offset(api: Running) -> None:
    """The store keeps naive UTC; without an offset a client reads its own local time."""
    stored = call(api, "POST", "/v1/profiles/bob-2/memories", BOB_TOKEN, {"memories": [
        {"id": "bob-dated", "content": "bob moved to Lyon",
         "created_at": "2026-03-01T09:30:00+02:00", "valid_from": "2026-03-01",
         "valid_until": "2027-03-01T00:00:00Z"}]})
    assert stored.status_code == 200, stored.text
    got = call(api, "GET", "/v1/profiles/bob-2/memories/bob-dated", BOB_TOKEN).json()
    assert got["created_at"] == "2026-03-01T07:30:00+00:00"
    assert got["valid_until"] == "2027-03-01T00:00:00+00:00"
    answers = [got]
    for method, path, body in (
        ("POST", "/v1/profiles/bob-2/recall", {"query": "where did bob move", "k": 3}),
        ("POST", "/v1/profiles/bob-2/session-init", {"query": "Lyon"}),
        ("POST", "/v1/profiles/bob-2/session-init", {}),
        ("POST", "/v1/profiles/bob-2/consolidate", {"mode": "lightweight", "dry_run": True}),
        ("GET", "/v1/profiles/bob-2/consolidate/status", None),
    ):
        r = call(api, method, path, BOB_TOKEN, body)
        assert r.status_code == 200, r.text
        answers.append(r.json())
    times = _times(answers)
    assert len(times) >= 8, times
    assert [t for t in times if not t.endswith("+00:00")] == [], times


@pytest.mark.slow
def test_old_mode_names_are_taken_but_no_longer_offered(api: Running) -> None:
    """The description lists the current modes only (an agent reading it learns those);
    an old name (ALIASES) still runs for one release, and its answer says so."""
    from reverie.flows.catalog import ALIASES

    described = httpx.get(f"{api.url}/openapi.json", timeout=60).json()
    schemas = described["components"]["schemas"]
    offered = [offered_names(schemas["ConsolidateBody"]["properties"]["mode"], described),
               offered_names(schemas["AutoMemConsolidate"]["properties"]["task"], described)]
    for names in offered:
        assert "cold-notes" in names and "sleep" in names
        assert not set(ALIASES) & set(names), names
    for path, body in (("/v1/profiles/alice/consolidate", {"mode": "cold", "dry_run": True}),
                       ("/consolidate", {"profile": "alice", "task": "cold", "dry_run": True})):
        r = call(api, "POST", path, ALICE_TOKEN, body)
        assert r.status_code == 200, r.text
        assert r.json()["mode"] == "cold"
        assert "old name of 'cold-notes'" in r.json()["deprecated"]
    current = call(api, "POST", "/v1/profiles/alice/consolidate", ALICE_TOKEN,
                   {"mode": "cold-notes", "dry_run": True}).json()
    assert "deprecated" not in current


@pytest.mark.slow
def test_get_finds_a_memory_by_the_callers_id(api: Running) -> None:
    r = call(api, "GET", "/v1/profiles/bob/memories/bob-2", BOB_TOKEN)
    assert r.status_code == 200
    assert r.json()["content"] == "bob lives in Lyon"
    assert call(api, "GET", "/v1/profiles/bob/memories/alice-1", BOB_TOKEN).status_code == 404


@pytest.mark.slow
def test_session_init_gives_blocks_then_memories_within_the_budget(api: Running) -> None:
    r = call(api, "POST", "/v1/profiles/bob/session-init", BOB_TOKEN,
             {"query": "where does bob live", "budget_chars": 30})
    data = r.json()
    assert data["used_chars"] <= 30
    assert [m["content"] for m in data["memories"]] == ["bob lives in Lyon"]


@pytest.mark.slow
@pytest.mark.store_independent("request validation and refusals come before the store")
def test_schemathesis_finds_no_server_error(api: Running, tmp_path: Path) -> None:
    """A property-based fuzz of the OpenAPI description (admin token: every generated
    profile gets past the token to the operation's own checks)."""
    st = Path(subprocess.check_output(["which", "st"], text=True,
                                      env={"PATH": str(Path(__file__).parents[1] / ".venv/bin")
                                           + ":/usr/bin:/bin"}).strip())
    result = subprocess.run(
        [str(st), "run", f"{api.url}/openapi.json", "--checks", "not_a_server_error",
         "-H", f"Authorization: Bearer {ADMIN_TOKEN}", "--max-examples", "8",
         "--generation-deterministic", "--request-timeout", "120",
         "--phases", "examples,coverage,fuzzing",
         "--suppress-health-check", "all"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    print(result.stdout[-1500:])
    assert api.process.poll() is None  # no crash


@pytest.mark.slow
def test_a_real_consolidation_is_a_flow_run_returned_at_once(
    api: Running, tmp_path: Path
) -> None:
    """Without a configured Prefect API the run is made on the shared local server and
    run by a process of its own: the call answers before the run is over."""
    import time

    def completes(data: dict[str, Any]) -> str:
        assert data["state"] in ("Pending", "Scheduled")
        assert data["ui_url"].endswith(f"/runs/flow-run/{data['run_id']}")
        api_url = data["ui_url"].split("/runs/")[0] + "/api"
        deadline = time.monotonic() + 240
        state = None
        while time.monotonic() < deadline:
            state = httpx.get(f"{api_url}/flow_runs/{data['run_id']}", timeout=10).json()[
                "state"]["type"]
            if state in ("COMPLETED", "FAILED", "CRASHED"):
                break
            time.sleep(1)
        return str(state)

    r = call(api, "POST", "/v1/profiles/alice/consolidate", ALICE_TOKEN,
             {"mode": "lightweight"})
    assert r.status_code == 200, r.text
    first = r.json()
    # The agent follows its run: its process takes seconds to start, so the run is
    # still waiting (or already running) when the call has answered.
    status = call(api, "GET", "/v1/profiles/alice/consolidate/status", ALICE_TOKEN).json()
    following = {g["run_id"]: g for runs in status["running"].values() for g in runs}
    assert following[first["run_id"]]["state"] in ("Pending", "Running"), status
    assert following[first["run_id"]]["ui_url"] == first["ui_url"]
    assert completes(first) == "COMPLETED"
    status = call(api, "GET", "/consolidate/status?profile=alice", ALICE_TOKEN).json()
    assert status["last"].get("lightweight-consolidation")
    assert first["run_id"] not in {g["run_id"] for runs in status["running"].values()
                                   for g in runs}
    # Another profile's status shows none of alice's runs.
    bob = call(api, "GET", "/v1/profiles/bob/consolidate/status", BOB_TOKEN).json()
    assert not any(bob["running"].values()), bob

    # The local server records runs and has no deployments nor automations: a session's
    # end promises no consolidation, and the calls queue no events nothing would act on.
    ended = call(api, "POST", "/v1/profiles/alice/session-end", ALICE_TOKEN, {}).json()
    assert ended["consolidation_follows"] is False
    stored = call(api, "POST", "/v1/profiles/alice/memories", ALICE_TOKEN,
                  {"memories": [{"content": "alice walks to work"}]})
    assert stored.status_code == 200, stored.text
    waiting = subprocess.run([reverie(), "events", "--json"], env=api.env,
                             capture_output=True, text=True, timeout=120)
    assert waiting.returncode == 0, waiting.stderr
    assert json.loads(waiting.stdout) == [], waiting.stdout

    # The local server stopped (`reverie server stop`, idle, killed) is started again
    # by the next run, not a 500 for every call until the API restarts.
    stop = subprocess.run([reverie(), "server", "stop"], env=api.env, capture_output=True,
                          text=True, timeout=120)
    assert stop.returncode == 0 and "stopped" in stop.stdout, stop.stdout + stop.stderr
    r = call(api, "POST", "/v1/profiles/alice/consolidate", ALICE_TOKEN,
             {"mode": "lightweight"})
    assert r.status_code == 200, r.text
    again = r.json()
    assert again["ui_url"] != first["ui_url"] or again["run_id"] != first["run_id"]
    assert completes(again) == "COMPLETED"


BLOCK_TOKEN = "carol-token-from-a-secret-0123456789"


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
@pytest.mark.store_independent("the tokens come from Prefect before any store is read")
def test_tokens_from_a_prefect_secret_block(tmp_path: Path) -> None:
    """REVERIE_API_TOKENS_BLOCK names a Secret block on a real Prefect API: its token
    covers its profile and no other, and adds to REVERIE_API_TOKENS."""
    from prefect.blocks.system import Secret
    from prefect.settings import PREFECT_API_URL

    Secret(value=f"{BLOCK_TOKEN}:carol,carol-2").save("reverie-api-tokens-test", overwrite=True)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    create_store(url)
    with api_server(url, tmp_path,
                    REVERIE_API_TOKENS_BLOCK="reverie-api-tokens-test",
                    PREFECT_API_URL=str(PREFECT_API_URL.value())) as running:
        stored = call(running, "POST", "/v1/profiles/carol/memories", BLOCK_TOKEN,
                      {"memories": [{"content": "carol keeps bees"}]})
        assert stored.status_code == 200, stored.text
        found = call(running, "POST", "/v1/profiles/carol/recall", BLOCK_TOKEN,
                     {"query": "bees", "k": 1})
        assert found.status_code == 200, found.text
        assert found.json()["hits"][0]["content"] == "carol keeps bees"
        for profile in ("alice", "bob"):  # not covered by the block's token
            refused = call(running, "POST", f"/v1/profiles/{profile}/recall", BLOCK_TOKEN,
                           {"query": "bees"})
            assert refused.status_code == 403, refused.text
        # The tokens of REVERIE_API_TOKENS still hold, and still not for carol.
        assert call(running, "POST", "/v1/profiles/alice/recall", ALICE_TOKEN,
                    {"query": "tea"}).status_code == 200
        assert call(running, "POST", "/v1/profiles/carol/recall", ALICE_TOKEN,
                    {"query": "bees"}).status_code == 403
        assert BLOCK_TOKEN not in running.log_text()


@pytest.mark.store_independent("the server refuses to start before it reads the store")
def test_a_missing_secret_block_stops_the_server_with_its_name(tmp_path: Path) -> None:
    from agent_server import reverie, server_env

    url = f"sqlite:///{tmp_path / 'store.db'}"
    create_store(url)
    env = server_env(url, REVERIE_API_TOKENS_BLOCK="no-such-block",
                     PREFECT_API_URL="http://127.0.0.1:9/api")
    done = subprocess.run([reverie(), "api", "--port", "9"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    assert "no-such-block" in done.stderr


@pytest.mark.slow
@pytest.mark.store_independent("the local Prefect server is started before any store is read")
@pytest.mark.parametrize("command", [("api",), ("mcp", "--transport", "http")])
def test_the_local_prefect_server_is_started_at_once_without_holding_up_the_start(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """With no Prefect API configured (and the shared local server, the default), a
    server process starts the local Prefect server as it starts, so that an agent's
    first consolidate does not wait 8 s or more for it; the server answers before it is
    up. The suite's REVERIE_LOCAL_SERVER=temporary starts none (the other tests)."""
    import time

    from reverie.deployments.local_server import running

    url = f"sqlite:///{tmp_path / 'store.db'}"
    create_store(url)
    with api_server(url, tmp_path, command=command, REVERIE_LOCAL_SERVER="shared") as up:
        home = Path(up.env["PREFECT_HOME"])
        assert running(home) is None  # answering already, the Prefect server not yet
        deadline = time.monotonic() + 120
        while "started a local Prefect server" not in up.log_text():
            assert time.monotonic() < deadline, up.log_text()
            time.sleep(0.5)
        server = running(home)
        assert server is not None and f"at {server.url} " in up.log_text(), up.log_text()
