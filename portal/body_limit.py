"""Request bodies are counted as they arrive and refused (413) past their limit, before
anything is stored or anyone is authenticated: chunked bodies included.

::

    client ── headers ──> Content-Length over the limit? ── yes ──> 413, nothing read or stored
                │ no (or chunked: no length given)
                ▼
            body bytes ──> counted as they arrive ── past the limit ──> 413, what was kept
                │                                                       is dropped at once
                ▼
            the application (Django reads the body, then authenticates)

The limit of a request (:func:`limit_for`) is ``MAX_REQUEST_BODY_BYTES``, except for the
few views that take code archives (``UPLOAD_URL_NAMES``: the code page, the job form and
``POST /api/v1/code/``), which may send ``MAX_UPLOAD_BODY_BYTES``: the archive
(``CODE_MAX_BYTES``) and whatever else a form carries.  Those views keep their own,
exact checks of the archive (``bundles``); this only bounds what anyone can make the
server hold before a view runs.

Two places enforce it, because each server reads the body at a different time:

- **daphne** (the server ``runstack``, the image and compose run) reads the whole body
  into a buffer or a temporary file *before* it calls the application, Content-Length
  or chunked alike: an application-level check comes too late.  :func:`install_in_daphne`
  (called by ``portal.asgi``, which daphne imports before it starts serving) makes
  daphne build :class:`LimitedWebRequest`, which counts in Twisted's own callbacks:
  a declared length over the limit is refused with the headers, a chunked body when its
  count passes the limit.  A chunked body is held in memory up to Twisted's own
  threshold (``SPOOL_MEMORY_BYTES``), so a small one, refused or not, never touches
  the disk; a larger one spills to an unnamed temporary file, never past the limit,
  closed the moment the body is refused.
- :class:`BodyLimitMiddleware`, around the ASGI application, for servers that stream the
  body to the application (uvicorn, hypercorn, the tests' ASGI clients): it refuses a
  declared length before the application runs, and counts ``http.request`` messages
  before Django's handler spools them to its own temporary file; past the limit the
  application sees the client gone (``http.disconnect``) and the client gets the 413.

A refusal answers ``{"message": "The request body is over the limit of N bytes.",
"errors": {}}`` (the API's error shape) with ``Connection: close``; daphne then reads
and drops at most ``DRAIN_BYTES`` more for ``DRAIN_SECONDS`` (so that a client still
sending sees the answer rather than a reset) and closes the connection.
"""

from __future__ import annotations

import functools
import io
import json
import tempfile
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import IO, Any
from urllib.parse import unquote

from django.conf import settings
from django.urls import NoReverseMatch, reverse

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]  # Django's handler types its arguments its own way

UPLOAD_URL_NAMES = ("code-list", "code", "job-new")
"""The views that take a code archive (POST): the code API, the code page, the job form."""
UPLOAD_METHODS = frozenset({"POST"})
SPOOL_MEMORY_BYTES = 100_000
"""A chunked body is kept in memory up to this (Twisted's own threshold for a known length)."""
DRAIN_BYTES = 1024 * 1024
"""Bytes of a refused body read and dropped after the 413, so the client can read it."""
DRAIN_SECONDS = 5.0
"""How long a refused request's connection stays open for that, at most."""
STATUS = 413
REASON = b"Content Too Large"


@functools.cache
def _upload_paths(urlconf: str) -> frozenset[str]:
    paths = set()
    for name in UPLOAD_URL_NAMES:
        try:
            paths.add(reverse(name, urlconf=urlconf))
        except NoReverseMatch:  # a URL configuration without that view: nothing to allow
            continue
    return frozenset(paths)


def upload_paths() -> frozenset[str]:
    """The paths of the views that take code archives (``UPLOAD_URL_NAMES``)."""
    return _upload_paths(str(settings.ROOT_URLCONF))


def limit_for(method: str, path: str) -> int:
    """The most bytes the body of a ``method`` request to ``path`` may hold."""
    if method.upper() in UPLOAD_METHODS and path in upload_paths():
        return int(settings.MAX_UPLOAD_BODY_BYTES)
    return int(settings.MAX_REQUEST_BODY_BYTES)


def refusal_message(limit: int) -> str:
    """What a refused client is told (the API's 413 wording)."""
    return f"The request body is over the limit of {limit} bytes."


def refusal_body(limit: int) -> bytes:
    """The 413's JSON body, in the API's error shape."""
    return json.dumps({"message": refusal_message(limit), "errors": {}}).encode()


def declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The largest ``Content-Length`` among ``headers`` (None without one, or a malformed one:
    the server refuses those itself)."""
    lengths = [
        int(value)
        for name, value in headers
        if name.lower() == b"content-length" and value.isdigit()
    ]
    return max(lengths) if lengths else None


# --------------------------------------------------------------------------- ASGI


class BodyLimitMiddleware:
    """ASGI middleware: an HTTP request's body past :func:`limit_for` is a 413.

    A declared ``Content-Length`` over the limit is refused before the application
    is called.  Otherwise each ``http.request`` message is counted as the application
    receives it; the one that passes the limit is never handed over: the client gets the
    413 and the application ``http.disconnect`` (Django's handler then drops the
    body it spooled and answers nothing). Whatever the application sends after that is
    dropped. Other scopes (WebSockets, lifespan) pass through.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        limit = limit_for(str(scope.get("method", "")), str(scope.get("path", "")))
        declared = declared_length(scope.get("headers") or ())
        if declared is not None and declared > limit:
            await _send_refusal(send, limit)
            return
        received = 0
        refused = False
        started = False

        async def counted_receive() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body") or b"")
                if received > limit:
                    refused = True
                    if not started:
                        await _send_refusal(send, limit)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 is the answer
            if message.get("type") == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, counted_receive, guarded_send)


async def _send_refusal(send: Send, limit: int) -> None:
    body = refusal_body(limit)
    await send(
        {
            "type": "http.response.start",
            "status": STATUS,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


# --------------------------------------------------------------------------- daphne

try:  # daphne is the portal's server; the ASGI middleware works without it
    from daphne.http_protocol import HTTPFactory, WebRequest  # type: ignore[import-untyped]
    from twisted.web import http
except ImportError:  # pragma: no cover - daphne is a dependency
    HTTPFactory = WebRequest = None


if WebRequest is not None:

    class LimitedWebRequest(WebRequest):  # type: ignore[misc]
        """daphne's request, counting its body in Twisted's callbacks (see the module)."""

        content: IO[bytes]
        body_limit: int | None = None
        body_received = 0
        body_refused = False
        drained = 0

        def gotLength(self, length: int | None) -> None:
            """The headers are in: refuse a declared length over the limit, else make room."""
            channel = self.channel  # HTTP/1.1: the request line is on the channel until the
            # body is in; an HTTP/2 stream keeps its pseudo-headers as ``command``, ``path``
            method = getattr(channel, "_command", None) or getattr(channel, "command", None) or b""
            raw_path = getattr(channel, "_path", None) or getattr(channel, "path", None) or b""
            raw_path = raw_path.split(b"?", 1)[0]
            path = unquote(raw_path.decode("ascii", "replace"))
            self.body_limit = limit_for(method.decode("ascii", "replace"), path)
            if length is not None and length > self.body_limit:
                self.content = io.BytesIO()
                self._refuse()
            elif length is None:  # chunked: in memory while small, never past the limit
                # Twisted owns it from here (it closes a request's content): no "with".
                self.content = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)  # noqa: SIM115
            else:
                super().gotLength(length)

        def handleContentChunk(self, data: bytes) -> None:
            """Count a piece of the body; keep it while the count is within the limit."""
            if self.body_refused:
                self.drained += len(data)
                if self.drained > DRAIN_BYTES:
                    self._close()
                return
            self.body_received += len(data)
            if self.body_limit is not None and self.body_received > self.body_limit:
                self._refuse()
                return
            super().handleContentChunk(data)

        def process(self) -> Any:
            """Hand a complete body to daphne; a refused one (answered already) ends here."""
            if self.body_refused:
                self._close()
                return None
            return super().process()

        def connectionLost(self, reason: Any) -> None:
            """The connection closed: no drain deadline is left behind."""
            deadline, self._drain_deadline = getattr(self, "_drain_deadline", None), None
            if deadline is not None and deadline.active():
                deadline.cancel()
            super().connectionLost(reason)

        def _refuse(self) -> None:
            self.body_refused = True
            kept, self.content = self.content, io.BytesIO()
            kept.close()  # what was spooled is gone now
            # No "100 Continue" after the answer (Twisted sends one after gotLength).
            self.requestHeaders.removeHeader(b"Expect")
            limit = int(self.body_limit or 0)
            body = refusal_body(limit)
            head = (
                b"HTTP/1.1 %d %s\r\n" % (STATUS, REASON)
                + b"Content-Type: application/json\r\n"
                + b"Content-Length: %d\r\n" % len(body)
                + b"Connection: close\r\n\r\n"
            )
            if not isinstance(self.channel, http.HTTPChannel):
                # An HTTP/2 stream (daphne speaks it only with the ``h2`` package, which the
                # portal does not install): answer through the request, which ends the stream.
                self.setResponseCode(STATUS, REASON)
                self.responseHeaders.setRawHeaders(b"content-type", [b"application/json"])
                self.write(body)
                self.finish()
                return
            transport = getattr(self.channel, "transport", None)
            if transport is None:
                return
            transport.write(head + body)
            call_later = getattr(self.channel, "callLater", None)
            if call_later is not None:
                self._drain_deadline = call_later(DRAIN_SECONDS, self._close)

        def _close(self) -> None:
            channel = self.channel
            if channel is not None and getattr(channel, "transport", None) is not None:
                channel.loseConnection()

    class LimitedHTTPFactory(HTTPFactory):  # type: ignore[misc]
        """daphne's HTTP factory, making :class:`LimitedWebRequest` requests."""

        def buildProtocol(self, addr: Any) -> Any:
            protocol = super().buildProtocol(addr)
            protocol.requestFactory = LimitedWebRequest
            return protocol


def install_in_daphne() -> bool:
    """Make daphne's server build :class:`LimitedHTTPFactory` (True when daphne is there).

    daphne's ``Server.run`` makes its factory from the name ``daphne.server.HTTPFactory``
    after it has imported the application (``daphne`` on the command line, ``runserver``
    and ``runstack`` alike), and has no option to choose another: this sets that name.
    """
    if WebRequest is None:  # pragma: no cover - daphne is a dependency
        return False
    import daphne.server  # type: ignore[import-untyped]

    daphne.server.HTTPFactory = LimitedHTTPFactory
    return True
