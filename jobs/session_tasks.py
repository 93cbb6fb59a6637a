"""The sessions' Celery task: idle culling, run by beat (``CELERY_BEAT_SCHEDULE``)."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from jobs.session_cull import cull_idle_sessions

CULL_TASK = "jobs.cull_idle_sessions"


@shared_task(name=CULL_TASK, ignore_result=True)
def cull_sessions() -> list[int]:
    """Stop the sessions idle past their timeout; the ids stopped."""
    return cull_idle_sessions(timezone.now())
