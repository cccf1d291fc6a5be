"""The remediator's side of drain_node and undrain_node: the store's `node_drains`, the user's
scheduler hook, and the NodeDrained/NodeUndrained facts on the bus.

The hook gets one JSON body per drain or undrain:

    {"node_id": "gpu-node-07", "drained": true, "reason": "...", "incident_id": "...", "action_id": "..."}

with `Authorization: Bearer <token>` when GPUMEDIC_REMEDIATOR_HOOK_TOKEN_FILE names a file. The
file is checked when the service starts and read for each call (a rotated token is picked up);
the token is never logged, and errors name the hook's host only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import httpx
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpumedic_events import ActionRequested, Event, NodeDrained, NodeUndrained
from gpumedic_store import views
from gpumedic_webhook import post_with_retries
from remediator import repository

HOOK_TIMEOUT_S = 10.0


class StoreScheduler:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        publish: Callable[[Event, str], Awaitable[None]],
        hook_url: str | None,
        hook_token: Callable[[], str | None],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._sessions = sessions
        self._publish = publish
        self._hook_url = hook_url
        self._hook_token = hook_token
        self._now = clock

    async def holders(self, node_id: str) -> list[str]:
        async with self._sessions() as session:
            return [row.incident_id for row in await views.drains(session=session, node_id=node_id)]

    async def hold(self, request: ActionRequested, holder: str) -> None:
        async with self._sessions() as session:
            await repository.hold_drained(session=session, request=request, holder=holder, now=self._now())
            await session.commit()

    async def release(self, request: ActionRequested, holder: str) -> None:
        async with self._sessions() as session:
            await repository.release_drained(session=session, node_id=request.node_id, holder=holder)
            await session.commit()

    async def tell(self, request: ActionRequested, *, drained: bool) -> None:
        if not self._hook_url:
            return
        body = {
            "node_id": request.node_id,
            "drained": drained,
            "reason": request.reason,
            "incident_id": str(request.incident_id),
            "action_id": str(request.action_id),
        }
        async with httpx.AsyncClient(timeout=HOOK_TIMEOUT_S) as client:
            await post_with_retries(client, self._hook_url, body, token=self._hook_token())

    async def publish(self, request: ActionRequested, *, drained: bool) -> None:
        kind = NodeDrained if drained else NodeUndrained
        event = kind(
            source="remediator",
            node_id=request.node_id,
            incident_id=request.incident_id,
            action_id=request.action_id,
            reason=request.reason[:1000],
        )
        # One fact per action: a re-published one is the same message to the stream.
        await self._publish(event, f"{request.action_id}:{'drained' if drained else 'undrained'}")
