"""Handing one notification over: a signed JSON POST, or an email. No database here.

Each call makes one attempt and says how it went (:class:`Outcome`); the
services record it and decide about retries. Timeouts are short
(``WEBHOOK_TIMEOUT_S``, ``EMAIL_TIMEOUT``), and these run only in Celery
tasks, so a slow or dead endpoint delays nothing but its own delivery.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.mail import send_mail

from notifications.signing import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    signature,
)

ERROR_MAX = 500
USER_AGENT = "gpu-portal-webhooks/1"


@dataclass(frozen=True)
class Outcome:
    """How one attempt went: ``ok`` for a 2xx (or mail accepted), else the status or error."""

    ok: bool
    status_code: int | None
    error: str
    duration_ms: float


def body_bytes(payload: dict[str, Any]) -> bytes:
    """The exact bytes a webhook POSTs (and signs): compact JSON, keys sorted."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


def private_address_error(url: str) -> str:
    """Why ``url`` may not be called when ``WEBHOOK_ALLOW_PRIVATE`` is off ("" when it may).

    Every address the host resolves to must be global: not loopback, private,
    link-local (cloud metadata), reserved or multicast.
    """
    host = urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        return f"cannot resolve {host!r}: {exc}"
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if not address.is_global:
            return f"{host!r} resolves to a non-public address ({address}): refused"
    return ""


def post_webhook(
    *, url: str, secret: str, payload: dict[str, Any], delivery_id: int, now: datetime
) -> Outcome:
    """POST ``payload`` to ``url``, signed with ``secret`` at ``now``; one attempt, no redirects."""
    started = time.monotonic()
    if not settings.WEBHOOK_ALLOW_PRIVATE and (refused := private_address_error(url)):
        return Outcome(False, None, refused, 0.0)
    body = body_bytes(payload)
    timestamp = str(int(now.timestamp()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: signature(secret, timestamp, body),
        EVENT_HEADER: str(payload.get("type", "")),
        DELIVERY_HEADER: str(delivery_id),
    }
    try:
        response = httpx.post(
            url,
            content=body,
            headers=headers,
            timeout=settings.WEBHOOK_TIMEOUT_S,
            follow_redirects=False,
        )
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:ERROR_MAX]
        return Outcome(False, None, error, _ms_since(started))
    ok = 200 <= response.status_code < 300
    error = "" if ok else f"HTTP {response.status_code}"
    return Outcome(ok, response.status_code, error, _ms_since(started))


def email_text(payload: dict[str, Any]) -> tuple[str, str]:
    """Subject and plain-text body of a notification email."""
    job = payload.get("job") or {}
    kind = str(payload.get("type", "job.event")).removeprefix("job.").replace("_", " ")
    if job:
        subject = f"[GPU portal] job {job.get('id')} ({job.get('name')}): {kind}"
        lines = [
            f"Job {job.get('id')} ({job.get('name')}) of tenant {job.get('tenant')}: {kind}.",
            f"State: {job.get('state')}",
            f"Why: {payload.get('reason') or '-'}",
            f"Page: {(job.get('links') or {}).get('page', '')}",
        ]
    else:
        subject = f"[GPU portal] {kind} event"
        lines = [f"A {kind} event from the GPU portal: your subscription works."]
    lines += ["", "The event as JSON:", json.dumps(payload, indent=2, sort_keys=True)]
    return subject, "\n".join(lines) + "\n"


def send_email(*, address: str, payload: dict[str, Any]) -> Outcome:
    """Mail the notification to ``address`` through Django's configured backend; one attempt."""
    started = time.monotonic()
    subject, text = email_text(payload)
    try:
        send_mail(subject, text, settings.DEFAULT_FROM_EMAIL, [address], fail_silently=False)
    except (OSError, ValueError) as exc:  # smtplib's errors are OSErrors
        return Outcome(False, None, f"{type(exc).__name__}: {exc}"[:ERROR_MAX], _ms_since(started))
    return Outcome(True, None, "", _ms_since(started))


def _ms_since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)
