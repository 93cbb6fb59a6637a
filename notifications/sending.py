"""Handing one notification over: a signed JSON POST, or an email. No database here.

Each call makes one attempt and says how it went (:class:`Outcome`); the
services record it and decide about retries. Deadlines are short
(``WEBHOOK_TIMEOUT_S`` for a whole webhook attempt, ``EMAIL_TIMEOUT``), and
these run only in the ``webhooks`` queue's own worker, so a slow or dead
endpoint delays nothing but other deliveries, never a report or heartbeat.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.mail import send_mail

from notifications import pinned
from notifications.addresses import IPNetwork, parse_networks
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


def allowed_networks() -> tuple[IPNetwork, ...]:
    """``WEBHOOK_ALLOWED_NETWORKS``: the non-public networks an operator lets webhooks reach."""
    return parse_networks(settings.WEBHOOK_ALLOWED_NETWORKS)


def post_webhook(
    *, url: str, secret: str, payload: dict[str, Any], delivery_id: int, now: datetime
) -> Outcome:
    """POST ``payload`` to ``url``, signed with ``secret`` at ``now``; one attempt, no redirects.

    The host is resolved once and the connection goes to the address that was
    checked (``notifications.pinned``); the whole attempt ends within
    ``WEBHOOK_TIMEOUT_S`` and reads at most the answer's status and headers.
    """
    started = time.monotonic()
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
        status = pinned.post(
            url,
            body=body,
            headers=headers,
            deadline_s=float(settings.WEBHOOK_TIMEOUT_S),
            allowed=allowed_networks(),
        )
    except pinned.PostError as exc:
        return Outcome(False, None, str(exc)[:ERROR_MAX], _ms_since(started))
    ok = 200 <= status < 300
    error = "" if ok else f"HTTP {status}"
    return Outcome(ok, status, error, _ms_since(started))


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
