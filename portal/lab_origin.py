"""Labs on hosts of their own (``LAB_HOST_TEMPLATE``): the routing, the hand-over, the sign-in.

::

    any request ──LabHostMiddleware──> portal.lab_hosts.route(host, path)
        portal    the portal's pages (its host, no lab path)
        reopen    a lab path on the portal's host: GET is sent to lab-open, else 404
        lab       session N's lab path on N's host: on to portal.lab_proxy.lab, which
                  signs the browser in by ticket or cookie (lab_host_user)
        not_found anything else on a lab host or a stray name under the labs' domain
    sockets ──LabHostSocketGuard──> the same route: only ``lab`` and ``portal`` pass

``lab_open`` is the portal's side of the hand-over (``portal.lab_ticket``): the session's
"Open JupyterLab" link, which works with or without the template (without one, it sends
the browser to the lab on the portal's own origin, as before).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseRedirect,
)
from django.http.request import split_domain_port, validate_host
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_safe

from jobs.sessions import lab_job
from portal.lab_hosts import Route, lab_host, route
from portal.lab_streams import RUNNING
from portal.lab_ticket import (
    SPENT_TTL_S,
    TICKET_PARAM,
    LabAuthError,
    cookie_name,
    cookie_value,
    mark_matches,
    mint_ticket,
    read_cookie,
    read_ticket,
    spent_key,
)
from workers.lab_protocol import lab_base_url

log = logging.getLogger(__name__)


def _plain(status: int, message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=status, content_type="text/plain")
    add_never_cache_headers(response)
    return response


def host_route(host: str, path: str) -> Route:
    """Where a request for ``path`` on ``host`` (an allowed ``Host`` header) goes."""
    domain, _port = split_domain_port(host.lower())
    portal_host = bool(domain) and validate_host(domain, list(settings.PORTAL_HOSTS))
    return route(settings.LAB_HOST_TEMPLATE, host, path, portal_host=portal_host)


class LabHostMiddleware:
    """A lab host serves its own lab only; the portal's host serves no lab (when labs
    have hosts of their own). Sets ``request.lab_host_job`` on a lab host's requests."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if not settings.LAB_HOST_TEMPLATE:
            return self.get_response(request)
        where = host_route(request.get_host(), request.path_info)
        if where.kind == "not_found":
            return _plain(404, "Not found.")
        if where.kind == "reopen":
            if request.method not in ("GET", "HEAD"):
                return _plain(404, "A lab is served on its own host: open it from the portal.")
            target = reverse("session-lab-open", args=[where.job_id])
            return HttpResponseRedirect(f"{target}?{urlencode({'next': request.get_full_path()})}")
        if where.kind == "lab":
            request.lab_host_job = where.job_id  # type: ignore[attr-defined]
        return self.get_response(request)


def _next_path(job_id: int, wanted: str) -> str:
    """``wanted`` when it is a path of session ``job_id``'s lab, else the lab's root."""
    base = lab_base_url(job_id)
    if wanted.startswith(base) and wanted.isprintable() and "\\" not in wanted:
        return wanted
    return base


@login_required
@require_safe
def lab_open(request: HttpRequest, job_id: int) -> HttpResponse:
    """The "Open JupyterLab" link: to the lab's host with a one-use ticket (or, with no
    ``LAB_HOST_TEMPLATE``, to the lab on this origin); 404 as the lab itself answers."""
    job = lab_job(request.user, job_id)
    if job.state not in RUNNING:
        raise Http404(f"Session {job_id} does not run.")
    path = _next_path(job_id, request.GET.get("next", ""))
    template = settings.LAB_HOST_TEMPLATE
    if not template:
        return HttpResponseRedirect(path)
    _domain, port = split_domain_port(request.get_host())
    origin = f"{request.scheme}://{lab_host(template, job_id)}" + (f":{port}" if port else "")
    separator = "&" if "?" in path else "?"
    ticket = urlencode({TICKET_PARAM: mint_ticket(int(request.user.pk or 0), job_id)})
    response = HttpResponseRedirect(f"{origin}{path}{separator}{ticket}")
    add_never_cache_headers(response)
    return response


def cookie_user(value: str, job_id: int) -> Any | None:
    """The active user whom lab cookie ``value`` signs in to session ``job_id``'s host, or
    None (tampered, expired, another session's, a changed password, a deactivated user).
    Whether that user may still open the session is the caller's to ask (``lab_job``)."""
    try:
        user_id, mark = read_cookie(value, job_id, max_age=settings.LAB_COOKIE_SECONDS)
    except LabAuthError as error:
        log.info("lab %s: cookie refused: %s", job_id, error)
        return None
    user = _active_user(user_id)
    if user is None or not mark_matches(user, mark):
        return None
    return user


async def lab_host_user(request: HttpRequest, job_id: int) -> Any:
    """Who a lab host's request comes from: the user its cookie signs in, or the answer to
    give instead (an ``HttpResponse``): the sign-in redirect for a valid ticket, or the
    refusal."""
    ticket = request.GET.get(TICKET_PARAM)
    if ticket is not None:
        return await _spend_ticket(request, job_id, ticket)
    value = request.COOKIES.get(cookie_name(job_id))
    user = await sync_to_async(cookie_user)(value, job_id) if value else None
    if user is not None:
        return user
    return _plain(403, "Open this lab from the portal: its session's page has the link.")


async def _spend_ticket(request: HttpRequest, job_id: int, value: str) -> HttpResponse:
    """A valid, unused ticket: its nonce spent, the cookie set, the browser sent on to the
    same URL without it. Anything else: 403 (404 when its user may no longer open it)."""
    try:
        ticket = read_ticket(value, job_id)
    except LabAuthError as error:
        log.info("lab %s: ticket refused: %s", job_id, error)
        return _plain(403, "This lab link has expired: open the lab from the portal again.")
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    try:
        fresh = await client.set(spent_key(ticket), 1, nx=True, ex=SPENT_TTL_S)
    finally:
        await client.aclose()
    if not fresh:
        return _plain(403, "This lab link was used already: open the lab from the portal again.")
    user = await sync_to_async(_active_user)(ticket.user_id)
    if user is None:
        return _plain(403, "This lab link's user cannot sign in.")
    try:
        await sync_to_async(lab_job)(user, job_id)
    except Http404:
        return _plain(404, f"No session {job_id} runs that you may open.")
    query = request.GET.copy()
    query.pop(TICKET_PARAM, None)
    response = HttpResponseRedirect(request.path + (f"?{query.urlencode()}" if query else ""))
    response.set_cookie(
        cookie_name(job_id),
        cookie_value(user, job_id),
        max_age=settings.LAB_COOKIE_SECONDS,
        path=lab_base_url(job_id),
        secure=request.is_secure(),
        httponly=True,
        samesite="Lax",
    )
    add_never_cache_headers(response)
    return response


def _active_user(user_id: int) -> Any | None:
    return get_user_model().objects.filter(pk=user_id, is_active=True).first()


def _header(scope: dict[str, Any], name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return ""


def socket_lab_user(scope: dict[str, Any], job_id: int) -> Any | None:
    """The user a lab host's WebSocket comes from (its lab cookie), or None; None also when
    the socket did not come to session ``job_id``'s own host."""
    where = host_route(_header(scope, b"host"), str(scope.get("path", "")))
    if where != Route("lab", job_id):
        return None
    value = (scope.get("cookies") or {}).get(cookie_name(job_id))
    return cookie_user(value, job_id) if value else None


class LabHostSocketGuard:
    """Refuses, before any consumer runs, a WebSocket that a lab host may not serve (the
    portal's live and shell sockets, another lab's) and a lab socket on the portal's host."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope.get("type") == "websocket" and settings.LAB_HOST_TEMPLATE:
            host = _header(scope, b"host")
            domain, _port = split_domain_port(host.lower())
            allowed = bool(domain) and validate_host(domain, list(settings.ALLOWED_HOSTS))
            where = host_route(host, str(scope.get("path", ""))) if allowed else None
            if where is None or where.kind not in ("portal", "lab"):
                return await WebsocketDenier()(scope, receive, send)
        return await self.app(scope, receive, send)
