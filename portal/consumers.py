"""The live-update WebSocket: one socket per page, subscribed to the topics it shows.

A page opens ``/ws/live/`` (session auth) and sends::

    {"type": "subscribe", "topic": "tenant", "id": 3}     a tenant's jobs (members, admins)
    {"type": "subscribe", "topic": "job", "id": 42}       one job (who may see the job)
    {"type": "subscribe", "topic": "cluster"}              the whole cluster (admins only)

and receives ``{"type": "subscribed", ...}`` or ``{"type": "subscribe.refused", ...}``,
then the events that the services broadcast after commit (``job.created``,
``job.updated``, ...), unchanged.  Whether a user may join a group is decided by
``group_for`` with the same ``restrict(user)`` scoping as every page; another
tenant's topic is refused exactly like a topic that does not exist.
"""

from __future__ import annotations

import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from jobs.models import Job
from tenancy.models import Tenant
from utilities.realtime import CLUSTER_GROUP, job_group, tenant_group

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
MAX_SUBSCRIPTIONS = 32
TOPICS = ("tenant", "job", "cluster")


def group_for(user: Any, topic: Any, ident: Any) -> str | None:
    """The group ``user`` may join for ``topic``/``ident``, or None if refused.

    Refusal does not say whether the object exists (as a 404 would not).
    """
    if user is None or not user.is_authenticated:
        return None
    if topic == "cluster":
        return CLUSTER_GROUP if user.is_staff else None
    if isinstance(ident, bool) or not isinstance(ident, int) or ident < 1:
        return None
    if topic == "tenant":
        return (
            tenant_group(ident) if Tenant.objects.restrict(user).filter(pk=ident).exists() else None
        )
    if topic == "job":
        return job_group(ident) if Job.objects.restrict(user).filter(pk=ident).exists() else None
    return None


class LiveConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    """Relays after-commit events of the groups a page has subscribed to."""

    async def connect(self) -> None:
        """Accept only authenticated sessions; others are closed before the handshake."""
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.joined: set[str] = set()
        await self.accept()

    async def disconnect(self, code: int) -> None:
        """Leave every group this socket joined."""
        for group in getattr(self, "joined", set()):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Handle subscribe / unsubscribe / ping requests from the page."""
        if not isinstance(content, dict):
            await self.send_json({"type": "error", "message": "expected a JSON object"})
            return
        kind = content.get("type")
        topic, ident = content.get("topic"), content.get("id")
        if kind == "ping":
            await self.send_json({"type": "pong", "t": content.get("t")})
        elif kind == "subscribe":
            await self._subscribe(topic, ident)
        elif kind == "unsubscribe":
            group = await database_sync_to_async(group_for)(self.scope["user"], topic, ident)
            if group is not None and group in self.joined:
                self.joined.discard(group)
                await self.channel_layer.group_discard(group, self.channel_name)
            await self.send_json({"type": "unsubscribed", "topic": topic, "id": ident})
        else:
            await self.send_json({"type": "error", "message": f"unknown request type {kind!r}"})

    async def _subscribe(self, topic: Any, ident: Any) -> None:
        if topic not in TOPICS:
            await self.send_json(
                {
                    "type": "subscribe.refused",
                    "topic": topic,
                    "id": ident,
                    "message": "unknown topic",
                }
            )
            return
        if len(self.joined) >= MAX_SUBSCRIPTIONS:
            await self.send_json(
                {"type": "subscribe.refused", "topic": topic, "id": ident, "message": "too many"}
            )
            return
        group = await database_sync_to_async(group_for)(self.scope["user"], topic, ident)
        if group is None:
            await self.send_json(
                {"type": "subscribe.refused", "topic": topic, "id": ident, "message": "not found"}
            )
            return
        await self.channel_layer.group_add(group, self.channel_name)
        self.joined.add(group)
        await self.send_json({"type": "subscribed", "topic": topic, "id": ident})

    async def portal_event(self, message: dict[str, Any]) -> None:
        """A broadcast from ``utilities.realtime``: pass the event on as it is."""
        await self.send_json(message["event"])
