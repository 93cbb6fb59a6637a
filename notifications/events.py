"""Which job events notify, what they are called, and what a notification says.

A job's history (``jobs.models.JobEvent``) is the trigger::

    JobEvent row                                   notification type
    ─────────────────────────────────────────────  ─────────────────────────────
    state,     to_state completed                  job.completed
    state,     to_state failed, run-time limit     job.runtime_limit  (also to "failed" subscribers)
    state,     to_state failed, anything else      job.failed
    retried    (requeued after a failure)          job.retried
    preempted  (running → queued)                  job.preempted
    (the sweep: queued past N minutes)             job.queued_long

Everything else in a job's history (scaling, notes, priorities) notifies nobody.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings

from control.limits import RUNTIME_LIMIT_REASON
from jobs.choices import EventKind, JobState
from jobs.models import Job, JobEvent
from notifications.choices import EventType

NOTIFYING_KINDS = frozenset({EventKind.STATE, EventKind.RETRIED, EventKind.PREEMPTED})


def classify(*, kind: str, to_state: str, reason: str) -> EventType | None:
    """The notification type of a job event, or None when the event notifies nobody."""
    if kind == EventKind.RETRIED:
        return EventType.RETRIED
    if kind == EventKind.PREEMPTED:
        return EventType.PREEMPTED
    if kind != EventKind.STATE:
        return None
    if to_state == JobState.COMPLETED:
        return EventType.COMPLETED
    if to_state == JobState.FAILED:
        # control.limits fails the job with a reason that starts "failed: run-time limit reached".
        if RUNTIME_LIMIT_REASON in reason:
            return EventType.RUNTIME_LIMIT
        return EventType.FAILED
    return None


def wanted_by(event_type: str) -> frozenset[str]:
    """The subscription event names that ask for ``event_type``.

    A run-time limit is a failure too: a subscriber to "failed" hears of it.
    """
    if event_type == EventType.RUNTIME_LIMIT:
        return frozenset({EventType.RUNTIME_LIMIT, EventType.FAILED})
    return frozenset({event_type})


def job_links(job_id: int) -> dict[str, str]:
    """Where a reader of a notification finds the job: its page and its API resource."""
    base = settings.PORTAL_BASE_URL
    return {"page": f"{base}/jobs/{job_id}/", "api": f"{base}/api/v1/jobs/{job_id}/"}


def job_summary(job: Job) -> dict[str, Any]:
    """The job as a notification shows it: small, no arguments or environment."""
    return {
        "id": job.pk,
        "name": job.name,
        "tenant": job.tenant.slug,
        "state": job.state,
        "submitter": job.submitter.get_username(),
        "links": job_links(job.pk),
    }


def event_payload(
    *, event_id: str, event_type: str, at: datetime, job: Job | None, reason: str
) -> dict[str, Any]:
    """The JSON body of a notification (webhook body; the email quotes it)."""
    return {
        "id": event_id,
        "type": f"job.{event_type}",
        "time": at.isoformat(),
        "reason": reason,
        "job": job_summary(job) if job is not None else None,
    }


def job_event_id(event: JobEvent) -> str:
    """A notification's id for a job event: stable, so a repeated task makes no second one."""
    return f"evt_{event.pk}"


def queued_long_id(job_id: int) -> str:
    """The id of a job's one "queued too long" notification (once per job and subscription)."""
    return f"queued_{job_id}"
