"""Prefect's event ordering for automations, made to survive a restart of the server.

Prefect's triggers service handles a flow run's state event only once it has handled the
state event before it (each names the one it follows), and remembers what it handled in
server memory. After a restart it has forgotten them: the Crashed event of a run that
was Running before the restart waited for a predecessor that would never come again,
and the failure alert fired only when Prefect gave up waiting, 15 minutes later
(``PRECEDING_EVENT_LOOKBACK``). This ordering also counts as handled a predecessor from
before this server process started (a state entered, or an event received, earlier):
the server of the time handled it, or nothing ever will. ``reverie serve`` selects it through
``PREFECT_SERVER_EVENTS_CAUSAL_ORDERING``; the server imports it, nothing else does.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any
from uuid import UUID

from prefect.server.events.ordering.memory import CausalOrdering as _InMemory
from prefect.server.events.schemas.events import Event

MODULE = "reverie.deployments.causal_ordering"


class CausalOrdering(_InMemory):
    # Prefect's class keeps one instance per scope in class-level maps: our own.
    _instances: dict[str, Any] = {}
    _locks: dict[str, asyncio.Lock] = {}

    def __init__(self, scope: str) -> None:
        if not getattr(self, "_initialized", False):
            from prefect.types._datetime import now

            self._started: datetime = now("UTC")
        super().__init__(scope)

    async def event_has_been_seen(self, event: UUID | Event) -> bool:
        if await super().event_has_been_seen(event):
            return True
        return await self._received_before_start(event.id if isinstance(event, Event) else event)

    async def _received_before_start(self, event_id: UUID) -> bool:
        import sqlalchemy as sa
        from prefect.server.database import provide_database_interface

        db = provide_database_interface()
        # A state event's id is its state's: the state row is committed with the
        # transition, while a server killed with SIGKILL loses the events it had not
        # yet written (they are written in batches).
        queries = [
            sa.select(db.FlowRunState.id).where(db.FlowRunState.id == event_id,
                                                db.FlowRunState.timestamp < self._started),
            sa.select(db.TaskRunState.id).where(db.TaskRunState.id == event_id,
                                                db.TaskRunState.timestamp < self._started),
            sa.select(db.Event.id).where(db.Event.id == event_id,
                                         db.Event.received < self._started),
        ]
        async with db.session_context() as session:
            for query in queries:
                if await session.scalar(query) is not None:
                    return True
        return False
