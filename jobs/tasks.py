"""Celery tasks of the control plane: thin wrappers that call ``jobs.control``.

Tasks take plain JSON (ids, dicts), never model instances.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from jobs.control.reports import handle_report
from jobs.control.tick import TICK_TASK, run_tick
from workers.protocol import REPORT_TASK

log = logging.getLogger(__name__)


@shared_task(name=REPORT_TASK, ignore_result=True)
def agent_report(payload: Any) -> str:
    """Apply one agent report (idempotent; malformed reports change nothing)."""
    outcome = handle_report(payload)
    log.debug("report %s: %s", payload.get("type") if isinstance(payload, dict) else "?", outcome)
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
