"""``reverie mcp``: Reverie's operations as MCP tools, on the official MCP Python SDK.

Over stdio (a local agent spawns ``reverie mcp``) the token is the process's
``REVERIE_MCP_TOKEN``, set in the client's configuration of the server; over streamable
HTTP (``reverie mcp --transport http``, or the ``/mcp`` endpoint of ``reverie api``)
every request carries ``Authorization: Bearer <token>``. Either way each tool call is
checked against the profiles the token covers (``deployments.auth``). Tools are thin:
each calls the function of ``deployments.operations`` of its name; a refusal is a tool
error whose text starts with the HTTP status the API would give.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from pydantic import Field, ValidationError

from reverie.deployments import operations as ops
from reverie.deployments.api_errors import body_of, status_of
from reverie.deployments.auth import Principal, Tokens
from reverie.deployments.operations import Bool, Int, ModeName, Number
from reverie.models.errors import ReverieError
from reverie.models.settings import get_settings
from reverie.models.store import Store

if TYPE_CHECKING:
    from reverie.engines.ranking import RecallCache

Profile = Annotated[str, Field(description="The memory owner (one profile).",
                               min_length=1, max_length=ops.MAX_PROFILE_CHARS)]
# The arguments as an agent reads them. Bounds are in the words, checked by
# ``operations`` (some are settings), so that a refusal names its field as the API's do.
Query = Annotated[str, Field(description="What to look for, in words.")]
AnId = Annotated[str, Field(description="A Reverie id (m-..., c-...) or your own id.")]
DecisionId = Annotated[str, Field(description=(
    "A consolidation's id (c-..., as consolidation_status and `reverie consolidations` "
    "give it), or the id of the summary it wrote (m-...)."))]
Session = Annotated[str | None, Field(description="Your id of the session.")]
Budget = Annotated[Int | None, Field(
    description="Characters of blocks and memories together, 0 to 200000 (default "
                "REVERIE_API_CONTEXT_CHARS).")]
Memories = Annotated[list[dict[str, Any]], Field(
    description="Records as `reverie ingest` takes them: content (required); id (your "
                "own, to update or get it later), kind (semantic, episodic, preference, "
                "decision, ...), importance and confidence (0 to 1), entity, created_at "
                "(ISO-8601), session_id, protected, metadata: optional. At most "
                "REVERIE_API_MAX_BATCH (500) a call.")]
START = "What the session is about, in words; unset: the most important memories."
K = "How many memories, 1 to REVERIE_API_MAX_K (100 unless configured)."
DEEP = "Search the cold tier too (originals a summary replaced)."
TRACK = "Count the hits as accessed (importance and promotion use it)."
MODE = ("full or lightweight (SuperLocalMemory's runs), sleep (linksee's cold-notes), or "
        "one flow by its short name.")
DRY_RUN = "The preview only: nothing written."
SCOPE = "Mode sleep: all notes, or one session's (with session)."
MIN_AGE = "Mode sleep: only notes at least this many days old, 0 to 36500."
USE_LLM = "Word summaries with the configured LLM (true) or rules (false); unset: config."
LIMIT = "How many runs of the history, 1 to 1000."


class _Server(MCPServer):
    """The SDK's server, with arguments an agent got wrong refused as every other
    refusal is: ``422 {"error", "field", "message"}``, the field named, its value not
    echoed (the SDK's text quotes it), and an argument no tool has refused as the HTTP
    API refuses it, not ignored."""

    _arguments: dict[str, frozenset[str]] | None = None

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Any = None) -> Any:
        if self._arguments is None:
            self._arguments = {t.name: frozenset(t.input_schema.get("properties", {}))
                               for t in await self.list_tools()}
        known = self._arguments.get(name)
        if known is not None and (unknown := sorted(set(arguments) - known)):
            raise ToolError(f"Error executing tool {name}: "
                            + _refusal(unknown[0], "not an argument of this tool"))
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc, UnexpectedToolError) or not isinstance(
                    exc.__cause__, ValidationError):
                raise
            first = exc.__cause__.errors()[0]
            field = ".".join(str(part) for part in first["loc"])
            raise ToolError(f"Error executing tool {name}: "
                            + _refusal(field, first["msg"])) from exc.__cause__


def _refusal(field: str, message: str) -> str:
    return f"422 {json.dumps({'error': 'InputError', 'field': field, 'message': message})}"


def build_mcp(open_store: Callable[[], Store], tokens: Tokens, stdio: bool = False,
              cache: RecallCache | None = None) -> Any:
    """The MCP server: its tools call ``operations`` on ``open_store()`` for the caller the
    request's bearer token (or, with ``stdio``, ``REVERIE_MCP_TOKEN``) names. ``cache``:
    the recall cache it shares with the HTTP API it is mounted in; else its own."""
    from reverie.engines.ranking import RecallCache

    if cache is None:
        cache = RecallCache(get_settings().api_recall_cache_mib * 1024 * 1024)
    server = _Server(
        "reverie", log_level="WARNING",
        instructions="Long-term memory. Call session_init first, store what is worth "
                     "keeping, recall when you need it, session_end at the end.",
    )

    def caller(ctx: Context) -> Principal:
        if stdio:
            token = get_settings().mcp_token
            return tokens.authenticate(token.get_secret_value() if token else None)
        headers = ctx.headers or {}
        return tokens.authenticate_header(headers.get("authorization"))

    def call(ctx: Context, operation: Callable[..., dict[str, Any]], *args: Any,
             **kwargs: Any) -> dict[str, Any]:
        try:
            return operation(open_store(), caller(ctx), *args, **kwargs)
        except ReverieError as exc:
            raise ToolError(f"{status_of(exc)} {json.dumps(body_of(exc))}") from None

    def tool(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        said = ops.DESCRIPTIONS[fn.__name__]
        if fn.__name__ == "store":
            said += " " + ops.what_blocks_take()
        return server.tool(description=said)(fn)

    @tool
    def session_init(profile: Profile, ctx: Context,
                     query: Annotated[str | None, Field(description=START)] = None,
                     k: Annotated[Int, Field(description=K)] = 10,
                     budget_chars: Budget = None) -> dict[str, Any]:
        return call(ctx, ops.session_init, profile, query, k, budget_chars, cache=cache)

    @tool
    def store(profile: Profile, memories: Memories, ctx: Context) -> dict[str, Any]:
        return call(ctx, ops.store_memories, profile, memories)

    @tool
    def recall(profile: Profile, query: Query, ctx: Context,
               k: Annotated[Int, Field(description=K)] = 5,
               deep: Annotated[Bool, Field(description=DEEP)] = False,
               track: Annotated[Bool, Field(description=TRACK)] = False) -> dict[str, Any]:
        return call(ctx, ops.recall, profile, query, k, deep, track, cache=cache)

    @tool
    def get(profile: Profile, id: AnId, ctx: Context) -> dict[str, Any]:  # noqa: A002
        return call(ctx, ops.get, profile, id)

    @tool
    def consolidate(
        profile: Profile, ctx: Context,
        mode: Annotated[ModeName, Field(description=MODE)] = "full",
        dry_run: Annotated[Bool, Field(description=DRY_RUN)] = False,
        scope: Annotated[Literal["all", "session"] | None, Field(description=SCOPE)] = None,
        min_age_days: Annotated[Number | None, Field(description=MIN_AGE)] = None,
        use_llm: Annotated[Bool | None, Field(description=USE_LLM)] = None,
        session: Session = None,
    ) -> dict[str, Any]:
        return call(ctx, ops.consolidate, profile, mode, dry_run, scope, min_age_days,
                    use_llm, session)

    @tool
    def consolidation_status(profile: Profile, ctx: Context,
                             limit: Annotated[Int, Field(description=LIMIT)] = 20,
                             ) -> dict[str, Any]:
        return call(ctx, ops.consolidation_status, profile, limit)

    @tool
    def session_end(profile: Profile, ctx: Context, session: Session = None) -> dict[str, Any]:
        return call(ctx, ops.session_end, profile, session)

    @tool
    def undo(profile: Profile, id: DecisionId, ctx: Context) -> dict[str, Any]:  # noqa: A002
        return call(ctx, ops.undo, profile, id)

    return server


def run_stdio(tokens: Tokens) -> None:
    server = build_mcp(Store, tokens, stdio=True)
    # A local agent's session ends in session_end, whose full run needs the Prefect
    # server: started now, it is up by then. Its output goes to its own log, never to
    # the stdout the protocol speaks on.
    ops.start_local_api()
    server.run("stdio")
