"""Idle culling of sessions: a session nobody used for its idle timeout is stopped.

"Used" is the latest client request through the lab proxy or kernel activity the agent
reports (``jobs.sessions.note_activity``); a session never used counts from its start. A
beat task (``jobs.session_tasks``) calls :func:`cull_idle_sessions` every
``SESSION_CULL_SECONDS``; each idle session ends cancelled with the reason
``idle for N s: culled`` (its final event), its agent syncs its home and stops.

The lifetime is the job's run-time limit (``max_runtime_s``, ``control.limits``): the
tick stops a session at it as it stops any job.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q

from jobs.choices import ACTIVE_STATES, JobKind
from jobs.errors import JobConflictError
from jobs.models import Job
from jobs.session_services import stop_session

log = logging.getLogger(__name__)


def idle_since(last_activity_at: datetime | None, started_at: datetime | None) -> datetime | None:
    """When a session's idle time started: its latest activity, else its start (None: it
    never started, so it cannot idle)."""
    return last_activity_at or started_at


def idle_deadline(
    last_activity_at: datetime | None, started_at: datetime | None, idle_timeout_s: int | None
) -> datetime | None:
    """When a running session will be culled if nothing happens (None: never)."""
    since = idle_since(last_activity_at, started_at)
    if since is None or idle_timeout_s is None:
        return None
    return since + timedelta(seconds=idle_timeout_s)


def is_idle(
    last_activity_at: datetime | None,
    started_at: datetime | None,
    idle_timeout_s: int | None,
    now: datetime,
) -> bool:
    """Whether a running session has gone unused for its whole idle timeout by ``now``."""
    deadline = idle_deadline(last_activity_at, started_at, idle_timeout_s)
    return deadline is not None and now >= deadline


def cull_reason(idle_timeout_s: int) -> str:
    """The final event's reason of a culled session."""
    return f"idle for {idle_timeout_s} s: culled"


def cull_idle_sessions(now: datetime) -> list[int]:
    """Stop every running session idle past its timeout at ``now``; return their ids.

    Each is stopped in a transaction of its own, its row locked and checked again (activity
    that arrived meanwhile saves it), so one bad row never holds back the others.
    """
    rows = (
        Job.objects.filter(kind=JobKind.SESSION, state__in=ACTIVE_STATES)
        .filter(Q(last_activity_at__isnull=False) | Q(started_at__isnull=False))
        .values_list("pk", "last_activity_at", "started_at", "idle_timeout_s")
    )
    due = [pk for pk, last, started, idle in rows if is_idle(last, started, idle, now)]
    culled: list[int] = []
    for pk in due:
        try:
            with transaction.atomic():
                job = Job.objects.select_for_update().get(pk=pk)
                if job.state not in ACTIVE_STATES or not is_idle(
                    job.last_activity_at, job.started_at, job.idle_timeout_s, now
                ):
                    continue
                assert job.idle_timeout_s is not None  # is_idle said so
                stop_session(pk, reason=cull_reason(job.idle_timeout_s), at=now)
        except JobConflictError:  # ended meanwhile
            continue
        culled.append(pk)
        log.info("session %d culled: idle for %d s", pk, job.idle_timeout_s)
    return culled
