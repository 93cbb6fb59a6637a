"""The elastic runtime's coordination keys of a job in Redis, and when the control plane drops them.

Two moments: a job whose every server died is requeued (the dead run's
leader, generation and members would make its next first generation wait for
a leader that is gone), and a job that ended a few minutes ago (the retention
run, once its last events were read).
"""

from __future__ import annotations

import logging

from django.conf import settings

from jobs.agent_commands import runtime_job_name
from workers.elastic.control import JobControl

log = logging.getLogger(__name__)


def forget_coordination(job_id: int, redis_url: str | None = None) -> bool:
    """Delete every Redis key of job ``job_id``'s runtime; False (logged) if Redis failed."""
    try:
        control = JobControl(redis_url or str(settings.REDIS_URL), runtime_job_name(job_id))
        try:
            control.cleanup()
        finally:
            control.redis.close()
    except Exception:  # Redis errors are many; the caller tries again later
        log.exception("could not delete the coordination keys of job %s", job_id)
        return False
    return True
