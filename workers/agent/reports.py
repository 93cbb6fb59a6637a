"""Reports out of the agent: the one function that sends them, and the report
of a job's runtime event (as the event's declaration in ``workers.runtime_events`` says)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from celery import Celery

from workers.agent.celery_app import agent_app
from workers.protocol import (
    EVENT_REPORTS,
    REPORT_TASK,
    REPORTS_QUEUE,
    Heartbeat,
    ProtocolError,
    Report,
)
from workers.runtime_events import event_types
from workers.signing import seal

log = logging.getLogger(__name__)


def send_report(
    report: Report,
    *,
    key: bytes,
    queue: str = REPORTS_QUEUE,
    expires: float | None = None,
    app: Celery | None = None,
    now: Callable[[], float] = time.time,
) -> bool:
    """Send one report to the control plane as the Celery task ``REPORT_TASK``.

    The only place where reports leave the agent (through ``app``, by default
    the agent's own), each in an envelope signed with the node's ``key``
    (``workers.signing``).  Returns False (and logs) when the broker refuses
    it or it cannot be signed: a lost report must not take the agent down.
    """
    sender = app if app is not None else agent_app()
    try:
        # Sealing refuses what JSON cannot carry (text that does not encode, NaN): a
        # report made of a job's data must not raise through the agent's loop.
        envelope = seal(report.to_dict(), node=report.node, key=key, now=now())
    except ValueError:
        log.exception("could not sign %s report", report.TYPE)
        return False
    try:
        sender.send_task(
            REPORT_TASK, args=[envelope], queue=queue, expires=expires, ignore_result=True
        )
    except Exception:  # the broker's errors are many and transport-specific
        log.exception("could not send %s report", report.TYPE)
        return False
    return True


def send_heartbeat(
    report: Heartbeat,
    *,
    key: bytes,
    queue: str,
    expires_seconds: float,
    app: Celery | None = None,
) -> bool:
    """A heartbeat expires: a stale one says nothing once a newer one exists."""
    return send_report(report, key=key, queue=queue, expires=expires_seconds, app=app)


def report_from_event(node: str, job: str, event_id: str, event: dict[str, Any]) -> Report | None:
    """The report for one runtime event, or None for a kind no event class declares.

    The event's declaration (``workers.runtime_events``) reads its fields and
    names them as its report (``workers.protocol.EVENT_REPORTS``) does.  Raises
    ``ProtocolError`` for an event whose fields do not make a valid report.
    """
    kind = event.get("kind")
    declared = event_types().get(kind) if isinstance(kind, str) else None
    if declared is None:
        return None
    report_type = EVENT_REPORTS[declared.TYPE]
    try:
        fields = {**declared.report_fields(event), "node": node, "job": job, "event_id": event_id}
        return report_type(**fields)
    except KeyError as exc:
        raise ProtocolError(f"runtime event {kind} lacks field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"runtime event {kind} is malformed: {exc}") from None
