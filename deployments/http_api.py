"""``reverie api``: Reverie's operations as JSON endpoints (FastAPI, described at
``/openapi.json``), with the MCP streamable HTTP endpoint at ``/mcp`` on the same
server. It listens on 127.0.0.1 unless told otherwise.

Every endpoint but ``/health`` needs ``Authorization: Bearer <token>``
(``deployments.auth``). Refusals are 4xx with a JSON body ``{"error", "message",
"field"}`` naming the field at fault; bodies over ``REVERIE_API_MAX_BODY_BYTES`` are a
413. The server logs no request bodies, queries or memory content: uvicorn's access log
is off, and errors are logged by class only.
"""


import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal

import orjson
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Message, Receive, Scope, Send

from reverie.deployments import operations as ops
from reverie.deployments.api_errors import body_of, status_of
from reverie.deployments.auth import Principal, Tokens, UnauthorizedError
from reverie.deployments.operations import Bool, Int, ModeName, Number
from reverie.models.errors import ReverieError
from reverie.models.settings import get_settings
from reverie.models.store import Store

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
WORKER_HOST_ENV = "_REVERIE_API_WORKER_HOST"  # serve's host, for its worker processes
# The error names of Starlette's own refusals, as ``api_errors.body_of`` names Reverie's.
HTTP_ERRORS = {400: "InputError", 404: "NotFoundError", 405: "MethodNotAllowedError"}
GIL_SWITCH_SECONDS = 0.001  # the server process's; Python's default is 0.005 (see serve)

Name = Annotated[str, Field(min_length=1, max_length=ops.MAX_PROFILE_CHARS)]
AnId = Annotated[str, Field(min_length=1, max_length=ops.MAX_ID_CHARS)]
Text = Annotated[str, Field(min_length=1, max_length=32_000)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


_K = "how many memories, at most REVERIE_API_MAX_K (100 unless configured)"


class SessionInit(_Body):
    query: Text | None = None
    k: Annotated[Int, Field(ge=1, le=10_000, description=_K)] = 10
    budget_chars: Annotated[Int, Field(ge=0, le=200_000)] | None = None


class StoreBody(_Body):
    memories: Annotated[list[dict[str, Any]], Field(min_length=1, max_length=10_000)] = Field(
        description="Memory records as `reverie ingest` takes them (one JSONL line each).")


class RecallBody(_Body):
    query: Text
    k: Annotated[Int, Field(ge=1, le=10_000, description=_K)] = 5
    deep: Bool = False
    track: Bool = False


class ConsolidateBody(_Body):
    mode: ModeName = "full"
    dry_run: Bool = False
    scope: Literal["all", "session"] | None = None
    min_age_days: Annotated[Number, Field(ge=0, le=36_500)] | None = None
    use_llm: Bool | None = None
    session: AnId | None = None


class AutoMemConsolidate(ConsolidateBody):
    """AutoMem's ``POST /consolidate``: the profile in the body; ``task`` names a mode."""

    profile: Name
    task: ModeName | None = None


class SessionEnd(_Body):
    session: AnId | None = None


class UndoBody(_Body):
    id: AnId


class _Guard:
    """In front of everything: the bearer check of the MCP endpoint (its tools check
    the profile), and a 413 for a body over ``limit`` bytes, by its Content-Length or
    as it streams. ``app`` is the FastAPI application (for its OpenAPI description)."""

    def __init__(self, app: FastAPI, tokens: Tokens, limit: Callable[[], int]) -> None:
        self.app = app
        self.tokens = tokens
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"].rstrip("/") == "/mcp":
            header = dict(scope.get("headers", [])).get(b"authorization", b"")
            try:
                self.tokens.authenticate_header(header.decode("latin-1"))
            except UnauthorizedError as exc:
                await _refuse(send, 401, body_of(exc), [(b"www-authenticate", b"Bearer")])
                return
        limit = self.limit()
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > limit
                except ValueError:
                    too_big = False
                if too_big:
                    await _too_large(send, limit)
                    return
        seen = 0
        over = False

        async def counted() -> Message:
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    over = True
                    raise _TooLarge
            return message

        refused = False

        async def sending(message: Message) -> None:
            # FastAPI turns any error while reading a body into its own 400: a body
            # sent in chunks, with no Content-Length, is still a 413.
            nonlocal refused
            if not over:
                await send(message)
            elif message["type"] == "http.response.start" and not refused:
                refused = True
                await _too_large(send, limit)

        try:
            await self.app(scope, counted, sending)
        except _TooLarge:
            if not refused:
                await _too_large(send, limit)


class _TooLarge(Exception):
    pass


async def _too_large(send: Send, limit: int) -> None:
    await _refuse(send, 413, {"error": "PayloadTooLargeError", "field": "body",
                              "message": f"the body is over {limit} bytes "
                                         "(REVERIE_API_MAX_BODY_BYTES)"})


async def _refuse(send: Send, status: int, data: dict[str, Any],
                  headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = JSONResponse(data).body
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def _json(data: dict[str, Any]) -> Response:
    """``data`` (plain: ``ops`` gives str, numbers, bools, None, lists, dicts) as JSON by
    orjson: FastAPI's own way, ``jsonable_encoder`` then ``json.dumps``, walked every
    value of a recall's answer in Python (0.2 ms, on the thread every request waits for).
    The same values either way: both write floats as their shortest round-trip form."""
    return Response(orjson.dumps(data), media_type="application/json")


def build_app(tokens: Tokens, open_store: Callable[[], Store] = Store,
              host: str = DEFAULT_HOST, stateless: bool = False) -> _Guard:
    """``stateless``: the MCP endpoint keeps no session between requests, so that any
    of several server processes can answer any request of a client."""
    from reverie.deployments.mcp_server import build_mcp
    from reverie.engines.ranking import RecallCache

    # One per server process: every request's recall shares what earlier ones read.
    cache = RecallCache(get_settings().api_recall_cache_mib * 1024 * 1024)
    mcp = build_mcp(open_store, tokens, cache=cache)
    mcp_app = mcp.streamable_http_app(streamable_http_path="/mcp", host=host,
                                      stateless_http=stateless)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # In each server process: each points itself at the local server it makes runs on.
        ops.start_local_api()
        async with mcp.session_manager.run():
            yield

    app = FastAPI(title="Reverie", version="1", lifespan=lifespan,
                  description="Long-term memory for AI agents: session start, store, "
                              "recall, get, consolidate, status, session end, undo. "
                              "Every call needs `Authorization: Bearer <token>`.")

    # A coroutine: FastAPI runs a plain function dependency in its threadpool, one more
    # hop to a thread and back per call for a few microseconds of hashing.
    async def caller(request: Request) -> Principal:
        return tokens.authenticate_header(request.headers.get("authorization"))

    Who = Annotated[Principal, Depends(caller)]

    @app.exception_handler(ReverieError)
    async def reverie_error(_: Request, exc: ReverieError) -> JSONResponse:
        status = status_of(exc)
        log.info("refused with %d: %s", status, type(exc).__name__)
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, UnauthorizedError) else None
        return JSONResponse(body_of(exc), status_code=status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Starlette's and FastAPI's own refusals (no such path, method not allowed, a
        body that is not UTF-8 or not readable) in Reverie's shape."""
        body_error = exc.status_code == 400
        return JSONResponse(
            {"error": HTTP_ERRORS.get(exc.status_code, "HTTPError"),
             "field": "body" if body_error else None,
             "message": "the body could not be read as JSON (UTF-8, numbers of at most "
                        "4,300 digits)" if body_error else str(exc.detail)},
            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":  # its loc is a character position
            return JSONResponse({"error": "InputError", "field": "body",
                                 "message": f"the body is not valid JSON (at character "
                                            f"{first.get('loc', ('', '?'))[-1]})"},
                                status_code=422)
        loc = list(first.get("loc", ()))
        if loc == ["body"]:  # the body as a whole, not one of its fields
            if first.get("type") == "missing":
                return JSONResponse({"error": "InputError", "field": "body",
                                     "message": "a JSON body is required"}, status_code=422)
            if not _json_type(request.headers.get("content-type")):
                # FastAPI reads a body as JSON only when it is said to be: the body may
                # be fine, its content type is not ("curl -d" sends a form's).
                return JSONResponse({"error": "InputError", "field": "content-type",
                                     "message": "send the body as JSON, with "
                                                "Content-Type: application/json"},
                                    status_code=415)
            field = "body"  # JSON, but not an object ("[]")
        else:
            if loc and loc[0] in ("query", "path", "header", "body"):  # where, not which
                loc = loc[1:]
            field = ".".join(str(p) for p in loc)
        # The messages only, never the input they quote.
        return JSONResponse({"error": "InputError", "field": field or None,
                             "message": str(first.get("msg", "invalid request")),
                             "errors": [{"field": ".".join(map(str, e.get("loc", ()))),
                                         "message": str(e.get("msg", ""))} for e in errors]},
                            status_code=422)

    @app.get("/health", tags=["server"])
    def health() -> dict[str, str]:
        return {"status": "ok"}

    base = "/v1/profiles/{profile}"
    said = ops.DESCRIPTIONS

    @app.post(f"{base}/session-init", tags=["agent"], response_model=dict[str, Any],
              description=said["session_init"])
    def session_init(profile: Name, who: Who, body: SessionInit | None = None) -> Response:
        body = body or SessionInit()  # every field has its default: a body is optional
        return _json(ops.session_init(open_store(), who, profile, body.query, body.k,
                                      body.budget_chars, cache=cache))

    @app.post(f"{base}/memories", tags=["agent"],
              description=f'{said["store"]} {ops.what_blocks_take()}')
    def store(profile: Name, body: StoreBody, who: Who) -> dict[str, Any]:
        return ops.store_memories(open_store(), who, profile, body.memories)

    @app.post(f"{base}/recall", tags=["agent"], response_model=dict[str, Any],
              description=said["recall"])
    def recall(profile: Name, body: RecallBody, who: Who) -> Response:
        return _json(ops.recall(open_store(), who, profile, body.query, body.k, body.deep,
                                body.track, cache=cache))

    # ``:path``: an id may hold "/" (any text up to 256 characters is one), which the
    # server has decoded from %2F before routing.
    @app.get(f"{base}/memories/{{memory_id:path}}", tags=["agent"], description=said["get"])
    def get(profile: Name, memory_id: AnId, who: Who) -> dict[str, Any]:
        return ops.get(open_store(), who, profile, memory_id)

    @app.post(f"{base}/consolidate", tags=["consolidation"], description=said["consolidate"])
    def consolidate(profile: Name, who: Who,
                    body: ConsolidateBody | None = None) -> dict[str, Any]:
        body = body or ConsolidateBody()  # every field has its default: a body is optional
        return ops.consolidate(open_store(), who, profile, body.mode, body.dry_run, body.scope,
                               body.min_age_days, body.use_llm, body.session)

    @app.get(f"{base}/consolidate/status", tags=["consolidation"],
             description=said["consolidation_status"])
    def status(profile: Name, who: Who,
               limit: Annotated[int, Field(ge=1, le=1000)] = 20) -> dict[str, Any]:
        return ops.consolidation_status(open_store(), who, profile, limit)

    @app.post(f"{base}/session-end", tags=["agent"], description=said["session_end"])
    def session_end(profile: Name, who: Who, body: SessionEnd | None = None) -> dict[str, Any]:
        body = body or SessionEnd()
        return ops.session_end(open_store(), who, profile, body.session)

    @app.post(f"{base}/undo", tags=["consolidation"], description=said["undo"])
    def undo(profile: Name, body: UndoBody, who: Who) -> dict[str, Any]:
        return ops.undo(open_store(), who, profile, body.id)

    # AutoMem's endpoints, the profile in the body or the query.
    @app.post("/consolidate", tags=["consolidation"], description=said["consolidate"])
    def automem_consolidate(body: AutoMemConsolidate, who: Who) -> dict[str, Any]:
        return ops.consolidate(open_store(), who, body.profile, body.task or body.mode,
                               body.dry_run, body.scope, body.min_age_days, body.use_llm,
                               body.session)

    @app.get("/consolidate/status", tags=["consolidation"],
             description=said["consolidation_status"])
    def automem_status(profile: Name, who: Who,
                       limit: Annotated[int, Field(ge=1, le=1000)] = 20) -> dict[str, Any]:
        return ops.consolidation_status(open_store(), who, profile, limit)

    # The MCP endpoint: the SDK's route, behind the same bearer check.
    for route in mcp_app.routes:
        app.router.routes.append(route)

    def described() -> dict[str, Any]:
        if app.openapi_schema is None:
            settings = get_settings()
            app.openapi_schema = with_limits(with_refusals(get_openapi(
                title=app.title, version=app.version, description=app.description,
                routes=app.routes)), settings.api_max_k, settings.api_max_batch)
        return app.openapi_schema

    app.openapi = described  # type: ignore[method-assign]  # FastAPI's way to amend it

    limit_store = open_store()
    return _Guard(app, tokens, lambda: limit_store.settings.api_max_body_bytes)


# What every endpoint behind the token may answer besides its own result.
REFUSALS = {
    "400": "The body could not be read (not UTF-8, a number too long)",
    "401": "No bearer token, or not a valid one",
    "403": "The token does not cover this profile (the same whether it exists or not)",
    "404": "No such profile (admin token) or memory",
    "413": "The body is over REVERIE_API_MAX_BODY_BYTES",
    "415": "The body is not sent as JSON (Content-Type: application/json)",
    "422": "A field is invalid: `field` names it",
    "503": "The store is busy or down: try again",
}


def with_refusals(schema: dict[str, Any]) -> dict[str, Any]:
    """FastAPI's description with the bearer scheme every endpoint but ``/health``
    needs (so that ``/docs`` sends it: its Authorize button) and the refusals each may
    give, in their one shape."""
    components = schema.setdefault("components", {})
    components.setdefault("securitySchemes", {})["bearer"] = {
        "type": "http", "scheme": "bearer",
        "description": "A token of REVERIE_API_TOKENS (its profiles) or "
                       "REVERIE_API_ADMIN_TOKEN (every profile)"}
    components.setdefault("schemas", {})["Refusal"] = {
        "type": "object", "required": ["error", "message"],
        "properties": {
            "error": {"type": "string", "description": "the kind of refusal"},
            "field": {"type": ["string", "null"], "description": "the field at fault"},
            "message": {"type": "string"},
        }}
    refusal = {"application/json": {"schema": {"$ref": "#/components/schemas/Refusal"}}}
    for path, item in schema.get("paths", {}).items():
        if path == "/health":
            continue
        for operation in item.values():
            operation["security"] = [{"bearer": []}]
            answers = operation.setdefault("responses", {})
            for status, what in REFUSALS.items():
                answers[status] = {"description": what, "content": refusal}
    return schema


def with_limits(schema: dict[str, Any], max_k: int, max_batch: int) -> dict[str, Any]:
    """The description with the limits this server applies (``REVERIE_API_MAX_K``,
    ``REVERIE_API_MAX_BATCH``), not the models' outer bounds, so that a client or a
    fuzzer reading it sends what is taken."""
    bodies = schema.get("components", {}).get("schemas", {})
    for name in ("SessionInit", "RecallBody"):
        if name in bodies:
            bodies[name]["properties"]["k"]["maximum"] = max_k
    if "StoreBody" in bodies:
        bodies["StoreBody"]["properties"]["memories"]["maxItems"] = max_batch
    return schema


def _json_type(content_type: str | None) -> bool:
    """Whether a request's Content-Type says JSON (``application/json``, or a
    ``+json`` type), as FastAPI reads it."""
    kind = (content_type or "").split(";")[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def serve(tokens: Tokens, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          workers: int = 1) -> None:
    """Serve on ``host``:``port``; ``workers`` above 1: that many server processes on
    the one socket (uvicorn's), each loading the tokens, the model and its caches
    itself (``worker_app``), with a stateless MCP endpoint."""
    import uvicorn

    # httptools: uvicorn's C parser; h11's pure-Python one held the GIL for every
    # request's parsing and response framing.
    options: dict[str, Any] = {"host": host, "port": port, "access_log": False,
                               "log_level": "warning", "lifespan": "on",
                               "http": "httptools"}
    if workers > 1:
        # The processes are spawned, not forked: each imports its own OpenVINO and
        # threads; this one only hands them the socket and restarts one that dies.
        # They inherit the environment: the host is how the MCP endpoint tells its
        # allowed Host headers (DNS rebinding protection on loopback).
        os.environ[WORKER_HOST_ENV] = host
        uvicorn.run(f"{__name__}:worker_app", factory=True, workers=workers, **options)
        return
    app = build_app(tokens, host=host)
    _switch_often()
    uvicorn.run(app, **options)


def worker_app() -> _Guard:
    """One of ``serve``'s worker processes: its application, tokens read from the
    settings as ``reverie api`` reads them."""
    from reverie.deployments.auth import load_tokens

    _switch_often()
    return build_app(load_tokens(get_settings()),
                     host=os.environ.get(WORKER_HOST_ENV, DEFAULT_HOST), stateless=True)


def _switch_often() -> None:
    # A thread back from a short C call (a SQLite statement, the event loop's wake-up)
    # waits for the GIL until the holder lets go, by default after up to 5 ms; with 8
    # clients a recall makes dozens of such hand-overs. 1 ms: p95 at 8 clients 9-18%
    # lower in three interleaved A/B runs, CPU per call the same (benchmarks-history).
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
