"""The shell's WebSocket, ``/ws/jobs/<job>/shell/``: a thin pump between a client and Redis.

::

    client ──open──> check_open (404 / 409 / 400 / 429) ──> do_open ──on commit──> OpenShell
           <─opened─                                                     to the node's agent
    client ──bytes / resize / eof / close──> ShellStreams.send ──> agent:<node>:shell:<id>:in
    client <──bytes── ShellStreams.receive <── agent:<node>:shell:<id>:out
    client <──exit {code}── (the agent's ``x``) ──> do_close (audit) ──> socket closed (1000)

Authentication: ``Authorization: Token <secret>`` (a write token) as for the API, else
the browser session.  A refusal is one JSON text frame ``{"type": "error", "status",
"field", "message"}``, then close code ``4000 + status`` when the socket cannot go on
(4401 no or bad token, 4403 read-only token, 4404 no such job *or another tenant's*,
4409 not running, 4400 a bad open message, 4429 too many shells).  A bad frame after
the open (too large, bad JSON, unknown type) is refused the same way and forwards
nothing, and the shell goes on.  Idle shells (``SHELL_IDLE_SECONDS`` with no byte either
way) are closed; so is a shell whose client leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.utils import timezone
from redis.exceptions import RedisError

from shells.messages import Message, MessageError, parse_message
from shells.services import ShellPlan, ShellRefused, check_open, do_close, do_open
from shells.streams import ShellStreams
from tenancy.authentication import token_from_header
from tenancy.models import ApiToken, TokenScope
from tenancy.token_services import TokenRefused

log = logging.getLogger(__name__)

OPEN_WAIT_S = 30.0
"""How long the agent has to answer an open (with output, a refusal or an exit)."""
KILL_WAIT_S = 10.0
"""How long a shell that was told to close has to report its exit status."""
MAX_TEXT_CHARS = 64 * 1024


def authenticate(scope: dict[str, Any]) -> Any:
    """The user of a shell socket: its token's (a write token), else its session's."""
    headers = dict(scope.get("headers") or [])
    header = headers.get(b"authorization", b"").decode("latin-1")
    try:
        token: ApiToken | None = token_from_header(header)
    except TokenRefused as refused:
        raise ShellRefused(401, "token", str(refused)) from None
    if token is not None:
        if token.scope == TokenScope.READ:
            raise ShellRefused(403, "token", "this token is read-only")
        return token.user
    user = scope.get("user")
    if user is not None and user.is_authenticated:
        return user
    raise ShellRefused(401, "token", "sign in, or send 'Authorization: Token <secret>'")


def _open(user: Any, job_id: int, message: Message) -> tuple[ShellPlan, str]:
    plan = check_open(
        user=user,
        job_id=job_id,
        worker=message.worker,
        argv=message.argv,
        term=message.term,
        rows=message.rows,
        cols=message.cols,
    )
    return plan, do_open(user=user, plan=plan, now=timezone.now()).id


class ShellConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]
    """One client's shell: opened by its first message, pumped until it exits or is closed."""

    async def connect(self) -> None:
        """Accept (so that a refusal can say why), then authenticate."""
        self.user: Any = None
        self.shell_id = ""
        self.streams: ShellStreams | None = None
        self.pump: asyncio.Task[None] | None = None
        self.bytes_in = self.bytes_out = 0
        self.finished = False
        self.last_activity = time.monotonic()
        await self.accept()
        try:
            self.user = await database_sync_to_async(authenticate)(self.scope)
        except ShellRefused as refused:
            await self.refuse(refused, close=True)

    async def refuse(self, refused: ShellRefused, *, close: bool) -> None:
        """Say why (one JSON frame); close with ``4000 + status`` when nothing can follow."""
        await self.send(text_data=json.dumps(refused.as_dict()))
        if close:
            await self.close(code=4000 + refused.status)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The open message first; then input bytes and control messages."""
        if self.user is None or self.finished:
            return
        try:
            if bytes_data is not None:
                await self.input(bytes_data)
            else:
                await self.control(parse_message(text_data or "", MAX_TEXT_CHARS))
        except MessageError as bad:
            # Before the open, nothing can follow a bad message; after it, the shell goes on.
            await self.refuse(ShellRefused(400, bad.field, bad.message), close=not self.shell_id)
        except ShellRefused as refused:
            await self.refuse(refused, close=not self.shell_id)

    async def input(self, data: bytes) -> None:
        """Bytes typed into the shell, bounded per frame."""
        if not self.shell_id or self.streams is None:
            raise MessageError("message", "send the open message first")
        limit = settings.SHELL_MAX_FRAME_BYTES
        if len(data) > limit:
            raise MessageError("data", f"a binary frame may hold at most {limit} bytes")
        self.bytes_in += len(data)
        self.last_activity = time.monotonic()
        await self.streams.send({"d": data})

    async def control(self, message: Message) -> None:
        """Open the shell, or pass a resize, end of input or close on to it."""
        if message.type == "open":
            if self.shell_id:
                raise MessageError("type", "this socket has opened its shell already")
            await self.open(message)
            return
        if self.streams is None:
            raise MessageError("type", "send the open message first")
        if message.type == "resize":
            await self.streams.send({"r": f"{message.rows} {message.cols}"})
        elif message.type == "eof":
            await self.streams.send({"e": "1"})
        else:
            await self.streams.send({"k": "1"})

    async def open(self, message: Message) -> None:
        """Check and record the shell, have the agent open it, start pumping its output."""
        job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        plan, self.shell_id = await database_sync_to_async(_open)(self.user, job_id, message)
        self.streams = ShellStreams(plan.node, self.shell_id)
        self.pump = asyncio.create_task(self.pump_output())
        await self.send(
            text_data=json.dumps(
                {
                    "type": "opened",
                    "shell": self.shell_id,
                    "job": job_id,
                    "worker": plan.command.worker_id,
                    "node": plan.node,
                }
            )
        )

    async def pump_output(self) -> None:
        """The shell's output to the client until its exit status (or a deadline) arrives;
        a stream that fails ends the shell, with the reason."""
        try:
            await self._pump_until_exit()
        except (RedisError, OSError) as exc:
            log.warning("shell %s: its stream failed: %s", self.shell_id, exc)
            await self.finish(None, "the shell's stream failed")

    async def _pump_until_exit(self) -> None:
        assert self.streams is not None
        deadline: float | None = time.monotonic() + OPEN_WAIT_S
        error = ""
        while True:
            await self.streams.renew(self.bytes_in, self.bytes_out)
            for _id, fields in await self.streams.receive(block_ms=1000):
                deadline = None
                if b"d" in fields:
                    self.bytes_out += len(fields[b"d"])
                    self.last_activity = time.monotonic()
                    await self.send(bytes_data=fields[b"d"])
                error = fields.get(b"err", b"").decode(errors="replace") or error
                if b"x" in fields:
                    await self.finish(int(fields[b"x"]), error or "exited")
                    return
            now = time.monotonic()
            if deadline is None and now - self.last_activity > settings.SHELL_IDLE_SECONDS:
                await self.streams.send({"k": "1"})
                error, deadline = "idle", now + KILL_WAIT_S
            elif deadline is not None and now > deadline:
                # An agent that opens it later reads this first, and ends it at once.
                await self.streams.send({"k": "1"})
                await self.finish(None, error or "the agent did not answer")
                return

    async def finish(self, code: int | None, reason: str) -> None:
        """Tell the client how the shell ended, record it, close the socket."""
        self.finished = True
        body: dict[str, Any] = {"type": "exit", "code": code}
        if reason not in ("exited", ""):
            body["reason"] = reason
        await self.send(text_data=json.dumps(body))
        await self.record_close(code, reason)
        await self.close(code=1000)

    async def record_close(self, code: int | None, reason: str) -> None:
        """``do_close`` once, from the async side."""
        await database_sync_to_async(do_close)(
            shell_id=self.shell_id,
            now=timezone.now(),
            reason=reason,
            exit_code=code,
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
        )

    async def disconnect(self, code: int) -> None:
        """A client that leaves closes its shell."""
        if self.pump is not None and not self.pump.done():
            self.pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.pump
        if self.shell_id and not self.finished and self.streams is not None:
            self.finished = True
            with contextlib.suppress(Exception):
                await self.streams.send({"k": "1"})
            await self.record_close(None, "the client left")
        if self.streams is not None:
            await self.streams.close()
