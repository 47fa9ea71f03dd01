"""What an agent can do through ``reverie api`` and ``reverie mcp``: one function per
operation, taking the store and the caller (``auth.Principal``), returning plain data.
Both servers call these and nothing else, so an HTTP endpoint and an MCP tool answer
alike; each checks the caller's token covers the profile before it looks at the store,
so a refusal says nothing of whether the profile exists.

They reuse what the CLI does: ``models.ingest.ingest`` (validation, messages, the store
trigger's events), ``recall.search.recall``, ``repositories.runs.end_session``,
``repositories.summaries.undo``, ``deployments.status.collect`` and the flows of
``flows.catalog``. Nothing here logs a memory's content or a query.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, Strict, TypeAdapter, WithJsonSchema
from pydantic_core import PydanticCustomError
from sqlalchemy import select
from sqlmodel import col

from reverie.deployments.api_errors import RecordsRefused, field_error
from reverie.deployments.auth import Principal
from reverie.engines.group_commit import Failure, GroupCommit
from reverie.flows.catalog import ALIASES, FLOWS
from reverie.models.errors import NotFoundError, RecordError
from reverie.models.ids import PROFILE_CHARACTERS, PROFILE_NAME, given_id
from reverie.models.records import MemoryView
from reverie.models.store import Store
from reverie.models.tables import Memory, RunRecord, Tier, Tombstone
from reverie.models.text import has_visible_text
from reverie.models.timestamps import utcnow

if TYPE_CHECKING:
    from reverie.engines.ranking import RecallCache
    from reverie.models.ingest import IngestReport

log = logging.getLogger(__name__)

# consolidate's modes: every flow of the catalog by its short name (SuperLocalMemory's
# full and lightweight runs, linksee's cold consolidation, also called "sleep", AutoMem's
# tasks), less those that delete or expire, which wait for an operator's approval.
# The old names (ALIASES) are still taken for one release, but not advertised: an agent
# that reads the modes (OpenAPI, the MCP tool) learns the current ones only.
NEEDS_APPROVAL = ("forget", "cold-tier")
MODES = {**{name: name for name in FLOWS if name not in NEEDS_APPROVAL}, "sleep": "cold-notes"}
# Members from the catalog: mypy cannot list them (the ignore).
Mode = StrEnum("Mode", {name: name for name in MODES})  # type: ignore[misc]


def _a_mode(text: str) -> str:
    if text not in MODES.keys() | ALIASES.keys():
        raise PydanticCustomError("enum", "Input should be one of {expected}",
                                  {"expected": ", ".join(MODES)})
    return text


# Numbers and flags as both servers declare them: as JSON types them (pydantic's lax
# mode took "3" for 3 and 0 for false). An HTTP query string's stay lax: there every
# value is a string.
Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Number = Annotated[float, Strict()]  # a JSON integer is a number too
# A mode as the servers declare it: described as its current names (``Mode``), an old one
# still taken. Checked in the request, so that a refusal names the field it came in (an
# AutoMem call's ``task``); ``consolidate`` checks it again for a Python caller.
ModeName = Annotated[str, AfterValidator(_a_mode), WithJsonSchema(
    TypeAdapter(Mode).json_schema())]
MAX_PROFILE_CHARS = 128
MAX_ID_CHARS = 512
SESSION_INIT_POOL = 50  # memories session_init ranks before it fills the budget
# The kinds the seeds give a meaning (the design's open vocabulary): a record of another
# is stored, and its store answer says that no Core Memory block will take it ("fact"
# was taken without a word, and never showed in session_init).
SEED_KINDS = frozenset(
    "episodic semantic opinion preference decision insight pattern behavioral procedural "
    "context".split())
# What each operation does, as the MCP tools and the HTTP API's OpenAPI description both
# say it to an agent (and its developer): one text per operation.
DESCRIPTIONS: dict[str, str] = {
    "session_init": "Call first, at the start of a session: the Core Memory blocks (the "
                    "user's profile first), then the best memories the blocks do not "
                    "already say (recalled for the query if given, else the most "
                    "important) within a character budget.",
    "store": "Store memories worth keeping. Each is checked on its own: the answer lists "
             "those refused, naming their field, and the id of each accepted. A record "
             "with an id stored before updates it; notes name a record stored of a kind "
             "no Core Memory block takes. Counts toward the 50-store trigger and the idle "
             "timer.",
    "recall": "The memories most like the query, best first, each with its day. A summary "
              "shows the members that matched; get gives it whole. Deep recall adds the "
              "cold tier: an original a newer memory superseded says so (superseded_by).",
    "get": "One memory by Reverie id or your own id, in any tier (or its tombstone).",
    "consolidate": "Consolidate the profile. A dry run answers with the preview at once. "
                   "A real run is a Prefect flow run, started without waiting: its id, "
                   "state and UI link come back at once.",
    "consolidation_status": "When each flow last ran for the profile, its scheduled runs, "
                            "the runs that failed, and the run history.",
    "session_end": "Call at the end of a session. With the Prefect deployments' triggers, "
                   "a full consolidation follows (consolidation_follows says whether one "
                   "will).",
    "undo": "Undo a consolidation by its id (c-...) or its summary's id: its originals "
            "come back hot.",
}


# --- checks -------------------------------------------------------------------------------


def profile_name(text: object) -> str:
    """A profile as the store keeps it, or a 422 naming the field 'profile'."""
    if not isinstance(text, str):
        raise field_error("profile", "must be a string")
    try:
        name = given_id(text)
    except ValueError as exc:
        raise field_error("profile", str(exc)) from None
    if not name:
        raise field_error("profile", "must not be empty")
    if len(name) > MAX_PROFILE_CHARS:
        raise field_error("profile", f"longer than {MAX_PROFILE_CHARS} characters")
    if not PROFILE_NAME.match(name):  # as ingest has it: no such profile can exist
        raise field_error("profile", PROFILE_CHARACTERS)
    return name


def _allowed(store: Store, who: Principal, profile: object, must_exist: bool = True) -> str:
    """The profile, once the token covers it (checked first: an uncovered profile gets
    the same refusal whether it exists or not), and it exists if ``must_exist``."""
    name = profile_name(profile)
    who.check(name)
    if must_exist:
        store.resolve_profiles(name)
    return name


def _new(store: Store, who: Principal, name: str) -> bool:
    """Whether ``name`` is a profile the token names that the store does not hold yet (an
    agent before its first store): it reads as empty. Any other profile the store does
    not hold is a 404 (an admin token names no profile)."""
    if store.has_profile(name):
        return False
    if who.admin or name not in who.profiles:
        store.resolve_profiles(name)  # raises NotFoundError
    return True


def _an_id(text: object, field: str) -> str:
    if not isinstance(text, str):
        raise field_error(field, "must be a string")
    try:
        ident = given_id(text)
    except ValueError as exc:
        raise field_error(field, str(exc)) from None
    if not ident or len(ident) > MAX_ID_CHARS:
        raise field_error(field, f"must have 1 to {MAX_ID_CHARS} characters")
    return ident


def _query(store: Store, query: object, field: str = "query") -> str:
    if not isinstance(query, str) or not query.strip():
        raise field_error(field, "must be a non-empty string")
    if not has_visible_text(query):
        # Recall refuses it too, as a plain InputError: an API call is told which
        # field of its request it was.
        raise field_error(field, "is empty: it has no letter, digit, punctuation or symbol")
    limit = store.settings.max_content_chars
    if len(query) > limit:
        raise field_error(field, f"longer than {limit} characters")
    try:
        given_id(query)  # no NUL, no unpaired surrogate
    except ValueError as exc:
        raise field_error(field, str(exc)) from None
    return query


def _flag(value: object, field: str) -> bool:
    if not isinstance(value, bool):  # 0 or "no" would read as false, "false" as true
        raise field_error(field, "must be true or false")
    return value


def _count(value: object, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise field_error(field, f"must be a whole number from {low} to {high}")
    return value


# --- plain data ---------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return _utc_iso(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _utc_iso(value: datetime) -> str:
    """``value`` in ISO 8601 with its offset, +00:00: the store's times are naive UTC,
    and a client reading a time without an offset takes it as its own local time."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC).isoformat()
    return value.astimezone(UTC).isoformat()


def memory_data(m: Any) -> dict[str, Any]:
    if hasattr(m, "model_dump"):
        data = m.model_dump()
    else:
        # Field by field, not ``asdict``: its deep copy of every value was a tenth of a
        # recall's CPU, and ``_plain`` below copies the containers anyway.
        data = {f.name: getattr(m, f.name) for f in fields(m)}
    data.pop("embedding", None)
    return _plain(data)


# --- activity events ----------------------------------------------------------------------


def _recalled(store: Store, profile: str, asked: int, found: int) -> None:
    """A recall is activity for the idle trigger: its event goes out as a store's does
    (through the outbox, when a Prefect API is configured)."""
    from reverie.models import events, outbox
    from reverie.runner.event_delivery import deliver, wanted

    if not wanted():
        return
    with store.writing_all() as s:
        outbox.add(s, [events.recalled_event(profile, asked, found, utcnow())])
    deliver(store.url)


@dataclass(frozen=True)
class _StoreCall:
    records: list[dict[str, Any]]
    profile: str
    at: datetime


def _write_calls(store: Store, queue_events: bool, _slot: int,
                 group: list[_StoreCall]) -> list[IngestReport | Failure]:
    """The store calls of one group, together if ``ingest_together`` can, else one by
    one in their order, each with its own report or error."""
    from reverie.engines.embedding import embedder_for
    from reverie.models.ingest import ingest, ingest_together

    embedder = embedder_for(store.settings)
    if len(group) > 1:
        try:
            reports = ingest_together(store, [(c.records, c.profile, c.at) for c in group],
                                      embedder, queue_events)
        except Exception:  # noqa: BLE001 - nothing was written: each call alone says why
            reports = None
        if reports is not None:
            return list(reports)
        log.info("a group of %d store calls is stored call by call", len(group))
    answers: list[IngestReport | Failure] = []
    for c in group:
        try:
            # An agent's call never creates a store: a mistyped URL is an error naming it.
            answers.append(ingest(store, c.records, embedder, c.profile, at=c.at,
                                  queue_events=queue_events, create=False))
        except Exception as exc:  # noqa: BLE001 - the call's own error, raised by it
            answers.append(Failure(exc))
    return answers


# By store URL and whether events are queued, the most recently used few: a server
# sees one store, a test process many, and one entry per URL ever seen was a leak. An
# entry dropped while calls use it only stops later calls from joining them.
STORE_CALL_URLS = 16
_store_calls: OrderedDict[tuple[str, bool], GroupCommit[_StoreCall, IngestReport]] = (
    OrderedDict())
_store_calls_lock = threading.Lock()


def _stored_together(store: Store, records: list[dict[str, Any]], name: str,
                     queue_events: bool) -> IngestReport:
    """``ingest`` of one call's records, written together with the store calls that
    came meanwhile (group commit): the first to get the store's turn writes every
    call waiting, in the order they came, in one transaction with one embedding
    (``ingest_together``), each answered with its own report; calls it cannot write
    together it ingests one by one, in that order. At 16 memories a call, a call's
    own transaction, reads and small embedding batches held 8 clients to under half
    of ingest's sentences per second."""
    key = (store.url, queue_events)
    with _store_calls_lock:
        calls = _store_calls.get(key)
        if calls is None:
            calls = GroupCommit(functools.partial(_write_calls, store, queue_events),
                                gather=store.settings.api_store_gather_ms / 1000)
            _store_calls[key] = calls
            while len(_store_calls) > STORE_CALL_URLS:
                _store_calls.popitem(last=False)
        else:
            _store_calls.move_to_end(key)
    return calls.submit(_StoreCall(records, name, utcnow()))


# --- operations ---------------------------------------------------------------------------


def store_memories(
    store: Store, who: Principal, profile: object, memories: object
) -> dict[str, Any]:
    """``reverie ingest`` for a batch of memory records (dicts, as JSONL lines are):
    the same validation and messages, the store trigger's events queued and sent as
    ingest sends them. Good records are stored even when others are refused."""
    from reverie.runner.event_delivery import deliver, wanted

    name = _allowed(store, who, profile, must_exist=False)
    most = store.settings.api_max_batch
    if not isinstance(memories, list) or not memories:
        raise field_error("memories", "must be a non-empty list of memory records")
    if len(memories) > most:
        raise field_error("memories", f"{len(memories)} records is more than one call "
                                      f"takes ({most}, REVERIE_API_MAX_BATCH)")
    records: list[dict[str, Any]] = []
    refused: list[RecordError] = []
    for n, record in enumerate(memories, start=1):
        where = f"record {n}"
        if not isinstance(record, dict):
            refused.append(RecordError(where, None, "must be an object"))
            continue
        if "profile" in record and record["profile"] != name:
            # A record for another profile would escape the token's scope.
            refused.append(RecordError(where, "profile", "must be the profile of the call "
                                                         "(or left out)"))
            continue
        records.append({**record, "profile": name})
    report = _stored_together(store, records, name, wanted()) if records else None
    if report is not None and report.queued_events:
        deliver(store.url)
    errors = refused + (report.errors if report else [])
    # ingest numbers the records it was given; renumber to the caller's positions.
    positions = [n for n, r in enumerate(memories, start=1)
                 if isinstance(r, dict) and ("profile" not in r or r["profile"] == name)]
    rejected: list[dict[str, Any]] = []
    for e in errors:
        where = e.where
        if e in (report.errors if report else []) and where.startswith("record "):
            try:
                where = f"record {positions[int(where.split()[1]) - 1]}"
            except (ValueError, IndexError):
                pass
        rejected.append({"record": where, "field": e.field, "message": e.message})
    # In the call's order: those refused here and those ingest refused were two lists.
    rejected.sort(key=lambda r: _record_number(r["record"]))
    refused_at = {r["record"] for r in rejected}
    notes = [f"record {n}: kind {kind!r} is none the seeds give a meaning "
             f"({', '.join(sorted(SEED_KINDS))}): stored, but no Core Memory block takes it"
             for n in positions if f"record {n}" not in refused_at
             and (record := memories[n - 1]).get("type", "memory") == "memory"
             and (kind := str(record.get("kind") or "semantic").strip().lower())
             not in SEED_KINDS]
    result = {
        "profile": name,
        "stored": report.stored if report else 0,
        "updated": report.updated if report else 0,
        "unchanged": report.unchanged if report else 0,
        "edges": report.edges if report else 0,
        "ids": list(report.memory_ids) if report else [],
        "released": list(report.released) if report else [],
        "rejected": rejected,
        "notes": notes,
    }
    if report is None or report.accepted + report.edges == 0:
        raise RecordsRefused(rejected)
    return result


def what_blocks_take() -> str:
    """Which memories each Core Memory block takes, by this configuration (said with
    ``store``): an agent that stores preferences at the default confidence, or never
    recalls with track, otherwise finds two blocks empty without knowing why."""
    from reverie.models.block_text import block_rules
    from reverie.models.settings import get_settings

    rules = block_rules(get_settings().consolidation_config().blocks)
    return "Core Memory (session_init) takes: " + "; ".join(
        f"{block}, {rule}" for block, rule in rules.items()) + "."


def _record_number(where: str) -> int:
    """N of "record N" (what a refusal of a store call names); 0 for anything else."""
    number = where.removeprefix("record ")
    return int(number) if number.isdigit() else 0


def recall(
    store: Store, who: Principal, profile: object, query: object, k: object = 5,
    deep: bool = False, track: bool = False, cache: RecallCache | None = None,
) -> dict[str, Any]:
    """The ``k`` memories most like ``query``; ``deep`` searches the cold tier too,
    ``track`` counts the hits as accessed. Activity for the idle trigger. ``cache``: the
    server's (the same hits, without reading an unchanged profile's vectors again)."""
    from reverie.recall.search import recall as recall_memories

    name = _allowed(store, who, profile, must_exist=False)
    text = _query(store, query)
    most = _count(k, "k", 1, store.settings.api_max_k)
    deep, track = _flag(deep, "deep"), _flag(track, "track")
    try:
        # Whether the profile exists is read in recall's own snapshot: a call reads
        # one small row before the vectors, not the list of every profile.
        hits = recall_memories(store, name, text, most, deep, track, cache=cache)
    except NotFoundError:
        if _new(store, who, name):
            return {"profile": name, "hits": []}
        raise
    _recalled(store, name, most, len(hits))
    # ``text`` is what to read: a summary's members that matched, whole and dated (its
    # ids in ``matched``), else the memory's content; ``get`` gives a summary whole.
    return {"profile": name, "hits": [
        {"score": h.score, **memory_data(h.memory), "text": h.text,
         "matched": [o.id for o in h.members] if h.excerpted else []} for h in hits]}


def get(store: Store, who: Principal, profile: object, memory_id: object) -> dict[str, Any]:
    """One memory of the profile by Reverie id or the caller's own id, in any tier; or
    its tombstone."""
    from reverie.models.repositories.memories import get as get_memory

    name = _allowed(store, who, profile)
    ident = _an_id(memory_id, "id")
    with store.reading_all() as s:
        found = get_memory(s, ident, name)
    if isinstance(found, Tombstone):
        return {"tombstone": True, **_plain(found.model_dump())}
    return memory_data(found)


def session_init(
    store: Store, who: Principal, profile: object, query: object = None, k: object = 10,
    budget_chars: object = None, cache: RecallCache | None = None,
) -> dict[str, Any]:
    """What an agent reads at the start of a session: the Core Memory blocks (in
    priority order, the user's profile first), then the best memories the blocks given
    do not already quote (recalled for ``query``, else the most important hot ones),
    while they fit ``budget_chars`` (default ``REVERIE_API_CONTEXT_CHARS``). A profile the
    token covers but the store does not hold yet starts empty."""
    from reverie.models.block_text import SEPARATOR, fact_text
    from reverie.models.repositories.blocks import blocks as blocks_of
    from reverie.recall.search import recall as recall_memories

    name = _allowed(store, who, profile, must_exist=False)
    budget = store.settings.api_context_chars if budget_chars is None else _count(
        budget_chars, "budget_chars", 0, 200_000)
    most = _count(k, "k", 1, store.settings.api_max_k)
    text = None if query is None else _query(store, query)
    if _new(store, who, name):
        # A new agent's first session: nothing to recall yet (its first store makes it).
        return {"profile": name, "budget_chars": budget, "used_chars": 0, "blocks": [],
                "memories": []}
    with store.reading(name) as tx:
        blocks = [b for b in blocks_of(tx) if b.content]
    left = budget
    chosen_blocks = []
    # What the blocks given already say, by id and by words (a fact stored twice is
    # quoted by one id): not said again below.
    quoted: set[str] = set()
    said: set[str] = set()
    for b in blocks:
        if len(b.content) <= left:
            chosen_blocks.append({"block_type": b.block_type, "content": b.content,
                                  "version": b.version})
            left -= len(b.content)
            quoted.update(b.source_ids or [])
            said.update(f.casefold() for f in b.content.split(SEPARATOR))
    if text is not None:
        found: list[tuple[float | None, MemoryView | Memory, str]] = [
            (h.score, h.memory, h.text) for h in
            recall_memories(store, name, text,
                            min(SESSION_INIT_POOL, max(most, 1) + len(quoted)), cache=cache)]
        _recalled(store, name, most, len(found))
    else:
        with store.reading(name) as tx:
            rows = tx.session.execute(
                select(Memory).where(col(Memory.profile_id) == name)
                .where(col(Memory.tier) == Tier.HOT.value)
                .order_by(col(Memory.importance).desc(), col(Memory.created_at).desc(),
                          col(Memory.id))
                .limit(SESSION_INIT_POOL)
            ).scalars().all()
        found = [(None, m, m.content) for m in rows]
    memories: list[dict[str, Any]] = []
    for score, m, shown in found:
        # A recalled summary shows its members that matched (``text``), not itself.
        if len(memories) >= most:
            break
        if len(shown) > left or m.id in quoted or fact_text(shown).casefold() in said:
            continue
        left -= len(shown)
        memories.append({"score": score, "id": m.id, "external_id": m.external_id,
                         "kind": m.kind, "content": shown,
                         "created_at": _plain(m.created_at)})
    return {"profile": name, "budget_chars": budget, "used_chars": budget - left,
            "blocks": chosen_blocks, "memories": memories}


def session_end(
    store: Store, who: Principal, profile: object, session: object = None
) -> dict[str, Any]:
    """``reverie session-end``: count the session; its events (full consolidation
    follows through the deployment triggers) queued and sent."""
    from reverie.runner.event_delivery import end_session

    name = _allowed(store, who, profile, must_exist=False)
    session_id = None if session is None else _an_id(session, "session")
    if _new(store, who, name):
        # A first session that stored nothing: nothing to count or consolidate yet.
        return {"profile": name, "session": session_id, "session_count": 0,
                "consolidation_follows": False, "already_ended": False,
                "why_not": "the profile holds no memory yet: nothing to consolidate"}
    ended = end_session(store, name, session_id)
    follows = ended.sent and _operator_api()
    answer = {"profile": name, "session": session_id, "session_count": ended.count,
              "consolidation_follows": follows, "already_ended": not ended.counted}
    if not follows:
        answer["why_not"] = _why_no_run(ended.counted)
    return answer


def _why_no_run(counted: bool) -> str:
    """Why a session end starts no consolidation: an agent trial saw only ``false``."""
    if not counted:
        return "this session had ended already: its end was counted then"
    if not _operator_api():
        return ("no Prefect API with Reverie's deployments is configured (PREFECT_API_URL): "
                "nothing acts on the session's end; call consolidate to run one now")
    # Counted, with the operator's API: only events turned off keep a run from following.
    return "events are off (REVERIE_EMIT_EVENTS=false): no trigger sees the end"


def undo(store: Store, who: Principal, profile: object, ident: object) -> dict[str, Any]:
    """``reverie undo``: a consolidation (by its id or its summary's) undone."""
    from reverie.models.repositories.summaries import undo as undo_consolidation

    name = _allowed(store, who, profile)
    target = _an_id(ident, "id")
    with store.writing(name) as tx:
        result = undo_consolidation(tx, target, utcnow())
    return _plain(asdict(result))


def consolidation_status(
    store: Store, who: Principal, profile: object, limit: object = 20
) -> dict[str, Any]:
    """AutoMem's status for the profile: the last run of each flow, the scheduled runs
    that cover it, and the history. A profile the token names that the store does not
    hold yet has none."""
    from reverie.deployments.status import (
        Status,
        active_runs,
        collect,
        covers,
        failed_runs,
        scheduled_runs,
    )

    name = _allowed(store, who, profile, must_exist=False)
    most = _count(limit, "limit", 1, 1000)
    # A new profile has no history, but Prefect may have runs that covered it (every
    # profile's): read as for any profile, so `failed` is a list whenever it can be.
    status = Status(next_runs=scheduled_runs(),
                    failed=failed_runs(lambda selector: covers(selector, name))) \
        if _new(store, who, name) else collect(store, name, most)

    # Not ``status.as_json``: ``reverie status --json`` writes its times as the store
    # keeps them, without an offset.
    def run(r: RunRecord) -> dict[str, Any]:
        return _plain(r.model_dump(exclude={"id"}))

    last = {flow: run(r) for flow, r in status.last.get(name, {}).items()}
    going = active_runs()
    return {
        "profile": name,
        "last": {flow: r.get("finished_at") for flow, r in last.items()},
        "last_runs": last,
        # Only the runs that cover this profile, each said of it alone: a schedule's
        # selector may name profiles the token does not cover.
        "next": None if status.next_runs is None else {
            flow: [{"at": _utc_iso(when), "profile": None if selector is None else name}
                   for when, selector in runs if covers(selector, name)]
            for flow, runs in status.next_runs.items()
        },
        # Runs started and not over that cover it: one a consolidate call just made is
        # here, Pending until its process starts it, then Running.
        "running": None if going is None else {
            flow: [{"run_id": run_id, "state": state,
                    "since": None if since is None else _utc_iso(since),
                    "profile": None if selector is None else name,
                    "ui_url": ui_link(run_id)}
                   for run_id, state, since, selector in runs if covers(selector, name)]
            for flow, runs in going.items()
        },
        # Runs that ended Failed or Crashed, the last ended first, that covered it;
        # without their messages, which may name other profiles (``reverie status``,
        # the operator's, has them).
        "failed": None if status.failed is None else [
            {"run_id": r.run_id, "flow": r.flow, "state": r.state,
             "ended": None if r.ended is None else _utc_iso(r.ended),
             "profile": None if r.profile is None else name, "ui_url": ui_link(r.run_id)}
            for r in status.failed if covers(r.profile, name)],
        "history": [run(r) for r in status.history],
    }


def consolidate(
    store: Store, who: Principal, profile: object, mode: object = "full",
    dry_run: bool = False, scope: object = None, min_age_days: object = None,
    use_llm: object = None, session: object = None,
) -> dict[str, Any]:
    """Consolidate the profile. A dry run answers with the preview (the same selection
    code as the real run; nothing written). A real run becomes a Prefect flow run:
    through the flow's deployment when a Prefect API has it, else started here on the
    local server; its id, state and UI link come back at once."""
    name = _allowed(store, who, profile)
    if isinstance(mode, StrEnum):
        mode = mode.value
    if not isinstance(mode, str) or mode not in MODES.keys() | ALIASES.keys():
        raise field_error("mode", f"must be one of {', '.join(MODES)}")
    flow = MODES[ALIASES.get(mode, mode)]
    dry_run = _flag(dry_run, "dry_run")
    # An old name still runs, and says so: an agent's log shows what to change.
    note = {"deprecated": f"mode {mode!r} is the old name of {ALIASES[mode]!r}, accepted "
                          "until the next release"} if mode in ALIASES else {}
    extra: dict[str, Any] = {}
    if flow == "cold-notes":
        if scope is not None and scope not in ("all", "session"):
            raise field_error("scope", "must be 'all' or 'session'")
        session_id = None if session is None else _an_id(session, "session")
        chosen_scope = scope or ("session" if session_id else "all")
        if chosen_scope == "session" and session_id is None:
            raise field_error("session", "scope 'session' needs the session's id")
        if min_age_days is not None and (
            isinstance(min_age_days, bool) or not isinstance(min_age_days, int | float)
            or not math.isfinite(min_age_days) or not 0 <= min_age_days <= 36_500
        ):
            raise field_error("min_age_days", "must be a number of days from 0 to 36500")
        extra = {"scope": chosen_scope, "session_id": session_id,
                 "min_age_days": None if min_age_days is None else float(min_age_days),
                 # Cold consolidation's sweep archives only: deletion needs an operator.
                 "auto_approve_deletion": False}
    else:
        for field, value in (("scope", scope), ("min_age_days", min_age_days),
                             ("session", session)):
            if value is not None:
                raise field_error(field, "applies to mode 'cold-notes' only")
    if use_llm is not None and not isinstance(use_llm, bool):
        raise field_error("use_llm", "must be true or false")
    config = None
    if use_llm is not None:
        from reverie.models.settings import get_settings

        config = get_settings().consolidation_config().model_copy(
            update={"summarizer": "llm" if use_llm else "rules"})
    if dry_run:
        from reverie.deployments.cli import run_flow

        _local_api_if_none()
        report = run_flow(flow, name, None, True, config, **extra)
        preview = _plain(asdict(report))
        if report.as_of:  # the report's text of the store's naive UTC
            preview["as_of"] = _utc_iso(datetime.fromisoformat(report.as_of))
        return {"profile": name, "mode": mode, "dry_run": True, **note,
                "changed": report.changed(), "preview": preview}
    parameters: dict[str, Any] = {"profile": name, "as_of": None, "dry_run": False, **extra}
    if config is not None:
        parameters["config"] = config.model_dump(mode="json")
    return {"profile": name, "mode": mode, "dry_run": False, **note,
            **launch(flow, parameters)}


# --- starting runs ------------------------------------------------------------------------

_LOCAL_API_LOCK = threading.Lock()


def _operator_api() -> bool:
    """Whether a Prefect API is configured, not the local server this process pointed
    itself at for a run (which has no deployments)."""
    from reverie.runner.event_delivery import api_configured, pointed_by_us

    return api_configured() and not pointed_by_us()


def launch(flow: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """Start a run of ``flow`` that goes on without the caller: the deployment's when
    the configured Prefect API has it, else a flow run made on the API (the local
    server when none is configured) and executed by a process started here."""
    from prefect.exceptions import ObjectNotFound

    from reverie.flows.catalog import DEPLOYMENTS

    if _operator_api() and flow in DEPLOYMENTS:
        from prefect.deployments import run_deployment

        try:
            run = run_deployment(DEPLOYMENTS[flow], parameters=dict(parameters), timeout=0,
                                 as_subflow=False, tags=["reverie-api"])
        except ObjectNotFound:
            log.info("no deployment %s on the Prefect API: running %s here",
                     DEPLOYMENTS[flow], flow)
        else:
            return _run_data(run, DEPLOYMENTS[flow])
    return _run_here(flow, parameters)


def _run_here(flow: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    from prefect.client.orchestration import get_client
    from prefect.states import Pending

    from reverie.flows.catalog import FLOWS

    _local_api_if_none()
    flow_obj = FLOWS[flow]
    entrypoint = FLOWS._where[flow]  # noqa: SLF001 - "module:attribute", as Prefect loads it
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(
            flow_obj, name=f"{flow_obj.name} | {parameters['profile']} | api",
            parameters=dict(parameters), tags=["reverie-api"], state=Pending())
    env = {**os.environ, "PREFECT__FLOW_RUN_ID": str(run.id)}
    # Its own session: the run goes on if the server that started it stops.
    subprocess.Popen(
        [sys.executable, "-m", "prefect.flow_engine", entrypoint],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=env, start_new_session=True, close_fds=True,
    )
    return _run_data(run, None)


def _local_api_if_none() -> None:
    """Point this process at the shared local Prefect server when no API is configured,
    even where commands are set to use a temporary one each: a server process lives
    long, a real run outlives the call that made it, and a temporary server started
    from a request's thread would outlive the process."""
    from reverie.deployments.local_server import use_local_api
    from reverie.models.settings import environment

    if _operator_api():
        return
    # Each time, not once: the shared server may have stopped since the last call, and
    # is then started again.
    with _LOCAL_API_LOCK, environment("REVERIE_LOCAL_SERVER", "shared"):
        use_local_api()


def start_local_api() -> threading.Thread | None:
    """For a server process (``reverie api``, ``reverie mcp``) starting with no
    Prefect API configured: bring the shared local Prefect server up in the background,
    so that the first real consolidate, which needs it, waits only for what is left of
    its start (8 s or more), not all of it. Not with ``REVERIE_LOCAL_SERVER=temporary``:
    there local commands use no shared server, and one started by a process nobody
    consolidates through would outlive it (a consolidate still starts one when asked)."""
    from reverie.models.settings import get_settings

    if get_settings().local_server == "temporary":
        return None

    def start() -> None:
        # Whether an operator's API is configured is asked here too: Prefect may need
        # importing to say, and startup does not wait for it.
        try:
            _local_api_if_none()
        except Exception as exc:  # noqa: BLE001 - a consolidate tries again, and says why
            log.warning("the local Prefect server did not start: %s: %s",
                        type(exc).__name__, " ".join(str(exc).split()))

    thread = threading.Thread(target=start, name="reverie-local-api", daemon=True)
    thread.start()
    return thread


def _run_data(run: Any, deployment: str | None) -> dict[str, Any]:
    return {"run_id": str(run.id), "state": run.state.name if run.state else None,
            "deployment": deployment, "ui_url": ui_link(str(run.id))}


def ui_link(run_id: str) -> str | None:
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    base = settings.ui_url or (settings.api.url or "").removesuffix("/api") or None
    return f"{base.rstrip('/')}/runs/flow-run/{run_id}" if base else None


__all__: Sequence[str] = (
    "consolidate", "consolidation_status", "get", "launch", "recall", "session_end",
    "session_init", "start_local_api", "store_memories", "undo",
)
