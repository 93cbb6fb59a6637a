"""``/sessions/<id>/lab/...`` over WebSocket: a kernel's (or a terminal's) socket, relayed.

::

    browser ──handshake──> LabConsumer.connect: signed in? lab_target? (else refused)
                              ──o──> agent ──> Jupyter's WebSocket ──o (subprotocol)──> accept
    browser ──message──> receive ──w (pieces)──> agent          (every PING_EVERY_S: p)
    browser <──message── pump <──w── agent;   either side closes: c

The route is the path JupyterLab opens with ``base_url=/sessions/<id>/lab/``
(``ws://host/sessions/<id>/lab/api/kernels/<kernel>/channels``); ``portal.origin``'s
same-origin check runs before this consumer, and, when labs have hosts of their own,
``portal.lab_origin``'s guard (the socket must come to its session's host, whose cookie
signs it in).  A portal process that restarts drops its
sockets; JupyterLab reconnects to another, and the agent closes the orphaned ones once
they go unmentioned for ``WS_SILENT_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.http import Http404
from django.utils import timezone
from redis.exceptions import RedisError

from jobs.sessions import note_activity
from portal.lab_origin import socket_lab_user
from portal.lab_streams import Exchange, LabTarget, lab_target
from workers.lab_protocol import (
    WS_PING_EVERY_S,
    LabFrameError,
    MessageJoiner,
    encode_headers,
    message_entries,
)

log = logging.getLogger(__name__)

OPEN_WAIT_S = 30.0
ACTIVITY_EVERY_S = 30.0
"""A socket's messages count as the session's activity at most this often."""


class LabConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]
    """One browser WebSocket to a session's Jupyter."""

    async def connect(self) -> None:
        """Authorize, have the agent open Jupyter's socket, then accept with its subprotocol."""
        self.exchange: Exchange | None = None
        self.pump: asyncio.Task[None] | None = None
        self.noted = time.monotonic()
        kwargs = self.scope["url_route"]["kwargs"]
        if settings.LAB_HOST_TEMPLATE:  # on its own host, by its own cookie (lab_origin)
            user = await database_sync_to_async(socket_lab_user)(self.scope, int(kwargs["job_id"]))
        else:
            user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        try:
            target: LabTarget = await database_sync_to_async(lab_target)(
                user, int(kwargs["job_id"])
            )
        except Http404:
            await self.close(code=4404)
            return
        path = self.scope["path"]
        query = self.scope.get("query_string", b"").decode("latin-1")
        if query:
            path = f"{path}?{query}"
        protocols = list(self.scope.get("subprotocols") or [])
        headers = [("Sec-WebSocket-Protocol", ", ".join(protocols))] if protocols else []
        self.exchange = Exchange(target)
        try:
            await self.exchange.send({"t": "o", "p": path, "hd": encode_headers(headers)})
            entries = await self.exchange.receive(OPEN_WAIT_S)
        except (RedisError, OSError, LabFrameError) as exc:
            log.warning("lab %s: socket not opened: %s", target.job_id, exc)
            entries = []
        if not entries or entries[0].type != "o":
            await self.exchange.close()
            self.exchange = None
            await self.close(code=4502)
            return
        await self.accept(subprotocol=entries[0].subprotocol or None)
        self.pump = asyncio.create_task(self.pump_out(entries[1:]))

    async def pump_out(self, early: list[Any]) -> None:
        """Jupyter's messages to the browser until either side closes; a ping on the way."""
        assert self.exchange is not None
        joiner = MessageJoiner()
        pinged = time.monotonic()
        pending = list(early)
        try:
            while True:
                for entry in pending:
                    if entry.type == "w":
                        whole = joiner.add(entry)
                        if whole is None:
                            continue
                        if entry.kind == "t":
                            await self.send(text_data=whole.decode("utf-8", errors="replace"))
                        else:
                            await self.send(bytes_data=whole)
                    elif entry.type in ("c", "f"):
                        await self.close(code=entry.code if entry.type == "c" else 1011)
                        return
                if time.monotonic() - pinged >= WS_PING_EVERY_S:
                    pinged = time.monotonic()
                    await self.exchange.send({"t": "p"})
                pending = await self.exchange.receive(1.0)
        except (RedisError, OSError, LabFrameError) as exc:
            log.warning("lab socket %s failed: %s", self.exchange.id, exc)
            await self.close(code=1011)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """A browser's message to Jupyter, in pieces; activity noted now and then."""
        if self.exchange is None:
            return
        if bytes_data is not None:
            data, kind = bytes_data, "b"
        else:
            data, kind = (text_data or "").encode(), "t"
        try:
            pieces = message_entries(data, kind)
        except ValueError:
            await self.close(code=1009)
            return
        for piece in pieces:
            await self.exchange.send(piece)
        if time.monotonic() - self.noted >= ACTIVITY_EVERY_S:
            self.noted = time.monotonic()
            await database_sync_to_async(note_activity)(self.exchange.target.job_id, timezone.now())

    async def disconnect(self, code: int) -> None:
        """The browser left: tell the agent, forget the exchange."""
        if self.pump is not None and not self.pump.done():
            self.pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.pump
        if self.exchange is not None:
            with contextlib.suppress(RedisError, OSError):
                await self.exchange.send({"t": "c", "cc": "1000"})
            await self.exchange.close()
            self.exchange = None
