"""Celery tasks of the control plane: thin wrappers that call ``control``'s modules.

The agents' reports, the tick, the agents' Redis users and the forecast.  Task
names are kept from when they lived in ``jobs.tasks`` (messages queued and beat
entries name them).  Tasks take plain JSON (ids, dicts), never model instances.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task, shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError

from control import agent_users
from control.forecast import FORECAST_TASK, refresh_forecast
from control.reports import handle_signed_report
from control.tick import TICK_TASK, run_tick
from workers.protocol import REPORT_TASK

log = logging.getLogger(__name__)


def report_retry_schedule(retry_for_s: float, backoff_max_s: float) -> list[float]:
    """The pauses between a report's tries while the database is away: 1, 2, 4 ... s.

    Doubling up to ``backoff_max_s`` apart, until they add up to ``retry_for_s``
    (``AGENT_REPORT_RETRY_FOR_SECONDS``): the outage a report outlives.
    """
    pauses: list[float] = []
    while sum(pauses) < retry_for_s:
        pauses.append(float(min(2 ** len(pauses), backoff_max_s)))
    return pauses


@shared_task(
    name=REPORT_TASK,
    bind=True,
    ignore_result=True,
    # Acknowledged after it ran, and put back if its worker dies (OOM, SIGKILL): applying a
    # report twice changes nothing (an envelope is applied once, agent_trust.was_applied).
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=None,
)
def agent_report(self: Task, envelope: Any) -> str:
    """Check and apply one signed agent report (idempotent; forged or malformed: no change).

    The database down or restarting: the report waits and is applied later,
    never dropped (a final checkpoint's artifact row, a job's exit), for
    ``AGENT_REPORT_RETRY_FOR_SECONDS``; its envelope's age is judged at its
    first receipt, so the retries stay valid (``agent_trust.open_report``).
    """
    try:
        outcome = handle_signed_report(envelope)
    except (OperationalError, InterfaceError) as exc:
        pauses = report_retry_schedule(
            float(settings.AGENT_REPORT_RETRY_FOR_SECONDS),
            float(settings.AGENT_REPORT_RETRY_BACKOFF_MAX_SECONDS),
        )
        tries = int(self.request.retries or 0)
        if tries >= len(pauses):
            log.error("dropped an agent report after %d tries: %s", tries + 1, exc)
            raise
        raise self.retry(exc=exc, countdown=pauses[tries], max_retries=len(pauses)) from exc
    body = envelope.get("body") if isinstance(envelope, dict) else None
    log.debug("report %s: %s", body.get("type") if isinstance(body, dict) else "?", outcome)
    return outcome


@shared_task(name=TICK_TASK, ignore_result=True)
def scheduler_tick() -> dict[str, Any]:
    """One scheduler tick under the cluster lock (beat runs it every TICK_SECONDS)."""
    result = run_tick()
    if result.ran and (result.changed_jobs or result.down_nodes):
        log.info(
            "tick %.0f ms: changed jobs %s, down %s, refused %s",
            result.duration_s * 1000,
            list(result.changed_jobs),
            list(result.down_nodes),
            [(r.job, r.reason) for r in result.refused],
        )
    return {
        "ran": result.ran,
        "duration_s": result.duration_s,
        "changed": list(result.changed_jobs),
    }


AGENT_USERS_TASK = "control.agent_users"


@shared_task(name=AGENT_USERS_TASK, ignore_result=True)
def keep_agent_users() -> None:
    """The agents' and jobs' Redis users kept (``agent_users.maintain``; beat runs it every
    ``AGENT_USERS_SYNC_SECONDS`` on the portal queue, off the tick's worker and time)."""
    agent_users.maintain(force=True)


@shared_task(name=FORECAST_TASK, ignore_result=True)
def forecast_estimates() -> dict[str, Any]:
    """Predict every queued and running job's start and finish (on the ``whatif`` queue).

    ``control.forecast.maybe_refresh`` sends it from the tick when one is due; a
    refresh already running makes this one a no-op.
    """
    changed = refresh_forecast()
    return {"ran": changed is not None, "changed": changed or []}
