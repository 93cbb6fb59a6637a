"""Celery tasks of the job domain: a finished job's log export, outputs' retention.

The control plane's tasks (reports, tick, forecast) are in ``control.tasks``.
Tasks take plain JSON (ids, dicts), never model instances.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from jobs.expiry import expire_outputs as run_expiry
from jobs.lifecycle import EXPORT_LOG_TASK
from jobs.logs.export import export_log

log = logging.getLogger(__name__)


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
