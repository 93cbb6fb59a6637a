"""``/sessions/<id>/lab/...`` over HTTP: a session's JupyterLab through the node's agent.

::

    browser ──request──> lab (this view): signed in? lab_target (404) ──> same origin? (403)
            ──> body within LAB_MAX_BODY_BYTES? (413) ──> Exchange: h, b..., e ──> agent
    browser <──streamed── head (status, headers), then body pieces as they come <── agent

The portal's session authenticates (a signed-out browser is sent to the login page) or,
when labs have hosts of their own (``LAB_HOST_TEMPLATE``, ``portal.lab_origin``), the lab
host's own cookie does; the agent's relay adds Jupyter's token, which never reaches the
browser.  Jupyter skips its own XSRF check for token-authenticated requests, so this view
keeps cross-site writes out: a request that is not GET/HEAD/OPTIONS must come from the
origin it is addressed to (``Origin``, else ``Sec-Fetch-Site``), as every browser says for
its page's own fetches.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    StreamingHttpResponse,
)
from django.views.decorators.csrf import csrf_exempt

from portal.lab_origin import lab_host_user
from portal.lab_streams import Exchange, LabTarget, lab_target
from workers.lab_protocol import (
    HEAD_WAIT_S,
    MAX_REQUEST_BODY_BYTES,
    METHODS,
    encode_headers,
    safe_chunks,
)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PIECE_WAIT_S = 300.0
"""How long a response may pause between two pieces of its body."""
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "upgrade", "te"})


def _error(status: int, message: str) -> HttpResponse:
    response = HttpResponse(
        json.dumps({"message": message}), status=status, content_type="application/json"
    )
    if status == 503:
        response["Retry-After"] = "2"
    return response


def same_origin(request: HttpRequest) -> bool:
    """Whether the browser says this request comes from a page of the origin it is sent to
    (the portal's, or the lab host's)."""
    origin = request.headers.get("Origin")
    if origin is not None:
        return origin == f"{request.scheme}://{request.get_host()}"
    return request.headers.get("Sec-Fetch-Site", "") == "same-origin"


def request_headers(request: HttpRequest) -> list[tuple[str, str]]:
    """The browser's headers as pairs (``workers.lab_protocol`` drops what Jupyter may not
    see when the relay forwards them)."""
    return [(name, value) for name, value in request.headers.items() if "\n" not in value]


@csrf_exempt
async def lab(request: HttpRequest, job_id: str) -> HttpResponseBase:
    """Relay one request to session ``job_id``'s lab and stream its answer back."""
    on_lab_host = getattr(request, "lab_host_job", None) is not None
    if on_lab_host:  # portal.lab_origin: a lab on its own host signs in by its own cookie
        user = await lab_host_user(request, int(job_id))
        if isinstance(user, HttpResponseBase):
            return user
    else:
        user = await request.auser()
        if not user.is_authenticated:
            return redirect_to_login(request.get_full_path())
    try:
        target: LabTarget = await sync_to_async(lab_target)(user, int(job_id))
    except Http404:
        return _error(404, f"No session {job_id} runs that you may open.")
    method = (request.method or "GET").upper()
    if method not in METHODS:
        return _error(405, f"{method} is not relayed to a lab")
    if method not in SAFE_METHODS and not same_origin(request):
        return _error(403, "a lab accepts changes only from its own pages")
    limit = min(MAX_REQUEST_BODY_BYTES, int(settings.MAX_REQUEST_BODY_BYTES))
    body = request.body
    if len(body) > limit:
        return _error(413, f"The request body is over the limit of {limit} bytes.")
    path = request.get_full_path()
    if not path.startswith(target.base_url):
        return _error(404, "not a path of this lab")
    exchange = Exchange(target)
    try:
        await exchange.send(
            {"t": "h", "m": method, "p": path, "hd": encode_headers(request_headers(request))}
        )
        if body:
            for piece in safe_chunks(body):
                await exchange.send({"t": "b", "d": piece})
        await exchange.send({"t": "e"})
        first = await _head(exchange)
    except BaseException:
        await exchange.close()
        raise
    if isinstance(first, HttpResponse):
        await exchange.close()
        return first
    status, headers, early = first
    response = StreamingHttpResponse(_body(exchange, early), status=status)
    for name, value in headers:
        if name.lower() not in HOP_BY_HOP:
            response[name] = value
    return response


async def _head(
    exchange: Exchange,
) -> HttpResponse | tuple[int, tuple[tuple[str, str], ...], list[bytes | None]]:
    """The response's head (and any body pieces that came with it; None: the end), or the
    error answer when none comes."""
    entries = await exchange.receive(HEAD_WAIT_S)
    if not entries:
        return _error(504, "the lab did not answer (is its node's agent running?)")
    first = entries[0]
    if first.type == "f":
        if "starting" in first.reason:
            return _error(503, "The lab is starting: try again in a moment.")
        return _error(502, f"the lab could not be reached: {first.reason}")
    if first.type != "h":
        return _error(502, "the lab answered out of order")
    early: list[bytes | None] = []
    for entry in entries[1:]:
        early.append(entry.data if entry.type == "b" else None)
        if entry.type in ("e", "f"):
            break
    return first.status, first.headers, early


async def _body(exchange: Exchange, early: list[bytes | None]) -> AsyncIterator[bytes]:
    """The body's pieces as the agent sends them; a client that leaves aborts the request."""
    finished = False
    try:
        for piece in early:
            if piece is None:
                finished = True
                return
            yield piece
        while True:
            entries = await exchange.receive(PIECE_WAIT_S)
            if not entries:
                return
            for entry in entries:
                if entry.type == "b":
                    yield entry.data
                elif entry.type in ("e", "f"):
                    finished = True
                    return
    finally:
        if not finished:
            try:
                await exchange.send({"t": "c"})
            finally:
                await exchange.close()
        else:
            await exchange.close()
