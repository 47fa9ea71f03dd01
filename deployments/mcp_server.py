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
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from reverie.deployments import operations as ops
from reverie.deployments.api_errors import body_of, status_of
from reverie.deployments.auth import Principal, Tokens
from reverie.deployments.operations import Mode
from reverie.models.errors import ReverieError
from reverie.models.settings import get_settings
from reverie.models.store import Store

if TYPE_CHECKING:
    from reverie.engines.ranking import RecallCache

FULL = Mode("full")  # the default mode, made once

Profile = Annotated[str, Field(description="The memory owner (one profile).",
                               min_length=1, max_length=ops.MAX_PROFILE_CHARS)]


def build_mcp(open_store: Callable[[], Store], tokens: Tokens, stdio: bool = False,
              cache: RecallCache | None = None) -> Any:
    """The MCP server: its tools call ``operations`` on ``open_store()`` for the caller the
    request's bearer token (or, with ``stdio``, ``REVERIE_MCP_TOKEN``) names. ``cache``:
    the recall cache it shares with the HTTP API it is mounted in; else its own."""
    from reverie.engines.ranking import RecallCache

    if cache is None:
        cache = RecallCache(get_settings().api_recall_cache_mib * 1024 * 1024)
    server = MCPServer(
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

    @server.tool()
    def session_init(profile: Profile, ctx: Context, query: str | None = None,
                     k: int = 10, budget_chars: int | None = None) -> dict[str, Any]:
        """Start of a session: the Core Memory blocks, then the best memories (recalled
        for the query if given) within a character budget."""
        return call(ctx, ops.session_init, profile, query, k, budget_chars, cache=cache)

    @server.tool()
    def store(profile: Profile, memories: list[dict[str, Any]], ctx: Context) -> dict[str, Any]:
        """Store memories: records as `reverie ingest` takes them (content required;
        kind, importance, entity, layer, id, ... optional). Counts toward the
        50-store trigger and the idle timer."""
        return call(ctx, ops.store_memories, profile, memories)

    @server.tool()
    def recall(profile: Profile, query: str, ctx: Context, k: int = 5, deep: bool = False,
               track: bool = False) -> dict[str, Any]:
        """The k memories most like the query; deep searches the cold tier too; track
        counts the hits as accessed."""
        return call(ctx, ops.recall, profile, query, k, deep, track, cache=cache)

    @server.tool()
    def get(profile: Profile, id: str, ctx: Context) -> dict[str, Any]:  # noqa: A002
        """One memory by Reverie id or your own id, in any tier (or its tombstone)."""
        return call(ctx, ops.get, profile, id)

    @server.tool()
    def consolidate(
        profile: Profile, ctx: Context,
        mode: Mode = FULL,
        dry_run: bool = False, scope: Literal["all", "session"] | None = None,
        min_age_days: float | None = None, use_llm: bool | None = None,
        session: str | None = None,
    ) -> dict[str, Any]:
        """Consolidate the profile. dry_run: the preview, at once. Otherwise a Prefect
        flow run is started and its id, state and UI link returned at once. mode cold
        (linksee's sleep) takes scope, session and min_age_days."""
        return call(ctx, ops.consolidate, profile, mode, dry_run, scope, min_age_days,
                    use_llm, session)

    @server.tool()
    def consolidation_status(profile: Profile, ctx: Context, limit: int = 20) -> dict[str, Any]:
        """When each flow last ran for the profile, and the run history."""
        return call(ctx, ops.consolidation_status, profile, limit)

    @server.tool()
    def session_end(profile: Profile, ctx: Context, session: str | None = None) -> dict[str, Any]:
        """End of a session: full consolidation follows (through Prefect's triggers)."""
        return call(ctx, ops.session_end, profile, session)

    @server.tool()
    def undo(profile: Profile, id: str, ctx: Context) -> dict[str, Any]:  # noqa: A002
        """Undo a consolidation by its id (c-...) or its summary's id."""
        return call(ctx, ops.undo, profile, id)

    return server


def run_stdio(tokens: Tokens) -> None:
    server = build_mcp(Store, tokens, stdio=True)
    server.run("stdio")
