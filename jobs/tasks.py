"""Celery tasks of the control plane: thin wrappers that call ``jobs.control``.

Tasks take plain JSON (ids, dicts), never model instances.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.db import InterfaceError, OperationalError

from jobs.control.reports import handle_signed_report
from jobs.control.tick import TICK_TASK, run_tick
from jobs.expiry import expire_outputs as run_expiry
from jobs.forecast import FORECAST_TASK, refresh_forecast
from jobs.lifecycle import EXPORT_LOG_TASK
from jobs.log_export import export_log
from workers.protocol import REPORT_TASK

log = logging.getLogger(__name__)
REPORT_MAX_RETRIES = 40
"""With backoff 1, 2, 4 ... 30 s: a report outlives a database outage of about 18 minutes."""


@shared_task(
    name=REPORT_TASK,
    ignore_result=True,
    # The database down or restarting: the report waits and is applied later, never dropped
    # (a final checkpoint's artifact row, a job's exit). Handlers are idempotent.
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=1,
    retry_backoff_max=30,
    retry_jitter=False,
    max_retries=REPORT_MAX_RETRIES,
)
def agent_report(envelope: Any) -> str:
    """Check and apply one signed agent report (idempotent; forged or malformed: no change)."""
    outcome = handle_signed_report(envelope)
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


EXPIRE_TASK = "jobs.tasks.expire_outputs"
AGAIN_AFTER_S = 30.0
"""A full batch asks for another run this soon, rather than an hour later."""


@shared_task(name=EXPORT_LOG_TASK, ignore_result=True)
def export_job_log(job_id: int) -> int | None:
    """Write a finished job's whole log to the artifact store (idempotent); the row's id."""
    artifact = export_log(int(job_id))
    return None if artifact is None else artifact.pk


@shared_task(name=EXPIRE_TASK, ignore_result=True)
def expire_outputs() -> dict[str, Any]:
    """Delete expired artifacts and logs, and finished jobs' coordination keys (beat: hourly)."""
    result = run_expiry()
    if result.artifacts or result.logs or result.errors or result.coordination:
        log.info(
            "retention: %d artifacts (%d bytes), %d logs, %d coordination key sets, %d errors",
            result.artifacts,
            result.bytes,
            result.logs,
            result.coordination,
            result.errors,
        )
    if result.full and result.artifacts:
        expire_outputs.apply_async(countdown=AGAIN_AFTER_S, expires=3600)
    return {
        "artifacts": result.artifacts,
        "bytes": result.bytes,
        "logs": result.logs,
        "coordination": result.coordination,
        "errors": result.errors,
    }


@shared_task(name=FORECAST_TASK, ignore_result=True)
def forecast_estimates() -> dict[str, Any]:
    """Predict every queued and running job's start and finish (on the ``whatif`` queue).

    ``jobs.forecast.maybe_refresh`` sends it from the tick when one is due; a
    refresh already running makes this one a no-op.
    """
    changed = refresh_forecast()
    return {"ran": changed is not None, "changed": changed or []}
