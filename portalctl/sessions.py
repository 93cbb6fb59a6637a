"""``portalctl sessions``: interactive sessions (JupyterLab on the cluster's GPUs).

::

    portalctl sessions ls                               your tenants' sessions
    portalctl sessions start --gpus 1 [--idle 30m] [--lifetime 8h] [--priority high]
                             [--access tenant] [--code BUNDLE|DIR] [--requirement PKG]...
    portalctl sessions stop 12
    portalctl sessions open 12                          prints the lab URL (open it in a browser)

The API is ``/api/v1/sessions/``; this module holds what the commands share (the calls,
the request body, the table rows); the click commands are in :mod:`portalctl.cli`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urljoin

from portalctl.client import Client
from portalctl.duration import format_duration

SESSION_COLUMNS = ("ID", "TENANT", "NAME", "USER", "STATE", "GPUS", "IDLE", "CULLED AT", "LAB")
PRIORITY_CLASSES = ("high", "normal", "low")


class SessionsAPI:
    """``/api/v1/sessions/`` over a :class:`~portalctl.client.Client`; answers as the API's
    JSON."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def start(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """Start a session; the session as created (queued)."""
        return dict(self._client.json("POST", "/api/v1/sessions/", json=dict(fields)))

    def get(self, session_id: int) -> dict[str, Any]:
        """One session."""
        return dict(self._client.json("GET", f"/api/v1/sessions/{int(session_id)}/"))

    def list(self, state: str | None = None) -> list[dict[str, Any]]:
        """The caller's tenants' sessions, newest first (``state``: comma-separated)."""
        params = {"state": state} if state else None
        return [dict(item) for item in self._client.pages("/api/v1/sessions/", params)]

    def stop(self, session_id: int, reason: str = "") -> dict[str, Any]:
        """Stop a session (its home is saved, its GPUs released)."""
        body = {"reason": reason} if reason else {}
        path = f"/api/v1/sessions/{int(session_id)}/stop/"
        return dict(self._client.json("POST", path, json=body))


def start_fields(
    *,
    gpus: int,
    tenant: str | None = None,
    name: str | None = None,
    idle_s: int | None = None,
    lifetime_s: int | None = None,
    priority: str | None = None,
    access: str | None = None,
    code: str | None = None,
    requirements: Sequence[str] = (),
    resources: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The body of ``POST /api/v1/sessions/`` for what the command line was given (left
    out: the tenant's defaults)."""
    fields: dict[str, Any] = {"gpus": gpus}
    optional = {
        "tenant": tenant,
        "name": name,
        "idle_timeout_s": idle_s,
        "max_lifetime_s": lifetime_s,
        "lab_access": access,
        "code": code,
    }
    fields.update({key: value for key, value in optional.items() if value is not None})
    if priority is not None:
        fields["priority"] = int(priority) if priority.isdigit() else priority
    if requirements:
        fields["environment"] = {"requirements": list(requirements)}
    fields.update(resources or {})
    return fields


def lab_url(portal_url: str, session: Mapping[str, Any]) -> str:
    """The absolute URL of a session's JupyterLab through the portal."""
    return urljoin(portal_url.rstrip("/") + "/", str(session.get("lab_url", "")).lstrip("/"))


def _clock(value: Any) -> str:
    if not value:
        return ""
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).strftime("%H:%M:%S")
    except ValueError:
        return str(value)


def session_row(session: Mapping[str, Any], portal_url: str) -> list[Any]:
    """One session as a row of ``portalctl sessions ls``."""
    running = session.get("state") in ("running", "scaling")
    return [
        session.get("id"),
        session.get("tenant"),
        session.get("name"),
        session.get("submitter"),
        session.get("state"),
        session.get("gpus"),
        format_duration(session.get("idle_timeout_s")),
        _clock(session.get("idle_deadline")),
        lab_url(portal_url, session) if running else "",
    ]
