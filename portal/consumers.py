"""The live-update WebSocket: one socket per page, subscribed to the topics it shows.

A page opens ``/ws/live/`` (session auth) and sends::

    {"type": "subscribe", "topic": "tenant", "id": 3}     a tenant's jobs (members, admins)
    {"type": "subscribe", "topic": "job", "id": 42}       one job (who may see the job)
    {"type": "subscribe", "topic": "cluster"}              the whole cluster (admins only)

and receives ``{"type": "subscribed", ...}`` or ``{"type": "subscribe.refused", ...}``,
then the events that the services broadcast after commit (``job.created``,
``job.updated``, ``tenant.counts``, ...), coalesced per group (``utilities.realtime``)::

    {"type": "batch", "topic": "tenant", "id": 3, "seq": 17, "events": [{...}, {...}]}

``seq`` counts the group's batches (one Redis counter per group); a page that
sees one missing reloads its snapshot, which carries the ``seq`` it reflects.  Whether a user may join a group is decided by
``group_for`` with the same ``restrict(user)`` scoping as every page; another
tenant's topic is refused exactly like a topic that does not exist.

Access is not decided once.  The socket also joins its user's own group
(``tenancy.live_access``) and re-checks its session and every subscription::

    access.recheck  (membership or user changed; and every LIVE_RECHECK_SECONDS)
        session gone, expired, logged out elsewhere, password changed, user inactive
            ──> close (4401)
        a topic the user may no longer see ──> leave its group, send subscription.revoked
    session.ended   (logout of this socket's session) ──> close (4401)

Batches already queued for a group the socket has just left are dropped too
(``batch_allowed``): leaving a group does not recall what was sent before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.utils.crypto import constant_time_compare

from jobs.models import Job
from tenancy.live_access import session_digest, user_group
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
    if user is None or not user.is_authenticated or not user.is_active:
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


def session_user(session_key: str | None, user_id: int) -> Any | None:
    """The user, fresh from the database, if ``session_key`` still signs them in; else None.

    The same rules as a page request: the session exists and has not expired, names
    this user, carries the hash of their current password, and the user is active.
    """
    if not session_key:
        return None
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    data = store.load()  # {} when the session is gone or expired
    if str(data.get(SESSION_KEY, "")) != str(user_id) or BACKEND_SESSION_KEY not in data:
        return None
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        return None
    if not constant_time_compare(str(data.get(HASH_SESSION_KEY, "")), user.get_session_auth_hash()):
        return None
    return user


@dataclass(frozen=True)
class Verdict:
    """The outcome of re-checking a socket: its fresh user (None: close) and groups it keeps."""

    user: Any | None
    allowed: frozenset[str]


def recheck(session_key: str | None, user_id: int, topics: dict[str, tuple[Any, Any]]) -> Verdict:
    """Re-decide a socket's access: ``topics`` maps each joined group to its (topic, id)."""
    user = session_user(session_key, user_id)
    if user is None:
        return Verdict(user=None, allowed=frozenset())
    allowed = frozenset(
        group for group, (topic, ident) in topics.items() if group_for(user, topic, ident) == group
    )
    return Verdict(user=user, allowed=allowed)


def event_allowed(event: Any, joined: set[str] | frozenset[str]) -> bool:
    """Whether a broadcast ``event`` concerns a group the socket is still in."""
    if CLUSTER_GROUP in joined:
        return True
    if not isinstance(event, dict):
        return False
    tenant, job = event.get("tenant"), event.get("job")
    return (isinstance(tenant, int) and tenant_group(tenant) in joined) or (
        isinstance(job, int) and job_group(job) in joined
    )


def batch_allowed(group: Any, topics: dict[str, tuple[Any, Any]]) -> bool:
    """Whether a coalesced batch for ``group`` may go to a socket subscribed to ``topics``."""
    return isinstance(group, str) and group in topics


RELAYS = frozenset({"portal.batch", "portal.event", "session.ended"})
"""Channel messages whose handlers only pass something on (or close): no database."""


class LiveConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    """Relays after-commit events of the groups a page has subscribed to, while it may."""

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Hand ``message`` to its handler; a relayed batch skips Channels' database cleanup.

        Channels closes stale database connections before every handler, through
        the one thread that runs sync code: a batch for 1,000 sockets was 1,000
        hops through that thread, most of the cost of delivering it.  Relays touch
        no database; the handlers that do go through ``database_sync_to_async``,
        which does the same cleanup in its own thread.
        """
        if message.get("type") in RELAYS:
            await getattr(self, get_handler_name(message))(message)
            return
        await super().dispatch(message)

    async def connect(self) -> None:
        """Accept only authenticated sessions; others are closed before the handshake."""
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.topics: dict[str, tuple[Any, Any]] = {}
        session = self.scope.get("session")
        self.session_key: str | None = getattr(session, "session_key", None)
        self.personal_group = user_group(user.pk)
        self.closing = False
        await self.channel_layer.group_add(self.personal_group, self.channel_name)
        await self.accept()
        self.rechecker = asyncio.ensure_future(self._recheck_periodically())

    async def disconnect(self, code: int) -> None:
        """Leave every group this socket joined and stop its re-check timer."""
        rechecker = getattr(self, "rechecker", None)
        if rechecker is not None:
            rechecker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await rechecker
        for group in [*getattr(self, "topics", {}), getattr(self, "personal_group", None)]:
            if group is not None:
                await self.channel_layer.group_discard(group, self.channel_name)

    async def _recheck_periodically(self) -> None:
        # Through the socket's own channel, so a re-check never interleaves with a
        # subscribe being handled: the consumer handles one message at a time.
        while True:
            await asyncio.sleep(float(settings.LIVE_RECHECK_SECONDS))
            await self.channel_layer.send(self.channel_name, {"type": "access.recheck"})

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Handle subscribe / unsubscribe / ping requests from the page."""
        if self.closing:
            return
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
            if group is not None and group in self.topics:
                del self.topics[group]
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
        if len(self.topics) >= MAX_SUBSCRIPTIONS:
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
        self.topics[group] = (topic, ident)
        await self.send_json({"type": "subscribed", "topic": topic, "id": ident})

    async def portal_event(self, message: dict[str, Any]) -> None:
        """A single event sent straight to a group: pass it on if the socket may still see it."""
        if not self.closing and event_allowed(message.get("event"), set(self.topics)):
            await self.send_json(message["event"])

    async def portal_batch(self, message: dict[str, Any]) -> None:
        """A coalesced batch from ``utilities.realtime``: one frame, named by topic and seq."""
        group = message.get("group")
        if self.closing or not isinstance(group, str) or not batch_allowed(group, self.topics):
            return
        topic, ident = self.topics[group]
        await self.send_json(
            {
                "type": "batch",
                "topic": topic,
                "id": ident,
                "seq": message.get("seq"),
                "events": message.get("events", []),
            }
        )

    async def access_recheck(self, message: dict[str, Any]) -> None:
        """The user's access may have changed: re-check the session and every subscription."""
        if self.closing:
            return
        verdict = await database_sync_to_async(recheck)(
            self.session_key, self.scope["user"].pk, dict(self.topics)
        )
        if verdict.user is None:
            await self._end()
            return
        self.scope["user"] = verdict.user
        for group in [g for g in self.topics if g not in verdict.allowed]:
            topic, ident = self.topics.pop(group)
            await self.channel_layer.group_discard(group, self.channel_name)
            await self.send_json({"type": "subscription.revoked", "topic": topic, "id": ident})

    async def session_ended(self, message: dict[str, Any]) -> None:
        """A logout: close if it ended this socket's session."""
        ended = str(message.get("session", ""))
        if ended and ended == session_digest(self.session_key):
            await self._end()

    async def _end(self) -> None:
        self.closing = True
        for group in list(self.topics):
            await self.channel_layer.group_discard(group, self.channel_name)
        self.topics.clear()
        await self.close(code=CLOSE_UNAUTHENTICATED)
